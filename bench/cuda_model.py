"""Performance model of the CUDA kernels: roofline time adjusted for occupancy and grid fill.

For each benchmark case (bench/cases) and each GPU, the op's own work model (``Op.flops`` / ``Op.bytes``, the
same numbers the CPU report's roofline uses: FLOPs done and the fewest bytes moved) gives

    roofline  = max(bytes / bandwidth, flops / fp32 peak)   (non-tensor-core fp32)

which is then divided by what the launch configuration lets the chip reach:
- occupancy: theoretical occupancy of the kernel the dispatcher picks on that chip
  (registers and shared memory from `python -m bench.ptx`, block size from the launch
  rule); a memory-bound kernel needs about OCC_SAT_MEM of the warps resident to keep
  enough loads in flight (Little's law on ~600 ns DRAM latency), a compute-bound one
  OCC_SAT_FLOP (the register tile supplies the rest of the ILP): efficiency
  min(1, occupancy / saturation);
- grid fill: a grid of fewer blocks than SMs leaves SMs idle (fraction blocks / SMs), and
  a grid of several waves pays for its partial last wave;
plus LAUNCH_S per kernel launch.  The result is a prediction of the best this kernel can
do, not a measurement: there is no GPU here.  ``predictions(cases)`` returns
[{op, case, gpu, seconds, bound, ...}] for the performance report.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

GPUS = {
    # name: (chip key in dispatch.devices.CHIPS, bytes/s, fp32 FLOP/s non-tensor)
    "H100 SXM": ("sm_90", 3.35e12, 67e12),
    "A100 80GB SXM": ("sm_80", 2.0e12, 19.5e12),
    "Jetson AGX Orin": ("sm_87", 204.8e9, 5.3e12),
}
OCC_SAT_MEM = 0.5
OCC_SAT_FLOP = 0.25
LAUNCH_S = 3e-6
DEFAULT_OCCUPANCY = 0.5  # when no ptxas numbers are available (e.g. under the simulator)
PTX_CACHE = os.path.join("bench_out", "ptx.json")


def _case_calls(cases):
    """(op, case name, args, kwargs) of the bench cases: the op's own inputs, zeros drawn
    without a generator (only shapes and dtypes matter here)."""
    out = []
    for c in cases:
        args, kw = c.call_args(c.inputs(None, np.float32, shape_only=True))
        out.append((c.op, c.name, args, kw))
    return out


def _ptx_rows(kernel_names, archs):
    """ptxas results: from bench_out/ptx.json when present, else compiled now (float32)."""
    if os.path.exists(PTX_CACHE):
        with open(PTX_CACHE) as f:
            return json.load(f)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return []
    try:
        from bench import ptx

        return ptx.run(archs, ("float32",), only=sorted(kernel_names), verbose=False)
    except Exception:  # noqa: BLE001 - no numba-cuda / nvcc: fall back to the default
        return []


def predictions(cases=None, ptx_rows=None):
    """[{op, case, gpu, seconds, bound, kernel, launch, occupancy, roofline_s, flops, bytes}]"""
    import dispatch  # noqa: F401  (registers the ops and the CUDA implementations)
    from dispatch import devices, registry

    from bench import cases as bc

    from dispatch import select

    plans = []
    for op_name, case_name, args, kw in _case_calls(bc.CASES if cases is None else cases):
        op = registry.OPS[op_name]
        call = op.describe(*args, **kw)
        # what the dispatcher would run for the same call on a GPU (its CUDA rule, no
        # overrides or tuning): asked, not re-derived
        impl = select.rule_choice(call.key._replace(device="cuda"))
        plans.append((op_name, case_name, call, impl, None if impl else "no CUDA implementation"))

    launches = {}
    needed = set()
    for gname, (chip, bw, peak) in GPUS.items():
        with devices.assume(devices.CHIPS[chip]):
            for i, (op_name, case_name, call, impl, err) in enumerate(plans):
                if impl is None:
                    continue
                cfg = impl.launch_config(call)
                launches[(i, gname)] = cfg
                needed.add(cfg.get("kernel", ""))
    if ptx_rows is None:
        ptx_rows = _ptx_rows(needed, tuple(c for c, _, _ in GPUS.values()))
    occ = {(r["kernel"], r["arch"]): r for r in ptx_rows if r.get("dtype", "float32") == "float32" and "regs" in r}

    from bench import ptx as ptxmod

    out = []
    for i, (op_name, case_name, call, impl, err) in enumerate(plans):
        for gname, (chip, bw, peak) in GPUS.items():
            row = {"op": op_name, "case": case_name, "gpu": gname}
            if impl is None:
                row.update(seconds=None, bound=err)
                out.append(row)
                continue
            op = registry.OPS[op_name]
            flops, nbytes = float(op.flops(call)), float(op.bytes(call))
            t_mem, t_flop = nbytes / bw, flops / peak
            bound = "memory" if t_mem >= t_flop else "compute"
            roof = max(t_mem, t_flop)
            cfg = launches[(i, gname)]
            kname = cfg.get("kernel", "")
            threads = cfg["block"] if isinstance(cfg["block"], int) else math.prod(cfg["block"])
            r = occ.get((kname, chip))
            if r is not None:
                occupancy = ptxmod.occupancy(chip, threads, r["regs"], r["smem"])
                occ_src = "ptxas"
            else:
                occupancy, occ_src = DEFAULT_OCCUPANCY, "assumed"
            sat = OCC_SAT_MEM if bound == "memory" else OCC_SAT_FLOP
            eff = min(1.0, occupancy / sat)
            grid = cfg["grid"]
            blocks = grid if isinstance(grid, int) else math.prod(grid)
            p = devices.CHIPS[chip]
            per_sm = max(1, round(occupancy * p.max_threads_per_sm / threads))
            resident = p.sm_count * per_sm
            if blocks < p.sm_count:
                fill = blocks / p.sm_count
            else:
                waves = math.ceil(blocks / resident)
                fill = blocks / (waves * resident) if waves > 1 else 1.0
            launches_n = 2 if cfg.get("reduce") else 1
            seconds = roof / (eff * fill) + LAUNCH_S * launches_n
            row.update(seconds=seconds, bound=bound, roofline_s=roof, flops=flops, bytes=nbytes,
                       impl=impl.name, kernel=kname, threads=threads, blocks=blocks,
                       occupancy=occupancy, occupancy_source=occ_src, efficiency=eff * fill)
            out.append(row)
    return out


def print_table(rows):
    print(f"{'op':14s} {'case':32s} {'gpu':16s} {'bound':8s} {'kernel':26s} {'occ':>4s} {'eff':>5s} {'roofline':>10s} {'predicted':>10s}")
    for r in rows:
        if r.get("seconds") is None:
            print(f"{r['op']:14s} {r['case'][:32]:32s} {r['gpu']:16s} {r['bound']}")
            continue
        print(f"{r['op']:14s} {r['case'][:32]:32s} {r['gpu']:16s} {r['bound']:8s} {r['kernel'][:26]:26s} "
              f"{r['occupancy']:4.0%} {r['efficiency']:5.0%} {r['roofline_s'] * 1e6:8.1f}us {r['seconds'] * 1e6:8.1f}us")


def main():
    import sys

    sys.path.insert(0, os.getcwd())
    print_table(predictions())


if __name__ == "__main__":
    main()
