"""float64 numpy references for dispatch.matmul_int8 and dispatch.dynamic_quant_linear (same
signatures), and a local numpy quantizer (independent of dispatch.quantize) for building
QuantizedArray test inputs."""
import numpy as np

from dispatch.quantized import QuantizedArray
from tests.reference import activation as act

_ACT = act.BY_NAME


def dequantize(q: QuantizedArray) -> np.ndarray:
    """float64 (values - zero_point) * scale, exactly (8-bit integers times float32 scales)."""
    v = np.asarray(q.values).astype(np.float64)
    s = q.scale.astype(np.float64)
    z = q.zero_point.astype(np.float64)
    if q.axis is not None:
        shape = [1] * q.ndim
        shape[q.axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return (v - z) * s


def quantize(x, dtype=np.int8, axis=None, symmetric=True):
    """A QuantizedArray of float x: per tensor (axis None) or one scale per slice along axis;
    symmetric int8 uses [-127, 127], otherwise the full range with a zero point."""
    x = np.asarray(x, np.float64)
    lo_t, hi_t = (-128, 127) if np.dtype(dtype) == np.int8 else (0, 255)
    red = None if axis is None else tuple(i for i in range(x.ndim) if i != axis % x.ndim)
    if symmetric:
        hi_t = 127 if np.dtype(dtype) == np.int8 else 255
        amax = np.max(np.abs(x), axis=red)
        scale = np.where(amax > 0, amax / hi_t, 1.0).astype(np.float32)
        zp = np.zeros(np.shape(scale), dtype)
    else:
        lo = np.minimum(np.min(x, axis=red), 0)
        hi = np.maximum(np.max(x, axis=red), 0)
        scale = np.where(hi > lo, (hi - lo) / (hi_t - lo_t), 1.0).astype(np.float32)
        zp = np.clip(np.rint(lo_t - lo / scale), lo_t, hi_t).astype(dtype)
    s64, z64 = scale.astype(np.float64), zp.astype(np.float64)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis % x.ndim] = -1
        s64, z64 = s64.reshape(shape), z64.reshape(shape)
    q = np.clip(np.rint(x / s64) + z64, lo_t, hi_t).astype(dtype)
    return QuantizedArray(q, scale, zp, axis=axis)


def quantize_rows_dynamic(x):
    """dynamic_quant_linear's quantization of x (M, K) float32, reproduced in float32 numpy:
    per row, ONNX DynamicQuantizeLinear's uint8 formulas (round half to even); a row of
    zeros gets scale 1, zp 0.  Returns (q uint8 (M, K), scale float32 (M,), zp uint8 (M,))."""
    x = np.asarray(x, np.float32)
    f = np.float32
    lo = np.minimum(x.min(axis=1), f(0)).astype(np.float32)
    hi = np.maximum(x.max(axis=1), f(0)).astype(np.float32)
    scale = ((hi - lo) / f(255)).astype(np.float32)
    scale = np.where(scale > 0, scale, f(1)).astype(np.float32)
    zp = np.clip(np.rint((f(0) - lo / scale).astype(np.float32)), f(0), f(255)).astype(np.float32)
    q = np.clip(np.rint((x / scale[:, None]).astype(np.float32)) + zp[:, None], f(0), f(255))
    return q.astype(np.uint8), scale, zp.astype(np.uint8)


def exact_product(a_q: QuantizedArray, b_q: QuantizedArray) -> np.ndarray:
    """float64 dequantize(a) @ dequantize(b), the integer sum taken exactly (int64) and then
    scaled: (sa * sb) * X in float64, one rounding (the scale product is exact)."""
    av = np.asarray(a_q.values).astype(np.int64)
    bv = np.asarray(b_q.values).astype(np.int64)
    za = a_q.zero_point.astype(np.int64)
    sa = a_q.scale.astype(np.float64)
    if a_q.axis is not None:
        za, sa = za[:, None], sa[:, None]
    zb = b_q.zero_point.astype(np.int64)
    sb = b_q.scale.astype(np.float64)
    x = np.matmul(av - za, bv - zb)
    return (sa * sb) * x.astype(np.float64)


def matmul_int8(a_q, b_q, *, bias=None, activation=None, out_dtype=np.float32):
    y = exact_product(a_q, b_q)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return _ACT[activation](y)


def dynamic_quant_linear(x, w_q, bias=None, *, activation=None):
    """The float64 product of the same per-row quantization of x (quantize_rows_dynamic)
    with the weight, exact, + bias, then the activation."""
    x = np.asarray(x, np.float32)
    lead, k = x.shape[:-1], x.shape[-1]
    q, s, z = quantize_rows_dynamic(x.reshape(-1, k))
    a_q = QuantizedArray(q, s, z, axis=0)
    wv = np.asarray(w_q.values)
    b_q = QuantizedArray(np.ascontiguousarray(wv.T), w_q.scale, w_q.zero_point,
                         axis=None if w_q.axis is None else 1)
    y = exact_product(a_q, b_q)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return _ACT[activation](y).reshape(lead + (wv.shape[0],))
