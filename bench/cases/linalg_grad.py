"""Benchmark cases of the matmul / linear backward ops: the forwards' shapes
(bench/cases/linalg.py), grad_out and pre of the output's shape, has_bias where the forward
has a bias.

Forward + backward, BERT-base FFN-up 128x768 -> 3072 + bias + gelu, float32 (issue #13's bar:
>= 0.9x PyTorch); ours = dispatch.linear (GEMM + bias epilogue, keeps pre) + dispatch.gelu +
dispatch.linear_backward, PyTorch 2.x = autograd.grad of F.gelu(F.linear(x, w, b)).  Sapphire
Rapids host, 2 cores shared with other jobs (load average 5-10), 2026-11-25:
  one thread, CPU time (process_time over 3 calls, 15 interleaved rounds, median), two runs:
    ours 21.7 / 18.6 ms, PyTorch 15.7 / 13.5 ms: 0.72x both times (bar NOT met).
    Split: our forward GEMM + bias ~5-6.5 ms (PyTorch's 4.0-5.3), gelu pass ~1 ms, backward
    dx 6.4 ms + dweight/dbias 5.2 ms; PyTorch's MKL products alone: dx 4.1, dweight 4.6 ms;
    OpenBLAS 5.7 / 4.7.  Of our dx, packing W (9.4 MB) takes 1.07 ms.
  two threads, wall clock (bench.timing.interleaved, 11 rounds, 0.2 s between libraries):
    load ~10: ours 105 ms, PyTorch 249 ms (2.4x), unfused ours 353 ms;
    load ~5:  ours 35.4 ms, PyTorch 45.3 ms (1.28x) by medians; minimums 21.0 vs 18.8 (0.89x).
    (numba's GEMM takes its tasks from a counter and tolerates a lost core; MKL's / OpenBLAS's
    spinning threads do not: on a loaded host the medians favour ours, the minimums - the
    nearest to a quiet host - give ~0.9x.)
  the prologue's own cost (CPU time, one thread, each GEMM with and without it): dx 6.4 vs
    6.6 ms plain, dweight + dbias 5.15 vs 4.79 ms plain (gelu); the unfused gelu_backward
    pass it replaces costs 1.26 ms plus writing and re-reading the (128, 3072) g'.
So the fusion does its part (under 0.5 ms of a ~12 ms backward); the gap to the bar on one
thread is the GEMM core at M = 128 (0.7-0.8x MKL's, forward included).
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
    # a weight that does not fit the L2s (64 MiB): the backward GEMMs' B packed in their tasks
    _c("linear_backward", "llama-7b prefill 128 proj", "Llama-7B", _lin(128, 4096, 4096)),
    _c("matmul_backward", "bert-base qkv proj", "BERT-base", _mm((128, 768), (768, 768)), quick=True),
    _c("matmul_backward", "minilm proj", "MiniLM-L6", _mm((128, 384), (384, 384))),
]
