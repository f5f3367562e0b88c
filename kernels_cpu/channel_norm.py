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
2. with d = x - m0, sd = sum(d), q = sum(d^2) (layer_norm writes d to out here; group_norm
recomputes it in pass 3: centered_act); 3. per channel c of the group, out = act(d * a +
(bias[c] - mc * a)) with mc = sd / L, a = rstd * weight[c].  A constant group has d == 0
and mc == 0, so its output is exactly bias (before the activation), and groups with a
large common offset keep their precision.  The row stays in L2 between the passes (40960
floats = 160 KiB for Stable Diffusion's 10 channels x 64 x 64).

16-bit x (bfloat16 / float16 bits, uint16 / int16: half.py; *_half_*) with float32
parameters: batch_norm widens pieces of at most HALF_CHUNK elements of one plane into a
float32 scratch, applies the affine + activation there and rounds each value into out;
group_norm widens each (sample, group) row into a float32 scratch row, takes the same
statistics and affine passes on it, and rounds the row into out.  One rounding per output
(PyTorch's 16-bit norms compute in float32 too).

The activation is a runtime code (kernels_common.activation.ACT_*), branched on outside the
element loops (affine_act) so every loop body is branch-free and vectorizes, and one
compiled kernel serves every activation.  The float32 loops run 16 lanes wide on AVX-512 hosts
(approx.wide_loops; LLVM's own choice there is 8): report timing, old / new trees
alternating twice, 2 threads (Xeon with AMX, 2026-12-07), us: group_norm + SiLU 1x320x64x64
684-693 -> 557-578 (its floor 394-448), 1x640x32x32 383-496 -> 328-374; batch_norm + ReLU
1x64x112x112 330-354 -> 296-302, 1x256x56x56 331-359 -> 288-392.  The 16-bit kernels keep
LLVM's 8 lanes: 16 gave float16 group_norm 688-863 -> 619-704 but bfloat16 740-744 ->
762-795 (one variant serves both).  weight / bias are always arrays here (dispatch
passes ones / zeros for None).
"""
import numpy as np
from numpy import uintp
from numba import njit

from .approx import (ACT_GELU, ACT_GELU_TANH, ACT_NONE, ACT_RELU, ACT_SILU, JIT, JIT_BY_ADDRESS, JIT_INNER,
                     fma, gelu, gelu_tanh, like, relu, silu, wide_loops)
from .half import round_to, widen
from .norm import centered_moments, centered_stats
from .parallel import (RW_D, RW_I, RW_I2, RW_I3, RW_I4, RW_N, c_array_at, launch, only_if, row_args,
                       row_block, row_claim, row_of, row_run, worker_address, zero_of)

# Parallel batch_norm tasks cover at least this many elements, their bounds rounded down
# to a multiple of ALIGN elements (whole cache lines between tasks, aligned vector loops).
MIN_TASK = 4096
ALIGN = 64
# S == 1: pieces of a row this long get the affine loop, then the activation in place
# while they are in L1 (a separate vector-parameter copy of every activation loop cost
# 2.4 s of compile time on the cold first call).
VEC_CHUNK = 1024
# 16-bit batch_norm: elements widened into the float32 scratch at a time (4 KiB: stays in L1
# between the widening, the affine + activation and the rounding; not measured on its own)
HALF_CHUNK = 1024


@njit(**JIT_INNER)
def affine_act(src, dst, a, b, code, lo, hi):
    """dst[uintp(j)] = act(src[uintp(j)] * a + b) for j in [lo, hi) (src may be dst)."""
    wide_loops()
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
    wide_loops()
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
def centered_act(src, dst, m0, a, b, code, lo, hi):
    """dst[j] = act((src[j] - m0) * a + b) for j in [lo, hi): src - m0 rounded, then one
    FMA (llvm.fma, which fastmath reassociation cannot rewrite as src * a + (b - m0 * a):
    that would lose the low bits of src - m0 when |m0| is large).  group_norm's last pass,
    reading x where it used to read back d = x - m0 stored by the statistics pass: SD U-Net
    1x320x64x64 + SiLU, one thread, a model of the row passes (Xeon with AVX-512,
    2026-12-07): 858-950 -> 782-843 us (without the SiLU 528-578 -> 512-554)."""
    wide_loops()
    if code == ACT_RELU:
        for j in range(lo, hi):
            dst[uintp(j)] = relu(fma(src[uintp(j)] - m0, a, b))
    elif code == ACT_SILU:
        for j in range(lo, hi):
            dst[uintp(j)] = silu(fma(src[uintp(j)] - m0, a, b))
    elif code == ACT_GELU:
        for j in range(lo, hi):
            dst[uintp(j)] = gelu(fma(src[uintp(j)] - m0, a, b))
    elif code == ACT_GELU_TANH:
        for j in range(lo, hi):
            dst[uintp(j)] = gelu_tanh(fma(src[uintp(j)] - m0, a, b))
    else:
        for j in range(lo, hi):
            dst[uintp(j)] = fma(src[uintp(j)] - m0, a, b)


@njit(**JIT_INNER)
def batch_norm_range(x, scale, shift, out, s, code, lo, hi):
    """out = act(x * scale[c] + shift[c]) on the flat elements [lo, hi) of x (N*C*S
    elements, planes of s); scale, shift: (C,)."""
    wide_loops()
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


@njit(**JIT_BY_ADDRESS)
def channel_norm_worker(me, params, xfmt, pfmt, half, group):
    """Claims from the block (parallel.row_block).  group_norm (group True): rows of (N*G,
    cg*s), f = eps, i = cg, i2 = s, i3 = code, i4 = C; arrays x, w, b, out.  batch_norm
    (group None: parallel.only_if, the other op's path is not compiled): blocks of ALIGN
    elements of the flat x (d elements), i2 = s, i3 = code, i4 = C; arrays x, scale, shift,
    out.  xfmt / pfmt: the literal type characters (parallel.zero_of) of x and out ("f",
    "d", or 16-bit bits "H" / "h", which take the *_half rows: half, a parallel.only_if
    literal) and of the parameters (x's, or "f")."""
    p, eps64 = row_args(params)
    z, pz = zero_of(xfmt), zero_of(pfmt)
    nc = p[RW_I4]
    w = c_array_at(p[1], pz, (nc,))
    b = c_array_at(p[2], pz, (nc,))
    s, code = p[RW_I2], p[RW_I3]
    lo, hi = row_claim(p, me)
    if group is not None:
        n, d = p[RW_N], p[RW_D]
        x = c_array_at(p[0], z, (n, d))
        out = c_array_at(p[3], z, (n, d))
        eps = like(pz, eps64)
        while lo < hi:
            if half is not None:
                group_norm_rows_half(x, w, b, eps, out, p[RW_I], s, code, lo, hi)
            else:
                group_norm_rows(x, w, b, eps, out, p[RW_I], s, code, lo, hi)
            lo, hi = row_claim(p, me)
    else:
        total = p[RW_D]
        x = c_array_at(p[0], z, (total,))
        out = c_array_at(p[3], z, (total,))
        while lo < hi:
            if half is not None:
                batch_norm_range_half(x, w, b, out, s, code, lo * ALIGN, min(hi * ALIGN, total))
            else:
                batch_norm_range(x, w, b, out, s, code, lo * ALIGN, min(hi * ALIGN, total))
            lo, hi = row_claim(p, me)


def _variant(x, w, group):
    """channel_norm_worker's literals for these arrays (dtype.char: 0.04 us, dtype.name 1.8)."""
    return x.dtype.char, w.dtype.char, only_if(x.dtype.itemsize == 2), only_if(group)


@njit(**JIT)
def _launch(x, w, b, out, eps, cg, s, code, worker, nw, fn, buf, team_run, team_state):
    if x.ndim == 2:  # group_norm's (N*G, cg*s) rows
        workers = row_block(buf, x.shape[0], x.shape[1], eps, cg, s, code, 1, nw, fn)
    else:  # batch_norm's flat elements, claimed in blocks of ALIGN
        total = x.shape[0]
        workers = row_block(buf, (total + ALIGN - 1) // ALIGN, total, eps, cg, s, code, MIN_TASK // ALIGN, nw, fn)
    buf[RW_I4] = w.shape[0]
    buf[0], buf[1], buf[2], buf[3] = x.ctypes.data, w.ctypes.data, b.ctypes.data, out.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def batch_norm_parallel(x, scale, shift, out, s, code):
    """batch_norm_serial's result, element ranges claimed by the team's threads (parallel.row_run)."""
    row_run(_launch, worker_address(channel_norm_worker, _variant(x, scale, False)), x, scale, shift, out, 0.0, 0, s,
            code)


@njit(**JIT_INNER)
def group_norm_rows(x, w, b, eps, out, cg, s, code, lo, hi):
    """Rows [lo, hi) of x, out: (N*G, cg*s), row i = group i % G of sample i // G; w, b: (C,)."""
    wide_loops()
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
        m0, mc, rstd = centered_moments(src, x0, t, eps)  # layer_norm's statistics
        for k in range(cg):
            c = g * cg + k
            a = rstd * w[c]
            centered_act(src, orow, m0, a, b[c] - mc * a, code, k * s, (k + 1) * s)
        g += 1
        if g == ng:
            g = 0


@njit(**JIT)
def group_norm_serial(x, w, b, eps, out, cg, s, code):
    group_norm_rows(x, w, b, eps, out, cg, s, code, np.int64(0), x.shape[0])  # see batch_norm_serial


def group_norm_parallel(x, w, b, eps, out, cg, s, code):
    """group_norm_serial's result, (sample, group) rows claimed by the team's threads."""
    row_run(_launch, worker_address(channel_norm_worker, _variant(x, w, True)), x, w, b, out, eps, cg, s, code)


# ---- bfloat16 / float16 x (half.py): float32 arithmetic on widened values ----------------------

@njit(**JIT_INNER)
def batch_norm_range_half(x, scale, shift, out, s, code, lo, hi):
    """batch_norm_range for 16-bit x / out (bits of one format) with float32 scale / shift:
    pieces of one plane (or, with s == 1, of one row of C) of at most HALF_CHUNK elements
    widened into a float32 scratch, act(x * scale + shift) there, each value rounded into out."""
    nc = scale.shape[0]
    buf = np.empty(HALF_CHUNK, np.float32)
    one, zero = np.float32(1.0), np.float32(0.0)
    j = lo
    while j < hi:
        if s == 1:  # (N, C): the channel runs along each row of C
            c = j % nc
            end = min(hi, j + (nc - c), j + HALF_CHUNK)
            for t in range(j, end):
                buf[t - j] = widen(x[t]) * scale[c + t - j] + shift[c + t - j]
            if code != ACT_NONE:
                affine_act_inplace(buf, one, zero, code, np.int64(0), end - j)
        else:
            c = (j // s) % nc
            end = min(hi, (j // s + 1) * s, j + HALF_CHUNK)
            for t in range(j, end):
                buf[t - j] = widen(x[t])
            affine_act_inplace(buf, scale[c], shift[c], code, np.int64(0), end - j)
        for t in range(j, end):
            out[t] = round_to(buf[t - j], out)
        j = end


@njit(**JIT)
def batch_norm_half_serial(x, scale, shift, out, s, code):
    """x, out: flat (N*C*S,) 16-bit bits; scale, shift: (C,) float32."""
    batch_norm_range_half(x, scale, shift, out, s, code, np.int64(0), x.shape[0])


@njit(**JIT_INNER)
def group_norm_rows_half(x, w, b, eps, out, cg, s, code, lo, hi):
    """group_norm_rows for 16-bit rows (bits of one format) with float32 w, b, eps: each row
    widened into a float32 scratch row, the statistics and per-channel affine + activation
    there, the row rounded into out."""
    d = x.shape[1]
    ng = w.shape[0] // cg
    src = np.empty(d, np.float32)
    dst = np.empty(d, np.float32)
    g = lo % ng
    for i in range(lo, hi):
        xr = row_of(x, i)
        orow = row_of(out, i)
        x0 = widen(xr[0])
        t = np.float32(0.0)
        for j in range(d):
            v = widen(xr[j])
            src[j] = v
            t += v - x0
        mc, rstd = centered_stats(src, x0, t, dst, eps)
        for k in range(cg):
            c = g * cg + k
            a = rstd * w[c]
            affine_act_inplace(dst, a, b[c] - mc * a, code, k * s, (k + 1) * s)
        for j in range(d):
            orow[j] = round_to(dst[j], out)
        g += 1
        if g == ng:
            g = 0


@njit(**JIT)
def group_norm_half_serial(x, w, b, eps, out, cg, s, code):
    group_norm_rows_half(x, w, b, eps, out, cg, s, code, np.int64(0), x.shape[0])
