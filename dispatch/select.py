"""Choosing an implementation for a call: overrides, the tuning cache, shape rules.

Order of decision for a key ``(op, device, dtype, ...)``:
1. a forced implementation (``with dispatch.use(...)`` or ``NK_USE``) is taken if it can run
   the call, else `NoImplementationError` lists why not; nothing falls back silently;
2. otherwise the candidates come from the tuning cache (``python -m bench tune``) when it
   has an entry for this key, else from the op's shape rule (``Op.order``);
3. excluded implementations (``use(exclude=...)`` or ``NK_EXCLUDE``) are skipped and the
   first candidate that supports the key runs.

The answer for a key is cached in a dict, so a repeated call costs one lookup.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from . import registry, tuning


class NoImplementationError(RuntimeError):
    """No implementation (or not the forced one) can run this call; the message lists why."""


@dataclass
class Decision:
    op: str
    key: tuple
    chosen: registry.Implementation | None
    params: dict
    source: str  # "forced", "tuned", "rule"
    rule: str
    candidates: list = field(default_factory=list)  # (name, verdict, reasons)


# ---- overrides ---------------------------------------------------------------------------

def _parse(spec: str | None):
    """'cpu-serial' or 'softmax=cpu-serial,matmul=blas' -> (global names, {op: name})."""
    names, per_op = [], {}
    for item in (spec or "").replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            op, name = (s.strip() for s in item.split("=", 1))
            per_op[op] = name
        else:
            names.append(item)
    return names, per_op


def _env_overrides():
    force_names, force_ops = _parse(os.environ.get("NK_USE"))
    excl_names, excl_ops = _parse(os.environ.get("NK_EXCLUDE"))
    return {
        "force": force_names,
        "force_op": force_ops,
        "exclude": set(excl_names),
        "exclude_op": {op: {n} for op, n in excl_ops.items()},
    }


_overrides = _env_overrides()
_cache: dict = {}


def _check_known(names, per_op):
    known_ops = registry.OPS
    known_names = {impl.name for impl in registry.implementations()}
    for op, name in per_op.items():
        if op not in known_ops:
            raise ValueError(f"use(): unknown op {op!r}; known ops: {sorted(known_ops)}")
        if name not in known_ops[op].implementations:
            raise ValueError(
                f"use(): op {op!r} has no implementation {name!r}; it has "
                f"{sorted(known_ops[op].implementations)}"
            )
    for name in names:
        if name not in known_names:
            raise ValueError(f"use(): unknown implementation {name!r}; known: {sorted(known_names)}")


@contextlib.contextmanager
def use(*names: str, exclude=(), **per_op: str):
    """Force or exclude implementations inside a ``with`` block.

    ``use("cpu-serial")`` forces that implementation for every op that has one;
    ``use(softmax="cpu-parallel")`` forces it for one op; ``use(exclude="blas")`` or
    ``use(exclude=["blas", "cpu-gemv"])`` removes candidates.  The environment variables
    ``NK_USE`` and ``NK_EXCLUDE`` take the same forms ("cpu-serial",
    "softmax=cpu-serial,matmul=blas") for a whole process.
    """
    global _overrides
    if isinstance(exclude, str):
        exclude = [exclude]
    _check_known(list(names) + list(exclude), per_op)
    saved = _overrides
    _overrides = {
        "force": list(names) + saved["force"],
        "force_op": {**saved["force_op"], **per_op},
        "exclude": saved["exclude"] | set(exclude),
        "exclude_op": saved["exclude_op"],
    }
    _cache.clear()
    try:
        yield
    finally:
        _overrides = saved
        _cache.clear()


def _forced_name(op: registry.Op):
    name = _overrides["force_op"].get(op.name)
    if name is not None:
        return name
    for name in _overrides["force"]:
        if name in op.implementations:
            return name
    return None


def _excluded(op: registry.Op, name: str) -> bool:
    return name in _overrides["exclude"] or name in _overrides["exclude_op"].get(op.name, ())


# ---- decision ----------------------------------------------------------------------------

def decide(key: tuple) -> Decision:
    """The full decision for a key, with every candidate's verdict (what `explain` shows)."""
    op = registry.OPS[key[0]]
    forced = _forced_name(op)
    if forced is not None:
        impl = op.implementations[forced]
        reasons = impl.refusals(key)
        decision = Decision(op.name, key, None if reasons else impl, dict(impl.params),
                            "forced", f"forced by override to {forced!r}")
        decision.candidates.append((forced, "refused" if reasons else "chosen", reasons))
        for name, other in op.implementations.items():
            if name != forced:
                decision.candidates.append((name, "not tried", ["another implementation is forced"]))
        return decision

    tuned = tuning.lookup(op, key)
    if tuned is not None:
        names, params_by_name, rule = tuned
        source = "tuned"
    else:
        names, rule = op.order(key)
        params_by_name, source = {}, "rule"
    names = [n for n in names if n in op.implementations] + [n for n in op.implementations if n not in names]

    decision = Decision(op.name, key, None, {}, source, rule)
    for name in names:
        impl = op.implementations[name]
        if decision.chosen is not None:
            reasons = impl.refusals(key)
            verdict = "can run, ranked lower" if not reasons else "refused"
            decision.candidates.append((name, verdict, reasons or [f"ranked after {decision.chosen.name}: {rule}"]))
            continue
        if _excluded(op, name):
            decision.candidates.append((name, "excluded", ["excluded by override"]))
            continue
        reasons = impl.refusals(key)
        if reasons:
            decision.candidates.append((name, "refused", reasons))
            continue
        decision.chosen = impl
        decision.params = {**impl.params, **params_by_name.get(name, {})}
        decision.candidates.append((name, "chosen", []))
    return decision


def _raise_none(decision: Decision):
    lines = [f"no implementation of {decision.op!r} can run this call "
             f"(key {decision.key}; {decision.rule}):"]
    for name, verdict, reasons in decision.candidates:
        lines.append(f"  {name}: {verdict}: {'; '.join(reasons) if reasons else '-'}")
    raise NoImplementationError("\n".join(lines))


def select(key: tuple):
    """(implementation, params) for a call key; cached per key and override state."""
    hit = _cache.get(key)
    if hit is not None:
        return hit
    decision = decide(key)
    if decision.chosen is None:
        _raise_none(decision)
    hit = (decision.chosen, decision.params)
    _cache[key] = hit
    return hit


def clear_cache():
    _cache.clear()
