"""Depthwise causal 1-D convolution and its decode step on the GPU.

Arrays are 2-D C-contiguous device arrays of (batch * dim) rows; row r uses weight row
r % dim.  float16 / float32 inputs compute in float32, float64 in float64; the activation
is a runtime code (kernels_common.activation.ACT_*, kernels_cuda/activation.py's device
function).  bias (dim,) and the initial state are 1-element dummies when absent (flagged
by has_bias / has_init: a missing state reads zeros).  Every output sums bias, then taps
0..W-1, as the CPU kernels.

- causal_conv.conv_rows: one thread per output (row r, time t): the W inputs ending at t (the
  initial state before time 0), consecutive threads on consecutive times, so a warp's W
  loads are W coalesced, overlapping reads (served by L1).  Threads with t < W - 1 also
  write final[r, t], the input at time L - (W - 1) + t; the x extent of the grid is
  max(L, W - 1).  grid.y strides over the rows, the row's weight index advanced with an add
  and a compare.
- causal_conv.update_rows: one thread per row: seqlen outputs against the window (the
  state's last W - 1 values, then x), then the state shifted left by seqlen with x
  appended, in place (one thread owns a row: no race).
"""
from functools import lru_cache

from numba import cuda, types

from ._jit import ELEMENTWISE_THREADS, PtxBuild, acc_np, acc_of, arr, kernel
from .activation import act_fn


@lru_cache(maxsize=None)
def conv_kernel(acc_np):
    """kernel(x, w, bias, init, y, final, has_bias, has_init, code): x, y (rows, L); w
    (dim, W); init, final (rows, W - 1) (init a (1, 1) dummy without has_init)."""
    acc, _ = acc_of(acc_np)
    act = act_fn(acc_np)
    zero = acc_np(0.0)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def causal_conv1d_rows(x, w, bias, init, y, final, has_bias, has_init, code):
        rows, n = x.shape
        dim, width = w.shape
        h = width - 1
        t = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if t >= n and t >= h:
            return
        r = cuda.blockIdx.y
        d = r % dim
        step = cuda.gridDim.y % dim
        while r < rows:
            if t < n:
                a = acc(bias[d]) if has_bias else zero
                for k in range(width):
                    p = t - h + k
                    if p >= 0:
                        v = acc(x[r, p])
                    elif has_init:
                        v = acc(init[r, h + p])
                    else:
                        v = zero
                    a += acc(w[d, k]) * v
                y[r, t] = act(a, code)
            if t < h:
                p = n - h + t
                if p >= 0:
                    final[r, t] = x[r, p]
                elif has_init:
                    final[r, t] = init[r, h + p]
                else:
                    final[r, t] = zero
            r += cuda.gridDim.y
            d += step
            if d >= dim:
                d -= dim

    return causal_conv1d_rows


@lru_cache(maxsize=None)
def update_kernel(acc_np):
    """kernel(state, x, w, bias, y, has_bias, code): state (rows, state_len) updated in
    place; x, y (rows, seqlen); w (dim, W)."""
    acc, _ = acc_of(acc_np)
    act = act_fn(acc_np)
    zero = acc_np(0.0)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def causal_conv1d_update_rows(state, x, w, bias, y, has_bias, code):
        rows, slen = state.shape
        n = x.shape[1]
        dim, width = w.shape
        h = width - 1
        r = cuda.grid(1)
        if r >= rows:
            return
        d = r % dim
        base = slen - h
        for t in range(n):
            a = acc(bias[d]) if has_bias else zero
            for k in range(width):
                p = t + k
                v = acc(state[r, base + p]) if p < h else acc(x[r, p - h])
                a += acc(w[d, k]) * v
            y[r, t] = act(a, code)
        if n >= slen:
            for i in range(slen):
                state[r, i] = x[r, n - slen + i]
        else:
            for i in range(slen - n):
                state[r, i] = state[r, i + n]
            for i in range(n):
                state[r, slen - n + i] = x[r, i]

    return causal_conv1d_update_rows


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild("causal_conv.conv_rows", "causal_conv", lambda dt: conv_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 2), arr(dt, 2), arr(dt, 1), arr(dt, 2), arr(dt, 2), arr(dt, 2), types.boolean,
                         types.boolean, types.int64), threads=ELEMENTWISE_THREADS),
    PtxBuild("causal_conv.update_rows", "causal_conv", lambda dt: update_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 1), arr(dt, 2), types.boolean, types.int64),
             threads=ELEMENTWISE_THREADS),
]
