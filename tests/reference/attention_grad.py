"""float64 numpy references for attention's backward (dispatch.attention_backward) and the
forward's row log-sum-exp (dispatch.attention(return_lse=True)): the naive formulas on the
whole (Sq, Skv) score matrix.

Scores s = q k^T * scale + mask (bool False: -inf), keys past the causal limit (query i
sees j <= i + Skv - Sq) removed; lse = log sum_j exp(s_ij) over the keys a row sees (-inf
when it sees none).  Backward, from the forward's out O and lse:
    P = exp(s - lse) at the keys the row sees, 0 elsewhere
    dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D) (0 where P is unseen)
    dQ = scale dS K, dK = scale dS^T Q
with dK, dV summed over the query heads of each kv head's group (GQA).  A row that sees no
key (its output zeros) contributes nothing; NaN follows IEEE arithmetic through these
formulas (tests/test_attention_grad.py states where the kernels' tiling may differ)."""
import math

import numpy as np


def _scores(q, k, causal, mask, scale):
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    kk = np.repeat(k, Hq // Hkv, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum("bhid,bhjd->bhij", q, kk) * scale
        if mask is not None:
            mask = np.asarray(mask)
            s = s + (np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask.astype(np.float64))
        if causal:
            i = np.arange(Sq)[:, None]
            j = np.arange(Skv)[None, :]
            s = np.where(j <= i + (Skv - Sq), s, -np.inf)
    return np.broadcast_to(s, (B, Hq, Sq, Skv))


def _f64(*arrays):
    return tuple(None if a is None else np.asarray(a, dtype=np.float64) for a in arrays)


def attention_lse(q, k, v, *, causal=False, mask=None, scale=None):
    """The (B, Hq, Sq) log-sum-exp of each row's scores (what return_lse=True returns)."""
    q, k = _f64(q, k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = _scores(q, k, causal, mask, scale)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(s, axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf)
        m = np.where(m == -np.inf, 0.0, m)  # +inf max: exp(inf - inf) = NaN, as the kernels
        seen = s != -np.inf
        tot = np.where(seen, np.exp(s - m), 0.0).sum(axis=-1)
        return m[..., 0] + np.log(tot)


def attention_backward(grad_out, q, k, v, out, lse, *, causal=False, mask=None, scale=None):
    """(dq, dk, dv) in float64."""
    g, q, k, v, o, lse = _f64(grad_out, q, k, v, out, lse)
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    s = _scores(q, k, causal, mask, scale)
    kk, vv = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        seen = s != -np.inf
        lz = np.where(lse == -np.inf, np.inf, lse)[..., None]
        p = np.where(seen, np.exp(s - lz), 0.0)
        dv = np.einsum("bhij,bhid->bhjd", p, g)
        dp = np.einsum("bhid,bhjd->bhij", g, vv)
        di = np.sum(g * o, axis=-1, keepdims=True)
        ds = np.where(seen, p * (dp - di), 0.0)
        dq = scale * np.einsum("bhij,bhjd->bhid", ds, kk)
        dk = scale * np.einsum("bhij,bhid->bhjd", ds, q)
    def group_sum(x):
        return x.reshape(B, Hkv, G, *x.shape[2:]).sum(axis=2)
    return dq, group_sum(dk), group_sum(dv)
