"""Peers of causal_conv1d and causal_conv1d_update (see bench/peer_ops/__init__.py).

The prefill as its users write it without the causal-conv1d package: a grouped conv1d
padded by W - 1 on both sides and cut to L (PyTorch: mamba-ssm's fallback path;
onnxruntime: Conv with group = dim and pads (W - 1, 0), then Sigmoid * Mul); numpy: one
multiply-add of a shifted, left-padded x per tap.  The decode step as mamba-ssm's
Mamba.step writes it without the package (its conv_state holds W values): roll the state
left, put x last, sum state * weight over the taps, add the bias, SiLU.  No onnxruntime
decode step (a model cannot update its input in place)."""
import numpy as np

from ..peers import _ACT, Unavailable, _ort_act


def _act(i):
    a = i.get("activation")
    return "silu" if a == "swish" else a


def _numpy_conv(i):
    x, w, b = i["x"], i["weight"], i.get("bias")
    n, width = x.shape[-1], w.shape[1]
    xp = np.pad(x, ((0, 0), (0, 0), (width - 1, 0)))
    y = sum(w[None, :, k, None] * xp[..., k:k + n] for k in range(width))
    if b is not None:
        y = y + b[None, :, None]
    return _ACT[_act(i)](y)


def _torch_conv(t, torch):
    F = torch.nn.functional
    x, w = t["x"], t["weight"]
    y = F.conv1d(x, w.unsqueeze(1), t.get("bias"), padding=w.shape[1] - 1, groups=w.shape[0])[..., :x.shape[-1]]
    return F.silu(y) if _act(t) == "silu" else y


def _ort_conv(i, g):
    w = i["weight"]
    d, width = w.shape
    ins = ["x", g.const(w.reshape(d, 1, width))] + ([g.const(i["bias"])] if i.get("bias") is not None else [])
    y = g.op("Conv", *ins, group=d, pads=[width - 1, 0], kernel_shape=[width])
    return {"x": i["x"]}, _ort_act(g, y, _act(i))


def _stepping(i):
    """mamba-ssm's step needs one new input per channel and a state of W values."""
    if i["x"].ndim != 2 or i["conv_state"].shape[-1] != i["weight"].shape[1]:
        raise Unavailable("mamba-ssm's step takes x (batch, dim) and a conv_state of W values")


def _numpy_update(i):
    _stepping(i)
    s, w, b = i["conv_state"], i["weight"], i.get("bias")
    s[...] = np.roll(s, -1, axis=-1)
    s[:, :, -1] = i["x"]
    y = np.sum(s * w, axis=-1)
    if b is not None:
        y = y + b
    return _ACT[_act(i)](y)


def _torch_update(t, torch):
    _stepping(t)
    s, w, b = t["conv_state"], t["weight"], t.get("bias")
    s.copy_(torch.roll(s, shifts=-1, dims=-1))
    s[:, :, -1] = t["x"]
    y = torch.sum(s * w, dim=-1)
    if b is not None:
        y = y + b
    return torch.nn.functional.silu(y) if _act(t) == "silu" else y


NUMPY = {"causal_conv1d": _numpy_conv, "causal_conv1d_update": _numpy_update}
TORCH = {"causal_conv1d": _torch_conv, "causal_conv1d_update": _torch_update}
ORT = {"causal_conv1d": _ort_conv}
