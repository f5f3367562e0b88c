"""float64 numpy references for dispatch.matmul and dispatch.linear, same signatures."""
import numpy as np

from tests.reference import activation as act

_ACT = act.BY_NAME


def matmul(a, b, *, bias=None, activation=None):
    y = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return _ACT[activation](y)


def linear(x, weight, bias=None, *, activation=None):
    if not (isinstance(weight, np.ndarray) and weight.dtype.kind == "f"):  # bfloat16, QuantizedArray
        from tests.reference.weight_only import dequantize
        weight = dequantize(weight)
    return matmul(x, np.asarray(weight, np.float64).T, bias=bias, activation=activation)
