"""float64 numpy references for dispatch.{relu, silu, gelu, swiglu, geglu}_backward, same
signatures: the analytic derivatives (PyTorch's formulas; tests/test_activation_grad.py
checks them against PyTorch autograd of tests/reference/activation.py's forwards).

Written without cancellation or overflow (sigmoid and 1 - sigmoid each from exp(-|v|); the
multiplicative factors take x clamped to +-1e4, where every derivative has reached its limit),
so +-inf give the limits 0 and 1 and NaN gives NaN, as the kernels do."""
import math

import numpy as np

_erfc = np.frompyfunc(math.erfc, 1, 1)
_CLAMP = 1.0e4
_C2 = 2.0 * math.sqrt(2.0 / math.pi)
_K = 0.044715


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def _sigmoid_pair(v):
    """(sigmoid(v), 1 - sigmoid(v)), both to full relative accuracy."""
    with np.errstate(invalid="ignore"):
        e = np.exp(-np.abs(v))
        r = 1.0 / (1.0 + e)
        pos = v >= 0
        return np.where(pos, r, e * r), np.where(pos, e * r, r)


def _keep_nan(x, d):
    return np.where(np.isnan(x), np.nan, d)


def _act_and_derivative(x, kind):
    x = _f64(x)
    xc = np.clip(x, -_CLAMP, _CLAMP)
    with np.errstate(invalid="ignore", over="ignore"):
        if kind == "silu":
            s, sc = _sigmoid_pair(x)
            return x * s, _keep_nan(x, s * (1.0 + xc * sc))
        if kind == "gelu":
            cdf = 0.5 * _erfc(-x / math.sqrt(2.0)).astype(np.float64)
            pdf = np.exp(-0.5 * xc * xc) / math.sqrt(2.0 * math.pi)
            return x * cdf, _keep_nan(x, cdf + xc * pdf)
        if kind == "gelu_tanh":
            v = _C2 * (xc + _K * xc**3)
            s, sc = _sigmoid_pair(v)
            dv = _C2 * (1.0 + 3.0 * _K * xc * xc)
            return x * s, _keep_nan(x, s * (1.0 + xc * sc * dv))
    raise ValueError(kind)


def _gelu_kind(approximate):
    return "gelu_tanh" if approximate == "tanh" else "gelu"


def relu_backward(grad_out, x, *, out=None):
    g, x = _f64(grad_out), _f64(x)
    return np.where(x > 0, g, np.where(x <= 0, 0.0, np.nan))


def silu_backward(grad_out, x, *, out=None):
    return _f64(grad_out) * _act_and_derivative(x, "silu")[1]


def gelu_backward(grad_out, x, approximate="none", *, out=None):
    return _f64(grad_out) * _act_and_derivative(x, _gelu_kind(approximate))[1]


def _gated(grad_out, gate, up, kind):
    g, up = _f64(grad_out), _f64(up)
    a, d = _act_and_derivative(gate, kind)
    return g * up * d, g * a


def swiglu_backward(grad_out, gate, up):
    return _gated(grad_out, gate, up, "silu")


def geglu_backward(grad_out, gate, up, approximate="none"):
    return _gated(grad_out, gate, up, _gelu_kind(approximate))
