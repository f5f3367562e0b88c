"""Benchmark cases of the attention ops (model-derived shapes; see bench/cases/__init__.py)."""
from . import case as _c

CASES = [
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
    # a bfloat16 model's attention (PyTorch's bfloat16 scaled_dot_product_attention)
    _c("attention", "llama-7b prefill 512 causal bfloat16", "Llama-7B",
       {"q": (1, 32, 512, 128), "k": (1, 32, 512, 128), "v": (1, 32, 512, 128)}, causal=True,
       activations="bfloat16"),
    _c("attention", "llama-7b prefill 512 causal float16", "Llama-7B",
       {"q": (1, 32, 512, 128), "k": (1, 32, 512, 128), "v": (1, 32, 512, 128)}, causal=True,
       activations="float16"),
    # a decode step against a 16-bit KV cache (split-KV reads it as it is)
    _c("attention", "llama-7b decode kv 4096 bfloat16", "Llama-7B",
       {"q": (1, 32, 1, 128), "k": (1, 32, 4096, 128), "v": (1, 32, 4096, 128)}, activations="bfloat16"),
    _c("attention", "llama-7b decode kv 4096 float16", "Llama-7B",
       {"q": (1, 32, 1, 128), "k": (1, 32, 4096, 128), "v": (1, 32, 4096, 128)}, activations="float16"),
]
