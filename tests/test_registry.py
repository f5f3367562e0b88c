"""The registry contract (issue #7).

* Declaring inconsistently raises RegistryError: an implementation of an unknown op, an op
  or implementation registered twice, a second rule for one op and device, and
  `registry.check()` finds rules naming unregistered implementations or implementations
  of another device, implementations on a device without a rule, ops without a public
  function.  These are built on a scratch registry (registry.OPS monkeypatched), never by
  changing the real one.
* Every real op's rules return, for any key, only implementations registered on the
  key's device and declared in the rule (keys from real calls, then every size bucket).
* Every op is exported as dispatch.<name>, listed in __all__ and by `python -m dispatch`.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import dispatch
from dispatch import registry, select
from dispatch.registry import Implementation, Op, RegistryError, Rule
from tests import small_inputs as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL_OPS = dict(registry.OPS)


def _snapshot():
    return {name: (op, tuple(op.implementations), tuple(op.rules), op.public) for name, op in registry.OPS.items()}


@pytest.fixture
def scratch(monkeypatch):
    """An empty registry for the test; the real one is checked unchanged afterwards."""
    before = _snapshot()
    monkeypatch.setattr(registry, "OPS", {})
    yield registry.OPS
    monkeypatch.undo()
    assert registry.OPS is not None and _snapshot() == before, "a scratch test changed the real registry"


def _op(name="fake", rules=None, public=True):
    op = Op(name, describe=lambda *a, **k: None, family="fake", bound="memory",
            signature=lambda i: ((i["x"],), {}), flops=lambda call: 0, bytes=lambda call: 0,
            rules=dict(rules or {}))
    if public:
        def fn(x):
            """A fake op."""
            return x

        fn.__name__ = name
        op.expose(fn)
    return op


def _impl(name, op="fake", device="cpu"):
    return Implementation(op, name, device, run=lambda params, *args: None)


def _complete(scratch_ops):
    """A consistent fake op: two CPU implementations, one CUDA, a rule per device."""
    op = registry.register_op(_op(rules={"cpu": Rule(("a", "b"), lambda key: (("a", "b"), "a first"))}))
    registry.register(_impl("a"))
    registry.register(_impl("b"))
    registry.register(_impl("g", device="cuda"))
    registry.set_rule("fake", "cuda", Rule(("g",), lambda key: (("g",), "the only one")))
    return op


# ---- declaring -------------------------------------------------------------------------------

def test_complete_scratch_registry_passes_check(scratch):
    _complete(scratch)
    registry.check()
    assert [i.name for i in registry.implementations("fake", device="cpu")] == ["a", "b"]
    assert registry.families() == ["fake"]


def test_implementation_for_unknown_op(scratch):
    registry.register_op(_op())
    with pytest.raises(RegistryError, match="unknown op 'nope'"):
        registry.register(_impl("a", op="nope"))
    assert "nope" not in scratch


def test_op_registered_twice(scratch):
    first = registry.register_op(_op())
    with pytest.raises(RegistryError, match="'fake' registered twice"):
        registry.register_op(_op())
    assert scratch["fake"] is first


def test_implementation_registered_twice(scratch):
    registry.register_op(_op())
    first = registry.register(_impl("a"))
    with pytest.raises(RegistryError, match="'a' of op 'fake' registered twice"):
        registry.register(_impl("a"))
    with pytest.raises(RegistryError, match="registered twice"):
        registry.register(_impl("a", device="cuda"))  # same name on another device: still one namespace
    assert scratch["fake"].implementations["a"] is first


def test_implementation_on_unknown_device(scratch):
    registry.register_op(_op())
    with pytest.raises(RegistryError, match="unknown device 'tpu'"):
        registry.register(_impl("a", device="tpu"))
    assert not scratch["fake"].implementations


def test_set_rule_twice(scratch):
    rule = Rule(("a",), lambda key: (("a",), "only"))
    registry.register_op(_op(rules={"cpu": rule}))
    with pytest.raises(RegistryError, match="already has a cpu rule"):
        registry.set_rule("fake", "cpu", rule)
    registry.set_rule("fake", "cuda", Rule(("g",), lambda key: (("g",), "only")))
    with pytest.raises(RegistryError, match="already has a cuda rule"):
        registry.set_rule("fake", "cuda", Rule(("g",), lambda key: (("g",), "only")))
    assert scratch["fake"].rules["cpu"] is rule


@pytest.mark.parametrize("args, match", [
    (("nope", "cpu", Rule((), lambda k: ((), ""))), "unknown op 'nope'"),
    (("fake", "tpu", Rule((), lambda k: ((), ""))), "unknown device 'tpu'"),
    (("fake", "cpu", lambda k: ((), "")), "must be a registry.Rule"),
], ids=["unknown-op", "unknown-device", "not-a-rule"])
def test_set_rule_refuses(scratch, args, match):
    registry.register_op(_op())
    with pytest.raises(RegistryError, match=match):
        registry.set_rule(*args)
    assert not scratch["fake"].rules


def test_op_declaration_refused():
    with pytest.raises(RegistryError, match="bound must be one of"):
        Op("fake", lambda: None, family="fake", bound="latency", signature=lambda i: ((), {}),
           flops=lambda c: 0, bytes=lambda c: 0)
    with pytest.raises(RegistryError, match="unknown device"):
        _op(rules={"tpu": Rule((), lambda k: ((), ""))})
    with pytest.raises(RegistryError, match="must be a registry.Rule"):
        _op(rules={"cpu": ("a",)})
    op = _op(public=False)

    def other(x):
        return x

    with pytest.raises(RegistryError, match="names must match"):
        op.expose(other)
    assert op.public is None


def _check_fails(match):
    with pytest.raises(RegistryError, match=match) as info:
        registry.check()
    return str(info.value)


def test_check_rule_names_unregistered_implementation(scratch):
    registry.register_op(_op(rules={"cpu": Rule(("a", "ghost"), lambda key: (("a",), ""))}))
    registry.register(_impl("a"))
    _check_fails(r"fake: the cpu rule names 'ghost', which is not registered")


def test_check_rule_names_implementation_of_another_device(scratch):
    registry.register_op(_op(rules={"cpu": Rule(("a", "g"), lambda key: (("a",), ""))}))
    registry.register(_impl("a"))
    registry.register(_impl("g", device="cuda"))
    registry.set_rule("fake", "cuda", Rule(("g",), lambda key: (("g",), "")))
    _check_fails(r"fake: the cpu rule names 'g', which runs on cuda")


def test_check_implementations_on_a_device_without_rule(scratch):
    registry.register_op(_op(rules={"cpu": Rule(("a",), lambda key: (("a",), ""))}))
    registry.register(_impl("a"))
    registry.register(_impl("g", device="cuda"))
    _check_fails(r"fake: implementations on cuda but no cuda rule")


def test_check_op_without_public_function(scratch):
    registry.register_op(_op(rules={"cpu": Rule(("a",), lambda key: (("a",), ""))}, public=False))
    registry.register(_impl("a"))
    _check_fails(r"fake: no public function")


def test_check_op_without_implementation(scratch):
    registry.register_op(_op())
    _check_fails(r"fake: no implementation")


def test_check_reports_every_problem_at_once(scratch):
    registry.register_op(_op("one", public=False, rules={"cpu": Rule(("ghost",), lambda key: ((), ""))}))
    registry.register_op(_op("two"))
    registry.register(_impl("g", op="two", device="cuda"))
    msg = _check_fails("inconsistent registry")
    for part in ("one: no public function", "one: the cpu rule names 'ghost'", "one: no implementation",
                 "two: implementations on cuda but no cuda rule"):
        assert part in msg, msg


def test_rule_returning_an_undeclared_name_raises():
    rule = Rule(("a", "b"), lambda key: (("a", "c"), "c is not declared"))
    with pytest.raises(RegistryError, match=r"\['c'\]"):
        rule(None)


def test_real_registry_is_consistent():
    registry.check()
    assert dict(registry.OPS) == REAL_OPS
    for op in registry.OPS.values():
        assert op.rule("cpu") is not None, f"{op.name} has no CPU rule"
        assert S.cpu_impls(op), f"{op.name} has no CPU implementation"
        for impl in op.implementations.values():
            assert impl.op == op.name and impl.device in registry.DEVICES
    assert sorted(registry.families()) == sorted({op.family for op in registry.OPS.values()})


# ---- the real rules on many keys ------------------------------------------------------------

GRID = sorted(set(range(17)) | {1 << p for p in range(5, 31)})


def _sample_keys(op):
    """Keys of real calls: small, large and decode-shaped inputs, float32 and float64."""
    keys = []
    for size in S.SHAPES:
        for dtype in (np.float32, np.float64):
            named = S.inputs(op, size, dtype=dtype, seed=1)
            args, kwargs = S.call_args(op, named)
            keys.append(op.describe(*args, **kwargs).key)
    return keys


def _grid_keys(op, rng):
    """The sample keys, each size-like field (an int field that differs between the real
    calls) over every bucket value, each bool field flipped, and random combinations."""
    samples = _sample_keys(op)
    fields = samples[0]._fields
    size_like = [f for f in fields
                 if all(type(getattr(k, f)) is int for k in samples) and len({getattr(k, f) for k in samples}) > 1]
    flags = [f for f in fields if all(isinstance(getattr(k, f), (bool, np.bool_)) for k in samples)]
    assert size_like, f"{op.name}: no size field varies between the sample calls"
    keys = list(samples)
    for k in samples:
        for f in size_like:
            keys += [k._replace(**{f: v}) for v in GRID]
        for f in flags:
            keys.append(k._replace(**{f: not getattr(k, f)}))
    for _ in range(400):
        k = samples[rng.integers(len(samples))]
        change = {f: int(rng.choice(GRID)) for f in size_like}
        change.update({f: bool(rng.integers(2)) for f in flags})
        keys.append(k._replace(**change))
    return keys, size_like


@pytest.mark.parametrize("op_name", list(registry.OPS))
def test_rules_name_only_registered_implementations_of_the_device(op_name):
    op = registry.OPS[op_name]
    rng = np.random.default_rng(0)
    keys, size_like = _grid_keys(op, rng)
    for device, rule in op.rules.items():
        registered = {n for n, impl in op.implementations.items() if impl.device == device}
        for key in keys:
            key = key._replace(device=device)
            names, why = rule(key)  # Rule.__call__ raises for names not declared in rule.names
            assert names, f"{op_name} {device}: the rule returned no candidate for {key}"
            assert set(names) <= set(rule.names), (key, names)
            assert set(names) <= registered, f"{op_name} {device}: {set(names) - registered} for {key}"
            assert len(set(names)) == len(names), f"{op_name} {device}: duplicates {names}"
            assert isinstance(why, str) and why, f"{op_name} {device}: no reason for {key}"
            if device == "cpu":
                chosen = select.rule_choice(key)
                assert chosen is not None and chosen.device == "cpu", f"{op_name}: nothing can run {key}"


def test_rules_see_many_distinct_keys():
    """The grid above really varies the keys (a guard on the test itself)."""
    rng = np.random.default_rng(0)
    for op in registry.OPS.values():
        keys, size_like = _grid_keys(op, rng)
        assert len(set(keys)) > 50, (op.name, size_like)


# ---- public names ----------------------------------------------------------------------------

def test_every_op_is_exported():
    assert tuple(registry.OPS) == dispatch.OPS
    for name, op in registry.OPS.items():
        assert op.public is not None
        assert getattr(dispatch, name) is op.public, f"dispatch.{name} is not the op's public function"
        assert name in dispatch.__all__, f"{name} missing from dispatch.__all__"
        assert op.public.__name__ == name
        assert (op.public.__doc__ or "").strip(), f"dispatch.{name} has no docstring"
    for name in ("explain", "use", "NoImplementationError", "Explanation", "registry"):
        assert name in dispatch.__all__ and hasattr(dispatch, name)
    assert len(set(dispatch.__all__)) == len(dispatch.__all__), "duplicates in dispatch.__all__"
    missing = [n for n in dispatch.__all__ if not hasattr(dispatch, n)]
    assert not missing


def test_star_import_gives_every_op():
    ns: dict = {}
    exec("from dispatch import *", ns)  # noqa: S102 - the public namespace itself is under test
    for name in registry.OPS:
        assert ns.get(name) is registry.OPS[name].public


def test_python_m_dispatch_lists_every_op():
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("NK_USE", None)
    env.pop("NK_EXCLUDE", None)
    r = subprocess.run([sys.executable, "-m", "dispatch"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    for op in registry.OPS.values():
        assert f"dispatch.{op.name}(" in out, f"python -m dispatch does not list {op.name}"
        assert f"[{op.family}]" in out
        for device in registry.DEVICES:
            names = [i.name for i in op.implementations.values() if i.device == device]
            if names:
                assert f"{device}: {', '.join(names)}" in out, (op.name, device)
    ops_part, _, extra_part = out.partition("\nalso:")
    listed = [ln.split("(")[0].strip() for ln in ops_part.splitlines() if ln.strip().startswith("dispatch.")
              and "(" in ln]
    assert sorted(n.removeprefix("dispatch.") for n in listed) == sorted(registry.OPS)
    for name in dispatch._EXTRA:  # the op modules' exported helpers, after the ops
        assert f"dispatch.{name}" in extra_part, f"python -m dispatch does not list {name}"


def test_scratch_fixture_restores(scratch):
    """(The scratch registry is empty and separate from the real one.)"""
    assert scratch == {} and registry.OPS is scratch
    assert dispatch.softmax is REAL_OPS["softmax"].public


def test_real_registry_after_scratch_tests():
    assert registry.OPS == REAL_OPS
    registry.check()


def test_half_octave_buckets():
    """bucket_half: exact up to 16, then 2^j and 3 * 2^(j-1); its power-of-two floor is
    bucket's, thresholds at powers of two (and three times them) read the same on it as on
    the size, and every size lies in [bucket_half(n), bucket_half_end(bucket_half(n)))."""
    from dispatch.registry import bucket, bucket_half, bucket_half_end
    assert [bucket_half(n) for n in (1, 16, 17, 23, 24, 255, 256, 383, 384, 511, 512, 768, 1535)] == [
        1, 16, 16, 16, 24, 192, 256, 256, 384, 384, 512, 768, 1024]
    thresholds = [1 << j for j in range(4, 13)] + [3 << j for j in range(3, 12)]
    for n in range(1, 5000):
        b = bucket_half(n)
        assert bucket(b) == bucket(n) and b <= n < bucket_half_end(b), n
        assert all((n >= t) == (b >= t) for t in thresholds), n
