"""GPU probe: how fast mma.sync (kernels_cuda/mma.py's mma_16816, HMMA.16816.F32) issues on
this chip with nothing else in the way: no memory, no barriers, operands in registers.  The
model's tensor pipe (bench/cuda_model.py, MMA_SYNC_CLK_PER_HMMA) is this number; the GEMM and
attention kernels can approach it, never pass it.

    python3 bench/gpu_probe_mma.py            # a machine with a GPU and a CUDA torch
    DRY=1 NUMBA_ENABLE_CUDASIM=1 python bench/gpu_probe_mma.py   # the logic, in the simulator

Each thread of a block of `warps` warps runs ITERS steps of `chains` independent
accumulator chains (chains x mma.m16n8k16 per step, each reading the previous step's result
of its chain), SM_BLOCKS blocks per SM over every SM.  Printed per (warps per block, chains):
GPU microseconds (median of REPS, CUDA events, queued behind a spin kernel), TFLOP/s (2 x 16
x 8 x 16 per mma) and SM clocks per HMMA per SM partition (four per SM) at the chip's
current SM clock (torch.cuda.clock_rate() when it reports one, else its maximum): fewer
warps and chains show the latency of one HMMA, many show the pipe's rate.  One JSON row
per line on stdout and, with $OUT, $OUT/gpu_probe_mma.json.
"""
from __future__ import annotations

import os
import sys

import numpy as np
from numba import cuda, float32, uint32  # module-level: the simulator swaps a kernel's global `cuda`

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from bench import gpu_probe_common as common  # noqa: E402
from bench.gpu_probe_common import DRY  # noqa: E402

ITERS = 2 if DRY else int(os.environ.get("ITERS", "4096"))
SM_BLOCKS = 1 if DRY else 2
CASES = [(1, 8)] if DRY else [(1, 1), (1, 4), (1, 8), (4, 1), (4, 4), (4, 8), (8, 4), (8, 8), (16, 4), (16, 8)]


def build(chains):
    from kernels_cuda._jit import kernel
    from kernels_cuda.mma import mma_16816

    @kernel
    def hmma_chains(seed, iters, out):
        d = cuda.local.array((chains, 4), float32)
        a = uint32(seed[0] + cuda.threadIdx.x)  # operands the compiler cannot fold (tiny halves)
        b = uint32(seed[1])
        for c in range(chains):
            for r in range(4):
                d[c, r] = float32(0.0)
        for _ in range(iters):
            for c in range(chains):
                d0, d1, d2, d3 = mma_16816(a, a, a, a, b, b, d[c, 0], d[c, 1], d[c, 2], d[c, 3])
                d[c, 0] = d0
                d[c, 1] = d1
                d[c, 2] = d2
                d[c, 3] = d3
        s = float32(0.0)
        for c in range(chains):
            s += d[c, 0] + d[c, 1] + d[c, 2] + d[c, 3]
        out[cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x] = s  # keeps every chain live

    return hmma_chains


def main():
    torch, has_torch = common.setup()
    dev = cuda.get_current_device()
    sms = getattr(dev, "MULTIPROCESSOR_COUNT", 1)  # the simulator's device has no attributes
    clock_hz = None
    if has_torch:
        rate = getattr(torch.cuda, "clock_rate", None)
        try:
            clock_hz = rate() * 1e6 if rate else None  # MHz, where torch reports it
        except Exception:  # noqa: BLE001 - no NVML: fall back to the maximum below
            clock_hz = None
    clock_hz = clock_hz or getattr(dev, "CLOCK_RATE", 1e6) * 1e3  # kHz: the maximum SM clock
    seed = cuda.to_device(np.array([0, 0x00010001], np.uint32))  # subnormal halves: no overflow
    rows = []
    name = getattr(dev, "name", "simulator")
    print(f"device: {name.decode() if isinstance(name, bytes) else name}, {sms} SMs, "
          f"clock {clock_hz / 1e9:.2f} GHz; iters {ITERS}", flush=True)
    print(f"{'warps':>5s} {'chains':>6s} {'us':>9s} {'TFLOP/s':>8s} {'clk/HMMA/SMSP':>13s}", flush=True)
    for warps, chains in CASES:
        k = build(chains)
        blocks = sms * SM_BLOCKS
        threads = 32 * warps
        out = cuda.device_array(blocks * threads, np.float32)

        def launch(k=k, blocks=blocks, threads=threads, out=out):
            k[blocks, threads](seed, ITERS, out)

        t = common.time_it(launch, cuda.synchronize, torch, has_torch)
        hmma = blocks * warps * chains * ITERS  # warp instructions
        row = {"warps_per_block": warps, "blocks_per_sm": SM_BLOCKS, "chains": chains, "iters": ITERS, "us": t,
               "clock_hz": clock_hz, "sms": sms, "hmma": hmma}
        if t is not None:
            row["tflops"] = hmma * 2 * 16 * 8 * 16 / t / 1e6
            row["clk_per_hmma_per_smsp"] = (t * 1e-6 * clock_hz) / (hmma / (4 * sms))
        rows.append(row)
        us = "-" if t is None else f"{t:.1f}"
        tf = "-" if t is None else f"{row['tflops']:.1f}"
        cyc = "-" if t is None else f"{row['clk_per_hmma_per_smsp']:.2f}"
        print(f"{warps:5d} {chains:6d} {us:>9s} {tf:>8s} {cyc:>13s}", flush=True)
    common.emit(rows, "gpu_probe_mma")
    return 0


if __name__ == "__main__":
    sys.exit(main())
