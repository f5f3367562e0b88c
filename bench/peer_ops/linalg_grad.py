"""Peers of linear_backward and matmul_backward (see bench/peer_ops/__init__.py).

PyTorch: the backward that autograd runs for act(F.linear(x, weight, bias)) /
act(a @ b + bias), written with the aten ops it dispatches to: the activation's backward
kernel (aten.gelu_backward / silu_backward / threshold_backward) on the saved pre-activation,
then the two matrix products (MKL / oneDNN) and the column sum for dbias, the broadcast batch
dims summed.  So a timed call is the backward alone, as ours; the forward + backward figures
(autograd of F.linear + activation against our forward ops + linear_backward) are in
bench/cases/linalg_grad.py.  Returns (dx or da, dweight or db, dbias)."""


def _torch_gprime(t, torch):
    g, pre, act = t["grad_out"], t.get("pre"), t.get("activation")
    if act is None:
        return g
    if act == "relu":
        return torch.ops.aten.threshold_backward(g, pre, 0)
    if act == "silu":
        return torch.ops.aten.silu_backward(g, pre)
    return torch.ops.aten.gelu_backward(g, pre, approximate="tanh" if act == "gelu_tanh" else "none")


def _torch_linear(t, torch):
    gp = _torch_gprime(t, torch)
    x, w = t["x"], t["weight"]
    n, k = w.shape
    g2 = gp.reshape(-1, n)
    dx = (g2 @ w).reshape(x.shape)
    dw = g2.t() @ x.reshape(-1, k)
    return dx, dw, (g2.sum(0) if t.get("has_bias") else None)


def _sum_to(torch, full, shape):
    lead = full.dim() - len(shape)
    if lead:
        full = full.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, s in enumerate(shape[:-2]) if s == 1 and full.shape[i] != 1)
    return full.sum(dim=dims, keepdim=True) if dims else full


def _torch_matmul(t, torch):
    gp = _torch_gprime(t, torch)
    a, b = t["a"], t["b"]
    da = _sum_to(torch, gp @ b.transpose(-1, -2), a.shape)
    db = _sum_to(torch, a.transpose(-1, -2) @ gp, b.shape)
    return da, db, (gp.reshape(-1, gp.shape[-1]).sum(0) if t.get("has_bias") else None)


TORCH = {"linear_backward": _torch_linear, "matmul_backward": _torch_matmul}
