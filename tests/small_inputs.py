"""Small inputs for every registered op, found from the registry (no list of ops).

The contract tests (test_threads, test_contract, test_registry) call every op on the
example inputs of dispatch/examples.py (the same ones `python -m dispatch.warmup` compiles
with): shapes by the op's pattern of input names, or the EXAMPLE_SHAPES its own
dispatch/ops/<family>.py declares; an op with neither fails `shapes_for` loudly instead
of being skipped.
"""
from __future__ import annotations

import numpy as np

from dispatch import registry
from dispatch import examples as EX
from dispatch.examples import SHAPES, names_read  # noqa: F401 - SHAPES: the size names tests iterate

# The parameter value meaning "no override: whatever the dispatcher picks" (not None: the
# conftest treats impl=None as a dropped skip mark).
DEFAULT = "dispatch"

SIZES = ("small", "large")  # what the thread and contract tests run; "decode" adds rule coverage


def shapes_for(op: registry.Op, size: str = "small") -> dict:
    """The named input shapes of op for one size (dispatch.examples: by input pattern, or
    the op module's EXAMPLE_SHAPES); AssertionError for an unknown pattern."""
    shapes = EX.shapes_for(op, size)
    assert shapes is not None, (
        f"op {op.name!r} takes inputs {sorted(names_read(op)[0])}, a pattern dispatch/examples.py has no shapes "
        f"for: declare EXAMPLE_SHAPES for it in its dispatch/ops/{op.family}.py")
    return shapes


def inputs(op: registry.Op, size: str = "small", dtype=np.float32, seed=None) -> dict:
    """The named inputs (arrays) of op, drawn by the op itself."""
    return EX.inputs(op, size, dtype, seed, shapes=shapes_for(op, size))


def call_args(op: registry.Op, named: dict):
    """(args, kwargs) of op's public function for named inputs, with fresh copies of the
    inputs it updates in place (Op.updates): every call sees the same inputs."""
    return op.signature(op.fresh_inputs(named))


def call(op: registry.Op, named: dict, **extra):
    args, kwargs = call_args(op, named)
    return op.public(*args, **kwargs, **extra)


def array_names(named: dict):
    """The names of the array inputs, in order."""
    return [n for n, v in named.items() if isinstance(v, np.ndarray)]


def public_names(op: registry.Op, named: dict) -> dict:
    """Which public parameter each named input is passed as (by position or keyword):
    {input name: parameter name}.  Input names and parameter names coincide for the ops
    here, but this is checked, not assumed."""
    import inspect

    params = list(inspect.signature(op.public).parameters)
    args, kwargs = op.signature({n: ("__probe__", n) for n in named})
    found = {}
    for pos, a in enumerate(args):
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "__probe__":
            found[a[1]] = params[pos]
    for k, a in kwargs.items():
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "__probe__":
            found[a[1]] = k
    return found


def same(a, b) -> bool:
    """Bitwise equality of results (arrays, tuples of arrays, or QuantizedArrays: values,
    scale, zero point and axis), NaN equal to NaN."""
    from dispatch.quantized import QuantizedArray

    if isinstance(a, QuantizedArray) or isinstance(b, QuantizedArray):
        return (isinstance(a, QuantizedArray) and isinstance(b, QuantizedArray) and a.axis == b.axis
                and same(np.asarray(a.values), np.asarray(b.values)) and same(a.scale, b.scale)
                and same(a.zero_point, b.zero_point))
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def has_out(op: registry.Op) -> bool:
    import inspect

    return "out" in inspect.signature(op.public).parameters


def cpu_impls(op: registry.Op):
    """op's CPU implementations that take its example inputs.  Left out: those that refuse
    the small example's key outright, i.e. that serve another kind of input of the same op
    (linear's weight-only *-wo-* kernels take low-precision weights only; their own test
    file, tests/test_weight_only.py, runs them, threads included)."""
    args, kwargs = call_args(op, inputs(op, "small", seed=0))
    key = op.describe(*args, **kwargs).key
    return [impl.name for impl in op.implementations.values() if impl.device == "cpu" and not impl.refusals(key)]
