"""Top-k softmax routing of mixture-of-experts router logits, row by row.

logits (T, E) C-contiguous; weights (T, k) of the logits' dtype, indices (T, k) int64.
Per row:
1. the k largest logits in one pass, kept sorted in a small insertion list: each logit is
   compared with the current k-th (one compare; an insertion only when it beats it).  A
   logit enters only when strictly larger, so among equal logits the lower expert index
   ranks first.  Ranking the logits ranks the probabilities exactly (exp is increasing),
   with no rounding in between.  Long rows first bound the k-th largest from below (see
   GROUPS) and skip the logits under it.  The same pass notes NaNs; the max is the first
   of the list.  Measured against k passes of an argmax (branch-free selects) over the
   row (2026-11-23, AMD znver3, one thread, float32, selection only, a loaded host):
   E 8 / k 2 49 vs 56 ns per row, E 64 / k 6 595 vs 1247, E 256 / k 8 1145 vs 5752;
2. weights exp(l - max) / sum: the sum over the k chosen (renormalize) or over the whole
   row (a vectorized exp pass, approx.fexp).
A row whose max is +inf or -inf (all -inf), or that holds a NaN, has no softmax (PyTorch
gives NaN): its weights are NaN and its indices 0..k-1.

The parallel version runs topk_rows in workers called by address that take blocks of rows
from an atomic counter (parallel.run_workers).
"""
import numpy as np
from numba import njit
from numpy import uintp

from .approx import JIT, JIT_INNER, JIT_BY_ADDRESS, fexp, like
from .parallel import (TASKS_PER_THREAD, addresses, c_array_at, fetch_add, like_dtype, num_threads, row_of, run_workers,
                       worker_address)

# Rows of at least PREFILTER_MIN logits first find a lower bound of their k-th largest: the
# k-th largest of the maxima of GROUPS interleaved groups (logit j in group j % GROUPS; a
# vector max per lane), since those maxima are k distinct logits.  Only logits at or above
# it enter the insertion list.  Measured 2026-11-23 (AMD znver3, one thread, float32,
# selection only, interleaved medians of 9, a loaded host): E 160 / k 6 1331 -> 981 ns per
# row, E 256 / k 8 1932 -> 1305, E 64 / k 6 425 -> 400, but E 32 / k 4 462 -> 540 (the
# group pass costs more than the insertions it saves).
GROUPS = 16
PREFILTER_MIN = 64


@njit(**JIT_INNER)
def _insert(vals, idx, p, v, j):
    """Put (v, j) into the sorted list at or above slot p (the slots below p shift down)."""
    while p > 0 and v > vals[p - 1]:
        vals[p] = vals[p - 1]
        idx[p] = idx[p - 1]
        p -= 1
    vals[p] = v
    idx[p] = j


@njit(**JIT_INNER)
def topk_rows(x, k, renormalize, weights, indices, lo, hi):
    """Rows lo..hi-1 of x (T, E) -> weights, indices (T, k); 1 <= k <= E."""
    n = x.shape[1]
    vals = np.empty(k, x.dtype)
    idx = np.empty(k, np.int64)
    gmax = np.empty(GROUPS, x.dtype)
    gidx = np.empty(k, np.int64)
    prefilter = n >= PREFILTER_MIN and k <= GROUPS
    full = n - n % GROUPS
    for r in range(lo, hi):
        xr = row_of(x, r)
        wr = row_of(weights, r)
        ir = row_of(indices, r)
        thr = like(xr[0], -np.inf)
        if prefilter:
            for g in range(GROUPS):
                gmax[g] = xr[g]
            for i in range(GROUPS, full, GROUPS):
                for g in range(GROUPS):
                    v = xr[uintp(i + g)]
                    gmax[g] = v if v > gmax[g] else gmax[g]
            for g in range(k):
                _insert(vals, gidx, g, gmax[g], g)
            for g in range(k, GROUPS):
                if gmax[g] > vals[k - 1]:
                    _insert(vals, gidx, k - 1, gmax[g], g)
            thr = vals[k - 1]
        nan = False
        c = 0
        for j in range(n):
            v = xr[j]
            nan |= v != v
            if v >= thr:
                if c < k:
                    _insert(vals, idx, c, v, j)
                    c += 1
                elif v > vals[k - 1]:
                    _insert(vals, idx, k - 1, v, j)
        m = vals[0]
        if nan or m == like(m, np.inf) or m == like(m, -np.inf):
            for i in range(k):
                wr[i] = like(m, np.nan)
                ir[i] = i
            continue
        s = like(m, 0.0)
        if renormalize:
            for i in range(k):
                wr[i] = fexp(vals[i] - m)
            for i in range(k):  # apart from the stores: tests/ir_checks.py
                s += wr[i]
        else:
            for j in range(n):
                s += fexp(xr[j] - m)
            for i in range(k):
                wr[i] = fexp(vals[i] - m)
        inv = like(m, 1.0) / s
        for i in range(k):
            wr[i] *= inv
            ir[i] = idx[i]


@njit(**JIT)
def topk_serial(x, k, renormalize, weights, indices):
    topk_rows(x, k, renormalize, weights, indices, 0, x.shape[0])


# The int64 argument block of topk_worker: addresses, sizes, the task counter.
(R_SYNC, R_X, R_W, R_I, R_T, R_E, R_K, R_RENORM, R_PER, R_COUNT) = range(10)


@njit(**JIT_BY_ADDRESS)
def topk_worker(wk, params, is64):
    """Worker wk of a parallel topk_softmax call (the R_* slots): topk_rows on blocks of
    R_PER rows taken from the counter.  Called by address (parallel.run_workers): as a
    prange kernel, topk_rows compiled a second time into the parallel region and the cold
    first call at 4096 x 160 took 3.8 s, against 2.0 s for the serial kernel (2026-11-23)."""
    p = c_array_at(params, np.int64(0), (R_COUNT,))
    z = like_dtype(is64)
    t, e, k, per = p[R_T], p[R_E], p[R_K], p[R_PER]
    sync = c_array_at(p[R_SYNC], np.int64(0), (1,))
    x = c_array_at(p[R_X], z, (t, e))
    weights = c_array_at(p[R_W], z, (t, k))
    indices = c_array_at(p[R_I], np.int64(0), (t, k))
    while True:
        first = fetch_add(sync, 0, per)
        if first >= t:
            break
        topk_rows(x, k, p[R_RENORM] != 0, weights, indices, first, min(first + per, t))


def topk_parallel(x, k, renormalize, weights, indices):
    """topk_serial's result, blocks of rows handed to numba's threads (dynamic:
    TASKS_PER_THREAD blocks per thread)."""
    t = x.shape[0]
    nw = min(num_threads(), t)
    sync = np.zeros(1, np.int64)
    p = np.zeros(R_COUNT, np.int64)
    addresses(p, (sync, x, weights, indices))
    p[R_T], p[R_E], p[R_K], p[R_RENORM] = t, x.shape[1], k, renormalize
    p[R_PER] = max(1, t // (nw * TASKS_PER_THREAD))
    run_workers(worker_address(topk_worker, (bool(x.dtype == np.float64),)), p, nw)
