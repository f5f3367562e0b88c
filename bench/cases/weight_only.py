"""Benchmark cases of linear with a low-precision weight (dispatch/ops/weight_only.py): the
Llama-7B projections at decode (one token: bound by reading the weight) and a 128-token
prefill (compute bound: the weight widened block by block, then the dense GEMM).  The
weight is drawn in float32 and stored as the case's weight_format by linear's synthesizer;
each case's accuracy probe compares the low-precision call with the float32 linear on the
same float32 data (bench/accuracy.py: normal and normal with outliers).

Measured 2026-11-25 on the Xeon host (AVX-512, 2 cores shared with other jobs; every weight
cycled through >= 1.2 GB of copies so that none is served from the 480 MiB L3),
`python -m bench.peer_ops.weight_only --rounds 11`, interleaved medians, M = 1, K = 4096,
N = 11008, in the quietest run (load average 1.1; copy bandwidth 25.2 GB/s read + write):
  float32 (dense: OpenBLAS sgemv, 29.6 GB/s of weight) 6.10 ms; bfloat16 3.50 ms (1.74x);
  float16 3.31 ms (1.84x); int8 per channel 1.89 ms (3.23x); against bytes / copy bandwidth
  0.98 / 0.92 / 1.06x; against a prange sum over the same bytes 1.34 / 1.27 / 1.44x;
  PyTorch bf16 F.linear 4.20 ms, numpy convert + matmul 56 / 82 / 701 ms.
  The run before it (same load, no peers): 7.74 / 3.66 (2.12x) / 3.52 (2.20x) / 2.11 ms
  (3.66x).  Under load (copy 9.7-18 GB/s) bfloat16 was 0.9-1.9x and int8 2.0-3.8x float32:
  other jobs' memory traffic moves every figure by up to 2x between runs.
M = 128 (cpu-wo-gemm: blocks of 2^21 weight elements widened, then the own GEMM), quiet run
(load 0.8-1.4), 7 rounds: float32 weight (dense rule: OpenBLAS) 49.9 ms; bfloat16 69.8 ms
(0.72x), float16 67.9 (0.73x), int8 67.9 (0.73x).  Beside it (7 rounds): the bf16 blocks
through the own GEMM 70.0 ms, through OpenBLAS 66.1; dense float32 OpenBLAS 51.1, own
cpu-gemm 73.8: the weight-only GEMM runs at the own GEMM's speed, OpenBLAS's is faster."""
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


def _probe_half_activations(case, data):
    """16-bit x, weight and bias (bfloat16 / float16, as the case's synthesis rounds them)
    against the float32 linear of the float32 data."""
    import dispatch
    from dispatch.ops.weight_only import low_precision_weight

    x, w, b = data["x"], data["weight"] / np.float32(np.sqrt(data["weight"].shape[1])), data.get("bias")
    act, fmt = case.params.get("activation"), case.params["activations"]
    low = dispatch.linear(*(low_precision_weight(v, fmt) if v is not None else None for v in (x, w, b)),
                          activation=act)
    return np.asarray(low, np.float32), dispatch.linear(x, w, b, activation=act)


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
    # the GEMM path of an int8 weight: its tasks dequantize their own panels (pack_bq8)
    _c("linear", "llama-7b prefill 128 gate int8", "Llama-7B", {"x": (128, _H), "weight": (_F, _H)},
       accuracy=_probe("int8"), weight_format="int8"),
    # bfloat16 activations too (PyTorch's bfloat16 linear: cpu-bf16-amx, AMX tiles, on hosts
    # with AMX-BF16; cpu-bf16-dot, vdpbf16ps, on hosts with AVX-512 BF16); the accuracy
    # columns: against the float32 linear of the float32 data
    _c("linear", "llama-7b prefill 128 gate bfloat16 activations", "Llama-7B",
       {"x": (128, _H), "weight": (_F, _H)}, accuracy=_probe_half_activations, weight_format="bfloat16",
       activations="bfloat16"),
    _c("linear", "llama-7b decode batch 16 gate bfloat16 activations", "Llama-7B",
       {"x": (16, _H), "weight": (_F, _H)}, accuracy=_probe_half_activations, weight_format="bfloat16",
       activations="bfloat16"),
    _c("linear", "bert-base ffn-up +gelu bfloat16 activations", "BERT-base",
       {"x": (128, 768), "weight": (3072, 768), "bias": (3072,)}, accuracy=_probe_half_activations,
       weight_format="bfloat16", activations="bfloat16", activation="gelu"),
    # float16 activations (PyTorch's float16 linear): x widened, the weight-only kernels
    _c("linear", "bert-base ffn-up +gelu float16 activations", "BERT-base",
       {"x": (128, 768), "weight": (3072, 768), "bias": (3072,)}, accuracy=_probe_half_activations,
       weight_format="float16", activations="float16", activation="gelu"),
]
