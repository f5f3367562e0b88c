"""float64 references for linear with a low-precision weight (dispatch/ops/weight_only.py):
the weight dequantized exactly, then the float64 linear."""
import numpy as np

from tests.reference import linalg as ref


def dequantize(weight) -> np.ndarray:
    """The float64 values of a float16 / ml_dtypes.bfloat16 array or an int8 QuantizedArray
    ((q - zero_point) * scale along its axis, or one scale for the tensor)."""
    if hasattr(weight, "scale") and hasattr(weight, "values"):
        q = np.asarray(weight.values if isinstance(weight.values, np.ndarray) else weight.values.copy_to_host(),
                       np.float64)
        sc = np.asarray(weight.scale, np.float64)
        zp = np.asarray(weight.zero_point, np.float64)
        if weight.axis is not None:
            shape = [1] * q.ndim
            shape[weight.axis] = -1
            sc, zp = sc.reshape(shape), zp.reshape(shape)
        return (q - zp) * sc
    w = np.asarray(weight)
    if w.dtype.name == "bfloat16":
        bits = np.ascontiguousarray(w).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return w.astype(np.float64)


def linear(x, weight, bias=None, *, activation=None):
    return ref.linear(np.asarray(x, np.float64), dequantize(weight), bias, activation=activation)
