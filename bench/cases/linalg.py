"""Benchmark cases of the linalg ops (model-derived shapes; see bench/cases/__init__.py)."""
from . import case as _c

CASES = [
    _c("matmul", "bert-base qkv proj", "BERT-base", {"a": (128, 768), "b": (768, 768)}, quick=True),
    _c("matmul", "llama-7b decode proj", "Llama-7B", {"a": (1, 4096), "b": (4096, 4096)}, quick=True),
    _c("matmul", "llama-7b prefill 128 proj", "Llama-7B", {"a": (128, 4096), "b": (4096, 4096)}),
    _c("matmul", "llama-7b prefill 512 proj", "Llama-7B", {"a": (512, 4096), "b": (4096, 4096)}),
    _c("matmul", "minilm proj", "MiniLM-L6", {"a": (128, 384), "b": (384, 384)}),
    _c("matmul", "square 1024", "GEMM", {"a": (1024, 1024), "b": (1024, 1024)}),
    # 16-bit operands (PyTorch's float16 / bfloat16 matmul on the CPU)
    *(_c("matmul", f"bert-base qkv proj {fmt}", "BERT-base", {"a": (128, 768), "b": (768, 768)}, activations=fmt)
      for fmt in ("float16", "bfloat16")),
    # a float16 decode step: b read as it is by the GEMV (linalg._gemv16)
    _c("matmul", "llama-7b decode proj float16", "Llama-7B", {"a": (1, 4096), "b": (4096, 4096)},
       activations="float16"),
    _c("matmul", "bert-base attention scores bfloat16", "BERT-base", {"a": (12, 128, 64), "b": (12, 64, 128)},
       activations="bfloat16"),
    _c("matmul", "llama-7b prefill 512 proj bfloat16", "Llama-7B", {"a": (512, 4096), "b": (4096, 4096)},
       activations="bfloat16"),
    _c("linear", "bert-base ffn-up +gelu", "BERT-base",
       {"x": (128, 768), "weight": (3072, 768), "bias": (3072,)}, quick=True, activation="gelu"),
    _c("linear", "bert-base ffn-down", "BERT-base", {"x": (128, 3072), "weight": (768, 3072), "bias": (768,)}),
    _c("linear", "minilm ffn-up +gelu", "MiniLM-L6",
       {"x": (128, 384), "weight": (1536, 384), "bias": (1536,)}, activation="gelu"),
    _c("linear", "llama-7b decode gate", "Llama-7B", {"x": (1, 4096), "weight": (11008, 4096)}),
]
