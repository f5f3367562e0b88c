"""float64 numpy references for dispatch.{relu, silu, gelu, swiglu, geglu}, same signatures."""
import math

import numpy as np

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def relu(x):
    return np.maximum(_f64(x), 0.0)


def silu(x):
    x = _f64(x)
    return x / (1.0 + np.exp(-x))


def gelu(x, approximate="none"):
    x = _f64(x)
    if approximate == "tanh":
        u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        # 0.5 x (1 + tanh u) written as x * sigmoid(2u): no cancellation for x << 0
        return x / (1.0 + np.exp(-2.0 * u))
    return 0.5 * x * _erfc(-x / math.sqrt(2.0)).astype(np.float64)


def swiglu(gate, up):
    return silu(gate) * _f64(up)


def geglu(gate, up, approximate="none"):
    return gelu(gate, approximate) * _f64(up)


# The `activation=` names of the fused epilogues (matmul, linear, conv2d, the norms, the int8
# and MoE GEMMs) -> their float64 reference.
BY_NAME = {
    None: lambda y: y,
    "relu": relu,
    "gelu": gelu,
    "gelu_tanh": lambda y: gelu(y, approximate="tanh"),
    "silu": silu,
}
