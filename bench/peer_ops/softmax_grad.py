"""Peers of the softmax-family backward ops (see bench/peer_ops/__init__.py).

PyTorch: its own backward kernels, torch.ops.aten._softmax_backward_data and
_log_softmax_backward_data (what autograd calls) on the same y; for the cross entropy,
autograd of torch.nn.functional.cross_entropy (forward + backward, the loss and the
gradient, as cross_entropy_with_grad returns) and, for cross_entropy_backward, the aten
backward chain autograd runs (nll_loss_backward, then _log_softmax_backward_data) after a
log_softmax forward (PyTorch saves log_softmax's output; we recompute the softmax).
numpy: the formulas.
"""
import numpy as np

from ..peers import _log_softmax, _softmax

_RED = {"none": 0, "mean": 1, "sum": 2}  # at::Reduction


def _axis(i):
    return i.get("axis", -1)


def _np_softmax_backward(i):
    g, y = i["grad_out"], i["y"]
    return y * (g - (g * y).sum(axis=_axis(i), keepdims=True))


def _np_log_softmax_backward(i):
    g, y = i["grad_out"], i["y"]
    return g - np.exp(y) * g.sum(axis=_axis(i), keepdims=True)


def _np_ce_grad(logits, targets, reduction, scale):
    p = _softmax(logits)
    n = logits.shape[0]
    p[np.arange(n), targets] -= 1
    return p * (scale / n if reduction == "mean" else scale)


def _np_with_grad(i):
    red = i.get("reduction", "mean")
    ls = _log_softmax(i["logits"])
    losses = -ls[np.arange(ls.shape[0]), i["targets"]]
    loss = losses.mean() if red == "mean" else losses.sum() if red == "sum" else losses
    return np.asarray(loss, ls.dtype), _np_ce_grad(i["logits"], i["targets"], red, 1.0)


def _np_backward(i):
    red = i.get("reduction", "mean")
    g = i["grad_loss"]
    return _np_ce_grad(i["logits"], i["targets"], red, g if red != "none" else g[:, None])


def _torch_softmax_backward(t, torch):
    return torch.ops.aten._softmax_backward_data(t["grad_out"], t["y"], _axis(t), t["y"].dtype)


def _torch_log_softmax_backward(t, torch):
    return torch.ops.aten._log_softmax_backward_data(t["grad_out"], t["y"], _axis(t), t["y"].dtype)


def _torch_with_grad(t, torch):
    F = torch.nn.functional
    with torch.inference_mode(False), torch.enable_grad():  # the report runs peers in inference mode
        x = t["logits"].detach().requires_grad_(True)
        loss = F.cross_entropy(x, t["targets"], reduction=t.get("reduction", "mean"))
        (g,) = torch.autograd.grad(loss, x, torch.ones_like(loss))
    return loss.detach(), g


def _torch_backward(t, torch):
    red = t.get("reduction", "mean")
    x = t["logits"]
    ls = torch.log_softmax(x, -1)
    total = torch.tensor(float(x.shape[0]), dtype=x.dtype)
    g = torch.ops.aten.nll_loss_backward(t["grad_loss"], ls, t["targets"], None, _RED[red], -100, total)
    return torch.ops.aten._log_softmax_backward_data(g, ls, -1, x.dtype)


NUMPY = {"softmax_backward": _np_softmax_backward, "log_softmax_backward": _np_log_softmax_backward,
         "cross_entropy_with_grad": _np_with_grad, "cross_entropy_backward": _np_backward}
TORCH = {"softmax_backward": _torch_softmax_backward, "log_softmax_backward": _torch_log_softmax_backward,
         "cross_entropy_with_grad": _torch_with_grad, "cross_entropy_backward": _torch_backward}
