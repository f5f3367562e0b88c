"""LayerNorm and RMSNorm over the last dim of C-contiguous 2-D arrays (rows x D).

One pass over memory per row: the row (and, with a residual, h = x + residual, written
once to h) is read from DRAM once; the statistics and the normalized output are then
computed from the copy in L1/L2 (a 768-float row is 3 KiB), and the output written once.
LayerNorm's statistics use the corrected two-pass algorithm on the cached row, with the
mean's sum shifted by the row's first element (see layer_norm_rows): a constant row gives
exactly 0 (the output is the bias), and rows with a large common offset keep full
precision (no cancellation, unlike E[x^2] - mean^2, and no rounding of the mean to the
dtype).  Accumulation is in the input's dtype with fastmath reassociation (vectorized
partial sums); for float32 rows of 768..32000 that is ~1e-7 relative, far inside the 1e-5
tolerance.  rms_norm has no cancellation to guard against (a sum of squares).

Each kernel runs a range of rows in one function, with the residual branch outside the
row loop: a per-row helper call cost ~30% at D = 768 (0.22 vs 0.16 ns/element in cache).
The parallel kernels let their threads claim ranges of rows (see parallel.claim).
weight / bias are always arrays here (dispatch passes ones / zeros for None).  Without a
residual, pass has_res=False and any arrays of x's shape for r and h (they are not touched).

16-bit rows (norm_half_*; bfloat16 or float16, x, r, h, out their bit patterns: uint16 /
int16, see half.py; weight and bias float32) take the float32 kernels' arithmetic on each
row widened into a float32 scratch row, and round the output to x's format (nearest even):
h = round(x + r) first (stored), then the norm of that rounded h, as PyTorch's bfloat16 /
float16 ops compute `layer_norm(x + r)` (float32 inside each op, 16 bits between them).
Memory sees 2 bytes an element each way.
"""
import math

import numpy as np
from numba import njit

from .approx import JIT, JIT_BY_ADDRESS, JIT_INNER, like, wide_loops
from .half import round_to, widen
from .parallel import (RW_D, RW_I, RW_N, c_array_at, launch, like_dtype, only_if, row_args, row_block, row_claim,
                       row_of, row_run, worker_address, zero_of)


@njit(inline="always")
def centered_stats(src, x0, s, dst, eps):
    """Passes 2 and 3 of the corrected two-pass statistics (see layer_norm_rows) of the row
    src, given s = sum(src - x0) (x0 = src[0]): writes d = src - m0 into dst (m0 = x0 +
    s / D) and returns (mc, rstd): the mean's remainder sum(d) / D and 1 / sqrt(var + eps).
    The output is then (d - mc) * rstd.  Shared with group_norm (channel_norm.py)."""
    d = src.shape[0]
    inv_d = like(eps, 1.0 / d)
    zero = like(eps, 0.0)
    m0 = x0 + s * inv_d
    sd = zero
    q = zero
    for j in range(d):
        c = src[j] - m0
        dst[j] = c
        sd += c
        q += c * c
    return _remainder_and_rstd(sd, q, inv_d, eps)


@njit(inline="always")
def centered_moments(src, x0, s, eps):
    """centered_stats without writing d: (m0, mc, rstd), the output being ((src - m0) - mc)
    * rstd with src - m0 rounded first (group_norm: channel_norm.centered_act)."""
    d = src.shape[0]
    inv_d = like(eps, 1.0 / d)
    zero = like(eps, 0.0)
    m0 = x0 + s * inv_d
    sd = zero
    q = zero
    for j in range(d):
        c = src[j] - m0
        sd += c
        q += c * c
    mc, rstd = _remainder_and_rstd(sd, q, inv_d, eps)
    return m0, mc, rstd


@njit(inline="always")
def _remainder_and_rstd(sd, q, inv_d, eps):
    """(mc, rstd) from sd = sum(d), q = sum(d^2) over a row of D = 1 / inv_d values."""
    mc = sd * inv_d
    var = max(q * inv_d - mc * mc, like(eps, 0.0))
    return mc, like(eps, 1.0) / math.sqrt(var + eps)


# layer_norm_rows / rms_norm_rows keep LLVM's 8-lane loops on AVX-512: 16 lanes
# (approx.wide_loops, as channel_norm.py) measured slower, one thread, old / new trees
# alternating three times (Xeon with AMX, 2026-12-07), us: layer_norm 512x768 197-207 ->
# 221-290, 4096x768 1015-1024 -> 1064-1156; rms_norm 512x4096 and the backward blocks
# (norm_grad.py) within noise.
@njit(**JIT_INNER)
def layer_norm_rows(x, r, h, w, b, eps, out, has_res, lo, hi):
    """Three vectorized passes over the cached row (h = x + r with a residual):
      1. s = sum(h - h[0]): the sum shifted by the row's first element;  m0 = h[0] + s / D;
      2. d = h - m0, written to out; sd = sum(d), q = sum(d^2);
      3. out = (d - sd / D) * rstd * w + b,  rstd = 1 / sqrt(q / D - (sd / D)^2 + eps).
    This is the corrected two-pass algorithm (Chan, Golub & LeVeque), chosen over a float64
    mean because every pass stays in the input's dtype (full-width vectors, one extra
    subtraction in pass 1 and an add + store in pass 2).  Why each piece:
    - The shift by h[0] makes a constant row exact whatever order fastmath sums in: every
      term is 0, so m0 == c, d == 0 and the output is exactly b (an unshifted float32 sum
      of D copies of c is off by many ulps, and (c - mean) / sqrt((c - mean)^2 + eps) is
      then O(1): 0.53 at c = 1e4 + 0.1, D = 4096).
    - m0 carries the rounding of the mean to the dtype (up to ulp(mean) / 2, 5e-4 at
      1e4): sd / D puts the exact remainder back without ever forming mean = m0 + sd / D,
      so rows with a large common offset keep full precision relative to their spread.
    - d goes through memory (out) rather than being recomputed in pass 3: under fastmath
      reassociation LLVM may rewrite (h - m0) - sd / D as h - (m0 + sd / D), which rounds
      the corrected mean back to the dtype."""
    d = x.shape[1]
    zero = like(eps, 0.0)
    for i in range(lo, hi):
        orow = row_of(out, i)
        if has_res:
            xr = row_of(x, i)
            rr = row_of(r, i)
            src = row_of(h, i)
            x0 = xr[0] + rr[0]  # == h[i, 0]: the same rounded sum
            s = zero
            for j in range(d):
                v = xr[j] + rr[j]
                src[j] = v
                s += v - x0
        else:
            src = row_of(x, i)
            x0 = src[0]
            s = zero
            for j in range(d):
                s += src[j] - x0
        mc, rstd = centered_stats(src, x0, s, orow, eps)
        for j in range(d):
            orow[j] = (orow[j] - mc) * rstd * w[j] + b[j]


@njit(**JIT_INNER)
def rms_norm_rows(x, r, h, w, eps, out, has_res, lo, hi):
    d = x.shape[1]
    inv_d = like(eps, 1.0 / d)
    one = like(eps, 1.0)
    if has_res:
        for i in range(lo, hi):
            xr = row_of(x, i)
            rr = row_of(r, i)
            hr = row_of(h, i)
            orow = row_of(out, i)
            q = like(eps, 0.0)
            for j in range(d):
                v = xr[j] + rr[j]
                hr[j] = v
                q += v * v
            rstd = one / math.sqrt(q * inv_d + eps)
            for j in range(d):
                orow[j] = hr[j] * rstd * w[j]
    else:
        for i in range(lo, hi):
            xr = row_of(x, i)
            orow = row_of(out, i)
            q = like(eps, 0.0)
            for j in range(d):
                v = xr[j]
                q += v * v
            rstd = one / math.sqrt(q * inv_d + eps)
            for j in range(d):
                orow[j] = xr[j] * rstd * w[j]


@njit(**JIT)
def layer_norm_serial(x, r, h, w, b, eps, out, has_res):
    layer_norm_rows(x, r, h, w, b, eps, out, has_res, 0, x.shape[0])


@njit(**JIT_BY_ADDRESS)
def norm_worker(me, params, is64, rms):
    """Rows claimed from the block (parallel.row_block: f = eps, i = has_res; arrays x, r,
    h, w, b (layer_norm only), out)."""
    p, eps64 = row_args(params)
    z = like_dtype(is64)
    n, d = p[RW_N], p[RW_D]
    x = c_array_at(p[0], z, (n, d))
    r = c_array_at(p[1], z, (n, d))
    h = c_array_at(p[2], z, (n, d))
    w = c_array_at(p[3], z, (d,))
    b = c_array_at(p[4], z, (d,))
    out = c_array_at(p[5], z, (n, d))
    eps = like(z, eps64)
    has_res = p[RW_I] != 0
    lo, hi = row_claim(p, me)
    while lo < hi:
        if rms is not None:
            rms_norm_rows(x, r, h, w, eps, out, has_res, lo, hi)
        else:
            layer_norm_rows(x, r, h, w, b, eps, out, has_res, lo, hi)
        lo, hi = row_claim(p, me)


@njit(**JIT)
def _norm_launch(x, r, h, w, b, eps, out, has_res, worker, nw, fn, buf, team_run, team_state):
    workers = row_block(buf, x.shape[0], x.shape[1], eps, has_res, 0, 0, 1, nw, fn)
    buf[0], buf[1], buf[2] = x.ctypes.data, r.ctypes.data, h.ctypes.data
    buf[3], buf[4], buf[5] = w.ctypes.data, b.ctypes.data, out.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def layer_norm_parallel(x, r, h, w, b, eps, out, has_res):
    """layer_norm_serial's result, rows claimed by the team's threads (parallel.row_run)."""
    row_run(_norm_launch, worker_address(norm_worker, (bool(x.dtype == np.float64), only_if(False))),
            x, r, h, w, b, eps, out, has_res)


@njit(**JIT)
def rms_norm_serial(x, r, h, w, eps, out, has_res):
    rms_norm_rows(x, r, h, w, eps, out, has_res, 0, x.shape[0])


def rms_norm_parallel(x, r, h, w, eps, out, has_res):
    """rms_norm_serial's result, rows claimed by the team's threads (parallel.row_run)."""
    row_run(_norm_launch, worker_address(norm_worker, (bool(x.dtype == np.float64), only_if(True))),
            x, r, h, w, w, eps, out, has_res)


@njit(**JIT_INNER)
def norm_rows_half(x, r, h, w, b, eps, out, has_res, rms, lo, hi):
    """Rows lo..hi of 16-bit x (bits, (n, D); half.py): with has_res h = round(x + r) is
    stored and normalized, else x; out = round(layer_norm) (rms False: weight w, bias b) or
    round(rms_norm) (w), rounded to x's format, in float32 by layer_norm_rows' /
    rms_norm_rows' arithmetic: the first pass widens the row into a float32 scratch row
    while summing (the shifted sum or the sum of squares), the last rounds each output
    value as it is made."""
    wide_loops()
    d = x.shape[1]
    src = np.empty(d, np.float32)
    dst = np.empty(d, np.float32)
    inv_d = np.float32(1.0 / d)
    one = np.float32(1.0)
    for i in range(lo, hi):
        xr = row_of(x, i)
        orow = row_of(out, i)
        s = np.float32(0.0)
        if has_res:
            rr = row_of(r, i)
            hr = row_of(h, i)
            x0 = widen(round_to(widen(xr[0]) + widen(rr[0]), x))
            if rms:
                for j in range(d):
                    hv = round_to(widen(xr[j]) + widen(rr[j]), x)
                    hr[j] = hv
                    v = widen(hv)
                    src[j] = v
                    s += v * v
            else:
                for j in range(d):
                    hv = round_to(widen(xr[j]) + widen(rr[j]), x)
                    hr[j] = hv
                    v = widen(hv)
                    src[j] = v
                    s += v - x0
        else:
            x0 = widen(xr[0])
            if rms:
                for j in range(d):
                    v = widen(xr[j])
                    src[j] = v
                    s += v * v
            else:
                for j in range(d):
                    v = widen(xr[j])
                    src[j] = v
                    s += v - x0
        if rms:
            rstd = one / math.sqrt(s * inv_d + eps)
            for j in range(d):
                orow[j] = round_to(src[j] * rstd * w[j], out)
        else:
            mc, rstd = centered_stats(src, x0, s, dst, eps)
            for j in range(d):
                orow[j] = round_to((dst[j] - mc) * rstd * w[j] + b[j], out)


@njit(**JIT)
def norm_half_serial(x, r, h, w, b, eps, out, has_res, rms):
    norm_rows_half(x, r, h, w, b, eps, out, has_res, rms, 0, x.shape[0])


@njit(**JIT_BY_ADDRESS)
def norm_half_worker(me, params, fmt, rms):
    """norm_worker for 16-bit rows (arrays x, r, h, out of the literal type character fmt,
    "H" bfloat16 bits / "h" float16 bits (parallel.zero_of); w, b float32)."""
    p, eps64 = row_args(params)
    n, d = p[RW_N], p[RW_D]
    z = zero_of(fmt)
    x = c_array_at(p[0], z, (n, d))
    r = c_array_at(p[1], z, (n, d))
    h = c_array_at(p[2], z, (n, d))
    w = c_array_at(p[3], np.float32(0), (d,))
    b = c_array_at(p[4], np.float32(0), (d,))
    out = c_array_at(p[5], z, (n, d))
    eps = np.float32(eps64)
    has_res = p[RW_I] != 0
    lo, hi = row_claim(p, me)
    while lo < hi:
        norm_rows_half(x, r, h, w, b, eps, out, has_res, rms, lo, hi)
        lo, hi = row_claim(p, me)


def norm_half_parallel(x, r, h, w, b, eps, out, has_res, rms):
    """norm_half_serial's result, rows claimed by the team's threads (parallel.row_run)."""
    row_run(_norm_launch, worker_address(norm_half_worker, (x.dtype.char, bool(rms))), x, r, h, w, b, eps, out,
            has_res)
