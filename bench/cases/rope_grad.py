"""Benchmark cases of rope_backward: rope's shapes (bench/cases/rope.py), grad_out of x's shape."""
from . import case as _c

CASES = [
    _c("rope_backward", "llama-7b prefill 512", "Llama-7B", {"grad_out": (1, 32, 512, 128)}, quick=True),
    _c("rope_backward", "llama-7b decode", "Llama-7B", {"grad_out": (1, 32, 1, 128)}),
]
