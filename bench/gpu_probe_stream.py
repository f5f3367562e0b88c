"""GPU probe: the DRAM bandwidth a streaming kernel reaches on this chip (PyTorch's device copy
and elementwise add, GPU time), beside the datasheet figure bench/cuda_model.py divides by.

    python3 bench/gpu_probe_stream.py            # a machine with a GPU and a CUDA torch
    DRY=1 NUMBA_ENABLE_CUDASIM=1 python bench/gpu_probe_stream.py   # the logic, in the simulator

Why: the row kernels' measured / predicted ratios are 1.4-1.8 (2026-11-27d call 3: layer_norm
float16 (4096, 4096) 25.3 us against 14.0 predicted at 4.8 TB/s), and the model's
bytes-in-flight bound does not bind for them at any DRAM latency up to 1.5 us (checked by
sweeping DRAM_LATENCY_S), so either the chip streams well below its datasheet bandwidth or
those kernels do: this says which.  Per size (MiB per tensor, float16): microseconds (median of
REPS, CUDA events behind a spin kernel), bytes moved (copy: 2 x, add: 3 x), TB/s and the
fraction of the datasheet peak (cuda_model.SPECS, by the device's name).  One JSON row per line
on stdout and, with $OUT, $OUT/gpu_probe_stream.json.  DRY: 1 MiB; without a CUDA torch (the
simulator) a numba copy kernel of 1541 float16s instead, no timing.
"""
from __future__ import annotations

import os
import sys

import numpy as np
from numba import cuda  # module-level: the simulator swaps a kernel's global `cuda`

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from bench import gpu_probe_common as common  # noqa: E402
from bench.gpu_probe_common import DRY  # noqa: E402

SIZES_MIB = [1] if DRY else [64, 256, 1024]


def _peak(name):
    from bench.cuda_model import SPECS

    for key, chip in SPECS.items():
        if key.split()[0] in name:
            return key, chip.dram_bps
    return None, None


def main():
    torch, has_torch = common.setup()
    rows = []
    name = torch.cuda.get_device_name() if has_torch else "simulator"
    chip, peak = _peak(name)
    print(f"device: {name}; datasheet DRAM {'-' if peak is None else f'{peak / 1e12:.2f} TB/s'} ({chip}); "
          f"reps {common.REPS}", flush=True)
    print(f"{'MiB':>6s} {'op':5s} {'us':>9s} {'TB/s':>6s} {'of peak':>7s}", flush=True)
    if not has_torch:  # the logic only: a numba copy at a tiny size
        from kernels_cuda._jit import kernel

        @kernel
        def copy(src, dst):
            for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
                dst[i] = src[i]

        n = 4 * 128 * 3 + 5  # each simulated thread's grid-stride loop goes round 3-4 times
        a = cuda.to_device(np.arange(n, dtype=np.float16))
        b = cuda.device_array_like(a)
        copy[4, 128](a, b)
        assert np.array_equal(b.copy_to_host(), a.copy_to_host())
        rows.append({"mib": n * 2 / 2 ** 20, "op": "copy", "us": None, "tbps": None, "of_peak": None})
        print(f"{n * 2 / 2 ** 20:6.3f} copy  {'-':>9s} {'-':>6s} {'-':>7s}", flush=True)
    else:
        for mib in SIZES_MIB:
            n = mib << 19  # float16 elements
            a = torch.randn(n, device="cuda", dtype=torch.float16)
            b = torch.randn(n, device="cuda", dtype=torch.float16)
            c = torch.empty_like(a)
            for op, fn, moved in (("copy", lambda: c.copy_(a), 2), ("add", lambda: torch.add(a, b, out=c), 3)):
                us = common.time_it(fn, torch.cuda.synchronize, torch, has_torch)
                tbps = moved * 2 * n / us / 1e6
                frac = None if peak is None else tbps * 1e12 / peak
                rows.append({"mib": mib, "op": op, "us": us, "tbps": tbps, "of_peak": frac, "device": name})
                print(f"{mib:6d} {op:5s} {us:9.1f} {tbps:6.2f} {'-' if frac is None else f'{frac:.2f}':>7s}", flush=True)
            del a, b, c
            torch.cuda.empty_cache()
    common.emit(rows, "gpu_probe_stream")
    return 0


if __name__ == "__main__":
    sys.exit(main())
