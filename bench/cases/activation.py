"""Benchmark cases of the activation ops (model-derived shapes; see bench/cases/__init__.py)."""
from . import case as _c

CASES = [
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
    # a bfloat16 model's activations (PyTorch's bfloat16 gelu / silu * up)
    _c("gelu", "bert-base ffn bfloat16", "BERT-base", {"x": (128, 3072)}, activations="bfloat16"),
    _c("swiglu", "llama-7b ffn prefill 128 bfloat16", "Llama-7B", {"gate": (128, 11008), "up": (128, 11008)},
       activations="bfloat16"),
    # a float16 model's (PyTorch's float16 silu(gate) * up on the CPU)
    _c("swiglu", "llama-7b ffn prefill 128 float16", "Llama-7B", {"gate": (128, 11008), "up": (128, 11008)},
       activations="float16"),
]
