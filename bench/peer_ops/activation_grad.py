"""Peers of the activation backward ops (see bench/peer_ops/__init__.py for the tables).

- PyTorch: the aten backward kernels autograd runs: threshold_backward (relu), silu_backward,
  gelu_backward (approximate="none" / "tanh"); for swiglu / geglu (act(gate) * up) the two
  gradients autograd's backward of that composition computes, dgate = act_backward(g * up,
  gate) and dup = g * act(gate), with act(gate) computed here (autograd would have saved it
  from the forward; this op receives only grad_out, gate and up, and recomputes it too).
- numpy: the formulas where numpy has the functions (no erf: no gelu / geglu peer); dgate
  only for swiglu.
The report compares the first result (dgate) of the gated ops.
"""
from __future__ import annotations

import numpy as np


def _np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_silu_backward(i):
    x, g = i["x"], i["grad_out"]
    s = _np_sigmoid(x)
    return g * s * (1 + x * (1 - s))


def _np_swiglu_backward(i):
    """dgate only: the report compares the first gradient (dup = g * gate * s costs one pass more)."""
    gate, up, g = i["gate"], i["up"], i["grad_out"]
    s = _np_sigmoid(gate)
    return g * up * s * (1 + gate * (1 - s))


NUMPY = {
    "relu_backward": lambda i: np.where(i["x"] > 0, i["grad_out"], 0).astype(i["x"].dtype),
    "silu_backward": _np_silu_backward,
    "swiglu_backward": _np_swiglu_backward,
}


def _approx(t):
    return t.get("approximate", "none")


def _torch_gated(act, act_backward):
    def run(t, torch):
        g, gate, up = t["grad_out"], t["gate"], t["up"]
        return act_backward(torch, g * up, gate, t), g * act(torch, gate, t)

    return run


def _silu(torch, x, t):
    return torch.nn.functional.silu(x)


def _silu_bw(torch, g, x, t):
    return torch.ops.aten.silu_backward(g, x)


def _gelu(torch, x, t):
    return torch.nn.functional.gelu(x, approximate=_approx(t))


def _gelu_bw(torch, g, x, t):
    return torch.ops.aten.gelu_backward(g, x, approximate=_approx(t))


def _first(run):
    """The report compares one array: the first gradient (dgate)."""
    return lambda t, torch: run(t, torch)[0]


TORCH = {
    "relu_backward": lambda t, torch: torch.ops.aten.threshold_backward(t["grad_out"], t["x"], 0),
    "silu_backward": lambda t, torch: torch.ops.aten.silu_backward(t["grad_out"], t["x"]),
    "gelu_backward": lambda t, torch: torch.ops.aten.gelu_backward(t["grad_out"], t["x"], approximate=_approx(t)),
    "swiglu_backward": _first(_torch_gated(_silu, _silu_bw)),
    "geglu_backward": _first(_torch_gated(_gelu, _gelu_bw)),
}
