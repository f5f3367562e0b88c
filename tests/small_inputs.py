"""Small inputs for every registered op, found from the registry (no list of ops).

The contract tests (test_threads, test_contract, test_registry) call every op.  Which
named inputs an op takes is read off its own ``Op.signature`` (called on a recording
mapping: ``i["x"]`` is a required input, ``i.get("bias")`` an optional one); the arrays are
drawn by the op's own ``Op.inputs`` (its synthesizer makes targets, rope tables, ...).  Only
the shapes are given here, keyed by the *set of required input names*, so a new op with
a known input pattern (another unary op, another norm) is covered without an edit; an op
with a new pattern declares its shapes in its own bench/cases/<family>.py (TEST_SHAPES),
and without them fails `shapes_for` loudly instead of being skipped.
"""
from __future__ import annotations

import numpy as np

from dispatch import registry

# Shapes by the set of required input names; optional names listed here are used only by
# ops whose signature reads them (layer_norm reads weight and bias, relu neither).
# "small": the serial kernels' side of every CPU rule, odd sizes (tails of SIMD loops).
# "large": past the serial/parallel thresholds (2^16 elements) and, for matmul / linear,
# a 64 x 256 x 256 product, so the cache-blocked GEMM packs its panels.
SHAPES = {
    "small": {
        frozenset({"x"}): {"x": (5, 37), "weight": (37,), "bias": (37,)},
        frozenset({"gate", "up"}): {"gate": (5, 37), "up": (5, 37)},
        frozenset({"a", "b"}): {"a": (2, 5, 24), "b": (24, 19), "bias": (19,)},
        frozenset({"x", "weight"}): {"x": (5, 24), "weight": (19, 24), "bias": (19,)},
        frozenset({"logits", "targets"}): {"logits": (5, 37)},
        frozenset({"x", "cos", "sin"}): {"x": (2, 3, 6, 16)},
        frozenset({"q", "k", "v"}): {"q": (1, 4, 6, 16), "k": (1, 2, 9, 16), "v": (1, 2, 9, 16)},
    },
    "large": {
        frozenset({"x"}): {"x": (64, 1100), "weight": (1100,), "bias": (1100,)},
        frozenset({"gate", "up"}): {"gate": (64, 1100), "up": (64, 1100)},
        frozenset({"a", "b"}): {"a": (64, 256), "b": (256, 256), "bias": (256,)},
        frozenset({"x", "weight"}): {"x": (64, 256), "weight": (256, 256), "bias": (256,)},
        frozenset({"logits", "targets"}): {"logits": (64, 1100)},
        frozenset({"x", "cos", "sin"}): {"x": (2, 8, 64, 64)},
        frozenset({"q", "k", "v"}): {"q": (1, 8, 40, 32), "k": (1, 4, 70, 32), "v": (1, 4, 70, 32)},
    },
    # one row / one query against a longer context, grouped heads (only where rules look)
    "decode": {
        frozenset({"x"}): {"x": (1, 4096), "weight": (4096,), "bias": (4096,)},
        frozenset({"gate", "up"}): {"gate": (1, 11), "up": (1, 11)},
        frozenset({"a", "b"}): {"a": (1, 96), "b": (96, 200), "bias": (200,)},
        frozenset({"x", "weight"}): {"x": (3, 96), "weight": (200, 96), "bias": (200,)},
        frozenset({"logits", "targets"}): {"logits": (1, 3000)},
        frozenset({"x", "cos", "sin"}): {"x": (1, 4, 1, 8)},
        frozenset({"q", "k", "v"}): {"q": (1, 8, 1, 16), "k": (1, 2, 300, 16), "v": (1, 2, 300, 16)},
    },
}
# The parameter value meaning "no override: whatever the dispatcher picks" (not None: the
# conftest treats impl=None as a dropped skip mark).
DEFAULT = "dispatch"

SIZES = ("small", "large")  # what the thread and contract tests run; "decode" adds rule coverage


class _Recorder(dict):
    """A mapping that records which names a signature reads, and how."""

    def __init__(self):
        super().__init__()
        self.required, self.optional = [], []

    def __getitem__(self, name):
        self.required.append(name)
        return object()

    def get(self, name, default=None):
        self.optional.append(name)
        return default

    def __contains__(self, name):
        self.optional.append(name)
        return False


def names_read(op: registry.Op):
    """(required, optional) input names op.signature reads."""
    rec = _Recorder()
    op.signature(rec)
    return tuple(dict.fromkeys(rec.required)), tuple(n for n in dict.fromkeys(rec.optional) if n not in rec.required)


def _declared(op: registry.Op, size: str):
    """Shapes the op's own case module declares for these tests, if any:
    ``TEST_SHAPES = {op_name: {"small": {...}, "large": {...}, "decode": {...}}}`` in
    bench/cases/<family>.py (an op with inputs of a new pattern, e.g. a convolution whose
    (x, weight) are not linear's, declares them there, beside its benchmark shapes)."""
    import importlib

    try:
        mod = importlib.import_module(f"bench.cases.{op.family}")
    except ImportError:
        return None
    return getattr(mod, "TEST_SHAPES", {}).get(op.name, {}).get(size)


def shapes_for(op: registry.Op, size: str = "small") -> dict:
    """The named input shapes of op for one size: the op's own TEST_SHAPES if its case
    module declares them, else by its pattern of input names (AssertionError for an
    unknown pattern)."""
    required, optional = names_read(op)
    table = _declared(op, size) or SHAPES[size].get(frozenset(required))
    assert table is not None, (
        f"op {op.name!r} takes inputs {sorted(required)}, a pattern tests/small_inputs.py has no shapes "
        f"for: declare TEST_SHAPES for it in bench/cases/{op.family}.py")
    return {n: s for n, s in table.items() if n in required or n in optional}


def inputs(op: registry.Op, size: str = "small", dtype=np.float32, seed=None) -> dict:
    """The named inputs (arrays) of op, drawn by the op itself."""
    rng = np.random.default_rng(seed)
    got = op.inputs(shapes_for(op, size), {}, rng, np.dtype(dtype).type)
    required, _ = names_read(op)
    missing = [n for n in required if n not in got]
    assert not missing, f"op {op.name!r}: Op.inputs made no {missing}"
    return got


def call_args(op: registry.Op, named: dict):
    """(args, kwargs) of op's public function for named inputs."""
    return op.signature(named)


def call(op: registry.Op, named: dict, **extra):
    args, kwargs = op.signature(named)
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
    """Bitwise equality of results (arrays or tuples of arrays), NaN equal to NaN."""
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
    return [impl.name for impl in op.implementations.values() if impl.device == "cpu"]
