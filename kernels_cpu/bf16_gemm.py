"""bfloat16 x bfloat16 GEMM with float32 accumulation on AVX-512 BF16 (`vdpbf16ps`):
linear with bfloat16 activations and a bfloat16 weight, as PyTorch's bfloat16 linear.

    out[m, n] = bf16(act(sum_k x[m, k] * w[n, k] + bias[n]))

x (M, K) and w (N, K) hold bfloat16 bit patterns (uint16), K even; the sum is float32:
`vdpbf16ps` multiplies pairs of bfloat16 (exact in float32: 8-bit significands) and adds
them to a float32 lane (round to nearest even, bfloat16 and float32 subnormals read and
written as zero: the instruction ignores MXCSR).  Bias (float32) and the activation are
applied to the float32 sum, which is then rounded once to bfloat16 (to nearest even, NaN
kept a NaN).

Layout (the roles swapped against the float32 GEMM, so that the large operand is never
packed): the weight is the broadcast operand, read in place: a 32-bit word of w's row n
is a pair (k, k+1) of its values, which `vdpbf16ps` takes with a {1to16} broadcast.  x is
packed once per call into panels of NR rows: xp[panel][k/2][NR] 32-bit words, the word of
x row m and pair k/2 at lane m of the panel (pack_x; M x K x 2 bytes, small beside the
weight).  The register tile is MR weight rows x NR x rows: MR * NR/16 = 24 zmm
accumulators, NR/16 = 4 x vectors and one broadcast word (29 of 32).  Per K pair: 4 zmm
loads, 6 broadcast words, 24 `vdpbf16ps` (64 flops each).

Work: tasks of TASK_ROWS weight rows x X_BLOCK rows of x, taken from a counter (the x
block outer, so both threads stream the weight past the same block of x); a task runs
its MR-row weight groups over the block's panels (each weight group read from memory
once, from L1 for the further panels), storing the tiles weight row by weight row, then
turns them into a float32 block of output rows (X_BLOCK x TASK_ROWS) by 8 x 8 register
transposes, applies an activation (with the bias) by the float32 GEMM's epilogue (called
by address), and rounds the block into out (adding the bias there when there is no
activation).  No K blocking: a tile's K loop streams one x panel (NR x K x 2 bytes: 512
KiB at K = 4096) from L2 / L3 against MR weight rows.

Tile shape, 1 thread, 128 x 4096 x 1104 (Zen 4 VM, 2026-12-06, /tmp/w/bf/proto.py): 6 x 64
219-223 GFLOP/s, 8 x 48 197-203, 12 x 32 188-199 (the float32 FMA's ceiling here is about
111 per core: vdpbf16ps does twice the work per instruction).
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import target
from .half import to_bf16
from .approx import ACT_NONE, JIT_BY_ADDRESS
from .gemm import _U, _pack_strided, _transpose_block, epilogue_address
from .llvm_ir import arg_readers
from .parallel import c_array_at, call_address, fetch_add, num_threads, run_at, worker_address

MR, NR, LANES = 6, 64, 16
# Tasks: 48 weight rows (8 MR groups) x 128 rows of x (2 panels).  Linear through dispatch,
# 2 threads, loops of 20 calls, ms at 128x768x768 / 1024^3 (Zen 4, 2026-12-06): 48 x 128
# 0.415 / 5.72, 48 x 64 0.462 / 6.39, 96 x 128 0.475 / 5.94, 24 x 128 0.79 / 6.34, 48 x 256
# 0.430 / 5.89 (PyTorch's bfloat16 linear beside them 0.38-0.40 / 5.0-5.2).
TASK_ROWS = 48
X_BLOCK = 128


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


@intrinsic
def dot_tile(typingctx, kq, w, wo, xp, xoff, t, toff, ldt):
    """t[toff + i*ldt + j] = sum over q < kq of the bfloat16 pair dot product of the 32-bit
    words w[wo[i] + q] (weight row i: MR rows at the offsets wo, uint32 words) and
    xp[xoff + q*NR + j] (one packed x panel), in float32 (vdpbf16ps), for i < MR, j < NR."""
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
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(nv)] for _ in range(MR)]
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
        td = builder.gep(data(5), [i64_of(6)])
        ldt = i64_of(7)
        for i in range(MR):
            for v in range(nv):
                ptr = builder.gep(td, [builder.add(builder.mul(ldt, ir.Constant(i64, i)), ir.Constant(i64, v * LANES))])
                builder.store(builder.load(accs[i][v]), builder.bitcast(ptr, vf.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(kq, w, wo, xp, xoff, t, toff, ldt), codegen


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


# The int64 argument block of bf16_worker.
(P_X, P_W, P_BIAS, P_OUT, P_M, P_N, P_K2, P_NEXT, P_EPI, P_ADD_BIAS, P_COUNT) = range(11)


@njit(**JIT_BY_ADDRESS)
def bf16_worker(wk, params):
    """A worker (parallel.run_workers) of run: tasks (X_BLOCK rows of x, TASK_ROWS weight
    rows) from the P_NEXT counter, the x block outer."""
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    M, N, K2 = p[P_M], p[P_N], p[P_K2]
    npan = (M + NR - 1) // NR
    xp = c_array_at(p[P_X], np.uint32(0), (npan * K2 * NR,))
    w = c_array_at(p[P_W], np.uint32(0), (N * K2,))
    outf = c_array_at(p[P_OUT], np.uint16(0), (M * N,))
    bias = c_array_at(p[P_BIAS], np.float32(0), (N,))
    nbn = (N + TASK_ROWS - 1) // TASK_ROWS
    ntask = nbn * ((M + X_BLOCK - 1) // X_BLOCK)
    # the tiles land weight row by weight row (accT: TASK_ROWS x X_BLOCK, vector stores),
    # then 8 x 8 register transposes make the output's rows (acc: X_BLOCK x TASK_ROWS)
    acc_t = np.empty(TASK_ROWS * X_BLOCK, np.float32)
    acc = np.empty((X_BLOCK, TASK_ROWS), np.float32)
    accf = acc.reshape(-1)
    wo = np.empty(MR, np.int64)
    task = fetch_add(p, P_NEXT, 1)
    while task < ntask:
        bm = task // nbn
        m0 = bm * X_BLOCK
        n0 = (task - bm * nbn) * TASK_ROWS
        ml = min(X_BLOCK, M - m0)
        nl = min(TASK_ROWS, N - n0)
        for g in range(0, nl, MR):
            gl = min(MR, nl - g)
            for i in range(MR):
                wo[i] = (n0 + g + min(i, gl - 1)) * K2   # a short group repeats its last row
            for pp in range(m0 // NR, (m0 + ml + NR - 1) // NR):
                dot_tile(K2, w, wo, xp, pp * K2 * NR, acc_t, g * X_BLOCK + pp * NR - m0, X_BLOCK)
        for i0 in range(0, nl, 8):
            for r0 in range(0, ml, 8):
                _transpose_block(acc_t, i0 * X_BLOCK + r0, X_BLOCK, accf, r0 * TASK_ROWS + i0, TASK_ROWS)
        if p[P_EPI]:  # an activation: bias + activation by the float32 GEMM's epilogue
            call_address(p[P_EPI], (acc.ctypes.data, TASK_ROWS, ml, nl, p[P_BIAS] + n0 * 4))
        # rounded into out in one pass (with the bias when there is no activation): the
        # epilogue called for bias alone, then this pass, took 11% of a 1024^3 product
        for r in range(ml):
            ob = _U((m0 + r) * N + n0)
            ab = _U(r * TASK_ROWS)
            if p[P_ADD_BIAS]:
                for j in range(_U(nl)):
                    outf[ob + j] = to_bf16(accf[ab + j] + bias[_U(n0) + j])
            else:
                for j in range(_U(nl)):
                    outf[ob + j] = to_bf16(accf[ab + j])
        task = fetch_add(p, P_NEXT, 1)


@njit(cache=True, nogil=True)
def _params(p, xp, w2, bias, out2, M, N, K2):
    """Fill bf16_worker's argument block p; its address back (addresses are free in numba,
    1.6-1.9 us each through ctypes)."""
    p[P_X], p[P_W], p[P_BIAS], p[P_OUT] = xp.ctypes.data, w2.ctypes.data, bias.ctypes.data, out2.ctypes.data
    p[P_M], p[P_N], p[P_K2], p[P_NEXT] = M, N, K2, 0
    return p.ctypes.data


def panels_shape(m, k):
    """The shape of pack_x's panels for x of m rows and k (even) columns."""
    return (-(-m // NR), k // 2, NR)


def run(x2, w2, bias, code, out2, xp, has_bias=True):
    """out2 = bf16(act(x2 @ w2.T + bias)): x2 (M, K) and w2 (N, K) uint16 bfloat16 bits, K
    even, bias (N,) float32 (not added when has_bias is False: -0.0 stays -0.0), code an
    ACT_*, out2 (M, N) uint16, all C-contiguous; xp a uint32 buffer of panels_shape(M, K)
    (x's panels).  On numba's threads (bf16_worker)."""
    m, k = x2.shape
    n = w2.shape[0]
    pack_x(x2.view(np.float32), xp.view(np.float32))
    p = np.empty(P_COUNT, np.int64)  # alive until the workers are done
    addr = _params(p, xp, w2, bias, out2, m, n, k // 2)
    p[P_EPI] = epilogue_address(np.float32, code) if code != ACT_NONE else 0
    p[P_ADD_BIAS] = has_bias and code == ACT_NONE
    ntask = -(-n // TASK_ROWS) * -(-m // X_BLOCK)
    run_at(worker_address(bf16_worker, ()), addr, min(num_threads(), ntask))
