"""Backward of softmax / log_softmax and the cross-entropy gradient, on C-contiguous rows.

softmax_backward:      dx = y * (g - sum(g * y))      (y the softmax output)
log_softmax_backward:  dx = g - exp(y) * sum(g)        (y the log_softmax output)
A row is two short passes that stay in L1/L2 (a 50257-float row is 196 KiB): the sum, then
the write.  Main memory sees g and y read once and dx written once.  A reduction along
another axis runs on x viewed as (outer, n, inner) directly (`cols`): a chunk of the inner
axis keeps its sums in a small buffer and both passes run along the contiguous inner
axis, so no transposed copy is made.

cross_entropy with its gradient (`ce_grad_rows`): per row, max (the forward's integer max
over the float bits), then exp(x - max) written to the gradient row with the sum
accumulated, then the row scaled by scale / sum and scale subtracted at the target:
grad = (softmax - onehot) * scale, and loss = log(sum) - (x_t - max).  The logits are read
from main memory once and the gradient written once; the later passes read the row from
cache.  The forward's measurement (kernels_cpu/softmax.py) of this three-pass form against
an online (running max) softmax applies here unchanged.  The gradient row may be the logits
row itself (grad_out=logits): every pass reads element j before writing element j, and
x_t is read before the row is overwritten.

float32 uses approx.fexp (vectorizable, ~2e-7 relative), float64 approx.exp64; sums are
in the input dtype with fastmath reassociation (vectorized partial sums), the loss total in
float64.  NaN in g or y gives a NaN row (the sum is NaN); a logits row holding NaN or +inf,
or all -inf, gives a NaN loss and a NaN gradient row.
"""
import math

import numpy as np
from numba import njit

from .approx import JIT, JIT_BY_ADDRESS, JIT_INNER, bits_to_float, fence, fexp, like, wide_loops
from .parallel import (RW_D, RW_I, RW_I2, RW_I3, RW_N, c_array_at, fetch_add, launch, like_dtype, num_threads, only_if,
                       row_args, require_c_arrays, row_block, row_claim, row_of, row_run, run_workers, tasks_for,
                       worker_address)
from .softmax import row_max

# Inner-axis chunk of the column kernel: sums for COL_CHUNK columns (2 KiB float32, 4 KiB
# float64) stay in L1 while the n rows of the chunk stream by.  Not measured on its own.
COL_CHUNK = 512


@njit(**JIT_INNER)
def _exp_nan(v):
    """exp(v) with NaN for NaN (approx.fexp clamps its argument and gives 0 for NaN; the
    forwards test for NaN rows apart).  A compare and a blend: the loops still vectorize."""
    e = fexp(v)
    return e if v == v else v


@njit(**JIT)
def rows(g, y, dx, log, lo, hi):
    """Rows lo..hi-1 of g, y (rows, n) -> dx: softmax backward, or log_softmax backward
    when log is True."""
    # 16-lane loops on AVX-512 targets (approx.wide_loops; the forward's measurement)
    wide_loops()
    n = g.shape[1]
    if n == 0:
        return
    for i in range(lo, hi):
        gr = row_of(g, i)
        yr = row_of(y, i)
        dr = row_of(dx, i)
        s = like(yr[0], 0.0)
        if log:
            for j in range(n):
                s += gr[j]
            for j in range(n):
                dr[j] = gr[j] - _exp_nan(yr[j]) * s
        else:
            for j in range(n):
                s += gr[j] * yr[j]
            for j in range(n):
                dr[j] = yr[j] * (gr[j] - s)


@njit(**JIT)
def rows_serial(g, y, dx, log):
    rows(g, y, dx, log, 0, g.shape[0])


@njit(**JIT_BY_ADDRESS)
def grad_worker(me, params, is64, by_cols):
    """Claims from the block (parallel.row_block; arrays g, y, dx; i = log).  Rows: n rows
    of d.  Columns: n column tasks of (outer, d, inner) arrays, i2 = outer, i3 = inner."""
    p, _ = row_args(params)
    z = like_dtype(is64)
    log = p[RW_I] != 0
    lo, hi = row_claim(p, me)
    if by_cols is not None:
        shape = (p[RW_I2], p[RW_D], p[RW_I3])
        g3, y3, d3 = c_array_at(p[0], z, shape), c_array_at(p[1], z, shape), c_array_at(p[2], z, shape)
        while lo < hi:
            cols(g3, y3, d3, log, lo, hi)
            lo, hi = row_claim(p, me)
    else:
        shape2 = (p[RW_N], p[RW_D])
        g, y, dx = c_array_at(p[0], z, shape2), c_array_at(p[1], z, shape2), c_array_at(p[2], z, shape2)
        while lo < hi:
            rows(g, y, dx, log, lo, hi)
            lo, hi = row_claim(p, me)


@njit(**JIT)
def _launch(g, y, dx, log, n, d, outer, inner, worker, nw, fn, buf, team_run, team_state):
    workers = row_block(buf, n, d, 0.0, log, outer, inner, 1, nw, fn)
    buf[0], buf[1], buf[2] = g.ctypes.data, y.ctypes.data, dx.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def rows_parallel(g, y, dx, log):
    """rows_serial's result, rows claimed by the team's threads (parallel.row_run)."""
    row_run(_launch, worker_address(grad_worker, (bool(g.dtype == np.float64), only_if(False))),
            g, y, dx, log, g.shape[0], g.shape[1], 0, 0)


@njit(**JIT)
def cols(g, y, dx, log, lo, hi):
    """Column tasks lo..hi-1 of g, y (outer, n, inner) -> dx, reducing along axis 1.  Task
    k is outer index k // chunks, inner columns [c0, c0 + COL_CHUNK) of chunk k % chunks."""
    wide_loops()
    outer, n, inner = g.shape
    if n == 0 or inner == 0:
        return
    chunks = (inner + COL_CHUNK - 1) // COL_CHUNK
    g2 = g.reshape(outer * n, inner)
    y2 = y.reshape(outer * n, inner)
    d2 = dx.reshape(outer * n, inner)
    s = np.empty(COL_CHUNK, g.dtype)
    for k in range(lo, hi):
        o = k // chunks
        c0 = (k - o * chunks) * COL_CHUNK
        w = min(COL_CHUNK, inner - c0)
        for c in range(w):
            s[c] = 0
        for j in range(n):
            gr = row_of(g2, o * n + j)[c0:c0 + w]
            yr = row_of(y2, o * n + j)[c0:c0 + w]
            if log:
                for c in range(w):
                    s[c] += gr[c]
            else:
                for c in range(w):
                    s[c] += gr[c] * yr[c]
        for j in range(n):
            gr = row_of(g2, o * n + j)[c0:c0 + w]
            yr = row_of(y2, o * n + j)[c0:c0 + w]
            dr = row_of(d2, o * n + j)[c0:c0 + w]
            if log:
                for c in range(w):
                    dr[c] = gr[c] - _exp_nan(yr[c]) * s[c]
            else:
                for c in range(w):
                    dr[c] = yr[c] * (gr[c] - s[c])


def col_tasks(shape):
    """Number of column tasks of an (outer, n, inner) reduction."""
    outer, _, inner = shape
    return outer * ((inner + COL_CHUNK - 1) // COL_CHUNK)


@njit(**JIT)
def cols_serial(g, y, dx, log, ntasks):
    cols(g, y, dx, log, 0, ntasks)


def cols_parallel(g, y, dx, log, ntasks):
    """cols_serial's result, column tasks claimed by the team's threads (parallel.row_run)."""
    row_run(_launch, worker_address(grad_worker, (bool(g.dtype == np.float64), only_if(True))),
            g, y, dx, log, ntasks, g.shape[1], g.shape[0], g.shape[2])


# ---- cross-entropy with its gradient ------------------------------------------------------

@njit(**JIT)
def ce_check_count(targets, n_classes, ignore_index):
    """(index of the first target outside [0, n_classes) that is not ignore_index, or -1;
    number of targets that are not ignore_index)."""
    count = 0
    for i in range(targets.shape[0]):
        t = targets[i]
        if t != ignore_index:
            if t < 0 or t >= n_classes:
                return i, count
            count += 1
    return -1, count


@njit(inline="always")
def _exp_shift_store(src, dst, m):
    """dst[j] = exp(src[j] - m) for the row; returns their sum.  src and dst may be the
    same array (then passed as the same variable, so that the loop vectorizes)."""
    s = like(m, 0.0)
    for j in range(src.shape[0]):
        e = fexp(src[j] - m)
        dst[j] = e
        s += e
    return s


@njit(**JIT_INNER)
def ce_grad_rows(x, targets, ignore_index, grad, losses, scales, per_row, base, lo, hi):
    """Rows lo..hi-1: losses[i] = logsumexp(x[i]) - x[i, t_i] and grad[i] = (softmax(x[i])
    - onehot(t_i)) * scale_i, scale_i = scales[i] (per_row) or scales[0], times base;
    ignored rows get loss 0 and a zero gradient row.  Returns the losses' sum in float64.
    grad may be x itself (see the module docstring)."""
    wide_loops()
    n = x.shape[1]
    total = 0.0
    for i in range(lo, hi):
        t = targets[i]
        gr = row_of(grad, i)
        if t == ignore_index:
            losses[i] = 0
            for j in range(n):
                gr[j] = 0
            continue
        xr = row_of(x, i)
        sc = like(xr[0], (scales[i] if per_row else scales[0]) * base)
        m, nan = row_max(xr)
        xt = xr[t]  # before the row is overwritten (grad may be x)
        if nan or m == like(m, np.inf) or m == like(m, -np.inf):
            v = like(m, np.nan)
            for j in range(n):
                gr[j] = v
        else:
            # grad_out=logits: the pass on one array.  On two views of the same memory
            # LLVM's runtime overlap check fails and the loop runs scalar: 128x50257 float32
            # in place 10.1 -> 1.5-1.6 ms (1.7 into another array; 2 threads, Zen 4,
            # 2026-12-05); in linear_cross_entropy_with_grad at 4096 rows 469 -> 69-83 ms
            # of 6.6 -> 6.0 s
            if gr.ctypes.data == xr.ctypes.data:
                s = _exp_shift_store(gr, gr, m)
            else:
                s = _exp_shift_store(xr, gr, m)
            f = sc / s
            for j in range(n):
                gr[j] *= f
            gr[t] -= sc
            v = like(m, math.log(s)) - fence(xt - m)
        losses[i] = v
        total += v
    return total


@njit(**JIT)
def ce_grad_serial(x, targets, ignore_index, grad, losses, scales, per_row, base):
    return ce_grad_rows(x, targets, ignore_index, grad, losses, scales, per_row, base, 0, x.shape[0])


# ce_grad_worker's argument block: int64 slots (addresses, then sizes and scalars); E_NEXT
# is the task counter the workers take row blocks from.
(E_X, E_T, E_G, E_L, E_S, E_PART, E_ROWS, E_COLS, E_NSCALES, E_IGNORE, E_PER_ROW, E_BASE, E_TASKS, E_NEXT,
 E_COUNT) = range(15)


@njit(**JIT_BY_ADDRESS)
def ce_grad_worker(w, params, is64):
    """ce_grad_rows over the row blocks taken from the E_NEXT counter (a worker of
    parallel.run_workers; is64 a literal): block k's loss total into part[k], so the total
    is summed in one order whichever thread ran which block.  A worker called by address,
    not a prange kernel: cold first call of linear_cross_entropy_with_grad (gpt-2 lm head
    512, empty cache, Sapphire Rapids host, 2026-11-26) 3.94-4.08 s with the prange
    kernel (1.32 s of it compiling that kernel)."""
    p = c_array_at(params, np.int64(0), (E_COUNT,))
    z = like_dtype(is64)
    n, c, tasks = p[E_ROWS], p[E_COLS], p[E_TASKS]
    x = c_array_at(p[E_X], z, (n, c))
    grad = c_array_at(p[E_G], z, (n, c))
    targets = c_array_at(p[E_T], np.int64(0), (n,))
    losses = c_array_at(p[E_L], z, (n,))
    scales = c_array_at(p[E_S], z, (p[E_NSCALES],))
    part = c_array_at(p[E_PART], np.float64(0), (tasks,))
    base = bits_to_float(p[E_BASE])
    per_row = p[E_PER_ROW] != 0
    k = fetch_add(p, E_NEXT, 1)
    while k < tasks:
        part[k] = ce_grad_rows(x, targets, p[E_IGNORE], grad, losses, scales, per_row, base,
                               k * n // tasks, (k + 1) * n // tasks)
        k = fetch_add(p, E_NEXT, 1)


def ce_grad_parallel(x, targets, ignore_index, grad, losses, scales, per_row, base):
    """ce_grad_serial's result, row blocks taken by the team's threads (ce_grad_worker on
    parallel.run_workers)."""
    require_c_arrays("ce_grad_parallel", (("x", x, x.dtype), ("targets", targets, np.int64), ("grad", grad, x.dtype),
                                          ("losses", losses, x.dtype), ("scales", scales, x.dtype)))
    n = x.shape[0]
    tasks = tasks_for(n)
    part = np.zeros(tasks)
    p = np.zeros(E_COUNT, np.int64)
    for slot, a in ((E_X, x), (E_T, targets), (E_G, grad), (E_L, losses), (E_S, scales), (E_PART, part)):
        p[slot] = a.ctypes.data
    p[E_ROWS], p[E_COLS], p[E_NSCALES], p[E_IGNORE] = n, x.shape[1], scales.shape[0], ignore_index
    p[E_PER_ROW], p[E_BASE], p[E_TASKS] = bool(per_row), np.float64(base).view(np.int64), tasks
    run_workers(worker_address(ce_grad_worker, (bool(x.dtype == np.float64),)), p,
                min(num_threads(), tasks))
    return float(part.sum())
