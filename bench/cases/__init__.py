"""The benchmark shapes, taken from real models, read by the report (`python -m bench`), the
tuner (`python -m bench tune`), the asv suite (bench/benchmarks), the PTX report and the
CUDA performance model.

A case is data: the op, a readable name, the model it comes from, the named input shapes
and the op's parameters.  The rows live beside their family, one module per family
(`bench/cases/<family>.py` defining ``CASES``), discovered here: adding an op's shapes is
adding its module.  What a case's inputs are and how they map onto the public function is
the op's own knowledge (`Op.inputs`, `Op.signature` in its dispatch/ops module), so this
package keeps no per-op table.

Models (batch 1 unless stated):
  BERT-base   hidden 768, 12 heads of 64, FFN 3072, sequence 128
  MiniLM-L6   hidden 384, 12 heads of 32, FFN 1536, sequence 128 (all-MiniLM-L6-v2)
  Llama-7B    hidden 4096, 32 heads of 128, FFN 11008; prefill of 128 / 512 tokens,
              decode of 1 token against a KV cache of 4096
  GPT-2       vocabulary 50257: the LM-head softmax / cross-entropy over 128 or 1024 tokens
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field

import numpy as np

# Model dimensions.
BERT = dict(h=768, heads=12, dh=64, ffn=3072, seq=128)
MINILM = dict(h=384, heads=12, dh=32, ffn=1536, seq=128)
LLAMA = dict(h=4096, heads=32, dh=128, ffn=11008, kv=4096)
GPT2_VOCAB = 50257


def _op(name):
    import dispatch  # noqa: F401  (registers every op)
    from dispatch import registry

    op = registry.OPS.get(name)
    if op is None:
        raise ValueError(f"benchmark case for unknown op {name!r}; registered ops: {sorted(registry.OPS)}")
    return op


class ShapeOnlyRng:
    """Stands in for a numpy Generator where only shapes and dtypes matter (the CUDA model
    describes calls without running them): every draw is a zero-stride view of one zero.
    Synthesizers that would compute on full arrays check registry.shape_only(rng) and
    draw with registry.draw_normal (contiguous zeros that cost nothing to make)."""

    shape_only = True

    def standard_normal(self, shape):
        return np.broadcast_to(np.zeros((), np.float64), shape)

    def integers(self, low, high=None, size=None, dtype=np.int64):
        return np.broadcast_to(np.zeros((), dtype), () if size is None else size)


@dataclass(frozen=True)
class Case:
    op: str
    name: str                  # unique within the op, e.g. "bert-base ffn-up"
    model: str
    shapes: dict               # input name -> shape
    params: dict = field(default_factory=dict)  # non-array arguments (axis, causal, ...)
    quick: bool = False        # part of the quick report / asv quick set
    # low-precision cases: probe(case, float32 inputs) -> (low-precision result, float32
    # result), the accuracy cost the report and asv show beside the times (bench/accuracy.py)
    accuracy: object = field(default=None, compare=False)
    # the report also measures each candidate's peak memory above its inputs (bench/memory.py):
    # for ops whose point is memory (linear_cross_entropy never holds the logits)
    memory: bool = False

    @property
    def id(self) -> str:
        return f"{self.op}:{self.name}"

    @property
    def family(self) -> str:
        return _op(self.op).family

    @property
    def label(self) -> str:
        dims = " ".join("x".join(str(d) for d in s) for s in self.shapes.values())
        return f"{self.name} [{dims}]"

    def inputs(self, rng: np.random.Generator, dtype=np.float32, shape_only: bool = False) -> dict:
        """The named input arrays (and parameters) of this case, drawn by the op's own
        synthesis.  shape_only=True: zeros of the right shapes and dtypes, drawn without
        a random generator, for describing calls (the CUDA model): read-only zero-stride
        views, except the inputs the op updates in place (Op.updates)."""
        op = _op(self.op)
        if not shape_only:
            return op.inputs(self.shapes, self.params, rng, np.dtype(dtype).type)
        named = op.inputs(self.shapes, self.params, ShapeOnlyRng(), np.dtype(dtype).type)
        # inputs the op writes in place must be writeable arrays: materialize them (decode states, small)
        return {k: (np.zeros(v.shape, v.dtype) if k in op.updates else v) for k, v in named.items()}

    def call_args(self, inputs: dict):
        """(args, kwargs) for dispatch.<op>(*args, **kwargs)."""
        return _op(self.op).signature(inputs)


def case(op, name, model, shapes, quick=False, accuracy=None, memory=False, **params) -> Case:
    """One row of a family module's CASES (accuracy, memory: see Case)."""
    return Case(op, name, model, shapes, params, quick, accuracy, memory)


def _discover() -> list[Case]:
    rows = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        rows.extend(mod.CASES)
    ids = [c.id for c in rows]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"duplicate benchmark case ids: {dup}")
    for c in rows:
        _op(c.op)  # an unknown op is an error here, not a silent skip later
    return rows


CASES: list[Case] = _discover()


def cases(ops=None, quick: bool = False) -> list[Case]:
    """The cases of the given ops (all when None), only the quick set when quick."""
    return [c for c in CASES if (ops is None or c.op in ops) and (c.quick or not quick)]


def by_id(case_id: str) -> Case:
    for c in CASES:
        if c.id == case_id:
            return c
    raise KeyError(case_id)
