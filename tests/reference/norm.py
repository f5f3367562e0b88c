"""float64 numpy references for dispatch.{layer_norm, rms_norm}, same signatures."""
import numpy as np


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def layer_norm(x, weight=None, bias=None, *, eps=1e-5, residual=None, out=None):
    h = _f64(x) if residual is None else _f64(x) + _f64(residual)
    # corrected two-pass: d - d.mean() puts back the rounding of the mean to float64
    # (half an ulp of 3e5 is 2.9e-11, more than the 1e-12 tolerance of float64 rows with
    # a large common offset)
    d = h - h.mean(axis=-1, keepdims=True)
    d = d - d.mean(axis=-1, keepdims=True)
    var = (d ** 2).mean(axis=-1, keepdims=True)
    y = d / np.sqrt(var + eps)
    if weight is not None:
        y = y * _f64(weight)
    if bias is not None:
        y = y + _f64(bias)
    return y if residual is None else (y, h)


def rms_norm(x, weight=None, *, eps=1e-6, residual=None, out=None):
    h = _f64(x) if residual is None else _f64(x) + _f64(residual)
    y = h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * _f64(weight)
    return y if residual is None else (y, h)
