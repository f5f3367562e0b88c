"""Benchmark cases of causal_conv1d / causal_conv1d_update (model-derived shapes; see
bench/cases/__init__.py).

Mamba-130M (d_model 768) and Mamba-1.4B (d_model 2048) expand to d_inner 1536 and 4096
channels, each convolved by a width-4 depthwise causal conv1d with bias, then SiLU: a
1024-token prefill at batch 1, and one decode step at batch 1 and 16 against mamba-ssm's
conv_state of d_conv = 4 values per channel."""
from . import case as _c


def _prefill(d):
    return {"x": (1, d, 1024), "weight": (d, 4), "bias": (d,)}


def _step(b, d):
    return {"conv_state": (b, d, 4), "x": (b, d), "weight": (d, 4), "bias": (d,)}


CASES = [
    _c("causal_conv1d", "mamba-130m prefill dim 1536 L 1024", "Mamba-130M", _prefill(1536), quick=True,
       activation="silu"),
    _c("causal_conv1d", "mamba-1.4b prefill dim 4096 L 1024", "Mamba-1.4B", _prefill(4096), activation="silu"),
    _c("causal_conv1d_update", "mamba-130m decode batch 1", "Mamba-130M", _step(1, 1536), quick=True,
       activation="silu"),
    _c("causal_conv1d_update", "mamba-1.4b decode batch 1", "Mamba-1.4B", _step(1, 4096), activation="silu"),
    _c("causal_conv1d_update", "mamba-1.4b decode batch 16", "Mamba-1.4B", _step(16, 4096), activation="silu"),
]
