"""float64 numpy references for dispatch.quantize / dispatch.dequantize, same signatures.

Written from the ONNX definitions (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear)
and the conventions of dispatch/ops/quant.py, without its code:
    q = saturate(round_half_to_even(x / scale) + zero_point)
The quotient is the float64 quotient rounded to x's precision (float32 for float32 and
float16 x, as ONNX computes in float32): rounding the float64 quotient of two float32 values
to float32 gives the correctly rounded float32 quotient (53 >= 2 * 24 + 2), so this is bit
for bit what a float32 division gives.  NaN gives the type's lowest value.

quantize returns (values, scale float32, zero_point) with scale / zero_point of shape ()
per tensor or (x.shape[axis],); dequantize returns float64 (q - zp) * scale, exact (the
product of a 9-bit integer and a 24-bit scale fits float64), to be rounded once to the
result dtype by the caller."""
import numpy as np

QT = {"int8": (np.int8, -128, 127), "uint8": (np.uint8, 0, 255)}


def _qtype(dtype):
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return QT[name]


def _moved(x, axis):
    """x as (C, rest) with the channel axis first (C = 1 per tensor)."""
    if axis is None:
        return x.reshape(1, -1)
    return np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)


def dynamic_params(x, dtype="int8", axis=None, symmetric=True):
    """(scale float32 (C,), zero_point (C,)) of the dynamic rule, channel by channel."""
    qt, qmin, qmax = _qtype(dtype)
    x = np.asarray(x)
    T = np.float64 if x.dtype == np.float64 else np.float32
    rows = _moved(x, axis)
    scales, zps = [], []
    for r in rows:
        r64 = r.astype(np.float64)
        if r.size and not np.all(np.isfinite(r64)):
            raise ValueError("x holds NaN or inf")
        if symmetric:
            m = float(np.max(np.abs(r64))) if r.size else 0.0
            s = np.float32(m / 127.0)
            z = 128 if qt is np.uint8 else 0
            wide = m > 0
        else:
            rmin = min(0.0, float(np.min(r64))) if r.size else 0.0
            rmax = max(0.0, float(np.max(r64))) if r.size else 0.0
            d = float(T(rmax) - T(rmin))           # rounded in x's precision, as ONNX / onnxruntime
            s = np.float32(d / (qmax - qmin))
            wide = d > 0
        if not np.isfinite(s):
            raise ValueError("scale overflows float32")
        if not wide:
            s = np.float32(1.0)
        elif s < np.finfo(np.float32).tiny:
            s = np.finfo(np.float32).tiny
        if not symmetric:
            zq = T(qmin) - T(rmin) / T(s)          # in x's precision
            z = int(np.rint(min(max(zq, T(qmin)), T(qmax))))
        scales.append(s)
        zps.append(z)
    return np.array(scales, np.float32), np.array(zps, qt)


def quantize_values(x, scale, zero_point, dtype, axis):
    """saturate(rint(x / scale) + zp) with scale / zero_point (C,) along axis."""
    qt, qmin, qmax = _qtype(dtype)
    x = np.asarray(x)
    shape = [1] * x.ndim
    if axis is not None:
        shape[axis] = -1
    s = np.asarray(scale, np.float64).reshape(shape) if axis is not None else np.float64(np.asarray(scale).ravel()[0])
    z = np.asarray(zero_point, np.float64).reshape(shape) if axis is not None else np.float64(np.asarray(zero_point).ravel()[0])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        quot = x.astype(np.float64) / s
        if x.dtype != np.float64:
            quot = quot.astype(np.float32).astype(np.float64)
        t = np.rint(quot) + z
    t = np.where(np.isnan(t), qmin, t)
    return np.clip(t, qmin, qmax).astype(qt)


def quantize(x, *, dtype="int8", axis=None, symmetric=True, scale=None, zero_point=None):
    x = np.asarray(x)
    qt, _, _ = _qtype(dtype)
    if axis is not None:
        axis = axis % x.ndim
    c = 1 if axis is None else x.shape[axis]
    if scale is None:
        s, z = dynamic_params(x, dtype, axis, symmetric)
    else:
        s = np.asarray(scale, np.float32).reshape(c)
        z = np.zeros(c, qt) if zero_point is None else np.asarray(zero_point, qt).reshape(c)
    v = quantize_values(x, s, z, dtype, axis)
    if axis is None:
        s, z = s.reshape(()), z.reshape(())
    return v, s, z


# bench.peers.reference: pass float32 x as it is (the quotient's precision is x's)
quantize.takes_input_precision = True


def dequantize(q, *, dtype=np.float32, out=None):
    """float64 (values - zero_point) * scale (exact)."""
    v = np.asarray(q.values, np.float64)
    shape = [1] * v.ndim
    if q.axis is not None:
        shape[q.axis] = -1
    s = np.asarray(q.scale, np.float64).reshape(shape)
    z = np.asarray(q.zero_point, np.float64).reshape(shape)
    return (v - z) * s
