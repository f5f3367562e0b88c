"""float64 numpy references for dispatch.{softmax, log_softmax, cross_entropy}, same signatures.

Non-finite rows follow the documented behaviour: -inf entries give 0 (log: -inf); a row that
is all -inf, or holds +inf or NaN, gives NaN (as PyTorch)."""
import numpy as np


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def log_softmax(x, axis=-1, *, out=None):
    x = _f64(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        bad = ~np.isfinite(m) | np.isnan(x).any(axis=axis, keepdims=True)
        m = np.where(bad, 0.0, m)
        d = x - m
        y = d - np.log(np.sum(np.exp(d), axis=axis, keepdims=True))
    return np.where(bad, np.nan, y)


def softmax(x, axis=-1, *, out=None):
    x = _f64(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        bad = ~np.isfinite(m) | np.isnan(x).any(axis=axis, keepdims=True)
        e = np.exp(x - np.where(bad, 0.0, m))
        y = e / np.sum(e, axis=axis, keepdims=True)
    return np.where(bad, np.nan, y)


def cross_entropy(logits, targets, *, reduction="mean", ignore_index=-100):
    lp = log_softmax(logits, axis=-1)
    t = np.asarray(targets).astype(np.int64)
    keep = t != ignore_index
    losses = np.zeros(lp.shape[0])
    rows = np.nonzero(keep)[0]
    losses[rows] = -lp[rows, t[rows]]
    if reduction == "none":
        return losses
    if reduction == "sum":
        return np.float64(losses.sum())
    with np.errstate(invalid="ignore"):
        return np.float64(losses.sum() / keep.sum()) if keep.sum() else np.float64(np.nan)
