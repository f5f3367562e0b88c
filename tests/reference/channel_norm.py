"""float64 numpy references for dispatch.{batch_norm, group_norm}, same signatures.

Written from the formulas of torch.nn.functional.batch_norm (training=False) and
group_norm, with explicit broadcasting of the (C,) parameters, not from the kernels'
folded or shifted forms."""
import numpy as np

from tests.reference import activation as act

_ACT = act.BY_NAME


def _act(activation, y):
    with np.errstate(over="ignore"):  # exp(-x) of very negative x: inf, and the result 0 or -0
        return _ACT[activation](y)


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def _per_channel(p, ndim):
    """(C,) -> (1, C, 1, ..., 1) against an (N, C, *spatial) array of ndim dimensions."""
    return _f64(p).reshape((1, -1) + (1,) * (ndim - 2))


def _affine(y, weight, bias):
    if weight is not None:
        y = y * _per_channel(weight, y.ndim)
    if bias is not None:
        y = y + _per_channel(bias, y.ndim)
    return y


def batch_norm(x, running_mean, running_var, weight=None, bias=None, *, eps=1e-5, activation=None, out=None):
    x = _f64(x)
    with np.errstate(invalid="ignore"):  # a negative running_var: NaN, as PyTorch
        y = (x - _per_channel(running_mean, x.ndim)) / np.sqrt(_per_channel(running_var, x.ndim) + eps)
    return _act(activation, _affine(y, weight, bias))


def group_norm(x, num_groups, weight=None, bias=None, *, eps=1e-5, activation=None, out=None):
    x = _f64(x)
    n, c = x.shape[:2]
    blocks = x.reshape(n, num_groups, -1)
    # corrected two-pass (as the layer_norm reference): d - d.mean() puts back the rounding
    # of the mean to float64, which matters for groups with a large common offset
    with np.errstate(invalid="ignore"):  # inf - inf in groups holding an inf: NaN
        d = blocks - blocks.mean(axis=-1, keepdims=True)
        d = d - d.mean(axis=-1, keepdims=True)
        var = (d ** 2).mean(axis=-1, keepdims=True)
        y = (d / np.sqrt(var + eps)).reshape(x.shape)
    return _act(activation, _affine(y, weight, bias))
