"""The benchmark shapes: one table of cases taken from real models, read by the report
(`python -m bench`), the tuner (`python -m bench tune`), the asv suite (bench/benchmarks)
and the CUDA performance model.

A case is data: the op, a readable name, the model it comes from, the named input shapes
and the op's parameters.  ``Case.inputs(rng, dtype)`` draws the arrays; ``Case.call_args``
turns them into the (args, kwargs) of the public function ``dispatch.<op>``; the peers
(bench/peers.py) read the same named inputs.  To add shapes (CNN, diffusion, Mamba, MoE),
append ``Case`` rows to CASES; a new op also adds one entry to SIGNATURES (how its named
inputs map onto the public function's arguments) and one to bench/peers.py.

Models (batch 1 unless stated):
  BERT-base   hidden 768, 12 heads of 64, FFN 3072, sequence 128
  MiniLM-L6   hidden 384, 12 heads of 32, FFN 1536, sequence 128 (all-MiniLM-L6-v2)
  Llama-7B    hidden 4096, 32 heads of 128, FFN 11008; prefill of 128 / 512 tokens,
              decode of 1 token against a KV cache of 4096
  GPT-2       vocabulary 50257: the LM-head softmax / cross-entropy over 128 or 1024 tokens
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Case:
    op: str
    name: str                  # unique within the op, e.g. "bert-base ffn-up"
    model: str
    shapes: dict               # input name -> shape (float inputs unless listed in INT_INPUTS)
    params: dict = field(default_factory=dict)  # non-array arguments (axis, causal, ...)
    quick: bool = False        # part of the quick report / asv quick set
    family: str = ""

    @property
    def id(self) -> str:
        return f"{self.op}:{self.name}"

    @property
    def label(self) -> str:
        dims = " ".join("x".join(str(d) for d in s) for s in self.shapes.values())
        return f"{self.name} [{dims}]"

    def inputs(self, rng: np.random.Generator, dtype=np.float32, empty: bool = False) -> dict:
        """The named input arrays (and parameters) of this case, freshly drawn (empty=True:
        uninitialized float arrays, for checks that need shapes only)."""
        out = {}
        for name, shape in self.shapes.items():
            if empty and name not in INT_INPUTS:
                out[name] = np.empty(shape, dtype)
            elif name in INT_INPUTS:
                high = self.params.get("classes") or shape[-1]
                out[name] = rng.integers(0, high, size=shape, dtype=np.int64)
            elif name in POSITIVE_INPUTS:
                out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(dtype)
            else:
                out[name] = rng.standard_normal(shape).astype(dtype)
        if self.op == "cross_entropy":
            out["targets"] = rng.integers(0, self.shapes["logits"][-1], size=self.shapes["logits"][:-1], dtype=np.int64)
        if self.op == "rope":
            out.update(rope_tables(self.shapes["x"][-2], self.shapes["x"][-1], dtype))
        out.update(self.params)
        return out

    def call_args(self, inputs: dict):
        """(args, kwargs) for dispatch.<op>(*args, **kwargs)."""
        return SIGNATURES[self.op](inputs)


INT_INPUTS = {"targets"}
POSITIVE_INPUTS = {"weight"}


def rope_tables(seq: int, dim: int, dtype, base: float = 10000.0, offset: int = 0):
    """cos/sin tables (seq, dim/2) of rotary embeddings at positions offset..offset+seq-1."""
    inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    ang = np.outer(np.arange(offset, offset + seq, dtype=np.float64), inv)
    return {"cos": np.cos(ang).astype(dtype), "sin": np.sin(ang).astype(dtype)}


def _x(inp):
    return (inp["x"],), {}


# How each op's named inputs become the public function's arguments.  The op families own
# their signatures: if one differs from the guess here, this table is the one place to fix.
SIGNATURES = {
    "relu": _x,
    "silu": _x,
    "gelu": lambda i: ((i["x"],), {"approximate": i.get("approximate", "none")}),
    "swiglu": lambda i: ((i["gate"], i["up"]), {}),
    "geglu": lambda i: ((i["gate"], i["up"]), {"approximate": i.get("approximate", "none")}),
    "matmul": lambda i: ((i["a"], i["b"]), {}),
    "linear": lambda i: ((i["x"], i["weight"], i.get("bias")), {"activation": i.get("activation")}),
    "softmax": lambda i: ((i["x"],), {"axis": -1}),
    "log_softmax": lambda i: ((i["x"],), {"axis": -1}),
    "cross_entropy": lambda i: ((i["logits"], i["targets"]), {}),
    "layer_norm": lambda i: ((i["x"], i["weight"], i["bias"]), {"eps": 1e-5}),
    "rms_norm": lambda i: ((i["x"], i["weight"]), {"eps": 1e-6}),
    "rope": lambda i: ((i["x"], i["cos"], i["sin"]), {"interleaved": i.get("interleaved", False)}),
    "attention": lambda i: ((i["q"], i["k"], i["v"]), {"causal": i.get("causal", False)}),
}

FAMILIES = {
    "relu": "activation", "silu": "activation", "gelu": "activation", "swiglu": "activation",
    "geglu": "activation", "matmul": "linalg", "linear": "linalg", "softmax": "softmax",
    "log_softmax": "softmax", "cross_entropy": "softmax", "layer_norm": "norm",
    "rms_norm": "norm", "rope": "rope", "attention": "attention",
}

# Model dimensions.
BERT = dict(h=768, heads=12, dh=64, ffn=3072, seq=128)
MINILM = dict(h=384, heads=12, dh=32, ffn=1536, seq=128)
LLAMA = dict(h=4096, heads=32, dh=128, ffn=11008, kv=4096)
GPT2_VOCAB = 50257


def _c(op, name, model, shapes, quick=False, **params):
    return Case(op, name, model, shapes, params, quick, FAMILIES.get(op, op))


CASES: list[Case] = [
    # ---- activations (elementwise over the FFN intermediate) ----
    _c("relu", "bert-base ffn", "BERT-base", {"x": (128, 3072)}, quick=True),
    _c("silu", "llama-7b ffn prefill 128", "Llama-7B", {"x": (128, 11008)}, quick=True),
    _c("silu", "llama-7b ffn prefill 512", "Llama-7B", {"x": (512, 11008)}),
    _c("gelu", "bert-base ffn", "BERT-base", {"x": (128, 3072)}, quick=True),
    _c("gelu", "bert-base ffn tanh", "BERT-base", {"x": (128, 3072)}, approximate="tanh"),
    _c("gelu", "minilm ffn", "MiniLM-L6", {"x": (128, 1536)}),
    _c("swiglu", "llama-7b ffn prefill 128", "Llama-7B", {"gate": (128, 11008), "up": (128, 11008)}, quick=True),
    _c("swiglu", "llama-7b ffn prefill 512", "Llama-7B", {"gate": (512, 11008), "up": (512, 11008)}),
    _c("swiglu", "llama-7b ffn decode", "Llama-7B", {"gate": (1, 11008), "up": (1, 11008)}),
    _c("geglu", "bert-base-sized ffn", "BERT-base", {"gate": (128, 3072), "up": (128, 3072)}, quick=True),
    # ---- matmul / linear ----
    _c("matmul", "bert-base qkv proj", "BERT-base", {"a": (128, 768), "b": (768, 768)}, quick=True),
    _c("matmul", "llama-7b decode proj", "Llama-7B", {"a": (1, 4096), "b": (4096, 4096)}, quick=True),
    _c("matmul", "llama-7b prefill 128 proj", "Llama-7B", {"a": (128, 4096), "b": (4096, 4096)}),
    _c("matmul", "llama-7b prefill 512 proj", "Llama-7B", {"a": (512, 4096), "b": (4096, 4096)}),
    _c("matmul", "minilm proj", "MiniLM-L6", {"a": (128, 384), "b": (384, 384)}),
    _c("matmul", "square 1024", "GEMM", {"a": (1024, 1024), "b": (1024, 1024)}),
    _c("linear", "bert-base ffn-up +gelu", "BERT-base",
       {"x": (128, 768), "weight": (3072, 768), "bias": (3072,)}, quick=True, activation="gelu"),
    _c("linear", "bert-base ffn-down", "BERT-base", {"x": (128, 3072), "weight": (768, 3072), "bias": (768,)}),
    _c("linear", "minilm ffn-up +gelu", "MiniLM-L6",
       {"x": (128, 384), "weight": (1536, 384), "bias": (1536,)}, activation="gelu"),
    _c("linear", "llama-7b decode gate", "Llama-7B", {"x": (1, 4096), "weight": (11008, 4096)}),
    # ---- softmax family ----
    _c("softmax", "bert-base attn scores", "BERT-base", {"x": (1, 12, 128, 128)}, quick=True),
    _c("softmax", "gpt-2 vocab 128", "GPT-2", {"x": (128, GPT2_VOCAB)}, quick=True),
    _c("softmax", "gpt-2 vocab 1024", "GPT-2", {"x": (1024, GPT2_VOCAB)}),
    _c("softmax", "llama-7b attn scores 512", "Llama-7B", {"x": (1, 32, 512, 512)}),
    _c("log_softmax", "gpt-2 vocab 128", "GPT-2", {"x": (128, GPT2_VOCAB)}, quick=True),
    _c("log_softmax", "gpt-2 vocab 1024", "GPT-2", {"x": (1024, GPT2_VOCAB)}),
    _c("cross_entropy", "gpt-2 lm loss 128", "GPT-2", {"logits": (128, GPT2_VOCAB)}, quick=True),
    _c("cross_entropy", "gpt-2 lm loss 1024", "GPT-2", {"logits": (1024, GPT2_VOCAB)}),
    # ---- norms ----
    _c("layer_norm", "bert-base", "BERT-base", {"x": (128, 768), "weight": (768,), "bias": (768,)}, quick=True),
    _c("layer_norm", "minilm", "MiniLM-L6", {"x": (128, 384), "weight": (384,), "bias": (384,)}),
    _c("layer_norm", "bert-base batch 32", "BERT-base", {"x": (32 * 128, 768), "weight": (768,), "bias": (768,)}),
    _c("rms_norm", "llama-7b prefill 512", "Llama-7B", {"x": (512, 4096), "weight": (4096,)}, quick=True),
    _c("rms_norm", "llama-7b decode", "Llama-7B", {"x": (1, 4096), "weight": (4096,)}),
    # ---- rotary embeddings: x (batch, heads, seq, head_dim), tables (seq, head_dim/2) ----
    _c("rope", "llama-7b prefill 512", "Llama-7B", {"x": (1, 32, 512, 128)}, quick=True),
    _c("rope", "llama-7b decode", "Llama-7B", {"x": (1, 32, 1, 128)}),
    # ---- attention: q, k, v (batch, heads, seq, head_dim) ----
    _c("attention", "bert-base seq 128", "BERT-base",
       {"q": (1, 12, 128, 64), "k": (1, 12, 128, 64), "v": (1, 12, 128, 64)}, quick=True),
    _c("attention", "minilm seq 128", "MiniLM-L6",
       {"q": (1, 12, 128, 32), "k": (1, 12, 128, 32), "v": (1, 12, 128, 32)}),
    _c("attention", "bert-base seq 512", "BERT-base",
       {"q": (1, 12, 512, 64), "k": (1, 12, 512, 64), "v": (1, 12, 512, 64)}),
    _c("attention", "llama-7b prefill 512 causal", "Llama-7B",
       {"q": (1, 32, 512, 128), "k": (1, 32, 512, 128), "v": (1, 32, 512, 128)}, causal=True),
    _c("attention", "llama-7b decode kv 4096", "Llama-7B",
       {"q": (1, 32, 1, 128), "k": (1, 32, 4096, 128), "v": (1, 32, 4096, 128)}, quick=True),
    _c("attention", "long seq 2048 causal", "Llama-7B",
       {"q": (1, 12, 2048, 64), "k": (1, 12, 2048, 64), "v": (1, 12, 2048, 64)}, causal=True),
]


def cases(ops=None, quick: bool = False) -> list[Case]:
    """The cases of the given ops (all when None), only the quick set when quick."""
    return [c for c in CASES if (ops is None or c.op in ops) and (c.quick or not quick)]


def by_id(case_id: str) -> Case:
    for c in CASES:
        if c.id == case_id:
            return c
    raise KeyError(case_id)


def _check_unique():
    ids = [c.id for c in CASES]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"duplicate case ids in bench/cases.py: {sorted(dup)}")
    missing = {c.op for c in CASES} - set(SIGNATURES)
    if missing:
        raise ValueError(f"ops with cases but no SIGNATURES entry: {sorted(missing)}")


_check_unique()
