"""int8 GEMM with int32 accumulation and a fused dequantize + bias + activation epilogue.

    out[m, n] = act(sa[m] * sb[n] * X[m, n] + bias[n]),
    X[m, n]   = sum_k (a[m, k] - za[m]) * (b[k, n] - zb[n])          (an exact integer)

a: int8 or uint8 activations (per-row or per-tensor scale / zero point), b: int8 weights
(per-column or per-tensor).  The kernels multiply the *unshifted* unsigned activations
au = a + s (s = 128 for int8 a, 0 for uint8) with the signed weights, as the hardware's
u8 x s8 dot product wants, and correct afterwards:

    acc[m, n] = sum_k au[m, k] * b[k, n]                             (int32, exact)
    X[m, n]   = acc[m, n] - c[m] * colsum[n] - zb[n] * rsa[m]
    c[m] = s + za[m],  colsum[n] = sum_k b[k, n],  rsa[m] = sum_k (a[m, k] - za[m])

colsum is computed once when the weight is packed; c and rsa when A is packed.  Exactness:
|au| <= 255 and |b| <= 128, so |acc| <= K * 32640 < 2^31 for K <= MAX_K = 65793; the
epilogue evaluates X in float64, where every term is an integer below 2^53 (exact), then
(sa * sb) (exact in float64: 24-bit significands) times X, + bias, rounded once to float32,
then the activation (kernels_cpu/approx.py's float32 functions).

Instruction paths (chosen per call by the dispatcher from the host's features, see
`host_paths`; each compiled only when used, so a host without AVX-512 never compiles the
VNNI kernel):
  PATH_AMX      AMX-INT8 `tdpbusd` (Sapphire Rapids and later; Linux grants the tile state
                on request, `amx.permission`): a 32 x 32 block as 2 x 2 tiles of 16 x 16
                int32, per 64-byte K chunk two A tiles (16 rows x 64 u8, read in place
                from A's rows) and two B tiles (16 groups x 16 columns x 4 s8) from the
                same [k/4][NR][4] panel layout as VNNI with NR = 32.  onnxruntime's MLAS
                runs AMX on these hosts too (its 128x768x768 u8s8 MatMulInteger took
                ~60-130 us here, beyond any vpdpbusd kernel's reach on 2 cores).
  PATH_AMX_ROWS one row of A (a decode step) on an AMX host: PATH_VNNI512's code with MR = 1
                over the AMX panels ([k/4][32][4] s8 is two zmm of vpdpbusd operands), so
                the weight packed for PATH_AMX serves both; a 32-row tile would compute 31
                wasted rows.  matmul_int8 1x768x768 81 -> 48 us, dynamic_quant_linear
                1x4096x4096 738 -> 512 us (timeit medians, 2 threads, 2026-11-26).
  PATH_VNNI_ROWS one row of A on a VNNI host: PATH_VNNI512's code with MR = 1 over the same
                48-column panels, where the 8-row tile computes 7 wasted rows.  Zen 5,
                through dispatch, 2 threads, medians of 9 (2026-11-26), tile -> rows:
                matmul_int8 1x768x768 32.2 -> 29.3 us, 1x768x3072 47.4 -> 42.0,
                1x4096x4096 188.5 -> 131.0; dynamic_quant_linear 1x4096x4096 185.2 -> 126.7.
  PATH_VNNI512  AVX-512 VNNI `vpdpbusd` on zmm registers (llvm.x86.avx512.vpdpbusd.512):
                16 int32 lanes, each += 4 u8 x s8 products.  Register tile MR_V x NR_V =
                8 x 48 (24 zmm accumulators, 3 B vectors, 1 broadcast A word: 28 of 32).
                A's rows are read in place, a 4-byte word at a time (broadcast), from a
                copy padded to whole tiles and words; B is packed as [panel][k/4][NR][4] s8.
  PATH_AVX2     AVX2 `vpmaddwd` (llvm.x86.avx2.pmadd.wd) on int16 operands: exact (int16
                products, pair sums in int32), unlike `vpmaddubsw`, whose int16 pair sums
                saturate (255 * 127 * 2 > 32767; onnxruntime's AVX2 u8s8 kernel does).
                Register tile MR_A x NR_A = 6 x 16 (12 ymm accumulators, 2 B, 1 A).  A
                rows as int16 (words of 2), B as [panel][k/2][NR][2] int16.
  PATH_PORTABLE plain numba int32 loops on the unpacked operands (any host).
The packed paths run one worker, gemm_packed (the path a literal argument: a variant holds
one path's instructions; the activation is act_rows, called by address per output row, one
small function per activation), on numba's threads through
parallel.run_workers: the workers take (row block x column block) tasks from a counter,
each task running the micro-kernel over the whole K (no K blocking: a 48-column B panel of
K = 4096 is 192 KiB, in L2) into a small int32 buffer (a row panel across the task's
columns), then the epilogue from that buffer straight into the output (fused: the output
is written once).  Few rows (decode) take the same path (on AMX hosts, one row takes
PATH_AMX_ROWS): one row panel, the tasks split the columns, and each packed weight panel is
streamed once.  A is packed (or quantized) by row packers called by address
(pack_int_rows, quant_pack_rows): when every row panel is one task's, by each GEMM task
for its own rows (gemm's note), else first, by workers of their own (pack_a_rows) in
blocks of PACK_ROWS rows.

Workers called by address instead of prange loops: each is compiled once, alone (a prange
kernel compiles its body again into a parfor gufunc).  Cold first call of matmul_int8
128x768x768 (empty cache, this Sapphire Rapids host, 2026-11-26): 4.06 s with prange
drivers that compiled every activation, 1.73 s now.
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from kernels_common.memory import aligned_empty

from . import amx, target
from .approx import OVERLOAD, ACT_NONE, ACTIVATIONS, JIT_BY_ADDRESS, wide_loops
from .half import bits_float
from .llvm_ir import arg_readers
from .parallel import (addresses, c_array_at, call_address, call_literal, fetch_add, launch, run_serial,
                       run_workers, worker_address)

PATH_VNNI512, PATH_AVX2, PATH_PORTABLE, PATH_AMX, PATH_AMX_ROWS, PATH_VNNI_ROWS = 0, 1, 2, 3, 4, 5
PATH_NAMES = {PATH_AMX: "amx-int8 tdpbusd (16x64 tiles, u8 x s8)",
              PATH_AMX_ROWS: "avx512-vnni vpdpbusd one row at a time over the AMX panels (few rows)",
              PATH_VNNI_ROWS: "avx512-vnni vpdpbusd one row at a time (few rows)",
              PATH_VNNI512: "avx512-vnni vpdpbusd (zmm, u8 x s8)",
              PATH_AVX2: "avx2 vpmaddwd (ymm, int16 x int16, exact)",
              PATH_PORTABLE: "portable int32 loops"}

# K limit of the exact int32 accumulation: K * 255 * 128 <= 2^31 - 1.
MAX_K = (2**31 - 1) // (255 * 128)

# Register tiles (rows MR, columns NR) and K group (products per int32 lane and step).
MR_V, NR_V, KG_V = 8, 48, 4
MR_A, NR_A, KG_A = 6, 16, 2
MR_X, NR_X, KG_X = 32, 32, 4   # AMX: 2 x 2 tiles of 16 x 16 int32
# PATH_AMX_ROWS: the AMX path's packed weight read by vpdpbusd one row of A at a time, for
# calls with few rows (decode), where a 32-row AMX tile computes 31 wasted rows.  An AMX
# panel ([k/4][32 columns][4 bytes]) is two zmm of what vpdpbusd takes, so the weight is
# not packed again.
TILES = {PATH_VNNI512: (MR_V, NR_V, KG_V), PATH_AVX2: (MR_A, NR_A, KG_A), PATH_AMX: (MR_X, NR_X, KG_X),
         PATH_AMX_ROWS: (1, NR_X, KG_X), PATH_VNNI_ROWS: (1, NR_V, KG_V)}
# K is padded (zeros) to a multiple of this: AMX multiplies 64-byte K chunks per tile.
K_ALIGN = {PATH_VNNI512: KG_V, PATH_AVX2: KG_A, PATH_AMX: 64, PATH_AMX_ROWS: 64, PATH_VNNI_ROWS: KG_V}
# The one-row form of a packed path (same weight panels, MR = 1).
ROWS_OF = {PATH_AMX: PATH_AMX_ROWS, PATH_VNNI512: PATH_VNNI_ROWS}


def k_words(k, path):
    """Words (groups of KG values) per packed row for K = k on path (K padded with zeros)."""
    al = K_ALIGN[path]
    return -(-k // al) * al // TILES[path][2]


def host_paths():
    """{path: None if it can run on this host, else the reason it cannot}: the features numba
    compiles for (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES when the user set them, e.g. for a
    portable cache, else LLVM's view of the host CPU): an instruction the target lacks would
    not compile."""
    feats, cpu = target.features(), target.cpu_name()
    out = {PATH_PORTABLE: None}
    need = ("avx512f", "avx512bw", "avx512vnni")
    miss = [f for f in need if f not in feats]
    out[PATH_VNNI512] = None if not miss else f"host {cpu} lacks {', '.join(miss)}"
    out[PATH_AVX2] = None if "avx2" in feats else f"host {cpu} lacks avx2"
    out[PATH_AMX] = amx.refusal("amx-int8")
    out[PATH_AMX_ROWS] = out[PATH_VNNI512] or out[PATH_AMX]  # vpdpbusd on the AMX path's panels
    out[PATH_VNNI_ROWS] = out[PATH_VNNI512]
    for path, name in _KERNEL_NAMES.items():  # declared x86-only in target.X86_ONLY
        off_x86 = target.x86_only_refusal(__name__, name)
        if off_x86 is not None:
            out[path] = off_x86
    return out


# the worker of each packed path (GEMM below), by name: target.X86_ONLY declares it.  One
# worker serves the three paths: the path is a literal argument, so each compiled variant
# holds only its own path's instructions (a host without AVX-512 never compiles VNNI code).
_KERNEL_NAMES = {PATH_AMX: "gemm_packed", PATH_AMX_ROWS: "gemm_packed", PATH_VNNI_ROWS: "gemm_packed",
                 PATH_VNNI512: "gemm_packed",
                 PATH_AVX2: "gemm_packed"}


# ---- the micro-kernel -------------------------------------------------------------------------

def _micro_typer(path):
    mr, nr, _ = TILES[path]
    vnni = path in (PATH_VNNI512, PATH_AMX_ROWS, PATH_VNNI_ROWS)
    lanes = 16 if vnni else 8
    nv = nr // lanes

    def typer(typingctx, kq, ap, aoff, lda, bp, boff, t, toff, ldt):
        for arr in (ap, bp, t):
            if not (isinstance(arr, types.Array) and arr.dtype == types.int32):
                return None

        def codegen(context, builder, sig, args):
            i32, i64, i16 = ir.IntType(32), ir.IntType(64), ir.IntType(16)
            vty = ir.VectorType(i32, lanes)

            i64_of, data = arg_readers(context, builder, sig, args)

            apd = builder.gep(data(1), [i64_of(2)])
            lda = i64_of(3)
            bpd = builder.gep(data(4), [i64_of(5)])
            tpd = builder.gep(data(6), [i64_of(7)])
            ldt = i64_of(8)
            arows = [builder.gep(apd, [builder.mul(lda, ir.Constant(i64, i))]) for i in range(mr)]
            if vnni:
                dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty, vty, vty]),
                                                     "llvm.x86.avx512.vpdpbusd.512")
            else:
                wty = ir.VectorType(i16, 2 * lanes)
                pmadd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [wty, wty]),
                                                       "llvm.x86.avx2.pmadd.wd")
            zero = ir.Constant(vty, [ir.Constant(i32, 0)] * lanes)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)] for _ in range(mr)]
            undef = ir.Constant(vty, ir.Undefined)
            splat = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
            with cgutils.for_range(builder, i64_of(0)) as loop:
                k = loop.index
                bbase = builder.gep(bpd, [builder.mul(k, ir.Constant(i64, nr))])
                bvec = [builder.load(builder.bitcast(builder.gep(bbase, [ir.Constant(i64, v * lanes)]),
                                                     vty.as_pointer()), align=4) for v in range(nv)]
                if path == PATH_AVX2:
                    bvec = [builder.bitcast(b, wty) for b in bvec]
                for i in range(mr):
                    a = builder.load(builder.gep(arows[i], [k]), align=1)
                    av = builder.shuffle_vector(builder.insert_element(undef, a, ir.Constant(i32, 0)), undef, splat)
                    for v in range(nv):
                        old = builder.load(accs[i][v])
                        if vnni:
                            new = builder.call(dot, [old, av, bvec[v]])   # old += u8(av) . s8(b)
                        else:
                            new = builder.add(old, builder.call(pmadd, [builder.bitcast(av, wty), bvec[v]]))
                        builder.store(new, accs[i][v])
            for i in range(mr):
                for v in range(nv):
                    ptr = builder.gep(tpd, [builder.add(builder.mul(ldt, ir.Constant(i64, i)), ir.Constant(i64, v * lanes))])
                    builder.store(builder.load(accs[i][v]), builder.bitcast(ptr, vty.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.none(kq, ap, aoff, lda, bp, boff, t, toff, ldt), codegen

    return typer


def _amx_typer(kq, ap, aoff, lda, bp, boff, t, toff, ldt):
    """PATH_AMX's micro-kernel: t[i*NR_X + j] (int32, 32 x 32) = u8(A) . s8(B) for a 32-row A
    block (its rows in place at ap[aoff + i*lda], lda in words, K padded to 64-byte chunks)
    and a 32-column B panel (bp[boff:], [k/4][32][4] bytes, 128 bytes per K group): per
    64-byte K chunk, two A tiles (tmm4, tmm5: 16 rows each) and two B tiles (tmm6, tmm7: 16
    columns each, row stride 128 bytes) loaded, four `tdpbusd` into the C tiles tmm0-3 (16 x
    16 x 64 products each); then the C tiles stored into t.  The tile configuration
    (amx.config, tiles_begin) must have been loaded on this thread."""
    for arr in (ap, bp, t):
        if not (isinstance(arr, types.Array) and arr.dtype == types.int32):
            return None

    def codegen(context, builder, sig, args):
        i8, i64 = ir.IntType(8), ir.IntType(64)
        p8 = i8.as_pointer()
        f = amx.fns(builder)

        i64_of, data = arg_readers(context, builder, sig, args)

        def byte_ptr(pos, off_pos):
            return builder.bitcast(builder.gep(data(pos), [i64_of(off_pos)]), p8)

        C = lambda v: ir.Constant(i8, v)  # noqa: E731
        abase = byte_ptr(1, 2)
        lda_b = builder.mul(i64_of(3), ir.Constant(i64, 4))
        bbase = byte_ptr(4, 5)
        bstride = ir.Constant(i64, NR_X * 4)
        for tile in range(4):
            builder.call(f["zero"], [C(tile)])
        a1 = builder.gep(abase, [builder.mul(lda_b, ir.Constant(i64, 16))])
        nchunks = builder.udiv(i64_of(0), ir.Constant(i64, 16))
        with cgutils.for_range(builder, nchunks) as loop:
            c = loop.index
            aoff = builder.mul(c, ir.Constant(i64, 64))
            boffc = builder.mul(c, ir.Constant(i64, 16 * NR_X * 4))
            builder.call(f["load"], [C(4), builder.gep(abase, [aoff]), lda_b])
            builder.call(f["load"], [C(5), builder.gep(a1, [aoff]), lda_b])
            builder.call(f["load"], [C(6), builder.gep(bbase, [boffc]), bstride])
            builder.call(f["load"], [C(7), builder.gep(bbase, [builder.add(boffc, ir.Constant(i64, 64))]), bstride])
            builder.call(f["dpbusd"], [C(0), C(4), C(6)])
            builder.call(f["dpbusd"], [C(1), C(4), C(7)])
            builder.call(f["dpbusd"], [C(2), C(5), C(6)])
            builder.call(f["dpbusd"], [C(3), C(5), C(7)])
        tdata = byte_ptr(6, 7)  # t[toff:] (the gep scales by int32) as bytes
        ldt_b = builder.mul(i64_of(8), ir.Constant(i64, 4))
        for i in range(2):
            for j in range(2):
                off = builder.add(builder.mul(ldt_b, ir.Constant(i64, 16 * i)), ir.Constant(i64, 16 * j * 4))
                builder.call(f["store"], [C(2 * i + j), builder.gep(tdata, [off]), ldt_b])
        return context.get_dummy_value()

    return types.none(kq, ap, aoff, lda, bp, boff, t, toff, ldt), codegen


@intrinsic
def micro(typingctx, path, kq, ap, aoff, lda, bp, boff, t, toff, ldt):
    """The micro-kernel of the literal `path`; only that path's instructions are emitted.

    ap / bp / t int32 arrays (words of KG bytes or int16 values); A row i's word k at
    ap[aoff + i*lda + k] (A is not interleaved: its rows, padded to whole words, are read in
    place), the B panel at bp[boff:] (kq x NR words), the MR x NR int32 tile stored at
    t[toff + i*ldt + j].
      PATH_VNNI512: per group, NR_V/16 zmm loads of B, MR_V broadcast A words and
        MR_V * NR_V/16 `vpdpbusd` (llvm.x86.avx512.vpdpbusd.512) into zmm accumulators
        (allocas that mem2reg keeps in registers).
      PATH_AVX2: the same on ymm with words of 2 int16: `vpmaddwd` (llvm.x86.avx2.pmadd.wd,
        exact int16 x int16 pair sums) plus `vpaddd` per step.
      PATH_AMX: _amx_typer's tiles.
      PATH_AMX_ROWS: PATH_VNNI512's code for one row of A over a 32-column AMX panel.
      PATH_VNNI_ROWS: PATH_VNNI512's code for one row of A."""
    if not isinstance(path, types.IntegerLiteral):
        return None
    pv = path.literal_value
    if pv == PATH_AMX:
        res = _amx_typer(kq, ap, aoff, lda, bp, boff, t, toff, ldt)
    elif pv in (PATH_VNNI512, PATH_AVX2, PATH_AMX_ROWS, PATH_VNNI_ROWS):
        res = _micro_typer(pv)(typingctx, kq, ap, aoff, lda, bp, boff, t, toff, ldt)
    else:
        return None
    if res is None:
        return None
    inner_sig, inner = res

    def codegen(context, builder, sig, args):
        return inner(context, builder, inner_sig, args[1:])

    return types.none(path, *inner_sig.args), codegen


def _amx_path(path):
    """tiles_begin / tiles_end's test of their argument: True for the literal PATH_AMX,
    False for another literal path, None (no typing) otherwise."""
    if not isinstance(path, types.IntegerLiteral):
        return None
    return path.literal_value == PATH_AMX


tiles_begin = amx.tiles_switch(True, _amx_path)
tiles_begin.__doc__ = "On the AMX path (a literal) the tile configuration (ldtilecfg); nothing on the others."
tiles_end = amx.tiles_switch(False, _amx_path)
tiles_end.__doc__ = "On the AMX path (a literal) tilerelease (the thread's tile state back to unused); nothing on the others."


# ---- epilogue --------------------------------------------------------------------------------

@njit(inline="always")
def _epi_scale(acc, ao, sa, c, rs, sb, colsum, zb, bias, j0, dst, do, n):
    """dst[do + j] = f32(sa * sb[j0+j] * (acc[ao+j] - c * colsum[j0+j] - zb[j0+j] * rs) +
    bias[j0+j]) for j < n: float64 arithmetic on exact integers (see the module docstring),
    one rounding to float32.  Offsets into whole arrays (unsigned: no negative-index
    fix-up), not slices: a slice per row and operand cost a reference count each, more than
    the row's arithmetic."""
    ao, j0, do = _U(ao), _U(j0), _U(do)
    for j in range(_U(n)):
        x = np.float64(acc[ao + j]) - c * colsum[j0 + j] - zb[j0 + j] * rs
        dst[do + j] = np.float32(sa * sb[j0 + j] * x + bias[j0 + j])


def act_in_place(d, o, n, code):
    """d[o + j] = act(d[o + j]) for j < n, act the activation `code` (a literal: only its
    loop is compiled; ACT_NONE: nothing).  A loop of its own after _epi_scale's, all
    float32: 16 lanes on AVX-512, where inside the float64 loop it ran 8 wide (the
    gelu_tanh part of the AMX GEMM at 128x768x768 on one thread, 100 -> 50 us, 2026-11-25,
    loaded host, min of 200)."""


@overload(act_in_place, inline="always", **OVERLOAD)
def _act_in_place_overload(d, o, n, code):
    if not isinstance(code, types.IntegerLiteral):
        return None
    act = ACTIVATIONS.get(code.literal_value)
    if act is None:
        return lambda d, o, n, code: None

    def apply(d, o, n, code):
        ou = _U(o)
        for j in range(_U(n)):
            d[ou + j] = act(d[ou + j])
    return apply


@njit(inline="always")
def epi_row(acc, ao, sa, c, rs, sb, colsum, zb, bias, j0, dst, do, n, code):
    """_epi_scale, then the activation `code` (a literal) in place (act_in_place)."""
    _epi_scale(acc, ao, sa, c, rs, sb, colsum, zb, bias, j0, dst, do, n)
    act_in_place(dst, do, n, code)


_U = np.uint64


# ---- packing ---------------------------------------------------------------------------------

def pack_b(b, transposed, path):
    """The weight in the micro-kernel's layout (numpy, once per weight).

    b: int8 (K, N), or (N, K) when transposed (a PyTorch Linear weight).  Returns
    (bp, colsum): bp an int32 array of npanels * kq * NR words, panel q holding columns
    q*NR .. q*NR+NR-1 as [k group][column][KG values] (int8 bytes for PATH_VNNI512, int16
    for PATH_AVX2), zero padded in K and N; colsum float64 (N,) = sum_k b[k, n]."""
    mr, nr, kg = TILES[path]
    bk = np.ascontiguousarray(b.T if transposed else b)  # (K, N)
    k, n = bk.shape
    kq = k_words(k, path)
    npn = -(-n // nr)
    et = np.int16 if path == PATH_AVX2 else np.int8
    pad = np.zeros((kq * kg, npn * nr), et)
    pad[:k, :n] = bk
    # (kq, kg, npn, nr) -> (npn, kq, nr, kg)
    packed = aligned_empty((npn, kq, nr, kg), et)  # its panels on cache lines (tile / zmm rows)
    packed[...] = pad.reshape(kq, kg, npn, nr).transpose(2, 0, 3, 1)
    colsum = bk.astype(np.int64).sum(axis=0).astype(np.float64)
    return packed.reshape(-1).view(np.int32), colsum


# The A packers' argument block: int64 slots (addresses, then sizes); A_NEXT is the task
# counter the workers take row blocks from.
# A_SELF: the block's own address (gemm's G_PACK without a ctypes.data in Python).
(A_SRC, A_DST, A_ZA, A_SA, A_C, A_RS, A_SELF, A_M, A_K, A_MP, A_KP, A_FLIP, A_NEXT, A_ROWS, A_COUNT) = range(15)
# Rows per packing task: small blocks so that both threads share even a 128-row A.
PACK_ROWS = 16


def packed_zero(wide):
    return np.uint8(0)


@overload(packed_zero, **OVERLOAD)
def _packed_zero_overload(wide):
    """The element type of packed A (a literal wide: int16 words for PATH_AVX2, else uint8)."""
    if not isinstance(wide, types.BooleanLiteral):
        return None
    if wide.literal_value:
        return lambda wide: np.int16(0)
    return lambda wide: np.uint8(0)


@njit(inline="always")
def _pack_int_rows(p, r0, r1, wide):
    """Rows r0..r1-1 of dst packed from integer activations (pack_int_rows; rows from
    M on zero), from the argument block p."""
    M, K, Mp, Kp, flip = p[A_M], p[A_K], p[A_MP], p[A_KP], np.int32(p[A_FLIP])
    src = c_array_at(p[A_SRC], np.uint8(0), (max(M, 1), K))
    dst = c_array_at(p[A_DST], packed_zero(wide), (Mp, Kp))
    za = c_array_at(p[A_ZA], np.float64(0), (M,))
    c = c_array_at(p[A_C], np.float64(0), (M,))
    rs = c_array_at(p[A_RS], np.float64(0), (M,))
    shift = np.float64(flip)  # 128 or 0: the value the flip adds
    f8 = np.uint8(flip)  # a byte xor (au is 0..255 in either dst type)
    for m in range(r0, r1):
        d = dst[m]
        if m < M:
            row = src[m]
            # two loops, each vectorized on its own: the copy in dst's lanes (64 bytes a
            # zmm for uint8), then the sum of what it wrote, in int32 lanes (K * 255 <
            # 2^31 for K <= MAX_K); one loop of both ran on int64 lanes.  128x768 int8,
            # one thread: Xeon with AVX-512 (2026-12-03), pack_a 14.3-14.5 -> 10.8-11.3
            # us; the copy xor-ing in int32 lanes and the sum re-reading src -> the byte
            # xor and the sum over dst, loops alone on Zen 4 (2026-12-04): 6.2 -> 3.3 us
            for k in range(K):
                d[k] = row[k] ^ f8
            s = np.int32(0)
            for k in range(K):
                s += np.int32(d[k])
            for k in range(K, Kp):
                d[k] = 0
            c[m] = shift + za[m]
            rs[m] = np.float64(s) - K * c[m]
        else:
            for k in range(Kp):
                d[k] = 0


# The row packers are called by address (the block's A_ROWS), from the packing worker
# pack_a_rows and from gemm_packed's tasks (G_PACK): one compiled copy of each, not one
# inlined into every GEMM variant (inlined, matmul_int8's cold first call took 2.15-2.23 s
# against 1.68: gemm_packed's own compile went 0.38 -> 0.73 s, 2026-12-05, Zen 4).  No
# fastmath, as the packers always were: _rint relies on it.
_ROWS_BY_ADDRESS = dict(cache=True, error_model="numpy", nogil=True, no_cpython_wrapper=True)


@njit(**_ROWS_BY_ADDRESS)
def pack_int_rows(params, r0, r1, wide):
    """Rows r0..r1-1 of A packed from integer activations (_pack_int_rows) for the A_*
    argument block at address params: src (M, K) uint8 bytes (int8 activations viewed as
    uint8), au = byte ^ flip (flip 0x80 for int8: x + 128 as a byte; 0 for uint8); dst (Mp,
    Kp) uint8, or int16 when the literal wide (PATH_AVX2), Mp / Kp whole register tiles /
    words, zero padded (the micro-kernel reads A's rows in place, a word of KG values at a
    time).  za (M,) float64 zero points; c[m] = shift + za[m], rs[m] = sum_k (a - za)
    (float64, exact)."""
    wide_loops()
    _pack_int_rows(c_array_at(params, np.int64(0), (A_COUNT,)), r0, r1, wide)


@njit(cache=True, error_model="numpy", nogil=True)
def pack_a_rows(w, params):
    """A worker (parallel.run_workers) packing A for the packed paths: tasks of PACK_ROWS
    rows taken from the A_NEXT counter, each packed by the block's row packer (A_ROWS:
    pack_int_rows or quant_pack_rows)."""
    p = c_array_at(params, np.int64(0), (A_COUNT,))
    Mp = p[A_MP]
    task = fetch_add(p, A_NEXT, 1)
    while task * PACK_ROWS < Mp:
        call_address(p[A_ROWS], (params, task * PACK_ROWS, min(Mp, task * PACK_ROWS + PACK_ROWS)))
        task = fetch_add(p, A_NEXT, 1)


_RINT_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23


@njit(inline="always")
def _rint(v):
    """v rounded to the nearest integer, ties to even, for float32 |v| < 2^22: (v + 1.5*2^23)
    - 1.5*2^23 in float32 (the addition rounds in the 2^0 place).  numba's np.rint is a libm
    call per element, which kept the quantization loop scalar (136 us for 128 x 768 on one
    thread); these kernels are compiled without fastmath, so LLVM keeps both operations."""
    return (v + _RINT_MAGIC) - _RINT_MAGIC


_NEG_INF_KEY = np.int32(-2139095041)  # _order_key(-inf) = 0xFF800000 ^ 0x7FFFFFFF as int32
_POS_INF_KEY = np.int32(0x7F800000)


@njit(inline="always")
def _row_range(row, K):
    """(min(0, min x), max(0, max x), finite) of a float32 row, in one integer pass: the
    bit pattern b maps to the key b ^ ((b >> 31) & 0x7FFFFFFF), whose signed integer order
    is the float order (and NaNs land beyond the infinities), so the two reductions are
    integer min / max, which LLVM vectorizes; float min / max reductions stay scalar
    without fastmath's no-NaN promise (measured 2026-11-25 on this Sapphire Rapids host,
    128 x 768 on one thread: 98 us as float, 13 us as integers).  row: C-contiguous (its
    bits read in place through c_array_at: with row.view, dynamic_quant_linear's cold first
    call took 2.07-2.16 s, 1.90-1.96 without, 2026-12-03)."""
    bits = c_array_at(row.ctypes.data, np.int32(0), (K,))
    lo = np.int32(0)
    hi = np.int32(0)
    for k in range(K):
        b = bits[k]
        key = np.int32(b ^ ((b >> 31) & np.int32(0x7FFFFFFF)))
        lo = min(lo, key)
        hi = max(hi, key)
    finite = hi < _POS_INF_KEY and lo > _NEG_INF_KEY
    lo = lo ^ ((lo >> 31) & np.int32(0x7FFFFFFF))
    hi = hi ^ ((hi >> 31) & np.int32(0x7FFFFFFF))
    return bits_float(lo), bits_float(hi), finite


@njit(inline="always")
def _quant_row(row, K, qrow):
    """Per-row asymmetric uint8 quantization, ONNX DynamicQuantizeLinear's formulas on one
    row (float32 arithmetic, round half to even): scale = (max(0, max x) - min(0, min x)) /
    255, zp = saturate(round(-min(0, min x) / scale)), q = saturate(round(x / scale) + zp).
    A row of zeros gets scale 1, zp 0; a row holding NaN or inf scale NaN (nothing
    written).  Writes q into qrow[0:K] (any integer type wide enough for 0..255); returns
    (scale, zp)."""
    lo, hi, finite = _row_range(row, K)
    if not finite:
        return np.float32(np.nan), np.int32(0)
    scale = (hi - lo) / np.float32(255.0)
    if not (scale > np.float32(0.0)) or scale == np.inf:
        scale = np.float32(1.0)
    zp = np.float32(np.rint(np.float32(0.0) - lo / scale))
    zp = min(max(zp, np.float32(0.0)), np.float32(255.0))
    # the division, not quant.quantize_run's checked product: compiled into this packer, that
    # took dynamic_quant_linear's cold first call from 2.4-2.5 s to 2.6-2.9 s (the bar: 3 s) for
    # 27.5 -> 25.4 us at 128 x 768 (one thread, Xeon with AVX-512, 2026-12-07)
    for k in range(K):
        q = _rint(row[k] / scale) + zp
        q = min(max(q, np.float32(0.0)), np.float32(255.0))
        qrow[k] = q
    return scale, np.int32(zp)


@njit(inline="always")
def _quant_pack_rows(p, r0, r1, wide):
    """Rows r0..r1-1 of dst quantized from float32 rows (quant_pack_rows; rows from M
    on zero), from the argument block p."""
    M, K, Mp, Kp = p[A_M], p[A_K], p[A_MP], p[A_KP]
    src = c_array_at(p[A_SRC], np.float32(0), (max(M, 1), K))
    dst = c_array_at(p[A_DST], packed_zero(wide), (Mp, Kp))
    sa = c_array_at(p[A_SA], np.float64(0), (M,))
    c = c_array_at(p[A_C], np.float64(0), (M,))
    rs = c_array_at(p[A_RS], np.float64(0), (M,))
    for m in range(r0, r1):
        d = dst[m]
        if m < M:
            scale, zp = _quant_row(src[m], K, d)
            s = np.int32(0)  # as in _pack_int_rows
            for k in range(K):
                s += np.int32(d[k])
            for k in range(K, Kp):
                d[k] = 0
            sa[m] = scale
            c[m] = zp
            rs[m] = np.float64(s) - K * np.float64(zp)
        else:
            for k in range(Kp):
                d[k] = 0


@njit(**_ROWS_BY_ADDRESS)
def quant_pack_rows(params, r0, r1, wide):
    """pack_int_rows' twin for dynamic_quant_linear: each row of src (M, K) float32
    quantized to uint8 (_quant_row) straight into dst (Mp, Kp) (the same layout: no other
    copy of x), with its scale sa[m], c[m] = zp[m] and rs[m] = sum_k (q - zp).  A row
    holding NaN or inf gets scale NaN (the caller checks sa, before the GEMM or, when the
    GEMM's tasks pack, after it)."""
    wide_loops()
    _quant_pack_rows(c_array_at(params, np.int64(0), (A_COUNT,)), r0, r1, wide)


@njit(cache=True, error_model="numpy", nogil=True)
def quant_rows(x2, q, sa, zp):
    """The portable path's dynamic quantization: q (M, K) int32 rows, sa, zp per row."""
    for m in range(x2.shape[0]):
        s, z = _quant_row(x2[m], x2.shape[1], q[m])
        sa[m] = s
        zp[m] = z


# ---- the GEMM worker ----------------------------------------------------------------------------

# gemm_packed's argument block: int64 slots (addresses, then sizes); G_NEXT is the task
# counter the workers take tasks from.
(G_AP, G_BP, G_SA, G_C, G_RS, G_SB, G_COLSUM, G_ZB, G_BIAS, G_OUT, G_NAP, G_NBP,
 G_M, G_N, G_KQ, G_MC, G_NC, G_NTASKS, G_NEXT, G_ACT, G_PACK, G_COUNT) = range(22)


def packed_tile(path):
    return 0, 0


@overload(packed_tile, **OVERLOAD)
def _packed_tile_overload(path):
    """(MR, NR) of the literal path."""
    if not isinstance(path, types.IntegerLiteral) or path.literal_value not in TILES:
        return None
    mr, nr, _ = TILES[path.literal_value]
    return lambda path: (mr, nr)


@njit(**JIT_BY_ADDRESS)
def act_rows(dst, n, code):
    """dst[j] = act(dst[j]) for j < n float32 at address dst, act the activation `code` (a
    literal): the packed paths' activation, called by address once per output row, so
    that gemm_packed compiles once per path rather than per (path, activation): each
    further activation of dynamic_quant_linear cost 1.0-1.2 s of first call (a whole
    worker, Zen 4 VM, 2026-12-01).  16 lanes on AVX-512 (act_in_place's note)."""
    wide_loops()
    act_in_place(c_array_at(dst, np.float32(0), (n,)), 0, n, code)


@njit(cache=True, error_model="numpy", nogil=True)
def gemm_packed(w, params, path):
    """A worker (parallel.run_workers) of the packed paths: out (M, N) float32 = the module
    docstring's epilogue of the packed product.  path is a literal: each variant holds one
    path's micro-kernel; the activation is the block's G_ACT (act_rows' address, 0 for
    none), applied to each output row after its scaling.

    The argument block's G_* slots: ap / bp packed A / B (int32 words, TILES[path], G_NAP /
    G_NBP words); sa, c, rs per-row float64 (M,); sb, colsum, zb per-column float64 (N,);
    bias float32 (N,); out float32 (M, N) C-contiguous; mc / nc row / column panels per
    task; ntasks the (row block x column block) task count, taken one at a time from the
    G_NEXT counter.  A task takes its row panels one at a time: the micro-kernel for each
    of its column panels into an int32 buffer as wide as the task's columns, then the
    epilogue over those whole rows (one call per row, not per tile row: at 32-column tiles
    the per-call setup of the epilogue loop cost more than its arithmetic).

    G_PACK nonzero: the address of an A_* argument block (a_params'), and each task first
    packs A's rows of its own row panels itself, by the block's row packer, which needs
    every row panel in one task only (one column block: nc >= the column panels).  The
    rows are then packed on the thread that multiplies them, in parallel, with no launch
    of their own (gemm's note)."""
    wide_loops()  # the epilogue's loops 16 lanes wide on AVX-512
    p = c_array_at(params, np.int64(0), (G_COUNT,))
    M, N, kq, mc, nc, ntasks = p[G_M], p[G_N], p[G_KQ], p[G_MC], p[G_NC], p[G_NTASKS]
    MR, NR = packed_tile(path)
    ap = c_array_at(p[G_AP], np.int32(0), (p[G_NAP],))
    bp = c_array_at(p[G_BP], np.int32(0), (p[G_NBP],))
    sa = c_array_at(p[G_SA], np.float64(0), (M,))
    c = c_array_at(p[G_C], np.float64(0), (M,))
    rs = c_array_at(p[G_RS], np.float64(0), (M,))
    sb = c_array_at(p[G_SB], np.float64(0), (N,))
    colsum = c_array_at(p[G_COLSUM], np.float64(0), (N,))
    zb = c_array_at(p[G_ZB], np.float64(0), (N,))
    bias = c_array_at(p[G_BIAS], np.float32(0), (N,))
    of = c_array_at(p[G_OUT], np.float32(0), (M * N,))
    mp = (M + MR - 1) // MR
    npn = (N + NR - 1) // NR
    nnb = (npn + nc - 1) // nc
    t = np.empty(MR * nc * NR, np.int32)  # a row panel's int32 results across a task's columns
    pk = p[G_PACK]
    tiles_begin(path)
    task = fetch_add(p, G_NEXT, 1)
    while task < ntasks:
        mb = task // nnb
        nb = task - mb * nnb
        if pk != 0:
            call_address(c_array_at(pk, np.int64(0), (A_COUNT,))[A_ROWS], (pk, mb * mc * MR,
                                                                           min(mb * mc + mc, mp) * MR))
        q0 = nb * nc
        q1 = min(q0 + nc, npn)
        ldt = (q1 - q0) * NR
        j0 = q0 * NR
        width = min(N, q1 * NR) - j0
        for pn in range(mb * mc, min(mb * mc + mc, mp)):
            i0 = pn * MR
            for q in range(q0, q1):
                micro(path, kq, ap, pn * MR * kq, kq, bp, q * kq * NR, t, (q - q0) * NR, ldt)
            for i in range(min(MR, M - i0)):  # the epilogue over whole rows of the task's columns
                m = i0 + i
                _epi_scale(t, i * ldt, sa[m], c[m], rs[m], sb, colsum, zb, bias, j0, of, m * N + j0, width)
                if p[G_ACT] != 0:
                    call_address(p[G_ACT], (p[G_OUT] + (m * N + j0) * 4, width))
        task = fetch_add(p, G_NEXT, 1)
    tiles_end(path)


def _run(worker, variant, p, ntasks, nworkers):
    """worker(w, p) on min(nworkers, ntasks) threads (the calling thread alone for one)."""
    fn = worker_address(worker, variant)
    n = min(nworkers, ntasks)
    if n > 1:
        run_workers(fn, p, n)
    else:
        run_serial(fn, p)


@njit(cache=True, nogil=True)
def all_finite(v):
    """Whether every value of v is finite (numpy's np.all(np.isfinite(v)) costs ~2 us a call
    on a few values)."""
    for i in range(v.shape[0]):
        if not np.isfinite(v[i]):
            return False
    return True


def a_params(src, dst, c, rs, *, za=None, sa=None):
    """The A packers' argument block (A_*) for src (M, K) C-contiguous into dst (Mp, Kp)
    (uint8, or int16 for PATH_AVX2): int8 / uint8 activations with their zero points za (M,)
    float64 (pack_int_rows: c, rs filled), or float32 rows quantized on the way (sa given:
    quant_pack_rows fills sa, c, rs; a row holding NaN or inf gets sa NaN)."""
    M, K = src.shape
    p = np.zeros(A_COUNT, np.int64)
    quant = sa is not None
    addresses(p, (src, dst, sa if quant else za, sa if quant else za, c, rs, p))
    p[A_M], p[A_K], p[A_MP], p[A_KP] = M, K, dst.shape[0], dst.shape[1]
    p[A_FLIP] = 0x80 if src.dtype == np.int8 else 0
    p[A_ROWS] = worker_address(quant_pack_rows if quant else pack_int_rows, (bool(dst.dtype == np.int16),), 3)
    return p


def pack_a(src, dst, c, rs, *, za=None, sa=None, nworkers=1):
    """Pack A into dst (Mp, Kp), on up to nworkers threads: see a_params."""
    run_pack_a(a_params(src, dst, c, rs, za=za, sa=sa), dst, nworkers)


def run_pack_a(p, dst, nworkers):
    """pack_a on an argument block p of a_params for dst."""
    _run(pack_a_rows, (), p, -(-dst.shape[0] // PACK_ROWS), nworkers)


def gemm(path, code, ap, bp, sa, c, rs, sb, colsum, zb, bias, out, mc, nc, ntasks, kq, *, nworkers=1, pack=None):
    """out (M, N) float32 C-contiguous = gemm_packed's product on path (see there), on up
    to nworkers threads; ap / bp int32 words, the other vectors float64 (bias float32).

    pack: an A argument block (a_params) whose rows the tasks pack themselves
    (gemm_packed's G_PACK; the caller's sa / c / rs must be the block's), only with one
    column block (nc covering N).  matmul_int8 128x768x768 int8, 2 threads, Zen 4, medians
    of 1000 dispatch calls (2026-12-05): in one phase A packed first on the calling thread
    took 235-237 us, on both threads by pack_a's counter 219-220, by the tasks that use the
    rows 206-210 (the GEMM with A not packed at all: 203-205); in a quieter one, old / new
    processes alternating, 211-214 -> 205-207 (dynamic_quant_linear 213-228 -> 210-211;
    1x768x768, 128x768x3072, 512x768x768 unchanged).  Each thread's rows are written in its
    own cache instead of read from the other core's, and the packing runs in parallel."""
    run_gemm(path, gemm_block(path, code, ap, bp, sa, c, rs, sb, colsum, zb, bias, out, mc, nc, ntasks, kq, pack=pack),
             ntasks, nworkers)


def gemm_block(path, code, ap, bp, sa, c, rs, sb, colsum, zb, bias, out, mc, nc, ntasks, kq, *, pack=None):
    """gemm's argument block (G_*) for these arrays and this blocking: run_gemm runs it.  A
    caller that keeps it for further calls of the same shapes rebinds its per-call arrays
    first (rebind)."""
    M, N = out.shape
    if pack is not None and -(-N // TILES[path][1]) > nc:
        raise ValueError("gemm: pack needs one column block (nc >= the column panels)")
    p = np.zeros(G_COUNT, np.int64)
    addresses(p, (ap, bp, sa, c, rs, sb, colsum, zb, bias, out))
    if pack is not None:
        p[G_PACK] = pack[A_SELF]
    p[G_NAP], p[G_NBP], p[G_M], p[G_N], p[G_KQ] = ap.size, bp.size, M, N, kq
    p[G_MC], p[G_NC], p[G_NTASKS] = mc, nc, ntasks
    p[G_ACT] = 0 if code == ACT_NONE else worker_address(act_rows, (int(code),))
    return p


def run_gemm(path, p, ntasks, nworkers):
    """gemm_packed over the argument block p (gemm_block) on up to nworkers threads."""
    _run(gemm_packed, (int(path),), p, ntasks, nworkers)


@njit(cache=True, nogil=True)
def rebind(pa, ga, src, weight, bias, out):
    """Kept argument blocks (a_params' pa, gemm_block's ga) made ready for another call of
    the same shapes: A's source rows, the weight (weight: the addresses of its bp, sb,
    colsum and zb, weight_addresses), the bias and the output; the task counters back to
    0.  Every other slot (the workspace, sizes, blocking, kernel addresses) is the same."""
    pa[A_SRC] = src.ctypes.data
    pa[A_NEXT] = 0
    ga[G_BP] = weight[0]
    ga[G_SB] = weight[1]
    ga[G_COLSUM] = weight[2]
    ga[G_ZB] = weight[3]
    ga[G_BIAS] = bias.ctypes.data
    ga[G_OUT] = out.ctypes.data
    ga[G_NEXT] = 0


# A kept plan's launch block (plan_block): the workers run_planned starts and how.
(P_PACK_FN, P_GEMM_FN, P_GEMM_N, P_CHECK, P_COUNT) = range(5)
CHECK_NONE, CHECK_BEFORE, CHECK_AFTER = 0, 1, 2


def plan_block(path, pack_first, gemm_n, check):
    """run_planned's launch block for a kept plan: the A packer's worker when A is packed
    on the calling thread first (pack_first; else the GEMM's tasks pack it, or no packing),
    the GEMM's worker on `path` and its worker count, and when the rows' scales are checked
    (CHECK_*: float32 rows quantized while packed get scale NaN for a NaN or inf)."""
    b = np.zeros(P_COUNT, np.int64)
    b[P_PACK_FN] = worker_address(pack_a_rows, ()) if pack_first else 0
    b[P_GEMM_FN] = worker_address(gemm_packed, (int(path),))
    b[P_GEMM_N] = gemm_n
    b[P_CHECK] = check
    return b


@njit(cache=True, nogil=True)
def _rows_finite(addr, m):
    v = c_array_at(addr, np.float64(0), (m,))
    for i in range(m):
        if not np.isfinite(v[i]):
            return False
    return True


@njit(cache=True, nogil=True)
def run_planned(plan, pa, ga, src, weight, bias, out, sa0, za0, team_run, team_state):
    """A kept plan's call in one compiled step: rebind; with sa0 >= 0 (A quantized per
    tensor), every row's scale and zero point set to sa0 / za0; A packed on the calling
    thread (P_PACK_FN); the GEMM started on the team (team_run, team_state: team.entry()).
    Returns 0 when done, -1 when a row's scale is not finite (CHECK_BEFORE: before the GEMM
    wrote anything), else the GEMM's worker count, which the caller runs on numba's threads
    (run_gemm_rest; the team was busy).  Rebinding, filling, packing and starting the GEMM
    from Python took 3.3 us of an 18 us matmul_int8 1x768x768 (Zen 4, 2026-12-06)."""
    rebind(pa, ga, src, weight, bias, out)
    m = ga[G_M]
    if sa0 >= 0.0:
        sa = c_array_at(ga[G_SA], np.float64(0), (m,))
        za = c_array_at(pa[A_ZA], np.float64(0), (m,))
        for i in range(m):
            sa[i] = sa0
            za[i] = za0
    if plan[P_PACK_FN] != 0:
        call_address(plan[P_PACK_FN], (0, pa.ctypes.data))
        if plan[P_CHECK] == CHECK_BEFORE and not _rows_finite(ga[G_SA], m):
            return -1
    rest = launch(plan[P_GEMM_FN], ga.ctypes.data, plan[P_GEMM_N], team_run, team_state)
    if rest == 0 and plan[P_CHECK] == CHECK_AFTER and not _rows_finite(ga[G_SA], m):
        return -1
    return rest


def run_gemm_rest(plan, ga, rest):
    """The GEMM that run_planned could not start on the team (rest: its return value > 0),
    on the team if it is free by now, else on numba's threads (run_workers)."""
    run_workers(plan[P_GEMM_FN], ga, rest)


def weight_addresses(bp, sb, colsum, zb):
    """The int64 addresses rebind takes for a packed weight (bp, sb, colsum, zb)."""
    out = np.zeros(4, np.int64)
    addresses(out, (bp, sb, colsum, zb))
    return out


PORTABLE_NB = 256  # output columns per portable task (an int32 accumulator row in L1)


@njit(cache=True, parallel=True, error_model="numpy", nogil=True)
def gemm_portable(a2, shift, b2, M, N, K, sa, c, rs, sb, colsum, zb, bias, code, out, ntasks):
    """The portable path: a2 (M, K) integer activations (int8 / uint8 / int32 quantized
    rows), used as a + shift; b2 (K, N) int8.  Same epilogue; prange over (row x column
    block) tasks; code a literal (run_portable calls it so): only its activation compiles."""
    nnb = (N + PORTABLE_NB - 1) // PORTABLE_NB
    for task in prange(ntasks):
        m = task // nnb
        j0 = (task - m * nnb) * PORTABLE_NB
        nl = min(PORTABLE_NB, N - j0)
        acc = np.zeros(PORTABLE_NB, np.int32)
        row = a2[m]
        for k in range(K):
            av = np.int32(row[k]) + shift
            brow = b2[k]
            for j in range(nl):
                acc[j] += av * np.int32(brow[j0 + j])
        epi_row(acc, 0, sa[m], c[m], rs[m], sb, colsum, zb, bias, j0, out.reshape(M * N), m * N + j0, nl, code)


def run_portable(a2, shift, b2, M, N, K, sa, c, rs, sb, colsum, zb, bias, code, out, ntasks):
    """gemm_portable (same arguments) with code passed as a literal."""
    call_literal(gemm_portable, ("code",), a2, shift, b2, M, N, K, sa, c, rs, sb, colsum, zb, bias, code, out,
                 ntasks)
