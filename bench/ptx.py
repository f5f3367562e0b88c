"""python -m bench.ptx: compile every CUDA kernel for real chips without a GPU.

Each kernel declared in a kernels_cuda module's ``PTX`` list (kernels_cuda._jit.PtxBuild,
beside the kernel; a kernel the dispatcher launches without a declaration is a failure)
is compiled with numba-cuda's ``compile_ptx`` for sm_80 (A100),
sm_87 (Jetson Orin) and sm_90 (H100), for every input dtype the dispatcher accepts on CUDA
(float32, float16, float64: each kernel for the dtypes its declaration lists), and assembled with
``ptxas -v -c -o X.o`` (``-c``: the fp16 helpers leave extern calls that only a final link
resolves).  The table gives registers per thread, static shared memory, spill bytes and
the theoretical occupancy for the largest block the dispatcher launches on that chip (the
launch rules of dispatch.cuda_impls evaluated with that chip's properties on every
benchmark case of bench/cases, in every dtype), and the instruction mix of the kernel's
hottest loop, read from the object's SASS with nvdisasm (bench/sass.py): per iteration
FFMA, HMMA, shared and global loads, stores, all instructions.  Exit status 1 when a kernel fails to compile, spills, declares more than 48 KB of static
shared memory, needs more registers than its largest launch can get, or is launched by the
dispatcher for a dtype its declaration does not build: a CI gate.

``--json FILE`` rows, one per (kernel, dtype, arch): ``registers``, ``shared_bytes``,
``spill_bytes``, ``occupancy``, ``inner_loop`` ({"ffma", "hmma", "ld_shared", "ld_global",
"st", "total", ...} per iteration, or {"error": why}) and ``predicted_us`` ({benchmark case id:
microseconds} predicted by bench/cuda_model.py for the chip of that arch, for the cases that
launch this kernel in this dtype); also the older names ``regs``, ``smem`` (static shared
memory only, which the 48 KB gate reads; ``shared_bytes`` adds a block's dynamic shared memory), ``spill_st``,
``spill_ld`` and ``stack`` (bytes of local-memory stack frame), and ``compile_s`` / ``sass_s``
(seconds for the whole build / its share of its batch's disassembly and reading: the SASS
of one arch is read 32 objects at a time, bench/sass.py's analyze_many).

Must run WITHOUT the simulator (compile_ptx fails under NUMBA_ENABLE_CUDASIM=1).

    python -m bench.ptx [--arch sm_80,sm_90] [--dtype float32] [--only gemm] [--json FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

from kernels_common.cuda_tiles import STATIC_SMEM

from bench import sass

ARCHS = ("sm_80", "sm_87", "sm_90")
DTYPES = ("float32", "float16", "float64")  # every dtype the dispatcher accepts on CUDA
MAX_BLOCKS_PER_SM = {"sm_80": 32, "sm_87": 16, "sm_90": 32}


def ptxas_path() -> str:
    return sass.cuda_tool("ptxas", "nvidia-cuda-nvcc")


def kernels():
    """name -> PtxBuild: every kernel declared in a kernels_cuda module's PTX list."""
    import importlib
    import pkgutil

    import kernels_cuda

    table = {}
    for info in sorted(pkgutil.iter_modules(kernels_cuda.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"kernels_cuda.{info.name}")
        for build in getattr(mod, "PTX", ()):
            if build.name in table:
                raise RuntimeError(f"kernel {build.name!r} declared twice (kernels_cuda.{info.name})")
            table[build.name] = build
    return table


def _launched_kernels(cfg):
    """(kernel name, threads) of a launch configuration and its follow-up passes."""
    out = []
    while cfg:
        block = cfg["block"]
        out.append((cfg["kernel"], block if isinstance(block, int) else math.prod(block)))
        cfg = cfg.get("reduce")
    return out


def launches_by_chip(chips, dtypes=DTYPES) -> dict:
    """{chip: {kernel name: {"threads": the largest block the dispatcher launches it with on
    that chip, "dtypes": the input dtypes it is launched for}}}, over every CUDA
    implementation of every op on every benchmark case in every dtype (the launch rules
    evaluated with each chip's properties; no GPU needed).  Each case is described once for
    all chips (describing draws the inputs: the larger part of this function's time)."""
    from bench import cases as bc
    from bench.cuda_model import describe
    from dispatch import devices, registry

    out = {chip: {} for chip in chips}
    for case in bc.CASES:
        op = registry.OPS[case.op]
        for dtype in dtypes:
            try:
                call = describe(case, dtype)
            except (TypeError, ValueError):  # the op does not take this dtype
                continue
            for chip in chips:
                with devices.assume(devices.CHIPS[chip]):
                    for impl in op.implementations.values():
                        if impl.device != "cuda" or impl.refusals(call.key._replace(device="cuda")):
                            continue
                        for name, threads in _launched_kernels(impl.launch_config(call)):
                            k = out[chip].setdefault(name, {"threads": 0, "dtypes": set()})
                            k["threads"] = max(k["threads"], threads)
                            k["dtypes"].add(dtype)
    return out


def _runs_on(build, arch) -> bool:
    """Whether the dispatcher may run `build` on chip `arch` (its PtxBuild.fits rule with the
    chip's shared memory; no rule: every chip), and it exists there (PtxBuild.archs)."""
    if build.archs is not None and arch not in build.archs:
        return False
    if build.fits is None:
        return True
    from dispatch import devices

    p = devices.CHIPS[arch]
    return build.fits(p.smem_per_block_optin, p.smem_per_sm)


def undeclared(table, launched) -> list:
    """Kernel names the dispatcher launches that no kernels_cuda module declares for the
    PTX report: such a kernel would escape the spill and shared-memory gates."""
    return sorted(set(launched) - set(table))


def unbuilt_dtypes(table, launched: dict, dtypes=DTYPES) -> list:
    """(kernel, dtype) pairs the dispatcher launches (launched: launches_by_chip()[chip]) that the kernel's
    declaration does not build: that compile would escape the gates (float64 shared tiles
    over 48 KB)."""
    return sorted((name, dt) for name, k in launched.items() if name in table
                  for dt in k["dtypes"] if dt in dtypes and dt not in table[name].dtypes)


def occupancy(chip: str, threads: int, regs: int, smem: int) -> float:
    """Theoretical occupancy (resident warps / max warps per SM), CUDA occupancy-calculator rules:
    registers allocated per warp in units of 256, 1 KB of shared memory reserved per block."""
    from dispatch import devices
    from kernels_common.cuda_tiles import SMEM_RESERVED_PER_BLOCK

    p = devices.CHIPS[chip]
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = (p.regs_per_sm // regs_per_warp) // warps
    by_smem = p.smem_per_sm // (smem + SMEM_RESERVED_PER_BLOCK)
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


# numba-cuda's lowering depends on the compute capability only below 7.5 (mathimpl's
# tanh.approx from 7.5, nvvmutils' atomics from 6.0): for chips at or above it the typed,
# lowered library is the same, and only NVVM and ptxas run per chip.  Sharing the front
# end across sm_80/87/90 cut the step's work per build by about a quarter (2026-11-25, 14
# kernels on a busy host: front end 0.42 s once, then per chip NVVM 0.11 s, ptxas 0.16 s,
# SASS reading 0.32 s).
SHARED_FRONT_END_FROM = (7, 5)
# NVVM's PTX for chips of one major compute capability differs only in its ".target" line
# (sm_80 against sm_87 compared whole, 2026-12-02: layer_norm.block_rows, gemm.128x64x8/8x4,
# attention.tc_d64, moe.grouped_128x64x8/8x4; NVVM 0.15-0.6 s a call on a busy host), so it
# runs once per major and the others take that PTX retargeted.  sm_90 keeps its own run:
# the NVPTX back end may select instructions that only sm_90 has.


def _cc(arch: str) -> tuple:
    return int(arch[3]), int(arch[4])


@contextlib.contextmanager
def _device_cc(cc):
    """Device functions compiled for `cc` without a driver.  numba-cuda compiles a called
    device function for the current device's compute capability (CUDADispatcher
    .compile_device asks the driver); here the chip being built stands in for it.  The
    device function keeps that compile for the rest of the process (its dispatcher caches
    it by argument types): the same typed code for every chip from SHARED_FRONT_END_FROM
    up, which NVVM then compiles for the kernel's own chip."""
    from numba.cuda import dispatcher

    class _Chip:
        compute_capability = cc[:2]

    real = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Chip
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def compile_many(name, get, argtypes, dtype, archs, ptxas, tmpdir, requires=(), arch_specific=False):
    """ptxas -v results of one kernel in one dtype for several chips: {arch: info (registers,
    shared memory, spills, the object's path), or the exception its build raised};
    arch_specific: for the chips' "a" targets (sm_90a), as PtxBuild.arch_specific."""
    from numba.cuda import compiler
    from numba import types as T

    dt = {"float32": T.float32, "float16": T.float16, "float64": T.float64}[dtype]
    disp = get(dt)
    opts = getattr(disp, "targetoptions", {}) or {}
    out, libs, ptxs = {}, {}, {}
    for arch in dict.fromkeys(archs):  # a chip named twice is built once (not retargeted onto itself)
        cc = _cc(arch)
        front = SHARED_FRONT_END_FROM if cc >= SHARED_FRONT_END_FROM else cc
        target = arch + ("a" if arch_specific else "")
        try:
            if front not in libs:
                # what cuda.compile_ptx does, with the library kept for the other chips;
                # the dispatcher's own options (launch bounds, fastmath) apply here too
                with _device_cc(cc):
                    libs[front], _ = compiler._compile_pyfunc_with_fixup(
                        disp.py_func, argtypes(dt), device=False, abi="numba", cc=cc,
                        launch_bounds=opts.get("launch_bounds"), fastmath=bool(opts.get("fastmath", False)))
            same = (front, cc[0], arch_specific)  # NVVM's output the same but for .target
            if same in ptxs:
                done, done_target = ptxs[same]
                ptx = done.replace(f".target {done_target}\n", f".target {target}\n", 1)
                if ptx == done:
                    raise RuntimeError(f"no '.target {done_target}' line in the PTX to retarget")
            else:
                (ptx,) = libs[front].get_asm_strs(cc=cc + ("a",) if arch_specific else cc)
                ptxs[same] = ptx, target
            out[arch] = _assemble(ptx, f"{name}.{dtype}.{arch}", target, ptxas, tmpdir, requires)
        except Exception as exc:  # noqa: BLE001 - reported per chip by the caller
            out[arch] = exc
    return out


def _assemble(ptx, stem, arch, ptxas, tmpdir, requires):
    path = os.path.join(tmpdir, f"{stem}.ptx".replace("/", "_"))
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
    info["missing"] = [r for r in requires if r not in ptx]
    info["object"] = path + ".o"
    info["entry"] = sass.ptx_entry(ptx)
    return info


def run(archs=ARCHS, dtypes=DTYPES, only=None, verbose=True):
    """Compile everything; returns the list of row dicts."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise SystemExit("bench.ptx must run without NUMBA_ENABLE_CUDASIM (compile_ptx needs the real CUDA target)")
    archs = tuple(dict.fromkeys(archs))  # bench.cuda_model names sm_90 for the H100 and the H200
    ptxas = ptxas_path()
    table = kernels()
    launched = launches_by_chip(archs, dtypes)
    threads = {a: {n: k["threads"] for n, k in launched[a].items()} for a in archs}
    rows = []
    for a in archs:
        for name in undeclared(table, threads[a]):
            rows.append({"kernel": name, "family": "?", "dtype": "-", "arch": a, "ok": False,
                         "error": "launched by the dispatcher but not declared in a kernels_cuda PTX list"})
        for name, dt in unbuilt_dtypes(table, launched[a], dtypes):
            if not only or any(o in name for o in only):
                rows.append({"kernel": name, "family": table[name].family, "dtype": dt, "arch": a, "ok": False,
                             "error": f"launched by the dispatcher for {dt}, which its PtxBuild does not build"})
    # one job per (kernel, dtype), all chips in it: they share numba's front end
    # (a build declares the chips it may run on: those whose shared memory holds its blocks)
    jobs = [(name, build, dtype, chips)
            for name, build in table.items() if not only or any(o in name for o in only)
            for chips in [tuple((arch, threads[arch].get(name, build.threads)) for arch in archs if _runs_on(build, arch))]
            if chips
            for dtype in dtypes if dtype in build.dtypes]
    global _JOBS
    _JOBS = jobs
    nproc = min(len(jobs), max(1, int(os.environ.get("NK_PTX_JOBS", 0) or (os.cpu_count() or 1))))
    try:
        nvdisasm = sass.nvdisasm_path()
    except RuntimeError as exc:  # the SASS columns say why; the gates still run
        nvdisasm = f"unavailable: {exc}"
    with tempfile.TemporaryDirectory() as tmp:
        if nproc > 1:
            # each build is independent (compile_ptx needs no GPU or driver context): forked
            # workers, rows in job order; 2 processes on 2 cores halve the step
            import concurrent.futures as cf
            import multiprocessing as mp

            pool = cf.ProcessPoolExecutor(nproc, mp_context=mp.get_context("fork"))
            done = pool.map(_build_row, range(len(jobs)), [tmp] * len(jobs), [ptxas] * len(jobs),
                            [nvdisasm] * len(jobs))
        else:
            pool = None
            done = (_build_row(k, tmp, ptxas, nvdisasm) for k in range(len(jobs)))
        try:
            for chip_rows in done:
                rows.extend(chip_rows)
                if verbose:
                    print("\n".join(_fmt(r) for r in chip_rows), flush=True)
            _read_sass(rows, nvdisasm, tmp, pool)
        finally:
            if pool is not None:
                pool.shutdown()
    # rows in (arch, kernel, dtype) order, as before the chips shared a job
    order = {a: i for i, a in enumerate(archs)}
    rows.sort(key=lambda r: order.get(r["arch"], -1))
    return rows


_JOBS = []  # run()'s build list, read by _build_row in the forked workers


def _read_sass(rows, nvdisasm, tmp, pool):
    """Each built row's hottest-loop counts (``inner_loop``) from its object's SASS, read
    in batches per arch (sass.analyze_many: one nvdisasm call per batch, not per object;
    nvdisasm's fixed cost was half of this step's CPU time); ``sass_s``: the row's share
    of its batch's time."""
    built = [r for r in rows if "_object" in r]
    if nvdisasm.startswith("unavailable"):
        for r in built:
            r.pop("_object")
            r.update(inner_loop={"error": f"nvdisasm {nvdisasm}"}, sass_s=0.0)
        return
    jobs = []
    for arch in sorted({r["arch"] for r in built}):
        mine = [r for r in built if r["arch"] == arch]
        for b0 in range(0, len(mine), sass.BATCH):
            jobs.append((arch, {i: r["_object"] for i, r in enumerate(mine[b0:b0 + sass.BATCH])}, mine[b0:b0 + sass.BATCH]))
    args = ([a for a, _, _ in jobs], [o for _, o, _ in jobs], [nvdisasm] * len(jobs), [tmp] * len(jobs))
    for (_, _, batch), (loops, secs) in zip(jobs, (pool.map if pool is not None else map)(_sass_batch, *args)):
        for i, r in enumerate(batch):
            r.pop("_object")
            r["inner_loop"] = loops[i]
            r["sass_s"] = round(secs / len(batch), 3)
            r["compile_s"] = round(r["compile_s"] + r["sass_s"], 2)


def _sass_batch(arch, objects, nvdisasm, tmp):
    t0 = time.time()
    return sass.analyze_many(objects, arch, nvdisasm, tmpdir=tmp), time.time() - t0


def _build_row(k, tmp, ptxas, nvdisasm):
    """The report rows of build k of _JOBS, one per chip: compile, assemble, check, read
    the hot loop."""
    name, build, dtype, chips = _JOBS[k]
    t0 = time.time()
    infos = compile_many(name, build.get, build.argtypes, dtype, [a for a, _ in chips], ptxas, tmp, build.requires,
                          build.arch_specific)
    share = (time.time() - t0) / len(chips)
    rows = []
    for arch, thr in chips:
        t0 = time.time()
        row = {"kernel": name, "family": build.family, "dtype": dtype, "arch": arch}
        info = infos[arch]
        try:
            if isinstance(info, Exception):
                raise info
            row["_object"] = (info.pop("object"), info.pop("entry"))
            row.update(info)
            # shared_bytes: what a block takes, dynamic included; smem: the static arrays (the gate)
            row.update(registers=info["regs"], shared_bytes=info["smem"] + build.dynamic_shared,
                       spill_bytes=info["spill_st"] + info["spill_ld"])
            row["threads"] = thr
            row["occupancy"] = occupancy(arch, thr, info["regs"], info["smem"] + build.dynamic_shared)
            errors = []
            if info["spill_st"] or info["spill_ld"]:
                errors.append("spills")
            if info.pop("missing"):
                errors.append(f"the PTX lacks {build.requires} (the instruction the kernel is built on)")
            if info["smem"] > STATIC_SMEM:
                errors.append(f"static shared memory {info['smem']} B > {STATIC_SMEM} B")
            biggest = max(thr, build.threads)  # the kernel's own largest launch
            if occupancy(arch, biggest, info["regs"], info["smem"] + build.dynamic_shared) == 0:
                errors.append(f"{info['regs']} registers x {biggest} threads do not fit one SM: "
                              "the largest launch would fail")
            row["ok"] = not errors
            row["error"] = "; ".join(errors)
        except Exception as exc:  # noqa: BLE001 - reported in the table, CI fails
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        # the shared front end's time split evenly over the chips
        row["compile_s"] = round(share + time.time() - t0, 2)
        rows.append(row)
    return rows


HEADER = f"{'kernel':28s} {'dtype':8s} {'arch':6s} {'regs':>4s} {'smem B':>7s} {'spill B':>7s} {'threads':>7s} {'occup.':>6s}  status"


def _fmt(r):
    if "regs" not in r:
        return f"{r['kernel']:28s} {r['dtype']:8s} {r['arch']:6s} {'-':>4s} {'-':>7s} {'-':>7s} {'-':>7s} {'-':>6s}  FAIL {r['error']}"
    spill = r["spill_st"] + r["spill_ld"]
    return (f"{r['kernel']:28s} {r['dtype']:8s} {r['arch']:6s} {r['regs']:4d} {r['shared_bytes']:7d} {spill:7d} "
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
    if not a.no_model:
        from bench import cuda_model

        try:
            for preds in cuda_model.annotate(rows, a.dtype.split(",")).values():
                print()
                cuda_model.print_table(preds)
        except Exception as exc:  # noqa: BLE001 - the JSON is still written, then the step fails
            print(f"\nperformance model failed: {type(exc).__name__}: {exc}")
            bad.append({"model": str(exc)})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
