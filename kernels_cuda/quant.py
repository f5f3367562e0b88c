"""Linear quantization (ONNX QuantizeLinear / DequantizeLinear) on the GPU.

Arrays are seen as (O, C, I) (C the quantization channels, 1 per tensor; see
kernels_cpu/quant.py).  float16 and float32 inputs compute in float32, float64 in float64.

quant.range_kernel: block (c, g) reduces channel c's elements k = g*blockDim + tid, stepping
    by G*blockDim over the O*I elements of the channel (element (k // I, c, k % I)), to
    max|x|, min(0, min x), max(0, max x) and a NaN / inf flag; block reductions by warp
    shuffles (primitives.block_max); partials (G, C) combined on the host (G > 1 only for
    few channels: one scale per tensor spreads over many blocks).
quant.quantize_kernel: grid-stride elementwise q = saturate(rint(x / scale[c]) + zp[c]),
    c = (j // I) % C.  The quotient is first clamped to [qmin - zp - 1, qmax - zp + 1]
    (integers: rint is monotone, so the saturated result is unchanged; NaN fails the
    compare and goes to the low end, the type's lowest value), then round() is llvm.rint
    (cvt.rni: round half to even) and the integer add.
quant.dequantize_kernel: grid-stride y = (q - zp[c]) * scale[c] (one rounding; float16
    results round the float32 product, which is the exact product rounded once, 24 >= 2*11+2).
"""
from functools import lru_cache

import numpy as np
from numba import cuda, types

from ._jit import ELEMENTWISE_THREADS, PtxBuild, acc_np, acc_of, arr, device, kernel
from .primitives import block_max

RANGE_THREADS = ELEMENTWISE_THREADS


@lru_cache(maxsize=None)
def range_kernel(acc_np):
    """kernel(x3, amax, lo, hi, bad): x3 (O, C, I); the four outputs (G, C) in acc_np."""
    acc, _ = acc_of(acc_np)
    zero, one, inf = acc_np(0.0), acc_np(1.0), acc_np(np.inf)

    @kernel(launch_bounds=(RANGE_THREADS, 4))
    def quant_range(x, amax, lo, hi, bad):
        scratch = cuda.shared.array(32, acc)
        nout, ncha, ninn = x.shape
        c = cuda.blockIdx.x
        g = cuda.blockIdx.y
        n = nout * ninn
        step = cuda.gridDim.y * cuda.blockDim.x
        m = zero
        mn = zero  # min(0, min x): start from 0
        mx = zero
        b = zero
        for k in range(g * cuda.blockDim.x + cuda.threadIdx.x, n, step):
            # the common layouts index without a division (uniform branches)
            if nout == 1:
                v = acc(x[0, c, k])
            elif ninn == 1:
                v = acc(x[k, c, 0])
            else:
                o = k // ninn
                v = acc(x[o, c, k - o * ninn])
            a = abs(v)
            if not (a < inf):  # NaN or inf
                b = one
            else:
                m = max(m, a)
                mn = min(mn, v)
                mx = max(mx, v)
        m = block_max(m, scratch, zero)
        mn = -block_max(-mn, scratch, zero)
        mx = block_max(mx, scratch, zero)
        b = block_max(b, scratch, zero)
        if cuda.threadIdx.x == 0:
            amax[g, c] = m
            lo[g, c] = mn
            hi[g, c] = mx
            bad[g, c] = b

    return quant_range


@device
def _channel(j, nchan, inner, n):
    """The channel of flat element j: none to compute per tensor, one division when the
    channels are the outermost axis (n == nchan * inner) or the innermost (inner == 1), two
    otherwise; in 32 bits while the array has fewer than 2^31 elements (a 64-bit division is
    a long instruction sequence on the GPU)."""
    if nchan == 1:
        return np.int64(0)
    if n < 2147483648:
        j32 = np.uint32(j)
        if inner == 1:
            return np.int64(j32 % np.uint32(nchan))
        if n == nchan * inner:
            return np.int64(j32 // np.uint32(inner))
        return np.int64((j32 // np.uint32(inner)) % np.uint32(nchan))
    return np.int64((j // inner) % nchan)


@lru_cache(maxsize=None)
def quantize_kernel(acc_np):
    """kernel(x, scale, zp, qlo, qhi, q, nchan, inner): flat x and q (n,), scale (C,) in
    acc_np, zp (C,) int32, qlo / qhi int32 limits."""
    acc, _ = acc_of(acc_np)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def quant_quantize(x, scale, zp, qlo, qhi, q, nchan, inner):
        n = x.shape[0]
        for j in range(cuda.grid(1), n, cuda.gridsize(1)):
            c = _channel(j, nchan, inner, n)
            z = zp[c]
            t = acc(x[j]) / scale[c]
            lo_f = acc(qlo - z - 1)
            hi_f = acc(qhi - z + 1)
            if not (t >= lo_f):
                t = lo_f
            if t > hi_f:
                t = hi_f
            r = round(t) + z
            r = max(qlo, min(qhi, r))
            q[j] = r

    return quant_quantize


@lru_cache(maxsize=None)
def dequantize_kernel(acc_np):
    """kernel(q, scale, zp, y, nchan, inner): flat q and y (n,), scale and zp (C,) in acc_np."""
    acc, _ = acc_of(acc_np)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def quant_dequantize(q, scale, zp, y, nchan, inner):
        n = q.shape[0]
        for j in range(cuda.grid(1), n, cuda.gridsize(1)):
            c = _channel(j, nchan, inner, n)
            y[j] = (acc(q[j]) - zp[c]) * scale[c]

    return quant_dequantize


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _acc(dt):
    return types.float64 if dt == types.float64 else types.float32


PTX = [
    PtxBuild("quant.range", "quant", lambda dt: range_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 3), arr(_acc(dt), 2), arr(_acc(dt), 2), arr(_acc(dt), 2), arr(_acc(dt), 2)),
             threads=RANGE_THREADS),
    PtxBuild("quant.quantize", "quant", lambda dt: quantize_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 1), arr(_acc(dt), 1), arr(types.int32, 1), types.int32, types.int32,
                         arr(types.int8, 1), types.int64, types.int64),
             threads=ELEMENTWISE_THREADS),
    PtxBuild("quant.dequantize", "quant", lambda dt: dequantize_kernel(acc_np(dt)),
             lambda dt: (arr(types.int8, 1), arr(_acc(dt), 1), arr(_acc(dt), 1), arr(dt, 1), types.int64,
                         types.int64),
             threads=ELEMENTWISE_THREADS),
]
