"""Peers of linear_cross_entropy (see bench/peer_ops/__init__.py): what a user writes
without the fused op, the full logits then the loss (PyTorch: F.cross_entropy(F.linear(...)),
and for the gradients its autograd; numpy: the float32 composition)."""
import numpy as np


def _numpy_lce(i):
    z = i["x"] @ i["weight"].T
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    return np.mean(lse - z[np.arange(len(z)), i["targets"]])


def _torch_lce(t, torch):
    F = torch.nn.functional
    return F.cross_entropy(F.linear(t["x"], t["weight"]), t["targets"])


def _torch_lce_grad(t, torch):
    F = torch.nn.functional
    # the report runs the peers under inference_mode, where no gradient can be recorded
    with torch.inference_mode(False), torch.enable_grad():
        x = t["x"].detach().requires_grad_()
        w = t["weight"].detach().requires_grad_()
        loss = F.cross_entropy(F.linear(x, w), t["targets"])
        dx, dw = torch.autograd.grad(loss, (x, w))
    return loss.detach(), dx, dw


NUMPY = {"linear_cross_entropy": _numpy_lce}
TORCH = {"linear_cross_entropy": _torch_lce, "linear_cross_entropy_with_grad": _torch_lce_grad}
