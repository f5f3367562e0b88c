"""Example inputs for every registered op, found from the registry (no list of ops).

Used by ``python -m dispatch.warmup`` (compile ahead of time) and by the contract tests
(tests/small_inputs.py).  Which named inputs an op takes is read off its own
``Op.signature`` (called on a recording mapping: ``i["x"]`` is a required input,
``i.get("bias")`` an optional one); the arrays are drawn by the op's own ``Op.inputs``
(its synthesizer makes targets, rope tables, ...).  Only the shapes are given here, keyed
by the *set of required input names*, so a new op with a known input pattern (another
unary op, another norm) is covered without an edit; an op with a new pattern declares
``EXAMPLE_SHAPES = {op_name: {"small": {...}, "large": {...}, "decode": {...}}}`` in its
own ``dispatch/ops/<family>.py``.
"""
from __future__ import annotations

import importlib

import numpy as np

from . import registry

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


def declared(op: registry.Op, size: str):
    """The op module's own EXAMPLE_SHAPES for this size, if it declares them."""
    mod = importlib.import_module(op.describe.__module__)
    return getattr(mod, "EXAMPLE_SHAPES", {}).get(op.name, {}).get(size)


def shapes_for(op: registry.Op, size: str = "small") -> dict | None:
    """The named input shapes of op for one size (None for an input pattern with no
    shapes here and none declared)."""
    required, optional = names_read(op)
    table = declared(op, size) or SHAPES[size].get(frozenset(required))
    if table is None:
        return None
    return {n: s for n, s in table.items() if n in required or n in optional}


def inputs(op: registry.Op, size: str = "small", dtype=np.float32, seed=None, shapes=None) -> dict:
    """The named inputs (arrays) of op, drawn by the op itself (shapes: shapes_for's)."""
    rng = np.random.default_rng(seed)
    shapes = shapes_for(op, size) if shapes is None else shapes
    if shapes is None:
        raise LookupError(f"op {op.name!r}: no example shapes for inputs {sorted(names_read(op)[0])}")
    got = op.inputs(shapes, {}, rng, np.dtype(dtype).type)
    required, _ = names_read(op)
    missing = [n for n in required if n not in got]
    if missing:
        raise LookupError(f"op {op.name!r}: Op.inputs made no {missing}")
    return got
