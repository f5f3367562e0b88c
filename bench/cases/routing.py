"""Benchmark cases of topk_softmax (model-derived shapes; see bench/cases/__init__.py).

Mixtral-8x7B's router: 8 experts, top-2, renormalized; one decode token, a batch of 64
tokens and a 4096-token prefill.  DeepSeek-V2-Lite (64 routed experts) and DeepSeek-V2
(160), top-6 of the softmax without renormalization (norm_topk_prob false)."""
from . import case as _c

CASES = [
    _c("topk_softmax", "mixtral decode T 1 E 8 k 2", "Mixtral-8x7B", {"logits": (1, 8)}, quick=True, k=2),
    _c("topk_softmax", "mixtral T 64 E 8 k 2", "Mixtral-8x7B", {"logits": (64, 8)}, k=2),
    _c("topk_softmax", "mixtral prefill T 4096 E 8 k 2", "Mixtral-8x7B", {"logits": (4096, 8)}, quick=True, k=2),
    _c("topk_softmax", "deepseek-v2-lite T 64 E 64 k 6", "DeepSeek-V2-Lite", {"logits": (64, 64)}, k=6,
       renormalize=False),
    _c("topk_softmax", "deepseek-v2 prefill T 4096 E 160 k 6", "DeepSeek-V2", {"logits": (4096, 160)}, k=6,
       renormalize=False),
]
