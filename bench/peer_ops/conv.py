"""Peers of conv2d (see bench/peer_ops/__init__.py)."""
import numpy as np

from ..peers import _ACT, _f32, _ort_act


def _pair(v):
    return (v, v) if isinstance(v, (int, np.integer)) else tuple(v)


def _numpy_conv(i):
    """What a numpy user writes: zero-pad, take the sliding windows (a strided view), one
    tensordot per group (numpy's BLAS does the work; a 16-bit case's arrays widened to
    float32 first: numpy has no 16-bit BLAS)."""
    x, w, b = _f32(i["x"]), _f32(i["weight"]), i.get("bias")
    b = None if b is None else _f32(b)
    sh, sw = _pair(i.get("stride", 1))
    ph, pw = _pair(i.get("padding", 0))
    dh, dw = _pair(i.get("dilation", 1))
    g = i.get("groups", 1)
    cout, cin_g, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]            # (N, C, OH, OW, KH, KW)
    if g == 1:
        y = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    elif cin_g == 1 and cout == g:                     # depthwise: an einsum over the taps
        y = np.einsum("nchwij,cij->nchw", win, w[:, 0])
    else:
        cg = cout // g
        y = np.concatenate([np.tensordot(win[:, k * cin_g:(k + 1) * cin_g], w[k * cg:(k + 1) * cg],
                                         axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2) for k in range(g)], axis=1)
    if b is not None:
        y = y + b[None, :, None, None]
    return _ACT[i.get("activation")](y)


def _torch_conv(t, torch):
    F = torch.nn.functional
    act = {None: lambda y: y, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
           "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}
    y = F.conv2d(t["x"], t["weight"], t.get("bias"), stride=t.get("stride", 1), padding=t.get("padding", 0),
                 dilation=t.get("dilation", 1), groups=t.get("groups", 1))
    return act[t.get("activation")](y)


def _ort_conv(i, g):
    """Conv with the weight and bias as constants of the model (onnxruntime packs them at
    session creation), then the activation (its graph optimizer fuses Conv + Relu)."""
    w = i["weight"]
    sh, sw = _pair(i.get("stride", 1))
    ph, pw = _pair(i.get("padding", 0))
    dh, dw = _pair(i.get("dilation", 1))
    ins = ["x", g.const(w)] + ([g.const(i["bias"])] if i.get("bias") is not None else [])
    y = g.op("Conv", *ins, strides=[sh, sw], pads=[ph, pw, ph, pw], dilations=[dh, dw], group=i.get("groups", 1),
             kernel_shape=list(w.shape[2:]))
    return {"x": i["x"]}, _ort_act(g, y, i.get("activation"))


NUMPY = {"conv2d": _numpy_conv}
TORCH = {"conv2d": _torch_conv}
ORT = {"conv2d": _ort_conv}
