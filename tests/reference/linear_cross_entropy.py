"""float64 numpy references for linear_cross_entropy(_with_grad), same signatures: the full
logits (what the op avoids), then the loss and d(loss)/d(x, weight, bias)."""
import numpy as np


def _parts(x, weight, targets, bias, ignore_index):
    x, w = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    z = x @ w.T + (0 if bias is None else np.asarray(bias, np.float64))
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    t = np.asarray(targets)
    keep = t != ignore_index
    tt = np.where(keep, t, 0)
    rows = np.arange(len(t))
    losses = np.where(keep, lse - z[rows, tt], 0.0)
    g = np.exp(z - lse[:, None])
    g[rows, tt] -= 1
    g[~keep] = 0
    return x, w, losses, g, keep


def linear_cross_entropy(x, weight, targets, bias=None, *, reduction="mean", ignore_index=-100):
    _, _, losses, _, keep = _parts(x, weight, targets, bias, ignore_index)
    if reduction == "none":
        return losses
    total = losses.sum()
    return np.asarray(total / keep.sum() if reduction == "mean" else total)


def linear_cross_entropy_with_grad(x, weight, targets, bias=None, *, reduction="mean", ignore_index=-100):
    x, w, losses, g, keep = _parts(x, weight, targets, bias, ignore_index)
    scale = 1.0 / keep.sum() if reduction == "mean" else 1.0
    g *= scale
    return (np.asarray(losses.sum() * scale), g @ w, g.T @ x, None if bias is None else g.sum(axis=0))
