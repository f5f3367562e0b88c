"""Benchmark cases of the softmax-family backward ops, at the forwards' shapes
(bench/cases/softmax.py; see bench/cases/__init__.py).

Forward + backward against PyTorch 2.13 CPU (issue #13's bar: >= 1.0x), float32, medians of
interleaved rounds (bench.timing.interleaved, 0.2 s pause between libraries), 2026-11-25,
Intel Xeon (AVX-512), 2 cores shared with other jobs (load average 7-12 throughout: the
figures are noisy, spreads 0.1-1.0).  Ours: the forward op into a preallocated y, then the
backward op into a preallocated dx; cross_entropy_with_grad writes into a preallocated
grad_out; "fwd + backward" is dispatch.cross_entropy then cross_entropy_backward (fresh
gradient array).  PyTorch: autograd (x.requires_grad_, forward, .backward) and the aten
forward + aten backward (_softmax_backward_data / _log_softmax_backward_data); its best is
the ratio's denominator.  PyTorch alone in its own process gave the same (CE 514 / 492 ms,
softmax 354 / 346 ms at 2 / 1 threads).

  case (threads)                  ours              PyTorch best       ratio
  cross_entropy 512x50257 (2)     with_grad 61 ms   505 ms (autograd)  8.2x; fwd + backward 159 ms: 3.2x
  cross_entropy 512x50257 (1)     with_grad 90 ms   592 ms             6.6x; fwd + backward 381 ms: 1.6x
  softmax 512x50257 (2 / 1)       111 / 149 ms      320 / 311 ms       2.9x / 2.1x
  log_softmax 512x50257 (2 / 1)   129 / 130 ms      358 / 325 ms       2.8x / 2.5x
  softmax 1x12x128x128 (2 / 1)    0.62 / 0.32 ms    4.58 / 0.60 ms     7.4x / 1.9x
  softmax 1x32x512x512 (2 / 1)    24.6 / 38.7 ms    109 / 110 ms       4.5x / 2.8x
(an earlier 2-thread run, heavier load: CE with_grad 7.7x, fwd + backward 0.94x with a
spread of 0.77 on ours, softmax 2.4x, log_softmax 2.9x, 1x12x128x128 0.76x against a
PyTorch sample spread of 44, 1x32x512x512 4.1x.)
"""
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
