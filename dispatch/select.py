"""Choosing an implementation for a call: overrides, the tuning cache, shape rules.

Order of decision for a key (``key.op``, ``key.device``, ``key.dtype``, ...):
1. a forced implementation (``with dispatch.use(...)`` or ``NK_USE``) is taken if it can run
   the call, else `NoImplementationError` lists why not; nothing falls back silently;
2. otherwise the candidates come from the tuning cache (``python -m bench tune``) when it
   has an entry for this key, else from the op's shape rule for the key's device;
3. excluded implementations (``use(exclude=...)`` or ``NK_EXCLUDE``) are skipped and the
   first candidate that supports the key runs.

Overrides are per thread (and per asyncio task): ``use`` sets a `contextvars.ContextVar`,
so a ``with dispatch.use(...)`` in one thread never changes what another thread runs.  The
environment variables give every thread's starting state; they are parsed once, and a
malformed entry is a ValueError naming the variable and the entry.

Each override state owns its cache of decisions (key -> choice); the process default's
cache is shared by all threads that set no override (dict reads and writes are atomic,
and two threads deciding the same key at once compute the same answer).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import threading
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

@dataclass(frozen=True, eq=False)
class Overrides:
    """One immutable override state and its decision cache."""

    force: tuple = ()                 # implementation names forced for every op that has them
    force_op: tuple = ()              # ((op, name), ...)
    exclude: frozenset = frozenset()  # names excluded for every op
    exclude_op: tuple = ()            # ((op, frozenset of names), ...)
    tuned: bool = True                # consult the tuning cache
    cache: dict = field(default_factory=dict, compare=False)

    def forced_name(self, op: registry.Op):
        name = dict(self.force_op).get(op.name)
        if name is not None:
            return name
        for name in self.force:
            if name in op.implementations:
                return name
        return None

    def excluded(self, op: registry.Op, name: str) -> bool:
        return name in self.exclude or name in dict(self.exclude_op).get(op.name, ())


_KNOWN_OK: set = set()   # (names, per_op) already checked: registries only grow, so they stay valid


def _check_known(names, per_op, where):
    """Unknown ops or implementation names are an error (a typo would silently do nothing)."""
    done = (tuple(names), tuple(per_op))
    if done in _KNOWN_OK:  # (building the set of every implementation's name: ~10 us)
        return
    known_ops = registry.OPS
    known_names = {impl.name for impl in registry.implementations()}
    for op, name in per_op:
        if op not in known_ops:
            raise ValueError(f"{where}: unknown op {op!r}; known ops: {sorted(known_ops)}")
        if name not in known_ops[op].implementations:
            raise ValueError(f"{where}: op {op!r} has no implementation {name!r}; it has "
                             f"{sorted(known_ops[op].implementations)}")
    for name in names:
        if name not in known_names:
            raise ValueError(f"{where}: unknown implementation {name!r}; known: {sorted(known_names)}")
    _KNOWN_OK.add(done)


def parse_spec(var: str, spec: str | None, *, unique_ops: bool):
    """'cpu-serial' or 'softmax=cpu-serial,matmul=blas' -> (names, ((op, name), ...)).

    Raises ValueError naming `var` and the bad entry: an empty op or name, an unknown op or
    implementation, or (unique_ops) one op given twice."""
    names, per_op = [], []
    for item in (spec or "").replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            op, _, name = (s.strip() for s in item.partition("="))
            if not op or not name or "=" in name:
                raise ValueError(f"{var}: malformed entry {item!r}; expected NAME or OP=NAME")
            if unique_ops and any(o == op for o, _ in per_op):
                raise ValueError(f"{var}: op {op!r} is given twice ({item!r}); give each op once")
            per_op.append((op, name))
        else:
            names.append(item)
    _check_known(names, per_op, var)
    return tuple(names), tuple(per_op)


_env_lock = threading.Lock()
_env_state: Overrides | None = None
_env_error: ValueError | None = None


def _from_env() -> Overrides:
    """The process default from NK_USE / NK_EXCLUDE, parsed once (after every op has
    registered, so names can be checked).  A malformed variable raises on every call."""
    global _env_state, _env_error
    if _env_state is not None:
        return _env_state
    with _env_lock:
        if _env_state is None and _env_error is None:
            try:
                force, force_op = parse_spec("NK_USE", os.environ.get("NK_USE"), unique_ops=True)
                excl, excl_op = parse_spec("NK_EXCLUDE", os.environ.get("NK_EXCLUDE"), unique_ops=False)
                by_op: dict = {}
                for op, name in excl_op:
                    by_op.setdefault(op, set()).add(name)
                _env_state = Overrides(force, force_op, frozenset(excl),
                                       tuple((op, frozenset(n)) for op, n in by_op.items()))
            except ValueError as exc:
                _env_error = exc
    if _env_error is not None:
        raise ValueError(str(_env_error)) from None
    return _env_state


_current: contextvars.ContextVar[Overrides | None] = contextvars.ContextVar("nk_overrides", default=None)


def current() -> Overrides:
    """The override state of the calling thread / task."""
    state = _current.get()
    if state is not None:
        return state
    return _env_state if _env_state is not None else _from_env()


# One state (with its decision cache) per distinct override, shared by every block and
# thread that sets the same one: a fresh state per block re-decided every call inside it
# (a use() block around a 29 us layer_norm 128x768 took 53 us, 2026-12-03).  The decisions
# depend only on the key, the state and the tuning cache (clear_cache empties them all).
_STATES: dict = {}
_STATES_MAX = 256


@contextlib.contextmanager
def use(*names: str, exclude=(), tuned: bool | None = None, **per_op: str):
    """Force or exclude implementations inside a ``with`` block, in this thread only.

    ``use("cpu-serial")`` forces that implementation for every op that has one;
    ``use(softmax="cpu-parallel")`` forces it for one op; ``use(exclude="blas")`` or
    ``use(exclude=["blas", "cpu-gemv"])`` removes candidates; ``use(tuned=False)`` ignores
    the tuning cache (the shape rules decide).  Blocks nest; other threads are unaffected.
    The environment variables ``NK_USE`` and ``NK_EXCLUDE`` take the same forms
    ("cpu-serial", "softmax=cpu-serial,matmul=blas") for every thread of a process.
    """
    if isinstance(exclude, str):
        exclude = [exclude]
    for what, vals in (("implementation names", names), ("exclude", exclude)):
        bad = [v for v in vals if not isinstance(v, str)]
        if bad:
            raise TypeError(f"use(): {what} must be strings, got {bad[0]!r}")
    bad = {op: v for op, v in per_op.items() if not isinstance(v, str)}
    if bad:
        op = next(iter(bad))
        raise TypeError(f"use(): {op}= must be an implementation name (a string), got {bad[op]!r}")
    if tuned is not None and not isinstance(tuned, bool):
        raise TypeError(f"use(): tuned must be a bool, got {tuned!r}")
    _check_known(list(names) + list(exclude), list(per_op.items()), "use()")
    saved = current()
    fields = (tuple(names) + saved.force, tuple({**dict(saved.force_op), **per_op}.items()),
              saved.exclude | frozenset(exclude), saved.exclude_op, saved.tuned if tuned is None else tuned)
    state = _STATES.get(fields)
    if state is None:
        if len(_STATES) >= _STATES_MAX:
            _STATES.clear()
        state = _STATES.setdefault(fields, Overrides(*fields))
    token = _current.set(state)
    try:
        yield
    finally:
        _current.reset(token)


# ---- decision ----------------------------------------------------------------------------

def decide(key, state: Overrides | None = None) -> Decision:
    """The full decision for a key, with every candidate's verdict (what `explain` shows)."""
    state = state or current()
    op = registry.OPS[key.op]
    forced = state.forced_name(op)
    if forced is not None:
        impl = op.implementations[forced]
        reasons = impl.refusals(key)
        decision = Decision(op.name, key, None if reasons else impl, dict(impl.params),
                            "forced", f"forced by override to {forced!r}")
        decision.candidates.append((forced, "refused" if reasons else "chosen", reasons))
        for name in op.implementations:
            if name != forced:
                decision.candidates.append((name, "not tried", ["another implementation is forced"]))
        return decision

    tuned = tuning.lookup(op, key) if state.tuned else None
    if tuned is not None:
        names, params_by_name, rule = tuned
        source = "tuned"
    else:
        rule_of_device = op.rule(key.device)
        if rule_of_device is None:
            names, rule = (), f"no {key.device} rule: {op.name} has no {key.device} implementation"
        else:
            names, rule = rule_of_device(key)
        params_by_name, source = {}, "rule"
    names = list(names) + [n for n in op.implementations if n not in names]

    decision = Decision(op.name, key, None, {}, source, rule)
    for name in names:
        impl = op.implementations[name]
        if decision.chosen is not None:
            reasons = impl.refusals(key)
            verdict = "can run, ranked lower" if not reasons else "refused"
            decision.candidates.append((name, verdict, reasons or [f"ranked after {decision.chosen.name}: {rule}"]))
            continue
        if state.excluded(op, name):
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


def select(key):
    """(implementation, params) for a call key; cached per key in the calling thread's
    override state (one state per distinct override, see _STATES)."""
    state = current()
    hit = state.cache.get(key)
    if hit is not None:
        return hit
    decision = decide(key, state)
    if decision.chosen is None:
        _raise_none(decision)
    hit = (decision.chosen, decision.params)
    state.cache[key] = hit
    return hit


registry._select = select


def rule_choice(key):
    """The implementation the op's shape rule picks for this key (no overrides, no tuning
    cache): what the tuner compares its winners with and the CUDA model predicts."""
    return decide(key, Overrides(tuned=False)).chosen


def clear_cache():
    """Forget cached decisions (after the tuning cache changed)."""
    current().cache.clear()
    for state in list(_STATES.values()):
        state.cache.clear()
    if _env_state is not None:
        _env_state.cache.clear()
