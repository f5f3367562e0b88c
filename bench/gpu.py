"""GPU harness: every CUDA op on a real GPU, timed with CUDA events, checked against PyTorch.

    python -m bench.gpu [--full | --bars] [--ops OP ...] [--dtypes float32 float16] [--json PATH]
                        [--tests] [--sanitize memcheck racecheck synccheck] [-k EXPR]

For each benchmark case of the report (bench/cases; the quick set unless --full) and each
dtype, on the current CUDA device: the inputs go to the device once, the dispatcher runs
the op (its CUDA implementation: `explain` names it), and after warm-up the call is timed
with CUDA events around batches of back-to-back calls (median of the batches, per call:
the time a user's stream sees, dispatch included).  PyTorch CUDA runs the same op on the
same data (bench.peers' torch versions, tensors on the GPU), timed the same way, and the
two results are compared (normwise relative error).  "GPU time" is the same calls' time on
the GPU alone (device_timed: the host enqueues them behind a spin kernel, so its dispatch
and launch costs are hidden), for both sides: what the kernels cost, apart from the host
floor that the stream time above includes.  The table gives achieved TFLOP/s and
TB/s (the op's own work model, Op.flops / Op.bytes), "peak": the larger of FLOPs / fp32
peak and bytes / bandwidth over the time (bench.cuda_model.GPUS; tensor-core work can pass
100% of the fp32 peak), the ratio to PyTorch (> 1: ours is faster), and measured /
predicted for bench.cuda_model's prediction of the same case (float32).

--tests runs the test suite on the GPU (NK_TEST_DEVICE=cuda); --sanitize runs it under
compute-sanitizer with each tool named (-k narrows the tests for the slower tools).

On a lent GPU machine (the `device` tool), whose python3 has numba-cuda, numpy, pytest
and a CUDA PyTorch, from the repository root:

    PYTHONPATH=. python3 -m bench.gpu --json $OUT/gpu.json --tests

Under the simulator (NUMBA_ENABLE_CUDASIM=1) the same code runs on tiny inputs (each op's
small example shapes, dispatch/examples.py) with the float64 reference instead of
PyTorch CUDA and no meaningful times: tests/test_bench.py runs it so, so that its first
run on a real GPU is not its first run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
# Relative normwise error allowed against PyTorch CUDA (or the float64 reference): float16
# inputs and outputs round at 2^-11; both sides accumulate in float32.
TOL = {"float32": 1e-4, "float16": 2e-2, "float64": 1e-10}
BATCH_S = 0.01      # each timed batch of calls lasts at least this long
BATCHES = 7         # batches per measurement (the median is reported)


class Refused(Exception):
    """The dispatcher (or PyTorch) does not run this op with these inputs."""


def _cuda():
    from numba import cuda

    try:
        ok = cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken driver install
        ok = False
    if not ok:
        raise SystemExit("bench.gpu: numba-cuda finds no CUDA GPU (nothing measured); run it on a GPU "
                         "machine, or under NUMBA_ENABLE_CUDASIM=1 to check its logic")
    return cuda


def chip():
    """(device properties, (peak name, bytes/s, fp32 FLOP/s), note) of the current device:
    the peaks of the bench.cuda_model.GPUS entry whose name the device's contains (H100,
    A100, Orin), else the entry for its compute capability (said in the note)."""
    from dispatch import devices

    from bench.cuda_model import GPUS

    p = devices.props()
    for name, (arch, bw, peak) in GPUS.items():
        if name.split()[0].lower() in p.name.lower():
            return p, (name, bw, peak), ""
    arch = f"sm_{p.cc[0]}{p.cc[1]}"
    for name, (a, bw, peak) in GPUS.items():
        if a == arch:
            return p, (name, bw, peak), f"peaks assumed from {name} (same compute capability {arch})"
    name, (_, bw, peak) = next(iter(GPUS.items()))
    return p, (name, bw, peak), f"no entry for {p.name} ({arch}): peaks assumed from {name}"


def workloads(ops, full, dtypes, bars=False):
    """(op name, label, numpy inputs, dtype, bench case or None) to measure.  Real GPU: the
    report's cases (bars: issue #9's bar shapes, bench.cuda_model.bar_cases, instead);
    simulator: each op's small example shapes."""
    from dispatch import examples, registry

    from bench import cases as bc

    cuda_ops = [n for n, op in registry.OPS.items()
                if any(i.device == "cuda" for i in op.implementations.values()) and (ops is None or n in ops)]
    for dt in dtypes:
        if SIM:
            for n in cuda_ops:
                yield n, "example (simulator)", examples.inputs(registry.OPS[n], "small", dt, seed=0), dt, None
        else:
            rng = np.random.default_rng(0)
            if bars:
                from bench.cuda_model import bar_cases

                chosen = [c for c in bar_cases() if c.op in cuda_ops]
            else:
                chosen = bc.cases([n for n in cuda_ops], quick=not full)
            for c in chosen:
                try:
                    inputs = c.inputs(rng, dt)
                except Exception as exc:  # noqa: BLE001 - reported as the case's row; the others go on
                    inputs = exc
                yield c.op, c.label, inputs, dt, c


def _quantized(v):
    from dispatch.quantized import QuantizedArray

    return isinstance(v, QuantizedArray)


def _narrow_weight(inputs):
    """Whether linear's weight is stored narrower than x (bfloat16 / float16 bits, int8)."""
    w, x = inputs.get("weight"), inputs.get("x")
    if _quantized(w):
        return True
    return isinstance(w, np.ndarray) and isinstance(x, np.ndarray) and w.dtype.itemsize < x.dtype.itemsize


def _to_device(inputs):
    """numpy arrays to the device (bfloat16 too: dispatch.devices.to_device); a
    QuantizedArray's values too (its scale and zero point stay host arrays, as
    dispatch.quantized takes them)."""
    from dispatch import devices

    def move(v):
        if isinstance(v, np.ndarray):
            return devices.to_device(v)
        if _quantized(v):
            return type(v)(move(v.values), v.scale, v.zero_point, v.axis)
        return v

    return {k: move(v) for k, v in inputs.items()}


def _to_host(x):
    if isinstance(x, tuple):
        return tuple(_to_host(v) for v in x)
    if _quantized(x):  # quantize's result: its integer values
        return _to_host(x.values)
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().float().cpu().numpy() if x.dtype.is_floating_point else x.cpu().numpy()
    return np.asarray(x)


def timed(fn, sync, events):
    """Median seconds per call of fn: warm-up, then BATCHES batches of n back-to-back calls
    (n chosen so that a batch lasts BATCH_S), each batch between two recorded events."""
    for _ in range(1 if SIM else 3):
        fn()
    sync()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        dt = time.perf_counter() - t0
        if dt >= BATCH_S or n >= 1 << 14 or SIM:
            break
        n = min(n * max(2, int(BATCH_S / max(dt, 1e-6))), 1 << 14)
    per_call = []
    for _ in range(1 if SIM else BATCHES):
        start, stop = events()
        t0 = time.perf_counter()
        start.record()
        for _ in range(n):
            fn()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop)
        # the simulator's events keep no time (elapsed_time gives -1): wall time instead
        per_call.append((ms * 1e-3 if ms > 0 else time.perf_counter() - t0) / n)
    return float(np.median(per_call)), n


_SPIN = {}


def _spin(cuda):
    """launch(seconds): a one-thread kernel that holds the default stream about that long (a
    chain of dependent float32 FMAs, its rate calibrated once with events)."""
    if "launch" in _SPIN:
        return _SPIN["launch"]

    @cuda.jit
    def spin(n, out):
        x = out[0]
        for _ in range(n):
            x = x * np.float32(0.9999999) + np.float32(1e-9)
        out[0] = x

    buf = cuda.to_device(np.ones(1, np.float32))
    spin[1, 1](1000, buf)  # compile and load
    cuda.synchronize()
    n0 = 1 << 18
    a, b = cuda.event(timing=True), cuda.event(timing=True)
    a.record()
    spin[1, 1](n0, buf)
    b.record()
    b.synchronize()
    per_iter = max(a.elapsed_time(b) * 1e-3 / n0, 1e-10)

    def launch(seconds):
        spin[1, 1](max(1, int(seconds / per_iter)), buf)

    _SPIN["launch"] = launch
    return launch


def device_timed(fn, n, host_s, cuda, events, batches=5):
    """Median GPU seconds per call of fn with the host's time taken out: a spin kernel holds
    the stream while the host enqueues n calls, so the events after it bracket the calls'
    kernels run back to back (the host's dispatch and launch costs overlap the spin).  The
    spin lasts at least twice the host's enqueue time, checked each batch (events around the
    spin) and lengthened when short; an op that waits for the GPU inside the call (a value
    read back) can never be queued ahead: None.  None under the simulator."""
    if SIM:
        return None
    spin = _spin(cuda)
    busy_s = max(2e-3, 3.0 * n * host_s)
    per = []
    for _ in range(batches):
        for _attempt in range(3):
            e0, e1 = events()
            e2, _ = events()
            e0.record()
            spin(busy_s)
            e1.record()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            host = time.perf_counter() - t0
            e2.record()
            e2.synchronize()
            if host < 0.5 * e0.elapsed_time(e1) * 1e-3:
                per.append(e1.elapsed_time(e2) * 1e-3 / n)
                break
            busy_s = min(4.0 * busy_s, 1.0)
        else:
            return None
    return float(np.median(per))


def rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return float("inf")
    if not (np.isfinite(got) == np.isfinite(ref)).all():
        return float("inf")
    fin = np.isfinite(ref)
    den = np.linalg.norm(ref[fin]) or 1.0
    return float(np.linalg.norm(got[fin] - ref[fin]) / den)


def _torch_cuda():
    """torch when it is installed with a usable CUDA device, else None."""
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None
    if SIM or not torch.cuda.is_available():
        return None
    # float32 against float32: PyTorch runs fp32 convolutions (and, where allowed, matmuls) in
    # TF32 by default, 10-bit mantissas, which fails the 1e-4 check for the wrong side (conv2d
    # 3x3 64ch on the H200, 2026-11-26: 2.9e-4) and times a different computation
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def measure_one(cuda, torch, op_name, label, inputs, dtype, peaks, prediction):
    """One row of the table (a dict)."""
    import dispatch
    from dispatch import registry

    from bench import peers

    op = registry.OPS[op_name]
    row = {"op": op_name, "case": label, "dtype": dtype}
    dev = _to_device(inputs)
    args, kw = op.signature(dev)
    fn = getattr(dispatch, op_name)
    try:
        call = op.describe(*args, **kw)
        chosen = dispatch.explain(op_name, *args, **kw).chosen
        t0 = time.perf_counter()
        ours = fn(*args, **kw)
        cuda.synchronize()
        # the first call of this op, dtype and shape class in the process: compilation
        # (numba-cuda's NVVM + ptxas) and module load, which a user's first call waits for too
        row["first_call_s"] = time.perf_counter() - t0
    except (TypeError, ValueError, RuntimeError) as exc:
        raise Refused(f"{exc.__class__.__name__}: {exc}") from None
    row["impl"] = chosen
    got = _to_host(ours)
    ref = tfn = None
    if torch is not None:
        from bench.peer_ops.weight_only import to_torch, torch_weight  # as the report

        try:
            tfn = peers._torch_fn(op_name, torch)
            # a QuantizedArray linear weight dequantized here (torch_weight), then moved
            tin = {k: (t.to("cuda") if isinstance(t, torch.Tensor) else t) for k, t in
                   ((k, torch_weight(to_torch(v, torch), torch) if op_name == "linear" else to_torch(v, torch))
                    for k, v in inputs.items())}
            with torch.inference_mode():
                ref_t = tfn(tin)
            ref, row["checked_against"] = _to_host(ref_t), "torch cuda"
        except Exception as exc:  # noqa: BLE001 - a CPU-only PyTorch peer (aten's *_for_cpu ops, qint8)
            tfn, row["torch_error"] = None, f"{exc.__class__.__name__}: {str(exc)[:200]}"
    if ref is not None and op_name == "linear" and _narrow_weight(inputs):
        # PyTorch's linear takes one dtype: its peer casts x to the low-precision weight's
        # (peers._torch_linear), so its result carries bfloat16 / float16 rounding that ours,
        # which widens the weight to float32, does not (2.3e-3 / 2.9e-4 on the H200): the
        # float64 reference checks ours instead; PyTorch still gives the time
        ref = None
    if ref is None:
        ref, row["checked_against"] = peers.reference(SimpleNamespace(op=op_name), inputs), "float64 reference"
    # the report's convention: multi-output ops are compared on their first output
    if isinstance(got, tuple):
        got = got[0]
    if isinstance(ref, tuple):
        ref = ref[0]
    if ref is None:  # the float64 copies would be too large (peers.REFERENCE_MAX_BYTES)
        row["rel_err"], row["ok"], row["checked_against"] = float("nan"), None, "unchecked (too large)"
    else:
        row["rel_err"] = rel_err(got, ref)
        row["ok"] = row["rel_err"] <= TOL.get(dtype, 1e-4)

    # (the simulator's cuda.event takes no timing argument and keeps no time)
    row["seconds"], row["calls_per_batch"] = timed(lambda: fn(*args, **kw), cuda.synchronize,
                                                   (lambda: (cuda.event(), cuda.event())) if SIM else
                                                   (lambda: (cuda.event(timing=True), cuda.event(timing=True))))
    ev = (lambda: (cuda.event(), cuda.event())) if SIM else (lambda: (cuda.event(timing=True), cuda.event(timing=True)))
    dev_n = max(2, min(row["calls_per_batch"], 64))
    row["device_seconds"] = device_timed(lambda: fn(*args, **kw), dev_n, row["seconds"], cuda, ev)
    flops, nbytes = float(op.flops(call)), float(op.bytes(call))
    _, bw, peak = peaks
    row.update(flops=flops, bytes=nbytes, tflops=flops / row["seconds"] / 1e12, tbps=nbytes / row["seconds"] / 1e12,
               peak_fraction=max(flops / peak, nbytes / bw) / row["seconds"], bound=op.bound)
    if tfn is not None:
        def run_torch():
            with torch.inference_mode():
                return tfn(tin)

        row["torch_seconds"], _ = timed(run_torch, torch.cuda.synchronize,
                                        lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        row["vs_torch"] = row["torch_seconds"] / row["seconds"]  # > 1: ours is faster
        tev = lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # noqa: E731
        row["torch_device_seconds"] = device_timed(run_torch, dev_n, row["torch_seconds"], cuda, tev)
        if row["device_seconds"] and row["torch_device_seconds"]:
            row["device_vs_torch"] = row["torch_device_seconds"] / row["device_seconds"]
    if prediction is not None:
        row["predicted_seconds"], row["predicted_kernel_seconds"] = prediction
        row["measured_over_predicted"] = row["seconds"] / row["predicted_seconds"]
        if row["device_seconds"] and row["predicted_kernel_seconds"]:
            # the GPU's own time against the model's kernel bound (its launch term left out)
            row["device_over_predicted"] = row["device_seconds"] / row["predicted_kernel_seconds"]
    return row


def _predictions(cases, gpu_name, dtypes):
    """{(case id, dtype name): (predicted seconds, predicted kernel seconds)} from
    bench.cuda_model for the chip the peaks came from, per measured dtype (the model reads
    each dtype's own kernel build); the kernel seconds leave out the model's host launch
    term: the larger of its memory and issue bounds."""
    if not cases:
        return {}
    from bench import cuda_model

    out = {}
    for dt in dtypes:
        for r in cuda_model.predictions(cases, dtype=np.dtype(dt)):
            if r["gpu"] == gpu_name and r.get("seconds"):
                busy = max(r.get("memory_s") or 0.0, r.get("issue_s") or 0.0) or None
                out[(f"{r['op']}:{r['case']}", dt)] = (r["seconds"], busy)
    return out


def print_row(r):
    if "error" in r:
        print(f"{r['op']:14s} {r['case'][:44]:44s} {r['dtype']:8s} {r['error'][:90]}")
        return
    vs = f"x{r['vs_torch']:.2f}" if "vs_torch" in r else "-"
    mp = f"{r['measured_over_predicted']:.2f}" if "measured_over_predicted" in r else "-"
    dev = f"{r['device_seconds'] * 1e6:.1f}us" if r.get("device_seconds") else "-"
    dvs = f"x{r['device_vs_torch']:.2f}" if r.get("device_vs_torch") else "-"
    dmp = f"{r['device_over_predicted']:.2f}" if r.get("device_over_predicted") else "-"
    print(f"{r['op']:14s} {r['case'][:44]:44s} {r['dtype']:8s} {r['impl'] or '?':14s} {r['seconds'] * 1e6:10.1f}us "
          f"{r['tflops']:7.2f} {r['tbps']:6.2f} {r['peak_fraction']:5.0%} {vs:>7s} {mp:>6s} "
          f"{dev:>10s} {dvs:>7s} {dmp:>6s} "
          f"{r['rel_err']:8.1e} {r['first_call_s']:6.2f}s {({True: 'ok', False: 'WRONG'}).get(r['ok'], 'unchecked')}")


def run_tests(sanitize, k, extra=()):
    """The test suite on the GPU: plainly, then under compute-sanitizer per tool.
    Returns [{tool, returncode, seconds}]."""
    env = dict(os.environ, NK_TEST_DEVICE="cuda")
    base = [sys.executable, "-m", "pytest", "tests", "-q", "-x", "-p", "no:cacheprovider", *extra]
    if k:
        base += ["-k", k]
    runs = [("plain", base)] + [(t, ["compute-sanitizer", "--tool", t, "--error-exitcode", "97", *base])
                                for t in sanitize]
    out = []
    for tool, cmd in runs:
        print(f"\n$ {' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        try:
            # under a sanitizer every access is checked: the small test shapes (tests/support.py)
            rc = subprocess.run(cmd, env=dict(env, NK_TEST_SMALL_SHAPES="1") if tool != "plain" else env).returncode
        except FileNotFoundError as exc:  # no compute-sanitizer on this machine
            print(f"bench.gpu: {exc}")
            rc = None
        out.append({"tool": tool, "returncode": rc, "seconds": round(time.perf_counter() - t0, 1)})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="all cases of bench/cases (default: the quick set)")
    ap.add_argument("--ops", nargs="+", metavar="OP", help="only these ops")
    ap.add_argument("--bars", action="store_true",
                    help="issue #9's bar shapes (GEMM 4096^3, causal attention 1x32x4096x128, (4096, 4096) rows)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=["float32", "float16", "float64"])
    ap.add_argument("--json", metavar="PATH", help="write the rows (and the test runs) as JSON")
    ap.add_argument("--tests", action="store_true", help="run the test suite on the GPU afterwards")
    ap.add_argument("--sanitize", nargs="*", default=[], metavar="TOOL",
                    help="run the test suite under compute-sanitizer with each tool (memcheck, racecheck, synccheck)")
    ap.add_argument("-k", metavar="EXPR", help="pytest -k expression for --tests / --sanitize")
    args = ap.parse_args(argv)

    if SIM:  # the tests' simulator fixes (warp primitives, host-side shapes), as in tests/conftest.py
        from tests.cuda import simwarp

        simwarp.install()
    cuda = _cuda()
    import dispatch  # noqa: F401  (registers the ops)

    props, peaks, note = chip()
    torch = _torch_cuda()
    print(f"device: {props.name}, cc {props.cc[0]}.{props.cc[1]}, {props.sm_count} SMs"
          f"{' (simulator: times are meaningless)' if SIM else ''}")
    print(f"peaks: {peaks[0]}: {peaks[1] / 1e12:.2f} TB/s, {peaks[2] / 1e12:.1f} TFLOP/s fp32 (bench.cuda_model.GPUS)"
          f"{'; ' + note if note else ''}")
    print(f"reference: {'PyTorch ' + torch.__version__ + ' on CUDA' if torch else 'the float64 reference (no CUDA PyTorch)'}")
    work = list(workloads(args.ops, args.full, args.dtypes, bars=args.bars))
    preds = _predictions(list({c.id: c for *_, c in work if c is not None}.values()), peaks[0],
                         sorted({dtype for _, _, _, dtype, _ in work}))
    print(f"\n{'op':14s} {'case':44s} {'dtype':8s} {'impl':14s} {'time':>12s} {'TFLOP/s':>7s} {'TB/s':>6s} "
          f"{'peak':>5s} {'vsTorch':>7s} {'m/pred':>6s} {'GPU time':>10s} {'GPU vs':>7s} {'g/pred':>6s} "
          f"{'rel err':>8s} {'first':>7s}")
    rows = []

    def save(tests=()):
        """The rows so far as JSON (after every row: a run cut off by a time limit keeps them)."""
        if not args.json:
            return
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "cc": list(props.cc), "sm_count": props.sm_count, "simulated": SIM,
                       "peaks": {"name": peaks[0], "bytes_per_s": peaks[1], "fp32_flops": peaks[2], "note": note},
                       "reference": "torch cuda" if torch else "float64", "rows": rows, "tests": list(tests)},
                      f, indent=1)

    for op_name, label, inputs, dtype, case in work:
        pred = preds.get((case.id, dtype)) if case is not None else None
        try:
            if isinstance(inputs, Exception):
                raise RuntimeError(f"making the inputs: {inputs.__class__.__name__}: {inputs}")
            r = measure_one(cuda, torch, op_name, label, inputs, dtype, peaks, pred)
        except Refused as exc:
            r = {"op": op_name, "case": label, "dtype": dtype, "error": f"refused: {exc}"}
        except Exception as exc:  # noqa: BLE001 - reported; the harness goes on to the next case
            r = {"op": op_name, "case": label, "dtype": dtype, "error": f"FAILED {exc.__class__.__name__}: {exc}"}
        rows.append(r)
        print_row(r)
        save()
    tests = run_tests(args.sanitize, args.k) if (args.tests or args.sanitize) else []
    bad = [r for r in rows if r.get("ok") is False or str(r.get("error", "")).startswith("FAILED")]
    print(f"\n{len(rows)} rows: {sum(1 for r in rows if r.get('ok'))} checked ok, {len(bad)} wrong or failed, "
          f"{sum(1 for r in rows if str(r.get('error', '')).startswith('refused'))} refused")
    save(tests)
    failed_tests = [t for t in tests if t["returncode"] not in (0, None)]
    return 1 if bad or failed_tests else 0


if __name__ == "__main__":
    sys.exit(main())
