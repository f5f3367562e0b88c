"""Benchmark cases of selective_scan / selective_state_update (model-derived shapes; see
bench/cases/__init__.py).

Mamba-130M (d_model 768) and Mamba-1.4B (d_model 2048) expand to d_inner 1536 and 4096
channels with d_state N = 16 and one group of B and C, called as Mamba's forward calls
mamba-ssm: D, z (the gate), delta_bias (dt_proj's bias) and delta_softplus=True.  Prefill
of 1024 tokens at batch 1 (plus a 128-token one, the quick case), and one decode step at
batch 1 and 16."""
from . import case as _c


def _prefill(d, L, n=16):
    return {"u": (1, d, L), "delta": (1, d, L), "A": (d, n), "B": (1, n, L), "C": (1, n, L), "D": (d,),
            "z": (1, d, L), "delta_bias": (d,)}


def _step(b, d, n=16):
    return {"state": (b, d, n), "x": (b, d), "dt": (b, d), "A": (d, n), "B": (b, n), "C": (b, n), "D": (d,),
            "z": (b, d), "dt_bias": (d,)}


CASES = [
    _c("selective_scan", "mamba-130m prefill dim 1536 L 128", "Mamba-130M", _prefill(1536, 128), quick=True,
       delta_softplus=True),
    _c("selective_scan", "mamba-130m prefill dim 1536 L 1024", "Mamba-130M", _prefill(1536, 1024),
       delta_softplus=True),
    _c("selective_scan", "mamba-1.4b prefill dim 4096 L 1024", "Mamba-1.4B", _prefill(4096, 1024),
       delta_softplus=True),
    _c("selective_state_update", "mamba-130m decode batch 1", "Mamba-130M", _step(1, 1536), quick=True,
       dt_softplus=True),
    _c("selective_state_update", "mamba-130m decode batch 16", "Mamba-130M", _step(16, 1536), dt_softplus=True),
    _c("selective_state_update", "mamba-1.4b decode batch 1", "Mamba-1.4B", _step(1, 4096), dt_softplus=True),
    _c("selective_state_update", "mamba-1.4b decode batch 16", "Mamba-1.4B", _step(16, 4096), dt_softplus=True),
]
