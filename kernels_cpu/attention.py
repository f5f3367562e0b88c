"""Scaled dot-product attention on the CPU: flash-style tiles and split-KV decode.

Layouts (prepared by dispatch/ops/attention.py): q (B, Hq, Sq, D), k and v (B, Hkv, Skv, D),
  each C-contiguous or a view with unit-stride rows (last axis) and positive strides (the
  transposed q/k/v views of a fused QKV projection, read in place); out (B, Hq, Sq, D)
  likewise (C-contiguous, or a view with unit-stride rows that do not overlap, e.g. a
  (B, Sq, Hq, D) buffer transposed); query head h reads kv head h // (Hq // Hkv).  ``mask`` is always a 4-D (B, Hq, Sq, Skv) *broadcast view*
  (zero strides where the user's mask broadcasts, never a copy); ``mkind`` says how to
  read it: MASK_NONE (a dummy), MASK_BOOL (True = attend) or MASK_ADD (added to the scores).
  ``causal``: query i sees keys j <= i + Skv - Sq (diagonal aligned to the bottom right).

flash (cpu-flash, cpu-serial)
  Work item = (batch, kv head, tile of BQ rows), the rows of a kv head enumerating
  (query head of its group, query), so GQA/MQA query heads share every K/V tile read.  Each thread packs the K of
  the kv head it works on into transposed 16-key panels ``(ceil(Skv/16), D, 16)`` (zero
  padded; a thread buffer, repacked only when the head changes), so that
  S = (scale*Q_tile) K^T and acc += P V both run on one register-blocked micro-kernel:
  an MR-row x 16-column block of C kept in 8 vector registers (8 x 16 in zmm on AVX-512
  targets, 4 x 16 as two 8-wide vectors a row otherwise: MR below), updated by broadcast(A)
  x a 16-wide row of B per step of the inner dimension (the classic GEMM micro-kernel,
  written directly in LLVM IR: numba's pipeline has no SLP vectorizer, so scalar code
  would not become vector code).  Keys stream through in tiles of BK (up to ONE_TILE keys
  as one tile) with an online
  softmax (running max m, sum l, rescaled accumulator); no Sq x Skv buffer exists.
  Causal: K tiles wholly above the diagonal are not visited, the diagonal tile is masked
  per row.  A row that sees no key (mask all False / -inf, or causal with Sq > Skv) is 0.
  NaN in, NaN out, as PyTorch: a row is NaN when its scores include NaN (NaN in q, in k,
  or in an additive mask) or +inf (inf in q or in the mask: exp(inf - inf)); a mask
  (bool False, or additive -inf) adds -inf to the score, so NaN at a masked key still
  counts, while keys past the causal limit never do (as PyTorch's default CPU kernel).
  NaN in V makes that column NaN in the rows that see the key; whether it reaches rows
  that do not (0 * NaN in the P V product) depends on the tiling, as in PyTorch.

split-KV (cpu-splitkv)
  For decode (few queries, long cache).  Work item = (batch, kv head, kv split, chunk of
  RC query rows); the rows of one item are all query heads of the kv group (x queries),
  so each K/V row is read once for the whole GQA group.  Scores are dot products over D
  (vectorized), P V updates accumulator rows; each split writes a partial (m, l, acc) and
  a second parallel pass combines the splits.
"""
import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .approx import (OVERLOAD, JIT, JIT_INNER, JIT_BY_ADDRESS, _target_has_avx512, bits_to_float, fexp, fexp_nonpos,
                     like, wide_loops)
from .half import widen
from .parallel import (c_array_at, call_address, fetch_add, keep_alive, like_dtype, prefetch, run_serial,
                       run_workers, view_at, worker_address, worker_addresses, zero_of)

from kernels_common.attention import MASK_ADD, MASK_BOOL, MASK_NONE  # noqa: F401  (one table with CUDA)

# The micro-kernel's block, MR rows x NC columns of C: 8 x 16 in 8 zmm accumulators on an
# AVX-512 target, 4 x 16 in 8 ymm (two 8-lane vectors a row) otherwise.  Chosen from the
# features numba compiles for (approx._target_has_avx512), which its cache is keyed on, so
# a cached kernel never carries the other choice; a Haswell target (NUMBA_CPU_NAME=haswell,
# tests/test_attention.py) runs the 4-row one on any x86 host.  Sapphire Rapids, one thread,
# CPU time, medians of 9 interleaved (2026-11-25, loaded host), 4 x 16 ymm -> 8 x 16 zmm:
# 1x12x512x64 11.1 -> 9.7 ms, causal 1x12x2048x64 84.4 -> 74.3 ms, 1x12x128x64 1.02 ->
# 0.89 ms.  (16-lane auto-vectorized softmax loops, approx.wide_loops, were slower here:
# 11.3 -> 12.8 ms at 1x12x512x64.)
WIDE = _target_has_avx512()
MR, NC = (8, 16) if WIDE else (4, 16)
BQ = 64          # queries per flash work item (multiple of MR)
BK = 64          # keys per streamed K/V tile (multiple of NC)
# flash: up to ONE_TILE keys stream as one tile (no online-softmax rescale between tiles),
# its width rounded up to a multiple of BK; longer key ranges in tiles of BK.  Measured on
# MiniLM's attention, 16x12x198x32 with a padding mask, float32, 2 threads, interleaved with
# PyTorch's SDPA, alternating processes (2026-11-26, Sapphire Rapids, a noisy host): 64-key
# tiles 10.5-11.8 ms (0.64-0.67x PyTorch), one 208-key tile 10.0-10.3 ms (0.69-0.72x), one
# 256-key tile 9.5-10.9 ms (0.71-0.76x); 1x12x128x64 and 1x12x512x64 unchanged within noise.
# With 256-key tiles at every length, 1x12x512x64 was 4-7% slower than with 64 (4.86-4.99
# vs 4.57-4.76 ms): longer ranges keep BK.  Raised to 1024 (a 64 x 1024 float32 score tile
# is 256 KiB, in L2): one tile of all the keys beat 64-key tiles up to 1024 keys (2 threads,
# Zen 4, a process per setting, alternating, medians of 11-15 batches, 2026-12-05), ms, 256
# -> 1024: 1x12x384x64 2.62-2.72 -> 2.44-2.62 (at 512: 2.40-2.58), 1x12x512x64 4.72-4.83 ->
# 4.18-4.52, 2x12x512x64 padding mask 11.6-12.2 -> 9.3-9.5, 1x32x512x128 causal 14.9-15.4
# -> 13.7-14.5, 1x12x1024x64 18.2-18.3 -> 16.7-17.0, 1x32x1024x128 causal 50.5-50.8 ->
# 48.3-49.9; 16x12x198x32 masked and causal 1x12x2048x64 (BK tiles either way) unchanged.
# (One 2048-key tile: causal 2048 34.8 / 37.9 against 37.9 / 38.3, not taken.)
ONE_TILE = 1024
# flash: with at least HEADS_PER_WORKER (batch, kv head) pairs per worker, a worker takes
# all row tiles of a head at once (F_CHUNK), so it packs that head's K (and copies its V)
# alone; handed out a tile at a time, both threads packed every head.  MiniLM's attention,
# 16x12x198x32 (4 row tiles a head), padding mask, 2 threads (2026-11-26, Sapphire Rapids):
# K packing and V copies were 9% of the samples; interleaved medians of 15 x 5 calls,
# 7.45 ms a tile at a time, 7.20 ms a head at a time.  Lowered from 8 to 4 so that BERT's
# 12 heads on 2 threads go a head at a time too (2026-11-27, Zen 5, 2 threads, interleaved
# medians of 9 x 30 ms, two runs, threshold 8 -> 4): 1x12x128x64 201.6 / 195.5 -> 188.0 /
# 183.5 us, 1x12x512x64 2345 / 2356 -> 2295 / 2291 us; 16x12x198x32 and 1x32x512x128, a
# head at a time under both, unchanged within noise.  (At 1 the same, but fewer heads than
# 4 per worker would leave one thread idle on a long last head.)
HEADS_PER_WORKER = 4
# flash (V off lines): a V whose rows are adjacent but start off cache lines (numpy's allocations start
# 16 bytes past one) is copied per head like non-adjacent rows (flash_worker), onto lines:
# there every 64-byte load of acc += P V split over two lines.  2 threads, Sapphire Rapids,
# medians of 11 x 10-100 calls, two runs (2026-12-07), V 16 bytes off / copied, us:
# 1x12x512x64 3473-3470 / 3156-3265 (V on lines: 3213-3281), 1x12x256x64 947-969 /
# 935-978, 1x12x128x64 284-286 / 273-291; old / new processes alternating, three pairs:
# 1x12x512x64 with V off lines 3477-3658 -> 3296-3416.  (Phases of that shape, each
# skipped in turn: S = Q K^T 1.2 ms, P V 1.45, the softmax 0.6 of 3.5.)
RC = 8           # query rows per split-KV work item
SPLIT_MIN = 256  # fewest keys per split-KV split


# ---- the register-blocked micro-kernel -------------------------------------------------

def _make_micro(fir, width, rows, nvec, vstride=False):
    """An emitter of C[r, 0:width*nvec] (+)= sum_k A[r*a_rs + k*a_ks] * B[k*ldb + 0:width*nvec]
    for r < rows: emit(builder, args) writes the block's LLVM IR where the builder stands.

    args are int64 LLVM values: element pointers (from ``arr.ctypes.data``) and strides in
    elements, (a_ptr, a_rs, a_ks, b_ptr, ldb, c_ptr, ldc, kdim, accumulate[, b_vs]).
    accumulate != 0 adds to C, else C is overwritten.  The rows x nvec vector accumulators
    live in registers for the whole k loop (allocas promoted by LLVM).  vstride: B's vector
    v is at B[k*ldb + v*b_vs] (a last argument b_vs) instead of B[k*ldb + v*width]: blocks of
    two K^T panels (pack_k_head) in one call."""
    vty = ir.VectorType(fir, width)
    suffix = "v%d%s" % (width, "f32" if isinstance(fir, ir.FloatType) else "f64")
    isz = 4 if isinstance(fir, ir.FloatType) else 8

    def emit(builder, args):
        a_ptr, a_rs, a_ks, b_ptr, ldb, c_ptr, ldc, kdim, accf = args[:9]
        b_vs = args[9] if vstride else ir.Constant(ir.IntType(64), width)
        i64, i32 = ir.IntType(64), ir.IntType(32)
        pty, vpty = fir.as_pointer(), vty.as_pointer()
        A = builder.inttoptr(a_ptr, pty)
        B = builder.inttoptr(b_ptr, pty)
        C = builder.inttoptr(c_ptr, pty)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vty, [vty, vty, vty]), "llvm.fma." + suffix)
        zero = ir.Constant(vty, None)
        doacc = builder.icmp_signed("!=", accf, ir.Constant(i64, 0))

        def c_addr(r, v):
            off = builder.add(builder.mul(ir.Constant(i64, r), ldc), ir.Constant(i64, v * width))
            return builder.bitcast(builder.gep(C, [off]), vpty)

        accs = []
        for r in range(rows):
            row = []
            for v in range(nvec):
                slot = cgutils.alloca_once(builder, vty)
                builder.store(zero, slot)
                row.append(slot)
            accs.append(row)
        with builder.if_then(doacc):
            for r in range(rows):
                for v in range(nvec):
                    builder.store(builder.load(c_addr(r, v), align=isz), accs[r][v])
        bcast = ir.Constant(ir.VectorType(i32, width), [0] * width)
        undef = ir.Constant(vty, ir.Undefined)
        with cgutils.for_range(builder, kdim) as loop:
            k = loop.index
            bp = builder.gep(B, [builder.mul(k, ldb)])
            bvs = [builder.load(builder.bitcast(builder.gep(bp, [builder.mul(b_vs, ir.Constant(i64, v))]), vpty),
                                align=isz) for v in range(nvec)]
            kofs = builder.mul(k, a_ks)
            for r in range(rows):
                ap = builder.gep(A, [builder.add(kofs, builder.mul(ir.Constant(i64, r), a_rs))])
                a = builder.insert_element(undef, builder.load(ap, align=isz), ir.Constant(i32, 0))
                a = builder.shuffle_vector(a, undef, bcast)
                for v in range(nvec):
                    builder.store(builder.call(fma, [a, bvs[v], builder.load(accs[r][v])]), accs[r][v])
        for r in range(rows):
            for v in range(nvec):
                builder.store(builder.load(accs[r][v]), c_addr(r, v), align=isz)

    return emit


_emit_micro_f32 = _make_micro(ir.FloatType(), 16, 8, 1) if WIDE else _make_micro(ir.FloatType(), 8, 4, 2)  # 8 accumulators
# Two 16-column blocks at once on AVX-512 (16 zmm accumulators: 8 broadcasts and 2 B loads
# feed 16 FMAs, where the one-block kernel issues 9 loads for 8): the flash item's S = Q K^T
# over pairs of K^T panels and acc += P V over 32 of V's columns.  Sapphire Rapids, float32,
# interleaved medians, two alternating process pairs (2026-11-26), one block -> pairs, ms:
# cpu-serial 1x12x128x64 0.76-0.77 -> 0.65-0.72, 1x12x512x64 9.05-9.31 -> 7.43-7.77,
# MiniLM-shaped 16x12x198x32 (no mask) 15.3 -> 13.5-14.5; cpu-flash (2 threads) 0.50 ->
# 0.45-0.47, 4.87-4.95 -> 4.11-4.34, 7.97-8.04 -> 7.32-7.74.  Cold first call of bert-base
# attention: 4.13-4.40 s -> 4.41-4.52 s (noisy; on a Haswell target, where pairs are two
# one-block calls, 3.88-3.95 -> 3.85-4.11).
_emit_micro2_f32 = _make_micro(ir.FloatType(), 16, 8, 2, vstride=True) if WIDE else None
_emit_micro_f64 = _make_micro(ir.DoubleType(), 4, 2, 4)  # 2 x 16: 8 accumulators
# One row of C, ROW_NC float32 columns (8 vector accumulators): split-KV's acc += p V for a
# query row, which the 8-row block above would compute 8 times over; the plain loop sent
# the row through memory once per key.  Decode, 1 query, causal, float32, 2 threads,
# alternating processes (2026-11-26, Sapphire Rapids): 32 heads x 4096 keys x 128:
# 5.96-5.98 -> 4.83-5.07 ms; GQA 32/8 heads: 1.32-1.36 -> 1.19-1.22 ms.  D = 64 (not a
# multiple of 128 here) keeps the plain loop: 0.48-0.49 ms either way; a plain loop for
# the columns past the last block (a run-time start) took twice as long, so D that is not
# a multiple of the block runs the plain loop whole.
ROW_NC = 128 if WIDE else 64
_emit_row_micro_f32 = _make_micro(ir.FloatType(), ROW_NC // 8, 1, 8)
_emit_row_micro_f64 = _make_micro(ir.DoubleType(), ROW_NC // 16, 1, 8)

# micro, micro_pair and row_micro are intrinsics that pick the element type's block from
# their first argument's type and write its code in place.  As @overload(inline="always")
# wrappers around per-dtype intrinsics, numba typed a copy of the wrapper at every call site:
# bert-base attention's cold first call spent 0.72 s typing micro (39 resolutions) and
# 0.42 s micro_pair (6) of its 10 s (Zen 3, 2026-12-02); as plain calls LLVM left them out
# of line and 1x12x512x64 causal ran 6.1-6.5 -> 8.6-9.9 ms.
_I64 = ir.IntType(64)


def _plus(builder, ptr, k, stride):
    """ptr + k * stride (int64 LLVM values; k a Python int)."""
    return builder.add(ptr, builder.mul(ir.Constant(_I64, k), stride))


def _emit_micro(builder, is32, args):
    """MR x 16 block of `micro` (args as _make_micro's emitters take them, without b_vs)."""
    if is32:
        _emit_micro_f32(builder, args)
        return
    a_ptr, a_rs, a_ks, b_ptr, ldb, c_ptr, ldc, kdim, accf = args
    for h in range(MR // 2):  # 2-row float64 blocks
        _emit_micro_f64(builder, [_plus(builder, a_ptr, h * 2 * 8, a_rs), a_rs, a_ks, b_ptr, ldb,
                                  _plus(builder, c_ptr, h * 2 * 8, ldc), ldc, kdim, accf])


def _float_type(x):
    """True for float32, False for float64, None for anything else (the intrinsics' typing)."""
    return {types.float32: True, types.float64: False}.get(x)


@intrinsic
def micro(typingctx, x, a_ptr, a_rs, a_ks, b_ptr, ldb, c_ptr, ldc, kdim, accumulate):
    """MR x 16 block: C[0:MR, 0:16] (+)= A(MR x kdim, strides a_rs, a_ks) B(kdim x 16, row stride
    ldb).  x: any scalar of the element type (selects float32 / float64)."""
    is32 = _float_type(x)
    if is32 is None:
        return None

    def codegen(context, builder, sig, args):
        _emit_micro(builder, is32, list(args[1:]))
        return context.get_dummy_value()

    return types.none(x, *([types.intp] * 9)), codegen


@intrinsic
def micro_pair(typingctx, x, a_ptr, a_rs, a_ks, b_ptr, ldb, b_vs, c_ptr, ldc, kdim, accumulate):
    """Two MR x 16 blocks, C[0:MR, 0:32] (+)= A B0 | A B1, B1 b_vs elements after B0: one
    register block on AVX-512 float32 (_emit_micro2_f32), two micro blocks elsewhere."""
    is32 = _float_type(x)
    if is32 is None:
        return None
    isz = 4 if is32 else 8

    def codegen(context, builder, sig, args):
        a_ptr, a_rs, a_ks, b_ptr, ldb, b_vs, c_ptr, ldc, kdim, accf = args[1:]
        if is32 and WIDE:
            _emit_micro2_f32(builder, [a_ptr, a_rs, a_ks, b_ptr, ldb, c_ptr, ldc, kdim, accf, b_vs])
        else:
            _emit_micro(builder, is32, [a_ptr, a_rs, a_ks, b_ptr, ldb, c_ptr, ldc, kdim, accf])
            _emit_micro(builder, is32, [a_ptr, a_rs, a_ks, _plus(builder, b_ptr, isz, b_vs), ldb,
                                        builder.add(c_ptr, ir.Constant(_I64, NC * isz)), ldc, kdim, accf])
        return context.get_dummy_value()

    return types.none(x, *([types.intp] * 10)), codegen


@intrinsic
def row_micro(typingctx, x, a_ptr, b_ptr, ldb, c_ptr, kdim):
    """C[0, 0:ROW_NC (float32) or ROW_NC/2 (float64)] += sum_k A[k] * B[k*ldb + ...]: one
    row, eight independent vector accumulators.  x: a scalar of the element type."""
    is32 = _float_type(x)
    if is32 is None:
        return None
    emit = _emit_row_micro_f32 if is32 else _emit_row_micro_f64

    def codegen(context, builder, sig, args):
        a_ptr, b_ptr, ldb, c_ptr, kdim = args[1:]
        zero, one = ir.Constant(_I64, 0), ir.Constant(_I64, 1)
        emit(builder, [a_ptr, zero, one, b_ptr, ldb, c_ptr, zero, kdim, one])
        return context.get_dummy_value()

    return types.none(x, *([types.intp] * 5)), codegen


# ---- shared pieces ---------------------------------------------------------------------

@intrinsic
def unit_row(typingctx, row):
    """A 1-D view with unit stride, retyped as C-contiguous (no owner: the caller holds the
    array).  The workers rebuild q/k/v/out as strided views ('A' layout), so numba
    indexes their rows with a run-time stride and LLVM leaves those loops scalar;
    flash()/splitkv() only accept views whose rows have unit stride, so the retyped row
    is the same memory.  An intrinsic, not numba.carray: that is a function each caller
    compiles and links."""
    if not (isinstance(row, types.Array) and row.ndim == 1):
        return None
    rty = types.Array(row.dtype, 1, "C")

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        out = context.make_array(rty)(context, builder)
        context.populate_array(out, data=src.data, shape=src.shape,
                               strides=cgutils.pack_array(builder, [src.itemsize]), itemsize=src.itemsize,
                               meminfo=None)
        return out._getvalue()

    return rty(row), codegen


def _make_rowmax(fir, width, nacc=4):
    """An emitter of max(init, x[0:n]) for the n elements at address ptr, in `width`-wide
    vectors with `nacc` independent accumulators, then a shuffle tree: emit(builder, ptr,
    n, init) writes the code and returns the LLVM value.  numba's max() loop stays scalar
    (LLVM does not vectorize a compare+select reduction without nnan), which cost ~80 cycles
    per 64-key row.  NaN inputs give an unspecified max (the row's output is NaN either
    way)."""
    vty = ir.VectorType(fir, width)
    isz = 4 if isinstance(fir, ir.FloatType) else 8

    def emit(builder, ptr, n, init):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        P = builder.inttoptr(ptr, fir.as_pointer())

        def vmax(x, y):
            return builder.select(builder.fcmp_ordered(">", x, y), x, y)

        undef = ir.Constant(vty, ir.Undefined)
        splat = builder.insert_element(undef, init, ir.Constant(i32, 0))
        splat = builder.shuffle_vector(splat, undef, ir.Constant(ir.VectorType(i32, width), [0] * width))
        accs = []
        for _ in range(nacc):
            slot = cgutils.alloca_once(builder, vty)
            builder.store(splat, slot)
            accs.append(slot)
        step = width * nacc
        nblk = builder.sdiv(n, ir.Constant(i64, step))
        with cgutils.for_range(builder, nblk) as loop:
            base = builder.mul(loop.index, ir.Constant(i64, step))
            for t in range(nacc):
                p = builder.gep(P, [builder.add(base, ir.Constant(i64, t * width))])
                x = builder.load(builder.bitcast(p, vty.as_pointer()), align=isz)
                builder.store(vmax(builder.load(accs[t]), x), accs[t])
        v = builder.load(accs[0])
        for t in range(1, nacc):
            v = vmax(v, builder.load(accs[t]))
        h = width // 2
        while h >= 1:
            sh = builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(i32, width),
                                                              [(t + h) % width for t in range(width)]))
            v = vmax(v, sh)
            h //= 2
        sacc = cgutils.alloca_once(builder, fir)
        builder.store(builder.extract_element(v, ir.Constant(i32, 0)), sacc)
        start = builder.mul(nblk, ir.Constant(i64, step))
        with cgutils.for_range_slice(builder, start, n, ir.Constant(i64, 1), inc=True) as (idx, _):
            x = builder.load(builder.gep(P, [idx]))
            m = builder.load(sacc)
            builder.store(builder.select(builder.fcmp_ordered(">", x, m), x, m), sacc)
        return builder.load(sacc)

    return emit


_emit_rowmax_f32 = _make_rowmax(ir.FloatType(), 8, 2)
_emit_rowmax_f64 = _make_rowmax(ir.DoubleType(), 4, 2)


@intrinsic
def rowmax(typingctx, ptr, n, init):
    """max(init, the n elements at address ptr); float32 or float64 after init's type (an
    intrinsic for the reason micro is one)."""
    is32 = _float_type(init)
    if is32 is None:
        return None
    emit = _emit_rowmax_f32 if is32 else _emit_rowmax_f64

    def codegen(context, builder, sig, args):
        return emit(builder, *args)

    return init(types.intp, types.intp, init), codegen


@njit(inline="always", **JIT)
def _exp_nan(t):
    """fexp(t), except NaN for a NaN t (fexp gives 0 there).  The online softmax relies on
    it to carry NaN: a NaN score, or +inf (exp(inf - inf)), makes p, hence l and the
    row's output, NaN, as in PyTorch, with no per-row test.  One compare + blend per
    vector in the exp loop."""
    p = fexp(t)
    return p if t == t else t


@njit(inline="always", **JIT)
def _mask_row(masks, b, h, i, j0, jn, mkind, mb):
    """mb[:jn] = the additive form of mask row (b, h, i) at keys j0..j0+jn-1: a bool mask's
    False becomes -inf (as PyTorch adds it: a NaN score at a masked key stays NaN), True
    0.  masks: the (bool, float) views of the broadcast mask (any strides; _views), of
    which the run-time mkind says which one is the mask.  Converting the row into a
    contiguous float row once, then adding that with unit stride, is what lets the add
    vectorize; callers convert once per K tile for all rows that share a mask row (a
    padding mask broadcast over heads and queries), which took the bool mask's cost in
    the MiniLM shape (16x12x198x32) from 6.8 ms to 2 ms of 31 ms (one thread)."""
    ninf = -np.inf
    zero = mb.dtype.type(0)
    if mkind == MASK_BOOL:
        mrow = masks[0][b, h, i]
        for j in range(jn):
            mb[j] = zero if mrow[j0 + j] else ninf
    else:
        mrow = masks[1][b, h, i]
        for j in range(jn):
            mb[j] = mrow[j0 + j]


@njit(inline="always", **JIT)
def _row_softmax_update(srow, jn, lim, mb, mask, m_old, l_old):
    """Turn scores srow[:jn] into exp(s - m_new) in place, after adding the additive mask
    row mb[:jn] (see _mask_row; unused when mask, the caller's mask views, is None) and masking keys >= lim
    (causal); returns (m_new, l_new, alpha) of the online softmax (alpha rescales the
    accumulator).  A row with nothing visible so far keeps m = -inf, l = 0 and
    contributes zeros.  A NaN score (NaN in q, k or an additive mask; +inf - inf) gives
    p = NaN, so l and the accumulator turn NaN and stay NaN (NaN * alpha, NaN + s)
    whatever m does later (rowmax may skip NaN); the row's output is then NaN.  A key
    past the causal limit is set to -inf (its score never matters: whole tiles of such
    keys are not even computed)."""
    ninf = -np.inf
    if mask is not None:
        for j in range(jn):
            srow[j] = srow[j] + mb[j]
    for j in range(max(lim, 0), jn):
        srow[j] = ninf
    m_new = rowmax(srow.ctypes.data, jn, m_old)
    mu = m_new if m_new > ninf else srow.dtype.type(0)
    if m_new == m_old:
        alpha = srow.dtype.type(1)
    elif m_old == ninf:
        # exp(-inf - mu) is 0 for every mu this can be (finite, +inf, or 0 for a NaN max):
        # the first tile of every row lands here, and a scalar exp a row was 5% of
        # BERT-base 1x12x128x64 (perf, one thread, Sapphire Rapids, 2026-12-03)
        alpha = srow.dtype.type(0)
    else:
        alpha = _exp_nan(m_old - mu)
    s = _exp_shift_sum(srow, jn, mu)
    return m_new, l_old * alpha + s, alpha


@njit(**JIT_INNER)
def _exp_shift_sum(srow, n, mu):
    """srow[:n] = exp(srow[:n] - mu) (NaN stays NaN); returns their sum.  A function of
    its own so that only this loop runs 16 lanes wide on AVX-512 (approx.wide_loops: the
    short D-long loops of a flash item lose to their scalar remainders at 16 lanes).
    64 rows of 208 keys, one thread, Sapphire Rapids (2026-11-26): 5.1 us at 8 lanes,
    3.8 us at 16; at 198 keys the 16-lane loop's 6-element scalar tail took 6.6 us, so
    the flash item pads its rows to a multiple of 16 keys (flash_item)."""
    wide_loops()
    s = srow.dtype.type(0)
    for j in range(n):
        t = srow[j] - mu  # <= 0 or NaN: mu is the row's max (or 0 when that is -inf)
        p = fexp_nonpos(t)
        p = p if t == t else t
        srow[j] = p
        s += p
    return s


@njit(**JIT_INNER)
def pack_k_head(kh, kph):
    """kph[c, d, t] = kh[16c + t, d] (zeros past the last key): K^T in 16-key panels.
    A whole panel is written a 16-key row of K^T at a time (contiguous stores, strided
    loads): 128x64 float32 in cache, one thread, Sapphire Rapids (2026-12-03), 2.4 us with
    the loops the other way round (scattered stores), 1.5 us so."""
    S, D = kh.shape
    z = kh.dtype.type(0)
    for c in range(kph.shape[0]):
        panel = kph[c]
        if (c + 1) * NC <= S:
            blk = kh[c * NC:(c + 1) * NC]
            for d in range(D):
                prow = panel[d]
                for t in range(NC):
                    prow[t] = blk[t, d]
        else:
            for t in range(NC):
                j = c * NC + t
                if j < S:
                    row = unit_row(kh[j])
                    for d in range(D):
                        panel[d, t] = row[d]
                else:
                    for d in range(D):
                        panel[d, t] = z


@njit(**JIT_INNER)
def _copy_rows(src, dst):
    """dst[:, :] = src for a (S, D) view with unit-stride rows."""
    for j in range(src.shape[0]):
        s = unit_row(src[j])
        d = dst[j]
        for t in range(src.shape[1]):
            d[t] = s[t]


# ---- flash ---------------------------------------------------------------------------

@njit(inline="always")
def k_panels(skv):
    """The 16-key K^T panels pack_k_head writes for skv keys, rounded up to an even count
    (the item scores them in pairs): the worker's scratch and the item's view of it."""
    return (skv + 2 * NC - 1) // (2 * NC) * 2


@njit(inline="always")
def flash_tile(skv):
    """Keys per flash tile for a key range of skv: all of them (rounded up to a multiple of
    BK) up to ONE_TILE, else BK; at least two K^T panels (the score blocks come in pairs)."""
    return max(2 * NC, (skv + BK - 1) // BK * BK) if skv <= ONE_TILE else BK


# A flash worker's block for its items (int64), read by flash_item: the call's block (_params),
# the item (batch x kv head, row tile), the kv head's K^T panels (pack_k_head), its V rows
# (address and row stride in elements: v's own rows, or the worker's copy of them) and the
# worker's scratch arrays (flash_worker).
(J_PARAMS, J_BH, J_QT, J_KPH, J_VH, J_LDV, J_QS, J_ST, J_ACC, J_ROWS3, J_RIH) = range(11)
J_COUNT = 11


def _convert_mask_row(masked, masks, b, h, i, j0, jn, mkind, mb, mprev):
    """mb = the additive mask row (b, h, i) at keys j0.. (_mask_row), unless mprev (the
    address of the last row converted) says it holds that row already; returns the row's
    address.  For a literal False masked (no mask) nothing, typed and compiled as nothing:
    flash_item's mask views are never None (it rebuilds them from addresses), so numba's
    pruning of `masks is not None` cannot drop the mask code there."""
    return mprev


@overload(_convert_mask_row, **OVERLOAD)
def _convert_mask_row_overload(masked, masks, b, h, i, j0, jn, mkind, mb, mprev):
    if not isinstance(masked, types.Literal):
        return None
    if not masked.literal_value:
        return lambda masked, masks, b, h, i, j0, jn, mkind, mb, mprev: mprev

    def convert(masked, masks, b, h, i, j0, jn, mkind, mb, mprev):
        mp = masks[0][b, h, i].ctypes.data
        if mp != mprev:  # rows that share a mask row (a broadcast mask) convert it once per tile
            _mask_row(masks, b, h, i, j0, jn, mkind, mb)
        return mp

    return convert


@njit(**JIT_BY_ADDRESS)
def flash_item(w, block, is64, masked):
    """One work item, called by address from flash_worker (compiled once, alone: linked into
    the worker as a plain callee, its code was optimized and turned into machine code a
    second time there, as attention_grad.backward_item's was; numba's inline="always"
    instead costs more than it saves: copying the item's IR, 113 blocks, took 0.49 s).
    Cold first call, empty cache, old / new processes alternating (Zen 4, 2026-12-05):
    1x12x128x64 3.11-3.20 -> 2.95-2.98 s, 1x12x128x32 3.15-3.17 -> 2.95; run time within
    -4% .. +1% (9 x 10-200 calls: 1x12x128x64 314-323 / 321-325 us, 16x12x198x32 with a
    padding mask 7.75-8.04 / 7.66-7.76 ms, without 7.21-7.27 / 7.47-7.59).  block: the item block
    (J_*); masked: whether there is a mask (a literal: one compiled item per dtype and
    masked or not, as the worker).

    Rows qt*BQ .. qt*BQ+BQ-1 of kv group hk in batch b, where the group's rows enumerate
    (query head, query): row rr is head hk*G + rr // Sq, query rr % Sq, so the query heads
    sharing a kv head read each K/V tile once (GQA/MQA).  kph: that kv head's K^T panels
    (pack_k_head); vh (Skv, D): its V, unit-stride rows.  qs (BQ, D), st (BQ, bk), acc (BQ,
    D), mv, lv (BQ,) and mb (>= bk: the additive mask row of the current K tile) are the
    worker's scratch (bk, the keys per tile, is st's width: flash_tile); ri, rh (BQ,) int64
    hold each row's query index and head (divisions done once, not per K tile).  lse (B,
    Hq, Sq), or an empty array: when not empty, each row's log-sum-exp of its scores, m +
    log(l) from the online softmax's running max and sum (-inf for a row that sees no key,
    NaN where the output is NaN): what attention_backward recomputes P from.  The mask
    code is compiled only for a masked variant (_convert_mask_row, _mask_arg: BERT-base
    1x12x128x64's cold first call, Zen 5, 2026-11-27: 2.92-2.98 -> about 2.7 s without it),
    the run-time mkind picks the mask's bool or float view; causal: run time too (see
    _variant)."""
    ip = c_array_at(block, np.int64(0), (J_COUNT,))
    p = c_array_at(ip[J_PARAMS], np.int64(0), (F_COUNT,))
    z = like_dtype(is64)
    q, k, _, masks, out, scale = _views(p, z, z)
    lse = _lse_view(p, z)
    mkind, causal = p[F_MKIND], p[F_CAUSAL] != 0
    Hkv = k.shape[1]
    isz = q.itemsize
    Skv, D = k.shape[2], q.shape[3]
    bk = flash_tile(Skv)
    kph = c_array_at(ip[J_KPH], z, (k_panels(Skv), D, NC))
    vh = view_at(ip[J_VH], z, (Skv, D), (ip[J_LDV] * isz, isz))
    qs = c_array_at(ip[J_QS], z, (BQ, D))
    st = c_array_at(ip[J_ST], z, (BQ, bk))
    acc = c_array_at(ip[J_ACC], z, (BQ, D))
    rows3 = c_array_at(ip[J_ROWS3], z, (3, max(BQ, bk)))
    mv, lv, mb = rows3[0, :BQ], rows3[1, :BQ], rows3[2]
    rih = c_array_at(ip[J_RIH], np.int64(0), (2, BQ))
    ri, rh = rih[0], rih[1]
    b, hk, qt = ip[J_BH] // Hkv, ip[J_BH] % Hkv, ip[J_QT]
    Hq, Sq = q.shape[1], q.shape[2]
    G = Hq // Hkv
    dt = q.dtype.type
    zero, ninf = dt(0), dt(-np.inf)
    r0 = qt * BQ
    nq = min(BQ, G * Sq - r0)
    nqr = (nq + MR - 1) // MR * MR
    off = Skv - Sq
    kv_end = Skv
    last = 0
    for r in range(nq):
        rr = r0 + r
        ri[r] = rr % Sq
        rh[r] = hk * G + rr // Sq
        last = max(last, ri[r])
    if causal:
        kv_end = min(Skv, last + off + 1)
    d16 = D // NC * NC
    for r in range(nqr):
        qrow = qs[r]
        if r < nq:
            src = unit_row(q[b, rh[r], ri[r]])
            for d in range(D):
                qrow[d] = src[d] * scale
        else:
            for d in range(D):
                qrow[d] = zero
        arow = acc[r]
        for d in range(d16, D):  # the first tile's P V overwrites columns < d16 (accumulate 0)
            arow[d] = zero
        mv[r] = ninf
        lv[r] = zero
    ldv = vh.strides[0] // isz
    qs_p, st_p, acc_p = qs.ctypes.data, st.ctypes.data, acc.ctypes.data
    kp_p, v_p = kph.ctypes.data, vh.ctypes.data
    for j0 in range(0, kv_end, bk):
        jn = min(bk, kv_end - j0)
        ncb = (jn + NC - 1) // NC
        # S = (scale Q) K^T in pairs of MR x 16 blocks (K^T panels D * NC elements apart);
        # an odd count runs one zero panel more (kph has an even number of panels, st's
        # width is a multiple of 2 * NC), whose keys the softmax below masks with the
        # others past jn: one call site
        ncb += ncb % 2
        for cb in range(0, ncb, 2):
            bptr = kp_p + (j0 // NC + cb) * D * NC * isz
            for rb in range(0, nqr, MR):
                micro_pair(zero, qs_p + rb * D * isz, D, 1, bptr, NC, D * NC,
                           st_p + (rb * bk + cb * NC) * isz, bk, D, 0)
        # masks and online softmax, row by row, over the scores of whole 16-key blocks
        # (jp): the keys past jn are masked like causal ones (-inf, exp 0), so the
        # vectorized loops have no scalar remainder; the mask row's entries past jn are
        # never written and are overwritten by -inf after the add
        jp = ncb * NC
        mprev = -1
        for r in range(nq):
            i = ri[r]
            lim = jn
            if causal:
                lim = min(jn, i + off + 1 - j0)
            mprev = _convert_mask_row(masked, masks, b, rh[r], i, j0, jn, mkind, mb, mprev)
            mo = mv[r]
            mn, ln, alpha = _row_softmax_update(st[r], jp, lim, mb, _mask_arg(masked, masks), mo, lv[r])
            mv[r] = mn
            lv[r] = ln
            if alpha != dt(1) and j0 > 0:  # on the first tile acc is still all zeros
                arow = acc[r]
                for d in range(D):
                    arow[d] *= alpha
        # acc += P V (acc = P V on the first tile), 32 of V's columns at once, then 16
        d32 = D // (2 * NC) * 2 * NC
        accum = 1 if j0 > 0 else 0
        for d0 in range(0, d32, 2 * NC):
            bptr = v_p + (j0 * ldv + d0) * isz
            for rb in range(0, nqr, MR):
                micro_pair(zero, st_p + rb * bk * isz, bk, 1, bptr, ldv, NC,
                           acc_p + (rb * D + d0) * isz, D, jn, accum)
        for d0 in range(d32, d16, NC):
            bptr = v_p + (j0 * ldv + d0) * isz
            for rb in range(0, nqr, MR):
                micro(zero, st_p + rb * bk * isz, bk, 1, bptr, ldv,
                      acc_p + (rb * D + d0) * isz, D, jn, accum)
        if d16 < D:
            for r in range(nq):
                arow = acc[r]
                prow = st[r]
                for j in range(jn):
                    p = prow[j]
                    vrow = unit_row(vh[j0 + j])
                    for d in range(d16, D):
                        arow[d] += p * vrow[d]
    if lse.size:
        for r in range(nq):
            lse[b, rh[r], ri[r]] = mv[r] + np.log(lv[r])  # l = 0: -inf (log 0), whatever m is
    for r in range(nq):
        orow = unit_row(out[b, rh[r], ri[r]])
        arow = acc[r]
        l = lv[r]
        if l == zero:  # saw no key: zeros (acc may hold 0 * NaN from V)
            for d in range(D):
                orow[d] = zero
        else:  # l > 0, or NaN: NaN in, NaN out
            inv = dt(1) / l
            for d in range(D):
                orow[d] = arow[d] * inv


@njit(**JIT_INNER)
def _item_coords(t, BH, nqt):
    """Work item t -> (bh, qt): head-major (neighbouring items share K/V in cache), the
    last row tile first (under causal masking it has the most keys: the longest items are
    handed out first, so the dynamic schedule ends balanced)."""
    return t // nqt, nqt - 1 - t % nqt


# The workers' arguments, read from an int64 block (_params): addresses, sizes, byte
# strides (numpy's), the item counter and how many items a worker takes at once
# (F_CHUNK), the mask kind and causal (F_MKIND, F_CAUSAL: read at run time, see _variant),
# and for split-KV its partials and phase.
(F_NEXT, F_Q, F_K, F_V, F_MASK, F_OUT, F_B, F_HQ, F_HKV, F_SQ, F_SKV, F_D,
 F_SCALE, F_VROWS, F_PM, F_PL, F_PACC, F_NSPLIT, F_SPLIT_LEN, F_PHASE, F_LSE, F_CHUNK, F_MKIND, F_CAUSAL,
 F_ITEM) = range(25)
F_STRIDES = 25            # then 4 byte strides each of q, k, v, mask, out
F_COUNT = F_STRIDES + 20


def _params(q, k, v, mask, mkind, causal, out, scale, lse=None):
    """The int64 block a worker reads q, k, v, mask (the 4-D broadcast view, or a dummy
    for MASK_NONE), the mask's kind, causal and out from; q/k/v/out rows must have unit
    stride, all strides be non-negative (the worker rebuilds each view from its first
    element).  lse: None, or a C-contiguous (B, Hq, Sq) array of q's dtype for the rows'
    log-sum-exp.  A fresh, writable copy of the cached block for these shapes and
    strides (_plan) with the addresses filled in.  Built whole for every call it took
    9.6 us of a 29 us call (1x1x16x16, Sapphire Rapids, 2026-12-03), 6.2 us so.  Filling
    the addresses in numba (parallel.addresses: 2.0 us) would add a compile of its own to
    the cold first call (3.16 -> 3.4 s, empty cache, same host), which the 3 s bar has no
    room for."""
    if lse is not None and not (lse.flags.c_contiguous and lse.dtype == q.dtype and lse.shape == q.shape[:3]):
        raise ValueError("attention kernels: lse must be a C-contiguous (B, Hq, Sq) array of q's dtype")
    p = _plan(q.shape, v.shape, q.itemsize, k.itemsize, (q.strides, k.strides, v.strides, mask.strides, out.strides),
              mask.itemsize, (q.size > 0, k.size > 0, v.size > 0, mask.size > 0, out.size > 0),
              int(mkind), bool(causal), float(scale)).copy()
    p[F_Q], p[F_K], p[F_V] = q.ctypes.data, k.ctypes.data, v.ctypes.data
    p[F_MASK], p[F_OUT] = mask.ctypes.data, out.ctypes.data
    if lse is not None:
        p[F_LSE] = lse.ctypes.data
    return p


@functools.lru_cache(maxsize=256)
def _plan(qshape, vshape, itemsize, kvitemsize, strides_all, mitemsize, nonempty, mkind, causal, scale):
    """_params' block without addresses, read-only (each call copies it); strides_all and
    nonempty: the strides of q, k, v, mask and out, and whether each has elements;
    kvitemsize: k's and v's (2 for split-KV's 16-bit K / V, else itemsize)."""
    B, Hq, Sq, D = qshape
    Hkv, Skv = vshape[1], vshape[2]
    vs = strides_all[2]
    p = np.zeros(F_COUNT, np.int64)
    for i, slot in enumerate((F_Q, F_K, F_V, F_MASK, F_OUT)):
        strides = strides_all[i]
        isz = mitemsize if slot == F_MASK else kvitemsize if slot in (F_K, F_V) else itemsize
        if nonempty[i] and (min(strides) < 0 or (slot != F_MASK and strides[-1] != isz)):
            raise ValueError("attention kernels: strides must be non-negative, and q/k/v/out rows unit-stride")
        base = F_STRIDES + 4 * (slot - F_Q)
        p[base:base + 4] = strides
    p[F_B], p[F_HQ], p[F_HKV], p[F_SQ], p[F_SKV], p[F_D] = B, Hq, Hkv, Sq, Skv, D
    p[F_SCALE] = np.float64(scale).view(np.int64)
    p[F_VROWS] = int(vs[2] != D * kvitemsize)  # V rows not adjacent: each head is copied
    p[F_CHUNK] = 1
    p[F_MKIND], p[F_CAUSAL] = mkind, int(causal)
    p.flags.writeable = False
    return p


def _variant(q, mkind):
    """The literals a worker is compiled for: (float64?, masked?).  The mask's kind (bool
    or additive) and causal are read at run time (F_MKIND, F_CAUSAL): as literals they made
    twelve compiled variants of each of flash, split-KV and the backward, of which the
    attention tests compiled 36 (190 s of their 197 s on one core with the variants that
    CI's portability step leaves in the cache; Zen 4, 2026-12-02); a test per row and
    per key tile is all they cost at run time.  No mask at all stays a variant of its
    own: _mask_arg's None prunes the mask code from the compile."""
    return bool(q.dtype == np.float64), mkind != MASK_NONE


def flash(q, k, v, mask, mkind, causal, scale, out, nworkers, lse=None):
    """out = attention(q, k, v) (see the module docstring) on nworkers workers (1: on the
    calling thread).  q, k, v, out: views with unit-stride rows; mask: the 4-D broadcast
    mask view (a dummy for MASK_NONE); lse: None or a C-contiguous (B, Hq, Sq) array that
    receives each row's log-sum-exp (see flash_item).

    flash_worker runs by address (parallel.run_workers), compiled per (dtype, masked or
    not: _variant) for every input layout at once (it rebuilds the views from addresses
    and strides): no parfor gufunc and kernel recompiling its code, and contiguous inputs
    and fused-QKV views share one compiled worker.  Workers take items from an atomic
    counter one at a time (dynamic: a thread the OS pauses does not hold back the call)."""
    B, Hq, Sq, D = q.shape
    Hkv = v.shape[1]
    p = _params(q, k, v, mask, mkind, causal, out, scale, lse)
    if not p[F_VROWS] and (D * q.itemsize) % 64 == 0 and (p[F_V] | v.strides[0] | v.strides[1]) % 64:
        p[F_VROWS] = 1   # copied onto cache lines ("flash (V off lines)" above)
    # the item first: the larger compile (cold: 1.55 of 2.85 s), done here while a helper
    # process compiles the worker (parallel.worker_addresses)
    p[F_ITEM], fn = worker_addresses([(flash_item, _variant(q, mkind)), (flash_worker, _variant(q, mkind))])
    nqt = ((Hq // Hkv) * Sq + BQ - 1) // BQ
    nitems = B * Hkv * nqt
    if B * Hkv >= HEADS_PER_WORKER * nworkers:
        p[F_CHUNK] = nqt
    if nworkers <= 1:
        run_serial(fn, p)
    else:
        run_workers(fn, p, min(nworkers, nitems))


def _mask_arg(masked, masks):
    return masks


@overload(_mask_arg, **OVERLOAD)
def _mask_arg_overload(masked, masks):
    """The mask's views for a literal True, None for a literal False (see flash_item)."""
    if not isinstance(masked, types.Literal):
        return None
    if not masked.literal_value:
        return lambda masked, masks: None
    return lambda masked, masks: masks


@njit(inline="always")
def _views(p, z, zkv):
    """(q, k, v, masks, out, scale) rebuilt from the int64 block p (see _params) as
    strided views; z: a zero of the element type, zkv: of k's and v's (z, or split-KV's
    16-bit bits); masks: the mask as a bool and as a float view (_mask_row reads the one
    its run-time kind names; a dummy for no mask)."""
    B, Hq, Hkv, Sq, Skv, D = p[F_B], p[F_HQ], p[F_HKV], p[F_SQ], p[F_SKV], p[F_D]
    s = F_STRIDES
    q = view_at(p[F_Q], z, (B, Hq, Sq, D), (p[s], p[s + 1], p[s + 2], p[s + 3]))
    k = view_at(p[F_K], zkv, (B, Hkv, Skv, D), (p[s + 4], p[s + 5], p[s + 6], p[s + 7]))
    v = view_at(p[F_V], zkv, (B, Hkv, Skv, D), (p[s + 8], p[s + 9], p[s + 10], p[s + 11]))
    mstrides = (p[s + 12], p[s + 13], p[s + 14], p[s + 15])
    masks = (view_at(p[F_MASK], False, (B, Hq, Sq, Skv), mstrides), view_at(p[F_MASK], z, (B, Hq, Sq, Skv), mstrides))
    out = view_at(p[F_OUT], z, (B, Hq, Sq, D), (p[s + 16], p[s + 17], p[s + 18], p[s + 19]))
    return q, k, v, masks, out, like(z, bits_to_float(p[F_SCALE]))


@njit(inline="always")
def _lines(n, per_line):
    """n elements rounded up to whole cache lines of per_line elements."""
    return (n + per_line - 1) // per_line * per_line


@njit(inline="always")
def _lse_view(p, z):
    """The (B, Hq, Sq) log-sum-exp array at p[F_LSE], or an empty one when it is 0 (not
    asked for)."""
    if p[F_LSE] != 0:
        return c_array_at(p[F_LSE], z, (p[F_B], p[F_HQ], p[F_SQ]))
    return c_array_at(p[F_Q], z, (0, 0, 0))


@njit(**JIT_BY_ADDRESS)
def flash_worker(w, params, is64, masked):
    """Worker w of a flash() call: rebuilds k and v as strided views of the addresses in
    the int64 block at params (so every layout compiles the same worker), then takes work
    items from the block's counter until none are left and runs each through flash_item
    (at p[F_ITEM]) with its own item block and scratch.  Scratch is its own: K^T panels of
    the kv head it holds (repacked only when an item's head differs; items are head-major,
    so a head is packed about once per worker) and, when V's rows are not adjacent (q/k/v
    views of a fused QKV projection: rows 3*H apart), a copy of that head's V: 64 V rows
    4.6 KB apart span 72 pages, more than the L1 TLB holds (the views cost 16.5 ms against
    13.6 ms contiguous in the MiniLM shape 16x12x198x32).  masked: flash_item's (the worker
    is compiled per variant, as the item)."""
    p = c_array_at(params, np.int64(0), (F_COUNT,))
    z = like_dtype(is64)
    B, Hq, Hkv, Sq, Skv, D = p[F_B], p[F_HQ], p[F_HKV], p[F_SQ], p[F_SKV], p[F_D]
    st = F_STRIDES
    k = view_at(p[F_K], z, (B, Hkv, Skv, D), (p[st + 4], p[st + 5], p[st + 6], p[st + 7]))
    v = view_at(p[F_V], z, (B, Hkv, Skv, D), (p[st + 8], p[st + 9], p[st + 10], p[st + 11]))
    vrows = p[F_VROWS] != 0
    nqt = ((Hq // Hkv) * Sq + BQ - 1) // BQ
    BH = B * Hkv
    # scratch: one allocation carved into cache-line-aligned arrays with no owner
    # (c_array_at: views of their rows touch no reference count), where eight np.empty
    # of three signatures were three more compiles; with only k and v rebuilt here (the
    # item rebuilds the rest), cold first call 1x12x128x64, old / new alternating (Zen 4,
    # 2026-12-05): 2.96-3.07 -> 2.79-2.91 s, run time unchanged within noise
    isz = 8 if is64 else 4
    L = 64 // isz  # elements per cache line
    nkp = k_panels(Skv)
    bk = flash_tile(Skv)
    o_vb = _lines(nkp * D * NC, L)
    o_qs = o_vb + _lines((Skv if vrows else 0) * D, L)
    o_st = o_qs + _lines(BQ * D, L)
    o_acc = o_st + _lines(BQ * bk, L)
    o_rows3 = o_acc + _lines(BQ * D, L)
    o_rih = o_rows3 + _lines(3 * max(BQ, bk), L)
    o_ip = o_rih + _lines(2 * BQ * 8 // isz, L)
    nbytes = (o_ip + _lines(J_COUNT * 8 // isz, L)) * isz
    owned = np.empty(nbytes // 8 + 8, np.int64)  # one line more: its start rounded up to a line
    base = (owned.ctypes.data + 63) // 64 * 64
    kph = c_array_at(base, z, (nkp, D, NC))
    vb = c_array_at(base + o_vb * isz, z, (Skv if vrows else 0, D))
    ip = c_array_at(base + o_ip * isz, np.int64(0), (J_COUNT,))
    ip[J_PARAMS], ip[J_KPH] = params, base
    ip[J_QS], ip[J_ST], ip[J_ACC] = base + o_qs * isz, base + o_st * isz, base + o_acc * isz
    ip[J_ROWS3], ip[J_RIH] = base + o_rows3 * isz, base + o_rih * isz
    item, block = p[F_ITEM], ip.ctypes.data
    held = -1  # the (batch * Hkv + kv head) whose panels kph holds
    chunk = p[F_CHUNK]
    while True:
        t0 = fetch_add(p, F_NEXT, chunk)
        if t0 >= BH * nqt:
            break
        for t in range(t0, min(t0 + chunk, BH * nqt)):
            bh, qt = _item_coords(t, BH, nqt)
            if held != bh:
                vh = v[bh // Hkv, bh % Hkv]
                pack_k_head(k[bh // Hkv, bh % Hkv], kph)
                if vrows:
                    _copy_rows(vh, vb)
                    ip[J_VH], ip[J_LDV] = vb.ctypes.data, D
                else:
                    ip[J_VH], ip[J_LDV] = vh.ctypes.data, vh.strides[0] // isz
                held = bh
            ip[J_BH], ip[J_QT] = bh, qt
            call_address(item, (w, block))
    keep_alive(owned)


# ---- split-KV --------------------------------------------------------------------------

@njit(**JIT_INNER)
def _split_item(q, k, v, masks, mkind, causal, scale, b, hk, sp, rc, split_len, pm, pl, pacc,
                qs, st, acc):
    """Keys [sp*split_len, ...) for query rows rc*RC .. of kv group hk; rows enumerate
    (head in group, query): row rr -> head hk*G + rr // Sq, query rr % Sq.  Writes the
    unnormalized partial (m, l, acc) of split sp.  masks, mkind, causal: as flash_item's.
    k and v may hold bfloat16 / float16 bits (half.py) with q float32: each element widened
    as it is read, so a decode step streams 2 bytes per cached element, not the 4 + 4 + 2
    of a float32 copy made first (then the plain p V loop: row_micro reads float32)."""
    Hq, Sq, D = q.shape[1], q.shape[2], q.shape[3]
    Hkv, Skv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    dt = q.dtype.type
    zero, ninf = dt(0), dt(-np.inf)
    R = G * Sq
    r0 = rc * RC
    nr = min(RC, R - r0)
    js = sp * split_len
    je = min(Skv, js + split_len)
    off = Skv - Sq
    ri = np.empty(RC, np.int64)
    rh = np.empty(RC, np.int64)
    last = 0
    for r in range(nr):
        rr = r0 + r
        ri[r] = rr % Sq
        rh[r] = hk * G + rr // Sq
        last = max(last, ri[r])
    if causal:
        je = min(je, last + off + 1)
    mb = np.empty(BK, q.dtype)
    kh, vh = k[b, hk], v[b, hk]
    for r in range(nr):
        src = unit_row(q[b, rh[r], ri[r]])
        qrow = qs[r]
        for d in range(D):
            qrow[d] = src[d] * scale
        arow = acc[r]
        for d in range(D):
            arow[d] = zero
    mvals = pm[b, hk, sp]
    lvals = pl[b, hk, sp]
    for r in range(nr):
        mvals[r0 + r] = ninf
        lvals[r0 + r] = zero
    isz = q.itemsize
    kisz = kh.itemsize
    rnc = ROW_NC if isz == 4 else ROW_NC // 2
    by_block = D % rnc == 0 and kisz == isz
    st_p, acc_p, v_p = st.ctypes.data, acc.ctypes.data, vh.ctypes.data
    ldv = vh.strides[0] // kisz
    ldk = kh.strides[0] // kisz
    line = 64 // kisz
    for j0 in range(js, je, BK):
        jn = min(BK, je - j0)
        for j in range(jn):
            krow = unit_row(kh[j0 + j])
            # the next tile's K and V rows asked for now, a tile ahead of their use: a decode
            # call is a stream of K / V tiles from memory, which the hardware prefetcher
            # alone kept at 22-24 GB/s on 2 threads.  Llama-7B decode (32 heads, 4096 keys,
            # D 128), 2 threads, 4 alternating processes (Xeon with AVX-512, 2026-12-03):
            # 5.50-5.98 -> 5.04-5.34 ms; two tiles ahead 5.16-5.24; one thread 10.6 -> 10.3.
            if j0 + BK + j < je:
                for d in range(0, D, line):
                    prefetch(kh, (j0 + BK + j) * ldk + d)
                    prefetch(vh, (j0 + BK + j) * ldv + d)
            for r in range(nr):
                qrow = qs[r]
                s = zero
                for d in range(D):
                    s += qrow[d] * widen(krow[d])
                st[r, j] = s
        for r in range(nr):
            rr = r0 + r
            i = ri[r]
            lim = jn
            if causal:
                lim = min(jn, i + off + 1 - j0)
            if masks is not None:
                _mask_row(masks, b, rh[r], i, j0, jn, mkind, mb)
            mn, ln, alpha = _row_softmax_update(st[r], jn, lim, mb, masks, mvals[rr], lvals[rr])
            mvals[rr] = mn
            lvals[rr] = ln
            if alpha != dt(1):
                arow = acc[r]
                for d in range(D):
                    arow[d] *= alpha
        # acc[r] += p V: with D a multiple of the one-row block, block by block with the
        # accumulators in registers (see ROW_NC); else the plain loop, the row through
        # memory once per key
        if by_block:
            for r in range(nr):
                for d0 in range(0, D, rnc):
                    row_micro(zero, st_p + r * BK * isz, v_p + (j0 * ldv + d0) * isz, ldv,
                              acc_p + (r * D + d0) * isz, jn)
        else:
            for j in range(jn):
                vrow = unit_row(vh[j0 + j])
                for r in range(nr):
                    p = st[r, j]
                    arow = acc[r]
                    for d in range(D):
                        arow[d] += p * widen(vrow[d])
    dst = pacc[b, hk, sp]
    for r in range(nr):
        drow = dst[r0 + r]
        arow = acc[r]
        for d in range(D):
            drow[d] = arow[d]


def splitkv(q, k, v, mask, mkind, causal, scale, out, nsplit, split_len, pm, pl, pacc, nworkers, lse=None):
    """out = attention(q, k, v) by split-KV (see the module docstring) on nworkers workers.
    pm, pl (B, Hkv, nsplit, G*Sq), pacc (B, Hkv, nsplit, G*Sq, D): C-contiguous partials.
    Two passes of splitkv_worker, by address like flash(): the split items, then (after
    all of them: the first run_workers returns when every worker is done) the combine,
    which also writes each row's log-sum-exp into lse when given (as flash())."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    R = (Hq // Hkv) * Sq
    p = _params(q, k, v, mask, mkind, causal, out, scale, lse)
    for slot, arr in ((F_PM, pm), (F_PL, pl), (F_PACC, pacc)):
        if not (arr.flags.c_contiguous and arr.dtype == q.dtype):
            raise ValueError("splitkv: the partials must be C-contiguous arrays of q's dtype")
        p[slot] = arr.ctypes.data
    p[F_NSPLIT], p[F_SPLIT_LEN] = nsplit, split_len
    fn = worker_address(splitkv_worker, _variant(q, mkind) + (k.dtype.char,))
    for phase, nitems in ((0, B * Hkv * nsplit * ((R + RC - 1) // RC)), (1, B * Hkv * R)):
        p[F_PHASE], p[F_NEXT] = phase, 0
        run_workers(fn, p, max(1, min(nworkers, nitems)))


@njit(**JIT_BY_ADDRESS)
def splitkv_worker(w, params, is64, masked, kv):
    """Worker w of one splitkv() pass (the block's F_PHASE): 0, split items (batch, kv
    head, split, chunk of RC query rows) writing the partials; 1, rows combining them.
    Items are taken from the block's counter one at a time.  kv: the literal type
    character of k and v (q's, or "H" / "h" for bfloat16 / float16 bits)."""
    p = c_array_at(params, np.int64(0), (F_COUNT,))
    q, k, v, masks, out, scale = _views(p, like_dtype(is64), zero_of(kv))
    lse = _lse_view(p, like_dtype(is64))
    mkind, causal = p[F_MKIND], p[F_CAUSAL] != 0
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    R = G * Sq
    nsplit, split_len = p[F_NSPLIT], p[F_SPLIT_LEN]
    z = q.dtype.type(0)
    pm = c_array_at(p[F_PM], z, (B, Hkv, nsplit, R))
    pl = c_array_at(p[F_PL], z, (B, Hkv, nsplit, R))
    pacc = c_array_at(p[F_PACC], z, (B, Hkv, nsplit, R, D))
    if p[F_PHASE] == 0:
        nrc = (R + RC - 1) // RC
        qs = np.empty((RC, D), q.dtype)
        st = np.empty((RC, BK), q.dtype)
        acc = np.empty((RC, D), q.dtype)
        while True:
            t = fetch_add(p, F_NEXT, 1)
            if t >= B * Hkv * nsplit * nrc:
                break
            rc = t % nrc
            u = t // nrc
            sp = u % nsplit
            bh = u // nsplit
            _split_item(q, k, v, _mask_arg(masked, masks), mkind, causal, scale, bh // Hkv, bh % Hkv,
                        sp, rc, split_len,
                        pm, pl, pacc, qs, st, acc)
    else:
        while True:
            t = fetch_add(p, F_NEXT, 1)
            if t >= B * Hkv * R:
                break
            rr = t % R
            bh = t // R
            b, hk = bh // Hkv, bh % Hkv
            t_lse = _combine_row(pm[b, hk], pl[b, hk], pacc[b, hk], rr, unit_row(out[b, hk * G + rr // Sq, rr % Sq]))
            if lse.size:
                lse[b, hk * G + rr // Sq, rr % Sq] = t_lse


@njit(**JIT_INNER)
def _combine_row(pm, pl, pacc, rr, orow):
    """orow = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits that saw a
    key (l_s != 0; 0 if none did).  NaN carries: a split with l_s NaN (a NaN or +inf
    score) or a NaN in acc_s (NaN in V) makes the row NaN; M may skip a NaN m_s, which
    does not matter as that split's l_s is NaN.  Returns the row's log-sum-exp, M + log L
    (-inf when no split saw a key, NaN when L is)."""
    nsplit = pm.shape[0]
    D = orow.shape[0]
    dt = orow.dtype.type
    zero = dt(0)
    M = dt(-np.inf)
    for s in range(nsplit):
        M = max(M, pm[s, rr])
    mu = M if M > dt(-np.inf) else zero  # -inf: only splits with NaN l_s can be left
    for d in range(D):
        orow[d] = zero
    L = zero
    for s in range(nsplit):
        ls = pl[s, rr]
        if ls == zero:  # saw no key: adds nothing (its acc may hold 0 * NaN from V)
            continue
        w = _exp_nan(pm[s, rr] - mu)
        L += w * ls
        src = pacc[s, rr]
        for d in range(D):
            orow[d] += w * src[d]
    if L != zero:
        inv = dt(1) / L
        for d in range(D):
            orow[d] *= inv
    return mu + np.log(L)
