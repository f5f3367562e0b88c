"""Benchmark cases of attention_backward: the forward's training shapes (bench/cases/attention.py;
its decode case is inference only) and the issue's bar, 1x12x512x64 causal.  Inputs: q, k, v,
grad_out drawn, out and lse from dispatch.attention(return_lse=True) (dispatch/ops/attention_grad.py).

Forward + backward at the bar shape, float32 (attention(return_lse=True) + attention_backward
vs torch autograd of F.scaled_dot_product_attention, which runs aten's CPU flash forward and
backward), interleaved medians (bench.timing.interleaved, 7 rounds), 2026-11-25, this machine
kind (2 shared cores) under load average ~9 from other jobs, so absolute times are inflated:
  1 thread:  ours 54.6 ms (fwd 18.5, bwd 40.3) vs torch 83.2 ms (fwd 24.0): 1.52x
"""
from . import case as _c

CASES = [
    _c("attention_backward", "gpt-2 seq 512 causal", "GPT-2 small",
       {"q": (1, 12, 512, 64), "k": (1, 12, 512, 64)}, causal=True, quick=True),
    _c("attention_backward", "bert-base seq 128", "BERT-base", {"q": (1, 12, 128, 64), "k": (1, 12, 128, 64)}),
    _c("attention_backward", "minilm seq 128", "MiniLM-L6", {"q": (1, 12, 128, 32), "k": (1, 12, 128, 32)}),
    _c("attention_backward", "bert-base seq 512", "BERT-base", {"q": (1, 12, 512, 64), "k": (1, 12, 512, 64)}),
    _c("attention_backward", "llama-7b prefill 512 causal", "Llama-7B",
       {"q": (1, 32, 512, 128), "k": (1, 32, 512, 128)}, causal=True),
]
