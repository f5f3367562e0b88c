"""Autotuning (`python -m bench tune [ops...]`): time every candidate implementation and
every combination of its tunable parameters (Implementation.tunables) on the shape buckets
of bench/cases, and write the winners to the tuning cache (dispatch.tuning.store) that
the dispatcher reads at its first call.  Tuning never runs implicitly.

One timing per selection key: cases whose calls fall in the same key (same op, device,
dtype, shape bucket and flags) share one entry, since selection depends on the key only.
"""
from __future__ import annotations

import itertools
import warnings

import numpy as np

from . import cases as C
from . import timing


def param_grid(impl) -> list[dict]:
    """Every combination of impl.tunables (over impl.params' defaults); [params] if none."""
    if not impl.tunables:
        return [dict(impl.params)]
    names = sorted(impl.tunables)
    grid = []
    for values in itertools.product(*(impl.tunables[n] for n in names)):
        grid.append({**impl.params, **dict(zip(names, values))})
    return grid


def _label(impl_name, params):
    return impl_name + ("" if not params else " " + ",".join(f"{k}={v}" for k, v in sorted(params.items())))


def tune(ops=None, quick=False, dtypes=(np.float32,), rounds=5, store=True, path=None, out=print, progress=None):
    """Tune the ops' keys; returns the list of winners ({op, key, impl, params, time_s, ...})."""
    from dispatch import registry, select, tuning

    results, skipped = [], []
    seen = set()
    for case in C.cases(ops, quick=quick):
        op = registry.OPS[case.op]
        for dtype in dtypes:
            inputs = case.inputs(np.random.default_rng(0), dtype)
            args, kwargs = case.call_args(inputs)
            try:
                call = op.describe(*args, **kwargs)
            except (TypeError, ValueError) as exc:
                skipped.append(f"{case.id}: arguments do not fit ({exc})")
                continue
            if call.key in seen:
                continue
            seen.add(call.key)
            cands, labels = {}, {}
            for impl in op.implementations.values():
                if impl.refusals(call.key):
                    continue
                for params in param_grid(impl):
                    label = _label(impl.name, params)
                    cands[label] = (lambda impl=impl, params=params: impl.run(params, *call.args))
                    labels[label] = (impl, params)
            if not cands:
                skipped.append(f"{case.id}: no implementation can run key {call.key}")
                continue
            if progress:
                progress(f"tuning {case.op} key {call.key}: {len(cands)} candidate(s) ({case.label})")
            try:
                stats = timing.interleaved(cands, rounds=rounds, warmup=1, batch_s=0.02, pause_s=0.0)
            except NotImplementedError as exc:
                skipped.append(f"{case.id}: not implemented ({exc})")
                continue
            best = min(stats, key=lambda k: stats[k].median)
            impl, params = labels[best]
            rule_impl = select.rule_choice(call.key)  # what the shape rule alone would pick
            results.append({
                "op": case.op, "key": call.key, "impl": impl.name, "params": params,
                "time_s": stats[best].median, "case": case.id,
                "candidates": {k: v.median for k, v in stats.items()},
                "rule_choice": rule_impl.name if rule_impl is not None else None,
            })
    out(f"{'op':<14} {'key':<44} {'winner':<28} {'time':>10}  rule would pick   (others)")
    for r in results:
        winner = _label(r["impl"], r["params"])
        others = ", ".join(f"{k} {v * 1e6:.0f}us" for k, v in sorted(r["candidates"].items(), key=lambda kv: kv[1])
                           if k != winner)
        key = ",".join(str(v) for k, v in r["key"]._asdict().items() if k != "op")
        out(f"{r['op']:<14} {key:<44} {winner:<28} "
            f"{r['time_s'] * 1e6:>8.1f}us  {str(r['rule_choice']):<16} ({others})")
    for s in skipped:
        out(f"skipped: {s}")
    if store and results:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            written = tuning.store(results, path)
        select.clear_cache()
        out(f"tuning cache written: {written} ({len(results)} entries); dispatch reads it at its first call, "
            f"`dispatch.explain` shows source 'tuned'")
    elif not results:
        out("nothing tuned")
    return results
