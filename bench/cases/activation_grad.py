"""Benchmark cases of the activation backward ops: the forwards' shapes (bench/cases/activation.py),
grad_out of the output's shape."""
from . import case as _c


def _u(shape):
    return {"grad_out": shape, "x": shape}


def _g(shape):
    return {"grad_out": shape, "gate": shape, "up": shape}


CASES = [
    _c("relu_backward", "bert-base ffn", "BERT-base", _u((128, 3072)), quick=True),
    _c("silu_backward", "llama-7b ffn prefill 128", "Llama-7B", _u((128, 11008)), quick=True),
    _c("silu_backward", "llama-7b ffn prefill 512", "Llama-7B", _u((512, 11008))),
    _c("gelu_backward", "bert-base ffn", "BERT-base", _u((128, 3072)), quick=True),
    _c("gelu_backward", "bert-base ffn tanh", "BERT-base", _u((128, 3072)), approximate="tanh"),
    _c("gelu_backward", "minilm ffn", "MiniLM-L6", _u((128, 1536))),
    _c("swiglu_backward", "llama-7b ffn prefill 128", "Llama-7B", _g((128, 11008)), quick=True),
    _c("swiglu_backward", "llama-7b ffn prefill 512", "Llama-7B", _g((512, 11008))),
    _c("swiglu_backward", "llama-7b ffn decode", "Llama-7B", _g((1, 11008))),
    _c("geglu_backward", "bert-base-sized ffn", "BERT-base", _g((128, 3072)), quick=True),
]
