"""Benchmark cases of attention_backward: the forward's training shapes (bench/cases/attention.py;
its decode case is inference only) and the issue's bar, 1x12x512x64 causal.  Inputs: q, k, v,
grad_out drawn, output and lse from dispatch.attention(return_lse=True) (dispatch/ops/attention_grad.py).

Forward + backward, float32 (attention(return_lse=True) + attention_backward vs torch autograd
of F.scaled_dot_product_attention, which runs aten's CPU flash forward and backward),
2026-11-25, this machine kind (2 shared cores, Rocket Lake target, AVX-512) under load average
8-9 from other jobs:
  wall, interleaved medians (bench.timing.interleaved, 11 rounds), 1x12x512x64 causal:
    1 thread  ours 81.2 ms (bwd 57.3) vs torch 110.5 ms (bwd 91.4): 1.36x (an earlier run 54.6 vs 83.2: 1.52x)
    2 threads ours 62.0 ms (bwd 30.7) vs torch 179.2 ms (bwd 93.9): 2.89x
  1-thread CPU time (sees through the load), interleaved medians of 21:
    1x12x512x64 causal    ours 18.7 ms vs torch 25.0 ms: 1.34x (torch's time is the same causal or
                          not: its kernel does not skip the tiles above the diagonal)
    1x32x512x128 causal   ours 88.9 ms vs torch 126.4 ms: 1.42x
    1x12x512x64           ours 29.9 ms vs torch 24.8 ms: 0.83x
    1x12x128x64           ours 2.49 ms vs torch 2.03 ms: 0.82x
    1x12x128x32           ours 1.46 ms vs torch 1.24 ms: 0.85x
  the backward alone runs at 109 GFLOP/s (1x12x512x64, 10 FLOPs x D per pair, one thread, CPU
  time), the forward at 87: without causal skipping the gap to torch is in the GEMM rate.
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
