"""Peers of batch_norm and group_norm (see bench/peer_ops/__init__.py): numpy, PyTorch
(F.batch_norm(training=False) / F.group_norm, then the activation) and onnxruntime
(BatchNormalization; group norm as torch.onnx exports it at opset 17)."""
import numpy as np

from ..peers import _ACT, _f32, _ort_act


def _per_channel(p, ndim):
    return p.reshape((1, -1) + (1,) * (ndim - 2))


def _numpy_bn(i):
    """What a numpy user writes: broadcast the (C,) statistics over (N, C, *spatial) (a
    16-bit case's arrays widened to float32 first, as for the other ops: peers._f32)."""
    i = {k: _f32(v) if isinstance(v, np.ndarray) else v for k, v in i.items()}
    x = i["x"]
    y = (x - _per_channel(i["running_mean"], x.ndim)) / np.sqrt(_per_channel(i["running_var"], x.ndim)
                                                                + x.dtype.type(i.get("eps", 1e-5)))
    if i.get("weight") is not None:
        y = y * _per_channel(i["weight"], x.ndim)
    if i.get("bias") is not None:
        y = y + _per_channel(i["bias"], x.ndim)
    return _ACT[i.get("activation")](y)


def _numpy_gn(i):
    i = {k: _f32(v) if isinstance(v, np.ndarray) else v for k, v in i.items()}
    x = i["x"]
    blocks = x.reshape(x.shape[0], i["num_groups"], -1)
    mu = blocks.mean(-1, keepdims=True)
    var = ((blocks - mu) ** 2).mean(-1, keepdims=True)
    y = ((blocks - mu) / np.sqrt(var + x.dtype.type(i.get("eps", 1e-5)))).reshape(x.shape)
    if i.get("weight") is not None:
        y = y * _per_channel(i["weight"], x.ndim)
    if i.get("bias") is not None:
        y = y + _per_channel(i["bias"], x.ndim)
    return _ACT[i.get("activation")](y)


def _torch_act(torch, activation):
    F = torch.nn.functional
    return {None: lambda y: y, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
            "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[activation]


def _torch_bn(t, torch):
    y = torch.nn.functional.batch_norm(t["x"], t["running_mean"], t["running_var"], t.get("weight"), t.get("bias"),
                                       training=False, eps=t.get("eps", 1e-5))
    return _torch_act(torch, t.get("activation"))(y)


def _torch_gn(t, torch):
    y = torch.nn.functional.group_norm(t["x"], t["num_groups"], t.get("weight"), t.get("bias"), eps=t.get("eps", 1e-5))
    return _torch_act(torch, t.get("activation"))(y)


def _ones(i, name):
    p = i.get(name)
    return np.ones(i["x"].shape[1], i["x"].dtype) if p is None else p


def _ort_bn(i, g):
    """BatchNormalization (inference form) with the statistics and parameters as constants
    of the model, then the activation."""
    c = i["x"].shape[1]
    bias = i.get("bias")
    y = g.op("BatchNormalization", "x", g.const(_ones(i, "weight")),
             g.const(np.zeros(c, i["x"].dtype) if bias is None else bias),
             g.const(i["running_mean"]), g.const(i["running_var"]), epsilon=float(i.get("eps", 1e-5)))
    return {"x": i["x"]}, _ort_act(g, y, i.get("activation"))


def _ort_gn(i, g):
    """torch.onnx's GroupNorm at opset 17: Reshape to (N, G, -1), InstanceNormalization with
    scale ones and bias zeros (per group), Reshape back, Mul weight, Add bias (per channel)."""
    x = i["x"]
    groups = i["num_groups"]
    r = g.op("Reshape", "x", g.const([x.shape[0], groups, -1], np.int64))
    r = g.op("InstanceNormalization", r, g.const(np.ones(groups, x.dtype)), g.const(np.zeros(groups, x.dtype)),
             epsilon=float(i.get("eps", 1e-5)))
    y = g.op("Reshape", r, g.const(list(x.shape), np.int64))
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    if i.get("weight") is not None:
        y = g.op("Mul", y, g.const(i["weight"].reshape(per_channel)))
    if i.get("bias") is not None:
        y = g.op("Add", y, g.const(i["bias"].reshape(per_channel)))
    return {"x": x}, _ort_act(g, y, i.get("activation"))


NUMPY = {"batch_norm": _numpy_bn, "group_norm": _numpy_gn}
TORCH = {"batch_norm": _torch_bn, "group_norm": _torch_gn}
ORT = {"batch_norm": _ort_bn, "group_norm": _ort_gn}
