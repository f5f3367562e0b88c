"""float64 numpy references for dispatch.linear_backward and dispatch.matmul_backward, same
signatures: g' = grad_out * act'(pre) (tests/reference/activation_grad.py's derivatives), then
the two products and the column sums, the broadcast batch dims summed away as PyTorch's
autograd does.  tests/test_linalg_grad.py checks them against torch autograd of
tests/reference/linalg.py's forwards."""
import numpy as np

from tests.reference import activation_grad as ag

_BACKWARD = {"relu": ag.relu_backward, "silu": ag.silu_backward, "gelu": ag.gelu_backward,
             "gelu_tanh": lambda g, x: ag.gelu_backward(g, x, approximate="tanh")}


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def grad_pre(grad_out, pre, activation):
    """g' = dL/dpre."""
    if activation is None:
        return _f64(grad_out)
    return _BACKWARD[activation](_f64(grad_out), _f64(pre))


def _reduce_to(full, shape):
    """Sum full (B..., R, C) down to the batch shape of an operand of shape `shape`."""
    lead = full.ndim - len(shape)
    out = full.sum(axis=tuple(range(lead))) if lead else full
    axes = tuple(i for i, s in enumerate(shape[:-2]) if s == 1 and out.shape[i] != 1)
    return out.sum(axis=axes, keepdims=True) if axes else out


def linear_backward(grad_out, x, weight, pre=None, *, activation=None, has_bias=False):
    gp = grad_pre(grad_out, pre, activation)
    n, k = np.shape(weight)
    g2 = gp.reshape(-1, n)
    dx = (g2 @ _f64(weight)).reshape(np.shape(x))
    dw = g2.T @ _f64(x).reshape(-1, k)
    return dx, dw, (g2.sum(axis=0) if has_bias else None)


def matmul_backward(grad_out, a, b, pre=None, *, activation=None, has_bias=False):
    gp = grad_pre(grad_out, pre, activation)
    a, b = _f64(a), _f64(b)
    da = _reduce_to(np.matmul(gp, np.swapaxes(b, -1, -2)), a.shape).reshape(a.shape)
    db = _reduce_to(np.matmul(np.swapaxes(a, -1, -2), gp), b.shape).reshape(b.shape)
    return da, db, (gp.reshape(-1, gp.shape[-1]).sum(axis=0) if has_bias else None)
