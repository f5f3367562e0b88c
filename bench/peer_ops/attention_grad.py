"""Peers of attention_backward (see bench/peer_ops/__init__.py for the tables).

- PyTorch: aten's CPU flash-attention backward, the kernel torch's autograd of
  F.scaled_dot_product_attention runs on the CPU (_scaled_dot_product_flash_attention_for_cpu
  _backward), given the same grad_out, q, k, v, output and lse (its logsumexp is the same natural
  log of the row sums: checked to 2e-7 against ours).  Its causal mask is top-left aligned, so
  for Sq != Skv causal, or GQA, autograd of the explicit composition instead.
- numpy: the naive formulas on the whole score matrix (what a numpy user writes).
"""
from __future__ import annotations

import math

import numpy as np


def _np(i):
    q, k, v, g, o, lse = i["q"], i["k"], i["v"], i["grad_out"], i["output"], i["lse"]
    causal = i.get("causal", False)
    G = q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    scale = q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    s = (q @ np.swapaxes(kk, -1, -2)) * scale
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        s = np.where(np.triu(np.ones((sq, sk), bool), k=sk - sq + 1), -np.inf, s)
    p = np.exp(s - lse[..., None])
    dv = np.swapaxes(p, -1, -2) @ g
    ds = p * (g @ np.swapaxes(vv, -1, -2) - (g * o).sum(-1, keepdims=True))
    dq = (ds @ kk) * scale
    dk = (np.swapaxes(ds, -1, -2) @ q) * scale
    B, Hkv = k.shape[:2]
    return dq, dk.reshape(B, Hkv, G, *dk.shape[2:]).sum(2), dv.reshape(B, Hkv, G, *dv.shape[2:]).sum(2)


def _torch(t, torch):
    q, k, v, g, o, lse = t["q"], t["k"], t["v"], t["grad_out"], t["output"], t["lse"]
    causal = bool(t.get("causal", False))
    sq, sk = q.shape[-2], k.shape[-2]
    if q.shape[1] == k.shape[1] and (not causal or sq == sk):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, o, lse, 0.0, causal)[:3]
    G = q.shape[1] // k.shape[1]
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    mask = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq) if causal else None
    y = torch.nn.functional.scaled_dot_product_attention(qq, kk.repeat_interleave(G, 1), vv.repeat_interleave(G, 1),
                                                         attn_mask=mask)
    return torch.autograd.grad(y, (qq, kk, vv), g)


NUMPY = {"attention_backward": _np}
TORCH = {"attention_backward": _torch}
