"""Row softmax, log-softmax and cross-entropy on C-contiguous 2-D arrays (rows x n).

Every kernel works on rows of the last axis (dispatch moves another axis last and copies).
A row is processed in three short passes that stay in L1/L2 (a 1024-float row is 4 KiB, a
32000-float row 125 KiB): max, then exp(x - max) written to the output with the sum
accumulated, then the output scaled by 1/sum.  Main memory sees the input read once and
the output written once.  Measured against a blocked "online softmax" (running max and
rescaled sum per block of 256, exp(x - running max) stored, blocks rescaled in a second
pass), float32, serial, best of 15: (64, 1024) 0.44 vs 0.54 ns/element, (4096, 1024) 0.44
vs 0.54, (64, 32000) 0.54 vs 0.53.  Online softmax saves a second read of the row, but
that read comes from cache here, and it pays per-block rescaling; the three-pass form stays.

float32 uses approx.fexp_nonpos (vectorizable polynomial exp, ~2e-7 relative, for the
arguments x - max <= 0 that a softmax has: no overflow clamp; serial 1536x128, Sapphire
Rapids, 2026-12-03: 84-86 -> 75-80 us); float64 uses the vectorizable exp64 (< 1e-15
relative; libm's exp is a scalar call, 20x slower).
Sums are in the input dtype with fastmath reassociation (vectorized partial sums).

Non-finite inputs: -inf entries give 0 (log_softmax: -inf).  A row whose max is -inf (all
-inf) or +inf, or that contains NaN, gives a row of NaN, as PyTorch does.
"""
import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from .approx import (OVERLOAD, HELPER, JIT, JIT_BY_ADDRESS, JIT_INNER, bits_to_float, fence, fexp_nonpos, like,
                     wide_loops)
from .half import round_to, widen
from .parallel import (RW_D, RW_I, RW_N, c_array_at, fetch_add, launch, like_dtype, num_threads, only_if, row_args,
                       require_c_arrays, row_block, row_claim, row_of, row_run, run_workers, tasks_for, worker_address,
                       zero_of)


# Row max as an integer max over the float bits: LLVM does not vectorize a float max
# reduction without the no-NaNs flag (we cannot use it: -inf/NaN must behave), but it does
# vectorize integer max (vpmaxsd).  key(i) = i ^ ((i >> 31) & 0x7FFFFFFF) orders float bit
# patterns like the floats (negative ones have their magnitude bits flipped) and is its own
# inverse.  The max of |bits| tells whether a NaN (|bits| > inf's) is present.
# Measured in-cache on 1024-float rows: 0.07 ns/element vs 0.18 for eight scalar max lanes
# and 0.54 for the plain loop.
@njit(**HELPER)
def _row_max32(xr):
    # 16 lanes on AVX-512 (approx.wide_loops; _row_max64 too): this helper compiles alone,
    # so the callers' wide_loops did not reach it.  Loop medians, old / new trees
    # alternating three times (Xeon with AMX, 2026-12-07), us, 1 / 2 threads: softmax
    # 1x32x512x512 5798-6323 / 2086-2285 -> 4595-5755 / 1808-2010, 128x50257 within noise,
    # 1x12x128x128 121-189 / 59-61 -> 126-128 / 61-64 (rows of 128: noise or a little worse)
    wide_loops()
    # the bits in place: with xr.view this helper took 0.28 s to compile, 0.10 s without (2026-12-03)
    iv = c_array_at(xr.ctypes.data, np.int32(0), (xr.shape[0],))
    k = np.int32(-2147483648)
    a = np.int32(0)
    for j in range(iv.shape[0]):
        i = iv[j]
        k = max(k, np.int32(i ^ ((i >> np.int32(31)) & np.int32(0x7FFFFFFF))))
        a = max(a, np.int32(i & np.int32(0x7FFFFFFF)))
    k = np.int32(k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF)))
    return bits_to_float(k), a > np.int32(0x7F800000)


_MAG64 = np.int64(0x7FFFFFFFFFFFFFFF)
_INF64 = np.int64(0x7FF0000000000000)


@njit(**HELPER)
def _row_max64(xr):
    wide_loops()
    iv = c_array_at(xr.ctypes.data, np.int64(0), (xr.shape[0],))
    k = np.int64(-9223372036854775808)
    a = np.int64(0)
    for j in range(iv.shape[0]):
        i = iv[j]
        k = max(k, i ^ ((i >> np.int64(63)) & _MAG64))
        a = max(a, i & _MAG64)
    k = k ^ ((k >> np.int64(63)) & _MAG64)
    return bits_to_float(k), a > _INF64


def row_max(xr):
    """(max of a contiguous row, True if the row holds a NaN); -inf for an empty row."""
    raise NotImplementedError


@overload(row_max, **OVERLOAD)
def _row_max_overload(xr):
    if not (isinstance(xr, types.Array) and xr.ndim == 1 and xr.layout == "C"):
        return None  # the helpers read the row's memory as integers in place
    if xr.dtype == types.float32:
        return lambda xr: _row_max32(xr)
    return lambda xr: _row_max64(xr)


# Short rows are processed in blocks of up to ROW_BLOCK rows, pass by pass (the maxima of
# the block's rows, then their exp passes, then their scaling): each pass ends in a
# reduction (max, sum) and a division whose latency the next pass of the same row waits
# for, and the other rows' independent work fills that wait.  A block spans at most
# ROW_BLOCK_ELEMENTS elements (4 KiB of float32); longer rows go one by one.  Float32,
# Zen 5, best of 3 loops, serial / parallel us, one by one -> blocked (2026-11-27): 4096x64
# 94 / 55 -> 76 / 45, 1536x128 (BERT-base scores) 59 / 36 -> 48 / 30, 8192x256 520 / 280 ->
# 460 / 237, 16384x512 2088 / 1048 -> 1900 / 1104.  Blocks of 4096 elements were slower
# for long rows read from memory (16384x512 serial 2049 -> 2713, 4096x1024 1049 -> 1233):
# the block's max pass then streams without the exp work to overlap it.
ROW_BLOCK = 8
ROW_BLOCK_ELEMENTS = 1024


@njit(**JIT_INNER)
def softmax_rows(x, out, log, lo, hi):
    """Rows lo..hi-1 of x (rows, n) -> out: softmax, or log_softmax when log is True."""
    # 16-lane exp on AVX-512 (approx.wide_loops): one thread, CPU time, Sapphire Rapids,
    # 2026-11-25: 64x32000 1.20-1.23 -> 0.99-1.00 ms, 1536x128 0.097-0.102 -> 0.089-0.093,
    # 4096x1024 2.71-2.83 either way (memory-bound)
    wide_loops()
    n = x.shape[1]
    if n == 0:
        return
    rb = max(1, min(ROW_BLOCK, ROW_BLOCK_ELEMENTS // n))
    ms = np.empty(rb, x.dtype)      # a row's max; NaN marks a row whose result is all NaN
    cs = np.empty(rb, x.dtype)      # 1 / sum (softmax) or log(sum) (log_softmax)
    inf = like(x[0, 0], np.inf)
    for i0 in range(lo, hi, rb):
        i1 = min(i0 + rb, hi)
        for i in range(i0, i1):
            m, nan = row_max(row_of(x, i))
            ms[i - i0] = like(m, np.nan) if (nan or m == inf or m == -inf) else m
        for i in range(i0, i1):
            m = ms[i - i0]
            if m != m:
                continue
            xr = row_of(x, i)
            orow = row_of(out, i)
            s = like(m, 0.0)
            if log:
                # d = x - m goes through memory (orow) before "- log(s)": with fastmath, LLVM
                # would otherwise hoist m + log(s) and compute x - (m + log s), losing the low
                # bits of the result when |m| is large.  The row is in L1: the pass is cheap.
                for j in range(n):
                    d = xr[j] - m
                    orow[j] = d
                    s += fexp_nonpos(d)
                cs[i - i0] = like(m, math.log(s))
            else:
                for j in range(n):
                    e = fexp_nonpos(xr[j] - m)
                    orow[j] = e
                    s += e
                cs[i - i0] = like(m, 1.0) / s
        for i in range(i0, i1):
            orow = row_of(out, i)
            m = ms[i - i0]
            if m != m:
                for j in range(n):
                    orow[j] = m
            elif log:
                ls = cs[i - i0]
                for j in range(n):
                    orow[j] -= ls
            else:
                inv = cs[i - i0]
                for j in range(n):
                    orow[j] *= inv


@njit(**JIT)
def softmax_serial(x, out, log):
    softmax_rows(x, out, log, 0, x.shape[0])


@njit(**JIT_BY_ADDRESS)
def softmax_worker(me, params, fmt, half):
    """Rows claimed from the block (parallel.row_block: i = log; arrays x, out of the
    literal type character fmt (parallel.zero_of): "f", "d", or 16-bit bits "H" / "h",
    which take softmax_rows_half (half: a parallel.only_if literal))."""
    p, _ = row_args(params)
    z = zero_of(fmt)
    x = c_array_at(p[0], z, (p[RW_N], p[RW_D]))
    out = c_array_at(p[1], z, (p[RW_N], p[RW_D]))
    log = p[RW_I] != 0
    lo, hi = row_claim(p, me)
    while lo < hi:
        if half is not None:
            softmax_rows_half(x, out, log, lo, hi)
        else:
            softmax_rows(x, out, log, lo, hi)
        lo, hi = row_claim(p, me)


def _variant(x):
    """softmax_worker's literals for x (dtype.char: 0.04 us, dtype.name 1.8)."""
    return x.dtype.char, only_if(x.dtype.itemsize == 2)


@njit(**JIT)
def _softmax_launch(x, out, log, worker, nw, fn, buf, team_run, team_state):
    workers = row_block(buf, x.shape[0], x.shape[1], 0.0, log, 0, 0, 1, nw, fn)
    buf[0], buf[1] = x.ctypes.data, out.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def softmax_parallel(x, out, log):
    """softmax_serial's result, rows claimed by the team's threads (parallel.row_run)."""
    row_run(_softmax_launch, worker_address(softmax_worker, _variant(x)), x, out, log)


@njit(**JIT_INNER)
def softmax_rows_half(x, out, log, lo, hi):
    """softmax_rows for 16-bit rows (x, out bfloat16 / float16 bits, half.py): ROW_BLOCK
    rows at a time widened into a float32 scratch block (exact), softmax_rows on it, each
    result rounded to x's format (nearest even), as PyTorch's bfloat16 / float16 softmax
    (float32 inside)."""
    wide_loops()
    n = x.shape[1]
    if n == 0:
        return
    rb = max(1, min(ROW_BLOCK, ROW_BLOCK_ELEMENTS // n))
    xs = np.empty((rb, n), np.float32)
    os = np.empty((rb, n), np.float32)
    for i0 in range(lo, hi, rb):
        k = min(rb, hi - i0)
        for i in range(k):
            xr = row_of(x, i0 + i)
            xsr = row_of(xs, i)
            for j in range(n):
                xsr[j] = widen(xr[j])
        softmax_rows(xs, os, log, 0, k)
        for i in range(k):
            orow = row_of(out, i0 + i)
            osr = row_of(os, i)
            for j in range(n):
                orow[j] = round_to(osr[j], out)


@njit(**JIT)
def softmax_half_serial(x, out, log):
    softmax_rows_half(x, out, log, 0, x.shape[0])


@njit(**JIT)
def cross_entropy_rows(x, targets, ignore_index, losses, lo, hi):
    """losses[i] = logsumexp(x[i]) - x[i, t_i] for rows lo..hi-1 (0 for ignored rows; NaN
    for NaN / +inf / all -inf rows); returns (their sum in float64, rows counted)."""
    # 16-lane exp sums on AVX-512 (approx.wide_loops), as softmax_rows: GPT-2's 128 x 50257,
    # loop medians, old / new trees alternating three times (Xeon with AMX, 2026-12-07), 1 /
    # 2 threads: 2787-2951 / 1442-1491 -> 2367-2393 / 1244-1271 us; 1024 rows 2 threads
    # 16.8-17.4 -> 15.2-16.0 ms
    wide_loops()
    n = x.shape[1]
    total = 0.0
    count = 0
    for i in range(lo, hi):
        t = targets[i]
        if t == ignore_index:
            losses[i] = 0
            continue
        xr = row_of(x, i)
        m, nan = row_max(xr)
        if nan or m == like(m, np.inf) or m == like(m, -np.inf):
            v = like(m, np.nan)
        else:
            s = like(m, 0.0)
            for j in range(n):
                s += fexp_nonpos(xr[j] - m)
            v = like(m, math.log(s)) - fence(xr[t] - m)
        losses[i] = v
        total += v
        count += 1
    return total, count


@njit(**JIT)
def ce_check(targets, n_classes, ignore_index):
    """Index of the first target outside [0, n_classes) that is not ignore_index, or -1."""
    for i in range(targets.shape[0]):
        t = targets[i]
        if t != ignore_index and (t < 0 or t >= n_classes):
            return i
    return -1


@njit(**JIT)
def cross_entropy_serial(x, targets, ignore_index, losses):
    """losses[i] = loss of row i (0 for ignored rows); returns (sum in float64, count)."""
    return cross_entropy_rows(x, targets, ignore_index, losses, 0, x.shape[0])


# ce_worker's argument block: int64 slots (addresses, then sizes); C_NEXT is the task
# counter the workers take row blocks from.
(C_X, C_T, C_L, C_PART, C_COUNT_PART, C_ROWS, C_COLS, C_IGNORE, C_TASKS, C_NEXT, C_COUNT) = range(11)


@njit(**JIT_BY_ADDRESS)
def ce_worker(w, params, is64):
    """cross_entropy_rows over the row blocks taken from the C_NEXT counter (a worker of
    parallel.run_workers; is64 a literal): block k's loss total and row count into part[k]
    and counts[k], so the total is summed in one order whichever thread ran which block.
    Called by address rather than as the prange kernel it replaced, which compiled
    cross_entropy_rows again into its gufunc: cold first call of cross_entropy (GPT-2's
    128 x 50257, empty cache, Sapphire Rapids-class Xeon, 2026-12-03, three alternating
    processes) 1.68-1.71 -> 1.30-1.33 s (1.13-1.14 with _ce_params), of linear_cross_entropy
    1.79-1.80 -> 1.40-1.72 s; the call itself unchanged (1.50-1.52 ms, loop medians)."""
    p = c_array_at(params, np.int64(0), (C_COUNT,))
    z = like_dtype(is64)
    n, c, tasks = p[C_ROWS], p[C_COLS], p[C_TASKS]
    x = c_array_at(p[C_X], z, (n, c))
    targets = c_array_at(p[C_T], np.int64(0), (n,))
    losses = c_array_at(p[C_L], z, (n,))
    part = c_array_at(p[C_PART], np.float64(0), (tasks,))
    counts = c_array_at(p[C_COUNT_PART], np.int64(0), (tasks,))
    k = fetch_add(p, C_NEXT, 1)
    while k < tasks:
        part[k], counts[k] = cross_entropy_rows(x, targets, p[C_IGNORE], losses, k * n // tasks, (k + 1) * n // tasks)
        k = fetch_add(p, C_NEXT, 1)


@njit(**JIT)
def _ce_params(p, x, targets, losses, part, counts):
    """ce_worker's addresses into p (in numba an array's address costs nothing, in Python
    ~3 us; parallel.addresses, with its literal_unroll, added 0.25 s to the cold first call)."""
    p[C_X], p[C_T], p[C_L] = x.ctypes.data, targets.ctypes.data, losses.ctypes.data
    p[C_PART], p[C_COUNT_PART] = part.ctypes.data, counts.ctypes.data


def cross_entropy_parallel(x, targets, ignore_index, losses):
    """cross_entropy_serial's result, row blocks taken by the team's threads (ce_worker on
    parallel.run_workers).  x (N, C), targets int64 (N,), losses (N,) of x's dtype, all
    C-contiguous (the worker reads raw memory)."""
    require_c_arrays("cross_entropy_parallel", (("x", x, x.dtype), ("targets", targets, np.int64),
                                                ("losses", losses, x.dtype)))
    n = x.shape[0]
    tasks = tasks_for(n)
    part = np.zeros(tasks)
    counts = np.zeros(tasks, np.int64)
    p = np.zeros(C_COUNT, np.int64)
    _ce_params(p, x, targets, losses, part, counts)
    p[C_ROWS], p[C_COLS], p[C_IGNORE], p[C_TASKS] = n, x.shape[1], ignore_index, tasks
    run_workers(worker_address(ce_worker, (bool(x.dtype == np.float64),)), p, min(num_threads(), tasks))
    return float(part.sum()), int(counts.sum())
