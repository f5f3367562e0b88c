"""Benchmark cases of the softmax ops (model-derived shapes; see bench/cases/__init__.py)."""
from . import case as _c, GPT2_VOCAB

CASES = [
    _c("softmax", "bert-base attn scores", "BERT-base", {"x": (1, 12, 128, 128)}, quick=True),
    _c("softmax", "gpt-2 vocab 128", "GPT-2", {"x": (128, GPT2_VOCAB)}, quick=True),
    _c("softmax", "gpt-2 vocab 1024", "GPT-2", {"x": (1024, GPT2_VOCAB)}),
    _c("softmax", "llama-7b attn scores 512", "Llama-7B", {"x": (1, 32, 512, 512)}),
    _c("log_softmax", "gpt-2 vocab 128", "GPT-2", {"x": (128, GPT2_VOCAB)}, quick=True),
    _c("log_softmax", "gpt-2 vocab 1024", "GPT-2", {"x": (1024, GPT2_VOCAB)}),
    _c("cross_entropy", "gpt-2 lm loss 128", "GPT-2", {"logits": (128, GPT2_VOCAB)}, quick=True),
    _c("cross_entropy", "gpt-2 lm loss 1024", "GPT-2", {"logits": (1024, GPT2_VOCAB)}),
    # a bfloat16 model's attention scores (PyTorch's bfloat16 softmax)
    _c("softmax", "bert-base attn scores bfloat16", "BERT-base", {"x": (1, 12, 128, 128)}, activations="bfloat16"),
    _c("softmax", "bert-base attn scores float16", "BERT-base", {"x": (1, 12, 128, 128)}, activations="float16"),
]
