"""Peers of selective_scan and selective_state_update (see bench/peer_ops/__init__.py), and
the plain numba baseline the CPU kernel is measured against.

PyTorch: mamba-ssm's reference implementations in eager PyTorch (selective_scan_ref: the
decay and input terms for all steps at once, then a Python loop over the sequence;
selective_state_update_ref), in the inputs' dtype.  numpy: the same loop over the
sequence.  No onnxruntime peer (ONNX has no scan of this kind; a Loop node would be a
Python-speed loop too, and a model cannot update its state input in place).

    PYTHONPATH=. python -m bench.peer_ops.ssm          # baseline vs dispatch.selective_scan

prints an interleaved comparison at the Mamba shapes (bench/cases/ssm.py) and where the
time of the scan goes.
"""
import math

import numba
import numpy as np
from numba import njit, prange


def _groups(M, dim, grouped_rank):
    """B or C as (batch, dim, N, ...) (channel d reads group d // (dim / G))."""
    if M.ndim < grouped_rank:
        return M[:, None]
    return np.repeat(M, dim // M.shape[1], axis=1)


def _softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _numpy_scan(i):
    u, A = i["u"], i["A"]
    dt = i["delta"]
    if i.get("delta_bias") is not None:
        dt = dt + i["delta_bias"][:, None]
    if i.get("delta_softplus"):
        dt = _softplus(dt)
    B = _groups(i["B"], u.shape[1], 4)
    C = _groups(i["C"], u.shape[1], 4)
    h = np.zeros(u.shape[:2] + A.shape[1:], u.dtype) if i.get("initial_state") is None else i["initial_state"]
    y = np.empty_like(u)
    for t in range(u.shape[2]):
        h = np.exp(dt[:, :, t, None] * A) * h + (dt[:, :, t] * u[:, :, t])[..., None] * B[..., t]
        y[:, :, t] = (h * C[..., t]).sum(-1)
    if i.get("D") is not None:
        y = y + i["D"][:, None] * u
    if i.get("z") is not None:
        y = y * (i["z"] / (1 + np.exp(-i["z"])))
    return y


def _numpy_update(i):
    state, x, A = i["state"], i["x"], i["A"]
    dt = i["dt"]
    if i.get("dt_bias") is not None:
        dt = dt + i["dt_bias"]
    if i.get("dt_softplus"):
        dt = _softplus(dt)
    B = _groups(i["B"], x.shape[1], 3)
    C = _groups(i["C"], x.shape[1], 3)
    state[...] = np.exp(dt[..., None] * A) * state + (dt * x)[..., None] * B
    y = (state * C).sum(-1)
    if i.get("D") is not None:
        y = y + i["D"] * x
    if i.get("z") is not None:
        y = y * (i["z"] / (1 + np.exp(-i["z"])))
    return y


def _torch_groups(M, dim, grouped_rank):
    return M.unsqueeze(1) if M.dim() < grouped_rank else M.repeat_interleave(dim // M.shape[1], dim=1)


def _torch_scan(t, torch):
    """mamba-ssm's selective_scan_ref (mamba_ssm/ops/selective_scan_interface.py)."""
    F = torch.nn.functional
    u, delta, A = t["u"], t["delta"], t["A"]
    if t.get("delta_bias") is not None:
        delta = delta + t["delta_bias"][..., None]
    if t.get("delta_softplus"):
        delta = F.softplus(delta)
    dim = u.shape[1]
    B = _torch_groups(t["B"], dim, 4)
    C = _torch_groups(t["C"], dim, 4)
    delta_a = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    delta_b_u = torch.einsum("bdl,bdnl,bdl->bdln", delta, B.expand(-1, dim, -1, -1), u)
    x = A.new_zeros((u.shape[0], dim, A.shape[1])) if t.get("initial_state") is None else t["initial_state"]
    ys = []
    for k in range(u.shape[2]):
        x = delta_a[:, :, k] * x + delta_b_u[:, :, k]
        ys.append(torch.einsum("bdn,bdn->bd", x, C[:, :, :, k].expand(-1, dim, -1)))
    y = torch.stack(ys, dim=2)
    out = y if t.get("D") is None else y + u * t["D"][:, None]
    return out if t.get("z") is None else out * F.silu(t["z"])


def _torch_update(t, torch):
    """mamba-ssm's selective_state_update_ref (mamba_ssm/ops/triton/selective_state_update.py)."""
    F = torch.nn.functional
    state, x, dt, A = t["state"], t["x"], t["dt"], t["A"]
    if t.get("dt_bias") is not None:
        dt = dt + t["dt_bias"]
    if t.get("dt_softplus"):
        dt = F.softplus(dt)
    dim = x.shape[1]
    B = _torch_groups(t["B"], dim, 3)
    C = _torch_groups(t["C"], dim, 3)
    state.copy_(state * torch.exp(dt[..., None] * A) + (dt[..., None] * B) * x[..., None])
    out = torch.einsum("bdn,bdn->bd", state, C.expand(-1, dim, -1))
    if t.get("D") is not None:
        out = out + x * t["D"]
    return out if t.get("z") is None else out * F.silu(t["z"])


NUMPY = {"selective_scan": _numpy_scan, "selective_state_update": _numpy_update}
TORCH = {"selective_scan": _torch_scan, "selective_state_update": _torch_update}


# ---- the baseline: a plain prange over the channels ---------------------------------------------

@njit(parallel=True, fastmath=True, cache=True)
def _baseline(u, delta, A, B, C, D, z, bias, y):
    """u, delta, z, y (batch, dim, L); B, C (batch, G, N, L); D, bias (dim,): one scalar
    loop over L and N per (batch, channel), softplus on, libm exp, a prange over rows."""
    nb, dim, L = u.shape
    N = A.shape[1]
    H = dim // B.shape[1]
    for r in prange(nb * dim):
        b = r // dim
        d = r - b * dim
        g = d // H
        h = np.zeros(N, y.dtype)
        for t in range(L):
            dt = delta[b, d, t] + bias[d]
            dt = math.log1p(math.exp(dt)) if dt <= 20.0 else dt
            du = dt * u[b, d, t]
            acc = 0.0
            for n in range(N):
                h[n] = math.exp(dt * A[d, n]) * h[n] + du * B[b, g, n, t]
                acc += h[n] * C[b, g, n, t]
            zt = z[b, d, t]
            y[b, d, t] = (acc + D[d] * u[b, d, t]) * zt / (1.0 + math.exp(-zt))


def baseline_scan(i):
    """selective_scan of a bench case's inputs (D, z, delta_bias given, softplus on) by the
    plain parallel loop: the issue's yardstick (about 107 ms at dim 1536, L 1024, N 16)."""
    B = i["B"] if i["B"].ndim == 4 else i["B"][:, None]
    C = i["C"] if i["C"].ndim == 4 else i["C"][:, None]
    y = np.empty_like(i["u"])
    _baseline(i["u"], i["delta"], i["A"], np.ascontiguousarray(B), np.ascontiguousarray(C), i["D"], i["z"],
              i["delta_bias"], y)
    return y


def main():
    import dispatch
    from bench import cases, timing
    from dispatch import registry
    from kernels_cpu.ssm import exp2_fast  # the kernel's exp: the breakdown below times it alone

    @njit(fastmath=True)
    def exp_loop(x, out, reps):
        for _ in range(reps):
            for k in range(x.size):
                out[k] = exp2_fast(x[k])

    op = registry.OPS["selective_scan"]
    print(f"{numba.get_num_threads()} threads; interleaved medians (bench.timing, 7 rounds); float32")
    for cid in ("selective_scan:mamba-130m prefill dim 1536 L 1024",
                "selective_scan:mamba-1.4b prefill dim 4096 L 1024"):
        case = cases.by_id(cid)
        i = case.inputs(np.random.default_rng(0), np.float32)
        args, kw = case.call_args(i)
        ours = dispatch.selective_scan(*args, **kw)
        base = baseline_scan(i)
        err = np.max(np.abs(ours - base)) / np.max(np.abs(base))
        call = op.describe(*args, **kw)
        flops, nbytes = op.flops(call), op.bytes(call)
        stats = timing.interleaved({"baseline (prange, libm exp)": lambda: baseline_scan(i),
                                    "dispatch.selective_scan": lambda: dispatch.selective_scan(*args, **kw)},
                                   rounds=7, warmup=1, batch_s=0.05, pause_s=0)
        b, o = (s.median for s in stats.values())
        print(f"\n{case.name}: {flops / 1e6:.0f} MFLOP, {nbytes / 1e6:.1f} MB; "
              f"max|ours - baseline| / max|baseline| = {err:.1e}")
        for name, s in stats.items():
            print(f"  {name:30s} {s.median * 1e3:8.2f} ms  (spread {s.spread:.2f})")
        print(f"  speed-up over the baseline: {b / o:.1f}x")
        # where the time goes, on one thread: the whole call; the same call without states
        # (N = 0: the row passes, transposes and gating alone); the exps alone (the
        # kernel's exp streamed over as many arguments as there are state updates)
        i0 = dict(i, A=i["A"][:, :0], B=i["B"][:, :0], C=i["C"][:, :0])
        a0, k0 = case.call_args(i0)
        x = np.linspace(-20, 0, 1 << 20, dtype=np.float32)
        ex = np.empty_like(x)
        reps = int(round(np.prod(i["u"].shape) * i["A"].shape[1] / x.size))
        exp_loop(x, ex, 1)
        with dispatch.use(selective_scan="cpu-serial"):
            one = timing.interleaved({"all": lambda: dispatch.selective_scan(*args, **kw),
                                      "N0": lambda: dispatch.selective_scan(*a0, **k0),
                                      "exp": lambda: exp_loop(x, ex, reps)}, rounds=5, warmup=1, batch_s=0.05,
                                     pause_s=0)
        t, rest, exps = (one[k].median for k in ("all", "N0", "exp"))
        print(f"  one thread {t * 1e3:.2f} ms = rows, transposes and gating (N = 0) {rest * 1e3:.2f} ms + state "
              f"updates {(t - rest) * 1e3:.2f} ms, of which the exps alone (streamed) take {exps * 1e3:.2f} ms; "
              f"memory floor {nbytes / 25e9 * 1e3:.2f} ms at 25 GB/s")


if __name__ == "__main__":
    main()
