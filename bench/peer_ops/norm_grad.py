"""Peers of layer_norm_backward and rms_norm_backward (see bench/peer_ops/__init__.py).

PyTorch: layer_norm_backward is aten's own kernel, torch.ops.aten.native_layer_norm_backward,
given the mean / rstd its forward (native_layer_norm) saved; rms_norm_backward is autograd
of torch.nn.functional.rms_norm (torch 2.13 has no CPU kernel for
aten._fused_rms_norm_backward), the graph built once and replayed (retain_graph).  What a
forward saved is made on the first call and kept in the case's tensor dict, so a timed call
is the backward alone.  numpy: the float32 formulas a numpy user writes."""
import numpy as np


def _np_stats_ln(x, eps):
    mu = x.mean(-1, keepdims=True)
    c = x - mu
    rstd = 1 / np.sqrt((c * c).mean(-1, keepdims=True) + x.dtype.type(eps))
    return c * rstd, rstd


def _numpy_ln(i):
    go, x, w = i["grad_out"], i["x"], i.get("weight")
    xh, rstd = _np_stats_ln(x, i.get("eps", 1e-5))
    g = go if w is None else go * w
    dx = rstd * (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True))
    if i.get("grad_residual") is not None:
        dx = dx + i["grad_residual"]
    d = x.shape[-1]
    dw = None if w is None else (go * xh).reshape(-1, d).sum(0)
    db = None if i.get("bias") is None else go.reshape(-1, d).sum(0)
    return dx, dw, db


def _numpy_rms(i):
    go, x, w = i["grad_out"], i["x"], i.get("weight")
    rstd = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + x.dtype.type(i.get("eps", 1e-6)))
    xh = x * rstd
    g = go if w is None else go * w
    dx = rstd * (g - xh * (g * xh).mean(-1, keepdims=True))
    if i.get("grad_residual") is not None:
        dx = dx + i["grad_residual"]
    dw = None if w is None else (go * xh).reshape(-1, x.shape[-1]).sum(0)
    return dx, dw


def _torch_ln(t, torch):
    x, w, b = t["x"], t.get("weight"), t.get("bias")
    shape = list(x.shape[-1:])
    saved = t.get("_peer_ln_saved")
    if saved is None:  # the forward's saved statistics (made once, untimed after the first call)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, w, b, t.get("eps", 1e-5))
        saved = t["_peer_ln_saved"] = (mean, rstd)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(t["grad_out"], x, shape, saved[0], saved[1], w, b,
                                                           [True, w is not None, b is not None])
    if t.get("grad_residual") is not None:
        dx = dx + t["grad_residual"]
    return dx, dw, db


def _torch_rms(t, torch):
    x, w = t["x"], t.get("weight")
    with torch.inference_mode(False), torch.enable_grad():
        graph = t.get("_peer_rms_graph")
        if graph is None:  # the forward's graph (built once), replayed by each backward
            xg = x.detach().clone().requires_grad_()
            wg = None if w is None else w.detach().clone().requires_grad_()
            y = torch.nn.functional.rms_norm(xg, list(x.shape[-1:]), wg, t.get("eps", 1e-6))
            graph = t["_peer_rms_graph"] = (y, [v for v in (xg, wg) if v is not None])
        y, leaves = graph
        grads = torch.autograd.grad(y, leaves, t["grad_out"], retain_graph=True)
    dx = grads[0]
    if t.get("grad_residual") is not None:
        dx = dx + t["grad_residual"]
    return dx, (grads[1] if w is not None else None)


NUMPY = {"layer_norm_backward": _numpy_ln, "rms_norm_backward": _numpy_rms}
TORCH = {"layer_norm_backward": _torch_ln, "rms_norm_backward": _torch_rms}
