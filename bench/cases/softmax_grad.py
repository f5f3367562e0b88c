"""Benchmark cases of the softmax-family backward ops, at the forwards' shapes
(bench/cases/softmax.py; see bench/cases/__init__.py)."""
from . import case as _c, GPT2_VOCAB

CASES = [
    _c("softmax_backward", "bert-base attn scores", "BERT-base",
       {"grad_out": (1, 12, 128, 128), "y": (1, 12, 128, 128)}, quick=True),
    _c("softmax_backward", "gpt-2 vocab 128", "GPT-2", {"grad_out": (128, GPT2_VOCAB), "y": (128, GPT2_VOCAB)}),
    _c("softmax_backward", "llama-7b attn scores 512", "Llama-7B",
       {"grad_out": (1, 32, 512, 512), "y": (1, 32, 512, 512)}),
    _c("log_softmax_backward", "gpt-2 vocab 128", "GPT-2", {"grad_out": (128, GPT2_VOCAB), "y": (128, GPT2_VOCAB)},
       quick=True),
    _c("log_softmax_backward", "gpt-2 vocab 1024", "GPT-2",
       {"grad_out": (1024, GPT2_VOCAB), "y": (1024, GPT2_VOCAB)}),
    _c("cross_entropy_with_grad", "gpt-2 lm loss 128", "GPT-2", {"logits": (128, GPT2_VOCAB)}, quick=True),
    _c("cross_entropy_with_grad", "gpt-2 lm loss 512", "GPT-2", {"logits": (512, GPT2_VOCAB)}),
    _c("cross_entropy_backward", "gpt-2 lm loss 128", "GPT-2", {"grad_loss": (), "logits": (128, GPT2_VOCAB)},
       quick=True),
    _c("cross_entropy_backward", "gpt-2 lm loss 512", "GPT-2", {"grad_loss": (), "logits": (512, GPT2_VOCAB)}),
]
