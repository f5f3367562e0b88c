"""Benchmark cases of the int8 GEMM ops (see bench/cases/__init__.py): BERT-base's projections
quantized (the 128 x 768 x 768 attention projection is issue #12's bar against onnxruntime's
prepacked u8s8 MatMulInteger / DynamicQuantizeMatMul), its FFN-up with a fused GELU, one
decode token, and a Llama-7B decode projection (a 16 MiB int8 weight streamed once)."""
from . import BERT, LLAMA
from . import case as _c

_H, _F, _S = BERT["h"], BERT["ffn"], BERT["seq"]

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
