"""bfloat16 x bfloat16 GEMM with float32 accumulation: linear and matmul with bfloat16
operands, as PyTorch's bfloat16 linear / matmul, on AMX tiles (`tdpbf16ps`, Sapphire Rapids
and later) or AVX-512 BF16 (`vdpbf16ps`, Zen 4, Cooper Lake and later).

    out[m, n] = bf16(act(sum_k x[m, k] * w[n, k] + bias[n]))      (linear; matmul: b[k, n])

x (M, K) and w (N, K) hold bfloat16 bit patterns (uint16), K even (but for matmul's b on
the AMX path); the sum is float32: both instructions multiply pairs of bfloat16 (exact in
float32: 8-bit significands) and add them to a float32 lane (round to nearest even,
bfloat16 and float32 subnormals read and written as zero: they ignore MXCSR).  Bias
(float32) and the activation are applied to the float32 sum, which is then rounded once to
bfloat16 (to nearest even, NaN kept a NaN).

AMX path (run_amx; linear's and matmul's, batched): C = x . w^T on 2 x 2 tiles of 16 x 16
float32 (amx_tile: 32 rows of x x 32 output columns, per chunk of 32 values of K two A
tiles of x's rows and two B tiles of the weight's pairs).  x is packed once per call into
tile-ordered row chunks (pack_group: the 32 x 32 values of a chunk in one 2 KiB piece),
matmul's b matrices once into B panels of AMX_NR columns (two rows interleaved,
_pack_kn_pairs), both by packing tasks that every worker takes first (one launch a call);
then each task packs its AMX_TASK_ROWS linear weight rows (a 32-bit word transpose,
pack_panel) into B panels on the thread that multiplies them, and runs them over a block
of x's rows (AMX_X_BYTES of them, so the weight is read from memory once per that much
x), K in blocks of AMX_KCH chunks.  The tiles are the output's rows: stored into a
float32 block, bias + activation, rounded.  Few rows (linear, M <= AMX_FEW_MAX: decode
batches) swap the roles (few_rows): the weight rows are read in place as the A tiles (a
stride of K values; a group's partial last chunk and a short last group copied), x packed
as B panels, the tiles transposed into the output's rows: the call reads the weight once.
Every tile operand sits on a cache line: a tile row across two lines halved the tiles'
rate (_lined).  Tile rate, one core, operands in L1 / L2 (Sapphire Rapids VM at 2.6 GHz,
2026-12-06): 2.1-2.7 / 1.45-1.65 TFLOP/s (peak 1024 flops a cycle, 2.66 TFLOP/s).

vdpbf16ps path (run: linear; run_kn: matmul, below).  Layout (the roles swapped against the float32 GEMM, so
that the large operand is never packed): the weight is the broadcast operand, read in
place: a 32-bit word of w's row n is a pair (k, k+1) of its values, which `vdpbf16ps`
takes with a {1to16} broadcast.  x is packed once per call into panels of NR rows:
xp[panel][k/2][NR] 32-bit words, the word of x row m and pair k/2 at lane m of the panel
(pack_x; M x K x 2 bytes, small beside the weight).  The register tile is MR weight rows x
NR x rows: MR * NR/16 = 24 zmm accumulators, NR/16 = 4 x vectors and one broadcast word
(29 of 32).  Per K pair: 4 zmm loads, 6 broadcast words, 24 `vdpbf16ps` (64 flops each).

Work: tasks of TASK_ROWS weight rows x X_BLOCK rows of x, taken from a counter (the x
block outer, so both threads stream the weight past the same block of x); a task runs
its MR-row weight groups over the block's panels (each weight group read from memory
once, from L1 for the further panels), storing the tiles weight row by weight row, then
turns them into a float32 block of output rows (X_BLOCK x TASK_ROWS) by 8 x 8 register
transposes, applies an activation (with the bias) by the float32 GEMM's epilogue (called
by address), and rounds the block into out (adding the bias there when there is no
activation).  No K blocking: a tile's K loop streams one x panel (NR x K x 2 bytes: 512
KiB at K = 4096) from L2 / L3 against MR weight rows.

Matmul on vdpbf16ps (run_kn: the hosts with AVX-512 BF16 but no AMX, Zen 4 and Cooper
Lake): the same tiles with the roles taken by a's rows (broadcast words, read in place)
and b's columns (panels of NR columns: pairs of b's rows interleaved by packing tasks that
every worker takes first, _pack_kn_dot), so the tiles are the output's rows: no
transposes, the epilogue and rounding applied to them directly.

Tile shape, 1 thread, 128 x 4096 x 1104 (Zen 4 VM, 2026-12-06, /tmp/w/bf/proto.py): 6 x 64
219-223 GFLOP/s, 8 x 48 197-203, 12 x 32 188-199 (the float32 FMA's ceiling here is about
111 per core: vdpbf16ps does twice the work per instruction).
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from kernels_common.memory import ALIGN

from . import amx, target
from .half import to_bf16
from .approx import ACT_NONE, JIT_BY_ADDRESS, OVERLOAD
from .gemm import _U, _pack_strided, _transpose_block, epilogue_address
from .llvm_ir import arg_readers
from .parallel import c_array_at, call_address, fetch_add, num_threads, only_if, run_at, worker_address

MR, NR, LANES = 6, 64, 16
# Tasks: 48 weight rows (8 MR groups) x 128 rows of x (2 panels).  Linear through dispatch,
# 2 threads, loops of 20 calls, ms at 128x768x768 / 1024^3 (Zen 4, 2026-12-06): 48 x 128
# 0.415 / 5.72, 48 x 64 0.462 / 6.39, 96 x 128 0.475 / 5.94, 24 x 128 0.79 / 6.34, 48 x 256
# 0.430 / 5.89 (PyTorch's bfloat16 linear beside them 0.38-0.40 / 5.0-5.2).
TASK_ROWS = 48
X_BLOCK = 128
# The AMX path (amx_tile): 32 rows of x (two A tiles) x AMX_NR output columns (two B
# tiles) per tile call; K in chunks of AMX_K values (a tile row of 64 bytes), zero-padded.
# Both operands packed so that a call's chunk of each is 2 KiB in one piece, which the
# prefetchers stream: weight rows read in place as 16-row A tiles (a stride of K values)
# and x in 64-row panels ran the tiles at 660 GFLOP/s, packed 1380 (512x768x3072, one
# core, Sapphire Rapids VM, 2026-12-06); and the tiles as the output's rows drop the
# transposes (epilogue 0.54 -> 0.22 ms of that product).
AMX_ROWS, AMX_K = 32, 32
AMX_NR = 32
AMX_TASK_ROWS = 64
# K chunks per block (the worker's K loop): the tile phase alone, one core, us at 128x768x768
# / 128x4096x1024 (operands packed, Sapphire Rapids VM, 2026-12-06), chunks per block 2 /
# 4 / 8 / 12 / 24 / all: 128-132 / 103 / 89-96 / 92-97 / 112-121 / 115-124, 1019-1045 / 905-935
# / 784-816 / 960-980 / 986-1005 / 947.  (With unaligned operands, no gain.)
AMX_KCH = 8
# Linear with at most this many rows of x reads the weight rows in place (few_rows) rather
# than packing them per task.  ms, 2 threads, medians of 11 rotating calls (SPR VM,
# 2026-12-06), at most 32 / 128 / 256 rows in place, M = 16 / 64 / 128 / 256:
#   11008 x 4096: 4.65 4.75 4.59 / 8.67 7.06 6.90 / 11.7 11.2 11.2 / 18.1 18.5 20.3;
#   3072 x 768: 0.42 0.42 0.40 / 0.87 0.59 0.65 / 1.09 0.84 0.84 / 1.36 1.51 1.43;
#   768 x 768: 0.129 0.129 0.136 / 0.27 0.26 0.24 / 0.34 0.31 0.32 / 0.54 0.47 0.54.
AMX_FEW_MAX = 128
# A task runs its weight rows over up to this many bytes of x (whole X_BLOCKs), so that
# the weight streams from memory once per that much x.  ms, 2 threads, medians of 7
# rotating calls (same VM, 2026-12-06), 1 / 2 / 4 / 8 MiB: 512x4096x4096 12.2 / 10.6 / 10.1
# / 10.1; 512x768x3072 1.61 / 1.54 / 1.58 / 1.61; 1024^3 1.57 / 1.67 / 1.61 / 1.52.
AMX_X_BYTES = 4 << 20


class _BFloat(ir.types._BaseFloatType):
    """LLVM's bfloat (llvmlite names half, float and double only): the element type of
    llvm.x86.avx512bf16.dpbf16ps.512's operands."""
    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self):
        return "bfloat"

    def format_constant(self, value):
        raise NotImplementedError("bfloat constants are not emitted")


_BFloat._create_instance()


def host_refusal():
    """None when this target can run the kernel (AVX-512 F and BF16), else why not."""
    off_x86 = target.x86_only_refusal(__name__, "bf16_worker")
    if off_x86 is not None:
        return off_x86
    miss = target.missing("avx512f", "avx512bf16")
    if miss:
        return f"host {target.cpu_name()} lacks {', '.join(miss)} (vdpbf16ps)"
    return None


def amx_refusal():
    """None when this target can run the AMX path (AMX-BF16 tiles, granted by Linux), else
    why not."""
    off_x86 = target.x86_only_refusal(__name__, "bf16_worker")
    if off_x86 is not None:
        return off_x86
    return amx.refusal("amx-bf16")


@intrinsic
def dot_tile(typingctx, kq, w, wo, xp, xoff, t, toff, ldt, load_c):
    """t[toff + i*ldt + j] = sum over q < kq of the bfloat16 pair dot product of the 32-bit
    words w[wo[i] + q] (weight row i: MR rows at the offsets wo, uint32 words) and
    xp[xoff + q*NR + j] (one packed x panel), in float32 (vdpbf16ps), for i < MR, j < NR;
    with load_c nonzero that sum is added to t's values (a K split over several calls)."""
    if not (isinstance(w, types.Array) and w.dtype == types.uint32 and isinstance(xp, types.Array)
            and xp.dtype == types.uint32 and isinstance(t, types.Array) and t.dtype == types.float32
            and isinstance(wo, types.Array) and wo.dtype == types.int64):
        return None
    nv = NR // LANES

    def codegen(context, builder, sig, args):
        i64_of, data = arg_readers(context, builder, sig, args)
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        vf = ir.VectorType(f32, LANES)
        vi = ir.VectorType(i32, LANES)
        vb = ir.VectorType(_BFloat(), 2 * LANES)
        dp = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vb, vb]),
                                            "llvm.x86.avx512bf16.dpbf16ps.512")
        wd, wod = data(1), data(2)
        wrows = [builder.gep(wd, [builder.load(builder.gep(wod, [ir.Constant(i64, i)]))]) for i in range(MR)]
        xb = builder.gep(data(3), [i64_of(4)])
        zero = ir.Constant(vf, [ir.Constant(f32, 0.0)] * LANES)
        td = builder.gep(data(5), [i64_of(6)])
        ldt = i64_of(7)
        load = builder.icmp_signed("!=", i64_of(8), ir.Constant(i64, 0))

        def t_at(i, v):
            ptr = builder.gep(td, [builder.add(builder.mul(ldt, ir.Constant(i64, i)), ir.Constant(i64, v * LANES))])
            return builder.bitcast(ptr, vf.as_pointer())

        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)] for _ in range(MR)]
        with builder.if_then(load):
            for i in range(MR):
                for v in range(nv):
                    builder.store(builder.load(t_at(i, v), align=4), accs[i][v])
        undef = ir.Constant(vi, ir.Undefined)
        splat = ir.Constant(vi, [0] * LANES)
        with cgutils.for_range(builder, i64_of(0)) as loop:
            q = loop.index
            base = builder.gep(xb, [builder.mul(q, ir.Constant(i64, NR))])
            xv = [builder.bitcast(builder.load(builder.bitcast(builder.gep(base, [ir.Constant(i64, v * LANES)]),
                                                               vi.as_pointer()), align=4), vb) for v in range(nv)]
            for i in range(MR):
                word = builder.load(builder.gep(wrows[i], [q]), align=2)
                wv = builder.bitcast(builder.shuffle_vector(builder.insert_element(undef, word, ir.Constant(i32, 0)),
                                                            undef, splat), vb)
                for v in range(nv):
                    builder.store(builder.call(dp, [builder.load(accs[i][v]), wv, xv[v]]), accs[i][v])
        for i in range(MR):
            for v in range(nv):
                builder.store(builder.load(accs[i][v]), t_at(i, v), align=4)
        return context.get_dummy_value()

    return types.none(kq, w, wo, xp, xoff, t, toff, ldt, load_c), codegen


@intrinsic
def amx_tile(typingctx, nchunks, ap, aoff, lda, astep, bp, boff, t, toff, ldt, load_c):
    """The AMX path's tile: t[toff + i*ldt + j] (float32) = the dot product over K of A row i
    (i < AMX_ROWS) and B column j (j < AMX_NR), by `tdpbf16ps` (pairs of bfloat16 products
    summed in float32) on 2 x 2 C tiles (tmm0-3) of 16 x 16.  A's rows (A tiles tmm4, tmm5:
    16 rows each): chunk c of AMX_K values of row i at uint16 ap[aoff + c*astep + i*lda] --
    x's rows packed (pack_group: lda AMX_K, astep AMX_ROWS*AMX_K, a tile's 1 KiB in one
    piece), or linear's weight rows in place (lda K, astep AMX_K: the few-rows form).  B is
    one panel (pack_panel), the pair q of its column j as the 32-bit word bp[boff +
    q*AMX_NR + j] (B tiles tmm6, tmm7: 16 pairs x 16 columns at a stride of AMX_NR words, the
    chunk's 2 KiB in one piece).  Both zero past K.  With load_c nonzero the C
    tiles start from t's values (a block of K after the first), else from zero.  The
    thread's tile configuration (amx_on) must be loaded."""
    if not (isinstance(ap, types.Array) and ap.dtype == types.uint16 and isinstance(bp, types.Array)
            and bp.dtype in (types.uint32, types.float32) and isinstance(t, types.Array)
            and t.dtype == types.float32):
        return None

    def codegen(context, builder, sig, args):
        i64_of, data = arg_readers(context, builder, sig, args)
        i8, i64 = ir.IntType(8), ir.IntType(64)
        p8 = i8.as_pointer()
        f = amx.fns(builder)

        def c8(v):
            return ir.Constant(i8, v)

        def c64(v):
            return ir.Constant(i64, v)

        def bytes_at(pos, off):
            return builder.bitcast(builder.gep(data(pos), [off]), p8)

        a0 = bytes_at(1, i64_of(2))
        lda = builder.mul(i64_of(3), c64(2))
        astep = builder.mul(i64_of(4), c64(2))
        a1 = builder.gep(a0, [builder.mul(lda, c64(16))])
        xb = bytes_at(5, i64_of(6))
        ldb = c64(AMX_NR * 4)
        tb = bytes_at(7, i64_of(8))
        ldt = builder.mul(i64_of(9), c64(4))
        c_at = [builder.gep(tb, [builder.add(builder.mul(ldt, c64(16 * a)), c64(16 * b * 4))])
                for a in range(2) for b in range(2)]
        with builder.if_else(builder.icmp_signed("!=", i64_of(10), c64(0))) as (then, other):
            with then:
                for tile in range(4):
                    builder.call(f["load"], [c8(tile), c_at[tile], ldt])
            with other:
                for tile in range(4):
                    builder.call(f["zero"], [c8(tile)])
        with cgutils.for_range(builder, i64_of(0)) as loop:
            ta = builder.gep(a0, [builder.mul(loop.index, astep)])
            ta1 = builder.gep(a1, [builder.mul(loop.index, astep)])
            tx = builder.gep(xb, [builder.mul(loop.index, c64(AMX_K // 2 * AMX_NR * 4))])
            # each dot product as soon as its tiles are in: 1130-1470 GFLOP/s on one core
            # against 600-1100 with the four loads first (L1-resident operands, Sapphire
            # Rapids VM, 2026-12-06)
            builder.call(f["load"], [c8(4), ta, lda])
            builder.call(f["load"], [c8(6), tx, ldb])
            builder.call(f["dpbf16ps"], [c8(0), c8(4), c8(6)])
            builder.call(f["load"], [c8(7), builder.gep(tx, [c64(64)]), ldb])
            builder.call(f["dpbf16ps"], [c8(1), c8(4), c8(7)])
            builder.call(f["load"], [c8(5), ta1, lda])
            builder.call(f["dpbf16ps"], [c8(2), c8(5), c8(6)])
            builder.call(f["dpbf16ps"], [c8(3), c8(5), c8(7)])
        for tile in range(4):
            builder.call(f["store"], [c8(tile), c_at[tile], ldt])
        return context.get_dummy_value()

    return types.none(nchunks, ap, aoff, lda, astep, bp, boff, t, toff, ldt, load_c), codegen


@intrinsic
def _copy_chunks(typingctx, wb, woff, w16, soff, nch):
    """wb[woff + c*AMX_ROWS*AMX_K + k] = w16[soff + c*AMX_K + k] for c < nch, k < AMX_K: one
    64-byte vector move per chunk (uint16 slices in numba moved 4 GB/s, this 13-19)."""
    if not (isinstance(wb, types.Array) and wb.dtype == types.uint16 and isinstance(w16, types.Array)
            and w16.dtype == types.uint16):
        return None

    def codegen(context, builder, sig, args):
        i64_of, data = arg_readers(context, builder, sig, args)
        i64 = ir.IntType(64)
        vty = ir.VectorType(ir.IntType(16), AMX_K).as_pointer()
        dst = builder.gep(data(0), [i64_of(1)])
        src = builder.gep(data(2), [i64_of(3)])
        with cgutils.for_range(builder, i64_of(4)) as loop:
            d = builder.gep(dst, [builder.mul(loop.index, ir.Constant(i64, AMX_ROWS * AMX_K))])
            v = builder.load(builder.bitcast(builder.gep(src, [builder.mul(loop.index, ir.Constant(i64, AMX_K))]),
                                             vty), align=2)
            builder.store(v, builder.bitcast(d, vty), align=2)
        return context.get_dummy_value()

    return types.none(wb, woff, w16, soff, nch), codegen


@njit(inline="always")
def pack_group(w16, N, K, r0, wb, woff, nct):
    """wb[woff + c*AMX_ROWS*AMX_K + i*AMX_K + k] = w16[(r0 + i)*K + c*AMX_K + k]: the AMX_ROWS
    rows from r0 of w16 (uint16, N rows of K) as nct chunks of AMX_K values, each chunk's
    rows contiguous (amx_tile's A tiles), zeros past K and past row N.  (Row by row: the
    rows' chunks one after another, 13.7 GB/s from memory on one core against 11.2 chunk by
    chunk, 11008 x 4096, 2026-12-06.)"""
    cb = AMX_ROWS * AMX_K
    kf = K - K % AMX_K
    for i in range(AMX_ROWS):
        d = woff + i * AMX_K
        if r0 + i < N:
            _copy_chunks(wb, d, w16, (r0 + i) * K, K // AMX_K)
            if kf < K:
                for k in range(AMX_K):
                    wb[_U(d + kf // AMX_K * cb + k)] = w16[_U((r0 + i) * K + kf + k)] if kf + k < K else 0
        else:
            for c in range(nct):
                for k in range(AMX_K):
                    wb[_U(d + c * cb + k)] = 0


@njit(inline="always")
def pack_panel(w32, s0, nrows, K2, wb, d0, K2p):
    """wb[d0 + q*AMX_NR + j] = w32[s0 + j*K2 + q]: AMX_NR rows of an (N, K) weight from word
    s0 (nrows of them, zeros after; w32 the weight's 32-bit words, pairs of bfloat16, as
    float32) as the AMX path's B panel, K2p pairs (zeros past K2)."""
    _pack_strided(w32, s0, K2, nrows, K2, wb, d0, AMX_NR)
    for i in range(K2 * AMX_NR, K2p * AMX_NR):
        wb[_U(d0 + i)] = 0


def _pair_interleaver(width):
    """An intrinsic interleave(dst, d0, dstride, b16, s0, N, npan): dst[d0 + p*dstride + j] =
    b16[s0 + p*width + j] | b16[s0 + N + p*width + j] << 16 for p < npan, j < width: two
    rows of b, `width` values of each at a time (one or two 64-byte loads), interleaved by
    one shuffle into the row of panel p (the B panels of a (K, N) b: AMX_NR columns for the
    AMX tiles, NR for vdpbf16ps)."""
    def typer(typingctx, dst, d0, dstride, b16, s0, N, npan):
        if not (isinstance(dst, types.Array) and dst.dtype == types.uint32 and isinstance(b16, types.Array)
                and b16.dtype == types.uint16):
            return None

        def codegen(context, builder, sig, args):
            i64_of, data = arg_readers(context, builder, sig, args)
            i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
            half = ir.VectorType(i16, width)
            whole = ir.VectorType(i16, 2 * width)
            mask = ir.Constant(ir.VectorType(i32, 2 * width), [j // 2 + (j % 2) * width for j in range(2 * width)])
            d = builder.gep(data(0), [i64_of(1)])
            r0 = builder.gep(data(3), [i64_of(4)])
            r1 = builder.gep(r0, [i64_of(5)])
            with cgutils.for_range(builder, i64_of(6)) as loop:
                off = builder.mul(loop.index, ir.Constant(i64, width))
                v0 = builder.load(builder.bitcast(builder.gep(r0, [off]), half.as_pointer()), align=2)
                v1 = builder.load(builder.bitcast(builder.gep(r1, [off]), half.as_pointer()), align=2)
                dp = builder.gep(d, [builder.mul(loop.index, i64_of(2))])
                builder.store(builder.shuffle_vector(v0, v1, mask), builder.bitcast(dp, whole.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.none(dst, d0, dstride, b16, s0, N, npan), codegen

    typer.__name__ = typer.__qualname__ = f"_interleave_pair{width}"
    return intrinsic(typer)


def _kn_pair_packer(width, interleave):
    """pack(b16, dst, m, q0, q1, K, N, K2p): pairs q0 <= q < q1 of rows of b matrix m (b16:
    (K, N) uint16 matrices) into its B panels at dst (uint32 [matrix][panel of `width`
    columns][K2p pairs][width]): the pair (b[2q, n], b[2q + 1, n]) one 32-bit word, zeros
    past K and N.  Each row is read from start to end (a panel at a time per task, 64
    bytes from each of K rows N values apart, read b at 4.6-7.7 GB/s, 4096 x 4096 one core,
    Sapphire Rapids VM, AMX_NR columns); interleave: _pair_interleaver(width)."""

    @njit(inline="always")
    def pack(b16, dst, m, q0, q1, K, N, K2p):
        npan = (N + width - 1) // width
        full = N // width
        for q in range(q0, q1):
            d0 = (m * npan * K2p + q) * width
            k0 = 2 * q
            s0 = (m * K + k0) * N
            if k0 + 1 < K:
                interleave(dst, d0, K2p * width, b16, s0, N, full)
            for pn in range(full if k0 + 1 < K else 0, npan):
                for j in range(width):
                    c = pn * width + j
                    lo = np.uint32(b16[_U(s0 + c)]) if k0 < K and c < N else np.uint32(0)
                    hi = np.uint32(b16[_U(s0 + N + c)]) if k0 + 1 < K and c < N else np.uint32(0)
                    dst[_U(d0 + pn * K2p * width + j)] = lo | (hi << np.uint32(16))

    return pack


# Pairs of b's rows per packing task (matmul), and x's row groups per task (the AMX path).
KN_PAIRS = 32
PACK_GROUPS = 4
_interleave_pair = _pair_interleaver(AMX_NR)
_interleave_pair_dot = _pair_interleaver(NR)


@njit(inline="always")
def _pack_kn_panel(b16, dst, d0, m, c0, nc, K2, N):
    """dst[d0 + q*NR + j] = the pair word (b[2q, c0 + j], b[2q + 1, c0 + j]) of b matrix m
    (b16: (2 K2, N) uint16 matrices) for q < K2, j < NR, zeros for j >= nc: one vdpbf16ps
    panel of b's columns c0.. (run_kn's P_SELF tasks)."""
    for q in range(K2):
        s0 = (m * 2 * K2 + 2 * q) * N + c0
        if nc == NR:
            _interleave_pair_dot(dst, d0 + q * NR, 0, b16, s0, N, 1)
        else:
            for j in range(NR):
                lo = np.uint32(b16[_U(s0 + j)]) if j < nc else np.uint32(0)
                hi = np.uint32(b16[_U(s0 + N + j)]) if j < nc else np.uint32(0)
                dst[_U(d0 + q * NR + j)] = lo | (hi << np.uint32(16))
_pack_kn_pairs = _kn_pair_packer(AMX_NR, _interleave_pair)          # the AMX path's B panels
_pack_kn_dot = _kn_pair_packer(NR, _interleave_pair_dot)            # the vdpbf16ps path's panels of b (matmul)


@intrinsic
def _pause(typingctx):
    """The x86 spin-wait hint (the AMX worker's wait for the packing tasks: x86 only)."""
    def codegen(context, builder, sig, args):
        fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), []))
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


def kn_panels_size(count, k, n):
    """uint32 words of the B panels of `count` (K, N) matrices (_pack_kn_pairs)."""
    return count * -(-n // AMX_NR) * -(-k // AMX_K) * (AMX_K // 2) * AMX_NR


# run_kn with at most this many rows of a runs tasks of all its rows x X_BLOCK columns of b,
# each packing its own panels of b (P_SELF: they go from L2 into the tiles) instead of a
# first pass over all of b (written out and read back).  Toggled in one process, 3 rounds
# of loop medians, 2 threads (Zen 4, 2026-12-07, /tmp/w/sp.py), us, self / first pass:
# 128x768x768 399-407 / 447-462, 12 x 128x64x128 97-100 / 104-117, 128x768x3072 1750-1825 /
# 1860-1927, 256x1024x1024 1395-1457 / 1467-1542, 128x4096x4096 13.4-14.3 / 14.3-15.5 ms;
# beyond it level: 384x1024x1024 1929-2025 / 1978-2069, 512x4096x4096 43.8-45.3 / 43.2-44.5 ms.
KN_SELF_ROWS = 256


def kn_dot_panels_size(count, k, n):
    """uint32 words of the vdpbf16ps path's panels of `count` (K, N) matrices, K even
    (run_kn; _pack_kn_dot)."""
    return count * -(-n // NR) * (k // 2) * NR


def _amx_flag(flag):
    """amx_on / amx_off's test of their argument: True for a literal True, False for None,
    None (no typing: numba tries the non-literal type first) otherwise."""
    if isinstance(flag, types.NoneType):
        return False
    if isinstance(flag, types.BooleanLiteral):
        return bool(flag.literal_value)
    return None


amx_on = amx.tiles_switch(True, _amx_flag)
amx_on.__doc__ = "With a literal True, load this thread's AMX tile configuration (amx.config); else nothing."
amx_off = amx.tiles_switch(False, _amx_flag)
amx_off.__doc__ = "With a literal True, release this thread's AMX tile state; else nothing."


def task_shape(use_amx):
    return 0, 0, 0


@overload(task_shape, **OVERLOAD)
def _task_shape_overload(use_amx):
    """(weight rows per tile call, weight rows per task, rows of x per block) of a path: the
    AMX path for a literal True, vdpbf16ps for None."""
    if isinstance(use_amx, types.NoneType):
        return lambda use_amx: (MR, TASK_ROWS, X_BLOCK)
    if isinstance(use_amx, types.BooleanLiteral) and use_amx.literal_value:
        return lambda use_amx: (AMX_ROWS, AMX_TASK_ROWS, X_BLOCK)
    return None


@njit(cache=True, nogil=True)
def pack_x(x32, xp):
    """xp[p, q, j] = x32[p*NR + j, q] (zero past the last row): x's rows (M, K/2 words) as
    panels of NR rows, one word per lane; both arrays float32 views of the words (the
    float32 GEMM's register-transposing packer moves them bit for bit)."""
    M, K2 = x32.shape
    src = x32.reshape(-1)
    dst = xp.reshape(-1)
    for p in range(xp.shape[0]):
        _pack_strided(src, p * NR * K2, K2, min(NR, M - p * NR), K2, dst, p * K2 * NR, NR)


@njit(inline="always")
def _lined(n):
    """An uninitialized float32 buffer of n values on a cache line (kernels_common.memory: a
    tile row off a line is split across two, and the AMX tiles ran at half speed, 1.0 vs 2.1
    TFLOP/s from L1 on one core, Sapphire Rapids VM, 2026-12-06)."""
    raw = np.empty(n + ALIGN // 4, np.float32)
    off = (ALIGN - raw.ctypes.data % ALIGN) % ALIGN // 4
    return raw[off:off + n]


@njit(inline="always")
def few_rows(w16, K, n0, nl, wt, wpad, xb, xoff, K2p, ml, acc_t, XB):
    """The AMX path for few rows of x (linear, M <= AMX_FEW_MAX): acc_t[i*XB + j] = weight
    row n0 + i . x row j for i < nl, j < ml (whole groups of AMX_ROWS and AMX_NR), the
    weight rows read in place as the A tiles (no packing: at these M the call streams the
    weight once, and packing it was a second pass) and x's rows from m0 as B panels at
    xb[xoff:] (pack_panel, K2p * AMX_NR words each).  A group's last partial
    chunk of K comes from wt (the in-place rows would read past their ends), a short last
    group's rows from wpad (rows of 2*K2p values); both zero past K."""
    nfull, tail = K // AMX_K, K % AMX_K
    kp = 2 * K2p
    for g in range(0, nl, AMX_ROWS):
        r0 = n0 + g
        gl = min(AMX_ROWS, nl - g)
        if gl == AMX_ROWS:
            if tail:
                for i in range(AMX_ROWS):
                    for k in range(tail):
                        wt[_U(i * AMX_K + k)] = w16[_U((r0 + i) * K + nfull * AMX_K + k)]
            for j in range(0, ml, AMX_NR):
                amx_tile(nfull, w16, r0 * K, K, AMX_K, xb, xoff + j * K2p, acc_t, g * XB + j, XB, 0)
                if tail:
                    amx_tile(1, wt, 0, AMX_K, AMX_ROWS * AMX_K, xb, xoff + j * K2p + nfull * (AMX_K // 2) * AMX_NR,
                             acc_t, g * XB + j, XB, 1)
        else:
            for i in range(gl):
                for k in range(K):
                    wpad[_U(i * kp + k)] = w16[_U((r0 + i) * K + k)]
            for j in range(0, ml, AMX_NR):
                amx_tile(K2p // (AMX_K // 2), wpad, 0, kp, AMX_K, xb, xoff + j * K2p, acc_t, g * XB + j, XB, 0)


# The int64 argument block of bf16_worker.  P_K2: pairs of K (rounded up), P_K2P: pairs per
# row of x's panels (K/2 padded to whole AMX chunks on the AMX path); P_BATCH products, the
# one of batch e multiplying x matrix P_AOF[e] by weight matrix P_BOF[e] (int64 arrays);
# P_BKN: the weight is (K, N) (a matmul's b) rather than (N, K).
# The AMX path's packing tasks (P_XSRC: the P_NA x matrices (M, K) into P_X; P_BSRC: with
# P_BKN the P_NB (K, N) b matrices into their panels at P_W) from the P_PNEXT counter, the
# finished ones counted in P_PDONE.
# P_FEW: linear with at most AMX_FEW_MAX rows of x, the weight rows read in place as A
# tiles and x packed as B panels (few_rows).
# P_SELF: run_kn with few rows of a: a task is all of a's rows x X_BLOCK columns of b, whose
# panels it packs itself (no first pass over all of b).
# P_BPACK: with P_BKN, the address of a packer that forms b's panels in place of
# _pack_kn_pairs (conv2d's im2col, kernels_cpu/conv_bf16.py): called as packer(i, params)
# for its packing tasks i, P_BTASKS of them per b matrix (b matrix i // P_BTASKS); its own
# arguments follow the P_COUNT slots (run_amx's b_packer extra).
# P_BREADY: run_kn's b panels are packed already (pack_kn_dot, dispatch.prepack): no packing.
(P_X, P_W, P_BIAS, P_OUT, P_M, P_N, P_K, P_K2, P_K2P, P_XS, P_BATCH, P_AOF, P_BOF, P_BKN, P_NEXT, P_EPI, P_ADD_BIAS,
 P_XSRC, P_BSRC, P_NA, P_NB, P_PNEXT, P_PDONE, P_FEW, P_OUT32, P_BPACK, P_BTASKS, P_SELF, P_BREADY,
 P_COUNT) = range(30)


@njit(**JIT_BY_ADDRESS)
def bf16_worker(wk, params, use_amx, kn, few):
    """A worker (parallel.run_workers) of run: tasks (X_BLOCK rows of x, task_shape's weight
    rows) from the P_NEXT counter, the x block outer.  use_amx a literal True (AMX tiles,
    amx_tile) or None (vdpbf16ps register tiles, dot_tile); kn (matmul's (K, N) b, either
    path) and on the AMX path few (linear's few-rows form) True or None too: each variant
    compiles only its own packing and tile loops (one variant for all three: 5.2 s cold,
    empty cache)."""
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    M, N, K2, K2p, nbatch = p[P_M], p[P_N], p[P_K2], p[P_K2P], p[P_BATCH]
    GR, TR, XB = task_shape(use_amx)
    if p[P_SELF]:
        TR = (N + MR - 1) // MR * MR   # (whole groups: a short group's tile still writes MR rows)
    # the output: bfloat16 bits, or (P_OUT32) the float32 sums themselves
    out32 = p[P_OUT32] != 0
    outf = c_array_at(p[P_OUT], np.uint16(0), (0 if out32 else nbatch * M * N,))
    outw = c_array_at(p[P_OUT], np.float32(0), (nbatch * M * N if out32 else 0,))
    bias = c_array_at(p[P_BIAS], np.float32(0), (N,))
    aof = c_array_at(p[P_AOF], np.int64(0), (nbatch,))
    bof = c_array_at(p[P_BOF], np.int64(0), (nbatch,))
    XS = p[P_XS]
    nbn = (N + TR - 1) // TR
    per_batch = nbn * ((M + XS - 1) // XS)
    ntask = nbatch * per_batch
    # vdpbf16ps: the tiles land weight row by weight row (acc_t: TR x XB), then 8 x 8
    # register transposes make the output's rows (acc: XB x TR); AMX: the tiles are the
    # output's rows
    acc_t = np.empty(TR * XB, np.float32)
    accf = _lined(XB * TR)
    if use_amx is not None:
        K, nx, nw = p[P_K], p[P_NA], p[P_NB]
        nct = K2p // (AMX_K // 2)
        ngrp = (M + AMX_ROWS - 1) // AMX_ROWS
        xsize = ngrp * nct * AMX_ROWS * AMX_K   # one x matrix, packed
        xa = c_array_at(p[P_X], np.uint16(0), (nx * xsize,))
        bkn = p[P_BKN] != 0
        npan_kn = (N + AMX_NR - 1) // AMX_NR
        w32 = c_array_at(p[P_W], np.float32(0), (0 if bkn else nw * N * K2,))   # (bit patterns, as float32)
        w16 = c_array_at(p[P_W], np.uint16(0), (0 if bkn else nw * N * K2 * 2,))
        wkn = c_array_at(p[P_W], np.uint32(0), (nw * npan_kn * K2p * AMX_NR if bkn else 0,))
        wb = _lined(0 if bkn else TR * K2p)   # the task's weight rows as B panels
        # the packing tasks first (x's row groups, b's pairs of rows), on every thread, then
        # wait until all are done: one launch per call (a second one cost ~30 us)
        x16 = c_array_at(p[P_XSRC], np.uint16(0), (nx * M * K,))
        b16 = c_array_at(p[P_BSRC], np.uint16(0), (nw * K * N if bkn else 0,))
        xt = (ngrp + PACK_GROUPS - 1) // PACK_GROUPS
        bt = ((K2p + KN_PAIRS - 1) // KN_PAIRS if p[P_BPACK] == 0 else p[P_BTASKS]) if bkn else 0
        npack = nx * xt + nw * bt
        if few is not None:
            wt = np.zeros(AMX_ROWS * AMX_K, np.uint16)        # a group's last partial chunk
            wpad = np.zeros(AMX_ROWS * 2 * K2p, np.uint16)    # a short last group's rows
        t = fetch_add(p, P_PNEXT, 1)
        while t < npack:
            if few is not None:   # x's rows as B panels of AMX_NR
                for j in range(0, M, AMX_NR):
                    pack_panel(c_array_at(p[P_XSRC], np.float32(0), (M * K2,)), j * K2, min(AMX_NR, M - j), K2,
                               c_array_at(p[P_X], np.float32(0), (ngrp * K2p * AMX_NR,)), j * K2p, K2p)
            else:
                packed = False
                if kn is not None:
                    if t >= nx * xt:
                        if p[P_BPACK] != 0:
                            call_address(p[P_BPACK], (t - nx * xt, params))
                        else:
                            bi = (t - nx * xt) // bt
                            q0 = (t - nx * xt - bi * bt) * KN_PAIRS
                            _pack_kn_pairs(b16, wkn, bi, q0, min(q0 + KN_PAIRS, K2p), K, N, K2p)
                        packed = True
                if not packed:
                    ai = t // xt
                    g0 = (t - ai * xt) * PACK_GROUPS
                    for g in range(g0, min(g0 + PACK_GROUPS, ngrp)):
                        pack_group(x16[ai * M * K:(ai + 1) * M * K], M, K, g * AMX_ROWS, xa,
                                   (ai * ngrp + g) * nct * AMX_ROWS * AMX_K, nct)
            fetch_add(p, P_PDONE, 1)
            t = fetch_add(p, P_PNEXT, 1)
        while fetch_add(p, P_PDONE, 0) < npack:
            _pause()
    elif kn is not None:
        # matmul (run_kn): a's rows are the broadcast rows (N of them, P_NA matrices, read in
        # place), b's columns the panels' lanes (M of them): b's pairs of rows interleaved
        # into its panels by packing tasks on every thread first, then wait until all are done
        npx = (M + NR - 1) // NR
        xp = c_array_at(p[P_X], np.uint32(0), (p[P_NB] * npx * K2 * NR,))
        w = c_array_at(p[P_W], np.uint32(0), (p[P_NA] * N * K2,))
        wo = np.empty(MR, np.int64)
        b16 = c_array_at(p[P_BSRC], np.uint16(0), (0 if p[P_BPACK] else p[P_NB] * 2 * K2 * M,))
        bt = p[P_BTASKS] if p[P_BPACK] else (K2 + KN_PAIRS - 1) // KN_PAIRS
        npack = 0 if p[P_SELF] or p[P_BREADY] else p[P_NB] * bt
        if p[P_SELF]:
            xp = np.empty(XB // NR * K2 * NR, np.uint32)   # the panels of this worker's task
        t = fetch_add(p, P_PNEXT, 1)
        while t < npack:
            if p[P_BPACK]:   # a packer of its own (conv2d's im2col): its tasks form the panels
                call_address(p[P_BPACK], (t, params))
            else:
                bi = t // bt
                q0 = (t - bi * bt) * KN_PAIRS
                _pack_kn_dot(b16, xp, bi, q0, min(q0 + KN_PAIRS, K2), 2 * K2, M, K2)
            fetch_add(p, P_PDONE, 1)
            t = fetch_add(p, P_PNEXT, 1)
        while fetch_add(p, P_PDONE, 0) < npack:
            _pause()
    else:
        npx = (M + NR - 1) // NR
        xp = c_array_at(p[P_X], np.uint32(0), (npx * K2 * NR,))
        w = c_array_at(p[P_W], np.uint32(0), (N * K2,))
        wo = np.empty(MR, np.int64)
    amx_on(use_amx)
    task = fetch_add(p, P_NEXT, 1)
    while task < ntask:
        e = task // per_batch
        bs = (task - e * per_batch) // nbn
        n0 = (task - e * per_batch - bs * nbn) * TR
        nl = min(TR, N - n0)
        if use_amx is not None:
            if kn is not None:   # b's panels, packed above
                bsrc = wkn
                boff = (bof[e] * npan_kn + n0 // AMX_NR) * K2p * AMX_NR
            else:
                bsrc = wb.view(np.uint32)
                boff = 0
                if few is None:
                    for j in range(0, nl, AMX_NR):
                        pack_panel(w32, (bof[e] * N + n0 + j) * K2, min(AMX_NR, nl - j), K2, wb, j * K2p, K2p)
        for m0 in range(bs * XS, min(M, bs * XS + XS), XB):
            ml = min(XB, M - m0)
            if use_amx is not None:
                if few is not None:
                    few_rows(w16, K, n0, nl, wt, wpad, xa.view(np.uint32), m0 * K2p, K2p, ml, acc_t, XB)
                    for i0 in range(0, nl, 8):
                        for r0 in range(0, ml, 8):
                            _transpose_block(acc_t, i0 * XB + r0, XB, accf, r0 * TR + i0, TR)
                else:
                    # K in blocks of AMX_KCH chunks, each over every tile of the block (the C
                    # tiles stored and loaded again between blocks): a B panel's block stays
                    # in L1 for the block's rows of x
                    for kb in range(0, max(nct, 1), AMX_KCH):   # (K = 0: one block of none, zeros)
                        nkb = min(AMX_KCH, nct - kb)   # (not kn: the literal argument)
                        for j in range(0, nl, AMX_NR):
                            for a in range(m0, m0 + ml, AMX_ROWS):
                                amx_tile(nkb, xa, aof[e] * xsize + (a // AMX_ROWS * nct + kb) * AMX_ROWS * AMX_K, AMX_K,
                                         AMX_ROWS * AMX_K, bsrc, boff + j * K2p + kb * (AMX_K // 2) * AMX_NR, accf,
                                         (a - m0) * TR + j, TR, kb)
            else:
                # the broadcast rows' and the panels' matrices: linear's weight and x, or
                # matmul's a and b (kn)
                wm, xm = (aof[e], bof[e]) if kn is not None else (bof[e], aof[e])
                p0 = m0 // NR
                selfp = kn is not None and p[P_SELF] != 0
                if selfp:
                    for pp in range(p0, (m0 + ml + NR - 1) // NR):
                        _pack_kn_panel(b16, xp, (pp - p0) * K2 * NR, xm, pp * NR, min(NR, M - pp * NR), K2, M)
                for g in range(0, nl, GR):
                    gl = min(GR, nl - g)
                    for i in range(MR):
                        wo[i] = (wm * N + n0 + g + min(i, gl - 1)) * K2   # a short group repeats its last row
                    for pp in range(p0, (m0 + ml + NR - 1) // NR):
                        xo = (pp - p0) * K2p * NR if selfp else (xm * npx + pp) * K2p * NR
                        dot_tile(K2, w, wo, xp, xo, acc_t, g * XB + pp * NR - m0, XB, 0)
                if kn is None:
                    for i0 in range(0, nl, 8):
                        for r0 in range(0, ml, 8):
                            _transpose_block(acc_t, i0 * XB + r0, XB, accf, r0 * TR + i0, TR)
            # the block of output rows: accf (XB x TR), or for matmul on vdpbf16ps acc_t itself
            # (TR x XB: its rows are a's, hence the output's)
            if kn is not None and use_amx is None:
                blk, ldb, nrow, ncol, row0, col0, ldo = acc_t, XB, nl, ml, e * N + n0, m0, M
            else:
                blk, ldb, nrow, ncol, row0, col0, ldo = accf, TR, ml, nl, e * M + m0, n0, N
            if p[P_EPI]:  # an activation: bias + activation by the float32 GEMM's epilogue
                call_address(p[P_EPI], (blk.ctypes.data, ldb, nrow, ncol, p[P_BIAS] + col0 * 4))
            # rounded into out in one pass (with the bias when there is no activation): the
            # epilogue called for bias alone, then this pass, took 11% of a 1024^3 product
            for r in range(nrow):
                ob = _U((row0 + r) * ldo + col0)
                ab = _U(r * ldb)
                if out32:
                    if p[P_ADD_BIAS]:
                        for j in range(_U(ncol)):
                            outw[ob + j] = blk[ab + j] + bias[_U(col0) + j]
                    else:
                        for j in range(_U(ncol)):
                            outw[ob + j] = blk[ab + j]
                elif p[P_ADD_BIAS]:
                    for j in range(_U(ncol)):
                        outf[ob + j] = to_bf16(blk[ab + j] + bias[_U(col0) + j])
                else:
                    for j in range(_U(ncol)):
                        outf[ob + j] = to_bf16(blk[ab + j])
        task = fetch_add(p, P_NEXT, 1)
    amx_off(use_amx)


@njit(cache=True, nogil=True)
def split3_into(x, parts):
    """x (float32, flat, n values) as the sum of three bfloat16 values, exactly: parts[i],
    parts[n + i], parts[2n + i] (uint16 bits) = hi, mid, lo with x == hi + mid + lo (each
    truncated to bfloat16 from what the previous ones left: 8 + 8 + 8 significant bits, the
    float32 significand's 24).  A non-finite x is hi alone (mid = lo = 0: an infinity's
    products stay infinite instead of inf - inf).  A part below bfloat16's normal range
    (x under about 2^-110) is read as zero by the tiles: the product loses that part."""
    n = x.size
    xi = x.view(np.uint32)
    for i in range(n):
        b = xi[i]
        hi = b & np.uint32(0xFFFF0000)
        mid = np.uint32(0)
        lo = np.uint32(0)
        if (b & np.uint32(0x7F800000)) != np.uint32(0x7F800000):
            r1 = x[i] - _as_f32(hi)
            mid = _as_u32(r1) & np.uint32(0xFFFF0000)
            lo = _as_u32(r1 - _as_f32(mid)) & np.uint32(0xFFFF0000)
        elif (b & np.uint32(0x007FFFFF)) != np.uint32(0):
            hi = np.uint32(0x7FC00000)   # a NaN whose payload is all in the low bits: not truncated to an infinity
        parts[i] = np.uint16(hi >> np.uint32(16))
        parts[n + i] = np.uint16(mid >> np.uint32(16))
        parts[2 * n + i] = np.uint16(lo >> np.uint32(16))


@njit(cache=True, nogil=True)
def sum3_into(c, out):
    """out[i] = (c[2n + i] + c[n + i]) + c[i] (n = out.size): split3_into's three products
    added smallest first."""
    n = out.size
    for i in range(n):
        out[i] = (c[2 * n + i] + c[n + i]) + c[i]


@intrinsic
def _as_f32(typingctx, u):
    """The float32 whose bits are the low 32 bits of the unsigned integer u."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if u.bitwidth != 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(u), codegen


@intrinsic
def _as_u32(typingctx, f):
    """The bits of the float32 f."""
    if f != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(f), codegen


@njit(cache=True, nogil=True)
def _params(p, xp, w, bias, out, aof, bof, M, N, K, K2p):
    """Fill bf16_worker's argument block p; its address back (addresses are free in numba,
    1.6-1.9 us each through ctypes)."""
    p[P_X], p[P_W], p[P_BIAS], p[P_OUT] = xp.ctypes.data, w.ctypes.data, bias.ctypes.data, out.ctypes.data
    p[P_AOF], p[P_BOF], p[P_BATCH] = aof.ctypes.data, bof.ctypes.data, aof.size
    p[P_M], p[P_N], p[P_K], p[P_K2], p[P_K2P], p[P_NEXT] = M, N, K, (K + 1) // 2, K2p, 0
    return p.ctypes.data


_ZERO_INDEX = np.zeros(1, np.int64)


def panels_shape(m, k, use_amx=False, count=1):
    """The shape of x's packed form (uint32) for x of m rows and k columns (even but on the
    AMX path): pack_x's panels, or on the AMX path pack_group's groups (k padded to whole
    chunks of AMX_K) for `count` x matrices."""
    if use_amx:
        return (count * -(-m // AMX_ROWS), -(-k // AMX_K), AMX_ROWS * AMX_K // 2)
    return (-(-m // NR), k // 2, NR)


def run(x2, w2, bias, code, out2, xp, has_bias=True, use_amx=False):
    """out2 = bf16(act(x2 @ w2.T + bias)): x2 (M, K) and w2 (N, K) uint16 bfloat16 bits, K
    even, bias (N,) float32 (not added when has_bias is False: -0.0 stays -0.0), code an
    ACT_*, out2 (M, N) uint16, all C-contiguous; xp a uint32 buffer of panels_shape(M, K,
    use_amx) (x's panels).  On numba's threads (bf16_worker; AMX tiles when use_amx, which
    needs amx_refusal() None: run_amx)."""
    if use_amx:
        run_amx(x2[None], w2[None], False, bias, code, out2[None], xp, has_bias)
        return
    m, k = x2.shape
    n = w2.shape[0]
    pack_x(x2.view(np.float32), xp.view(np.float32))
    _launch(None, xp, w2, bias, out2, _ZERO_INDEX, _ZERO_INDEX, m, n, k, k // 2, code, has_bias, X_BLOCK, TASK_ROWS,
            False)


def run_kn(a3, b3, bias, code, out3, bp, has_bias=True, a_of=None, b_of=None, b_packer=None, b_ready=False):
    """out3[e] = bf16(act(a3[a_of[e]] @ b3[b_of[e]] + bias)) for each e < out3.shape[0] on
    vdpbf16ps (matmul without AMX): a3 (A, M, K) and b3 (B, K, N) uint16 bfloat16 bits, K
    even, out3 (E, M, N) uint16, C-contiguous; a_of / b_of int64 (E,) (None: all 0); bias
    (N,) float32 (not added when has_bias is False), code an ACT_*; bp a uint32 buffer of
    kn_dot_panels_size(B, K, N) words.  The roles of run's linear swapped: a's rows are the
    broadcast operand, read in place (a word is a pair of K), b's columns the lanes of
    panels of NR (_pack_kn_dot: pairs of b's rows interleaved, by packing tasks that every
    worker takes first), and the register tiles are the output's rows (no transposes).
    b_packer: (address, extra, N, tasks) of a packer that forms the panels of b's N columns
    itself in `tasks` tasks per matrix (as run_amx's; called with its task and the argument
    block, whose P_M is N and P_X the panels), b3 then its source, B = b3.shape[0] matrices
    of any layout the packer reads.  b_ready: bp holds b3's panels already (pack_kn_dot), which
    the call then does not pack."""
    _, m, k = a3.shape
    nb = b3.shape[0]
    n = b_packer[2] if b_packer is not None else b3.shape[2]
    if k % 2:
        raise ValueError(f"a3, b3: K = {k} must be even (vdpbf16ps multiplies pairs of K)")
    if bp.size < kn_dot_panels_size(nb, k, n):
        raise ValueError("bp: the panels of b need kn_dot_panels_size words")
    a_of = _ZERO_INDEX if a_of is None else a_of
    b_of = _ZERO_INDEX if b_of is None else b_of
    self_pack = b_packer is None and 0 < m <= KN_SELF_ROWS and not b_ready
    _launch(None, bp, a3, bias, out3, a_of, b_of, n, m, k, k // 2, code, has_bias, X_BLOCK,
            m if self_pack else TASK_ROWS, True, a3, b3, b_packer=b_packer, self_pack=self_pack, b_ready=b_ready)


def pack_kn_dot(b3, bp):
    """bp = the panels run_kn packs of b3 (B, K, N) uint16 (K even, C-contiguous) on each call
    (its b_ready=True then skips that): bp uint32 of kn_dot_panels_size(B, K, N) words.  Runs
    run_kn's packing tasks alone (a product with no rows of a)."""
    nb, k, n = b3.shape
    run_kn(np.empty((1, 0, k), np.uint16), b3, np.zeros(n, np.float32), ACT_NONE, np.empty((1, 0, n), np.uint16), bp,
           False)


def run_amx(x3, w3, b_kn, bias, code, out3, xp, has_bias=True, a_of=None, b_of=None, bp=None, b_packer=None):
    """out3[e] = bf16(act(x3[a_of[e]] @ W + bias)) for each e < out3.shape[0] on AMX tiles, W
    = w3[b_of[e]].T (linear's (N, K) weights) or, b_kn, w3[b_of[e]] (matmul's (K, N) b's); x3
    (A, M, K), w3 (B, N, K) or (B, K, N), out3 (E, M, N) uint16 bfloat16 bits (or float32:
    the float32 sums, bias and activation applied, not rounded), C-contiguous,
    K even unless b_kn; a_of / b_of int64 (E,) (None: all 0); bias (N,) float32 (not added
    when has_bias is False), code an ACT_*; xp a uint32 buffer of panels_shape(M, K, True,
    A) on a cache line, and with b_kn bp one of kn_panels_size(B, K, N) words (b's panels,
    _pack_kn_pairs).  b_packer: with b_kn, (address, extra, N, tasks) of a packer that forms
    the B panels of b's N columns itself in `tasks` tasks per matrix (P_BPACK, P_BTASKS,
    its int64 arguments extra), w3 then being its source (P_BSRC), B = w3.shape[0]
    matrices of any layout the packer reads.  Needs amx_refusal() None (a tile instruction
    without Linux's permission is SIGILL)."""
    why = amx.permission()   # (the implementation checked the target's features)
    if why is not None:
        raise RuntimeError(f"the AMX path cannot run here: {why}")
    if xp.ctypes.data % ALIGN:
        raise ValueError("xp: the AMX path's x buffer must start on a cache line (kernels_common.memory.aligned_empty)")
    _, m, k = x3.shape
    n = b_packer[2] if b_packer is not None else w3.shape[2] if b_kn else w3.shape[1]
    src = None
    if b_kn:
        if bp is None or bp.ctypes.data % ALIGN or bp.size < kn_panels_size(w3.shape[0], k, n):
            raise ValueError("bp: the panels of a (K, N) b need kn_panels_size words on a cache line")
        src, w3 = w3, bp
    a_of = _ZERO_INDEX if a_of is None else a_of
    b_of = _ZERO_INDEX if b_of is None else b_of
    xs = X_BLOCK * max(1, AMX_X_BYTES // (X_BLOCK * max(k, 1) * 2))
    few = not b_kn and m <= AMX_FEW_MAX and x3.shape[0] == 1 and a_of.size == 1
    _launch(True, xp, w3, bias, out3, a_of, b_of, m, n, k, xp.shape[1] * AMX_K // 2, code, has_bias, xs,
            AMX_TASK_ROWS, b_kn, x3, src, few, b_packer)


def _launch(use_amx, xp, w, bias, out, a_of, b_of, m, n, k, k2p, code, has_bias, xs, task_rows, b_kn, x3=None,
            bsrc=None, few=False, b_packer=None, self_pack=False, b_ready=False):
    extra = () if b_packer is None else b_packer[1]
    p = np.zeros(P_COUNT + len(extra), np.int64)  # alive until the workers are done
    if b_packer is not None:
        p[P_BPACK], p[P_BTASKS] = b_packer[0], b_packer[3]
        p[P_COUNT:] = extra
    addr = _params(p, xp, w, bias, out, a_of, b_of, m, n, k, k2p)
    if x3 is not None:   # the sources the workers pack themselves (the AMX path; run_kn)
        p[P_XSRC], p[P_NA] = x3.ctypes.data, x3.shape[0]
        p[P_BSRC], p[P_NB] = (bsrc.ctypes.data, bsrc.shape[0]) if bsrc is not None else (0, w.shape[0])
        p[P_FEW] = few
    p[P_EPI] = epilogue_address(np.float32, code) if code != ACT_NONE else 0
    p[P_ADD_BIAS] = has_bias and code == ACT_NONE
    p[P_XS], p[P_BKN] = xs, b_kn
    p[P_OUT32] = out.dtype == np.float32
    p[P_SELF], p[P_BREADY] = self_pack, b_ready
    ntask = a_of.size * -(-n // task_rows) * -(-m // xs)
    run_at(worker_address(bf16_worker, (use_amx, only_if(b_kn), only_if(few))), addr, min(num_threads(), ntask))
