"""Peers of rope_backward (see bench/peer_ops/__init__.py for the tables).

- PyTorch: what autograd's backward of the rotate-half composition torch.cat([x1 c - x2 s,
  x2 c + x1 s]) computes (bench/peers.py's rope peer): the gradient split at D/2, each half
  multiplied by the tables and summed, (g1 c + g2 s, g2 c - g1 s); interleaved pairs through
  strided views.
- numpy: the same formula.
"""
from __future__ import annotations

import numpy as np


def _np(i):
    g, c, s = i["grad_out"], i["cos"], i["sin"]
    out = np.empty_like(g)
    if i.get("interleaved", False):
        a, b = g[..., 0::2], g[..., 1::2]
        out[..., 0::2] = a * c + b * s
        out[..., 1::2] = b * c - a * s
    else:
        h = g.shape[-1] // 2
        a, b = g[..., :h], g[..., h:]
        out[..., :h] = a * c + b * s
        out[..., h:] = b * c - a * s
    return out


def _torch(t, torch):
    g, c, s = t["grad_out"], t["cos"], t["sin"]
    if t.get("interleaved", False):
        a, b = g[..., 0::2], g[..., 1::2]
        return torch.stack([a * c + b * s, b * c - a * s], dim=-1).flatten(-2)
    h = g.shape[-1] // 2
    a, b = g[..., :h], g[..., h:]
    return torch.cat([a * c + b * s, b * c - a * s], dim=-1)


NUMPY = {"rope_backward": _np}
TORCH = {"rope_backward": _torch}
