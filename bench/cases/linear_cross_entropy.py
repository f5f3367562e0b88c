"""Benchmark cases of linear_cross_entropy (see bench/cases/__init__.py): GPT-2's LM head
(hidden 768, vocabulary 50257) over a training batch's tokens.  T = 4096 is the issue's
shape (#13); T = 512 keeps the quick report short; T = 128, the first quick case, is the one
asv's CI smoke run times (NK_ASV_QUICK=1 takes each op's first quick case: the T = 512 rows
took 50 s of that run, 2026-11-28)."""
from . import case as _c, BERT, GPT2_VOCAB

_H = BERT["h"]  # GPT-2 small's hidden size is BERT-base's, 768

CASES = [
    _c("linear_cross_entropy", "gpt-2 lm head 128", "GPT-2",
       {"x": (128, _H), "weight": (GPT2_VOCAB, _H)}, quick=True, memory=True),
    _c("linear_cross_entropy", "gpt-2 lm head 512", "GPT-2",
       {"x": (512, _H), "weight": (GPT2_VOCAB, _H)}, quick=True, memory=True),
    _c("linear_cross_entropy", "gpt-2 lm head 4096", "GPT-2", {"x": (4096, _H), "weight": (GPT2_VOCAB, _H)}, memory=True),
    _c("linear_cross_entropy_with_grad", "gpt-2 lm head 128", "GPT-2",
       {"x": (128, _H), "weight": (GPT2_VOCAB, _H)}, quick=True, memory=True),
    _c("linear_cross_entropy_with_grad", "gpt-2 lm head 512", "GPT-2",
       {"x": (512, _H), "weight": (GPT2_VOCAB, _H)}, quick=True, memory=True),
    _c("linear_cross_entropy_with_grad", "gpt-2 lm head 4096", "GPT-2",
       {"x": (4096, _H), "weight": (GPT2_VOCAB, _H)}, memory=True),
]
