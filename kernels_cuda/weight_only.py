"""Weight-only low precision GEMV: out = act(x @ dequant(W).T + bias) for few rows of x
(decode), W (N, K) stored as float16 / bfloat16 bits or int8 with a float32 scale and zero
point per output row; x float32 or float16, float32 accumulation, out in x's dtype.

One warp per output row n (warps grid-stride over N), its lanes striding over the row in
32-bit words: a word holds 2 weights of 16 bits or 4 int8 (the row read coalesced, 128
bytes per warp step), widened in registers:
  bfloat16: the float32 whose upper half is the 16 bits (lo << 16, hi & 0xFFFF0000),
  float16:  cvt.f32.f16 of each half (fpext),
  int8:     each byte sign-extended, minus the row's zero point (exact integers), times the
            row's scale once after the warp sum.
Rows of x are taken R at a time (R in ROWS, a compile-time constant of each build: the
smallest that covers M, at most MM = GEMV_MAX_M; accumulators in registers, no predicated
rows at decode), so each weight word is read from memory once per call for M <= MM.  When
K is not a multiple of the word (odd K for 16-bit weights, K % 4 for int8) the rows are not
word-aligned and the kernel built with words=False reads element by element (uint16 / int8
loads).

The 16-bit to float32 bit casts are intrinsics (a bitcast in LLVM IR); the CUDA simulator
cannot run those, so under it they are Python twins with the same results.
"""
from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import cuda, float32, types
from numba import uint64 as U64

from kernels_common.cuda_tiles import GEMV_MAX_M, GEMV_WARPS
from kernels_common.quant import WEIGHT_BF16, WEIGHT_F16, WEIGHT_INT8

from ._jit import SIM, PtxBuild, arr, device, kernel
from .activation import act_fn
from .primitives import warp_sum

MM = GEMV_MAX_M
NT = 32 * GEMV_WARPS
ROWS = tuple(r for r in (1, 2, 4, 8) if r < MM) + (MM,)


def rows_for(m: int) -> int:
    """R of the build for M rows: the smallest of ROWS >= min(M, MM)."""
    return next(r for r in ROWS if r >= min(max(m, 1), MM))

if not SIM:
    from numba.cuda.extending import intrinsic

    @intrinsic
    def bits_to_float(typingctx, u):
        """The float32 with the low 32 bits of the integer u as its pattern."""
        if not isinstance(u, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            v = builder.trunc(args[0], ir.IntType(32)) if u.bitwidth > 32 else args[0]
            return builder.bitcast(v, ir.FloatType())

        return float32(u), codegen

    @intrinsic
    def half_bits_to_float(typingctx, u):
        """The float32 value of the float16 whose pattern is the low 16 bits of u."""
        if not isinstance(u, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            v = builder.trunc(args[0], ir.IntType(16))
            return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())

        return float32(u), codegen

else:
    @device
    def bits_to_float(u):
        return float(np.uint32(int(u) & 0xFFFFFFFF).view(np.float32))

    @device
    def half_bits_to_float(u):
        return float(np.uint16(int(u) & 0xFFFF).view(np.float16))


@device
def _widen16(bits, fmt):
    """float32 of the 16-bit pattern in the low half of bits (fmt WEIGHT_BF16 or WEIGHT_F16)."""
    if fmt == WEIGHT_BF16:
        return bits_to_float((int(bits) & 0xFFFF) << 16)
    return half_bits_to_float(bits)


@device
def _sbyte(word, i):
    """The i-th byte of word as a signed integer."""
    b = (int(word) >> (8 * i)) & 0xFF  # int: 64-bit arithmetic on the GPU and in the simulator alike
    return b - ((b >> 7) << 8)


@lru_cache(maxsize=None)
def wo_gemv_kernel(fmt, words, rows=MM):
    """The GEMV for weight format fmt (WEIGHT_F16 / WEIGHT_BF16: w uint32 (N, K/2) words of
    two halves when words, else uint16 (N, K); WEIGHT_INT8: w uint32 (N, K/4) words of four
    bytes when words, else int8 (N, K)).  Arguments: x (M, K) float32/float16, w, scale / zp
    (N,) float32 (int8; unused otherwise), bias (N,) of x's dtype, out (M, N), code an
    ACT_*, has_bias; rows: R, the rows of x per pass over the weight (ROWS)."""
    act = act_fn(np.float32)
    zero = np.float32(0.0)
    int8 = fmt == WEIGHT_INT8
    RR = rows

    @kernel(launch_bounds=(NT, 4))
    def wo_gemv(x, w, scale, zp, bias, out, code, has_bias):
        m_total = x.shape[0]
        k_total = x.shape[1]
        n_total = out.shape[1]
        kw = w.shape[1]
        m_last = m_total - 1
        s = cuda.local.array(RR, float32)
        lane = cuda.threadIdx.x & 31
        for n in range(cuda.blockIdx.x * GEMV_WARPS + (cuda.threadIdx.x >> 5), n_total, cuda.gridDim.x * GEMV_WARPS):
            z = int(zp[n]) if int8 else 0
            nu = U64(n)
            for m0 in range(0, m_total, RR):
                for mm in range(RR):
                    s[mm] = zero
                for j in range(lane, kw, 32):
                    # unsigned indices: no negative-index wrap-around in the loop; rows past M
                    # read the last row again (results discarded) instead of branching
                    ju = U64(j)
                    p = w[nu, ju]
                    if words and int8:
                        w0 = float32(_sbyte(p, 0) - z)
                        w1 = float32(_sbyte(p, 1) - z)
                        w2 = float32(_sbyte(p, 2) - z)
                        w3 = float32(_sbyte(p, 3) - z)
                        k = ju * U64(4)
                        for mm in range(RR):
                            r = U64(min(m0 + mm, m_last))
                            a = s[mm]
                            a += float32(x[r, k]) * w0
                            a += float32(x[r, k + U64(1)]) * w1
                            a += float32(x[r, k + U64(2)]) * w2
                            a += float32(x[r, k + U64(3)]) * w3
                            s[mm] = a
                    elif words:
                        w0 = _widen16(p, fmt)
                        w1 = _widen16(p >> 16, fmt)
                        k = ju * U64(2)
                        for mm in range(RR):
                            r = U64(min(m0 + mm, m_last))
                            a = s[mm]
                            a += float32(x[r, k]) * w0
                            a += float32(x[r, k + U64(1)]) * w1
                            s[mm] = a
                    else:
                        w0 = float32(p - z) if int8 else _widen16(p, fmt)
                        for mm in range(RR):
                            r = U64(min(m0 + mm, m_last))
                            s[mm] += float32(x[r, ju]) * w0
                for mm in range(RR):
                    if m0 + mm < m_total:
                        v = warp_sum(s[mm])
                        if lane == 0:
                            if int8:
                                v *= scale[n]
                            if has_bias:
                                v += float32(bias[n])
                            out[m0 + mm, n] = act(v, code)

    return wo_gemv


_FMT_NAMES = {WEIGHT_F16: "f16", WEIGHT_BF16: "bf16", WEIGHT_INT8: "i8"}
# (fmt, words, rows) -> the name launch configurations and the PTX report use
KERNEL_NAMES = {(f, words, r): f"weight_only.gemv_{nm}{'' if words else '_odd'}_r{r}"
                for f, nm in _FMT_NAMES.items() for words in (True, False) for r in ROWS}


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _args(fmt, words):
    def argtypes(dt):
        wt = types.uint32 if words else (types.int8 if fmt == WEIGHT_INT8 else types.uint16)
        f32 = types.float32
        return (arr(dt, 2), arr(wt, 2), arr(f32, 1), arr(f32, 1), arr(dt, 1), arr(dt, 2), types.int64, types.boolean)
    return argtypes


PTX = [PtxBuild(name, "linalg", (lambda f, wd, r: lambda dt: wo_gemv_kernel(f, wd, r))(fmt, words, rows),
                _args(fmt, words), threads=NT, dtypes=("float32", "float16"))
       for (fmt, words, rows), name in KERNEL_NAMES.items()]
