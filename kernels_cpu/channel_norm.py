"""batch_norm (inference) and group_norm over NCHW-like arrays: channel dim 1, any number of
trailing spatial dims flattened into planes of S elements.

batch_norm: the dispatcher folds the running statistics, weight and bias into a per-channel
scale and shift (host float64 math, rounded to x's dtype), so the kernel is one streaming
pass: out = act(x * scale[c] + shift[c]).  It runs over a flat element range [lo, hi) of
x (N*C*S elements), cut into segments that stay inside one plane (one channel): each
segment is one vectorized loop with the plane's scale and shift in registers.  Ranges need
not start at a plane boundary, so the parallel kernel splits the array evenly whatever the
plane count (3 planes of 224 x 224 split over 2 threads as well as 1024 planes of 7 x 7).
With S == 1 (a rank-2 (N, C) input, BatchNorm1d) the channel runs along the row instead:
segments are pieces of rows, the scale and shift read as vectors, and the activation is
applied to each piece in place right after (act(y * 1 + 0): the same values, only the
sign of a zero may change).

group_norm: with x C-contiguous, the C/G channels of one group of one sample are one
contiguous block of L = (C/G) * S elements, so x is seen as (N*G, L) rows and each row is
normalized as kernels_cpu/norm.py layer_norm_rows does, with the same shifted, corrected
two-pass statistics (read its docstring): 1. s = sum(x - x[0]), m0 = x[0] + s / L;
2. d = x - m0 written to out, sd = sum(d), q = sum(d^2); 3. per channel c of the group,
out = act(d * a + (bias[c] - mc * a)) with mc = sd / L, a = rstd * weight[c].  A constant
group has d == 0 and mc == 0, so its output is exactly bias (before the activation), and
groups with a large common offset keep their precision.  The row stays in L2 between the
passes (40960 floats = 160 KiB for Stable Diffusion's 10 channels x 64 x 64).

The activation is a runtime code (kernels_common.activation.ACT_*), branched on outside the
element loops (affine_act) so every loop body is branch-free and vectorizes, and one
compiled kernel serves every activation.  weight / bias are always arrays here (dispatch
passes ones / zeros for None).
"""
import numpy as np
from numpy import uintp
from numba import njit, prange

from .approx import ACT_GELU, ACT_GELU_TANH, ACT_NONE, ACT_RELU, ACT_SILU, JIT, JIT_INNER, gelu, gelu_tanh, like, relu, silu
from .norm import centered_stats
from .parallel import claim, claims_for, row_of, row_split

# Parallel batch_norm tasks cover at least this many elements, their bounds rounded down
# to a multiple of ALIGN elements (whole cache lines between tasks, aligned vector loops).
MIN_TASK = 4096
ALIGN = 64
# S == 1: pieces of a row this long get the affine loop, then the activation in place
# while they are in L1 (a separate vector-parameter copy of every activation loop cost
# 2.4 s of compile time on the cold first call).
VEC_CHUNK = 1024


@njit(**JIT_INNER)
def affine_act(src, dst, a, b, code, lo, hi):
    """dst[uintp(j)] = act(src[uintp(j)] * a + b) for j in [lo, hi) (src may be dst)."""
    if code == ACT_RELU:
        for j in range(lo, hi):
            dst[uintp(j)] = relu(src[uintp(j)] * a + b)
    elif code == ACT_SILU:
        for j in range(lo, hi):
            dst[uintp(j)] = silu(src[uintp(j)] * a + b)
    elif code == ACT_GELU:
        for j in range(lo, hi):
            dst[uintp(j)] = gelu(src[uintp(j)] * a + b)
    elif code == ACT_GELU_TANH:
        for j in range(lo, hi):
            dst[uintp(j)] = gelu_tanh(src[uintp(j)] * a + b)
    else:
        for j in range(lo, hi):
            dst[uintp(j)] = src[uintp(j)] * a + b


@njit(**JIT_INNER)
def affine_act_inplace(buf, a, b, code, lo, hi):
    """buf[uintp(j)] = act(buf[uintp(j)] * a + b) for j in [lo, hi).  affine_act(buf, buf, ...) computes
    the same, but its loops read src and write dst: LLVM vectorizes them behind a runtime
    overlap check, which an in-place call fails, so they ran scalar (group_norm + SiLU
    at 1x320x64x64: 9.6 ms, 5.9 ns per element; one array here: no check, vectorized)."""
    if code == ACT_RELU:
        for j in range(lo, hi):
            buf[uintp(j)] = relu(buf[uintp(j)] * a + b)
    elif code == ACT_SILU:
        for j in range(lo, hi):
            buf[uintp(j)] = silu(buf[uintp(j)] * a + b)
    elif code == ACT_GELU:
        for j in range(lo, hi):
            buf[uintp(j)] = gelu(buf[uintp(j)] * a + b)
    elif code == ACT_GELU_TANH:
        for j in range(lo, hi):
            buf[uintp(j)] = gelu_tanh(buf[uintp(j)] * a + b)
    else:
        for j in range(lo, hi):
            buf[uintp(j)] = buf[uintp(j)] * a + b


@njit(**JIT_INNER)
def batch_norm_range(x, scale, shift, out, s, code, lo, hi):
    """out = act(x * scale[c] + shift[c]) on the flat elements [lo, hi) of x (N*C*S
    elements, planes of s); scale, shift: (C,)."""
    nc = scale.shape[0]
    if lo >= hi:
        return
    if s == 1:  # (N, C): the channel runs along each row of C
        one = like(scale[0], 1.0)
        zero = like(scale[0], 0.0)
        j = lo
        c = lo % nc
        while j < hi:
            end = min(hi, j + (nc - c), j + VEC_CHUNK)
            off = j - c
            for t in range(j, end):
                out[t] = x[t] * scale[t - off] + shift[t - off]
            if code != ACT_NONE:  # on the chunk just written, in L1
                affine_act(out, out, one, zero, code, j, end)
            c += end - j
            if c == nc:
                c = 0
            j = end
        return
    p = lo // s
    c = p % nc
    j = lo
    while j < hi:
        end = min(hi, (p + 1) * s)
        affine_act(x, out, scale[c], shift[c], code, j, end)
        j = end
        p += 1
        c += 1
        if c == nc:
            c = 0


@njit(**JIT)
def batch_norm_serial(x, scale, shift, out, s, code):
    """x, out: flat (N*C*S,) C-contiguous; scale, shift: (C,) in x's dtype."""
    # lo as np.int64(0), not the constant 0: numba would type it Literal[int](0) and compile
    # a second copy of affine_act for it
    batch_norm_range(x, scale, shift, out, s, code, np.int64(0), x.shape[0])


@njit(parallel=True, **JIT)
def _batch_norm_parallel(x, scale, shift, out, s, code, nw, fn, counters):
    total = x.shape[0]
    n = (total + ALIGN - 1) // ALIGN  # claimed in blocks of ALIGN elements
    least, workers = claims_for(n, nw, MIN_TASK // ALIGN)
    for me in prange(workers):
        lo, hi = claim(fn, counters, n, workers, least, me)
        while lo < hi:
            batch_norm_range(x, scale, shift, out, s, code, lo * ALIGN, min(hi * ALIGN, total))
            lo, hi = claim(fn, counters, n, workers, least, me)


def batch_norm_parallel(x, scale, shift, out, s, code):
    """batch_norm_serial's result, element ranges claimed by numba's threads (parallel.claim)."""
    _batch_norm_parallel(x, scale, shift, out, s, code, *row_split())


@njit(**JIT_INNER)
def group_norm_rows(x, w, b, eps, out, cg, s, code, lo, hi):
    """Rows [lo, hi) of x, out: (N*G, cg*s), row i = group i % G of sample i // G; w, b: (C,)."""
    d = x.shape[1]
    ng = w.shape[0] // cg
    zero = like(eps, 0.0)
    g = lo % ng
    for i in range(lo, hi):
        src = row_of(x, i)
        orow = row_of(out, i)
        x0 = src[0]
        t = zero
        for j in range(d):
            t += src[j] - x0
        mc, rstd = centered_stats(src, x0, t, orow, eps)  # layer_norm's statistics
        for k in range(cg):
            c = g * cg + k
            a = rstd * w[c]
            affine_act_inplace(orow, a, b[c] - mc * a, code, k * s, (k + 1) * s)
        g += 1
        if g == ng:
            g = 0


@njit(**JIT)
def group_norm_serial(x, w, b, eps, out, cg, s, code):
    group_norm_rows(x, w, b, eps, out, cg, s, code, np.int64(0), x.shape[0])  # see batch_norm_serial


@njit(parallel=True, **JIT)
def _group_norm_parallel(x, w, b, eps, out, cg, s, code, nw, fn, counters):
    n = x.shape[0]
    least, workers = claims_for(n, nw, 1)
    for me in prange(workers):
        lo, hi = claim(fn, counters, n, workers, least, me)
        while lo < hi:
            group_norm_rows(x, w, b, eps, out, cg, s, code, lo, hi)
            lo, hi = claim(fn, counters, n, workers, least, me)


def group_norm_parallel(x, w, b, eps, out, cg, s, code):
    """group_norm_serial's result, blocks of (sample, group) rows over numba's threads."""
    _group_norm_parallel(x, w, b, eps, out, cg, s, code, *row_split())
