"""Depthwise causal 1-D convolution (Mamba's conv1d) and its decode step, on rows.

The (batch, dim) rows of x are independent: row r = b * dim + d is convolved with weight
row d (W taps) and bias[d].  All arrays are C-contiguous; the dispatcher reshapes
(batch, dim, L) to (batch * dim, L) and passes a zero state / zero bias when none is given,
so one compiled kernel per dtype serves every call.

Output t of a row is act(bias + sum_k w[k] * c[t + k]), c = state ++ x: the row's input
preceded by its W - 1 earlier values (the initial state, zeros by default).  Every output
sums its terms in the same order (bias, then taps 0..W-1), in conv_rows and in the decode
step update_rows alike, so decoding step by step reproduces the prefill's outputs.

conv_rows: the first W - 1 outputs read the state (window_dot, scalar); the rest read x
only and run as one vector loop over the row with the W taps unrolled inside (the
causal-conv1d package's widths 2, 3 and 4, and 1: a loop compiled per width, _taps_body);
then SiLU as one vector pass over the row (in L1).  Measured 2026-11-23 (AMD znver3, one
thread, float32, dim 1536 x L 1024, W 4, interleaved medians of 15): one loop with the taps
unrolled 0.59 ms without activation / 2.16 ms with SiLU, against 1.66 / 4.08 ms for one
multiply-add pass over the row per tap (the loads and stores of y per tap cost more than
the taps' arithmetic); a copy of x took 0.63 ms.  SiLU in its own pass over the row: 1.63
ms against 1.68 ms inside the taps loop (medians of 15), and one SiLU loop to compile
instead of one per width.  Other widths take window_dot for every output.
final = c[L : L + W - 1], the last W - 1 inputs.  The rows run in conv_worker, called by
address (serial and parallel alike).

update_rows: one decode step of seqlen new inputs per row against a state of
state_len >= W - 1 values (its last W - 1 are the taps' history), then the state shifted
left by seqlen with the inputs appended (the causal-conv1d package's convention).  The
rows' weight index is advanced by an add and a compare, a seqlen-1 step has its taps
written out, and SiLU runs as one vector pass over the block's outputs afterwards:
measured 2026-11-23 (AMD znver3, one thread, a float32 step of 4096 rows, W 4, state 4,
interleaved medians of 11, a loaded host) 24 us for the outputs (47 us through
window_dot's loops, 70 us through its call) and 55 us in all, against 257 us with
r % dim and a scalar SiLU per row.

Inner-loop indexes are cast to uintp (>= 0 by construction): numba's wraparound of
negative signed indexes otherwise keeps a shifted loop scalar.  In parallel, workers
called by address (conv_worker, update_worker) take blocks of rows from an atomic counter.
"""
import numpy as np
from numpy import uintp
from numba import njit

from .approx import ACT_SILU, JIT, JIT_INNER, JIT_BY_ADDRESS, silu
from .parallel import (TASKS_PER_THREAD, addresses, c_array_at, fetch_add, like_dtype, num_threads, row_of, run_serial,
                       run_workers, worker_address)


@njit(**JIT_INNER)
def window_dot(s, base, xr, wr, b, t, width):
    """bias + the W-tap dot product of output t over the window s[base:] ++ xr, where
    s[base:] holds the W - 1 inputs before xr[0]."""
    h = width - 1
    a = b
    m = max(h - t, 0)  # the taps that reach back into the state
    for k in range(m):
        a += wr[k] * s[uintp(base + t + k)]
    for k in range(m, width):
        a += wr[k] * xr[uintp(t + k - h)]
    return a


def _taps_body(width):
    """body(xr, yr, wr, b, n): yr[t] = b + sum_k wr[k] * xr[t - (width - 1) + k] for
    width - 1 <= t < n, one vector loop with the taps unrolled (width is a constant of the
    compiled loop)."""
    h = width - 1

    @njit(**JIT)
    def body(xr, yr, wr, b, n):
        for j in range(n - h):
            a = b
            for k in range(width):
                a += wr[k] * xr[uintp(j + k)]
            yr[uintp(j + h)] = a

    return body


_BODY1, _BODY2, _BODY3, _BODY4 = (_taps_body(w) for w in (1, 2, 3, 4))


@njit(**JIT)
def conv_rows(x, w, bias, init, y, final, code, lo, hi):
    """Rows lo..hi-1: x, y (rows, L); w (dim, W); bias (dim,); init, final (rows, W - 1)."""
    dim, width = w.shape
    n = x.shape[1]
    h = width - 1
    for r in range(lo, hi):
        d = r % dim
        xr = row_of(x, r)
        yr = row_of(y, r)
        s = row_of(init, r)
        wr = row_of(w, d)
        b = bias[d]
        for t in range(min(h, n)):
            yr[t] = window_dot(s, 0, xr, wr, b, t, width)
        if width == 4:
            _BODY4(xr, yr, wr, b, n)
        elif width == 3:
            _BODY3(xr, yr, wr, b, n)
        elif width == 2:
            _BODY2(xr, yr, wr, b, n)
        elif width == 1:
            _BODY1(xr, yr, wr, b, n)
        else:
            for t in range(h, n):
                yr[t] = window_dot(s, 0, xr, wr, b, t, width)
        if code == ACT_SILU:
            for t in range(n):
                yr[t] = silu(yr[t])
        f = row_of(final, r)
        for i in range(h):
            p = n + i            # position in state ++ x
            f[i] = s[uintp(p)] if p < h else xr[uintp(p - h)]


# The int64 argument block of conv_worker: addresses, sizes, the task counter.
(C_SYNC, C_X, C_W, C_BIAS, C_INIT, C_Y, C_FINAL, C_ROWS, C_N, C_DIM, C_WIDTH, C_CODE, C_PER, C_COUNT) = range(14)


@njit(**JIT_BY_ADDRESS)
def conv_worker(wk, params, is64):
    """Worker wk of a causal_conv1d call (the C_* slots): conv_rows on blocks of C_PER rows
    taken from the counter.  One compiled worker per dtype, serial (run_serial) and
    parallel (run_workers) alike.  The cold first call at Mamba-130M's prefill took 5.6 s
    (serial) and 8.1 s (parallel) with a serial and a prange kernel each compiling
    conv_rows, SiLU inside every width's loop; 2.8 s and 3.1 s as this worker with one
    SiLU loop (2026-11-23, a loaded host)."""
    p = c_array_at(params, np.int64(0), (C_COUNT,))
    z = like_dtype(is64)
    rows, n, dim, width, per = p[C_ROWS], p[C_N], p[C_DIM], p[C_WIDTH], p[C_PER]
    h = width - 1
    sync = c_array_at(p[C_SYNC], np.int64(0), (1,))
    x = c_array_at(p[C_X], z, (rows, n))
    w = c_array_at(p[C_W], z, (dim, width))
    bias = c_array_at(p[C_BIAS], z, (dim,))
    init = c_array_at(p[C_INIT], z, (rows, h))
    y = c_array_at(p[C_Y], z, (rows, n))
    final = c_array_at(p[C_FINAL], z, (rows, h))
    while True:
        first = fetch_add(sync, 0, per)
        if first >= rows:
            break
        conv_rows(x, w, bias, init, y, final, p[C_CODE], first, min(first + per, rows))


def conv(x, w, bias, init, y, final, code, nworkers):
    """y = causal_conv1d of x (rows, L) with w (dim, W), bias (dim,), the W - 1 inputs before
    each row in init (rows, W - 1); final (rows, W - 1) gets the last W - 1 inputs; all
    C-contiguous of one dtype.  nworkers 1 runs on the calling thread, more hand blocks of
    rows to numba's threads (dynamic: TASKS_PER_THREAD blocks per thread)."""
    rows = x.shape[0]
    if rows == 0:
        return
    sync = np.zeros(1, np.int64)
    p = np.zeros(C_COUNT, np.int64)
    addresses(p, (sync, x, w, bias, init, y, final))
    p[C_ROWS], p[C_N], p[C_DIM], p[C_WIDTH], p[C_CODE] = rows, x.shape[1], w.shape[0], w.shape[1], code
    fn = worker_address(conv_worker, (bool(y.dtype == np.float64),))
    if nworkers <= 1:
        p[C_PER] = rows
        run_serial(fn, p)
    else:
        p[C_PER] = max(1, rows // (nworkers * TASKS_PER_THREAD))
        run_workers(fn, p, min(nworkers, rows))


@njit(**JIT)
def update_rows(state, x, w, bias, y, code, lo, hi):
    """Rows lo..hi-1: state (rows, state_len), updated in place; x, y (rows, seqlen)."""
    dim, width = w.shape
    slen = state.shape[1]
    n = x.shape[1]
    base = slen - (width - 1)
    d = lo % dim
    for r in range(lo, hi):
        s = row_of(state, r)
        xr = row_of(x, r)
        yr = row_of(y, r)
        wr = row_of(w, d)
        if n == 1:  # a decode step: the taps written out (window_dot's sums, 2x faster here)
            a = bias[d]
            for k in range(width - 1):
                a += wr[k] * s[uintp(base + k)]
            yr[0] = a + wr[width - 1] * xr[0]
        else:
            for t in range(n):
                yr[t] = window_dot(s, base, xr, wr, bias[d], t, width)
        if n >= slen:
            for i in range(slen):
                s[i] = xr[uintp(n - slen + i)]
        else:
            for i in range(slen - n):
                s[i] = s[uintp(i + n)]
            for i in range(n):
                s[uintp(slen - n + i)] = xr[i]
        d += 1
        if d == dim:
            d = 0
    if code == ACT_SILU:  # one vector pass over the block's outputs
        yf = y.reshape(y.size)
        for j in range(lo * n, hi * n):
            yf[uintp(j)] = silu(yf[uintp(j)])


@njit(**JIT)
def update_serial(state, x, w, bias, y, code):
    update_rows(state, x, w, bias, y, code, 0, x.shape[0])


# The int64 argument block of update_worker: addresses, sizes, the task counter.
(U_SYNC, U_STATE, U_X, U_W, U_BIAS, U_Y, U_ROWS, U_N, U_DIM, U_WIDTH, U_SLEN, U_CODE, U_PER, U_COUNT) = range(14)


@njit(**JIT_BY_ADDRESS)
def update_worker(wk, params, is64):
    """Worker wk of a parallel causal_conv1d_update call: update_rows on blocks of U_PER
    rows from the counter.  Called by address (parallel.run_workers): as a prange kernel,
    update_rows compiled a second time into the parallel region and the cold first call of
    a batch-16 step took 3.1 s, against 1.8 s for the serial kernel (2026-11-23)."""
    p = c_array_at(params, np.int64(0), (U_COUNT,))
    z = like_dtype(is64)
    rows, n, dim, width, slen, per = p[U_ROWS], p[U_N], p[U_DIM], p[U_WIDTH], p[U_SLEN], p[U_PER]
    sync = c_array_at(p[U_SYNC], np.int64(0), (1,))
    state = c_array_at(p[U_STATE], z, (rows, slen))
    x = c_array_at(p[U_X], z, (rows, n))
    w = c_array_at(p[U_W], z, (dim, width))
    bias = c_array_at(p[U_BIAS], z, (dim,))
    y = c_array_at(p[U_Y], z, (rows, n))
    while True:
        first = fetch_add(sync, 0, per)
        if first >= rows:
            break
        update_rows(state, x, w, bias, y, p[U_CODE], first, min(first + per, rows))


def update_parallel(state, x, w, bias, y, code):
    """update_serial's result, blocks of rows handed to numba's threads (dynamic:
    TASKS_PER_THREAD blocks per thread)."""
    rows = x.shape[0]
    nw = min(num_threads(), rows)
    sync = np.zeros(1, np.int64)
    p = np.zeros(U_COUNT, np.int64)
    addresses(p, (sync, state, x, w, bias, y))
    p[U_ROWS], p[U_N], p[U_DIM], p[U_WIDTH], p[U_SLEN] = rows, x.shape[1], w.shape[0], w.shape[1], state.shape[1]
    p[U_CODE], p[U_PER] = code, max(1, rows // (nw * TASKS_PER_THREAD))
    run_workers(worker_address(update_worker, (bool(y.dtype == np.float64),)), p, nw)
