"""float64 numpy references (analytic formulas) for the softmax-family backward ops, same
signatures as dispatch.{softmax_backward, log_softmax_backward, cross_entropy_with_grad,
cross_entropy_backward}."""
import numpy as np

from . import softmax as fwd


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def softmax_backward(grad_out, y, axis=-1, *, out=None):
    g, y = _f64(grad_out), _f64(y)
    return y * (g - np.sum(g * y, axis=axis, keepdims=True))


def log_softmax_backward(grad_out, y, axis=-1, *, out=None):
    g, y = _f64(grad_out), _f64(y)
    return g - np.exp(y) * np.sum(g, axis=axis, keepdims=True)


def _scales(targets, reduction, ignore_index, grad_loss):
    """Per-row multiplier of (softmax - onehot): 0 for ignored rows."""
    t = np.asarray(targets).astype(np.int64)
    keep = t != ignore_index
    n_keep = int(keep.sum())
    if reduction == "none":
        g = np.ones(t.shape[0]) if grad_loss is None else _f64(grad_loss).reshape(-1)
    else:
        g = np.full(t.shape[0], 1.0 if grad_loss is None else _f64(grad_loss).reshape(-1)[0])
        if reduction == "mean" and n_keep:
            g = g / n_keep
    return np.where(keep, g, 0.0), t, keep


def _grad(logits, targets, reduction, ignore_index, grad_loss):
    p = fwd.softmax(logits, axis=-1)
    sc, t, keep = _scales(targets, reduction, ignore_index, grad_loss)
    d = p.copy()
    rows = np.nonzero(keep)[0]
    d[rows, t[rows]] -= 1.0
    with np.errstate(invalid="ignore"):
        d = d * sc[:, None]
    d[~keep] = 0.0  # ignored rows: 0 even for non-finite logits or upstream gradients
    return d


def cross_entropy_with_grad(logits, targets, *, reduction="mean", ignore_index=-100, grad_out=None):
    loss = fwd.cross_entropy(logits, targets, reduction=reduction, ignore_index=ignore_index)
    return loss, _grad(logits, targets, reduction, ignore_index, None)


def cross_entropy_backward(grad_loss, logits, targets, *, reduction="mean", ignore_index=-100):
    return _grad(logits, targets, reduction, ignore_index, grad_loss)
