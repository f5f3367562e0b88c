"""Linear quantization (ONNX QuantizeLinear / DequantizeLinear) on the CPU.

Every array is seen as (O, C, I), C-contiguous: C the channels (the quantization axis; 1 for
one scale per tensor), O the extent before it, I after it.  Channel c owns x[:, c, :].

stats: per channel, the range of x, for computing scales.  The reductions run on the bit
patterns of x as integers (x viewed as int32 for float32, int64 for float64): LLVM does not
vectorize a float min/max reduction here (fcmp + select stays scalar, vminss, even with
nnan; checked 2026-11-25 with numba 0.68 / llvmlite 0.50 on the Sapphire Rapids host), but
it does vectorize integer ones (vpmaxs*/vpmaxu* on ymm / zmm).  What each reduction keeps:
    max |x| (symmetric):   max of bits & ABS   (non-negative floats order like their bits;
                                                a NaN or inf gives bits >= the exponent mask,
                                                so it also says whether the channel is finite)
    max(0, max x):         max of the bits as signed integers, from 0 (a positive float is
                           a positive integer, larger for a larger float; negatives are
                           negative integers and lose to the 0 it starts from)
    min(0, min x):         max of the bits as unsigned integers, from 0 (negative floats, the
                           sign bit set, are the largest unsigned values and order by
                           magnitude: the largest is the most negative x; below 2^31 (2^63)
                           there was no negative x and the bound is 0)
+inf and positive NaN are the largest signed values, -inf and negative NaN the largest
unsigned ones, so the two maxima also say whether the channel is finite.  Two vector max
ops per element (they replaced a sign-flip key and a min, a max and an |x| max: 179 ->
142 us for 3M float32 on one thread, 2026-11-27, AMD Zen 5 host).  The dispatcher turns
them back into floats (dispatch/ops/quant.py).

quantize: q = saturate(round_half_even(x / scale[c]) + zero_point[c]), the division in x's
type (float32 for float32, as ONNX), np.rint (vroundps: vectorized).  A NaN quotient fails
`t > qmin` and becomes qmin (onnxruntime 1.32 gives the lowest value of the type for NaN
as well); +-inf saturates.  The clamps compare strictly (`t if t > qmin else qmin`): LLVM
turns that form into vmaxps / vminps, whose NaN operand order gives the same qmin, where
`>=` (which must keep t = -0.0 over qmin = 0.0) stays vcmpps + vblendmps.  The quantize
loop alone, 98304 float32 to uint8, one thread, Zen 4 (2026-12-04): 15.3 -> 11.0 us, the
same bytes on random, NaN, inf and tie inputs.  No fastmath here: arcp would turn x / s
into x * (1 / s), which rounds differently.
quantize_run (a run of one scale, or channels along the last axis with a scale each)
multiplies by y = 1/s instead and checks the result: Intel's vdivps (one zmm in ~10
cycles) bounded the loop there.  98304 float32, one thread, Xeon with AVX-512
(2026-12-07), us, division -> product: static scale 20.5 -> 15.5,
dynamic uint8 per tensor (fused_rows, range + values) 26.7 -> 19.0, per row of 768 (128
rows) 23.7 -> 22.6 (per-row scale arithmetic and the range pass dominate there); the loop
is 14 zmm operations a vector, its check an OR of compare masks.  Why the product gives the
same integers: y = RN(1/s) and v = RN(x y) are within 2^-23 + 2^-48 (relative) of x / s,
and the reference quotient RN(x / s) within 2^-24, so |v - RN(x / s)| < 2^-22 |x / s| <
2^-21 |v| (float32; float64: 2^-50 |v|, RECIP_TOL_*).  rint is constant between consecutive
half-integers, so where no half-integer lies within RECIP_TOL_* |v| of v, rint(v) =
rint(RN(x / s)) exactly; a block of RUN_BLOCK elements holding any v nearer than that (one
in ~10^4 of random values) is quantized again by the division.  The bound needs 1 / s in
the normal range (RECIP_S_MIN <= s <= RECIP_S_MAX, else the run divides); a product that
underflows is below 2^-126, far from any half-integer (rint gives 0 either way), one that
overflows saturates as the quotient does, NaN stays NaN (the test is false, qmin).

dequantize: y = (q - zero_point[c]) * scale[c] in y's type: q - zp is an exact small
integer, so the only rounding is the product's (float64: exact).

Serial kernels take the whole array; the parallel ones split one of O, C, I (the largest
that fits, see `split_dim`) into `tasks` ranges handed to numba's threads one at a time.
"""
import numpy as np
from numba import njit, prange, types
from numba.extending import overload
from numpy import uintp

from .approx import HELPER, OVERLOAD, like, wide_loops

# Reductions: reassociation only (the integer reductions do not need it; kept off the
# quantize and dequantize loops, see the module docstring).
SJIT = dict(cache=True, error_model="numpy", nogil=True)  # the GIL released (see approx.JIT)


def _same_width(signed):
    """cast(ref, v): v's bits as the signed (unsigned) integer of ref's width, no bits
    changed.  numba widens int32 bit operations to int64, which would halve the vector
    lanes of the reductions (int32 lanes: 0.83 -> 0.54 ms for the min / max / |x| of 3M
    float32, 2026-11-25, Sapphire Rapids host)."""
    def cast(ref, v):
        return v

    @overload(cast, **OVERLOAD)
    def _cast_overload(ref, v):
        narrow = ref in (types.int32, types.uint32)
        if signed:
            return (lambda ref, v: np.int32(v)) if narrow else (lambda ref, v: np.int64(v))
        return (lambda ref, v: np.uint32(v)) if narrow else (lambda ref, v: np.uint64(v))

    return cast


as_int = _same_width(True)
as_uint = _same_width(False)


@njit(**SJIT)
def _row_absmax(xr, i0, i1, absmask, m):
    wide_loops()
    for i in range(i0, i1):
        b = xr[uintp(i)]
        a = as_int(b, b & absmask)
        m = a if a > m else m
    return m


@njit(**SJIT)
def _row_minmax(xr, i0, i1, lo, hi):
    """(lo, hi) folded with xr[i0:i1]: lo the unsigned, hi the signed maximum of the bits
    (module docstring)."""
    wide_loops()
    for i in range(i0, i1):
        b = xr[uintp(i)]
        u = as_uint(b, b)
        lo = u if u > lo else lo
        hi = b if b > hi else hi
    return lo, hi


@njit(**SJIT)
def stats_range(xi, absmask, minmax, amax, lo, hi, o0, o1, c0, c1, i0, i1):
    """Fold x[o0:o1, c0:c1, i0:i1] (xi: x's bits, (O, C, I)) into amax [C] (minmax False) or
    lo (unsigned) / hi [C] (minmax True)."""
    wide_loops()
    ni = xi.shape[2]
    if ni == 1:  # channels are the last axis: vectors across channels
        for o in range(o0, o1):
            xr = xi[o, :, 0]
            if minmax:
                for c in range(c0, c1):
                    b = xr[uintp(c)]
                    u = as_uint(b, b)
                    lo[c] = u if u > lo[c] else lo[c]
                    hi[c] = b if b > hi[c] else hi[c]
            else:
                for c in range(c0, c1):
                    b = xr[uintp(c)]
                    a = as_int(b, b & absmask)
                    amax[c] = a if a > amax[c] else amax[c]
        return
    for o in range(o0, o1):
        for c in range(c0, c1):
            xr = xi[o, c]
            if minmax:
                lo[c], hi[c] = _row_minmax(xr, i0, i1, lo[c], hi[c])
            else:
                amax[c] = _row_absmax(xr, i0, i1, absmask, amax[c])


@njit(**SJIT)
def stats_serial(xi, absmask, minmax, amax, lo, hi):
    o, c, i = xi.shape
    stats_range(xi, absmask, minmax, amax, lo, hi, 0, o, 0, c, 0, i)


@njit(**SJIT)
def _bounds(shape, dim, t, tasks):
    """(o0, o1, c0, c1, i0, i1): task t of `tasks` equal ranges of dimension dim."""
    n = shape[dim]
    a = n * t // tasks
    b = n * (t + 1) // tasks
    o0, o1, c0, c1, i0, i1 = 0, shape[0], 0, shape[1], 0, shape[2]
    if dim == 0:
        o0, o1 = a, b
    elif dim == 1:
        c0, c1 = a, b
    else:
        i0, i1 = a, b
    return o0, o1, c0, c1, i0, i1


@njit(parallel=True, **SJIT)
def stats_parallel(xi, absmask, minmax, amax_p, lo_p, hi_p, dim, tasks):
    """Task t folds its range into row t of the (tasks, C) partials (combined by the caller)."""
    for t in prange(tasks):
        o0, o1, c0, c1, i0, i1 = _bounds(xi.shape, dim, t, tasks)
        stats_range(xi, absmask, minmax, amax_p[t], lo_p[t], hi_p[t], o0, o1, c0, c1, i0, i1)


# quantize_run (module docstring): elements per checked block, the tolerance of the product
# against the quotient per x dtype, the scales whose reciprocal is a normal number.  Blocks
# of 64 / 128 / 256 ran alike (one thread, Xeon with AVX-512, 2026-12-07, us: a 98304-element
# static quantize 15.6 / 19.8 / 15.5, one row's dynamic uint8 18.8-19.2 for each, 128 rows
# of 768 per row 22.6 / 23.4 / 22.6); the smallest block costs least to redo.
RUN_BLOCK = 64
RECIP_TOL_F32, RECIP_TOL_F64 = 2.0 ** -21, 2.0 ** -50
RECIP_S_MIN, RECIP_S_MAX = 2.0 ** -125, 2.0 ** 125


def _at(v, j):
    """v[j] for an array v, v itself for a scalar (quantize_run's scales and zero points)."""
    return v


@overload(_at, **OVERLOAD)
def _at_overload(v, j):
    if isinstance(v, types.Array):
        return lambda v, j: v[uintp(j)]
    return lambda v, j: v


@njit(**HELPER)
def reciprocal(s):
    """(RN(1 / s), whether quantize_run may multiply by it: s a normal number's reciprocal,
    RECIP_S_MIN <= s <= RECIP_S_MAX) for one scale."""
    return like(s, 1.0) / s, s >= like(s, RECIP_S_MIN) and s <= like(s, RECIP_S_MAX)


@njit(**SJIT)
def quantize_run(xr, qr, s, y, z, flo, fhi, fast):
    """qr[i] = saturate(rint(xr[i] / s) + z) (xr, qr 1-D, C-contiguous, one length: pass
    slices, not bounds, so that no literal bound is a compile of its own; flo, fhi of xr's
    type; s, z one scale and zero point of xr's type, or arrays of xr's length: a channel
    each), the same integers as the division, by the product with y = RN(1 / s) (the
    scalar or array of `reciprocal`) checked against the half-integers (module docstring);
    fast False (a scale outside the reciprocal's range): the division throughout.  One
    function with both loops: quantize's cold first call (dynamic uint8 per tensor) took
    0.68 s with the division alone, 0.97 s with the division loop a function of its own,
    0.90-0.94 s as one, 1.03-1.13 s with array scales too (Xeon with AVX-512, 2026-12-07).
    Channels along the last axis, 768 x 3072 per column, static scales: one thread
    2.83-2.91 -> 0.78-0.80 ms."""
    wide_loops()
    n = len(xr)
    tol = like(flo, RECIP_TOL_F32) if xr.itemsize == 4 else like(flo, RECIP_TOL_F64)
    half = like(flo, 0.5)
    i = np.int64(0)
    while i < n:
        stop = n
        if fast:
            while i + RUN_BLOCK <= n:
                near = False
                for j in range(i, i + RUN_BLOCK):
                    v = xr[uintp(j)] * _at(y, j)
                    r = np.rint(v)
                    # within tol |v| of r + 1/2 or r - 1/2 (exact terms; the sum rounded up
                    # or not, never below 1/2 where the exact one is not: none is missed)
                    near |= abs(v - r) + tol * abs(v) >= half
                    t = r + _at(z, j)
                    t = t if t > flo else flo
                    t = t if t < fhi else fhi
                    qr[uintp(j)] = np.int32(t)
                if near:
                    break
                i += RUN_BLOCK
            stop = i + RUN_BLOCK if i + RUN_BLOCK < n else n   # the block to redo, or the tail
        for j in range(i, stop):   # the reference form
            t = np.rint(xr[uintp(j)] / _at(s, j)) + _at(z, j)
            t = t if t > flo else flo
            t = t if t < fhi else fhi
            qr[uintp(j)] = np.int32(t)
        i = stop


@njit(**SJIT)
def quantize_range(x, scale, zp, qlo, qhi, q, o0, o1, c0, c1, i0, i1):
    """q[o, c, i] = saturate(rint(x / scale[c]) + zp[c]) over the range; scale and zp in x's
    type (zp: small integers as floats), qlo / qhi the type's limits as floats, through
    quantize_run: runs of one channel, or channels along the last axis (a scale per
    element, the reciprocals made once)."""
    wide_loops()
    nc = c1 - c0
    ys = np.empty(nc, x.dtype)      # the range's reciprocals, once (not per row of O)
    oks = np.empty(nc, np.bool_)
    for c in range(nc):
        ys[c], oks[c] = reciprocal(scale[c0 + c])
    if x.shape[2] == 1:
        sc, zc = scale[c0:c1], zp[c0:c1]
        fast = oks.all()
        for o in range(o0, o1):
            xo = x[o].reshape(x.shape[1])
            qo = q[o].reshape(x.shape[1])
            quantize_run(xo[c0:c1], qo[c0:c1], sc, ys, zc, qlo, qhi, fast)
        return
    for o in range(o0, o1):
        for c in range(c0, c1):
            quantize_run(x[o, c][i0:i1], q[o, c][i0:i1], scale[c], ys[c - c0], zp[c], qlo, qhi, oks[c - c0])


@njit(**SJIT)
def quantize_serial(x, scale, zp, qlo, qhi, q):
    o, c, i = x.shape
    quantize_range(x, scale, zp, qlo, qhi, q, 0, o, 0, c, 0, i)


@njit(parallel=True, **SJIT)
def quantize_parallel(x, scale, zp, qlo, qhi, q, dim, tasks):
    for t in prange(tasks):
        o0, o1, c0, c1, i0, i1 = _bounds(x.shape, dim, t, tasks)
        quantize_range(x, scale, zp, qlo, qhi, q, o0, o1, c0, c1, i0, i1)


@njit(**SJIT)
def dequantize_range(q, scale, zp, y, o0, o1, c0, c1, i0, i1):
    """y[o, c, i] = (q - zp[c]) * scale[c]; scale and zp in y's type (int - float promotes
    to y's type, as numpy does)."""
    ni = q.shape[2]
    if ni == 1:
        for o in range(o0, o1):
            qr = q[o, :, 0]
            yr = y[o, :, 0]
            for c in range(c0, c1):
                yr[uintp(c)] = (qr[uintp(c)] - zp[uintp(c)]) * scale[uintp(c)]
        return
    for o in range(o0, o1):
        for c in range(c0, c1):
            qr = q[o, c]
            yr = y[o, c]
            s = scale[c]
            z = zp[c]
            for i in range(i0, i1):
                yr[uintp(i)] = (qr[uintp(i)] - z) * s


@njit(**SJIT)
def dequantize_serial(q, scale, zp, y):
    o, c, i = q.shape
    dequantize_range(q, scale, zp, y, 0, o, 0, c, 0, i)


@njit(parallel=True, **SJIT)
def dequantize_parallel(q, scale, zp, y, dim, tasks):
    for t in prange(tasks):
        o0, o1, c0, c1, i0, i1 = _bounds(q.shape, dim, t, tasks)
        dequantize_range(q, scale, zp, y, o0, o1, c0, c1, i0, i1)


def split_dim(shape, tasks):
    """The dimension of (O, C, I) the parallel kernels split: I when it is long enough
    for every task to stream a long run (one scale per tensor: I is everything); channels
    along the last axis (I == 1) by O while each task gets a row of channels, so that
    quantize_run's checked blocks run along whole rows (split by C, 768 x 3072 per column
    left runs of ~100 channels, a third of them in the division's tail: 2 threads 1.18 ms
    against 0.84 serial; Xeon with AVX-512, 2026-12-07); else the larger of O and C."""
    o, c, i = shape
    if i >= 1024 * tasks or (o == 1 and c == 1):
        return 2
    if i == 1 and o >= tasks:
        return 0
    return 0 if o >= c else 1


# ---- fused per-row quantization: the range of a row, its scale, then the row ------------------
#
# When each channel is one contiguous row (O == 1: per-row activations, per-output-channel
# weights), the row's range and its quantization run back to back while the row is in
# cache: x is read from memory once instead of twice.  The scale and zero point follow the
# host's formulas operation by operation (dispatch/ops/quant.py scales_from_range; no
# fastmath, so each float32 / float64 operation rounds as numpy's does), so both paths give
# the same bits (tests/test_quant.py checks both against the reference).
ROW_OK, ROW_NONFINITE, ROW_OVERFLOW = 0, 1, 2


@njit(**SJIT)
def fused_rows(x2, xi2, absmask, negbad, expo, symmetric, qlo, qhi, zsym, tiny, bits, fbits, q2, scale, zp, status,
               c0, c1):
    """Rows c0..c1-1 of x2 (C, I) (xi2: its bits; bits / fbits: a 2-element scratch array
    and its float view): scale[c] (float32), zp[c] (int32), status[c] (ROW_*), q2[c].
    expo / negbad: the smallest signed / unsigned bits of +inf / -inf (module docstring)."""
    wide_loops()
    n = x2.shape[1]
    flo = like(x2[0, 0], qlo)         # qlo, qhi, zsym: floats, as constants of x's type
    fhi = like(x2[0, 0], qhi)
    zs = like(x2[0, 0], zsym)
    rmin = flo
    zero = as_int(absmask, 0)
    uzero = as_uint(absmask, 0)
    umask = as_uint(absmask, absmask)
    for c in range(c0, c1):
        xr = xi2[c]
        if symmetric:
            m = _row_absmax(xr, 0, n, absmask, zero)
            if m >= expo:
                status[c] = ROW_NONFINITE
                continue
            bits[0] = m
            amax = np.float64(fbits[0])
            s = np.float32(amax / 127.0)
            wide = amax > 0
            z = zs
        else:
            lo, hi = _row_minmax(xr, 0, n, uzero, zero)
            if hi >= expo or lo >= negbad:
                status[c] = ROW_NONFINITE
                continue
            bits[0] = as_int(absmask, lo) if lo > umask else zero   # min(0, min x)
            bits[1] = hi                                             # max(0, max x)
            rmin = fbits[0]
            d = fbits[1] - rmin                 # in x's type, as the host
            s = np.float32(np.float64(d) / (qhi - qlo))
            wide = d > 0
        if not (abs(s) < np.float32(np.inf)):
            status[c] = ROW_OVERFLOW
            continue
        if wide:
            s = s if s > tiny else tiny
        else:
            s = np.float32(1.0)
        st = like(flo, s)
        if not symmetric:
            z = flo - rmin / st
            z = z if z > flo else flo
            z = z if z < fhi else fhi
            z = np.rint(z)
        scale[c] = s
        zp[c] = np.int32(z)
        status[c] = ROW_OK
        y, fast = reciprocal(st)
        quantize_run(x2[c], q2[c], st, y, z, flo, fhi, fast)


@njit(parallel=True, **SJIT)
def fused_rows_parallel(x2, xi2, absmask, negbad, expo, symmetric, qlo, qhi, zsym, tiny, bits, fbits, q2, scale, zp,
                        status, tasks):
    """fused_rows over `tasks` ranges of rows; bits / fbits: (tasks, 2) scratch."""
    c = x2.shape[0]
    for t in prange(tasks):
        fused_rows(x2, xi2, absmask, negbad, expo, symmetric, qlo, qhi, zsym, tiny, bits[t], fbits[t], q2, scale, zp,
                   status, c * t // tasks, c * (t + 1) // tasks)
