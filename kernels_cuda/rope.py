"""Rotary position embedding on the GPU.

x, out: (rows, D) C-contiguous with rows = batch * S (row r has position r % S); cos, sin:
(S, D/2).  One thread per rotated pair, grid-stride; a thread reads its pair (a, b), the
pair's cos / sin, and writes (a cos - b sin, b cos + a sin).  Consecutive threads take
consecutive pairs i of a row, so for rotate-half (pairs (i, i + D/2)) both halves are
read and written coalesced, and for interleaved (pairs (2i, 2i + 1)) a warp covers 64
consecutive elements; the cos / sin rows are shared by all batch rows through L2.  A
thread divides once to find its first pair's (row, pair, position) and then advances them
by the grid stride with adds and compares (no division per pair).  inverse=True builds
the backward (kernels_cuda/rope_grad.py): R^T, the signs of sin flipped.
"""
from functools import lru_cache

from numba import cuda

from numba import types

from ._jit import ELEMENTWISE_THREADS, PtxBuild, acc_np, acc_of, arr, kernel


@lru_cache(maxsize=None)
def rope_kernel(acc_np, inverse=False):
    acc, _ = acc_of(acc_np)
    inverse = bool(inverse)  # a compile-time constant: the untaken branch is dropped

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def rope_pairs(x, cos, sin, out, interleaved):
        rows, d = x.shape
        seq, h = cos.shape
        total = rows * h
        g = cuda.grid(1)
        step = cuda.gridsize(1)
        # (row r, pair i, position t) of pair g, advanced by the grid stride without a
        # division per pair (64-bit division is a ~70-instruction software routine):
        # the divisions happen once per thread, here
        r = g // h
        i = g - r * h
        t = r % seq
        step_r = step // h
        step_i = step - step_r * h
        step_t = step_r % seq
        while g < total:
            c = acc(cos[t, i])
            s = acc(sin[t, i])
            if interleaved:
                ia = 2 * i
                ib = ia + 1
            else:
                ia = i
                ib = i + h
            a = acc(x[r, ia])
            b = acc(x[r, ib])
            if inverse:
                out[r, ia] = a * c + b * s
                out[r, ib] = b * c - a * s
            else:
                out[r, ia] = a * c - b * s
                out[r, ib] = b * c + a * s
            g += step
            i += step_i
            r += step_r
            t += step_t
            if i >= h:
                i -= h
                r += 1
                t += 1
            if t >= seq:
                t -= seq

    return rope_pairs


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild("rope.pairs", "rope", lambda dt: rope_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 2), types.boolean), threads=ELEMENTWISE_THREADS),
]
