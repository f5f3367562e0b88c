"""Benchmark cases of the rope ops (model-derived shapes; see bench/cases/__init__.py)."""
from . import case as _c

CASES = [
    _c("rope", "llama-7b prefill 512", "Llama-7B", {"x": (1, 32, 512, 128)}, quick=True),
    _c("rope", "llama-7b decode", "Llama-7B", {"x": (1, 32, 1, 128)}),
    # a bfloat16 model's queries (x and tables bfloat16)
    _c("rope", "llama-7b prefill 512 bfloat16", "Llama-7B", {"x": (1, 32, 512, 128)}, activations="bfloat16"),
    _c("rope", "llama-7b prefill 512 float16", "Llama-7B", {"x": (1, 32, 512, 128)}, activations="float16"),
]
