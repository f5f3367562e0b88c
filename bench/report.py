"""The performance report (`python -m bench`): the machine, its ceilings, every registered
op at model-derived shapes against the installed peers, compile times, the CUDA side as
predicted by bench.cuda_model, a table, JSON and a roofline plot.

Everything is driven by the registry and the op records: a new op is measured as soon as
its module registers it and bench/cases/<family>.py gives its shapes, with no edit here.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import accuracy
from . import cases as C
from . import peers as P
from . import ROOT, roofline, timing

AGREE_TOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10}
# a case with 16-bit activations has a 16-bit result: rounded to 8 (bfloat16) / 11 (float16)
# significant bits, so within 2^-8 / 2^-11 of the float64 value, plus the float32 sums' error
AGREE_TOL_HALF = {"bfloat16": 2.0 ** -8 + 1e-4, "float16": 2.0 ** -11 + 1e-4}


class Progress:
    """Progress lines on stderr (the table goes to stdout), with elapsed time."""

    def __init__(self, stream=None, quiet=False):
        self.t0 = time.perf_counter()
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def __call__(self, msg):
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", file=self.stream, flush=True)


# ---- the machine -------------------------------------------------------------------------

def _cpuinfo():
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("", platform.machine(), platform.processor()):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


SIMD = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
        "amx_tile", "neon", "asimd", "sve")


def machine_info() -> dict:
    import numba

    model, flags = _cpuinfo()
    info = {
        "cpu": model,
        "cores": os.cpu_count(),
        "simd": [f for f in SIMD if f in flags],
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
        "threading_layer": None,
        "python": platform.python_version(),
        "numba": numba.__version__,
        "numpy": np.__version__,
        "peers": P.installed(),
        "blas": None,
        "gpu": None,
    }
    try:
        import llvmlite.binding as ll

        info["llvm_cpu"] = ll.get_host_cpu_name()
    except Exception:  # noqa: BLE001
        pass
    from kernels_cpu import runtime as cpu_runtime
    info["vectors"] = cpu_runtime.vectors()
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture')}, {p.get('num_threads')} threads)"
                        for p in threadpool_info() if p.get("user_api") == "blas"]
    except Exception:  # noqa: BLE001
        info["blas"] = None
    info["gpu"] = gpu_info()
    return info


def gpu_info():
    """A description of the CUDA GPU, or why there is none (never raises)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "none (CUDA simulator enabled)"
    try:
        from numba import cuda

        if not cuda.is_available():
            return "none (numba-cuda finds no CUDA GPU)"
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        return f"{name} (compute capability {dev.compute_capability[0]}.{dev.compute_capability[1]})"
    except Exception as exc:  # noqa: BLE001
        return f"none ({exc.__class__.__name__}: {str(exc)[:80]})"


def threading_layer():
    from kernels_cpu import runtime
    return runtime.describe()


# ---- dispatch overhead -------------------------------------------------------------------

def dispatch_overhead(rounds=7) -> dict:
    """dispatch.relu on a 1-element float32 array minus the bare serial kernel call."""
    import dispatch
    from kernels_cpu import activation as KA
    from kernels_cpu.approx import ACT_RELU

    x = np.ones(1, np.float32)
    out = np.empty(1, np.float32)
    res = timing.interleaved({"dispatch.relu": lambda: dispatch.relu(x),
                              "kernel": lambda: KA.activation_serial(x, out, ACT_RELU)},
                             rounds=rounds, warmup=3, batch_s=0.02, pause_s=0.0)
    d, k = res["dispatch.relu"].median, res["kernel"].median
    return {"dispatch_s": d, "kernel_s": k, "overhead_s": d - k, "goal_s": 5e-6, "ok": d - k < 5e-6,
            "spread": max(res["dispatch.relu"].spread, res["kernel"].spread)}


# ---- compile times -----------------------------------------------------------------------

# The cold-start bar (issue #8): the first call of any single op, in a fresh process with an
# empty numba cache, within this many seconds on the 2-core CI machine kind.
COLD_BAR_S = 3.0


def compile_times(case_list, progress=None) -> dict:
    """Per op (its first case): first-call seconds in a fresh process with an empty numba
    cache of its own (cold), then in another fresh process with that cache filled (warm).
    One process per op and state, so no op is credited with kernels, numba overloads or
    the worker driver that another op compiled before it.  Returned per family:
    {family: {state: {"first_call_s": the slowest op's, "per_case": {case id: s},
    "compiles": {case id: where the call's compile time went (bench/compile_time.py)},
    "helpers": {case id: compile helper processes the cold call started, where any},
    "errors": {...}}}}."""
    first = {}
    for c in case_list:
        first.setdefault(c.op, c)
    out = {}
    for i, c in enumerate(first.values()):
        fam = out.setdefault(c.family, {})
        with tempfile.TemporaryDirectory(prefix="nk-numba-cache-") as cache:
            for state in ("cold", "warm"):
                if progress:
                    progress(f"compile time {i + 1}/{len(first)}: first call of {c.op} in a fresh process "
                             f"({state} numba cache)")
                env = dict(os.environ, NUMBA_CACHE_DIR=cache)
                proc = subprocess.run([sys.executable, "-m", "bench.compile_time", c.id], env=env,
                                      capture_output=True, text=True, cwd=ROOT)
                r = fam.setdefault(state, {"first_call_s": 0.0, "per_case": {}, "compiles": {}, "errors": {}})
                if proc.returncode != 0:
                    r["errors"][c.id] = (proc.stderr.strip().splitlines() or ["failed"])[-1]
                    continue
                data = json.loads(proc.stdout.strip().splitlines()[-1])
                if c.id in data["first_call_s"]:
                    r["per_case"][c.id] = data["first_call_s"][c.id]
                    r["first_call_s"] = max(r["first_call_s"], data["first_call_s"][c.id])
                if c.id in data.get("compiles", {}):
                    r["compiles"][c.id] = data["compiles"][c.id]
                if data.get("helpers", {}).get(c.id):
                    r.setdefault("helpers", {})[c.id] = data["helpers"][c.id]
                r["errors"].update(data["errors"])
    return out



# ---- one case ----------------------------------------------------------------------------

def rel_err(got, ref) -> float:
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf")
    scale = np.max(np.abs(ref)) if ref.size else 0.0
    diff = np.abs(got - ref)
    both_inf = np.isinf(got) & np.isinf(ref) & (np.sign(got) == np.sign(ref))
    diff = np.where(both_inf, 0.0, diff)
    if not np.all(np.isfinite(diff)):
        return float("inf")
    return float(np.max(diff) / scale) if scale > 0 else float(np.max(diff))


def _public(op):
    import dispatch

    return getattr(dispatch, op)


# Interleaved rounds per case ({quick?: n}), and the most a case gets while a candidate's
# spread stays above timing.MAX_SPREAD.  This host kind is shared and noisy: in a quick
# report on the 2-vCPU Zen 4 VM (2026-12-01), 57 of 58 cases had some candidate's spread
# above 25% after 3 rounds (matmul 128x768x768: ours 4.68 ms +-77%, 1.0-1.15 ms in quiet
# runs), and 7 rounds left most above it still (the pools: ours 144-312 us, onnxruntime
# 101-128).  Up to 5 then lets the median stand on three of five samples at about 2 s more
# per case (+1.5 to 2 minutes on the quick set there); a quiet host stops at 3.
ROUNDS = {True: 3, False: 7}
MAX_ROUNDS = {True: 5, False: 11}


def measure_case(case, ceilings, *, dtype=np.float32, rounds=5, max_rounds=None, peers=P.PEERS,
                 pause_s=timing.PAUSE_S, progress=None, rng=None) -> dict:
    """Time dispatch.<op> and the peers on one case; returns the row (see report JSON).
    rounds, max_rounds: as timing.interleaved (rounds are added while a spread is high)."""
    from dispatch import registry
    from dispatch.explain import explain
    from dispatch.quantized import QuantizedArray

    rng = rng or np.random.default_rng()
    row = {"op": case.op, "case": case.name, "case_id": case.id, "label": case.label, "model": case.model,
           "family": case.family, "dtype": str(np.dtype(dtype)), "shapes": {k: list(v) for k, v in case.shapes.items()},
           "status": "ok", "notes": []}
    op = registry.OPS[case.op]
    inputs = case.inputs(rng, dtype)
    args, kwargs = case.call_args(inputs)
    try:
        call = op.describe(*args, **kwargs)
        ex = explain(case.op, *args, **kwargs)
    except (TypeError, ValueError) as exc:
        row["status"] = "skipped"
        row["notes"].append(f"bench/cases arguments do not fit dispatch.{case.op}: {exc}")
        return row
    row["impl"] = ex.chosen
    row["impl_source"] = ex.source
    flops, nbytes = float(op.flops(call)), float(op.bytes(call))
    row.update(flops=flops, bytes=nbytes, floor_s=roofline.floor_seconds(flops, nbytes, ceilings))
    fn = _public(case.op)

    candidates, library, convert = {}, {}, {}
    candidates["ours"] = lambda: fn(*args, **kwargs)
    # the threads a call leaves spinning are its implementation's: when the dispatcher hands
    # the call to numpy's OpenBLAS, the next candidate (our prepacked GEMM, a numba pool)
    # must wait for them as it would after numpy.  Without the pause, MiniLM's 128x384x384
    # prepacked matmul timed 192-198 us after ours (blas) and 117-119 us after onnxruntime
    # in one run (Zen 5, 2026-11-27); alone it runs at 137.
    library["ours"] = "openblas" if ex.chosen == "blas" else "numba"
    convert["ours"] = lambda r: r
    packed = _prepacked(case.op, fn, args, kwargs)
    if packed is not None:  # the weight packed once (dispatch.prepack), as onnxruntime does
        candidates[PREPACKED] = packed
        # a library of its own: it too runs after a pause, as every peer does.  Right after
        # ours (same library, no pause) it skipped the ramp after idle that the others pay:
        # the 7x7/2 stem timed 1.01 ms prepacked against 1.72 ms for ours in one report
        # (Sapphire Rapids, 2026-12-02), where back to back in a loop they differ by 20-30 us
        library[PREPACKED], convert[PREPACKED] = "numba (prepacked)", (lambda r: r)
    for peer in peers:
        try:
            run, conv = P.prepare(peer, case, inputs)
        except P.Unavailable as exc:
            if "not installed" not in str(exc):  # an absent library is said once, in the machine section
                row["notes"].append(f"{peer}: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - a peer that fails to build is skipped, not fatal
            row["notes"].append(f"{peer}: could not prepare ({exc.__class__.__name__}: {str(exc)[:100]})")
            continue
        candidates[peer], library[peer], convert[peer] = run, peer, conv

    # first calls: compile ours, build peers' plans, and check the outputs agree
    ref = P.reference(case, inputs)
    if ref is None:
        row["notes"].append(f"outputs not checked against the float64 reference: its copies would exceed "
                            f"{P.REFERENCE_MAX_BYTES >> 30} GiB")
    tol = AGREE_TOL_HALF.get(case.params.get("activations")) or AGREE_TOL[np.dtype(dtype)]
    row["agreement"] = {}
    # a state the op updates in place (Op.updates) is shared with the peers' views of the
    # inputs: each first call starts from the same state, so the outputs are comparable
    pristine = {k: np.array(inputs[k], copy=True) for k in op.updates}
    for name in list(candidates):
        for k, v in pristine.items():
            inputs[k][...] = v
        if progress:
            progress(f"  {name}: first call" + (" (compiles, or loads numba's cache)" if name == "ours" else ""))
        try:
            t0 = time.perf_counter()
            res = candidates[name]()
            first = time.perf_counter() - t0
        except NotImplementedError as exc:
            row["status"] = "skipped" if name == "ours" else row["status"]
            row["notes"].append(f"{name}: not implemented yet ({exc})")
            del candidates[name]
            continue
        except Exception as exc:  # noqa: BLE001
            if name == "ours":
                row["status"] = "error"
            row["notes"].append(f"{name}: failed ({exc.__class__.__name__}: {str(exc)[:120]})")
            del candidates[name]
            continue
        if name == "ours":
            row["first_call_s"] = first
        if isinstance(res, tuple):
            res = res[0]
        if isinstance(res, QuantizedArray):  # quantize: its integers (scales: tests/test_quant.py)
            res = res.values
        if ref is None:
            continue
        err = rel_err(convert[name](res), ref)
        row["agreement"][name] = {"rel_err": err, "ok": err <= tol}
        if err > tol:
            row["notes"].append(f"{name}: output DISAGREES with the float64 numpy reference (rel err {err:.2e} > {tol:g})")
    if "ours" not in candidates:
        return row
    if case.memory:  # peak memory above the inputs, each candidate in turn (bench/memory.py)
        from . import memory
        peaks = {name: memory.peak_extra_bytes(fn) for name, fn in candidates.items()}
        row["peak_extra_bytes"] = peaks
        row["notes"].append("peak memory above the inputs, results included: " + ", ".join(
            f"{name} {p / 2**20:.0f} MiB" if p is not None else f"{name} not measured" for name, p in peaks.items()))
    if case.accuracy is not None:  # a low-precision case: its accuracy cost beside its times
        try:
            row["accuracy_vs_fp32"] = accuracy.measure(case, rng)
        except Exception as exc:  # noqa: BLE001
            row["notes"].append(f"accuracy vs fp32 not measured ({exc.__class__.__name__}: {str(exc)[:100]})")

    if progress:
        more = f", up to {max_rounds} while a spread is above {timing.MAX_SPREAD:.0%}" if max_rounds else ""
        progress(f"  timing {', '.join(candidates)} interleaved ({rounds} rounds{more})")
    stats = timing.interleaved(candidates, rounds=rounds, warmup=1, batch_s=0.02 if rounds <= 5 else 0.05,
                               pause_s=pause_s, library=library, max_rounds=max_rounds)
    row["times"] = {}
    for name, st in stats.items():
        d = st.as_dict()
        t = st.median
        d["gflops"] = flops / t / 1e9 if flops else None
        d["gbs"] = nbytes / t / 1e9 if nbytes else None
        d["fraction_of_floor"] = row["floor_s"] / t if row["floor_s"] else None
        row["times"][name] = d
    ours = stats["ours"].median
    peer_t = {n: s.median for n, s in stats.items() if n not in ("ours", PREPACKED)}
    if peer_t:
        best = min(peer_t, key=peer_t.get)
        row["fastest_peer"] = best
        row["ratio_to_fastest_peer"] = ours / peer_t[best]
        row["ratio_rounds"] = timing.paired_ratio(stats["ours"], stats[best])
        if PREPACKED in stats:
            t = stats[PREPACKED].median
            row["prepacked_ratio_to_fastest_peer"] = t / peer_t[best]
            row["notes"].append(f"weight prepacked (dispatch.prepack): {_fmt_t(t)}, {_verdict(t / peer_t[best], best)}")
    return row


PREPACKED = "ours-prepacked"


def _prepacked(op, fn, args, kwargs):
    """A call of `fn` with its weight (second argument) packed once by dispatch.prepack, or
    None where the op has no prepacked form (prepack refuses it)."""
    import dispatch
    if len(args) < 2 or not isinstance(args[1], np.ndarray):
        return None
    try:
        from dispatch.ops.linalg import prepack_options

        pw = dispatch.prepack(args[1], op=op, **prepack_options(op, kwargs))  # conv2d: groups
    except (TypeError, ValueError):
        return None
    rest = args[2:]
    return lambda: fn(args[0], pw, *rest, **kwargs)


# ---- the table ---------------------------------------------------------------------------

def _fmt_t(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _verdict(ratio, peer, rounds=None):
    """Our time over the fastest peer's, in words: the table's column and the prepacked note.
    rounds (timing.paired_ratio of ours over that peer): the quartiles of the round-by-round
    ratios, in the same sense, after it ("win  x1.05 (0.97-1.12)": rounds went both ways)."""
    lose = ratio > 1.0
    text = f"LOSE x{ratio:.2f} to {peer}" if lose else f"win  x{1 / ratio:.2f}"
    if rounds:
        lo, hi = (rounds["q25"], rounds["q75"]) if lose else (1 / rounds["q75"], 1 / rounds["q25"])
        text += f" ({lo:.2f}-{hi:.2f})"
    return text


def table(rows, compile_by_family, peers_installed) -> str:
    peer_cols = [p for p in P.PEERS if peers_installed.get(p)]
    lowp = any(r.get("accuracy_vs_fp32") for r in rows)
    head = (["op", "case", "impl", "ours", "+-", "GFLOP/s", "GB/s", "floor", "of floor"] + peer_cols
            + ["vs best peer"] + (["err vs fp32 (normal/outliers)"] if lowp else []) + ["compile cold/warm"])
    lines = []
    out_rows = []
    for r in rows:
        fam = compile_by_family.get(r["family"], {})
        comp = "/".join(_fmt_t(fam.get(s, {}).get("first_call_s")) for s in ("cold", "warm")) if fam else "-"
        if "times" not in r:
            note = r["notes"][-1] if r["notes"] else r["status"]
            out_rows.append([r["op"], r["label"], r["status"].upper(), note])
            continue
        o = r["times"]["ours"]
        cells = [r["op"], r["label"], r.get("impl") or "-", _fmt_t(o["median_s"]), f"{100 * o['spread']:.0f}%",
                 _fmt(o["gflops"], ".1f"), _fmt(o["gbs"], ".1f"), _fmt_t(r.get("floor_s")),
                 _fmt(o["fraction_of_floor"], ".2f")]
        for p in peer_cols:
            cells.append(_fmt_t(r["times"][p]["median_s"]) if p in r["times"] else "-")
        ratio = r.get("ratio_to_fastest_peer")
        mark = "-" if ratio is None else _verdict(ratio, r["fastest_peer"], r.get("ratio_rounds"))
        wrong = [name for name, a in r.get("agreement", {}).items() if not a["ok"]]
        if wrong:  # who disagrees with the float64 reference (a peer's own rounding, or ours)
            mark += " MISMATCH " + ",".join(wrong)
        cells.append(mark)
        if lowp:  # normwise max relative error against the float32 op (bench/accuracy.py)
            acc = r.get("accuracy_vs_fp32")
            cells.append("/".join(f"{acc[d]['max_rel']:.1e}" for d in accuracy.DISTRIBUTIONS) if acc else "-")
        cells.append(comp)
        out_rows.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *[c for c in out_rows if len(c) == len(head)])]
    fmt_row = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    lines.append(fmt_row(head))
    lines.append("  ".join("-" * w for w in widths))
    for cells in out_rows:
        if len(cells) == len(head):
            lines.append(fmt_row(cells))
        else:
            lines.append(f"{cells[0].ljust(widths[0])}  {cells[1].ljust(widths[1])}  {cells[2]}: {cells[3]}")
    return "\n".join(lines)


# ---- the CUDA side -----------------------------------------------------------------------

def cuda_predictions(case_list):
    try:
        from . import cuda_model
    except Exception as exc:  # noqa: BLE001 - absent or broken: say why
        return None, f"bench.cuda_model is unavailable ({exc.__class__.__name__}: {exc})"
    try:
        return list(cuda_model.predictions(case_list)), None
    except Exception as exc:  # noqa: BLE001
        return None, f"bench.cuda_model.predictions failed ({exc.__class__.__name__}: {exc})"


# ---- the whole report --------------------------------------------------------------------

def run(quick=True, ops=None, json_path="bench_out/report.json", plot_path="bench_out/roofline.png",
        peers=P.PEERS, compile=True, out=None, progress=None, dtype=np.float32, runtime_settings=True,
        model=True) -> dict:
    from dispatch import registry

    out = out or (lambda s="": print(s, flush=True))
    progress = progress or Progress()
    mode = "quick" if quick else "full"
    t_start = time.perf_counter()
    progress(f"performance report ({mode}); importing the ops")
    import dispatch  # noqa: F401 - registers every landed op

    info = machine_info()
    out("== machine")
    out(f"cpu: {info['cpu']} ({info['cores']} logical cores; llvm target {info.get('llvm_cpu', '?')})")
    out(f"simd: {' '.join(info['simd']) or 'unknown'}")
    out(f"vectors: {info.get('vectors', '?')}")
    out(f"python {info['python']}, numba {info['numba']}, numpy {info['numpy']}; "
        f"peers: " + ", ".join(f"{k} {v}" if v else f"{k} (not installed, skipped)" for k, v in info["peers"].items()))
    if info["blas"]:
        out(f"numpy BLAS: {'; '.join(info['blas'])}")
    out(f"gpu: {info['gpu']}")

    progress("measuring the ceilings: fp32 FMA rate, the fastest fp32 GEMM (numpy BLAS, PyTorch, ours), 256 MiB copy")
    ceilings = roofline.measure(quick)
    info["threading_layer"] = threading_layer()
    out(f"numba threading: {info['threading_layer']}")
    out("")
    out("== ceilings (best sample; median in brackets)")
    fma, gemm = ceilings["fma"], ceilings["gemm"]
    out(f"compute: {ceilings['gflops']:.1f} GFLOP/s  (FMA rate {fma['best_gflops']:.1f} [{fma['median_gflops']:.1f}]: "
        f"{fma['what']}; {gemm['what']} {gemm['best_gflops']:.1f} [{gemm['median_gflops']:.1f}]: "
        + ", ".join(f"{k} {v:.0f}" for k, v in gemm.get("per_method_best_gflops", {}).items()) + ")")
    out(f"memory:  {ceilings['gbs']:.1f} GB/s [{ceilings['copy']['median_gbs']:.1f}]  ({ceilings['copy']['what']})")

    selected = C.cases(ops, quick=quick)
    if ops:
        unknown = set(ops) - {c.op for c in C.CASES}
        for name in sorted(unknown):
            out(f"note: no cases for op {name!r} in bench/cases")
    registered = set(registry.OPS)
    without_cases = sorted(registered - {c.op for c in C.CASES})
    rows = []
    out("")
    for i, case in enumerate(selected):
        progress(f"[{i + 1}/{len(selected)}] {case.op}: {case.label}")
        rows.append(measure_case(case, ceilings, dtype=dtype, rounds=ROUNDS[quick], max_rounds=MAX_ROUNDS[quick],
                                 peers=peers, progress=progress))

    progress("dispatch overhead: dispatch.relu on 1 element vs the bare kernel")
    overhead = dispatch_overhead() if "relu" in registered else None

    comp = {}
    if compile:
        landed = [c for c in selected if any(r["case_id"] == c.id and r["status"] == "ok" for r in rows)]
        comp = compile_times(landed, progress=progress)

    preds, why = cuda_predictions(selected)

    rt_rows = []
    if runtime_settings:
        from . import runtime as RT
        want = {c.op for c in selected}
        rt_cases = [c for c in RT.CASES if c.op in want]
        progress(f"runtime settings (a)-(e) on {len(rt_cases)} real-time cases")
        rt_rows = RT.measure(rt_cases, rounds=5 if quick else 9, progress=progress)
    model_row = None
    if model:
        from . import model as M
        progress("model forward: MiniLM-L6-sized encoder, ours and PyTorch in alternating fresh processes")
        model_row = M.run(rounds=3 if quick else 7, progress=progress, processes=2 if quick else 3)

    out(f"== ops (float32; median of {ROUNDS[quick]} interleaved rounds, up to {MAX_ROUNDS[quick]} while a spread is "
        f"above {timing.MAX_SPREAD:.0%}; +- = interquartile spread; floor = roofline floor;")
    out("   of floor = floor / ours (1.0 = at the machine's limit); LOSE = a peer is faster;")
    out("   MISMATCH names = whose output disagrees with the float64 reference)")
    out(table(rows, comp, info["peers"]))
    skipped = [r for r in rows if r["status"] != "ok"]
    if skipped:
        out("")
        out(f"skipped or failed: {len(skipped)} case(s), see the lines above")
    for name in without_cases:
        out(f"note: op {name!r} is registered but has no cases in bench/cases")
    notes = [(r["op"], r["case"], n) for r in rows if r["status"] == "ok" for n in r["notes"]]
    if notes:
        out("")
        out("notes:")
        for op, case, n in notes:
            out(f"  {op} {case}: {n}")

    if comp:
        out("")
        from kernels_cpu import compile_helper
        out("== first-call time per op (a fresh process each; cold = empty NUMBA_CACHE_DIR, warm = cache filled;"
            f" bar: cold <= {COLD_BAR_S:.0f} s; NK_COMPILE_HELPER={compile_helper.MODE})")
        for fam, res in comp.items():
            cold, warm = res.get("cold", {}), res.get("warm", {})
            for cid in sorted(set(cold.get("per_case", {})) | set(cold.get("errors", {}))):
                op = cid.split(":")[0]
                if cid in cold.get("errors", {}):
                    out(f"  {op:<30} cold failed: {cold['errors'][cid]}")
                    continue
                t = cold["per_case"][cid]
                w = warm.get("per_case", {}).get(cid)
                warm_s = _fmt_t(w) if w is not None else f"failed: {warm.get('errors', {}).get(cid)}"
                helpers = cold.get("helpers", {}).get(cid)
                out(f"  {op:<30} cold {_fmt_t(t):>9}  warm {warm_s:>9}  {'' if t <= COLD_BAR_S else 'OVER THE BAR'}"
                    f"   ({fam}, {cid.split(':', 1)[1]}"
                    + (f"; {helpers} compile helper{'s' if helpers > 1 else ''}" if helpers else "") + ")")
                why = cold.get("compiles", {}).get(cid)
                if t > COLD_BAR_S and why:
                    out(f"  {'':<30} {_fmt_t(why['compile_s'])} in numba's compiler; most (own time): "
                        + ", ".join(f"{f['fn'].rsplit('.', 1)[-1]} {_fmt_t(f['own_s'])}" for f in why["top"][:3]))

    if overhead:
        out("")
        out(f"== dispatch overhead: dispatch.relu(1 element) {_fmt_t(overhead['dispatch_s'])} - bare kernel "
            f"{_fmt_t(overhead['kernel_s'])} = {overhead['overhead_s'] * 1e6:.2f} us "
            f"(goal < 5 us: {'met' if overhead['ok'] else 'NOT met'})")

    if rt_rows:
        out("")
        out("== where users run it (bench/runtime.py): (a) back to back, (b) one call after 0.2 s idle,")
        out("   (c) right after a PyTorch/BLAS call, (d) 4 Python threads at once (results checked),")
        out(f"   (e) batches of {RT.PACED_CALLS} calls after {RT.PACED_PAUSE_S * 1e3:.0f} ms pauses; medians")
        out(RT.format_rows(rt_rows))
    if model_row is not None:
        out("")
        out("== model (bench/model.py; each side in a process of its own)")
        out(M.format_row(model_row))

    out("")
    out("== CUDA (PREDICTED by bench.cuda_model's static analysis, not measured)")
    if preds is None:
        out(f"  {why}")
    elif not preds:
        out("  no predictions for these cases")
    else:
        gpus = list(dict.fromkeys(p.get("gpu") for p in preds))
        by_case = {}
        for p in preds:
            by_case.setdefault((p.get("op"), p.get("case")), {})[p.get("gpu")] = p
        w = max(len(f"{op} {case}") for op, case in by_case)
        out("  " + "op / case".ljust(w) + "  " + "  ".join(str(g).ljust(24) for g in gpus))
        for (op, case), per_gpu in by_case.items():
            cells = [(f"{_fmt_t(per_gpu[g].get('seconds'))} ({per_gpu[g].get('bound')})" if g in per_gpu else "-").ljust(24)
                     for g in gpus]
            out("  " + f"{op} {case}".ljust(w) + "  " + "  ".join(cells))

    result = {"mode": mode, "machine": info, "ceilings": ceilings, "rows": rows, "compile_time": comp,
              "dispatch_overhead": overhead, "runtime_settings": rt_rows, "model": model_row, "cuda_predicted": preds, "cuda_note": why,
              "elapsed_s": time.perf_counter() - t_start}
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        out("")
        out(f"results: {json_path}")
    if plot_path:
        pts = []
        for r in rows:
            for name, t in r.get("times", {}).items():
                if r.get("flops") and r.get("bytes") and t.get("gflops"):
                    pts.append({"op": r["op"], "impl_kind": name, "intensity": r["flops"] / r["bytes"], "gflops": t["gflops"]})
        try:
            os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)
            roofline.plot(pts, ceilings, plot_path, title=f"roofline ({mode}): ours filled, peers open; {info['cpu']}")
            out(f"roofline plot: {plot_path}")
        except Exception as exc:  # noqa: BLE001 - no matplotlib: say so, the rest stands
            out(f"roofline plot not drawn ({exc.__class__.__name__}: {exc})")
    progress(f"done in {time.perf_counter() - t_start:.0f} s")
    return result
