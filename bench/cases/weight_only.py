"""Benchmark cases of linear with a low-precision weight (dispatch/ops/weight_only.py): the
Llama-7B projections at decode (one token: bound by reading the weight) and a 128-token
prefill (compute bound: the weight widened block by block, then the dense GEMM).  The
weight is drawn in float32 and stored as the case's weight_format by linear's synthesizer;
each case's accuracy probe compares the low-precision call with the float32 linear on the
same float32 data (bench/accuracy.py: normal and normal with outliers)."""
import numpy as np

from . import LLAMA
from . import case as _c


def _probe(fmt):
    def probe(case, data):
        import dispatch
        from dispatch.ops.weight_only import low_precision_weight

        x, w = data["x"], data["weight"] / np.float32(np.sqrt(data["weight"].shape[1]))
        return dispatch.linear(x, low_precision_weight(w, fmt)), dispatch.linear(x, w)
    return probe


_H, _F = LLAMA["h"], LLAMA["ffn"]
CASES = [
    _c("linear", f"llama-7b decode gate {fmt}", "Llama-7B", {"x": (1, _H), "weight": (_F, _H)},
       accuracy=_probe(fmt), weight_format=fmt)
    for fmt in ("bfloat16", "float16", "int8")
] + [
    _c("linear", "llama-7b decode down int8", "Llama-7B", {"x": (1, _F), "weight": (_H, _F)},
       accuracy=_probe("int8"), weight_format="int8"),
    _c("linear", "llama-7b prefill 128 gate bfloat16", "Llama-7B", {"x": (128, _H), "weight": (_F, _H)},
       accuracy=_probe("bfloat16"), weight_format="bfloat16"),
]
