"""float64 numpy references for dispatch.{layer_norm_backward, rms_norm_backward}, same
signatures: the analytic gradients of tests/reference/norm.py's forwards.

With xhat the normalized row, rstd = 1 / sqrt(var + eps) (layer_norm) or
1 / sqrt(mean(x^2) + eps) (rms_norm), g = grad_out * weight:
    layer_norm  dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    rms_norm    dx = rstd * (g - xhat * mean(g * xhat))
    dweight = sum over rows of grad_out * xhat,  dbias = sum over rows of grad_out,
plus grad_residual added to dx.  tests/test_norm_grad.py checks these against PyTorch
autograd of the forward compositions."""
import numpy as np


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def _rows_sum(a, d):
    return a.reshape(-1, d).sum(axis=0)


def layer_norm_backward(grad_out, x, weight=None, bias=None, *, eps=1e-5, grad_residual=None):
    go, h = _f64(grad_out), _f64(x)
    d = h.shape[-1]
    c = h - h.mean(axis=-1, keepdims=True)
    c = c - c.mean(axis=-1, keepdims=True)  # corrected two-pass, as tests/reference/norm.py
    rstd = 1.0 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)
    xhat = c * rstd
    g = go if weight is None else go * _f64(weight)
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    if grad_residual is not None:
        dx = dx + _f64(grad_residual)
    dw = None if weight is None else _rows_sum(go * xhat, d)
    db = None if bias is None else _rows_sum(go, d)
    return dx, dw, db


def rms_norm_backward(grad_out, x, weight=None, *, eps=1e-6, grad_residual=None):
    go, h = _f64(grad_out), _f64(x)
    d = h.shape[-1]
    rstd = 1.0 / np.sqrt((h * h).mean(axis=-1, keepdims=True) + eps)
    xhat = h * rstd
    g = go if weight is None else go * _f64(weight)
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    if grad_residual is not None:
        dx = dx + _f64(grad_residual)
    dw = None if weight is None else _rows_sum(go * xhat, d)
    return dx, dw
