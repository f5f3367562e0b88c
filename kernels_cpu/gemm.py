"""Matrix multiply with a fused bias + activation epilogue: C = act(A @ B + bias).

Shapes (every kernel): ``a3`` is (Ba, M, K), or (Ba, K, M) when ``transa``; ``b3`` is
(Bb, K, N), or (Bb, N, K) when ``transb`` (PyTorch's Linear weight layout, read as its
transpose without a copy); both C-contiguous.  ``out3`` is (nbatch, M, N) C-contiguous and
output batch ``i`` is ``a3[a_idx[i]] @ b3[b_idx[i]]`` (numpy batch broadcasting is done by
the index arrays).  ``bias`` has N entries (zeros when the call has no bias); ``code`` is
an approx.ACT_* activation applied after the bias.

gemm_parallel: the cache-blocked GEMM (the BLIS design), in one parallel region.
  1. pack A into MR-row panels ``ap[ba, panel, k, 0:MR]`` and B into NR-column panels
     ``bp[bb, panel, k, 0:NR]`` (zero padded at the edges; transposed sources go through
     a register-transpose intrinsic); workers take panels from an atomic counter, and a
     worker that finds a panel unfinished packs it again rather than wait (no barrier).
     When all M rows are one row block (and no B batch is shared), B's panels are packed
     by the task that reads them instead, right before its micro-kernels; and a (K, N) B
     with short rows is not packed at all there: the micro-kernel reads its panels in
     place, row k at k*N (B_IN_PLACE; a partial last panel is still packed).  An A of
     whole MR-row panels (not transposed, no custom packer) is not packed either: the
     micro-kernel broadcasts its values straight from its MR rows (A_IN_PLACE_OK; the
     worker is compiled per A form); an A that must be packed, under one column block,
     is packed by the task that reads it into its worker's slice (A_TASK_OK); a caller's A
     packer may write plain rows instead of panels (a_rows: the backward's g', read then as
     an A in place);
  2. then (batch x row block x column block) tasks, also from an atomic counter (dynamic
     scheduling: a thread that loses its core to another process does not hold up the
     other).  A task walks K in blocks of kc and for each (NR panel, MR panel) pair runs
     the micro-kernel: MR x NR accumulators in vector registers, kc steps of
     "broadcast A, vector-load B, FMA", then the tile is stored into the output (first K
     block) or added to it (later blocks) straight from the registers;
  3. bias + activation are applied to the task's block right after its last K block,
     while the block is in L2 (the fused epilogue: no extra pass over the output).
The worker (gemm_worker, per dtype) calls the packers for the operands' layouts and the
epilogue for the activation by address: each is compiled once, alone (parallel.py).

The micro-kernel is an LLVM-IR intrinsic (see `micro_tile`): numba
leaves LLVM's SLP vectorizer off, so an unrolled scalar version stays scalar, and a loop
version gets its k loop vectorized (the wrong loop).  The intrinsic emits the vector loop
directly, for a register tile from TILES chosen once at import from the target's features
(NK_GEMM_TILE=6x16|8x48|12x32 overrides; `use_tile` switches it in-process for tests):
  6x16 (AVX2 + FMA, and the portable choice): float32 6 x 16 (12 ymm accumulators),
    float64 6 x 8, 8 x f32 / 4 x f64 vectors.  Alone in L1 on a Zen 3 host: 105-110
    GFLOP/s per core; the whole GEMM 90-95 on one thread at 1024^3 (OpenBLAS 91-96).
  8x48 (the AVX-512 default): float32 8 x 48 (24 zmm accumulators, 3 B vectors, 1
    broadcast), float64 8 x 24, k unrolled by 4, A and C prefetched.  1024^3 on one
    Sapphire Rapids core: 150-160 GFLOP/s against OpenBLAS's 154-162 (6x16 there: 91).
  12x32 (BLIS SkylakeX's sgemm shape): selectable, measured beside 8x48 (TILES).
The IR uses only llvm.fma on <W x float> vectors and plain loads / stores, no x86
intrinsics: on aarch64 or any other target LLVM lowers the same code (the 6x16 tile is
the default there).  The workers, packers and micro-kernel are compiled per (dtype, tile),
the tile a literal argument.  conv2d (kernels_cpu/conv.py) runs the 6x16 tile.

gemm_rows: for few rows and a large (N, K) weight (linear): out^T = w @ x^T with the weight
read in place as the micro-kernel's A operand (MR of its rows per tile) and only x packed.

gemv_nk: few rows (decode) against B stored (N, K) (``transb``, a Linear weight): tasks of
weight rows on the thread team, dot_tile (kernels_cpu/dot_tile.py) dotting each group of
weight rows with every row of A (dot_row for one row), the next group prefetched.  gemv_kn: B stored (K, N):
slabs of whole rows on the team into partial sums, then a pass adding them with the
epilogue.

epilogue: bias + activation in place on a (rows, N) result (the "blas" path), on the team.
"""
import functools
import math
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .approx import (OVERLOAD, ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU, ACTIVATIONS, JIT_BY_ADDRESS, gelu,
                     gelu_tanh, relu, silu, wide_loops)
from . import target
from .dot_tile import TA, TB, dot_row, dot_tile
from .llvm_ir import arg_readers, prefetch as prefetch_line
from .parallel import (addresses, c_array_at, call_address, fetch_add, like_dtype, only_if, prefetch, run_workers,
                       worker_address, worker_addresses)

# Register tiles MR x NR.  "6x16": 6 rows x 2 vectors of 8 float32 = 12 accumulator
# registers + 2 B vectors + 1 broadcast A value = 15 of the 16 AVX2 registers (the BLIS /
# OpenBLAS Haswell shape); it runs at 95 GFLOP/s per core at 1024^3 against OpenBLAS's 93-96
# (measurements beside KC_MAX in dispatch/ops/linalg.py).  The AVX-512 tiles use 16-float32
# vectors and the 32 zmm registers (BLIS SkylakeX: sgemm 32x12, dgemm 16x14 in its
# orientation); the AVX-512 default (HOST_WIDE) is chosen from the measurements beside
# TILES.  The IR is target-independent (llvm.fma on <W x float>): on a host without
# AVX-512 (or aarch64) LLVM splits a 16-lane vector into narrower ones, correct but slower,
# so the wide tiles are the default only where the target has avx512f.
MR = 6            # rows of the 6x16 tile (both dtypes)
NR_F32 = 16       # columns of the 6x16 tile: 2 vectors of 8 float32
NR_F64 = 8        # 2 vectors of 4 float64
# gemv_kn: a (K, N) B read in GEMV_KN_SPLITS slabs of whole rows (each one sequential
# stream), GEMV_KN_ROWS rows per pass over the M x N accumulators.  Streaming 4096 x 4096
# float32 on 2 threads (Xeon with AVX-512, 2026-12-03, prange prototypes): rows per pass
# 1 / 4 / 8: 8.2-8.5 / 28 / 40.5 GB/s (one thread 14 / 24 / 26); a plain read of the same
# rows 55, OpenBLAS's sgemv 53-60.  More than 8 rows 16 KiB apart share the 12 ways of an
# L1 set with the accumulators.  A software prefetch of the rows ahead cost more than it
# gave (1x4096x4096: 2.86 ms with it, 2.09 without).  matmul + bias + relu with b (K, N), 2
# threads, medians of 7 x 10 calls, two alternating processes each, ms, before (blocks of
# 64 columns, each row's 64 values FMA'd into one accumulator row) -> now: 1x4096x4096
# 4.15-4.54 -> 1.74-1.77, 2x4096x4096 9.13-9.67 -> 2.24-2.37, 4x4096x4096 17.4-18.7 ->
# 3.11-3.31, 2x768x3072 1.10-1.30 -> 0.54-0.56 (OpenBLAS + the epilogue: 1.38-1.47,
# 5.46-5.99, 5.42-6.17, 0.70-0.76).
GEMV_KN_SPLITS = 8
GEMV_KN_ROWS = 8
# gemv_nk: weight rows per task (moe.py's FB, not measured here on its own).  linear + bias +
# relu, 2 threads, medians of 7 x 10 calls, two alternating processes each (Xeon with
# AVX-512, 2026-12-03), ms, before (prange over 64 outputs, 4 dot products at a time, each
# row of x on its own pass over the weight block) -> now: 2x4096x4096 3.40-3.54 ->
# 2.51-2.83, 4x4096x4096 4.37-4.62 -> 2.64-2.77, 2x768x3072 0.51-0.52 -> 0.43-0.44,
# 3x768x768 0.158-0.161 -> 0.121-0.130, 7x4096x11008 14.8-15.3 -> 9.3-9.6 (OpenBLAS + the
# epilogue: 6.0-6.6, 6.3-7.0, 0.83-0.92, 0.24-0.29, 21.9-22.3).
GEMV_NK_ROWS = 48


class Tile(NamedTuple):
    """A register tile: mr rows (broadcast A values) x nr vector columns (nr32 float32 /
    nr64 float64 values, vectors of lanes32 / lanes32 // 2 lanes)."""
    name: str
    mr: int
    nr32: int
    nr64: int
    lanes32: int
    unroll: int = 1   # k steps per loop iteration
    pfa: int = 0      # prefetch A this many bytes ahead of the current k (0: none)
    pfc: bool = False  # prefetch C's tile rows at the start
    a_outer: bool = False  # a task's loop: A panels outer (else B panels outer)

    def nr(self, dtype) -> int:
        return self.nr32 if np.dtype(dtype) == np.float32 else self.nr64

    def describe(self, dtype=np.float32) -> str:
        lanes = self.lanes32 if np.dtype(dtype) == np.float32 else self.lanes32 // 2
        return f"{self.mr}x{self.nr(dtype)} of {lanes}-lane {np.dtype(dtype).name} vectors"


# Index = the literal the workers are compiled for.  0 is the AVX2 tile and conv2d's; the
# AVX-512 ones unroll k by 4, prefetch A pfa bytes ahead and C's rows before the stores.
# Measured on Sapphire Rapids ("rocketlake" to LLVM), 2 shared cores, 2026-11-25, float32,
# one thread, GFLOP/s as medians of 7-11 interleaved rounds (numpy = OpenBLAS 0.3.31 in the
# same rounds; other jobs loaded the host, so differences under ~5% are noise):
#   1024^3, plain loop:   6x16 91, 12x32 133-137, 14x32 134, 8x48 139, numpy 157
#   + unroll 4:           12x32 139, 8x48 139;  + prefetch A and C: 12x32 145, 14x32 142,
#                         8x48 140 (numpy 152)
#   after B-packing prefetch (PACK_PF_ROWS), through dispatch: 12x32 151, 14x32 149,
#                         8x48 154, numpy 154, onnxruntime 155
#   128x768x768 (dispatch): 6x16 58, 12x32 86, 14x32 84, 8x48 93, numpy 117, ort prepacked 157
#   linear 128x768x3072 + bias + gelu, prepacked: 6x16 7.85 ms, 12x32 5.36, 14x32 5.28,
#                         8x48 4.93, onnxruntime prepacked 4.30
# 8x48 fits M = 128 and N = 768 / 3072 with no edge tiles; 12x32 (BLIS SkylakeX's sgemm
# shape) is kept selectable for hosts where it may win (NK_GEMM_TILE=12x32).  Walking A
# panels in the outer loop (a_outer, BLIS's order) measured within noise of B outer.
# Tried and dropped (same host, one thread): prefetching B 768-6144 bytes ahead in the
# micro-kernel (no consistent effect at 128x768x768 or 1024^3), packing a (N, K) B through
# 16 x 16 instead of 8 x 8 register transposes (3072x768 weight: 1.98 ms against 1.67).
TILES = (Tile("6x16", 6, 16, 8, 8),
         Tile("8x48", 8, 48, 24, 16, 4, 256, True),     # 24 zmm accumulators + 3 B + 1 broadcast
         Tile("12x32", 12, 32, 16, 16, 4, 384, True))   # 24 + 2 + 1
TILE_NAMES = tuple(t.name for t in TILES)
NARROW = 0
HOST_WIDE = 1     # the AVX-512 default (measurements beside TILES)
TILE_ENV = "NK_GEMM_TILE"


def host_has_avx512() -> bool:
    """Whether numba compiles for a target with AVX-512 F (kernels_cpu/target.py)."""
    return target.has("avx512f")


def _tile_from_env():
    """The tile index from NK_GEMM_TILE ("auto", unset or empty: the host's), read once at
    import; anything else than a TILE_NAMES entry is an error naming the variable."""
    import os
    val = os.environ.get(TILE_ENV, "").strip()
    if val in ("", "auto"):
        return HOST_WIDE if host_has_avx512() else NARROW
    if val not in TILE_NAMES:
        raise ValueError(f"{TILE_ENV}={val!r}: expected 'auto' or one of {list(TILE_NAMES)}")
    return TILE_NAMES.index(val)


_ACTIVE = [_tile_from_env()]


def active_tile() -> Tile:
    """The register tile the GEMM runs (and packs weights for) now."""
    return TILES[_ACTIVE[0]]


def active_index() -> int:
    """active_tile()'s index in TILES (what the workers are compiled for)."""
    return _ACTIVE[0]


def use_tile(name) -> str:
    """Make `name` (a TILE_NAMES entry, or "auto") the active tile for later calls in this
    process and return the previous one's name.  For tests and measurements (not
    thread-safe against concurrent GEMM calls switching tiles); weights prepacked for
    another tile are refused by the dispatch layer."""
    if name == "auto":
        idx = HOST_WIDE if host_has_avx512() else NARROW
    elif name in TILE_NAMES:
        idx = TILE_NAMES.index(name)
    else:
        raise ValueError(f"use_tile: expected 'auto' or one of {list(TILE_NAMES)}, got {name!r}")
    prev = TILES[_ACTIVE[0]].name
    _ACTIVE[0] = idx
    return prev


def _tile_index(tile):
    if tile is None:
        return _ACTIVE[0]
    if isinstance(tile, Tile):
        return TILES.index(tile)
    if isinstance(tile, str):
        return TILE_NAMES.index(tile)
    return int(tile)


def tile_m(tile=None) -> int:
    """MR (register tile rows) of a tile (default: the active one)."""
    return TILES[_tile_index(tile)].mr


def tile_n(dtype, tile=None) -> int:
    """NR (register tile columns) for a dtype, as used by the packing and the micro-kernel
    (default: the active tile)."""
    return TILES[_tile_index(tile)].nr(dtype)


def pack_shapes(n_a, n_b, M, N, K, dtype, tile=None):
    """Shapes of gemm_parallel's packed A and B for n_a / n_b distinct A / B matrices."""
    t = TILES[_tile_index(tile)]
    nr, mr = t.nr(dtype), t.mr
    return (n_a, -(-M // mr), K, mr), (n_b, -(-N // nr), K, nr)


def _constant(value, ty=types.intp):
    """An intrinsic's codegen that returns the compile-time constant value: the tile
    constants below are intrinsics, not inline="always" overloads, because an overload's
    body is typed and inlined again at every call site (numba's inline_overloads pass took
    0.09 s of gemm_worker's cold compile on Sapphire Rapids, 2026-12-02)."""
    def codegen(context, builder, sig, args):
        return context.get_constant(ty, value)
    return codegen


@intrinsic
def _tnr(typingctx, z, ti):
    """NR of tile TILES[ti] (ti a literal) for the element type of the scalar z."""
    if not isinstance(ti, types.Literal):
        return None
    t = TILES[ti.literal_value]
    return types.intp(z, ti), _constant(t.nr32 if z == types.float32 else t.nr64)


@intrinsic
def _taouter(typingctx, ti):
    """Whether tile TILES[ti] (ti a literal) walks A panels in the outer loop."""
    if not isinstance(ti, types.Literal):
        return None
    return types.boolean(ti), _constant(bool(TILES[ti.literal_value].a_outer), types.boolean)


@intrinsic
def _tmr(typingctx, ti):
    """MR of tile TILES[ti] (ti a literal)."""
    if not isinstance(ti, types.Literal):
        return None
    return types.intp(ti), _constant(TILES[ti.literal_value].mr)


def _micro_codegen(indexed, ti=NARROW, rows_a=False, strided_b=False):
    """The micro-kernel's code generator for tile TILES[ti]; indexed: B row k at
    bp[boff + tab[toff + k]] (the convolution's direct form) instead of bp[boff + k*NR] (a
    packed panel); strided_b: B row k at bp[boff + k*ldb] (an argument ldb after boff: a
    packed panel with ldb = NR, or a row-major B read in place); rows_a: A read in place
    from MR rows of a row-major matrix, element (i, k) at ap[aoff + i*ar + k] (an argument
    ar after aoff), instead of from a packed panel (ap[aoff + k*MR + i])."""
    tile = TILES[ti]
    MR = tile.mr  # noqa: N806 - the tile's rows, shadowing the 6x16 constant
    names = (("kc", "ap", "aoff") + (("ar",) if rows_a else ()) + ("bp", "boff") + (("ldb",) if strided_b else ())
             + (("tab", "toff") if indexed else ()) + ("c", "coff", "ldc", "accumulate"))
    at = {n: i for i, n in enumerate(names)}  # the arguments' positions

    def typer(typingctx, *argtys):
        ap, bp, c = argtys[at["ap"]], argtys[at["bp"]], argtys[at["c"]]
        if not (isinstance(ap, types.Array) and ap.dtype in (types.float32, types.float64)):
            return None
        if bp.dtype != ap.dtype or c.dtype != ap.dtype:
            return None
        is32 = ap.dtype == types.float32
        nr = tile.nr32 if is32 else tile.nr64
        width = tile.lanes32 if is32 else tile.lanes32 // 2
        nv = nr // width

        def codegen(context, builder, sig, args):
            fty = context.get_value_type(sig.args[1].dtype)
            vty = ir.VectorType(fty, width)
            i64, i32 = ir.IntType(64), ir.IntType(32)

            i64_of, data = arg_readers(context, builder, sig, args)

            apd = builder.gep(data(at["ap"]), [i64_of(at["aoff"])])
            bpd = builder.gep(data(at["bp"]), [i64_of(at["boff"])])
            cpd = builder.gep(data(at["c"]), [i64_of(at["coff"])])
            if indexed:
                tabd = builder.gep(data(at["tab"]), [i64_of(at["toff"])])
            ldb = i64_of(at["ldb"]) if strided_b else ir.Constant(i64, nr)
            if rows_a:  # the MR row starts, once: then row i's k-th value is one gep away
                arows = [builder.gep(apd, [builder.mul(i64_of(at["ar"]), ir.Constant(i64, i))]) for i in range(MR)]
            ldc = i64_of(at["ldc"])
            kc64 = i64_of(at["kc"])
            acc = at["accumulate"]
            accumulate = context.cast(builder, args[acc], sig.args[acc], types.boolean)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vty, [vty, vty, vty]),
                "llvm.fma.v%d%s" % (width, "f32" if is32 else "f64"))
            zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * width)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)] for _ in range(MR)]
            undef = ir.Constant(vty, ir.Undefined)
            splat = ir.Constant(ir.VectorType(i32, width), [0] * width)
            esz = 4 if is32 else 8

            if tile.pfc:  # C's rows into L1 before the tile's stores (they follow the FMAs)
                for i in range(MR):
                    row = builder.gep(cpd, [builder.mul(ldc, ir.Constant(i64, i))])
                    for off in range(0, nr * esz, 64):
                        prefetch_line(builder, row, 3, off)

            def step(k):
                if indexed:
                    bbase = builder.gep(bpd, [builder.load(builder.gep(tabd, [k]))])
                else:
                    bbase = builder.gep(bpd, [builder.mul(k, ldb)])
                abase = builder.gep(apd, [builder.mul(k, ir.Constant(i64, MR))])
                if tile.pfa and not rows_a:
                    prefetch_line(builder, abase, 3, tile.pfa)
                bvec = []
                for v in range(nv):
                    ptr = builder.bitcast(builder.gep(bbase, [ir.Constant(i64, v * width)]), vty.as_pointer())
                    bvec.append(builder.load(ptr, align=4))
                for i in range(MR):
                    a = builder.load(builder.gep(arows[i], [k]) if rows_a else builder.gep(abase, [ir.Constant(i64, i)]))
                    av = builder.shuffle_vector(builder.insert_element(undef, a, ir.Constant(i32, 0)), undef, splat)
                    for v in range(nv):
                        builder.store(builder.call(fma, [av, bvec[v], builder.load(accs[i][v])]), accs[i][v])

            unroll = tile.unroll
            if unroll > 1:  # kc // unroll steps of `unroll` k's, then the rest one by one
                ku = ir.Constant(i64, unroll)
                nbody = builder.udiv(kc64, ku)
                with cgutils.for_range(builder, nbody) as loop:
                    k0 = builder.mul(loop.index, ku)
                    for u in range(unroll):
                        step(builder.add(k0, ir.Constant(i64, u)))
                with cgutils.for_range_slice(builder, builder.mul(nbody, ku), kc64, ir.Constant(i64, 1)) as (k, _):
                    step(k)
            else:
                with cgutils.for_range(builder, kc64) as loop:
                    step(loop.index)
            ptrs = [[builder.bitcast(builder.gep(cpd, [builder.add(builder.mul(ldc, ir.Constant(i64, i)), ir.Constant(i64, v * width))]),
                                     vty.as_pointer()) for v in range(nv)] for i in range(MR)]
            with builder.if_else(accumulate) as (then, otherwise):
                with then:
                    for i in range(MR):
                        for v in range(nv):
                            old = builder.load(ptrs[i][v], align=4)
                            builder.store(builder.fadd(old, builder.load(accs[i][v])), ptrs[i][v], align=4)
                with otherwise:
                    for i in range(MR):
                        for v in range(nv):
                            builder.store(builder.load(accs[i][v]), ptrs[i][v], align=4)
            return context.get_dummy_value()

        return types.none(*argtys), codegen

    return typer


def _behind_tile(ti, res):
    """An intrinsic's (signature, codegen) from _micro_codegen's typer result res for the
    arguments after the literal tile ti, which the intrinsic takes first and the generated
    code ignores (None when res is None: the arguments did not type)."""
    if res is None:
        return None
    sig, gen = res

    def codegen(context, builder, sig_, args):
        return gen(context, builder, types.none(*sig_.args[1:]), args[1:])

    return types.none(ti, *sig.args), codegen


@intrinsic
def micro_tile(typingctx, ti, kc, ap, aoff, bp, boff, ldb, c, coff, ldc, accumulate):
    """C[0:mr, 0:nr] (=|+=) (Ap[aoff:] as kc x mr)^T @ (B as kc x nr) for the tile TILES[ti]
    (ti a literal: the worker's compile-time tile), B's row k the nr values at
    bp[boff + k*ldb] (ldb = nr: a packed panel; a row-major B's row length: B in place),
    where C starts at c[coff] with row stride ldc (c is a flat array: the output or a tile
    buffer).

    Emits: mr x (nr/W) vector accumulators (allocas that mem2reg turns into registers),
    a loop over kc doing nr/W unaligned vector loads of B, mr scalar loads of A broadcast
    to a vector, and mr * nr/W llvm.fma calls; then per row nr/W vector stores to C, after
    adding C's old value when ``accumulate``."""
    if not isinstance(ti, types.Literal):
        return None
    res = _micro_codegen(False, ti.literal_value, strided_b=True)(typingctx, kc, ap, aoff, bp, boff, ldb, c, coff,
                                                                  ldc, accumulate)
    return _behind_tile(ti, res)


@intrinsic
def micro_tile_indexed(typingctx, ti, kc, ap, aoff, bp, boff, tab, toff, c, coff, ldc, accumulate):
    """micro_tile with B row k read at bp[boff + tab[toff + k]] (nr contiguous values): a
    direct convolution's B operand straight from the (padded) image, tab holding each k's
    offset (channel, tap) in it (kernels_cpu/conv.py)."""
    if not isinstance(ti, types.Literal):
        return None
    res = _micro_codegen(True, ti.literal_value)(typingctx, kc, ap, aoff, bp, boff, tab, toff, c, coff, ldc,
                                                 accumulate)
    return _behind_tile(ti, res)


@intrinsic
def micro_rows(typingctx, ti, kc, ap, aoff, ar, bp, boff, ldb, c, coff, ldc, accumulate):
    """micro_tile of the tile TILES[ti] (ti a literal) with A read in place from MR rows of
    a row-major matrix: element (i, k) at ap[aoff + i*ar + k] (gemm_rows: the weight's rows;
    gemm_worker: A itself); B's row k at bp[boff + k*ldb] as in micro_tile."""
    if not isinstance(ti, types.Literal):
        return None
    res = _micro_codegen(False, ti.literal_value, rows_a=True, strided_b=True)(typingctx, kc, ap, aoff, ar, bp, boff,
                                                                               ldb, c, coff, ldc, accumulate)
    return _behind_tile(ti, res)


@njit(inline="always")
def store_edge_tile(t, ldt, c, c0, ldc, rows, cols, accumulate):
    """C[0:rows, 0:cols] (=|+=) T[0:rows, 0:cols] for an edge tile the micro-kernel wrote
    into the buffer t (row stride ldt); C at c[c0] with row stride ldc."""
    for ii in range(rows):
        o = c0 + ii * ldc
        if accumulate:
            for j in range(cols):
                c[o + j] += t[ii * ldt + j]
        else:
            for j in range(cols):
                c[o + j] = t[ii * ldt + j]


# ---- epilogue ------------------------------------------------------------------------------

@njit(inline="always")
def act_store(src, bias, dst, n, code):
    """dst[j] = act(src[j] + bias[j]) for j < n; one branch-free loop per activation."""
    if code == ACT_RELU:
        for j in range(n):
            dst[j] = relu(src[j] + bias[j])
    elif code == ACT_GELU_TANH:
        for j in range(n):
            dst[j] = gelu_tanh(src[j] + bias[j])
    elif code == ACT_GELU:
        for j in range(n):
            dst[j] = gelu(src[j] + bias[j])
    elif code == ACT_SILU:
        for j in range(n):
            dst[j] = silu(src[j] + bias[j])
    else:
        for j in range(n):
            dst[j] = src[j] + bias[j]


def act_store_lit(src, bias, dst, n, code):
    """act_store for a literal code (gemm_epilogue's argument): only that activation's
    loop is compiled.  bias: an array (one value per column: the GEMM) or a scalar (one
    value for the whole row: a convolution's output channel, kernels_cpu/conv.py)."""


def _bias_at(bias, j):
    return bias


@overload(_bias_at, inline="always", **OVERLOAD)
def _bias_at_overload(bias, j):
    if isinstance(bias, types.Array):
        return lambda bias, j: bias[j]
    return lambda bias, j: bias


@overload(act_store_lit, inline="always", **OVERLOAD)
def _act_store_lit_overload(src, bias, dst, n, code):
    if not isinstance(code, types.Literal):
        return None
    act = ACTIVATIONS.get(code.literal_value)
    if act is None:
        def bias_only(src, bias, dst, n, code):
            for j in range(n):
                dst[j] = src[j] + _bias_at(bias, j)
        return bias_only

    def biased_act(src, bias, dst, n, code):
        for j in range(n):
            dst[j] = act(src[j] + _bias_at(bias, j))
    return biased_act


@njit(**JIT_BY_ADDRESS)
def gemm_epilogue(c, ldc, rows, n, bias, is64, code):
    """C[i, 0:n] = act(C[i, 0:n] + bias[0:n]) for i < rows, C at address c with row stride
    ldc (elements), bias at address bias; is64 and code are literals: one small function per
    (dtype, activation), called by address from gemm_worker on each finished task block
    (while it is in L2), so the worker itself is compiled per dtype only."""
    wide_loops()  # 16 float32 lanes on AVX-512 hosts
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    bs = c_array_at(bias, z, (n,))
    for i in range(rows):
        cs = c_array_at(c + i * ldc * isz, z, (n,))
        act_store_lit(cs, bs, cs, n, code)


# ---- packing ---------------------------------------------------------------------------------

@intrinsic
def _transpose_block(typingctx, src, s0, ld, dst, d0, ldd):
    """dst[d0 + j*ldd + r] = src[s0 + r*ld + j] for r, j < W (W = 8 float32 / 4 float64 / 8
    uint16): W vector loads, a register transpose (LLVM turns the element moves into
    shuffles) and W vector stores.  The packing's transposed case uses it: scalar code there
    gets its k loop vectorized with 16-way interleaved stores, about 8x slower than a copy."""
    if not (isinstance(src, types.Array) and src.dtype in (types.float32, types.float64, types.uint16)
            and dst.dtype == src.dtype):
        return None
    width = 4 if src.dtype == types.float64 else 8
    align = 2 if src.dtype == types.uint16 else 4

    def codegen(context, builder, sig, args):
        fty = context.get_value_type(sig.args[0].dtype)
        vty = ir.VectorType(fty, width)
        i64, i32 = ir.IntType(64), ir.IntType(32)

        i64_of, data = arg_readers(context, builder, sig, args)

        sp = builder.gep(data(0), [i64_of(1)])
        dp = builder.gep(data(3), [i64_of(4)])
        ld, ldd = i64_of(2), i64_of(5)
        rows = []
        for r in range(width):
            ptr = builder.gep(sp, [builder.mul(ld, ir.Constant(i64, r))])
            rows.append(builder.load(builder.bitcast(ptr, vty.as_pointer()), align=align))
        for j in range(width):
            v = ir.Constant(vty, ir.Undefined)
            for r in range(width):
                v = builder.insert_element(v, builder.extract_element(rows[r], ir.Constant(i32, j)), ir.Constant(i32, r))
            ptr = builder.gep(dp, [builder.mul(ldd, ir.Constant(i64, j))])
            builder.store(v, builder.bitcast(ptr, vty.as_pointer()), align=align)
        return context.get_dummy_value()

    return types.none(src, s0, ld, dst, d0, ldd), codegen


@intrinsic
def _vw(typingctx, x):
    """Vector width (elements) of the micro-kernel and the transposer for x's dtype."""
    return types.intp(x), _constant(8 if x.dtype == types.float32 else 4)


_U = np.uint64  # unsigned indices: numba drops the negative-index fix-up, loops stay simple


# Rows ahead that _pack_contig prefetches: a panel reads R values per source row at the
# row stride (4 KiB for a 1024-column B), one page per row, which the hardware prefetcher
# does not follow.  1024^3 float32, 12x32 tile, one thread (Sapphire Rapids, 2026-11-25):
# B packing took 1.35 ms of 15.0 without it.
# Open: a (K, N) B packed in the GEMM's tasks costs 1.7-2.5x what packing the same panels
# alone does, where a B stored (N, K) costs about the same both ways.  128x3072 @ 3072x768
# (linear_backward's dx: W read as (K, N)), one thread, B packed in the tasks, ms: (K, N)
# 4.30-4.46, (N, K) 3.61-3.69, prepacked 3.07; the 16 panels packed alone 0.54 / 0.64; the
# same at M = 16: 1.45 / 0.96 (Xeon with AMX, 2026-12-07).  No better (one thread): 0 / 4 /
# 48 rows ahead (5.4-5.8 / 4.5-4.9 / 4.6-4.8), prefetchnta (5.9), prefetcht1 16-64 rows
# ahead, t0 8-16 + t1 64-256 rows ahead (4.6-4.8), B at a 2 MiB boundary (8 of its 9 MiB
# on huge pages either way: the same), B_LOCAL_OK off (4.60).  2 threads: 2.23-2.29 against
# 1.92-1.94 ((N, K)).
# Re-measured 2026-12-07 (same host, one thread, alternating in one process, ms, 128x3072 @
# 3072x768): B read in place 4.6-4.9, packed by the tasks 4.6, packed up front 4.7,
# prepacked 3.5-3.8, PyTorch (MKL) 3.7-3.9: with B in panels the micro-kernel matches MKL
# (165 GF/s at this shape; 168 at 1024^3 against 170), the whole gap is B's.  Also no
# better: a software prefetch 32 / 96 / 256 rows ahead on each in-place panel's first pass
# (4.77 / 4.97 / 4.73; 2 threads 2.38-2.39 against 2.36-2.56), packing up front by jobs of
# 64 whole rows of B (each row read once into all 16 panels; alone 0.73 ms against 1.36
# panel by panel, in the GEMM 4.83 against 4.87, 2 threads 2.43-2.47 against 2.52-2.57), kc
# 128 / 192 / 256 / 512 (4.53-4.65), A packed, the 12x32 tile (5.19), A panels outer.  B
# 64-byte aligned and read in place: 4.31 against 4.60 (numpy's 16-byte offset splits each
# 64-byte row load over two lines).  The VM exposes no hardware counters (perf: software
# events only): the cause stays unmeasured.
PACK_PF_ROWS = 16
# _pack_strided transposes a panel's R source rows in runs of PACK_KCH values of k per group
# of vw rows (the source's 64 bytes x vw rows stay in L1 until used): sweeping all R rows at
# each k, it held R lines of rows whose stride is a multiple of 4 KiB (K = 1024, 3072, ...)
# in one L1 set, and each line was fetched twice.  Prepacking a linear weight, 2 threads,
# medians of 9 x 20 calls, two runs (Zen 4, 2026-12-06, /tmp/w/pkt.py), ms, all R rows per
# k (8) / runs of 32 / 64 / 128: (N, K) 768x3072 0.80-0.82 / 0.40-0.47 / 0.305-0.307 /
# 0.30-0.48, 3072x768 0.29-0.47 / 0.32 / 0.26-0.28 / 0.26-0.36, 4096x4096 (from memory)
# 10.7-11.1 / 13.4-13.9 / 10.8 / 10.9-11.2.
PACK_KCH = 64


@njit(inline="always")
def _pack_contig(src, s0, step, nrows, K, dst, d0, R):
    """One packed panel whose R values at one k are contiguous in src (A stored (K, M), B
    stored (K, N)): dst[d0 + k*R + r] = src[s0 + k*step + r] for k < K, r < nrows, and 0
    for nrows <= r < R (a vector copy per k).  src and dst are flat; R is a compile-time
    constant after inlining, so the r loops unroll.  Two layouts, two functions: each
    worker compiles only the one its operand needs."""
    if nrows == R:
        kp = max(K - PACK_PF_ROWS, 0)
        for k in range(K):
            s = s0 + k * step
            d = d0 + k * R
            if k < kp:
                for r in range(0, R, 2 * _vw(dst)):  # one per 64-byte line
                    prefetch(src, _U(s + PACK_PF_ROWS * step + r))
            for r in range(R):
                dst[_U(d + r)] = src[_U(s + r)]
    else:
        _pack_edge(src, s0, 1, step, nrows, K, dst, d0, R)


@njit(inline="always")
def _pack_strided(src, s0, ld, nrows, K, dst, d0, R):
    """One packed panel read from R rows of src at stride ld (A stored (M, K), B stored
    (N, K)): dst[d0 + k*R + r] = src[s0 + r*ld + k], zeros past nrows.  With R a multiple
    of the vector width, W x W blocks go through a register transpose, W rows at a time
    over runs of PACK_KCH values of k; otherwise R source rows are read at column k (the R
    source lines stay in L1 for 64 bytes' worth of k)."""
    if nrows == R and R % _vw(dst) == 0:
        vw = _vw(dst)
        kv = K - K % vw
        for kc in range(0, kv, PACK_KCH):
            kc1 = min(kc + PACK_KCH, kv)
            for r in range(0, R, vw):
                for k in range(kc, kc1, vw):
                    _transpose_block(src, s0 + r * ld + k, ld, dst, d0 + k * R + r, R)
        for k in range(kv, K):
            d = d0 + k * R
            for r in range(R):
                dst[_U(d + r)] = src[_U(s0 + r * ld + k)]
    elif nrows == R:
        for k in range(K):
            d = d0 + k * R
            for r in range(R):
                dst[_U(d + r)] = src[_U(s0 + r * ld + k)]
    else:
        _pack_edge(src, s0, ld, 1, nrows, K, dst, d0, R)


@njit(inline="always")
def _pack_edge(src, s0, ld, step, nrows, K, dst, d0, R):
    """The last panel of an operand (nrows < R): dst[d0 + k*R + r] = src[s0 + r*ld +
    k*step] for r < nrows, zeros after."""
    zero = dst.dtype.type(0)
    for k in range(K):
        s = s0 + k * step
        d = d0 + k * R
        for r in range(nrows):
            dst[_U(d + r)] = src[_U(s + r * ld)]
        for r in range(nrows, R):
            dst[_U(d + r)] = zero


# A GEMM task packs its own B panels (gemm_worker) only if they take at most this many
# bytes: they must still be in L2 (2 MiB a core on the AVX-512 hosts, 512 KiB on Zen 3)
# when its micro-kernels read them.
B_IN_TASK_BYTES = 1 << 20
# ... and into the worker's own slice of the packing buffer (gemm_worker's b_local; off:
# into the panel's own place, for tests comparing the two).
B_LOCAL_OK = True
# P_B_TASK: B not packed by the tasks, packed by them into the panels' own places, or into
# their workers' slices
B_TASK_NONE, B_TASK_OWN, B_TASK_SLICE, B_TASK_KBLOCK = 0, 1, 2, 3
# B_TASK_KBLOCK: a task's panels packed a K block at a time into its worker's slice, right
# before that block's micro-kernels (the K-block packers, _pack_b_n_k / _pack_b_t_k), where
# one whole-K panel would not fit B_IN_TASK_BYTES (K over 5461 float32 with the 8x48 tile):
# one B matrix that the tasks pack.  Such a B was packed whole up front, written to memory
# and read back.  2 threads, medians of 5 rounds of 5 calls alternating in one process
# (Xeon with AMX, 2026-12-07, /tmp/w/bt2.py), ms, up front -> K blocks (PyTorch): linear
# 128x11008x4096 (Llama's FFN down) 72.6-73.7 -> 46.0-46.9 (42.8-42.9), 32x11008x4096 48.8 ->
# 19.6 (19.2), 256x11008x4096 108.6 -> 79.2 (71.4), 512x11008x4096 181 -> 158 (144); matmul
# 128x11008x4096 89.2 -> 59.5 (45.3).  Where a whole panel fits (K = 4096 and less), K
# blocks with more panels per task measured no better: 128x4096x4096 matmul 21.9 / 22.1,
# linear 17.8 / 18.5, 64x4096x4096 14.6 / 19.5, 512x4096x4096 60.9 / 63.6, linear
# 128x3072x768 2.63 / 2.43, 256x3072x768 4.44 / 4.42.
B_KBLOCK_OK = True


def packs_b_in_k_blocks(k, kc, nb, nr, itemsize) -> bool:
    """Whether a call whose tasks would pack B (plain packers) packs it a K block at a time
    (B_TASK_KBLOCK): one B matrix whose whole-K panel alone exceeds B_IN_TASK_BYTES (where
    one whole-K panel fits, the tasks pack whole panels: K blocks measured slower there)."""
    return B_KBLOCK_OK and nb == 1 and kc < k and k * nr * itemsize > B_IN_TASK_BYTES

# How gemm_worker gets B (the P_B_MODE slot): packed by the call, packed already (a
# prepacked weight), or read in place.  In place: a (K, N) B of at least one whole NR panel
# and no custom B packer; the micro-kernel reads B's row k of the panel at k*N instead of
# k*NR.  The panel's kc rows are then 3 cache lines every N*4 bytes instead of one stream,
# but the call neither writes the packed copy nor reads it back.  float32, 8x48 tile, 2
# threads, gemm_parallel called directly, medians of 9 rounds alternating packed / in place
# (Xeon with AVX-512, 2026-12-03), us, MxNxK: 16x768x768 186 -> 82, 48x768x768 290 -> 219,
# 96x768x768 485 -> 421, 128x768x768 591-599 -> 550, 128x384x1536 646 -> 596, 128x768x2304
# 1820-1843 -> 1621-1631, 128x768x3072 2533-2571 -> 2381-2423, 128x1024x1024 1226 -> 1232,
# 256x768x768 1077 -> 1094 (the gain fades as A grows); with more than one row block (8x48:
# M > 264) none: 512x768x768 2056-2072 -> 2067-2078, 1024^3 7109 -> 7071.  Rows longer than
# a page lose, badly where their stride maps a panel's rows onto few L2 sets: 128x1536x768
# 1222-1268 -> 1450-1488, 128x3072x768 2448 -> 5915-6171, 512x3072x768 8670 -> 25213.  So:
# one row block, rows of at most B_IN_PLACE_ROW_BYTES.  B_IN_PLACE_OK switches it off
# (tests compare the two paths).
# A partial last panel (N not a whole number of panels) is packed all the same, before the
# tasks start: read in place it would run past its rows' ends, and past B's end on its last
# row (tests/test_linalg.py puts a guard page there).  Until 2026-12-06 such a B was packed
# whole: plain matmul, cpu-gemm, 2 threads, old / new processes alternating twice,
# interleaved medians, us (Zen 4): 32x1024x1024 545-573 -> 425-429, 16x512x512 115-117 ->
# 78-91, 64x512x512 239-250 -> 218-235, 128x768x1000 1064-1124 -> 1017-1084, 128x256x256
# 140-195 -> 138-140; in place against packed in one process (B_IN_PLACE_OK toggled,
# medians of 8 x 50 calls): 256x256x256 214 / 211, 256x512x512 703 / 737, 256x1024x1024
# 2850 / 2942.
# Rows whose length in bytes is a multiple of B_IN_PLACE_BAD_STRIDE are packed all the same:
# a panel's kc rows then fall into a handful of L1 / L2 sets (at 4096 bytes one L1 set per
# line of the panel's width, 1/64 of L2's sets), are evicted before the next A panel reads
# them again, and come from L3 on every pass.  float32 matmul, 2 threads, plain products,
# medians of 5 rounds of 10 calls alternating in one process (Xeon with AMX / AVX-512,
# 2026-12-07, /tmp/w/g6.py), us, MxKxN, in place / packed: N = 1024 (4096-byte rows):
# 128x1024x1024 2207 / 1190, 128x4096x1024 9680 / 5862, 64x1024x1024 1177 / 714, 200x1024x1024
# 3913 / 1923, 32x4096x1024 2508 / 1931, 16x1024x1024 366 / 369; N = 512 (2048 bytes):
# 128x1024x512 882 / 611, 128x2048x512 1780 / 1231; float64 N = 256 (2048 bytes) 128x1024x256
# 1031 / 696, N = 512 2332 / 1320.  Other row lengths tie or favour in place: float32 N = 256
# (1024 bytes) 442 / 456, N = 640 728 / 729, 896 1024 / 1006, 1000 1086 / 1061, 128x3072x768
# 2341 / 2382.  Zen 4 measured the other way (below: 32x1024x1024 545-573 packed, 425-429
# in place; 16x512x512 115-117 / 78-91), its L3 being much nearer than this Xeon's: there
# such rows stay in place (B_IN_PLACE_BAD_STRIDE_BY_CPU, 0: none).
B_PACK, B_PACKED, B_IN_PLACE = 0, 1, 2
B_IN_PLACE_OK = True
B_IN_PLACE_ROW_BYTES = 4096
B_IN_PLACE_BAD_STRIDE = 2048
B_IN_PLACE_BAD_STRIDE_BY_CPU = {"znver4": 0}


def b_rows_conflict(row_bytes) -> bool:
    """Whether (K, N) rows of row_bytes bytes are packed on this host instead of read in
    place for their cache sets (a multiple of B_IN_PLACE_BAD_STRIDE, per CPU)."""
    bad = B_IN_PLACE_BAD_STRIDE_BY_CPU.get(target.cpu_name(), B_IN_PLACE_BAD_STRIDE)
    return bad != 0 and row_bytes % bad == 0


def reads_b_in_place(N, transb, nr, itemsize) -> bool:
    """Whether a call that would pack B reads it in place instead (B_IN_PLACE), given that
    M is one row block and no custom B packer is used (gemm_parallel's plan checks those)."""
    return (B_IN_PLACE_OK and not transb and nr <= N and N * itemsize <= B_IN_PLACE_ROW_BYTES
            and not b_rows_conflict(N * itemsize))

# A read in place: a (M, K) A whose M is a whole number of MR-row panels and no custom A
# packer is not packed: the micro-kernel (micro_rows) broadcasts A's values straight from
# its MR rows, as onnxruntime's MLAS kernels do, so the call neither writes a packed copy
# nor has one thread read the panels another packed.  B comes in any of its forms.  The
# worker is compiled per A form (rows_form / packed_form: parallel.only_if, so the other
# form's micro-kernel call site is pruned, never typed nor lowered), so a process compiles
# the form its calls use: one more call site of the micro-kernel in the one worker cost
# every GEMM's cold first call 0.22-0.25 s (matmul 128x768x768: 1.70-1.74 -> 1.93-1.99 s,
# Zen 4, 2026-12-04); a caller using both forms takes the variant holding both (see
# gemm_worker).  gemm_parallel called through
# dispatch.matmul, 2 threads, medians of 9 rounds alternating the two forms in one process
# (Zen 4, 2026-12-04), us, packed -> in place, three runs: prepacked b 128x768x768 734 /
# 757 / 849 -> 713 / 793 / 736, 128x768x3072 3322 / 3130 -> 3144 / 2993, 512x768x768 3185 /
# 3158 -> 2978 / 2928, 64x768x768 762 / 686 -> 429 / 361, 3168x384x1536 17897 / 18018 /
# 17595 -> 18210 / 17572 / 17438, 1024^3 10759 / 10712 / 10543 -> 11351 / 10363 / 10218;
# b packed by the call: 128x768x3072 4203 / 3772 -> 3896 / 3884, 512x768x768 3640 / 3676 ->
# 3521 / 3472, 3168x384x1536 19117 / 18440 / 17882 -> 17991 / 17597 / 17744, 1024^3 11179 /
# 12211 / 10897 -> 10885 / 11116 / 10702; b read in place too (cpu-gemm forced, medians /
# p25 of 11 rounds): 64x768x768 415 / 402 -> 396 / 381, 96x768x768 627 / 594 -> 602 / 574,
# 128x768x768 743 / 740 and 759 / 736 -> 735 / 727 and 725 / 714, 256x768x768 1687 / 1587 ->
# 1645 / 1584, 128x384x1024 591 / 586 -> 598 / 591.  The 6x16 tile forced on the same host
# (rows a multiple of 6): 120x768x768, 132x768x3072, 516x768x768, 1020x1024x1024 within -6%
# .. +1% (the same code path measured twice moved 5%); float64 8x24: prepacked 128x768x768
# 1822 -> 1565, 1024^3 20618 -> 20139, b packed by the call 128x768x768 2477 -> 1713.
# A_IN_PLACE_OK switches it off (tests compare the two forms).
A_IN_PLACE_OK = True

# A packed by the tasks (P_A_TASK): where A must be packed (transposed, or a custom packer)
# and the columns are one column block (every row block is read by one task only), each
# task packs its own A panels into its worker's slice of ap (mc_panels panels) right before
# its micro-kernels read them, instead of every panel being packed up front into a copy of
# all of A, written out to memory and read back.  The packing buffer is then nw * mc_panels
# panels, not A's size: linear_cross_entropy's dweight GEMM (A = the chunk's (rows, V)
# gradient, transposed) no longer needs a second chunk-sized array.  That GEMM (dweight +=
# g^T x[chunk], GPT-2's head: M = 50257, N = 768, K = the chunk's rows), 2 threads, up front
# / in the tasks, four rounds alternating in one process (Xeon with AMX, 2026-12-07,
# /tmp/w/dw2.py), ms: K = 512 139-155 / 117-127, K = 166 49-51 / 47-49; linear_backward
# (its dweight GEMM) 128x768x3072, 128x3072x768, 512x768x768, 3168x384x1536 with and without
# gelu within +-3% either way.  Only while a task's panels fit A_IN_TASK_BYTES (whole K:
# they must still be in L2 when read).  A_TASK_OK switches it off (tests compare the two).
A_TASK_OK = True
A_IN_TASK_BYTES = 1 << 20

# A packed by rows (P_A_ROWS, plan_args' a_rows): a caller's A packer (the backward's
# prologue, kernels_cpu/linalg_grad.py, forming g' = grad_out * act'(pre)) writes each
# MR-row panel as MR plain rows of K values into ap, an (na, mp * MR, K) array (rows past M
# zeroed), and the micro-kernel reads them as it reads an A in place (micro_rows): no
# transposes into panels, and ap holds the whole operand afterwards, for the caller's next
# GEMM (the backward's dW / dB reads g' from it).  Measurements in linalg_grad's docstring.


# gemm_parallel's int64 argument block, read by gemm_worker and the packers: addresses,
# sizes, blocking, and the addresses of the packers and the epilogue to call.
(P_SYNC, P_A, P_AP, P_B, P_BP, P_C, P_AIDX, P_BIDX, P_BIAS, P_NA, P_NB, P_NBATCH, P_M, P_N, P_K,
 P_MC, P_NC, P_KC, P_B_MODE, P_PACK_A, P_PACK_B, P_EPILOGUE, P_ACCUMULATE, P_WORKERS, P_NEXTRA, P_B_TASK,
 P_KFULL, P_K0, P_A_TASK, P_A_ROWS, P_COUNT) = range(31)
# P_KFULL, P_K0: B's K and the first row of the K block that the K-block packers pack (P_K
# values of it; B_TASK_KBLOCK)


# The packers run by address (gemm_worker calls the one its operand's layout needs, and
# pack_b runs them over a weight's panels): each compiles once per dtype, alone, instead of
# into every worker variant.  i: the panel; params: the GEMM's int64 block (P_* slots).

@njit(inline="always")
def _panel(i, params, z, R, src_slot, dst_slot, rows_slot, count_slot):
    """For panel i of R rows of an operand (A: rows M, R = MR; B: rows N, R = NR), from the
    block's slots: (the operand, its packed panels, rows, K, offset of the panel's batch
    in the operand, the panel's first row)."""
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    rows, K, count = p[rows_slot], p[P_K], p[count_slot]
    npan = (rows + R - 1) // R
    bi = i // npan
    return (c_array_at(p[src_slot], z, (count * rows * K,)), c_array_at(p[dst_slot], z, (count * npan * K * R,)),
            rows, K, bi * rows * K, (i - bi * npan) * R)


@njit(**JIT_BY_ADDRESS)
def _pack_a_n(i, params, is64, ti):
    """A panel i of A (M, K): element (i, k) at i*K + k (ti: the tile, a literal)."""
    mr = _tmr(ti)
    src, dst, M, K, base, i0 = _panel(i, params, like_dtype(is64), mr, P_A, P_AP, P_M, P_NA)
    _pack_strided(src, base + i0 * K, K, min(mr, M - i0), K, dst, i * K * mr, mr)


@njit(**JIT_BY_ADDRESS)
def _pack_a_t(i, params, is64, ti):
    """A panel i of A stored (K, M): element (i, k) at k*M + i."""
    mr = _tmr(ti)
    src, dst, M, K, base, i0 = _panel(i, params, like_dtype(is64), mr, P_A, P_AP, P_M, P_NA)
    _pack_contig(src, base + i0, M, min(mr, M - i0), K, dst, i * K * mr, mr)


@njit(**JIT_BY_ADDRESS)
def _pack_b_n(j, params, is64, ti):
    """B panel j of B (K, N): element (k, j) at k*N + j."""
    nr = _tnr(like_dtype(is64), ti)
    src, dst, N, K, base, j0 = _panel(j, params, like_dtype(is64), nr, P_B, P_BP, P_N, P_NB)
    _pack_contig(src, base + j0, N, min(nr, N - j0), K, dst, j * K * nr, nr)


@njit(**JIT_BY_ADDRESS)
def _pack_b_t(j, params, is64, ti):
    """B panel j of B stored (N, K): element (k, j) at j*K + k."""
    nr = _tnr(like_dtype(is64), ti)
    src, dst, N, K, base, j0 = _panel(j, params, like_dtype(is64), nr, P_B, P_BP, P_N, P_NB)
    _pack_strided(src, base + j0 * K, K, min(nr, N - j0), K, dst, j * K * nr, nr)


@njit(inline="always")
def _panel_k(j, params, z, nr):
    """For B panel j of a K block (B_TASK_KBLOCK): (B, its packed panels of P_K rows, N,
    B's K, the block's first row, its rows, the panel's first column)."""
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    N, KF, k0, kl = p[P_N], p[P_KFULL], p[P_K0], p[P_K]
    npan = (N + nr - 1) // nr
    return (c_array_at(p[P_B], z, (N * KF,)), c_array_at(p[P_BP], z, ((j + 1) * kl * nr,)), N, KF, k0, kl,
            (j % npan) * nr)


@njit(**JIT_BY_ADDRESS)
def _pack_b_n_k(j, params, is64, ti):
    """Rows P_K0 .. P_K0 + P_K of B panel j of B (K, N), packed as a panel of P_K rows."""
    nr = _tnr(like_dtype(is64), ti)
    src, dst, N, KF, k0, kl, j0 = _panel_k(j, params, like_dtype(is64), nr)
    _pack_contig(src, k0 * N + j0, N, min(nr, N - j0), kl, dst, j * kl * nr, nr)


@njit(**JIT_BY_ADDRESS)
def _pack_b_t_k(j, params, is64, ti):
    """Rows P_K0 .. P_K0 + P_K of B panel j of B stored (N, K), packed as a panel of P_K rows."""
    nr = _tnr(like_dtype(is64), ti)
    src, dst, N, KF, k0, kl, j0 = _panel_k(j, params, like_dtype(is64), nr)
    _pack_strided(src, j0 * KF + k0, KF, min(nr, N - j0), kl, dst, j * kl * nr, nr)


_PACKERS = {("a", False): _pack_a_n, ("a", True): _pack_a_t, ("b", False): _pack_b_n, ("b", True): _pack_b_t,
            ("bk", False): _pack_b_n_k, ("bk", True): _pack_b_t_k}


def _packer(operand, transposed, dtype, ti):
    """The address of the packer for operand "a" or "b" (or "bk": B a K block at a time)
    stored transposed or not, for the tile TILES[ti]."""
    return worker_address(*_packer_kernel(operand, transposed, dtype, ti))


def _packer_kernel(operand, transposed, dtype, ti):
    """_packer's (dispatcher, variant) for parallel.worker_address(es)."""
    return _PACKERS[operand, bool(transposed)], (bool(np.dtype(dtype) == np.float64), int(ti))


# ---- GEMM ------------------------------------------------------------------------------------

def gemm_parallel(a3, b3, a_idx, b_idx, transa, transb, bias, epilogue, code, out3, ap, bp, b_packed, mc_panels,
                  nc_panels, kc, nworkers, tile=None, pack_a=None, pack_b=None, extra=(), accumulate=False,
                  both_a_forms=False):
    """out3[i] = act(a3[a_idx[i]] @ b3[b_idx[i]] + bias) (see the module docstring).

    epilogue: apply bias + activation (False: plain product, bias and code ignored);
    ap, bp: packing workspaces of shapes pack_shapes(...) (reused between calls, so no
    fresh pages are faulted in per call);
    b_packed: bp already holds B's panels (a weight packed once by pack_b): only A is packed;
    mc_panels / nc_panels: MR-row / NR-column panels per task; kc: K block length;
    nworkers: numba's thread count (parallel.num_threads());
    tile: the register tile (a TILES index, name or Tile; default active_tile()): ap, bp
    and mc_panels / nc_panels are in its panels;
    pack_a / pack_b: addresses of other packers (same (panel, params) calling convention and
    panel layout) in place of the plain copies, and extra: int64 values appended to the
    argument block after its P_COUNT slots for them (the backward's prologue packers,
    kernels_cpu/linalg_grad.py, which form the activation's gradient while packing);
    accumulate: out3 += the product (no epilogue): a gradient summed over chunks of rows
    (linear_cross_entropy's dweight) without a product-sized scratch;
    both_a_forms: run the worker variant that holds both A forms (a caller whose products
    use both, see gemm_worker), the same results and speed as the one-form variant.

    Runs gemm_worker on up to nworkers threads (parallel.run_workers).  The worker is
    compiled per dtype; the packers for the operands' layouts and the epilogue for the
    activation are functions of their own that it calls by address.  Each is compiled
    once, alone: none is compiled again into the worker, a parfor gufunc or a kernel, and
    a variant (transposes, activation) adds only its own small function."""
    nbatch, M, N = out3.shape
    K = a3.shape[1] if transa else a3.shape[2]
    for arr in (a3, ap, b3, bp, bias, a_idx, b_idx):  # the worker reads raw memory
        if not (arr.flags.c_contiguous and arr.dtype == (np.int64 if arr.dtype.kind == "i" else out3.dtype)):
            raise ValueError(f"gemm_parallel: arrays must be C-contiguous {out3.dtype} (indices int64), "
                             f"got {arr.dtype} {arr.flags.c_contiguous}")
    if not out3.flags.c_contiguous:
        raise ValueError("gemm_parallel: out3 must be C-contiguous")
    if accumulate and epilogue:
        raise ValueError("gemm_parallel: accumulate=True takes no epilogue")
    args = plan_args(a3.shape[0], b3.shape[0], nbatch, M, N, K, transa, transb, out3.dtype, tile, b_packed, mc_panels,
                     nc_panels, kc, epilogue, code, nworkers, pack_a, pack_b, len(extra), accumulate, both_a_forms)
    gemm_launch(args, a3, ap, b3, bp, out3, a_idx, b_idx, bias, extra)


def plan_args(na, nb, nbatch, M, N, K, transa, transb, dtype, tile, b_packed, mc_panels, nc_panels, kc, epilogue, code,
              nworkers, pack_a=None, pack_b=None, nextra=0, accumulate=False, both_a_forms=False, a_rows=False) -> tuple:
    """The plan of a gemm_parallel call (its arguments less the arrays, see there), as
    gemm_launch takes it: a caller that makes the same call often (dispatch's linalg) keeps
    it and launches with it directly.  a_rows: pack_a (required, A not transposed) writes
    its panels as rows (P_A_ROWS): ap is then an (na, mp * MR, K) array of A's rows, whole
    (never the tasks' slices), read by the micro-kernel as an A in place."""
    if a_rows and (pack_a is None or transa):
        raise ValueError("gemm plan: a_rows needs a caller's A packer and A not transposed")
    return (na, nb, nbatch, M, N, K, bool(transa), bool(transb), np.dtype(dtype), _tile_index(tile), bool(b_packed),
            mc_panels, nc_panels, kc, bool(epilogue), int(code), pack_a, pack_b, nextra, bool(accumulate), nworkers,
            bool(both_a_forms), bool(a_rows))


def gemm_launch(args, a3, ap, b3, bp, out3, a_idx, b_idx, bias, extra=(), buffers=None):
    """gemm_parallel's call for plan_args(...) = args on these arrays, which the caller
    made as gemm_parallel checks them (C-contiguous, the plan's dtype, int64 indices).
    buffers: where ap and bp are None, buffers(elements of ap, elements of bp) -> (ap, bp),
    as many as the plan needs: fewer than pack_shapes' where A is read in place or packed
    by the tasks (A_TASK_OK)."""
    plan, nsync, fn, nw, need_a, need_b, ti = _gemm_plan(*args)
    if buffers is not None:
        ap, bp = buffers(need_a, need_b)
    if ap.size < need_a or bp.size < need_b:
        raise ValueError(f"gemm_parallel: packing buffers of {ap.size} / {bp.size} elements, tile {TILES[ti].name} "
                         f"needs {need_a} / {need_b}")
    p = plan.copy()
    if extra:
        p[P_COUNT:] = extra
    sync = np.zeros(nsync, np.int64)
    _addresses(p, sync, a3, ap, b3, bp, out3, a_idx, b_idx, bias)  # 1 us, where 9 x arr.ctypes.data take 13
    if p[P_B_TASK] in (B_TASK_SLICE, B_TASK_KBLOCK) or p[P_A_TASK]:   # each worker's copy of the block, at the end of sync
        sync[nsync - nw * p.size:] = np.tile(p, nw)
    run_workers(fn, p, nw)


@functools.lru_cache(maxsize=256)
def _gemm_plan(na, nb, nbatch, M, N, K, transa, transb, dtype, ti, b_packed, mc_panels, nc_panels, kc, epilogue, code,
               pack_a, pack_b, nextra, accumulate, nworkers, both_a_forms=False, a_rows=False):
    """What gemm_parallel's call needs besides the addresses, for its shapes and options:
    (argument block without addresses, read-only: each call copies it; sync length; the
    worker's address; worker count; packed A and B elements needed; tile index).  Built
    whole on every call it took 14 us of Python per call (8x768x768 prepacked, 2 threads,
    Sapphire Rapids, 2026-12-03)."""
    nr_full = tile_n(dtype, ti)
    mp = -(-M // tile_m(ti))
    npn = -(-N // nr_full)
    nmb = -(-mp // mc_panels)
    nnb = -(-npn // nc_panels)
    itemsize = np.dtype(dtype).itemsize
    b_mode = B_PACKED if b_packed else B_PACK
    if (b_mode == B_PACK and pack_b is None and nmb == 1
            and reads_b_in_place(N, transb, nr_full, itemsize)):
        b_mode = B_IN_PLACE
    a_in_place = A_IN_PLACE_OK and not transa and pack_a is None and M % tile_m(ti) == 0
    a_task = (A_TASK_OK and not a_in_place and not a_rows and nnb == 1 and nmb > 1 and na == nbatch
              and mc_panels * tile_m(ti) * K * itemsize <= A_IN_TASK_BYTES)
    n_pack_a = 0 if a_in_place or a_task else na * mp
    n_tail = nb if b_mode == B_IN_PLACE and N % nr_full != 0 else 0  # partial last panels, packed (gemm_worker)
    n_pack = n_pack_a + n_tail if b_mode != B_PACK else n_pack_a + nb * npn
    ntasks = nbatch * nmb * nnb
    p = np.zeros(P_COUNT + nextra, np.int64)
    p[P_NA], p[P_NB], p[P_NBATCH], p[P_M], p[P_N], p[P_K] = na, nb, nbatch, M, N, K
    p[P_MC], p[P_NC], p[P_KC], p[P_B_MODE] = mc_panels, nc_panels, kc, b_mode
    p[P_ACCUMULATE], p[P_NEXTRA], p[P_KFULL] = accumulate, nextra, K
    nw = min(nworkers, max(ntasks, 1))
    p[P_WORKERS] = nw
    # B packed by the call, one row block (M <= mc_panels * MR) and no B batch shared by
    # output batches: each B panel is read by one task only, which packs it itself right
    # before its micro-kernels read it from L2, instead of all B panels being packed up front (written out to L3 or
    # memory, then read back).  128x768x3072 linear / its dx GEMM (2 threads, Sapphire
    # Rapids, interleaved medians, 3 alternating processes each, 2026-11-26): 2.48 -> 2.40
    # ms / 2.73 -> 2.61 ms.
    # Only while a task's panels fit in L2 (B_IN_TASK_BYTES): 64x4096x4096 (12 panels of
    # K = 4096, 9.4 MB a task) ran 23-24 -> 26-31 ms packed in the task.
    # And then into the workers' own slices of bp (gemm_worker's b_local) where they fit.
    b_task = B_TASK_NONE
    if (b_mode == B_PACK and nmb == 1 and nb == nbatch
            and nc_panels * K * nr_full * itemsize <= B_IN_TASK_BYTES):
        b_task = B_TASK_SLICE if B_LOCAL_OK and nw * nc_panels <= nb * npn else B_TASK_OWN
    elif (b_mode == B_PACK and nmb == 1 and nb == nbatch and pack_b is None and B_LOCAL_OK
          and packs_b_in_k_blocks(K, kc, nb, nr_full, itemsize) and nw * nc_panels <= nb * npn
          and nc_panels * kc * nr_full * itemsize <= B_IN_TASK_BYTES):
        b_task = B_TASK_KBLOCK
    p[P_B_TASK] = b_task
    p[P_A_TASK] = a_task
    p[P_A_ROWS] = a_rows
    b_local = b_task in (B_TASK_SLICE, B_TASK_KBLOCK)
    sa, sb = pack_shapes(na, nb, M, N, K, dtype, ti)
    need_a = 0 if a_in_place else nw * mc_panels * tile_m(ti) * K if a_task else math.prod(sa)
    kernels = _kernels(dtype, ti, transa, transb, a_in_place or a_rows, (b_mode == B_PACK and pack_b is None) or n_tail > 0,
                       not a_in_place and pack_a is None, epilogue, code, both_a_forms, b_task == B_TASK_KBLOCK)
    addr = dict(zip(kernels, worker_addresses(list(kernels.values()))))
    fn = addr["worker"]
    p[P_PACK_A] = 0 if a_in_place else addr.get("pack_a", pack_a)
    p[P_PACK_B] = 0 if b_mode != B_PACK and not n_tail else addr.get("pack_b", pack_b)
    p[P_EPILOGUE] = addr.get("epilogue", 0)
    p.flags.writeable = False
    # sync[0] next panel to pack, sync[2 + i] panel i packed, sync[2 + n_pack + v] the next
    # task of worker v's own range, then with b_local or a_task worker v's copy of the
    # argument block (gemm_worker); no packed A needed when A is read in place, the workers'
    # slices when the tasks pack it
    nsync = 2 + n_pack + nw + (nw * (P_COUNT + nextra) if b_local or a_task else 0)
    return p, nsync, fn, nw, need_a, math.prod(sb), ti


def worker_kernel(dtype, ti, a_in_place, both_a_forms=False):
    """The (dispatcher, variant) of gemm_worker for (dtype, tile index), reading A by rows
    (a_in_place: in place, or packed by rows, P_A_ROWS) or packed in panels, or either
    (both_a_forms: see gemm_parallel), for parallel.worker_address(es)."""
    forms = (True, True) if both_a_forms else (only_if(a_in_place), only_if(not a_in_place))
    return gemm_worker, (bool(np.dtype(dtype) == np.float64), int(ti)) + forms


def _kernels(dtype, ti, transa, transb, a_in_place, packs_b, packs_a, epilogue, code, both_a_forms=False,
             b_kblock=False):
    """{role: worker_address request} of a gemm_parallel call: the worker, the packers it
    runs (packs_a / packs_b: with the plain packers, not a caller's own) and the epilogue.
    The worker first: the largest compile (cold: 0.86-1.03 s), done in this process while
    a helper process compiles the rest (parallel.worker_addresses)."""
    kernels = {"worker": worker_kernel(dtype, ti, a_in_place, both_a_forms)}
    if packs_a:
        kernels["pack_a"] = _packer_kernel("a", transa, dtype, ti)
    if packs_b:
        kernels["pack_b"] = _packer_kernel("bk" if b_kblock else "b", transb, dtype, ti)
    if epilogue:
        kernels["epilogue"] = epilogue_kernel(dtype, code)
    return kernels


def packed_kernels(dtype, ti, transa, transb):
    """The kernels (worker_address requests) of a gemm_parallel call with no epilogue that
    packs both operands with the plain packers (A stored transposed, or not a whole number
    of row tiles; B not read in place): for parallel.compile_ahead."""
    return list(_kernels(dtype, ti, transa, transb, False, True, True, False, 0).values())


def epilogue_address(dtype, code):
    """The address of gemm_epilogue for (dtype, activation code): call_address(it, (c, ldc,
    rows, n, bias)) applies bias + activation in place (the weight-only GEMV's too)."""
    return worker_address(*epilogue_kernel(dtype, code))


def epilogue_kernel(dtype, code):
    """epilogue_address's (dispatcher, variant, nargs) for parallel.worker_address(es)."""
    return gemm_epilogue, (bool(np.dtype(dtype) == np.float64), int(code)), 5


@njit(cache=True)
def _addresses(p, sync, a3, ap, b3, bp, out3, a_idx, b_idx, bias):
    """The arrays' data addresses into their P_* slots of p."""
    p[P_SYNC] = sync.ctypes.data
    p[P_A] = a3.ctypes.data
    p[P_AP] = ap.ctypes.data
    p[P_B] = b3.ctypes.data
    p[P_BP] = bp.ctypes.data
    p[P_C] = out3.ctypes.data
    p[P_AIDX] = a_idx.ctypes.data
    p[P_BIDX] = b_idx.ctypes.data
    p[P_BIAS] = bias.ctypes.data


@njit(**JIT_BY_ADDRESS)
def gemm_worker(w, params, is64, ti, rows_form, packed_form):
    """Worker w of a gemm_parallel call: its arrays, sizes and the addresses of its packers
    and epilogue are read from the int64 block at address params (the P_* slots); is64
    and ti (the register tile, TILES[ti]) are literals, and so are the A forms the variant
    holds (parallel.only_if): rows_form (A read in place from its rows, A_IN_PLACE_OK; the
    block names no A packer) and packed_form.  A call's plan picks the variant of its one
    form; a caller whose products use both forms (matmul_backward's dA in place, dB packed)
    asks for the variant holding both (gemm_parallel's both_a_forms), which picks per call:
    one more micro-kernel call site instead of a second worker (cold first call, old / new
    processes alternating, Zen 4, 2026-12-05: matmul_backward 128x768x2304 3.11-3.29 ->
    2.37-2.52 s, linear_backward 128x3072x768 with no activation 3.23 -> 2.46 s; their run
    time unchanged within noise).

    Packs panels, then runs GEMM tasks, both taken from sync's atomic counters until none
    are left: a worker that starts late finds the work taken instead of holding the
    others up.  There is no barrier between packing and the GEMM: a worker that finds a
    panel not yet marked packed (its owner is still at it, or lost its core to another
    process) packs it again itself - the same bytes, so the duplicate writes are
    harmless - instead of spinning on it.  One function, not a wrapper calling the body:
    each numba function costs its own pipeline, and numba's inline="always" re-types the
    inlined body (that cost more compile time than it saved)."""
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    nbatch, M, N, K = p[P_NBATCH], p[P_M], p[P_N], p[P_K]
    na, nb = p[P_NA], p[P_NB]
    mc_panels, nc_panels, kc = p[P_MC], p[P_NC], p[P_KC]
    pack_a, pack_b, epilogue = p[P_PACK_A], p[P_PACK_B], p[P_EPILOGUE]
    accumulate_c = p[P_ACCUMULATE] != 0
    a_in_place = pack_a == 0  # (the plan's choice, _gemm_plan)
    a_rows = p[P_A_ROWS] != 0   # A packed by rows into ap (P_A_ROWS), read as an A in place
    nr_full = _tnr(z, ti)
    MR = _tmr(ti)  # noqa: N806 - the tile's rows
    a_outer = _taouter(ti)
    mp = (M + MR - 1) // MR
    npn = (N + nr_full - 1) // nr_full
    nmb = (mp + mc_panels - 1) // mc_panels
    nnb = (npn + nc_panels - 1) // nc_panels
    a_task = p[P_A_TASK] != 0   # A panels packed by the task that reads them (the plan's choice, A_TASK_OK)
    n_pack_a = 0 if a_in_place or a_task else na * mp
    # B panels packed by the tasks that read them, into their own places or the worker's
    # slice of bp (the plan's choice, P_B_TASK: see _gemm_plan)
    b_in_task = p[P_B_TASK] != B_TASK_NONE
    b_kblock = p[P_B_TASK] == B_TASK_KBLOCK
    b_local = p[P_B_TASK] == B_TASK_SLICE or b_kblock
    b_in_place = p[P_B_MODE] == B_IN_PLACE
    # read in place, each B batch's last panel still packed when it is partial (read in
    # place, it would run past its rows' ends: past B's end on its last row)
    n_tail = nb if b_in_place and N % nr_full != 0 else 0
    n_pack = n_pack_a + n_tail if p[P_B_MODE] != B_PACK or b_in_task else n_pack_a + nb * npn
    ntasks = nbatch * nmb * nnb
    nw = p[P_WORKERS]
    # A task packing its own panels puts them into its worker's slice of bp (slice w,
    # nc_panels panels long), the same memory for each of the worker's tasks: the panels
    # are written into lines its L2 holds already, not into fresh lines across bp that are
    # first read from memory and later written back to it.  Plain products, 2 threads,
    # old / new processes alternating twice, medians of 7 rounds (Zen 4, 2026-12-06,
    # /tmp/w/mm4k.py, /tmp/w/mmset.py), ms: matmul 128x4096x4096 27.4-29.3 -> 24.2-25.2
    # (prepacked 22.0-22.5, OpenBLAS 24.2-26.7), 128x4096x11008 72.8 -> 63.4-63.7,
    # 64x2048x2048 3.84-4.25 -> 3.46-3.61, 128x768x3072 3.71-3.79 -> 3.39-3.43; linear
    # 128x768x2304 2.47-2.75 -> 2.24-2.26, 128x3072x768 3.38-3.69 -> 3.22-3.51; 128x768x768,
    # 128x1024x1024, 256x1024x1024 unchanged.
    # The packers and the micro-kernels find the slice through the worker's copy of the
    # argument block (gemm_parallel puts it at the end of sync) whose P_BP is moved so that
    # the task's first panel lands at the slice.
    home = 2 + n_tail + (n_pack_a if p[P_B_MODE] != B_PACK else n_pack_a + nb * npn)  # the range counters (_gemm_plan)
    plen = P_COUNT + p[P_NEXTRA]
    pl_addr = p[P_SYNC] + (home + nw + w * plen) * 8
    pl = c_array_at(pl_addr, np.int64(0), (plen if b_local or a_task else 0,))
    sync = c_array_at(p[P_SYNC], np.int64(0), (home + nw,))
    # A's panels, or A itself (na x M x K, M a whole number of panels) when it is read in
    # place, or its rows packed (na x mp * MR x K)
    apf = c_array_at(p[P_A] if a_in_place else p[P_AP], z, (na * mp * K * MR,))
    a_ld = M if a_in_place else mp * MR   # rows of a batch of A read by rows
    # B's panels, and B itself (nb x K x N) when it is read in place
    bpf = c_array_at(p[P_BP], z, (nb * npn * K * nr_full,))
    bsrc = c_array_at(p[P_B], z, (nb * K * N,)) if b_in_place else bpf
    cf = c_array_at(p[P_C], z, (nbatch * M * N,))
    a_idx = c_array_at(p[P_AIDX], np.int64(0), (nbatch,))
    b_idx = c_array_at(p[P_BIDX], np.int64(0), (nbatch,))
    # panels from the counter, then a sweep packing any still unmarked
    sweep = 0
    while True:
        i = fetch_add(sync, 0, 1)
        if i >= n_pack:
            while sweep < n_pack and fetch_add(sync, 2 + sweep, 0) != 0:
                sweep += 1
            if sweep >= n_pack:
                break
            i = sweep
            sweep += 1
        if i < n_pack_a:
            call_address(pack_a, (i, params))
        else:
            call_address(pack_b, ((i - n_pack_a) * npn + npn - 1 if b_in_place else i - n_pack_a, params))
        fetch_add(sync, 2 + i, 1)
    t = np.empty(MR * nr_full, cf.dtype)  # an edge tile (fewer than MR rows or NR columns)
    # Tasks: worker v owns the range [v * ntasks / nw, (v + 1) * ntasks / nw) and takes it
    # front to back from its counter, then takes what is left of the others' ranges (from
    # their counters: each task runs once, and a worker the OS pauses holds none up).  A
    # worker thus reads the same B columns on every call of the same shapes, which stay in
    # its core's L2 between calls, where one shared counter dealt them out afresh each
    # call.  Prepacked linear, 2 threads, loop medians, shared counter -> own ranges only
    # (Sapphire Rapids, 2026-12-03): 128x768x768 630-633 -> 569-595 us, 128x768x3072
    # 2037-2043 -> 1953-1989, 128x3072x768 2034-2051 -> 2006-2057.
    s = 0
    while s < nw:
        v = w + s if w + s < nw else w + s - nw
        task = v * ntasks // nw + fetch_add(sync, home + v, 1)
        if task >= (v + 1) * ntasks // nw:
            s += 1
            continue
        bi = task // (nmb * nnb)
        r = task - bi * (nmb * nnb)
        mb = r // nnb
        nb_ = r - mb * nnb
        ba = a_idx[bi]
        bb = b_idx[bi]
        p0 = mb * mc_panels
        p1 = min(p0 + mc_panels, mp)
        q0 = nb_ * nc_panels
        q1 = min(q0 + nc_panels, npn)
        at = apf
        if a_task:   # this task's A panels into the worker's slice (the slot moved so panel p0 lands there)
            pl[P_AP] = p[P_AP] + (w * mc_panels - (ba * mp + p0)) * K * MR * isz
            at = c_array_at(pl[P_AP], z, (na * mp * K * MR,))
            for pa in range(p0, p1):
                call_address(pack_a, (ba * mp + pa, pl_addr))
        bt = bpf
        if b_local and not b_kblock:
            pl[P_BP] = p[P_BP] + (w * nc_panels - (bb * npn + q0)) * K * nr_full * isz
            bt = c_array_at(pl[P_BP], z, (nb * npn * K * nr_full,))
            for q in range(q0, q1):
                call_address(pack_b, (bb * npn + q, pl_addr))
        elif b_in_task and not b_kblock:
            for q in range(q0, q1):
                call_address(pack_b, (bb * npn + q, params))
        for k0 in range(0, K, kc):
            kl = min(kc, K - k0)
            accumulate = k0 > 0 or accumulate_c
            if b_kblock:   # this K block of the task's panels, packed as panels of kl rows into the slice
                pl[P_K], pl[P_K0] = kl, k0
                pl[P_BP] = p[P_BP] + (w * nc_panels * K - q0 * kl) * nr_full * isz
                bt = c_array_at(pl[P_BP], z, (npn * kl * nr_full,))
                for q in range(q0, q1):
                    call_address(pack_b, (q, pl_addr))
            # (B panel, A panel) pairs: B panels outer for the 6x16 tile (its kc x 16 B
            # panel is reused from L1 by every A panel), A panels outer for the AVX-512
            # tiles (their MR x kc A panel is the smaller, reused one; see TILES)
            nq = q1 - q0
            npa = p1 - p0
            for pair in range(nq * npa):
                if a_outer:
                    pa = p0 + pair // nq
                    q = q0 + pair % nq
                else:
                    q = q0 + pair // npa
                    pa = p0 + pair % npa
                j0 = q * nr_full
                nr = min(nr_full, N - j0)
                in_place = b_in_place and nr == nr_full
                boff = ((bb * K + k0) * N + j0 if in_place else q * kl * nr_full if b_kblock
                        else ((bb * npn + q) * K + k0) * nr_full)
                bq = bsrc if in_place else bt
                ldb = N if in_place else nr_full
                i0 = pa * MR
                mr = min(MR, M - i0)
                # one call site per A form the variant holds (each inlined copy of the
                # intrinsic costs compile time): full tiles go straight to C, edge tiles
                # through t
                full = mr == MR and nr == nr_full
                coff = (bi * M + i0) * N + j0 if full else 0
                done = False
                if rows_form is not None:
                    if a_in_place or a_rows:
                        micro_rows(ti, kl, apf, (ba * a_ld + i0) * K + k0, K, bq, boff, ldb, cf if full else t, coff,
                                   N if full else nr_full, accumulate and full)
                        done = True
                if packed_form is not None:
                    if not done:
                        micro_tile(ti, kl, at, ((ba * mp + pa) * K + k0) * MR, bq, boff, ldb, cf if full else t,
                                   coff, N if full else nr_full, accumulate and full)
                if not full:
                    store_edge_tile(t, nr_full, cf, (bi * M + i0) * N + j0, N, mr, nr, accumulate)
        if epilogue != 0:  # bias + activation on the task's block while it is in L2
            j0 = q0 * nr_full
            i0 = p0 * MR
            call_address(epilogue, (p[P_C] + ((bi * M + i0) * N + j0) * isz, N, min(p1 * MR, M) - i0,
                                    min(q1 * nr_full, N) - j0, p[P_BIAS] + j0 * isz))


def pack_b(b3, transb, bp, tile=None):
    """bp[bb, q] = the q-th NR-column panel of B_bb, as gemm_parallel packs it for the tile
    (default: the active one; bp of shape pack_shapes(..., tile)[1]): a weight packed once
    and passed with b_packed=True (and the same tile) afterwards.  The panels are packed in
    parallel by the GEMM's own packer."""
    if not (b3.flags.c_contiguous and bp.flags.c_contiguous and b3.dtype == bp.dtype):
        raise ValueError("pack_b: b3 and bp must be C-contiguous, of one dtype")
    nb = b3.shape[0]
    N = b3.shape[1] if transb else b3.shape[2]
    K = b3.shape[2] if transb else b3.shape[1]
    p = np.zeros(P_COUNT, np.int64)
    ti = _tile_index(tile)
    if bp.size < nb * -(-N // tile_n(bp.dtype, ti)) * K * tile_n(bp.dtype, ti):
        raise ValueError(f"pack_b: bp too small for tile {TILES[ti].name}")
    p[P_B], p[P_BP], p[P_NB], p[P_N], p[P_K] = b3.ctypes.data, bp.ctypes.data, nb, N, K
    run_workers(_packer("b", transb, bp.dtype, ti), p, nb * -(-N // tile_n(bp.dtype, ti)))


# ---- weight read in place: few rows, a large (N, K) weight -----------------------------------
#
# gemm_rows: out = act(x @ w.T + bias) computed as out^T = w @ x^T, with the weight as the
# micro-kernel's A operand read in place (MR of its rows per tile, each broadcast value the
# next one of a row) and only x packed, as B panels of NR of its rows.  gemm_parallel packs
# the whole weight instead, which for few rows costs as much as the product: 64x4096x4096
# linear, 2 threads, Sapphire Rapids (2026-11-26, interleaved medians): 21.6 ms packing it,
# 10.0 ms with it prepacked, 11.3 ms read in place (a first version of this kernel).  Each
# tile of out^T is stored transposed into out; bias + activation then run over the task's
# columns (gemm_epilogue).  The tiles are the 16-lane ones of ROWS_TILES (correct but slow
# on narrower targets, where dispatch does not choose this path).
# gemm_rows's tiles: x's rows are the tile's NR columns, so M = 128 fills 2.67 panels of
# 48 (a third of the last tile's FMAs wasted) but exactly 4 of 32, M = 64 and 32 exactly
# 2 and 1 of 32 against 1.33 and 0.67 of 48.  The tile padding fewer rows runs (ties:
# the first).  linear + bias + gelu, 2 threads, medians of 9 rounds alternating (Xeon with
# AVX-512, 2026-12-03), us, MxNxK, 8x48 always -> this choice (prepacked weight): 32x3072x768
# 980 -> 760 (650), 64x3072x768 1756 -> 1376 (1159), 100x3072x768 2614 -> 2468 (1857),
# 128x3072x768 2712 -> 2580 (2225), 128x4096x4096 20.0 -> 17.1 ms (17.3).
ROWS_TILES = (HOST_WIDE, TILE_NAMES.index("12x32"))   # 8x48, 12x32
# Per CPU (target.cpu_name()) where that choice loses.  Zen 4 (512-bit work on 256-bit
# units): the 12x32 tile over the weight's 12 rows runs slower per FMA than 8x48's padded
# columns cost.  linear + bias + gelu, 2 threads, medians of 5 rounds alternating, in one
# process (2026-12-06, /tmp/w/lrows2.py), ms, MxKxN: the padding choice (12x32 for all of
# these) / 8x48 / the weight packed: 128x768x3072 4.53 / 3.55 / 3.64, 128x1024x4096 8.12 /
# 6.13 / 6.69, 112x768x3072 4.50 / 3.47 / 3.26, 128x4096x4096 30.9 / 22.7 / 29.7,
# 100x4096x4096 30.7 / 22.4 / 27.3, 64x4096x4096 16.0 / 15.0 / 19.7, 32x4096x11008 21.2 /
# 20.6 / 38.4, 32x768x3072 1.195 / 1.191 / 1.181.
ROWS_TILES_BY_CPU = {"znver4": (HOST_WIDE,)}
ROWS_PANELS = 8   # MR-row weight panels per task (8x48: 64 output columns, whole cache lines of out)


# gemm_rows's int64 argument block, read by rows_worker: addresses, sizes, the task counter.
(R_NEXT, R_W, R_XP, R_OUT, R_BIAS, R_EPILOGUE, R_N, R_K, R_M, R_NR, R_TASKS) = range(11)
R_COUNT = 11


@njit(**JIT_BY_ADDRESS)
def rows_worker(w, params, is64, ti):
    """Worker w of gemm_rows: takes tasks (runs of MR-row weight panels) from the block's
    counter.  By address (parallel.run_workers), not a prange kernel: that compiled its
    body twice (the kernel and numba's parfor gufunc), 1.26 s of a cold
    linear_cross_entropy on Zen 5 (2026-11-27)."""
    p = c_array_at(params, np.int64(0), (R_COUNT,))
    z = like_dtype(is64)
    N, K, M, nr, ntasks, epilogue = p[R_N], p[R_K], p[R_M], p[R_NR], p[R_TASKS], p[R_EPILOGUE]
    mr = _tmr(ti)
    npan = (N + mr - 1) // mr
    nxp = (M + nr - 1) // nr
    wf = c_array_at(p[R_W], z, (N * K,))
    xp = c_array_at(p[R_XP], z, (nxp * nr * K,))
    of = c_array_at(p[R_OUT], z, (M * N,))
    isz = of.itemsize
    t = np.empty(mr * nr, of.dtype)
    edge = np.empty(mr * K, of.dtype)  # the last, partial panel: its rows copied, zero padded to mr
    while True:
        task = fetch_add(p, R_NEXT, 1)
        if task >= ntasks:
            break
        p0 = task * npan // ntasks
        p1 = (task + 1) * npan // ntasks
        for pan in range(p0, p1):
            n0 = pan * mr
            rows = min(mr, N - n0)
            src, s0 = wf, n0 * K
            if rows < mr:
                src, s0 = edge, 0
                for i in range(rows):
                    for k in range(K):
                        src[i * K + k] = wf[(n0 + i) * K + k]
                for i in range(rows * K, mr * K):
                    src[i] = 0
            for j in range(nxp):
                micro_rows(ti, K, src, s0, K, xp, j * K * nr, nr, t, 0, nr, False)
                m0 = j * nr
                for r in range(min(nr, M - m0)):
                    o = (m0 + r) * N + n0
                    for i in range(rows):
                        of[o + i] = t[i * nr + r]
        if epilogue != 0 and p1 > p0:
            c0 = p0 * mr
            call_address(epilogue, (p[R_OUT] + c0 * isz, N, M, min(p1 * mr, N) - c0, p[R_BIAS] + c0 * isz))


def gemm_rows(x2, w2, bias, epilogue, code, out2, xp, nworkers):
    """out2 (M, N) = act(x2 @ w2.T + bias) (bias + activation only with epilogue), w2 (N, K)
    read in place; x2 (M, K), w2, bias, out2 C-contiguous of one dtype; xp: a workspace of
    at least rows_workspace(M, K, dtype) elements for x's panels."""
    M, K = x2.shape
    N = w2.shape[0]
    ti = rows_tile(M, out2.dtype)
    nr = tile_n(out2.dtype, ti)
    pack_b(x2.reshape(1, M, K), True, xp, tile=ti)
    npan = -(-N // tile_m(ti))
    ntasks = min(max(min(-(-npan // ROWS_PANELS), npan), nworkers), npan)
    p = np.array([0, w2.ctypes.data, xp.ctypes.data, out2.ctypes.data, bias.ctypes.data,
                  epilogue_address(out2.dtype, code) if epilogue else 0, N, K, M, nr, ntasks], np.int64)
    fn = worker_address(rows_worker, (bool(out2.dtype == np.float64), ti))
    run_workers(fn, p, max(1, min(nworkers, ntasks)))


def rows_tiles() -> tuple:
    """The tiles (TILES indices) gemm_rows chooses from on this target: ROWS_TILES, or the
    CPU's own set of ROWS_TILES_BY_CPU."""
    return ROWS_TILES_BY_CPU.get(target.cpu_name(), ROWS_TILES)


def rows_tile(M, dtype) -> int:
    """The tile (a TILES index) gemm_rows runs for x with M rows: of rows_tiles(), the one
    whose NR-row panels of x pad the fewest rows."""
    return min(rows_tiles(), key=lambda ti: -(-M // tile_n(dtype, ti)) * tile_n(dtype, ti))


def rows_workspace(M, K, dtype) -> int:
    """Elements of gemm_rows's workspace for x (M, K)."""
    nr = tile_n(dtype, rows_tile(M, dtype))
    return -(-M // nr) * nr * K


# ---- GEMV ------------------------------------------------------------------------------------

@njit(inline="always")
def _a4(a, transa, m, k):
    """A's values (m, k .. k+3) (a stored (K, M) when transa)."""
    if transa:
        return a[k, m], a[k + 1, m], a[k + 2, m], a[k + 3, m]
    return a[m, k], a[m, k + 1], a[m, k + 2], a[m, k + 3]


# gemv_kn's int64 argument block: addresses, sizes, the epilogue's address (0: none), the
# phase and its item counter.
(V_A, V_B, V_OUT, V_BIAS, V_PART, V_AIDX, V_BIDX, V_NBATCH, V_M, V_N, V_K, V_TRANSA, V_NS,
 V_EPILOGUE, V_PHASE, V_NEXT, V_COUNT) = range(17)


def gemv_kn(a3, b3, a_idx, b_idx, transa, bias, epilogue, code, out3, nworkers, slabs=0):
    """out3 as gemm_parallel, for few rows and B stored (K, N) (b3 (Bb, K, N), C-contiguous
    like every operand): the batch's K rows in GEMV_KN_SPLITS slabs of whole rows (each one
    sequential stream of memory), each summed into partial M x N results, GEMV_KN_ROWS rows
    per pass over them; then a pass adding the partials row by row with the epilogue
    (epilogue False: plain product).  Both passes run gemv_kn_worker by address on the
    team (parallel.run_workers); slabs: another worker's address for the first pass (a
    16-bit B's, kernels_cpu.weight_only.gemv_kn16), which reads this argument block."""
    nbatch, M, N = out3.shape
    K = b3.shape[1]
    ns = min(GEMV_KN_SPLITS, K)
    part = np.empty(nbatch * ns * M * N, out3.dtype)
    p = np.zeros(V_COUNT, np.int64)
    p[V_NBATCH], p[V_M], p[V_N], p[V_K] = nbatch, M, N, K
    p[V_TRANSA], p[V_NS] = transa, ns
    p[V_EPILOGUE] = epilogue_address(out3.dtype, code) if epilogue else 0
    addresses(p, (a3, b3, out3, bias, part, a_idx, b_idx))  # slots V_A .. V_BIDX
    fn = worker_address(gemv_kn_worker, (bool(out3.dtype == np.float64),))
    for phase, items in ((0, nbatch * ns), (1, nbatch * M)):
        p[V_PHASE], p[V_NEXT] = phase, 0
        run_workers(slabs if phase == 0 and slabs else fn, p, max(1, min(nworkers, items)))


@njit(inline="always")
def gemv_kn_slab(part, t, ns, K):
    """Slab item t of gemv_kn's first pass: (its batch, its K rows k0 .. k1 - 1, its M x N
    partial sums, zeroed)."""
    bi = t // ns
    sp = t - bi * ns
    acc = part[bi, sp]
    zero = acc.dtype.type(0)
    for m in range(acc.shape[0]):
        arow = acc[m]
        for j in range(acc.shape[1]):
            arow[j] = zero
    return bi, sp * K // ns, (sp + 1) * K // ns, acc


@njit(**JIT_BY_ADDRESS)
def gemv_kn_worker(w, params, is64):
    """A worker of gemv_kn's pass V_PHASE (0: slabs, 1: rows), items from V_NEXT."""
    wide_loops()
    p = c_array_at(params, np.int64(0), (V_COUNT,))
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    nbatch, M, N, K, ns = p[V_NBATCH], p[V_M], p[V_N], p[V_K], p[V_NS]
    transa = p[V_TRANSA] != 0
    a_idx = c_array_at(p[V_AIDX], np.int64(0), (nbatch,))
    b_idx = c_array_at(p[V_BIDX], np.int64(0), (nbatch,))
    part = c_array_at(p[V_PART], z, (nbatch, ns, M, N))
    out = c_array_at(p[V_OUT], z, (nbatch, M, N))
    if p[V_PHASE] == 0:
        while True:
            t = fetch_add(p, V_NEXT, 1)
            if t >= nbatch * ns:
                break
            bi, k0, k1, acc = gemv_kn_slab(part, t, ns, K)
            a = c_array_at(p[V_A] + a_idx[bi] * M * K * isz, z, (K, M) if transa else (M, K))
            b = c_array_at(p[V_B] + b_idx[bi] * K * N * isz, z, (K, N))
            # GEMV_KN_ROWS rows of B per pass over the accumulators, then the rest one by one
            k = k0
            while k + GEMV_KN_ROWS <= k1:
                for m in range(M):
                    x0, x1, x2, x3 = _a4(a, transa, m, k)
                    x4, x5, x6, x7 = _a4(a, transa, m, k + 4)
                    arow = acc[m]
                    for j in range(N):
                        arow[j] += (((x0 * b[k, j] + x1 * b[k + 1, j]) + (x2 * b[k + 2, j] + x3 * b[k + 3, j]))
                                    + ((x4 * b[k + 4, j] + x5 * b[k + 5, j]) + (x6 * b[k + 6, j] + x7 * b[k + 7, j])))
                k += GEMV_KN_ROWS
            while k < k1:
                for m in range(M):
                    xk = a[k, m] if transa else a[m, k]
                    arow = acc[m]
                    for j in range(N):
                        arow[j] += xk * b[k, j]
                k += 1
    else:
        while True:
            t = fetch_add(p, V_NEXT, 1)
            if t >= nbatch * M:
                break
            bi = t // M
            m = t - bi * M
            dst = out[bi, m]
            src = part[bi, 0, m]
            for j in range(N):
                dst[j] = src[j]
            for sp in range(1, ns):
                src = part[bi, sp, m]
                for j in range(N):
                    dst[j] += src[j]
            if p[V_EPILOGUE] != 0:
                call_address(p[V_EPILOGUE], (p[V_OUT] + (bi * M + m) * N * isz, N, 1, N, p[V_BIAS]))


def gemv_nk(a3, b3, a_idx, b_idx, transa, bias, epilogue, code, out3, nworkers):
    """out3 as gemm_parallel, for few rows and B stored (N, K) (a Linear weight): tasks of
    GEMV_NK_ROWS weight rows on the thread team, each group of TB weight rows dotted with
    every row of A by dot_tile (kernels_cpu/dot_tile.py: weight rows streamed once, the next
    group prefetched), then the epilogue over the task's columns."""
    nbatch, M, N = out3.shape
    K = b3.shape[2]
    p = np.zeros(V_COUNT, np.int64)
    p[V_NBATCH], p[V_M], p[V_N], p[V_K] = nbatch, M, N, K
    p[V_EPILOGUE] = epilogue_address(out3.dtype, code) if epilogue else 0
    a2 = np.ascontiguousarray(np.swapaxes(a3, 1, 2)) if transa else a3  # dot_tile reads A's rows along K
    addresses(p, (a2, b3, out3, bias, bias, a_idx, b_idx))  # no partial sums: bias fills their slot
    fn = worker_address(gemv_nk_worker, (bool(out3.dtype == np.float64),))
    items = nbatch * -(-N // GEMV_NK_ROWS)
    run_workers(fn, p, max(1, min(nworkers, items)))


@njit(**JIT_BY_ADDRESS)
def gemv_nk_worker(w, params, is64):
    """A worker of gemv_nk: tasks (batch, block of GEMV_NK_ROWS weight rows) from V_NEXT."""
    p = c_array_at(params, np.int64(0), (V_COUNT,))
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    nbatch, M, N, K = p[V_NBATCH], p[V_M], p[V_N], p[V_K]
    a_idx = c_array_at(p[V_AIDX], np.int64(0), (nbatch,))
    b_idx = c_array_at(p[V_BIDX], np.int64(0), (nbatch,))
    out = c_array_at(p[V_OUT], z, (nbatch * M * N,))
    t = np.empty(TA * TB, out.dtype)
    nblk = (N + GEMV_NK_ROWS - 1) // GEMV_NK_ROWS
    while True:
        task = fetch_add(p, V_NEXT, 1)
        if task >= nbatch * nblk:
            break
        bi = task // nblk
        c0 = (task - bi * nblk) * GEMV_NK_ROWS
        cl = min(GEMV_NK_ROWS, N - c0)
        a = c_array_at(p[V_A] + a_idx[bi] * M * K * isz, z, (M * K,))
        b = c_array_at(p[V_B] + b_idx[bi] * N * K * isz, z, (N * K,))
        for j0 in range(0, cl, TB):
            nj = min(TB, cl - j0)
            b0 = (c0 + j0) * K
            b1 = b0 + min(1, nj - 1) * K
            b2 = b0 + min(2, nj - 1) * K
            nn = min(TB, cl - j0 - TB)   # rows of the next group: the first row group prefetches them
            n0 = b0 + TB * K if nn > 0 else b0
            n1 = b0 + (TB + 1) * K if nn > 1 else b0
            n2 = b0 + (TB + 2) * K if nn > 2 else b0
            if M == 1:
                dot_row(K, a, 0, b, b0, b1, b2, n0, n1, n2, t)
                for jj in range(nj):
                    out[bi * N + c0 + j0 + jj] = t[jj]
                continue
            for i0 in range(0, M, TA):
                first = i0 == 0
                q0 = n0 if first else b0
                q1 = n1 if first else b0
                q2 = n2 if first else b0
                ni = min(TA, M - i0)
                a0 = i0 * K
                dot_tile(K, a, a0, a0 + min(1, ni - 1) * K, a0 + min(2, ni - 1) * K, a0 + min(3, ni - 1) * K,
                         b, b0, b1, b2, q0, q1, q2, t)
                for ii in range(ni):
                    o = (bi * M + i0 + ii) * N + c0 + j0
                    for jj in range(nj):
                        out[o + jj] = t[ii * TB + jj]
        if p[V_EPILOGUE] != 0:
            call_address(p[V_EPILOGUE], (p[V_OUT] + (bi * M * N + c0) * isz, N, M, cl, p[V_BIAS] + c0 * isz))


# ---- epilogue pass (for results computed elsewhere) -------------------------------------------

EPI_ROWS = 8  # rows per epilogue task (not measured: enough tasks for 2 threads at M >= 16)
# Results of at most this many elements get the pass on the calling thread: one decode row
# (4096 outputs) is a microsecond of work, less than handing it to other threads (not
# measured on its own).  bias + gelu, 2 threads, medians of 9 x 50 calls, two alternating
# processes each (Xeon with AVX-512, 2026-12-03), us, the former prange kernel on numba's
# threads -> this: 1x3072 7.2-7.8 -> 4.8, 1x11008 13.3-13.6 -> 9.4-9.6, 16x3072 26.5-27.6
# -> 19.1-21.7, 128x768 46.0-47.5 -> 38.2-39.9, 512x3072 696-750 -> 530-556.
EPI_SERIAL_MAX = 1 << 14

# epilogue()'s int64 argument block: addresses, sizes, gemm_epilogue's address, task counter
(E_C, E_BIAS, E_ROWS, E_N, E_ISZ, E_FN, E_NEXT, E_COUNT) = range(8)


def epilogue(c2, bias, code, nworkers):
    """c2[r, :] = act(c2[r, :] + bias) in place, for a C-contiguous (rows, N) array: blocks
    of EPI_ROWS rows by epilogue_worker on the thread team (the calling thread alone up to
    EPI_SERIAL_MAX elements), each gemm_epilogue by address."""
    rows, n = c2.shape
    p = np.zeros(E_COUNT, np.int64)
    p[E_ROWS], p[E_N], p[E_ISZ], p[E_FN] = rows, n, c2.itemsize, epilogue_address(c2.dtype, code)
    addresses(p, (c2, bias))  # slots E_C, E_BIAS
    fn = worker_address(epilogue_worker, ())
    run_workers(fn, p, 1 if c2.size <= EPI_SERIAL_MAX else min(nworkers, -(-rows // EPI_ROWS)))


@njit(**JIT_BY_ADDRESS)
def epilogue_worker(w, params):
    """A worker of epilogue(): blocks of EPI_ROWS rows from E_NEXT, the dtype's and
    activation's gemm_epilogue called on each (so this worker compiles once)."""
    p = c_array_at(params, np.int64(0), (E_COUNT,))
    rows, n = p[E_ROWS], p[E_N]
    nt = (rows + EPI_ROWS - 1) // EPI_ROWS
    while True:
        t = fetch_add(p, E_NEXT, 1)
        if t >= nt:
            break
        r0 = t * EPI_ROWS
        call_address(p[E_FN], (p[E_C] + r0 * n * p[E_ISZ], n, min(EPI_ROWS, rows - r0), n, p[E_BIAS]))
