"""GPU probe: the float16 GEMM's wide tensor-core tile against the 64 x 64 tile, per shape
(GPU time only: bench.gpu.device_timed), and PyTorch's."""
import numpy as np
from numba import cuda
import dispatch
from dispatch import registry
from bench.gpu import device_timed, timed
import torch

ev = lambda: (cuda.event(timing=True), cuda.event(timing=True))  # noqa: E731
tev = lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # noqa: E731
g = np.random.default_rng(0)
print(f"{'op':7s} {'M':>5s} {'N':>5s} {'K':>5s} {'kernel (default)':24s} {'default us':>10s} {'wide us':>9s} {'64x64 us':>9s} {'torch us':>9s} {'TFLOP/s best':>12s}")
from dispatch import select
for op, (m, n, k) in [(o, s) for s in [(1024, 1024, 1024), (512, 4096, 4096), (128, 4096, 4096), (128, 768, 768),
                                        (128, 3072, 768), (64, 4096, 4096), (16, 4096, 4096)]
                      for o in ("matmul", "linear")]:
    a = cuda.to_device(g.standard_normal((m, k)).astype(np.float16))
    w = cuda.to_device(g.standard_normal((n, k) if op == "linear" else (k, n)).astype(np.float16))
    fn = getattr(dispatch, op)
    params = registry.OPS[op].implementations["cuda-gemm"].params
    res = {}
    kern = "?"
    for label, waves in (("default", 1.0), ("wide", 0.0), ("64", 1e9)):
        params["wide_min_waves"] = waves
        select.clear_cache()
        with dispatch.use(**{op: "cuda-gemm"}):
            e = dispatch.explain(op, a, w)
            kk = e.decision.chosen.launch_config(e.call)["kernel"]
            kern = kk if label == "default" else kern
            f = lambda: fn(a, w)  # noqa: E731
            s, nb = timed(f, cuda.synchronize, ev)
            res[label] = device_timed(f, max(2, min(nb, 32)), s, cuda, ev) or s
        print("   ", label, kk, flush=True)
    params["wide_min_waves"] = 1.0
    select.clear_cache()
    ta = torch.as_tensor(a, device="cuda")
    tw = torch.as_tensor(w, device="cuda")
    tf = (lambda: ta @ tw.T) if op == "linear" else (lambda: ta @ tw)
    s, nb = timed(tf, torch.cuda.synchronize, tev)
    res["torch"] = device_timed(tf, max(2, min(nb, 32)), s, cuda, tev) or s
    best = min(res["default"], res["wide"], res["64"])
    print(f"{op:7s} {m:5d} {n:5d} {k:5d} {kern:24s} {res['default']*1e6:10.1f} {res['wide']*1e6:9.1f} {res['64']*1e6:9.1f} "
          f"{res['torch']*1e6:9.1f} {2*m*n*k/best/1e12:12.1f}", flush=True)
