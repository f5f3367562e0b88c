"""Public quantize / dequantize: linear int8 / uint8 quantization with ONNX QuantizeLinear /
DequantizeLinear semantics, per tensor or per channel (issue #12).

    quantize(x, *, dtype="int8", axis=None, symmetric=True, scale=None, zero_point=None)
        -> QuantizedArray
    dequantize(q, *, dtype=np.float32, out=None) -> array of q's shape

Quantization (ONNX QuantizeLinear):
    q = saturate(round_half_to_even(x / scale[c]) + zero_point[c])
with c the index along `axis` (one scale for the whole tensor when axis is None), the
division in x's type (float32 for float32 x, as ONNX computes it; float64 for float64 x;
float32 for float16 x on CUDA), saturation to the type's limits: int8 [-128, 127], uint8
[0, 255].  NaN in x becomes the type's lowest value (-128 or 0), as onnxruntime 1.32 gives;
+-inf saturate.

Scales, when not given (dynamic quantization), from each slice's range, computed on the
host from the exact float min / max / max|x| (float64 arithmetic, rounded as stated):
    symmetric (default): scale = float32(max|x| / 127); zero point 0 for int8 (values then
        in [-127, 127]: -128 never occurs, so negation is exact), 128 for uint8 (values in
        [1, 255]; onnxruntime's zero point for symmetric uint8);
    asymmetric: ONNX DynamicQuantizeLinear's rule for any type: rmin = min(0, min x),
        rmax = max(0, max x), scale = float32(T(rmax - rmin) / (qmax - qmin)) (the
        difference rounded in x's type T first, as onnxruntime's float32 code does), zero
        point = round_half_even(clamp(qmin - rmin / scale, qmin, qmax)) with the division
        in T.
A slice whose range is all zeros (or empty) gets scale 1 (not 0: DequantizeLinear needs a
positive scale; onnxruntime's DynamicQuantizeLinear does the same).  A scale that would
underflow float32 (|x| below ~1.5e-36) is raised to float32's smallest normal number.  x
holding NaN or +-inf cannot be given a scale: ValueError naming x (pass scale= to quantize
it statically).  A float64 x whose range overflows a float32 scale is a ValueError too.

Static quantization (ONNX QuantizeLinear): scale= (positive finite; a number or shape ()
for axis None, shape (x.shape[axis],) per channel) and optionally zero_point= (the integer
type's numpy dtype, or Python ints in its range; default 0).  `symmetric` only chooses how
scales are computed, so it is ignored when scale= is given.

Dequantization (ONNX DequantizeLinear): y = (q.values - zero_point[c]) * scale[c] in
`dtype` (float32 or float64; float16 too on CUDA): q - zero_point is an exact integer, so
the result is the exact product rounded once (float64: exact), except float16, computed in
float32 and then rounded to float16 (within one float16 ulp of the exact product).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common.quant import QTYPES, SYMMETRIC_INT8_MAX
from kernels_cpu import parallel as KP
from kernels_cpu import quant as K

from .. import validate as V
from ..quantized import QuantizedArray
from ..registry import FLOAT_DTYPES, Call, Implementation, Op, bucket, register, register_op
from . import _arena
from ._common import deliver, kernel_input, result_buffer, serial_parallel_rule, size_bucket

__public__ = ("QuantizedArray",)  # exported by dispatch/__init__ beside the ops

_KERNELS = ("kernels_cpu.quant", "kernels_cpu.approx", "kernels_cpu.parallel")

# Serial below 2^21 elements (bucketed size), for both ops.  Measured 2026-11-27 on a quiet
# host (Zen 5, 2 cores, tbb layer, the keep-warm heartbeat on: kernels_cpu/keepwarm.py;
# float32 rows of 768, through dispatch with each implementation forced, the best of two
# alternating medians), serial / parallel in us, (a) back to back after 20 ms of calls, (e)
# batches of 10 calls after 10 ms pauses, (b) one call after 0.2 s idle:
#   quantize per tensor (uint8, asymmetric) 2^19 (a) 100 / 94 (e) 107 / 104 (b) 474 / 671,
#     2^20 169 / 148  176 / 159  543 / 760, 2^21 302 / 214  330 / 241  906 / 870,
#     2^22 690 / 359  700 / 412  1511 / 1054;
#   per row (int8) 2^20 135 / 98  163 / 109  457 / 463, 2^21 255 / 158  276 / 184  671 / 709;
#   dequantize per row 2^20 59 / 47  68 / 72  334 / 381, 2^21 107 / 74  122 / 100  480 / 562.
# From 2^21 threads win 25-40% back to back and in paced bursts and lose at most 17% on the
# first call after idle (where both are 3-5x slower than warm: cold caches).  Before the
# heartbeat (2026-11-26, same host) the paced bursts lost up to 2^21 (per tensor 2^21: 292 /
# 317) because the second thread woke late, so the threshold was 2^22.
PARALLEL_THRESHOLD = 1 << 21
_MEASURED = ("from 2^21 elements parallel wins 25-40% back to back and in paced bursts, loses at most 17% "
             "on a call after 0.2 s idle (keep-warm on)")

EXAMPLE_SHAPES = {
    # quantize: one scale per tensor (the signature's default); the cases cover per-channel
    "quantize": {"small": {"x": (5, 37)}, "large": {"x": (64, 4100)}, "decode": {"x": (1, 4096)}},
    # dequantize: scale of shape (5,) along axis 0 (synthesize reads the axis off the shapes)
    "dequantize": {"small": {"values": (5, 37), "scale": (5,)},
                   "large": {"values": (64, 4100), "scale": (64,)},
                   "decode": {"values": (1, 4096), "scale": ()}},
}

_F32_TINY = np.float32(np.finfo(np.float32).tiny)
# QTYPES by numpy dtype (dtype.name is slow Python: two lookups were ~3 us of a 28 us call)
_LIMITS = {d: (lo, hi) for d, lo, hi in QTYPES.values()}
_QNAME = {d: name for name, (d, _, _) in QTYPES.items()}
# x's bits as (signed type, unsigned type, |x| mask, +inf's bits (the smallest non-finite
# positive bits), -inf's bits as unsigned (the smallest non-finite negative)): the range
# reductions of kernels_cpu/quant.py (its docstring) and their decoding here
_FINITE_BITS = {np.dtype(np.float32): (np.int32, np.uint32, 0x7FFFFFFF, 0x7F800000, 0xFF800000),
                np.dtype(np.float64): (np.int64, np.uint64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000,
                                       0xFFF0000000000000)}


def compute_dtype(dtype) -> np.dtype:
    """The type x / scale is computed in for x of this dtype (float16: float32)."""
    dt = np.dtype(dtype)
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def qdtype_of(name, value) -> np.dtype:
    """The quantized numpy dtype for a `dtype=` argument: "int8" / "uint8" or np.int8 /
    np.uint8 (as a type or a dtype)."""
    if isinstance(value, str):
        if value in QTYPES:
            return QTYPES[value][0]
    elif isinstance(value, (type, np.dtype)):
        try:
            dt = np.dtype(value)
        except TypeError:
            dt = None
        if dt is not None and dt.name in QTYPES and dt.kind in "iu":
            return dt
    raise ValueError(f"{name} must be one of {sorted(QTYPES)} (or np.int8 / np.uint8), got {value!r}")


def _channels(shape, axis):
    """(O, C, I) of shape around axis (axis None: (1, 1, size))."""
    n = 1
    for s in shape:
        n *= int(s)
    if axis is None:
        return 1, 1, n
    o = 1
    for s in shape[:axis]:
        o *= int(s)
    c = int(shape[axis])
    i = 1
    for s in shape[axis + 1:]:
        i *= int(s)
    return o, c, i


# ---- scales from ranges (host, shared with the CUDA implementation) -----------------------

def floats_from_bits(dtype, amax, lo, hi):
    """The floats of the range reductions (kernels_cpu/quant.py): (max|x|, min(0, min x),
    max(0, max x), whether each channel held a NaN or inf) from amax (symmetric: lo, hi
    None; the bounds come back None) or from lo (unsigned) and hi (amax None; max|x| comes
    back None)."""
    it, uit, absmask, expo, negbad = _FINITE_BITS[np.dtype(dtype)]
    fdt = np.dtype(dtype)
    if amax is not None:
        amax = np.asarray(amax, it)
        return amax.view(fdt), None, None, amax >= it(expo)
    lo, hi = np.asarray(lo, uit), np.asarray(hi, it)
    bad = (hi >= it(expo)) | (lo >= uit(negbad))
    rmin = np.where(lo > uit(absmask), lo, uit(0)).view(fdt)  # no sign bit: no negative x, the bound is 0
    return None, rmin, hi.view(fdt), bad


def scales_from_range(xdtype, qdtype, symmetric, amax, rmin, rmax):
    """(scale float32 (C,), zero_point qdtype (C,)) of the dynamic rule (module docstring)
    from per-channel max|x|, min(0, min x), max(0, max x) (arrays of x's dtype)."""
    qd = np.dtype(qdtype)
    qlo, qhi = _LIMITS[qd]
    T = compute_dtype(xdtype)
    tiny = _F32_TINY
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if symmetric:
            m = np.asarray(amax, np.float64)
            scale = (m / SYMMETRIC_INT8_MAX).astype(np.float32)
            zp = np.full(scale.shape, 128 if qd == np.uint8 else 0, qd)
            wide = m > 0
        else:
            d = (np.asarray(rmax).astype(T) - np.asarray(rmin).astype(T)).astype(np.float64)
            scale = (d / (qhi - qlo)).astype(np.float32)
            wide = d > 0
        if not np.all(np.isfinite(scale)):
            raise ValueError("x's range overflows a float32 scale (max|x| or max - min beyond "
                             f"{(qhi - qlo if not symmetric else SYMMETRIC_INT8_MAX)} x 3.4e38): scale it first")
        scale = np.where(wide, np.maximum(scale, tiny), np.float32(1.0)).astype(np.float32)
        if not symmetric:
            rmin_t = np.asarray(rmin).astype(T)
            z = T.type(qlo) - rmin_t / scale.astype(T)
            z = np.minimum(np.maximum(z, T.type(qlo)), T.type(qhi))
            zp = np.rint(z).astype(qd)
    return scale, zp


def check_finite(bad, axis):
    if np.any(bad):
        where = "" if axis is None else f" (first in channel {int(np.flatnonzero(bad)[0])} along axis {axis})"
        raise ValueError(f"x holds NaN or inf{where}: dynamic quantization computes the scale from x's range; "
                         "pass scale= (and zero_point=) to quantize it statically")


def host_range(x3, dtype, minmax, parallel):
    """Per-channel (amax, rmin, rmax, bad) of a (O, C, I) C-contiguous host array: amax
    (max|x|) when not minmax, else rmin and rmax (min(0, min x), max(0, max x)); the other
    None."""
    it, uit, absmask, _, _ = _FINITE_BITS[np.dtype(dtype)]
    xi = x3.view(it)
    c = x3.shape[1]
    if parallel:
        tasks = KP.tasks_for(max(x3.shape))
        dim = K.split_dim(x3.shape, tasks)
        tasks = max(1, min(tasks, x3.shape[dim]))
        amax = np.zeros((tasks, c), it)
        lo = np.zeros((tasks, c), uit)
        hi = np.zeros((tasks, c), it)
        KP.run_dynamic(K.stats_parallel, tasks, xi, it(absmask), minmax, amax, lo, hi, dim)
        amax, lo, hi = amax.max(axis=0), lo.max(axis=0), hi.max(axis=0)
    else:
        amax = np.zeros(c, it)
        lo = np.zeros(c, uit)
        hi = np.zeros(c, it)
        K.stats_serial(xi, it(absmask), minmax, amax, lo, hi)
    return floats_from_bits(dtype, None if minmax else amax, lo if minmax else None, hi if minmax else None)


# ---- quantize ----------------------------------------------------------------------------

class QuantizeKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype      # x's
    size: int            # bucket of x.size
    channels: int        # bucket of C (1: one scale per tensor)
    inner: int           # bucket of I, the run of one channel's contiguous elements
    qdtype: str          # "int8" / "uint8"
    mode: str            # "symmetric" / "asymmetric" (scales computed) / "static" (given)


class QuantizeArgs(NamedTuple):
    x: object            # float array, any shape
    qdtype: np.dtype
    axis: object         # None or a normalized axis
    symmetric: bool
    scale: object        # None, or float32 (C,) given (static), or per tensor a np.float32 (given_params)
    zero_point: object   # None, or qdtype (C,) given (static), or per tensor a qdtype scalar


# A per-tensor static call's scale: a Python or numpy float (or int) below float32's max
_SCALE_NUMBERS = frozenset((float, int, np.float16, np.float32, np.float64))
_F32_MAX = float(np.finfo(np.float32).max)


def _scalar_params(qd, scale, zero_point):
    """(scale as np.float32, zero point as a qd scalar) of a per-tensor static call given
    plain numbers that _static_params would accept, else None (arrays, and anything it must
    reject: it raises).  Numbers, not arrays, so that the memo keeps them as constants and
    a repeated call skips describe (memo.py): made into arrays per call by given_params, a
    128x768 static quantize took 74 us, 55 of them in describe (one thread, Xeon with
    AVX-512, 2026-12-07)."""
    if type(scale) not in _SCALE_NUMBERS:
        return None
    try:
        s = float(scale)
    except OverflowError:         # an int beyond float64: _static_params' TypeError
        return None
    if not 0.0 < s <= _F32_MAX:   # NaN, inf, <= 0, or inf in float32
        return None
    s32 = np.float32(s)
    if not s32 > 0:               # below float32's smallest subnormal
        return None
    if zero_point is None:
        return s32, qd.type(0)
    if type(zero_point) is int:
        lo, hi = _LIMITS[qd]
        return (s32, qd.type(zero_point)) if lo <= zero_point <= hi else None
    return (s32, zero_point) if type(zero_point) is qd.type else None


def given_params(scale, zero_point, qd):
    """A static call's scale / zero point as float32 (C,) / qd (C,) arrays (each
    implementation's run starts here): _scalar_params' numbers become 1-element arrays."""
    if scale is None or type(scale) is np.ndarray:
        return scale, zero_point
    return np.full(1, scale, np.float32), np.full(1, zero_point, qd)


def _static_params(x_shape, axis, qd, scale, zero_point):
    """The given scale / zero_point as float32 (C,) / qdtype (C,) host arrays (checked), or
    for a per-tensor call given numbers, as numbers (_scalar_params)."""
    if axis is None:
        numbers = _scalar_params(qd, scale, zero_point)
        if numbers is not None:
            return numbers
    want = () if axis is None else (int(x_shape[axis]),)
    c = 1 if axis is None else want[0]
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.number, np.ndarray)):
        raise TypeError(f"scale must be a float number or a numpy float array, got {type(scale).__name__}")
    s = np.asarray(scale)
    if s.dtype.kind not in "fiu":
        raise TypeError(f"scale must be a float number or a numpy float array, got dtype {s.dtype}")
    if s.shape not in (want, (1,) if axis is None else want):
        raise ValueError(f"scale must have shape {want} for axis={axis} and x of shape {tuple(x_shape)}, "
                         f"got {s.shape}")
    s64 = s.astype(np.float64)
    with np.errstate(over="ignore"):
        s32 = s.astype(np.float32)
    if not (np.all(np.isfinite(s64)) and np.all(s64 > 0) and np.all(np.isfinite(s32)) and np.all(s32 > 0)):
        raise ValueError(f"scale must be positive and finite in float32, got {s64.ravel()[:4].tolist()}")
    if zero_point is None:
        z = np.zeros(c, qd)
    else:
        lo, hi = _LIMITS[qd]
        if isinstance(zero_point, (bool, np.bool_)):
            raise TypeError(f"zero_point must have dtype {qd}, got a bool")
        if isinstance(zero_point, int):
            if not lo <= zero_point <= hi:
                raise ValueError(f"zero_point={zero_point} is out of {qd}'s range [{lo}, {hi}]")
            z = np.asarray(zero_point, qd)
        elif isinstance(zero_point, (np.ndarray, np.generic)):
            z = np.asarray(zero_point)
            if z.dtype != qd:
                raise TypeError(f"zero_point must have dtype {qd} (the quantized type), got {z.dtype}")
        else:
            raise TypeError(f"zero_point must be a numpy {qd} array or an int, got {type(zero_point).__name__}")
        if z.shape not in (want, (1,) if axis is None else want):
            raise ValueError(f"zero_point must have scale's shape {want}, got {z.shape}")
    s32 = np.ascontiguousarray(s32.reshape(c))
    z = np.ascontiguousarray(np.asarray(z).reshape(c))
    return s32, z


def _describe_quantize(x, *, dtype="int8", axis=None, symmetric=True, scale=None, zero_point=None):
    """Call.args = QuantizeArgs, key QuantizeKey."""
    V.required(x=x)
    dev = V.device_of(x=x)
    xdt = V.float_dtype("x", x)
    qd = qdtype_of("dtype", dtype)
    if axis is not None:
        axis = V.axis("axis", axis, len(x.shape))
    symmetric = V.flag("symmetric", symmetric)
    shape = tuple(int(s) for s in x.shape)
    if scale is None:
        if zero_point is not None:
            raise ValueError("zero_point is given without scale: pass both (static quantization) or neither")
        s = z = None
        mode = "symmetric" if symmetric else "asymmetric"
    else:
        s, z = _static_params(shape, axis, qd, scale, zero_point)
        mode = "static"
    o, c, i = _channels(shape, axis)
    key = QuantizeKey("quantize", dev, xdt, size_bucket(*shape), bucket(c), bucket(i), _QNAME[qd], mode)
    return Call(key, QuantizeArgs(x, qd, axis, symmetric, s, z))


def result(values, scale, zero_point, axis):
    """The QuantizedArray of a quantize call (scale / zero_point (C,) -> () per tensor):
    scale float32 and zero_point values' dtype, both contiguous, as every path here makes
    them (QuantizedArray.of_kernel checks nothing)."""
    if axis is None:
        scale, zero_point = scale.reshape(()), zero_point.reshape(())
    return QuantizedArray.of_kernel(values, scale, zero_point, axis)


# Channels that are single contiguous rows (O == 1) of FUSE_ROW[0]..FUSE_ROW[1] elements are
# quantized by kernels_cpu.quant.fused_rows: each row's range, scale and values back to back,
# the row read from memory once.  Measured 2026-11-25 (Sapphire Rapids host, 2 cores, loaded
# by other jobs; float32 per-row int8 of 2^20 elements, cpu-serial, medians of 7 alternating
# rounds), fused / two passes in ms: rows of 16 1.195 / 1.068 (the per-row scale arithmetic
# dominates), 64 0.605 / 0.631, 768 0.473 / 0.551, 4096 0.446 / 0.540, 262144 (1 MB)
# 0.441 / 0.518; the Llama-7B weight (11008 x 4096, 180 MB, from DRAM; 6 alternating single
# calls, a heavily loaded host) medians 139 / 276 ms.  The upper bound keeps a row within a
# 2 MB L2 for its second read.
FUSE_ROW = (64, 1 << 18)


# fused_rows' constants per x dtype, as the numpy scalars it takes: (bits type, |x| mask,
# -inf's bits as unsigned, +inf's bits), made once (three scalar constructions a call)
_FUSED_BITS = {dt: (it, it(absmask), uit(negbad), it(expo))
               for dt, (it, uit, absmask, expo, negbad) in _FINITE_BITS.items()}


def _fused(x2, qd, symmetric, axis, parallel):
    """(values (C, I), scale float32 (C,), zero_point qd (C,)) of x2 (C, I) by fused_rows."""
    it, absmask, negbad, expo = _FUSED_BITS[x2.dtype]
    lo, hi = _LIMITS[qd]
    zsym = 128.0 if (symmetric and qd == np.uint8) else 0.0
    c = x2.shape[0]
    q = _arena.empty(x2.shape, qd)
    scale = np.empty(c, np.float32)
    zp = np.empty(c, np.int32)
    status = np.empty(c, np.int8)
    tasks = KP.tasks_for(c) if parallel else 1
    bits = np.zeros((tasks, 2), it)
    fbits = bits.view(x2.dtype)
    args = (x2, x2.view(it), absmask, negbad, expo, symmetric, float(lo), float(hi), zsym,
            _F32_TINY, bits, fbits, q, scale, zp, status)
    if parallel:
        KP.run_dynamic(K.fused_rows_parallel, tasks, *args)
    else:
        K.fused_rows(*args[:10], bits[0], fbits[0], *args[12:], 0, c)
    # ROW_OK is 0: one test on the common path (an item for one row: a reduction cost 1 us)
    if (status.item(0) if c == 1 else status.any()):
        check_finite(status == K.ROW_NONFINITE, axis)
        if np.any(status == K.ROW_OVERFLOW):
            raise ValueError("x's range overflows a float32 scale: scale it first")
    return q, scale, zp.astype(qd)


def _quantize_host(parallel):
    def run(params, x, qd, axis, symmetric, scale, zero_point):
        scale, zero_point = given_params(scale, zero_point, qd)
        xc = kernel_input(x)
        shape = xc.shape
        o, c, i = _channels(shape, axis)
        x3 = xc.reshape(o, c, i)
        if scale is None and o == 1 and FUSE_ROW[0] <= i <= FUSE_ROW[1]:
            q, scale, zero_point = _fused(x3[0], qd, symmetric, axis, parallel)
            return result(q.reshape(shape), scale, zero_point, axis)
        if scale is None:
            amax, rmin, rmax, bad = host_range(x3, xc.dtype, not symmetric, parallel and x3.size > 0)
            check_finite(bad, axis)
            scale, zero_point = scales_from_range(xc.dtype, qd, symmetric, amax, rmin, rmax)
        T = compute_dtype(xc.dtype)
        q = _arena.empty(shape, qd)   # large values from the result arena: no page faults per call
        if q.size:
            lo, hi = _LIMITS[qd]
            args = (x3, scale.astype(T), zero_point.astype(T), T.type(lo), T.type(hi), q.reshape(o, c, i))
            if parallel:
                tasks = KP.tasks_for(max(x3.shape))
                dim = K.split_dim(x3.shape, tasks)
                tasks = max(1, min(tasks, x3.shape[dim]))
                KP.run_dynamic(K.quantize_parallel, tasks, *args, dim)
            else:
                K.quantize_serial(*args)
        return result(q, scale, zero_point, axis)

    return run


def _q_flops(call):
    """Per element: the division, the rounding, the zero point add and two clamps (plus the
    range reduction's compares when the scale is computed)."""
    n = int(np.prod(call.args.x.shape))
    return n * (5 + (0 if call.args.scale is not None else (1 if call.args.symmetric else 3)))


def _q_bytes(call):
    """x read (twice when the scale is computed: once for the range, once to quantize),
    one byte written per element."""
    a = call.args
    n = int(np.prod(a.x.shape))
    item = V.dtype_of(a.x).itemsize
    return n * item * (1 if a.scale is not None else 2) + n


def _q_signature(i):
    return (i["x"],), {"dtype": i.get("qtype", "int8"), "axis": i.get("axis"),
                       "symmetric": i.get("symmetric", True), "scale": i.get("scale"),
                       "zero_point": i.get("zero_point")}


_quantize = register_op(Op("quantize", _describe_quantize, family="quant", bound="memory", signature=_q_signature,
                           flops=_q_flops, bytes=_q_bytes, memo=True,
                           rules={"cpu": serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)}))
_Q_NOTES = ("x seen as (O, C, I) around the axis; channels that are contiguous rows of 64..2^18 elements: each "
            "row's range, scale and values back to back (x read once); else the range per channel by integer "
            "min/max reductions on x's bits (vectorized), scales on the host, then one vectorized x / scale -> "
            "rint -> clamp pass; non-contiguous x is copied to C order first")
register(Implementation("quantize", "cpu-serial", "cpu", _quantize_host(False), kernel_modules=_KERNELS,
                        notes=_Q_NOTES))
register(Implementation("quantize", "cpu-parallel", "cpu", _quantize_host(True), kernel_modules=_KERNELS,
                        notes=_Q_NOTES + "; ranges of O, C or I over threads (partial ranges combined on the host)"))


@_quantize.expose
def quantize(x, *, dtype="int8", axis=None, symmetric=True, scale=None, zero_point=None):
    """Quantize float x to int8 / uint8 (ONNX QuantizeLinear), one scale per tensor
    (axis=None) or per slice along `axis` (per-channel); returns a QuantizedArray.

    x: float32 or float64 (float16 too on CUDA), any shape.  dtype: "int8" or "uint8".
    q = saturate(round_half_to_even(x / scale) + zero_point), the division in x's type
    (float32 for float16); NaN gives the type's lowest value.  Without scale= the scales
    come from x (dynamic): symmetric, scale = max|x| / 127 with zero point 0 (int8, values
    in [-127, 127]) or 128 (uint8); symmetric=False, ONNX DynamicQuantizeLinear's rule
    (range [min(0, min x), max(0, max x)] over the type's full range, rounded zero point).
    A slice of all zeros gets scale 1, not 0.  x with NaN or inf cannot be given a scale:
    ValueError naming x.  With scale= (a number, or shape (x.shape[axis],) per channel;
    positive, finite) and optionally zero_point= (dtype's numpy type; default 0), those are
    used (static quantization).  See dispatch/ops/quant.py for the exact rounding of the
    computed scales."""
    return _quantize(x, dtype=dtype, axis=axis, symmetric=symmetric, scale=scale, zero_point=zero_point)


# ---- dequantize --------------------------------------------------------------------------

class DequantizeKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype      # the result's
    size: int            # bucket of q's size
    channels: int        # bucket of C
    inner: int           # bucket of I
    qdtype: str


class DequantizeArgs(NamedTuple):
    values: object       # q.values (int8 / uint8)
    q: object            # the QuantizedArray (scale, zero point, caches)
    dtype: np.dtype
    out: object


def out_dtype(name, value, device):
    try:
        dt = None if value is None else np.dtype(value)  # np.dtype(None) would be float64
    except TypeError:
        dt = None
    ok = FLOAT_DTYPES + ((np.dtype(np.float16),) if device == "cuda" else ())
    if value is None or isinstance(value, (bool, np.bool_)) or dt not in ok:  # (dtype == None is True for float64)
        names = ", ".join(str(d) for d in ok)
        raise ValueError(f"{name} must be one of {names}" + ("" if device == "cuda" else " (float16: CUDA only)")
                         + f", got {value!r}")
    return dt


def _describe_dequantize(q, *, dtype=np.float32, out=None):
    """Call.args = DequantizeArgs, key DequantizeKey."""
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"q must be a QuantizedArray (from dispatch.quantize or QuantizedArray(values, scale, "
                        f"zero_point, axis)), got {type(q).__name__}")
    dev = V.device_of(**{"q.values": q.values, "out": out})
    dt = out_dtype("dtype", dtype, dev)
    shape = q.shape
    V.out(out, shape, dt, **{"q.values": q.values})
    o, c, i = _channels(shape, q.axis)
    key = DequantizeKey("dequantize", dev, dt, size_bucket(*shape), bucket(c), bucket(i),
                        _QNAME.get(q.dtype) or q.dtype.name)
    return Call(key, DequantizeArgs(q.values, q, dt, out))


def _dequantize_host(parallel):
    def run(params, values, q, dt, out):
        vc = kernel_input(values)
        shape = vc.shape
        o, c, i = _channels(shape, q.axis)
        y = result_buffer(out, shape, dt)
        if vc.size:
            scale, zp = q.cached(("host-dequant", dt), lambda: (np.ascontiguousarray(q.scale.reshape(c), dt),
                                                                np.ascontiguousarray(q.zero_point.reshape(c), dt)))
            args = (vc.reshape(o, c, i), scale, zp, y.reshape(o, c, i))
            if parallel:
                tasks = KP.tasks_for(max(o, c, i))
                dim = K.split_dim((o, c, i), tasks)
                tasks = max(1, min(tasks, (o, c, i)[dim]))
                KP.run_dynamic(K.dequantize_parallel, tasks, *args, dim)
            else:
                K.dequantize_serial(*args)
        return deliver(y, out)

    return run


def _dq_flops(call):
    """Per element: the zero point subtraction and the product."""
    return 2 * int(np.prod(call.args.values.shape))


def _dq_bytes(call):
    """One byte read, the result written."""
    n = int(np.prod(call.args.values.shape))
    return n * (1 + call.args.dtype.itemsize)


def _is_array(a):
    from ..devices import device_kind
    from ..interop import as_array

    a = as_array("values", a)   # a PyTorch CPU tensor counts as its numpy view
    return isinstance(a, np.ndarray) or device_kind(a) == "cuda"


def _dq_signature(i):
    """The benchmark inputs are q's parts (values, scale, zero_point, axis), so that the
    generic tests see (and vary: memmap, read-only, broadcast) its arrays; the call gets
    the QuantizedArray built from them.  Registry probes (dispatch.examples.names_read)
    pass placeholders, which are passed on as they are."""
    parts = (i["values"], i["scale"], i.get("zero_point"), i.get("axis"))
    kw = {"dtype": i.get("dtype", np.float32)}
    if not _is_array(parts[0]):
        return (parts,), kw
    return (QuantizedArray(*parts),), kw


def _dq_synthesize(shapes, params, rng, dtype):
    """values drawn over the quantized type's range, scales positive around 0.01, a zero
    point only when a shape is given for it; axis: the first axis of values' extent
    scale's length (scale of shape (): per tensor); the result dtype = the case's dtype."""
    qd = qdtype_of("qtype", params.get("qtype", "int8"))
    lo, hi = _LIMITS[qd]
    vshape = tuple(shapes["values"])
    sshape = tuple(shapes.get("scale", ()))
    out = {"values": rng.integers(lo, hi + 1, size=vshape, dtype=qd),
           "scale": (np.abs(rng.standard_normal(sshape)) * 0.01 + 0.001).astype(np.float32)}
    if "zero_point" in shapes:
        out["zero_point"] = rng.integers(lo, hi + 1, size=tuple(shapes["zero_point"]), dtype=qd)
    if sshape and "axis" not in params:
        out["axis"] = vshape.index(sshape[0])
    out["dtype"] = np.dtype(dtype)
    return out


_dequantize = register_op(Op("dequantize", _describe_dequantize, family="quant", bound="memory",
                             signature=_dq_signature, flops=_dq_flops, bytes=_dq_bytes, synthesize=_dq_synthesize,
                             memo=True, rules={"cpu": serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)}))
_DQ_NOTES = "one vectorized (q - zero_point) * scale pass over (O, C, I); a non-contiguous out= is filled by one copy"
register(Implementation("dequantize", "cpu-serial", "cpu", _dequantize_host(False), kernel_modules=_KERNELS,
                        notes=_DQ_NOTES))
register(Implementation("dequantize", "cpu-parallel", "cpu", _dequantize_host(True), kernel_modules=_KERNELS,
                        notes=_DQ_NOTES + "; ranges of O, C or I over threads"))


@_dequantize.expose
def dequantize(q, *, dtype=np.float32, out=None):
    """Dequantize a QuantizedArray (ONNX DequantizeLinear): (q.values - zero_point) * scale
    per tensor or per channel along q.axis, in `dtype` (float32 or float64; float16 too on
    CUDA), of q's shape.  The product is rounded once (float64: exact; float16: rounded to
    float32 first, so within one float16 ulp).  out= (q's shape,
    `dtype`, writeable, not overlapping q.values) receives the result."""
    return _dequantize(q, dtype=dtype, out=out)
