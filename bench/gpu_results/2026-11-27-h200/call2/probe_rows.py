"""GPU probe (session 12): the block-per-row kernels' variants at the bars' row shapes, GPU
time (bench.gpu.device_timed) against PyTorch: the two-pass kernel as shipped (8 elements a
thread, one-wave grid), with 16 / 32 elements a thread, with a grid of every row; the
row held in registers at 8 and 16 elements a thread (float32 accumulation; float64 half)."""
import numpy as np
from numba import cuda
import torch
import dispatch
from dispatch import registry, select
from bench.gpu import device_timed, timed

ev = lambda: (cuda.event(timing=True), cuda.event(timing=True))  # noqa: E731
tev = lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # noqa: E731
OPS = ("softmax", "layer_norm", "rms_norm")
VARIANTS = {
    "2pass pt8 w1": {"register_rows": 0, "per_thread": 8, "waves": 1},
    "2pass pt16 w1": {"register_rows": 0, "per_thread": 16, "waves": 1},
    "2pass pt32 w1": {"register_rows": 0, "per_thread": 32, "waves": 1},
    "2pass pt16 w64": {"register_rows": 0, "per_thread": 16, "waves": 64},
    "reg8": {"register_rows": 8},
    "reg16": {"register_rows": 16},
}
base = {op: dict(registry.OPS[op].implementations["cuda-block-row"].params) for op in OPS}
g = np.random.default_rng(0)
print(f"{'op':10s} {'shape':>11s} {'dtype':8s} " + " ".join(f"{v:>14s}" for v in VARIANTS) + f" {'torch':>8s}  kernel(default)")
import os
DRY = os.environ.get("DRY") == "1"  # under the simulator: tiny rows, no PyTorch
if DRY:
    from tests.cuda import simwarp
    simwarp.install()
    ev = lambda: (cuda.event(), cuda.event())  # noqa: E731
for shape in ([(3, 2048)] if DRY else [(4096, 4096), (8192, 2048), (1024, 8192)]):
    for dt in (np.float16, np.float32):
        x = cuda.to_device(g.standard_normal(shape).astype(dt))
        w = cuda.to_device(g.standard_normal(shape[1]).astype(dt))
        b = cuda.to_device(g.standard_normal(shape[1]).astype(dt))
        tx, tw, tb = (None,) * 3 if DRY else (torch.as_tensor(a, device="cuda") for a in (x, w, b))
        for op in OPS:
            fn = {"softmax": lambda: dispatch.softmax(x), "layer_norm": lambda: dispatch.layer_norm(x, w, b),
                  "rms_norm": lambda: dispatch.rms_norm(x, w)}[op]
            res = {}
            for name, p in VARIANTS.items():
                params = registry.OPS[op].implementations["cuda-block-row"].params
                params.update(base[op]); params.update(p)
                select.clear_cache()
                try:
                    with dispatch.use(**{op: "cuda-block-row"}):
                        e = dispatch.explain(op, *( (x,) if op == "softmax" else (x, w, b) if op == "layer_norm" else (x, w)))
                        k = e.decision.chosen.launch_config(e.call)
                        s, nb = timed(fn, cuda.synchronize, ev)
                        res[name] = (device_timed(fn, max(2, min(nb, 32)), s, cuda, ev) or s, k["kernel"].split(".")[-1], k["block"])
                except Exception as exc:  # noqa: BLE001
                    print(name, repr(exc)[:300], flush=True)
                    res[name] = (float("nan"), type(exc).__name__, 0)
            params.update(base[op]); select.clear_cache()
            tf = {"softmax": lambda: torch.softmax(tx, -1),
                  "layer_norm": lambda: torch.nn.functional.layer_norm(tx, (shape[1],), tw, tb),
                  "rms_norm": lambda: torch.nn.functional.rms_norm(tx, (shape[1],), tw)}[op]
            if DRY:
                tt = float("nan")
            else:
                s, nb = timed(tf, torch.cuda.synchronize, tev)
                tt = device_timed(tf, max(2, min(nb, 32)), s, cuda, tev) or s
            print(f"{op:10s} {shape[0]:5d}x{shape[1]:<5d} {np.dtype(dt).name:8s} "
                  + " ".join(f"{res[v][0]*1e6:8.1f}/{res[v][2]:<5d}" for v in VARIANTS) + f" {tt*1e6:8.1f}", flush=True)
