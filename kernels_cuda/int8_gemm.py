"""int8 GEMM on the GPU with dp4a: int32 accumulation, the dequantize + bias + activation
epilogue fused (the CPU kernels' arithmetic, kernels_cpu/int8_gemm.py).

Operands, as the dispatcher prepares them (dispatch/cuda_impls/int8_linalg.py):
  a4 (M, KW) int32: each word 4 consecutive K values of a row as unsigned bytes, au = a +
      shift (128 for int8 a, 0 for uint8 and for the per-row quantized x), K zero padded;
  b4 (KW, N) int32: each word the 4 consecutive K values of one column as signed bytes
      (packed once per QuantizedArray on the host, then kept on the device);
  per row: sa (scale), c (shift + zero point), rs = sum_k (a - za) (float64, exact);
  per column: sb, colsum = sum_k b, zb (float64).
  out[m, n] = act(f32(sa * sb * (acc - c * colsum - zb * rs) + bias)),  acc = sum au * b.

dp4a: `dp4a.u32.s32 d, a, b, c` (PTX ISA: d = c + sum of the 4 products of a's unsigned
bytes with b's signed bytes, 32-bit wrap-around; exact here for K <= 65793, as on the CPU),
emitted through an llvmlite InlineAsm intrinsic (ptxas: IDP.4A.U8.S8).  The simulator runs
no inline assembly: there `dp4a` is a Python twin of the same semantics (tested against
the PTX definition in tests/test_int8_linalg.py).

Kernels:
  int8_gemm.pack_rows       one thread per row: int8/uint8 a -> a4 words (+ shift), rs, c;
  int8_gemm.quant_rows      one thread per row: float32 x -> per-row uint8 (ONNX
                            DynamicQuantizeLinear's formulas, as the CPU) -> a4, sa, c, rs;
  int8_gemm.dp4a_tile       a 16 x 16 block computes a 64 x 64 tile: each thread 4 x 4
                            outputs; per step 8 words (32 K values) of A (64 x 8) and B (8 x
                            64) staged in shared memory, then 8 x 16 dp4a per thread;
  int8_gemm.dp4a_gemv       few rows (M <= GEMV_MAX_ROWS, decode): a thread per column
                            streams its B column once (coalesced across the warp: b4 is
                            column-contiguous by word) against every row's A words
                            (broadcast reads), up to GEMV_MAX_ROWS accumulators.
Not measured on a GPU (none lent in this session); checked under the simulator and by
ptxas (bench.ptx).
"""
from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import cuda, float32, float64, int32, types

from kernels_common.activation import ACT_NONE  # noqa: F401

from ._jit import SIM, PtxBuild, arr, device, kernel
from .activation import act_fn

TM = TN = 4            # outputs per thread (rows, columns)
TY = TX = 16           # threads per block (rows, columns)
BM, BN = TM * TY, TN * TX   # 64 x 64 block tile
BKW = 8                # K words (32 K values) staged per step
TILE_THREADS = TY * TX
GEMV_THREADS = 128
GEMV_MAX_ROWS = 8
ROW_THREADS = 128      # pack_rows / quant_rows: threads per block, one row each

if not SIM:
    from numba.cuda.extending import intrinsic

    @intrinsic
    def dp4a(typingctx, a, b, c):
        """c + sum_i u8(a.byte i) * s8(b.byte i), 32-bit wrap-around (PTX dp4a.u32.s32)."""
        if not all(isinstance(t, types.Integer) for t in (a, b, c)):
            return None
        sig = types.int32(a, b, c)

        def codegen(context, builder, sig, args):
            i = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.int32) for v, t in zip(args, sig.args)]
            asm = ir.InlineAsm(ir.FunctionType(i, [i, i, i]), "dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.call(asm, vals)

        return sig, codegen

else:
    @device
    def dp4a(a, b, c):
        """Simulator twin of PTX dp4a.u32.s32 (see dp4a_reference)."""
        return dp4a_reference(a, b, c)


def dp4a_reference(a, b, c):
    """PTX dp4a.u32.s32 on Python integers: c + sum over bytes i of zero-extended a.byte i
    times sign-extended b.byte i, wrapped to a signed 32-bit integer."""
    a, b = int(a) & 0xFFFFFFFF, int(b) & 0xFFFFFFFF
    s = int(c)
    for i in range(4):
        ua = (a >> (8 * i)) & 0xFF
        sb = (b >> (8 * i)) & 0xFF
        s += ua * (sb - 256 if sb >= 128 else sb)
    s &= 0xFFFFFFFF
    return np.int32(s - (1 << 32) if s >= (1 << 31) else s)


_RINT_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23


@device
def _rint(v):
    """float32 v rounded to an integer, ties to even, for |v| < 2^22 (the CPU kernels' trick:
    the same operations in the simulator's numpy float32 and on the GPU)."""
    return (v + _RINT_MAGIC) - _RINT_MAGIC


@lru_cache(maxsize=None)
def kernels():
    """(pack_rows, quant_rows, dp4a_tile, dp4a_gemv) compiled on first use."""
    act = act_fn(np.float32)

    @device
    def _epilogue(acc, sa, c, rs, sb, colsum, zb, bias, code):
        x = float64(acc) - c * colsum - zb * rs
        return act(float32(sa * sb * x + float64(bias)), code)

    @kernel(launch_bounds=(ROW_THREADS, 4))
    def int8_pack_rows(a, shift, za, a4, c, rs):
        """a (M, K) int8/uint8 -> a4 (M, KW) words of a + shift; c = shift + za; rs."""
        m = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        rows, k = a.shape
        if m >= rows:
            return
        kw = a4.shape[1]
        s = 0
        for w in range(kw):
            word = 0
            for j in range(4):
                kk = 4 * w + j
                if kk < k:
                    v = int32(a[m, kk]) + shift
                    s += v
                    word |= (v & 0xFF) << (8 * j)
            a4[m, w] = int32(word - (1 << 32) if word >= (1 << 31) else word)
        cc = float64(shift) + za[m]
        c[m] = cc
        rs[m] = float64(s) - k * cc

    @kernel(launch_bounds=(ROW_THREADS, 4))
    def int8_quant_rows(x, a4, sa, c, rs):
        """x (M, K) float32 -> per-row uint8 (ONNX DynamicQuantizeLinear's formulas, float32,
        ties to even; zeros: scale 1, zp 0; a non-finite row: scale NaN) -> a4, sa, c, rs."""
        m = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        rows, k = x.shape
        if m >= rows:
            return
        lo = float32(0.0)
        hi = float32(0.0)
        finite = True
        for kk in range(k):
            v = x[m, kk]
            if v != v or abs(v) == float32(np.inf):
                finite = False
            lo = min(lo, v)
            hi = max(hi, v)
        if not finite:
            sa[m] = np.nan
            c[m] = 0.0
            rs[m] = 0.0
            return
        scale = (hi - lo) / float32(255.0)
        if not (scale > float32(0.0)) or scale == float32(np.inf):
            scale = float32(1.0)
        zp = min(max(_rint(float32(0.0) - lo / scale), float32(0.0)), float32(255.0))
        kw = a4.shape[1]
        s = 0
        for w in range(kw):
            word = 0
            for j in range(4):
                kk = 4 * w + j
                if kk < k:
                    q = min(max(_rint(x[m, kk] / scale) + zp, float32(0.0)), float32(255.0))
                    qi = int32(q)
                    s += qi
                    word |= qi << (8 * j)
            a4[m, w] = int32(word - (1 << 32) if word >= (1 << 31) else word)
        sa[m] = float64(scale)
        c[m] = float64(zp)
        rs[m] = float64(s) - k * float64(zp)

    @kernel(launch_bounds=(TILE_THREADS, 2))
    def int8_dp4a_tile(a4, b4, sa, c, rs, sb, colsum, zb, bias, code, out):
        ty = cuda.threadIdx.y
        tx = cuda.threadIdx.x
        tid = ty * TX + tx
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        rows, kw = a4.shape
        n = b4.shape[1]
        As = cuda.shared.array((BM, BKW), np.int32)
        Bs = cuda.shared.array((BKW, BN), np.int32)
        acc = cuda.local.array((TM, TN), np.int32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0
        for k0 in range(0, kw, BKW):
            # stage: 512 A words and 512 B words, 2 each per thread (zeros past the edges)
            for r in range(2):
                e = tid + r * TILE_THREADS
                ar, ac = e // BKW, e % BKW
                gm, gk = m0 + ar, k0 + ac
                As[ar, ac] = a4[gm, gk] if gm < rows and gk < kw else 0
                br, bc = e // BN, e % BN
                gk2, gn = k0 + br, n0 + bc
                Bs[br, bc] = b4[gk2, gn] if gk2 < kw and gn < n else 0
            cuda.syncthreads()
            for kk in range(BKW):
                for i in range(TM):
                    av = As[ty * TM + i, kk]
                    for j in range(TN):
                        acc[i, j] = dp4a(av, Bs[kk, tx + TX * j], acc[i, j])
            cuda.syncthreads()
        for i in range(TM):
            m = m0 + ty * TM + i
            if m < rows:
                for j in range(TN):
                    col = n0 + tx + TX * j  # columns strided by TX: the stores coalesce over tx
                    if col < n:
                        out[m, col] = _epilogue(acc[i, j], sa[m], c[m], rs[m], sb[col], colsum[col], zb[col],
                                                bias[col], code)

    @kernel(launch_bounds=(GEMV_THREADS, 8))
    def int8_dp4a_gemv(a4, b4, sa, c, rs, sb, colsum, zb, bias, code, out):
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        rows, kw = a4.shape
        n = b4.shape[1]
        if col >= n:
            return
        acc = cuda.local.array(GEMV_MAX_ROWS, np.int32)
        for i in range(GEMV_MAX_ROWS):
            acc[i] = 0
        for w in range(kw):
            bw = b4[w, col]
            for i in range(GEMV_MAX_ROWS):
                if i < rows:
                    acc[i] = dp4a(a4[i, w], bw, acc[i])
        for i in range(GEMV_MAX_ROWS):
            if i < rows:
                out[i, col] = _epilogue(acc[i], sa[i], c[i], rs[i], sb[col], colsum[col], zb[col], bias[col],
                                        code)

    return int8_pack_rows, int8_quant_rows, int8_dp4a_tile, int8_dp4a_gemv


@lru_cache(maxsize=None)
def dp4a_probe():
    """kernel(a, b, c, d): d[i] = dp4a(a[i], b[i], c[i]) (int32 arrays): the tests run dp4a
    through it on the device (the simulator's twin, or the GPU's instruction)."""
    @kernel
    def int8_dp4a_probe(a, b, c, d):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < a.size:
            d[i] = dp4a(a[i], b[i], c[i])

    return int8_dp4a_probe


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
# The kernels take no float input of the call's dtype: every dtype builds the same signature.
_I32_2, _F64_1, _F32_1 = arr(types.int32, 2), arr(types.float64, 1), arr(types.float32, 1)
_GEMM_ARGS = (_I32_2, _I32_2, _F64_1, _F64_1, _F64_1, _F64_1, _F64_1, _F64_1, _F32_1, types.int64,
              arr(types.float32, 2))
PTX = [
    PtxBuild("int8_gemm.dp4a_tile", "int8_linalg", lambda dt: kernels()[2], lambda dt: _GEMM_ARGS,
             threads=TILE_THREADS, requires=("dp4a.u32.s32",)),
    PtxBuild("int8_gemm.dp4a_gemv", "int8_linalg", lambda dt: kernels()[3], lambda dt: _GEMM_ARGS,
             threads=GEMV_THREADS, requires=("dp4a.u32.s32",)),
    PtxBuild("int8_gemm.pack_rows", "int8_linalg", lambda dt: kernels()[0],
             lambda dt: (arr(types.int8, 2), types.int64, _F64_1, _I32_2, _F64_1, _F64_1), threads=ROW_THREADS),
    PtxBuild("int8_gemm.quant_rows", "int8_linalg", lambda dt: kernels()[1],
             lambda dt: (arr(types.float32, 2), _I32_2, _F64_1, _F64_1, _F64_1), threads=ROW_THREADS),
]
