"""What the GPU probes (bench/gpu_probe_gemm.py, bench/gpu_probe_attention.py) share: the
environment switches, the simulator's warp emulation, a CUDA torch, and the timer.

DRY=1 (with NUMBA_ENABLE_CUDASIM=1): tiny shapes, 2 reps, a numpy reference; REPS=n.
"""
from __future__ import annotations

import json
import os
import statistics

DRY = os.environ.get("DRY", "0") not in ("", "0")
SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
REPS = int(os.environ.get("REPS", "2" if DRY else "20"))
WARMUP = 1 if DRY else 3


def setup():
    """(torch or None, whether it has CUDA): the simulator's warp primitives installed first
    (the mma / ldmatrix twins use them); a real run without a CUDA torch stops here."""
    if SIM:
        from tests.cuda import simwarp

        simwarp.install()
    try:
        import torch

        has_torch = torch.cuda.is_available() and not SIM
    except ImportError:
        torch, has_torch = None, False
    if not DRY and not has_torch:
        raise SystemExit("needs a CUDA torch (or DRY=1 NUMBA_ENABLE_CUDASIM=1)")
    return torch, has_torch


def time_it(launch, sync, torch, has_torch):
    """Median GPU microseconds of REPS launches after WARMUP (None without a CUDA torch: one
    launch runs, whose result the probe checks; more would only repeat the simulator's
    slowest part).  The launches queue behind torch.cuda._sleep, so CUDA events around
    each time the GPU's work, not the host's launch."""
    if not has_torch:
        launch()
        sync()
        return None
    for _ in range(WARMUP):
        launch()
    sync()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPS)]
    torch.cuda._sleep(20_000_000)  # ~10 ms of one spinning thread: the launches queue up behind it
    for s, e in evs:
        s.record()
        launch()
        e.record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(s.elapsed_time(e) for s, e in evs)


def emit(rows, name):
    """The rows as JSON lines on stdout and, where $OUT is set (the device tool's folder), in
    $OUT/<name>.json."""
    for r in rows:
        print(json.dumps(r))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"{name}.json"), "w") as f:
            json.dump(rows, f, indent=1)
