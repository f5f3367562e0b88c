"""Top-k softmax routing on the GPU: one warp per row of router logits.

routing.warp_rows: topk_softmax, logits (T, E), weights (T, k) in the accumulation type (float32
for float16 / float32 logits, float64 for float64), indices (T, k) int64.  A block of W
warps takes W rows; the lanes stride over the row's E logits (E is 8..256 in the models:
1..8 per lane):
1. the row's max and NaN flag (warp_max);
2. without renormalize, the sum of exp(l - max) over the row (warp_sum);
3. k rounds; round i finds the largest logit ranked below round i-1's winner in the order
   (logit descending, index ascending): each lane rescans its logits (from L1) for its best
   such one, and a butterfly of shuffles (warp_argmax) leaves every lane with the warp's
   (largest logit, lowest index) - so equal logits go to the lower expert index and no
   lane keeps a list.  Lane 0 writes exp(winner - max) and the index;
4. lane 0 scales its k weights by 1 / (their sum, or the row's sum): it reads back only
   what it wrote itself, so no barrier is needed.
A row holding NaN or +inf, or only -inf, gets NaN weights and indices 0..k-1.
"""
import math
from functools import lru_cache

import numpy as np
from numba import cuda, types

from ._jit import FULL_MASK, WARP_ROWS_THREADS, PtxBuild, acc_np, acc_of, acc_type, arr, device, kernel
from .primitives import warp_max, warp_sum


@device
def warp_argmax(v, i):
    """Warp reduction of (value, index) pairs to the largest value, the lowest index among
    equal values (every lane ends with it; values are not NaN)."""
    for off in (16, 8, 4, 2, 1):
        v2 = cuda.shfl_xor_sync(FULL_MASK, v, off)
        i2 = cuda.shfl_xor_sync(FULL_MASK, i, off)
        if v2 > v or (v2 == v and i2 < i):
            v = v2
            i = i2
    return v, i


@lru_cache(maxsize=None)
def warp_rows(acc_np):
    """kernel(x, k, renormalize, weights, indices) for accumulation type acc_np."""
    acc, _ = acc_of(acc_np)
    neg_inf, pos_inf, zero, one, nan = acc_np(-np.inf), acc_np(np.inf), acc_np(0.0), acc_np(1.0), acc_np(np.nan)

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 8))
    def topk_softmax_warp_rows(x, k, renormalize, weights, indices):
        rows, n = x.shape
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        if row >= rows:  # the whole warp leaves together
            return
        m = neg_inf
        bad = zero
        for j in range(lane, n, 32):
            v = acc(x[row, j])
            if v != v:
                bad = one
            elif v > m:
                m = v
        m = warp_max(m)
        bad = warp_max(bad)
        if bad > zero or m == pos_inf or m == neg_inf:
            for i in range(lane, k, 32):
                weights[row, i] = nan
                indices[row, i] = i
            return
        s = zero
        if not renormalize:
            for j in range(lane, n, 32):
                s += math.exp(acc(x[row, j]) - m)
            s = warp_sum(s)
        pv = pos_inf
        pi = np.int32(-1)
        for i in range(k):
            bv = neg_inf
            bi = np.int32(n)  # stands for "none yet": worse than any logit, -inf included
            for j in range(lane, n, 32):
                v = acc(x[row, j])
                if (v < pv or (v == pv and j > pi)) and (v > bv or (v == bv and j < bi)):
                    bv = v
                    bi = np.int32(j)
            bv, bi = warp_argmax(bv, bi)
            e = math.exp(bv - m)
            if lane == 0:
                weights[row, i] = e
                indices[row, i] = bi
            if renormalize:
                s += e
            pv = bv
            pi = bi
        if lane == 0:
            inv = one / s
            for i in range(k):
                weights[row, i] *= inv

    return topk_softmax_warp_rows


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild("routing.warp_rows", "routing", lambda dt: warp_rows(acc_np(dt)),
             lambda dt: (arr(dt, 2), types.int64, types.boolean, arr(acc_type(dt), 2), arr(types.int64, 2)),
             threads=WARP_ROWS_THREADS),
]
