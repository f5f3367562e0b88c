"""Benchmark cases of the norm ops (model-derived shapes; see bench/cases/__init__.py)."""
from . import case as _c

CASES = [
    _c("layer_norm", "bert-base", "BERT-base", {"x": (128, 768), "weight": (768,), "bias": (768,)}, quick=True),
    _c("layer_norm", "minilm", "MiniLM-L6", {"x": (128, 384), "weight": (384,), "bias": (384,)}),
    _c("layer_norm", "bert-base batch 32", "BERT-base", {"x": (32 * 128, 768), "weight": (768,), "bias": (768,)}),
    _c("rms_norm", "llama-7b prefill 512", "Llama-7B", {"x": (512, 4096), "weight": (4096,)}, quick=True),
    _c("rms_norm", "llama-7b decode", "Llama-7B", {"x": (1, 4096), "weight": (4096,)}),
    # a bfloat16 model's norms (x, weight and bias bfloat16; PyTorch's bfloat16 layer_norm / rms_norm)
    _c("layer_norm", "bert-base bfloat16", "BERT-base", {"x": (128, 768), "weight": (768,), "bias": (768,)},
       activations="bfloat16"),
    _c("rms_norm", "llama-7b prefill 512 bfloat16", "Llama-7B", {"x": (512, 4096), "weight": (4096,)},
       activations="bfloat16"),
    # a float16 model's (PyTorch's float16 rms_norm on the CPU)
    _c("rms_norm", "llama-7b prefill 512 float16", "Llama-7B", {"x": (512, 4096), "weight": (4096,)},
       activations="float16"),
]
