"""Every registered CPU implementation of every op, forced once, against the float64 reference.

    python -m tests.edge_run [OP ...] [--workers N] [--dtypes float32 float64] [--list]

Written for `./run.sh edge` (.ci/edge.sh), which runs it inside an arm64 Debian root under
qemu-user emulation, but it runs on any host.  For each CPU implementation
(``dispatch.registry.implementations(device="cpu")``, so a new op or kernel is included
without an edit) and each dtype it takes (float32 and float64 asked for), it looks for small
inputs that the implementation accepts when forced with ``dispatch.use(op=impl)``:
dispatch/examples.py's sizes ("small", then "large", then "decode"), each plain and then with
every parameter set the op's benchmark cases use (bench/cases: e.g. linear's
``weight_format="int8"``, which the weight-only kernels need).  Forcing is what reaches the
real code paths at small sizes: a forced cpu-gemm runs the packed GEMM and its micro-kernel
at (2, 5, 24) x (24, 19), where the shape rule would have chosen BLAS.  The result is
compared with tests/reference/<family>.<op> on float64 copies of the inputs (the same
reference the tests and the report use), by the normwise relative error
max |got - ref| / max |ref| with the report's tolerances (1e-4 float32, 1e-10 float64).

An implementation that refuses every input (the x86-only int8 paths on aarch64: AMX, VNNI,
AVX2) is printed as REFUSED with the reason `explain` gives, not counted as a failure; the
closing lines show, for each op with a refusal, which implementation the dispatcher picks
on its own there and that it passed.  An op left with no passing implementation in a
dtype is a failure.

One line per implementation and dtype: op, implementation, dtype, max rel err, seconds of
the first call (compilation included: under emulation these are emulated compile times,
not device times), PASS / FAIL / REFUSED; then ``N passed, N failed (N refused)``.  Exit
status 1 on any failure.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import multiprocessing as mp
import os
import platform
import sys
import time
import traceback

import numpy as np

SIZES = ("small", "large", "decode")
TOL = {"float32": 1e-4, "float64": 1e-10}


def _param_sets(op_name):
    """{} first, then each distinct parameter set the op's benchmark cases use."""
    out = [{}]
    try:
        from bench.cases import CASES
    except Exception:  # noqa: BLE001 - bench's optional imports: the plain examples still run
        return out
    for case in CASES:
        if case.op == op_name and case.params and case.params not in out:
            out.append(dict(case.params))
    return out


def _find_inputs(op, impl_name, dtype):
    """(size, params, named inputs) the forced implementation accepts, or (None, reason)."""
    import dispatch
    from dispatch import examples
    from dispatch.explain import explain

    first_reason = None
    for params in _param_sets(op.name):
        for size in SIZES:
            shapes = examples.shapes_for(op, size)
            if shapes is None:
                continue
            rng = np.random.default_rng(0)
            try:
                named = {**op.inputs(shapes, params, rng, np.dtype(dtype).type)}
                args, kwargs = op.signature(named)
                with dispatch.use(**{op.name: impl_name}):
                    e = explain(op.name, *args, **kwargs)
            except (TypeError, ValueError, LookupError):
                continue
            if e.chosen == impl_name:
                return size, params, named
            if first_reason is None:
                for name, _verdict, reasons in e.candidates:
                    if name == impl_name and reasons:
                        first_reason = "; ".join(reasons)
    return None, first_reason or "no example input is accepted"


def _components(res):
    """A result as a list of arrays: tuples in order; a QuantizedArray as values, scale."""
    from dispatch.quantized import QuantizedArray

    if isinstance(res, QuantizedArray):
        return [np.asarray(res.values), np.asarray(res.scale)]
    if isinstance(res, tuple):
        out = []
        for r in res:
            out += _components(r)
        return out
    return [np.asarray(res)]


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| (NaN matching NaN and equal infinities count as 0)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return float("inf")
    if not ref.size:
        return 0.0
    same = (np.isnan(got) & np.isnan(ref)) | (got == ref)
    diff = np.where(same, 0.0, np.abs(got - ref))
    if not np.all(np.isfinite(diff)):
        return float("inf")
    finite = np.abs(ref[np.isfinite(ref)])
    scale = float(finite.max()) if finite.size else 0.0
    return float(diff.max() / scale) if scale > 0 else float(diff.max())


def _reference(op, named):
    """The float64 reference (tests/reference/<family>.py, named like the op), on float64
    copies of the inputs (as bench.peers.reference), as a list of arrays."""
    fn = getattr(importlib.import_module(f"tests.reference.{op.family}"), op.name)
    keep = getattr(fn, "takes_input_precision", False)
    f64 = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" and not keep
               else (v.copy() if isinstance(v, np.ndarray) else v))
           for k, v in named.items()}
    args, kwargs = op.signature(f64)
    return _components(fn(*args, **kwargs))


def run_one(op_name, impl_name, dtype, compare=True):
    """Force one implementation on one dtype; returns a result dict (never raises).
    compare=False: run only (status "RAN"; tests/test_portability.py wants the kernels
    compiled, the comparisons are the op tests' job)."""
    t_import = time.perf_counter()
    import dispatch
    from dispatch import registry
    t_import = time.perf_counter() - t_import
    op = registry.OPS[op_name]
    row = {"op": op_name, "impl": impl_name, "dtype": dtype, "err": None, "first_s": None,
           "status": "FAIL", "note": "", "size": None}
    try:
        size, params_or_reason, *rest = _find_inputs(op, impl_name, dtype)
        if size is None:
            row.update(status="REFUSED", note=params_or_reason)
            return row
        params, named = params_or_reason, rest[0]
        row["size"] = size + (f" {params}" if params else "")
        ref = _reference(op, named) if compare else None
        args, kwargs = op.signature(op.fresh_inputs(named))
        with dispatch.use(**{op_name: impl_name}):
            t0 = time.perf_counter()
            res = op.public(*args, **kwargs)
            row["first_s"] = time.perf_counter() - t0
        if not compare:
            row["status"] = "RAN"
            return row
        got = _components(res)
        n = min(len(got), len(ref))
        if n == 0:
            row["note"] = "no result to compare"
            return row
        errs = [rel_err(g, r) for g, r in zip(got[:n], ref[:n])]
        row["err"] = max(errs)
        row["status"] = "PASS" if row["err"] <= TOL[dtype] else "FAIL"
        if row["status"] == "FAIL":
            row["note"] = f"rel err {row['err']:.2e} > {TOL[dtype]:g}"
    except Exception as exc:  # noqa: BLE001 - reported as the implementation's failure
        row["note"] = f"{exc.__class__.__name__}: {str(exc)[:300]}"
        row["trace"] = traceback.format_exc(limit=-4)
    row["import_s"] = t_import
    return row


def plan(ops=None, dtypes=("float32", "float64")):
    """[(op, implementation, dtype)]: every CPU implementation of the ops, per dtype it takes."""
    from dispatch import registry
    names = list(registry.OPS) if not ops else list(ops)
    unknown = [n for n in names if n not in registry.OPS]
    if unknown:
        raise SystemExit(f"unknown op(s) {unknown}; registered: {sorted(registry.OPS)}")
    return [(impl.op, impl.name, dt) for name in names for impl in registry.implementations(name, "cpu")
            for dt in dtypes if np.dtype(dt) in impl.dtypes]


def _line(r):
    err = f"{r['err']:.1e}" if r["err"] is not None else "-"
    first = f"{r['first_s']:.2f}" if r["first_s"] is not None else "-"
    note = f"  {r['note']}" if r["note"] else ""
    size = f"  [{r['size']}]" if r.get("size") and r["status"] != "REFUSED" else ""
    return f"{r['op']:<24} {r['impl']:<22} {r['dtype']:<8} {err:>8} {first:>8}  {r['status']}{size}{note}"


def _default_choices(rows):
    """For each op and dtype with a refused implementation: what the dispatcher picks on its
    own (no override) for the example input, and whether that implementation passed here."""
    import dispatch  # noqa: F401
    from dispatch import registry
    from dispatch.explain import explain

    lines, failures = [], 0
    status = {(r["op"], r["impl"], r["dtype"]): r["status"] for r in rows}
    for op_name, dt in dict.fromkeys((r["op"], r["dtype"]) for r in rows if r["status"] == "REFUSED"):
        op = registry.OPS[op_name]
        refused = [r["impl"] for r in rows if r["op"] == op_name and r["dtype"] == dt and r["status"] == "REFUSED"]
        passed = [r["impl"] for r in rows if r["op"] == op_name and r["dtype"] == dt and r["status"] == "PASS"]
        size, params, *rest = _find_inputs(op, passed[0], dt) if passed else (None, None)
        chosen = None
        if size is not None:
            args, kwargs = op.signature(rest[0])
            chosen = explain(op_name, *args, **kwargs).chosen
        ok = chosen is not None and status.get((op_name, chosen, dt)) == "PASS"
        failures += not ok
        lines.append(f"{op_name} {dt}: {', '.join(refused)} refused here; the dispatcher picks {chosen} "
                     f"({'PASS' if ok else 'NO WORKING IMPLEMENTATION'})")
    return lines, failures


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.edge_run", description=__doc__.split("\n\n")[0])
    p.add_argument("ops", nargs="*", help="op names to run (default: every registered op)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    p.add_argument("--list", action="store_true", help="print the plan and exit")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    import dispatch  # noqa: F401
    from kernels_cpu import runtime, target
    todo = plan(a.ops, a.dtypes)
    print(f"# {platform.machine()} ({target.cpu_name()}; {runtime.describe()}), python {platform.python_version()}, "
          f"numba {__import__('numba').__version__}, numpy {np.__version__}: {len(todo)} runs, "
          f"{a.workers} worker(s); import dispatch {time.perf_counter() - t0:.1f} s", flush=True)
    if a.list:
        for t in todo:
            print(*t)
        return 0
    print(f"{'op':<24} {'implementation':<22} {'dtype':<8} {'rel err':>8} {'first s':>8}  result", flush=True)
    rows = []
    if a.workers <= 1:
        for t in todo:
            r = run_one(*t)
            rows.append(r)
            print(_line(r), flush=True)
            if r.get("trace"):
                print("    " + r["trace"].replace("\n", "\n    "), flush=True)
    else:
        # spawn: each worker imports dispatch itself (no numba state forked mid-compilation)
        with cf.ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as ex:
            futs = {ex.submit(run_one, *t): t for t in todo}
            for f in cf.as_completed(futs):
                try:
                    r = f.result()
                except Exception as exc:  # noqa: BLE001 - a worker died (a crash in a kernel)
                    op_name, impl, dt = futs[f]
                    r = {"op": op_name, "impl": impl, "dtype": dt, "err": None, "first_s": None,
                         "status": "FAIL", "note": f"worker died: {exc.__class__.__name__}: {exc}"}
                rows.append(r)
                print(_line(r), flush=True)
                if r.get("trace"):
                    print("    " + r["trace"].replace("\n", "\n    "), flush=True)
    order = {t: i for i, t in enumerate(todo)}
    rows.sort(key=lambda r: order[(r["op"], r["impl"], r["dtype"])])
    extra, no_impl = _default_choices(rows)
    if extra:
        print("# refused implementations and what runs instead:")
        for line in extra:
            print(f"  {line}")
    passed = sum(r["status"] == "PASS" for r in rows)
    failed = sum(r["status"] == "FAIL" for r in rows) + no_impl
    refused = sum(r["status"] == "REFUSED" for r in rows)
    slow = sorted((r for r in rows if r["first_s"] is not None), key=lambda r: -r["first_s"])[:5]
    if slow:
        print("# slowest first calls: " + ", ".join(f"{r['op']} {r['impl']} {r['dtype']} {r['first_s']:.1f} s"
                                                   for r in slow))
    print(f"{passed} passed, {failed} failed ({refused} refused) in {time.perf_counter() - t0:.0f} s "
          f"on {platform.machine()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
