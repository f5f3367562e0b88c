"""float64 numpy reference for dispatch.attention, same signature: the explicit
softmax(q k^T * scale + mask) v, with a query that sees no key giving zeros."""
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
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    visible = np.ones((B, Hq, Sq, Skv), bool)
    if causal:
        i = np.arange(Sq)[:, None]
        j = np.arange(Skv)[None, :]
        visible &= j <= i + (Skv - Sq)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            visible &= np.broadcast_to(mask, visible.shape)
        else:
            s = s + mask.astype(np.float64)
    s = np.where(visible, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True) if Skv else np.zeros((B, Hq, Sq, 1))
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bhjd->bhid", p, v)
    res = np.where(l > 0, o / np.where(l > 0, l, 1.0), 0.0)
    if out is not None:
        out[...] = res
        return out
    return res
