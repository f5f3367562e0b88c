"""Benchmark cases of moe_ffn (model-derived shapes; see bench/cases/__init__.py).

Mixtral-8x7B's sparse MoE block (8 experts, top 2, hidden 4096, expert FFN 14336): one
decode token and a batch of 64 tokens; its weights are 5.6 GB in float32 (not quick).  A
small MoE with Mixtral's routing (hidden 1024, expert FFN 2816; 277 MB of weights) for the
quick runs."""
from . import case as _c


def _moe(t, h, f, e, k):
    return {"x": (t, h), "weights": (t, k), "indices": (t, k), "w_gate": (e, f, h), "w_up": (e, f, h),
            "w_down": (e, h, f)}


CASES = [
    _c("moe_ffn", "small-moe decode T=1", "small MoE (E 8, top 2)", _moe(1, 1024, 2816, 8, 2), quick=True),
    _c("moe_ffn", "small-moe batch T=64", "small MoE (E 8, top 2)", _moe(64, 1024, 2816, 8, 2), quick=True),
    _c("moe_ffn", "mixtral-8x7b decode T=1", "Mixtral-8x7B", _moe(1, 4096, 14336, 8, 2)),
    _c("moe_ffn", "mixtral-8x7b batch T=64", "Mixtral-8x7B", _moe(64, 4096, 14336, 8, 2)),
]
