"""float64 numpy reference for dispatch.attention, same signature: the explicit
softmax(q k^T * scale + mask) v, with a query that sees no key giving zeros.

Non-finite values follow IEEE arithmetic on the scores, as PyTorch's
scaled_dot_product_attention does: a row whose scores include NaN (NaN in q, k or an
additive mask) or +inf (exp(inf - inf)) is NaN.  A mask is added to the scores: -inf
(or bool False, which PyTorch turns into an additive -inf) masks the key out, but
NaN + -inf is still NaN.  Keys past the causal limit are removed before the scores are
looked at (as PyTorch's default CPU kernel; its math kernel adds -inf there too).  A row
whose every score is -inf sees no key: zeros (PyTorch 2.13 agrees).  NaN in V reaches
out[i, d] through every key the row sees (0 * NaN when p underflows); for keys a row
cannot see the kernels may or may not propagate it (0 * NaN in their P V products, as
in PyTorch), so tests put it on keys every row sees."""
import math

import numpy as np


def attention(q, k, v, *, causal=False, mask=None, scale=None, out=None):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    k = np.repeat(k, G, axis=1)
    v = np.repeat(v, G, axis=1)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum("bhid,bhjd->bhij", q, k) * scale
        visible = np.ones((B, Hq, Sq, Skv), bool)
        if causal:
            i = np.arange(Sq)[:, None]
            j = np.arange(Skv)[None, :]
            visible &= j <= i + (Skv - Sq)
        if mask is not None:
            mask = np.asarray(mask)
            if mask.dtype == np.bool_:
                s = s + np.where(mask, 0.0, -np.inf)
            else:
                s = s + mask.astype(np.float64)
        s = np.where(visible, s, -np.inf)
        seen = s != -np.inf  # keys that take part (NaN included)
        # np.max propagates NaN; a +inf max gives exp(inf - inf) = NaN for the +inf keys
        m = np.max(s, axis=-1, keepdims=True) if Skv else np.zeros((B, Hq, Sq, 1))
        m = np.where(m == -np.inf, 0.0, m)
        p = np.where(seen, np.exp(s - m), 0.0)
        l = p.sum(axis=-1, keepdims=True)
        if np.isfinite(v).all():
            o = np.einsum("bhij,bhjd->bhid", p, v)
        else:  # only the keys a row sees reach it (no 0 * NaN from the others)
            o = np.where(seen[..., None], p[..., None] * v[:, :, None], 0.0).sum(axis=-2)
        res = np.where(l == 0, 0.0, o / np.where(l == 0, 1.0, l))
    if out is not None:
        out[...] = res
        return out
    return res
