"""python -m bench.ptx: compile every CUDA kernel for real chips without a GPU.

Each kernel of kernels_cuda (the KERNELS table below: every kernel the CUDA
implementations launch) is compiled with numba-cuda's ``compile_ptx`` for sm_80 (A100),
sm_87 (Jetson Orin) and sm_90 (H100), for float32 and float16 inputs, and assembled with
``ptxas -v -c`` (``-c``: the fp16 helpers leave extern calls that only a final link
resolves).  The table gives registers per thread, static shared memory, spill bytes and
the theoretical occupancy for the block size the dispatcher launches on that chip (the
launch rule of dispatch.cuda_impls evaluated with that chip's properties on a
representative shape).  Exit status 1 when a kernel fails to compile, spills, declares more than 48 KB of static
shared memory, or needs more registers than its largest launch can get: a CI gate.

Must run WITHOUT the simulator (compile_ptx fails under NUMBA_ENABLE_CUDASIM=1).

    python -m bench.ptx [--arch sm_80,sm_90] [--dtype float32] [--only gemm] [--json FILE]
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

ARCHS = ("sm_80", "sm_87", "sm_90")
DTYPES = ("float32", "float16")
STATIC_SMEM = 48 * 1024  # the most static shared memory a kernel may declare
MAX_BLOCKS_PER_SM = {"sm_80": 32, "sm_87": 16, "sm_90": 32}


def ptxas_path() -> str:
    import nvidia

    for base in nvidia.__path__:
        hits = glob.glob(os.path.join(base, "**", "bin", "ptxas"), recursive=True)
        if hits:
            return hits[0]
    from shutil import which

    p = which("ptxas")
    if p:
        return p
    raise RuntimeError("ptxas not found: install nvidia-cuda-nvcc (pip install '.[cuda]')")


def kernels():
    """name -> (family, get(dtype) -> cuda dispatcher, argtypes(dtype) -> tuple of numba types)."""
    from numba import types as T

    from kernels_cuda import activation, attention, gemm, layout, norm, rope, softmax

    def arr(dt, nd, layout_="C"):
        return T.Array(dt, nd, layout_)

    def acc(dt):
        return T.float64 if dt == T.float64 else T.float32

    def acc_np(dt):
        return np.float64 if dt == T.float64 else np.float32

    b, i64, f64 = T.boolean, T.int64, T.float64
    table = {
        "activation.unary": ("activation", lambda dt: activation.unary_kernel(acc_np(dt)),
                             lambda dt: (arr(dt, 1), arr(dt, 1), i64)),
        "activation.gated": ("activation", lambda dt: activation.gated_kernel(acc_np(dt)),
                             lambda dt: (arr(dt, 1), arr(dt, 1), arr(dt, 1), i64)),
        "softmax.warp_rows": ("softmax", lambda dt: softmax.warp_rows(acc_np(dt)),
                              lambda dt: (arr(dt, 2), arr(dt, 2), b)),
        "softmax.block_rows": ("softmax", lambda dt: softmax.block_rows(acc_np(dt)),
                               lambda dt: (arr(dt, 2), arr(dt, 2), b)),
        "softmax.columns": ("softmax", lambda dt: softmax.columns(acc_np(dt)),
                            lambda dt: (arr(dt, 3), arr(dt, 3), b)),
        "cross_entropy.warp_rows": ("softmax", lambda dt: softmax.cross_entropy_rows(acc_np(dt)),
                                    lambda dt: (arr(dt, 2), arr(i64, 1), i64, arr(acc(dt), 1), arr(acc(dt), 1), arr(i64, 1))),
        "cross_entropy.block_rows": ("softmax", lambda dt: softmax.cross_entropy_block_rows(acc_np(dt)),
                                     lambda dt: (arr(dt, 2), arr(i64, 1), i64, arr(acc(dt), 1), arr(acc(dt), 1), arr(i64, 1))),
        "cross_entropy.reduce": ("softmax", lambda dt: softmax.sum_losses(acc_np(dt)),
                                 lambda dt: (arr(acc(dt), 1), arr(acc(dt), 1), b, arr(dt, 1))),
    }
    for fam, rms in (("layer_norm", False), ("rms_norm", True)):
        for kind in ("warp", "block"):
            table[f"{fam}.{kind}_rows"] = (
                "norm", (lambda kind, rms: lambda dt: norm.make(kind, rms, acc_np(dt)))(kind, rms),
                lambda dt: (arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 1), arr(dt, 1), f64, arr(dt, 2), b, b, b))
    table["rope.pairs"] = ("rope", lambda dt: rope.rope_kernel(acc_np(dt)),
                           lambda dt: (arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 2), b))
    for dmax in attention.TILES:
        table[f"attention.flash_d{dmax}"] = (
            "attention", (lambda dmax: lambda dt: attention.flash_kernel(acc_np(dt), dmax))(dmax),
            lambda dt: (arr(dt, 4), arr(dt, 4), arr(dt, 4), arr(T.boolean, 4), i64, b, f64, arr(dt, 4),
                        arr(acc(dt), 5), arr(acc(dt), 5)))
    table["attention.combine"] = ("attention", lambda dt: attention.combine_kernel(acc_np(dt)),
                                  lambda dt: (arr(acc(dt), 5), arr(acc(dt), 5), arr(dt, 4)))
    for tile in gemm.CONFIGS:
        table[f"gemm.{tile}"] = ("linalg", (lambda tile: lambda dt: gemm.gemm_kernel(acc_np(dt), tile))(tile),
                                 lambda dt: (arr(dt, 3), arr(dt, 3), arr(i64, 1), arr(i64, 1), arr(dt, 1), arr(dt, 3), i64, b, b))
    for nd in (1, 2, 3, 4):
        table[f"layout.copy{nd}"] = ("layout", (lambda nd: lambda dt: layout._COPY[nd])(nd),
                                     (lambda nd: lambda dt: (arr(dt, nd, "A"), arr(dt, nd)))(nd))
    for name, spec in _optional_kernels().items():
        table[name] = spec
    return table


def _optional_kernels():
    """Kernels of families added later (rope, attention) register here when present."""
    out = {}
    try:
        from kernels_cuda import catalog_extra
    except ImportError:
        return out
    return catalog_extra.kernels()


# Representative calls: which block size the dispatcher launches each kernel with.
def _zeros(shape, dtype=np.float32):
    return np.broadcast_to(np.zeros((), dtype), shape)


def representative_calls():
    """(kernel name, op, implementation, args, kwargs) evaluated with each chip's props."""
    z = _zeros
    calls = [
        ("activation.unary", "gelu", "cuda-elementwise", (z((128, 3072)),), {}),
        ("activation.gated", "swiglu", "cuda-elementwise", (z((128, 11008)), z((128, 11008))), {}),
        ("softmax.warp_rows", "softmax", "cuda-warp-row", (z((12, 128, 128)),), {}),
        ("softmax.block_rows", "softmax", "cuda-block-row", (z((128, 50257)),), {}),
        ("softmax.columns", "softmax", "cuda-warp-row", (z((16, 512, 64)), 1), {}),
        ("cross_entropy.warp_rows", "cross_entropy", "cuda-warp-row", (z((128, 1000)), np.zeros(128, np.int64)), {}),
        ("cross_entropy.block_rows", "cross_entropy", "cuda-block-row", (z((128, 50257)), np.zeros(128, np.int64)), {}),
        ("layer_norm.warp_rows", "layer_norm", "cuda-warp-row", (z((128, 768)), z((768,)), z((768,))), {}),
        ("layer_norm.block_rows", "layer_norm", "cuda-block-row", (z((512, 4096)), z((4096,)), z((4096,))), {}),
        ("rms_norm.warp_rows", "rms_norm", "cuda-warp-row", (z((128, 768)), z((768,))), {}),
        ("rms_norm.block_rows", "rms_norm", "cuda-block-row", (z((512, 4096)), z((4096,))), {}),
        ("rope.pairs", "rope", "cuda-elementwise", (z((1, 32, 512, 128)), z((512, 64)), z((512, 64))), {}),
        ("attention.flash_d64", "attention", "cuda-flash", (z((1, 12, 512, 64)),) * 3, {}),
        ("attention.flash_d128", "attention", "cuda-flash", (z((1, 32, 512, 128)),) * 3, {"causal": True}),
    ]
    try:
        from kernels_cuda import catalog_extra

        calls += catalog_extra.representative_calls(z)
    except ImportError:
        pass
    return calls


def launch_threads(chip: str) -> dict:
    """kernel name -> threads per block the dispatcher uses on this chip."""
    from dispatch import devices, registry

    out = {"cross_entropy.reduce": 256, "attention.combine": 256}
    for nd in (1, 2, 3, 4):
        out[f"layout.copy{nd}"] = 256
    with devices.assume(devices.CHIPS[chip]):
        for kname, op, impl, args, kw in representative_calls():
            o = registry.OPS.get(op)
            if o is None or impl not in o.implementations:
                continue
            call = o.describe(*args, **kw)
            cfg = o.implementations[impl].launch_config(call)
            out[kname] = cfg["block"] if isinstance(cfg["block"], int) else math.prod(cfg["block"])
        from dispatch.cuda_impls import linalg

        for name, bm, bn, thr, smem in linalg.TILES:
            out[f"gemm.{name}"] = thr
    return out


def max_launch_threads(name: str, representative: int) -> int:
    """The largest block the dispatcher may launch this kernel with (block-per-row kernels
    grow their block with the row length up to 1024 threads)."""
    return 1024 if name.endswith("block_rows") else representative


def occupancy(chip: str, threads: int, regs: int, smem: int) -> float:
    """Theoretical occupancy (resident warps / max warps per SM), CUDA occupancy-calculator rules:
    registers allocated per warp in units of 256, 1 KB of shared memory reserved per block."""
    from dispatch import devices

    p = devices.CHIPS[chip]
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = (p.regs_per_sm // regs_per_warp) // warps
    by_smem = p.smem_per_sm // (smem + 1024)
    by_threads = p.max_threads_per_sm // threads
    blocks = min(by_regs, by_smem, by_threads, MAX_BLOCKS_PER_SM[chip])
    return blocks * warps * 32 / p.max_threads_per_sm


_RE = {
    "regs": re.compile(r"Used (\d+) registers"),
    "smem": re.compile(r"(\d+) bytes smem"),
    "spill_st": re.compile(r"(\d+) bytes spill stores"),
    "spill_ld": re.compile(r"(\d+) bytes spill loads"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
}


_SHARED = re.compile(r"\.shared\s+\.align\s+\d+\s+\.b8\s+\w+\[(\d+)\]")


def compile_one(name, get, argtypes, dtype, arch, ptxas, tmpdir):
    from numba import cuda
    from numba import types as T

    dt = {"float32": T.float32, "float16": T.float16, "float64": T.float64}[dtype]
    cc = (int(arch[3]), int(arch[4]))
    disp = get(dt)
    opts = getattr(disp, "targetoptions", {}) or {}
    # the dispatcher's own options (launch bounds, fastmath) apply to this compile too
    ptx, _ = cuda.compile_ptx(disp.py_func, argtypes(dt), cc=cc, launch_bounds=opts.get("launch_bounds"),
                              fastmath=bool(opts.get("fastmath", False)))
    path = os.path.join(tmpdir, f"{name}.{dtype}.{arch}.ptx".replace("/", "_"))
    with open(path, "w") as f:
        f.write(ptx)
    r = subprocess.run([ptxas, "-v", f"-arch={arch}", "-c", path, "-o", path + ".o"],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr.strip()[-2000:])
    info = {k: sum(int(x) for x in rx.findall(r.stderr)) for k, rx in _RE.items()}
    info["regs"] = max((int(x) for x in _RE["regs"].findall(r.stderr)), default=0)
    # numba declares shared arrays as module-level .shared variables, which ptxas -c does
    # not attribute to the kernel: count them from the PTX (one kernel per module here).
    info["smem"] += sum(int(x) for x in _SHARED.findall(ptx))
    return info


def run(archs=ARCHS, dtypes=DTYPES, only=None, verbose=True):
    """Compile everything; returns the list of row dicts."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise SystemExit("bench.ptx must run without NUMBA_ENABLE_CUDASIM (compile_ptx needs the real CUDA target)")
    ptxas = ptxas_path()
    table = kernels()
    threads = {a: launch_threads(a) for a in archs}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (family, get, argtypes) in table.items():
            if only and not any(o in name for o in only):
                continue
            for dtype in dtypes:
                if family == "layout" and dtype != "float32":
                    continue
                for arch in archs:
                    t0 = time.time()
                    row = {"kernel": name, "family": family, "dtype": dtype, "arch": arch}
                    try:
                        info = compile_one(name, get, argtypes, dtype, arch, ptxas, tmp)
                        row.update(info)
                        thr = threads[arch].get(name, 256)
                        row["threads"] = thr
                        row["occupancy"] = occupancy(arch, thr, info["regs"], info["smem"])
                        errors = []
                        if info["spill_st"] or info["spill_ld"]:
                            errors.append("spills")
                        if info["smem"] > STATIC_SMEM:
                            errors.append(f"static shared memory {info['smem']} B > {STATIC_SMEM} B")
                        biggest = max_launch_threads(name, thr)
                        if occupancy(arch, biggest, info["regs"], info["smem"]) == 0:
                            errors.append(f"{info['regs']} registers x {biggest} threads do not fit one SM: "
                                          "the largest launch would fail")
                        row["ok"] = not errors
                        row["error"] = "; ".join(errors)
                    except Exception as exc:  # noqa: BLE001 - reported in the table, CI fails
                        row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
                    row["compile_s"] = round(time.time() - t0, 2)
                    rows.append(row)
                    if verbose:
                        print(_fmt(row), flush=True)
    return rows


HEADER = f"{'kernel':28s} {'dtype':8s} {'arch':6s} {'regs':>4s} {'smem B':>7s} {'spill B':>7s} {'threads':>7s} {'occup.':>6s}  status"


def _fmt(r):
    if "regs" not in r:
        return f"{r['kernel']:28s} {r['dtype']:8s} {r['arch']:6s} {'-':>4s} {'-':>7s} {'-':>7s} {'-':>7s} {'-':>6s}  FAIL {r['error']}"
    spill = r["spill_st"] + r["spill_ld"]
    return (f"{r['kernel']:28s} {r['dtype']:8s} {r['arch']:6s} {r['regs']:4d} {r['smem']:7d} {spill:7d} "
            f"{r['threads']:7d} {r['occupancy']:6.0%}  {'ok' if r['ok'] else 'FAIL ' + r['error']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default=",".join(ARCHS))
    ap.add_argument("--dtype", default=",".join(DTYPES))
    ap.add_argument("--only", default="", help="comma-separated substrings of kernel names")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--no-model", action="store_true", help="skip the performance model table")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    print(HEADER)
    t0 = time.time()
    rows = run(a.arch.split(","), a.dtype.split(","), [s for s in a.only.split(",") if s])
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows)} kernel builds in {time.time() - t0:.0f} s; {len(bad)} failed or spilled")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not a.no_model:
        from bench import cuda_model

        print()
        cuda_model.print_table(cuda_model.predictions(None, ptx_rows=rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
