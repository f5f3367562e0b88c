"""Benchmark cases of the int8 GEMM ops (see bench/cases/__init__.py): BERT-base's projections
quantized (the 128 x 768 x 768 attention projection is issue #12's bar against onnxruntime's
prepacked u8s8 MatMulInteger / DynamicQuantizeMatMul), its FFN-up with a fused GELU, one
decode token, and a Llama-7B decode projection (a 16 MiB int8 weight streamed once)."""
import dataclasses

from . import BERT, LLAMA
from . import case as _c

_H, _F, _S = BERT["h"], BERT["ffn"], BERT["seq"]


def _vs_fp32_matmul(case, data):
    """matmul_int8 of a quantized per row (symmetric int8) and b per column against the
    float32 matmul of the same data (bench/accuracy.py)."""
    import dispatch
    a_q = dispatch.quantize(data["a_q"], axis=0)
    b_q = dispatch.quantize(data["b_q"], axis=1)
    kw = dict(bias=data.get("bias"), activation=case.params.get("activation"))
    return dispatch.matmul_int8(a_q, b_q, **kw), dispatch.matmul(data["a_q"], data["b_q"], **kw)


def _vs_fp32_linear(case, data):
    """dynamic_quant_linear with the weight quantized per output channel (symmetric int8)
    against the float32 linear of the same data."""
    import dispatch
    w_q = dispatch.quantize(data["w_q"], axis=0)
    act = case.params.get("activation")
    return (dispatch.dynamic_quant_linear(data["x"], w_q, data.get("bias"), activation=act),
            dispatch.linear(data["x"], data["w_q"], data.get("bias"), activation=act))


CASES = [
    _c("matmul_int8", "bert-base proj", "BERT-base", {"a_q": (_S, _H), "b_q": (_H, _H)}, quick=True),
    _c("matmul_int8", "bert-base ffn-up + bias + gelu", "BERT-base", {"a_q": (_S, _H), "b_q": (_H, _F), "bias": (_F,)},
       activation="gelu"),
    _c("matmul_int8", "decode 1 token proj", "BERT-base", {"a_q": (1, _H), "b_q": (_H, _H)}),
    _c("dynamic_quant_linear", "bert-base proj", "BERT-base", {"x": (_S, _H), "w_q": (_H, _H), "bias": (_H,)},
       quick=True),
    _c("dynamic_quant_linear", "bert-base ffn-up + gelu_tanh", "BERT-base",
       {"x": (_S, _H), "w_q": (_F, _H), "bias": (_F,)}, activation="gelu_tanh"),
    _c("dynamic_quant_linear", "llama-7b decode q-proj", "Llama-7B",
       {"x": (1, LLAMA["h"]), "w_q": (LLAMA["h"], LLAMA["h"])}),
]
# every case reports its accuracy cost against the float32 op beside its times
_PROBES = {"matmul_int8": _vs_fp32_matmul, "dynamic_quant_linear": _vs_fp32_linear}
CASES = [dataclasses.replace(c, accuracy=_PROBES[c.op]) for c in CASES]
