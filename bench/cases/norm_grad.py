"""Benchmark cases of the norm backward ops, at the forward's shapes (bench/cases/norm.py)."""
from . import case as _c


def _ln(x, d):
    return {"grad_out": x, "x": x, "weight": (d,), "bias": (d,)}


CASES = [
    _c("layer_norm_backward", "bert-base", "BERT-base", _ln((128, 768), 768), quick=True),
    _c("layer_norm_backward", "minilm", "MiniLM-L6", _ln((128, 384), 384)),
    _c("layer_norm_backward", "bert-base batch 32", "BERT-base", _ln((32 * 128, 768), 768)),
    _c("rms_norm_backward", "llama-7b prefill 512", "Llama-7B",
       {"grad_out": (512, 4096), "x": (512, 4096), "weight": (4096,)}, quick=True),
    _c("rms_norm_backward", "llama-7b decode", "Llama-7B", {"grad_out": (1, 4096), "x": (1, 4096), "weight": (4096,)}),
]
