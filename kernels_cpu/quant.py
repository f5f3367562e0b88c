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

dequantize: y = (q - zero_point[c]) * scale[c] in y's type: q - zp is an exact small
integer, so the only rounding is the product's (float64: exact).

Serial kernels take the whole array; the parallel ones split one of O, C, I (the largest
that fits, see `split_dim`) into `tasks` ranges handed to numba's threads one at a time.
"""
import numpy as np
from numba import njit, prange, types
from numba.extending import overload
from numpy import uintp

from .approx import OVERLOAD, like, wide_loops

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


@njit(**SJIT)
def quantize_range(x, scale, zp, qlo, qhi, q, o0, o1, c0, c1, i0, i1):
    """q[o, c, i] = saturate(rint(x / scale[c]) + zp[c]) over the range; scale and zp in x's
    type (zp: small integers as floats), qlo / qhi the type's limits as floats."""
    wide_loops()
    ni = x.shape[2]
    if ni == 1:
        for o in range(o0, o1):
            xr = x[o, :, 0]
            qr = q[o, :, 0]
            for c in range(c0, c1):
                t = np.rint(xr[uintp(c)] / scale[uintp(c)]) + zp[uintp(c)]
                t = t if t > qlo else qlo
                t = t if t < qhi else qhi
                qr[uintp(c)] = np.int32(t)
        return
    for o in range(o0, o1):
        for c in range(c0, c1):
            xr = x[o, c]
            qr = q[o, c]
            s = scale[c]
            z = zp[c]
            for i in range(i0, i1):
                t = np.rint(xr[uintp(i)] / s) + z
                t = t if t > qlo else qlo
                t = t if t < qhi else qhi
                qr[uintp(i)] = np.int32(t)


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
    for every task to stream a long run (one scale per tensor: I is everything), else the
    larger of O and C."""
    o, c, i = shape
    if i >= 1024 * tasks or (o == 1 and c == 1):
        return 2
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
        xr2 = x2[c]
        qr = q2[c]
        for i in range(n):
            t = np.rint(xr2[uintp(i)] / st) + z
            t = t if t > flo else flo
            t = t if t < fhi else fhi
            qr[uintp(i)] = np.int32(t)


@njit(parallel=True, **SJIT)
def fused_rows_parallel(x2, xi2, absmask, negbad, expo, symmetric, qlo, qhi, zsym, tiny, bits, fbits, q2, scale, zp,
                        status, tasks):
    """fused_rows over `tasks` ranges of rows; bits / fbits: (tasks, 2) scratch."""
    c = x2.shape[0]
    for t in prange(tasks):
        fused_rows(x2, xi2, absmask, negbad, expo, symmetric, qlo, qhi, zsym, tiny, bits[t], fbits[t], q2, scale, zp,
                   status, c * t // tasks, c * (t + 1) // tasks)
