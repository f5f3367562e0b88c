"""LayerNorm and RMSNorm over the last dim of C-contiguous 2-D arrays (rows x D).

One pass over memory per row: the row (and, with a residual, h = x + residual, written
once to h) is read from DRAM once; the statistics and the normalized output are then
computed from the copy in L1/L2 (a 768-float row is 3 KiB), and the output written once.
LayerNorm's variance is the two-pass form sum((x - mean)^2) on the cached row (no
cancellation, unlike E[x^2] - mean^2).  Accumulation is in the input's dtype with fastmath
reassociation (vectorized partial sums); for float32 rows of 768..32000 that is ~1e-7
relative, far inside the 1e-5 tolerance.

weight / bias are always arrays here (dispatch passes ones / zeros for None).  Without a
residual, pass has_res=False and any arrays of x's shape for r and h (they are not touched).
"""
import math

import numpy as np
from numba import njit, prange

from .approx import JIT
from .softmax import like


@njit(**JIT)
def layer_norm_row(xr, rr, hr, w, b, eps, orow, has_res):
    d = xr.shape[0]
    inv_d = like(eps, 1.0 / d)
    s = like(eps, 0.0)
    if has_res:
        for j in range(d):
            v = xr[j] + rr[j]
            hr[j] = v
            s += v
        src = hr
    else:
        for j in range(d):
            s += xr[j]
        src = xr
    mean = s * inv_d
    q = like(eps, 0.0)
    for j in range(d):
        c = src[j] - mean
        q += c * c
    rstd = like(eps, 1.0) / math.sqrt(q * inv_d + eps)
    for j in range(d):
        orow[j] = (src[j] - mean) * rstd * w[j] + b[j]


@njit(**JIT)
def rms_norm_row(xr, rr, hr, w, eps, orow, has_res):
    d = xr.shape[0]
    inv_d = like(eps, 1.0 / d)
    q = like(eps, 0.0)
    if has_res:
        for j in range(d):
            v = xr[j] + rr[j]
            hr[j] = v
            q += v * v
        src = hr
    else:
        for j in range(d):
            v = xr[j]
            q += v * v
        src = xr
    rstd = like(eps, 1.0) / math.sqrt(q * inv_d + eps)
    for j in range(d):
        orow[j] = src[j] * rstd * w[j]


@njit(**JIT)
def layer_norm_serial(x, r, h, w, b, eps, out, has_res):
    for i in range(x.shape[0]):
        layer_norm_row(x[i], r[i], h[i], w, b, eps, out[i], has_res)


@njit(parallel=True, **JIT)
def layer_norm_parallel(x, r, h, w, b, eps, out, has_res):
    for i in prange(x.shape[0]):
        layer_norm_row(x[i], r[i], h[i], w, b, eps, out[i], has_res)


@njit(**JIT)
def rms_norm_serial(x, r, h, w, eps, out, has_res):
    for i in range(x.shape[0]):
        rms_norm_row(x[i], r[i], h[i], w, eps, out[i], has_res)


@njit(parallel=True, **JIT)
def rms_norm_parallel(x, r, h, w, eps, out, has_res):
    for i in prange(x.shape[0]):
        rms_norm_row(x[i], r[i], h[i], w, eps, out[i], has_res)
