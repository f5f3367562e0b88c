"""Backward of softmax / log_softmax and the cross-entropy gradient on the GPU.

softmax / log_softmax backward (the forward's three layouts, kernels_cuda/softmax.py):
- warp_rows: one warp per row; pass 1 sums g * y (log: g) per lane, merged by shuffles;
  pass 2 writes y * (g - s) (log: g - exp(y) * s).
- block_rows: one block per row (grid-stride over rows), the sum merged by shuffles and 32
  shared slots; long rows (vocabularies).
- columns: reduction along a non-last axis of (outer, n, inner): one thread per column.

cross-entropy with its gradient:
- ce_check: one block counts the targets that are not ignore_index (the "mean" divisor)
  and records the smallest row with an out-of-range target (atomic min); the host reads
  that back and raises before anything is written (the gradient may overwrite logits).
- ce_grad_warp_rows / ce_grad_block_rows: pass 1 an online (max, sum of exp) per lane,
  merged across the warp / block; pass 2 writes (exp(x - max) / sum - [j == t]) * scale.
  The loss is formed by the thread that owns column t in pass 2, from the x_t it reads
  there before writing the gradient over it: with grad = logits no other thread reads an
  element another writes.  Ignored rows write zeros.
- the losses are summed by kernels_cuda/softmax.py's one-block cross_entropy_reduce.
Sums in the accumulation type (float32 for float32 / float16, float64 for float64).
"""
import math
from functools import lru_cache

import numpy as np
from numba import cuda, types

from ._jit import BLOCK_ROWS_MAX_THREADS, WARP_ROWS_THREADS, PtxBuild, acc_np, acc_of, acc_type, arr, device, kernel
from .primitives import block_max_sumexp, block_sum, warp_max_sumexp, warp_sum
from .softmax import _helpers

CHECK_THREADS = 256
# Largest block of the cross-entropy gradient's block-per-row kernel: at 1024 threads (64
# registers a thread) its float64 build spilled 16 bytes on sm_90 (python -m bench.ptx,
# 2026-11-25); at 512 none spills.  dispatch/cuda_impls/softmax_grad.py launches at most this.
CE_BLOCK_MAX_THREADS = 512


@lru_cache(maxsize=None)
def _dx(acc_np):
    acc, _ = acc_of(acc_np)

    @device
    def term(g, y, log):
        """What pass 1 sums for one element."""
        return g if log else g * y

    @device
    def dx(g, y, s, log):
        return g - math.exp(y) * s if log else y * (g - s)

    return acc, term, dx


@lru_cache(maxsize=None)
def warp_rows(acc_np):
    acc, term, dx = _dx(acc_np)
    zero = acc_np(0.0)

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 8))
    def softmax_grad_warp_rows(g, y, out, log):
        rows, n = g.shape
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        if row >= rows:  # the whole warp leaves together
            return
        s = zero
        for j in range(lane, n, 32):
            s += term(acc(g[row, j]), acc(y[row, j]), log)
        s = warp_sum(s)
        for j in range(lane, n, 32):
            out[row, j] = dx(acc(g[row, j]), acc(y[row, j]), s, log)

    return softmax_grad_warp_rows


@lru_cache(maxsize=None)
def block_rows(acc_np):
    acc, term, dx = _dx(acc_np)
    zero = acc_np(0.0)

    @kernel(launch_bounds=(BLOCK_ROWS_MAX_THREADS, 1))
    def softmax_grad_block_rows(g, y, out, log):
        rows, n = g.shape
        sc = cuda.shared.array(32, acc)
        t = cuda.threadIdx.x
        nt = cuda.blockDim.x
        row = cuda.blockIdx.x
        while row < rows:  # block-uniform loop: the barriers inside are safe
            s = zero
            for j in range(t, n, nt):
                s += term(acc(g[row, j]), acc(y[row, j]), log)
            s = block_sum(s, sc, zero)
            for j in range(t, n, nt):
                out[row, j] = dx(acc(g[row, j]), acc(y[row, j]), s, log)
            row += cuda.gridDim.x

    return softmax_grad_block_rows


@lru_cache(maxsize=None)
def columns(acc_np):
    acc, term, dx = _dx(acc_np)
    zero = acc_np(0.0)

    @kernel
    def softmax_grad_columns(g, y, out, log):
        outer, n, inner = g.shape
        k = cuda.grid(1)
        if k >= outer * inner:
            return
        o = k // inner
        i = k - o * inner
        s = zero
        for j in range(n):
            s += term(acc(g[o, j, i]), acc(y[o, j, i]), log)
        for j in range(n):
            out[o, j, i] = dx(acc(g[o, j, i]), acc(y[o, j, i]), s, log)

    return softmax_grad_columns


# ---- cross-entropy with its gradient ---------------------------------------------------------

@lru_cache(maxsize=None)
def ce_check():
    """kernel(targets (N,), ignore_index, n_classes, count (1,) float64, bad (1,) int64 set
    to N): count[0] = targets not ignored; bad[0] = smallest row with a target outside
    [0, n_classes) that is not ignore_index.  One block."""

    @kernel(launch_bounds=(CHECK_THREADS,))
    def cross_entropy_check(targets, ignore_index, n_classes, count, bad):
        scratch = cuda.shared.array(32, types.float64)
        t = cuda.threadIdx.x
        a = 0.0
        for i in range(t, targets.shape[0], cuda.blockDim.x):
            v = targets[i]
            if v != ignore_index:
                if v < 0 or v >= n_classes:
                    cuda.atomic.min(bad, 0, i)
                else:
                    a += 1.0
        a = block_sum(a, scratch, 0.0)
        if t == 0:
            count[0] = a

    return cross_entropy_check


@lru_cache(maxsize=None)
def _ce_helpers(acc_np):
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)

    @device
    def row_scale(scales, per_row, row, count, mean):
        sc = acc(scales[row]) if per_row else acc(scales[0])
        if mean:
            sc = sc / acc(count[0])
        return sc

    return acc, neg_inf, zero, one, update, finish, row_scale


@lru_cache(maxsize=None)
def ce_grad_warp_rows(acc_np):
    """kernel(logits (N, C), targets (N,), ignore_index, grad (N, C), losses (N,) acc, valid
    (N,) acc, scales (1,) or (N,), per_row, count (1,) float64, mean): targets already
    checked.  grad may be logits."""
    acc, neg_inf, zero, one, update, finish, row_scale = _ce_helpers(acc_np)

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 8))
    def cross_entropy_grad_warp_rows(logits, targets, ignore_index, grad, losses, valid, scales, per_row, count,
                                     mean):
        rows, c = logits.shape
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        if row >= rows:
            return
        t = targets[row]
        if t == ignore_index:
            for j in range(lane, c, 32):
                grad[row, j] = zero
            if lane == 0:
                losses[row] = zero
                valid[row] = zero
            return
        m, s = neg_inf, zero
        for j in range(lane, c, 32):
            m, s = update(m, s, acc(logits[row, j]))
        m, s = warp_max_sumexp(m, s)
        m, inv, logs = finish(m, s)
        sc = row_scale(scales, per_row, row, count, mean)
        f = inv * sc
        for j in range(lane, c, 32):
            v = acc(logits[row, j])
            p = math.exp(v - m) * f
            if j == t:
                losses[row] = (m - v) + logs
                valid[row] = one
                p -= sc
            grad[row, j] = p

    return cross_entropy_grad_warp_rows


@lru_cache(maxsize=None)
def ce_grad_block_rows(acc_np):
    """As ce_grad_warp_rows with one block per row (grid-stride over rows): vocabularies."""
    acc, neg_inf, zero, one, update, finish, row_scale = _ce_helpers(acc_np)

    @kernel(launch_bounds=(CE_BLOCK_MAX_THREADS, 1))
    def cross_entropy_grad_block_rows(logits, targets, ignore_index, grad, losses, valid, scales, per_row, count,
                                      mean):
        rows, c = logits.shape
        sm = cuda.shared.array(32, acc)
        ss = cuda.shared.array(32, acc)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        row = cuda.blockIdx.x
        while row < rows:  # block-uniform
            t = targets[row]
            if t == ignore_index:
                for j in range(tid, c, nt):
                    grad[row, j] = zero
                if tid == 0:
                    losses[row] = zero
                    valid[row] = zero
            else:
                m, s = neg_inf, zero
                for j in range(tid, c, nt):
                    m, s = update(m, s, acc(logits[row, j]))
                m, s = block_max_sumexp(m, s, sm, ss, neg_inf, zero)
                m, inv, logs = finish(m, s)
                sc = row_scale(scales, per_row, row, count, mean)
                f = inv * sc
                for j in range(tid, c, nt):
                    v = acc(logits[row, j])
                    p = math.exp(v - m) * f
                    if j == t:
                        losses[row] = (m - v) + logs
                        valid[row] = one
                        p -= sc
                    grad[row, j] = p
            row += cuda.gridDim.x

    return cross_entropy_grad_block_rows


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _sm_args(nd):
    return lambda dt: (arr(dt, nd), arr(dt, nd), arr(dt, nd), types.boolean)


def _ce_args(dt):
    a = acc_type(dt)
    return (arr(dt, 2), arr(types.int64, 1), types.int64, arr(dt, 2), arr(a, 1), arr(a, 1), arr(dt, 1),
            types.boolean, arr(types.float64, 1), types.boolean)


PTX = [
    PtxBuild("softmax_grad.warp_rows", "softmax_grad", lambda dt: warp_rows(acc_np(dt)), _sm_args(2),
             threads=WARP_ROWS_THREADS),
    PtxBuild("softmax_grad.block_rows", "softmax_grad", lambda dt: block_rows(acc_np(dt)), _sm_args(2),
             threads=BLOCK_ROWS_MAX_THREADS),
    PtxBuild("softmax_grad.columns", "softmax_grad", lambda dt: columns(acc_np(dt)), _sm_args(3), threads=128),
    PtxBuild("cross_entropy_grad.check", "softmax_grad", lambda dt: ce_check(),
             lambda dt: (arr(types.int64, 1), types.int64, types.int64, arr(types.float64, 1), arr(types.int64, 1)),
             threads=CHECK_THREADS, dtypes=("float32",)),
    PtxBuild("cross_entropy_grad.warp_rows", "softmax_grad", lambda dt: ce_grad_warp_rows(acc_np(dt)), _ce_args,
             threads=WARP_ROWS_THREADS),
    PtxBuild("cross_entropy_grad.block_rows", "softmax_grad", lambda dt: ce_grad_block_rows(acc_np(dt)), _ce_args,
             threads=CE_BLOCK_MAX_THREADS),
]
