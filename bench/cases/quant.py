"""Benchmark cases of quantize / dequantize (model-derived shapes; see bench/cases/__init__.py).

Weights: per-output-channel symmetric int8 of a Llama-7B MLP projection (11008, 4096) (axis
0: one scale per output row of the (N, K) linear weight, as weight-only int8 schemes store
it).  Activations: per-token (axis 0, one scale per row) symmetric int8 of BERT-base hidden
states, one sequence (128, 768) and a batch of 32 (4096, 768), and onnxruntime's dynamic
quantization of an activation (DynamicQuantizeLinear: uint8, asymmetric, one scale).
dequantize: the same tensors back to float32 (scales of the same layouts)."""
import dataclasses

from . import BERT, LLAMA
from . import case as _c

_W = (LLAMA["ffn"], LLAMA["h"])
_A1 = (BERT["seq"], BERT["h"])
_A32 = (32 * BERT["seq"], BERT["h"])


def _round_trip(case, data):
    """dequantize(quantize(x)) with the case's scheme against x itself (bench/accuracy.py):
    what quantizing this tensor costs."""
    import dispatch
    args, kwargs = case.call_args({**data, **case.params})
    return dispatch.dequantize(dispatch.quantize(*args, **kwargs)), data["x"]


CASES = [
    _c("quantize", "llama-7b mlp weight per-channel int8", "Llama-7B", {"x": _W}, axis=0),
    _c("quantize", "bert-base activations per-row int8", "BERT-base", {"x": _A1}, quick=True, axis=0),
    _c("quantize", "bert-base x32 activations per-row int8", "BERT-base", {"x": _A32}, axis=0),
    _c("quantize", "bert-base activations dynamic uint8", "BERT-base", {"x": _A1}, quick=True, qtype="uint8",
       symmetric=False),
    _c("quantize", "bert-base x32 activations dynamic uint8", "BERT-base", {"x": _A32}, qtype="uint8",
       symmetric=False),
    _c("dequantize", "llama-7b mlp weight per-channel int8", "Llama-7B", {"values": _W, "scale": (_W[0],)},
       axis=0),
    _c("dequantize", "bert-base activations per-row int8", "BERT-base", {"values": _A1, "scale": (_A1[0],)},
       quick=True, axis=0),
    _c("dequantize", "bert-base x32 activations per-row int8", "BERT-base",
       {"values": _A32, "scale": (_A32[0],)}, axis=0),
    _c("dequantize", "bert-base activations dynamic uint8", "BERT-base",
       {"values": _A1, "scale": (), "zero_point": ()}, qtype="uint8"),
]
# quantize cases report the round trip's accuracy cost beside their times (dequantize's
# is the same tensors' and is not repeated)
CASES = [dataclasses.replace(c, accuracy=_round_trip) if c.op == "quantize" else c for c in CASES]
