"""float64 numpy reference for dispatch.topk_softmax, same signature.

Written from the definition: softmax over the experts (float64), the k largest
probabilities by a stable sort of the logits (equal logits: the lower expert index first),
renormalized to sum 1 when asked.  A row holding NaN or +inf, or only -inf, gives NaN
weights and indices 0..k-1 (the documented convention)."""
import numpy as np


def topk_softmax(logits, k, *, renormalize=True):
    x = np.asarray(logits, dtype=np.float64)
    t = x.shape[0]
    weights = np.full((t, k), np.nan)
    indices = np.tile(np.arange(k, dtype=np.int64), (t, 1))
    for r in range(t):
        row = x[r]
        m = row.max()
        if np.isnan(row).any() or not np.isfinite(m):
            continue
        p = np.exp(row - m)
        p /= p.sum()
        order = np.argsort(-row, kind="stable")[:k]
        indices[r] = order
        weights[r] = p[order] / p[order].sum() if renormalize else p[order]
    return weights, indices
