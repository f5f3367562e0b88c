"""Benchmark cases of the matmul / linear backward ops: the forwards' shapes
(bench/cases/linalg.py), grad_out and pre of the output's shape, has_bias where the forward
has a bias.

Forward + backward, BERT-base FFN-up 128x768 -> 3072 + bias + gelu, float32 (issue #13's bar:
>= 0.9x PyTorch); ours = dispatch.linear (GEMM + bias epilogue, keeps pre) + dispatch.gelu +
dispatch.linear_backward, PyTorch = autograd.grad of F.gelu(F.linear(x, w, b)).  Sapphire
Rapids host (2 cores shared with other jobs, load average 6-9), 2026-11-25:
  one thread, CPU time (process_time over 3 calls, 15 interleaved rounds, median):
    ours 21.7 ms, PyTorch 15.7 ms: 0.72x.  Split: our forward GEMM + bias ~6.5 ms, gelu pass
    ~1 ms, backward dx 6.4 ms + dweight/dbias 5.7 ms; PyTorch's MKL products: dx 4.1 ms,
    dweight 4.6 ms (one thread); OpenBLAS 5.7 / 4.7.
  the prologue's own cost (CPU time, one thread, the GEMM alone with and without it): dx
  6.4 vs 6.6 ms plain, dweight + dbias 5.7 vs 4.9 ms plain (gelu); the unfused gelu_backward
  pass it replaces: 1.26 ms + writing / re-reading the (128, 3072) g'.
So the fusion works (the derivative costs < 1 ms of the 12 ms backward where the separate
pass cost more than 1.3 ms), and the gap to the bar is the GEMM core: at M = 128 our GEMM runs
at 0.7-0.8x MKL's on these shapes (forward included).  Wall-clock figures at 2 threads on this
loaded host (interleaved medians) are in the final report of the commit that added them.
"""
from . import case as _c


def _lin(m, k, n):
    return {"grad_out": (m, n), "x": (m, k), "weight": (n, k), "pre": (m, n)}


def _mm(a, b):
    out = a[:-1] + b[-1:]
    return {"grad_out": out, "a": a, "b": b, "pre": out}


CASES = [
    _c("linear_backward", "bert-base ffn-up +gelu", "BERT-base", _lin(128, 768, 3072), quick=True,
       activation="gelu", has_bias=True),
    _c("linear_backward", "bert-base ffn-down", "BERT-base", _lin(128, 3072, 768), has_bias=True),
    _c("linear_backward", "minilm ffn-up +gelu", "MiniLM-L6", _lin(128, 384, 1536), activation="gelu",
       has_bias=True),
    _c("matmul_backward", "bert-base qkv proj", "BERT-base", _mm((128, 768), (768, 768)), quick=True),
    _c("matmul_backward", "minilm proj", "MiniLM-L6", _mm((128, 384), (384, 384))),
]
