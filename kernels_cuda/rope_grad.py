"""Backward of rope on the GPU: dx = R^T grad_out, each pair (a, b) -> (a cos + b sin,
b cos - a sin), the inverse rotation.

kernels_cuda/rope.py's kernel with the signs of sin flipped: grad_out, out (rows, D)
C-contiguous with rows = batch * S (row r at position r % S); cos, sin (S, D/2).  One thread
per rotated pair, grid-stride, consecutive threads on consecutive pairs of a row (coalesced
for both layouts), the (row, pair, position) of a thread's pair advanced by the grid stride
with adds and compares (one division per thread, not per pair).
"""
from functools import lru_cache

from numba import cuda, types

from ._jit import ELEMENTWISE_THREADS, PtxBuild, acc_np, acc_of, arr, kernel


@lru_cache(maxsize=None)
def rope_grad_kernel(acc_np):
    acc, _ = acc_of(acc_np)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def rope_grad_pairs(g, cos, sin, out, interleaved):
        rows, d = g.shape
        seq, h = cos.shape
        total = rows * h
        p = cuda.grid(1)
        step = cuda.gridsize(1)
        r = p // h
        i = p - r * h
        t = r % seq
        step_r = step // h
        step_i = step - step_r * h
        step_t = step_r % seq
        while p < total:
            c = acc(cos[t, i])
            s = acc(sin[t, i])
            if interleaved:
                ia = 2 * i
                ib = ia + 1
            else:
                ia = i
                ib = i + h
            a = acc(g[r, ia])
            b = acc(g[r, ib])
            out[r, ia] = a * c + b * s
            out[r, ib] = b * c - a * s
            p += step
            i += step_i
            r += step_r
            t += step_t
            if i >= h:
                i -= h
                r += 1
                t += 1
            if t >= seq:
                t -= seq

    return rope_grad_pairs


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild("rope_grad.pairs", "rope_grad", lambda dt: rope_grad_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 2), types.boolean), threads=ELEMENTWISE_THREADS),
]
