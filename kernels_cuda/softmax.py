"""softmax / log_softmax / cross_entropy rows on the GPU.

Row kernels read a row twice: pass 1 keeps an online (max, sum of exp(x - max)) state per
thread, merged across the warp (and block) with shuffles (primitives.warp_max_sumexp /
block_max_sumexp); pass 2 writes exp(x - max) / sum or x - max - log(sum).
- warp_rows: one warp per row (block of W warps = W rows); for rows up to ~1K elements,
  where a block-wide reduction would leave most threads idle.
- block_rows: one block per row (grid-stride over rows); long rows (vocabularies).
- columns: reduction along a non-last axis of x viewed as (outer, n, inner): one thread per
  (outer, inner) column, consecutive threads on consecutive inner indices (coalesced).
- cross_entropy: one warp per row computes logsumexp - x[target], flags a bad target
  (atomic min of its row index); a one-block second pass sums the losses and counts.
Special values as the CPU kernels: -inf entries give 0 (log: -inf); a row all -inf or
holding +inf or NaN gives NaN.
"""
import math
from functools import lru_cache

import numpy as np
from numba import cuda

from numba import types, uint64

from ._jit import (BLOCK_ROWS_MAX_THREADS, VEC_ROW_DTYPES, VEC_ROW_ELEMENTS, VEC_ROWS_MAX_THREADS, WARP_ROWS_THREADS,
                   PtxBuild, acc_np, acc_of, acc_type, arr, device, kernel, row_unroll)
from .primitives import block_max_sumexp, block_sum2, row_owner, vec_io, vec_width, warp_max_sumexp


@lru_cache(maxsize=None)
def _helpers(acc_np):
    acc, _ = acc_of(acc_np)
    neg_inf, pos_inf, zero, one = acc_np(-np.inf), acc_np(np.inf), acc_np(0.0), acc_np(1.0)
    nan = acc_np(np.nan)

    @device
    def update(m, s, v):
        """Online softmax state after one more element v."""
        if v > m:
            s = s * math.exp(m - v) + one
            m = v
        elif v != neg_inf:  # -inf adds exp(-inf) = 0 (and avoids -inf - -inf); NaN poisons s
            s += math.exp(v - m)
        return m, s

    @device
    def finish(m, s):
        """(max, 1/sum, log(sum)) for the write pass; +inf in the row gives NaN.  Callers
        form (x - max) - log(sum): x - max is exact, so large offsets keep full precision."""
        if m == pos_inf:
            s = nan
        logs = neg_inf if s == zero else math.log(s)  # s == 0: all -inf; NaN s stays NaN
        return m, one / s, logs

    return acc, neg_inf, zero, one, update, finish


@lru_cache(maxsize=None)
def _row_passes(acc_np):
    """The two passes over a row shared by the warp- and block-per-row kernels: thread t of
    the row's `nt` reads elements t, t + nt, ... U (_jit.row_unroll) at a time into
    registers, their loads in flight together (one dependent load per element left the
    H200's SMs waiting, _jit.ROW_UNROLL); elements past the row's end are predicated off
    (read as -inf: they add 0), so a thread's last, partial step is unrolled too."""
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)
    U = row_unroll(acc_np)

    @device
    def update_chunk(m, s, v):
        """Online softmax state after the U elements of v (a local array, loaded together so
        that their loads are in flight at once): one rescale per chunk; -inf adds 0, NaN
        poisons s, as update()."""
        mx = m
        for u in range(U):
            if v[u] > mx:
                mx = v[u]
        if mx > m:
            s = s * math.exp(m - mx)
            m = mx
        for u in range(U):
            if v[u] != neg_inf:
                s += math.exp(v[u] - m)
        return m, s

    @device
    def read_rows_state(x, row, t, nt, n, m, s):
        v = cuda.local.array(U, acc)
        for j in range(t, n, nt * U):
            for u in range(U):
                v[u] = acc(x[row, uint64(j + nt * u)]) if j + nt * u < n else neg_inf
            m, s = update_chunk(m, s, v)
        return m, s

    @device
    def write_rows(x, out, row, t, nt, n, m, inv, logs, log):
        v = cuda.local.array(U, acc)
        for j in range(t, n, nt * U):
            for u in range(U):
                if j + nt * u < n:
                    v[u] = acc(x[row, uint64(j + nt * u)])
            for u in range(U):
                if j + nt * u < n:
                    out[row, uint64(j + nt * u)] = ((v[u] - m) - logs) if log else math.exp(v[u] - m) * inv

    return read_rows_state, write_rows


@lru_cache(maxsize=None)
def warp_rows(acc_np):
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)
    read_rows_state, write_rows = _row_passes(acc_np)

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 8))
    def softmax_warp_rows(x, out, log):
        rows, n = x.shape
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        if row >= rows:  # the whole warp leaves together
            return
        m, s = neg_inf, zero
        m, s = read_rows_state(x, row, lane, 32, n, m, s)
        m, s = warp_max_sumexp(m, s)
        m, inv, logs = finish(m, s)
        write_rows(x, out, row, lane, 32, n, m, inv, logs, log)

    return softmax_warp_rows


@lru_cache(maxsize=None)
def block_rows(acc_np):
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)
    read_rows_state, write_rows = _row_passes(acc_np)

    @kernel(launch_bounds=(BLOCK_ROWS_MAX_THREADS, 1))
    def softmax_block_rows(x, out, log):
        rows, n = x.shape
        sm = cuda.shared.array(32, acc)
        ss = cuda.shared.array(32, acc)
        t = cuda.threadIdx.x
        nt = cuda.blockDim.x
        row = cuda.blockIdx.x
        while row < rows:  # block-uniform loop: the barriers inside are safe
            m, s = neg_inf, zero
            m, s = read_rows_state(x, row, t, nt, n, m, s)
            m, s = block_max_sumexp(m, s, sm, ss, neg_inf, zero)
            m, inv, logs = finish(m, s)
            write_rows(x, out, row, t, nt, n, m, inv, logs, log)
            row += cuda.gridDim.x

    return softmax_block_rows


@lru_cache(maxsize=None)
def vec_rows(kind, acc_np, vec):
    """The row-in-registers kernel for kind "warp" / "block" (as norm.make_vec): each thread
    loads its share of a row once, VEC_ROW_ELEMENTS elements at most, as 16-byte vectors of
    `vec` elements (thread t of the row's nt holds vectors t, t + nt, ...), forms its (max,
    sum of exp(x - max)) from registers, merges it across the row as the streamed kernels do
    and writes with 16-byte stores: one read of the row where those read it twice.  Special
    values as theirs (finish()).  Requires n % vec == 0, n <= nt * VEC_ROW_ELEMENTS and
    16-byte aligned x and out (dispatch checks)."""
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)
    warp = kind == "warp"
    NV = VEC_ROW_ELEMENTS // vec
    load_vec, store_vec = vec_io(vec)

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 4) if warp else (VEC_ROWS_MAX_THREADS, 1))
    def softmax_vec_rows(x, out, log):
        rows, n = x.shape
        nvec = n // vec
        row, start, step, row_step = row_owner(warp, rows)
        if row >= rows:  # a warp past the last row leaves at once (its registers: 64 at most)
            return
        sm = cuda.shared.array(32, acc)
        ss = cuda.shared.array(32, acc)
        vs = cuda.local.array(VEC_ROW_ELEMENTS, acc)
        while row < rows:  # warp: runs once; block: block-uniform grid-stride loop
            m = neg_inf
            for k in range(NV):
                if start + k * step < nvec:
                    load_vec(x, (row, (start + k * step) * vec), vs, k * vec)
                    for i in range(vec):
                        if vs[k * vec + i] > m:
                            m = vs[k * vec + i]
            s = zero
            for k in range(NV):
                if start + k * step < nvec:
                    for i in range(vec):
                        if vs[k * vec + i] != neg_inf:  # -inf adds 0 (and avoids -inf - -inf); NaN poisons s
                            s += math.exp(vs[k * vec + i] - m)
            if warp:
                m, s = warp_max_sumexp(m, s)
            else:
                m, s = block_max_sumexp(m, s, sm, ss, neg_inf, zero)
            m, inv, logs = finish(m, s)
            for k in range(NV):
                if start + k * step < nvec:
                    for i in range(vec):
                        y = vs[k * vec + i]
                        vs[k * vec + i] = ((y - m) - logs) if log else math.exp(y - m) * inv
                    store_vec(out, (row, (start + k * step) * vec), vs, k * vec)
            row += row_step

    return softmax_vec_rows


@lru_cache(maxsize=None)
def stream_vec_rows(acc_np, vec):
    """block_rows with 16-byte vector loads and stores, for rows too long to hold in
    registers (vec_rows) or whose length is not a multiple of the vector (vocabularies:
    50257): a block per row (grid-stride), the row split into a head of h < vec elements up
    to the first 16-byte boundary (h = the row start's offset from one, the same in x and out:
    both start on a boundary), whole vectors, and a tail; the head and tail one element a
    thread, the vectors SV at a time a thread (16 elements in flight) in both passes (online
    (max, sum of exp) state, then the write).  Requires 16-byte aligned x and out (dispatch
    checks).  Special values as block_rows.  H200 GPU time, softmax (128, 50257): float16
    25.4 -> 16.5 us, float32 28.0 -> 23.6 (PyTorch 14.0 / 23.3; 2026-11-26c, 2026-11-27b)."""
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)
    SV = max(1, 16 // vec)       # vectors a thread has in flight
    E = SV * vec
    load_vec, store_vec = vec_io(vec)
    itemsize = 16 // vec

    # VEC_ROWS_MAX_THREADS: 128 registers a thread (under 1024 threads' 64 it spilled 36-40
    # bytes on sm_80)
    @kernel(launch_bounds=(VEC_ROWS_MAX_THREADS, 1))
    def softmax_stream_vec_rows(x, out, log):
        rows, n = x.shape
        sm = cuda.shared.array(32, acc)
        ss = cuda.shared.array(32, acc)
        t = cuda.threadIdx.x
        nt = cuda.blockDim.x
        vs = cuda.local.array(E, acc)
        row = cuda.blockIdx.x
        while row < rows:  # block-uniform loop: the barriers inside are safe
            rem = (row * n * itemsize) & 15
            h = min(n, ((16 - rem) & 15) // itemsize)  # elements before the first boundary
            nv = (n - h) // vec
            tail0 = h + nv * vec
            m, s = neg_inf, zero
            if t < h:
                m, s = update(m, s, acc(x[row, t]))
            if t < n - tail0:
                m, s = update(m, s, acc(x[row, tail0 + t]))
            for v0 in range(t, nv, nt * SV):
                mx = m
                for k in range(SV):
                    if v0 + k * nt < nv:
                        load_vec(x, (row, h + (v0 + k * nt) * vec), vs, k * vec)
                    else:
                        for i in range(vec):
                            vs[k * vec + i] = neg_inf
                for i in range(E):
                    if vs[i] > mx:
                        mx = vs[i]
                if mx > m:
                    s = s * math.exp(m - mx)
                    m = mx
                for i in range(E):
                    if vs[i] != neg_inf:  # -inf adds 0; NaN poisons s
                        s += math.exp(vs[i] - m)
            m, s = block_max_sumexp(m, s, sm, ss, neg_inf, zero)
            m, inv, logs = finish(m, s)
            if t < h:
                xv = acc(x[row, t])
                out[row, t] = ((xv - m) - logs) if log else math.exp(xv - m) * inv
            if t < n - tail0:
                xv = acc(x[row, tail0 + t])
                out[row, tail0 + t] = ((xv - m) - logs) if log else math.exp(xv - m) * inv
            for v0 in range(t, nv, nt * SV):
                for k in range(SV):
                    if v0 + k * nt < nv:
                        load_vec(x, (row, h + (v0 + k * nt) * vec), vs, k * vec)
                for k in range(SV):
                    if v0 + k * nt < nv:
                        for i in range(vec):
                            y = vs[k * vec + i]
                            vs[k * vec + i] = ((y - m) - logs) if log else math.exp(y - m) * inv
                        store_vec(out, (row, h + (v0 + k * nt) * vec), vs, k * vec)
            row += cuda.gridDim.x

    return softmax_stream_vec_rows


@lru_cache(maxsize=None)
def columns(acc_np):
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)

    @kernel
    def softmax_columns(x, out, log):
        outer, n, inner = x.shape
        g = cuda.grid(1)
        if g >= outer * inner:
            return
        o = g // inner
        i = g - o * inner
        m, s = neg_inf, zero
        for j in range(n):
            m, s = update(m, s, acc(x[o, j, i]))
        m, inv, logs = finish(m, s)
        if log:
            for j in range(n):
                out[o, j, i] = (acc(x[o, j, i]) - m) - logs
        else:
            for j in range(n):
                out[o, j, i] = math.exp(acc(x[o, j, i]) - m) * inv

    return softmax_columns


@lru_cache(maxsize=None)
def cross_entropy_rows(acc_np):
    """kernel(logits (N, C), targets (N,), ignore_index, losses (N,) acc, valid (N,) acc,
    bad (1,) int64 initialised to N): losses[i] = logsumexp - logits[i, t] (0 if ignored),
    valid[i] = 1/0, bad[0] = smallest row with an out-of-range target."""
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 8))
    def cross_entropy_warp_rows(logits, targets, ignore_index, losses, valid, bad):
        rows, c = logits.shape
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5)
        if row >= rows:
            return
        t = targets[row]
        if t == ignore_index:
            if lane == 0:
                losses[row] = zero
                valid[row] = zero
            return
        if t < 0 or t >= c:
            if lane == 0:
                cuda.atomic.min(bad, 0, row)
                losses[row] = zero
                valid[row] = zero
            return
        m, s = neg_inf, zero
        for j in range(lane, c, 32):
            m, s = update(m, s, acc(logits[row, j]))
        m, s = warp_max_sumexp(m, s)
        m, inv, logs = finish(m, s)
        if lane == 0:
            losses[row] = (m - acc(logits[row, t])) + logs
            valid[row] = one
        return

    return cross_entropy_warp_rows


@lru_cache(maxsize=None)
def cross_entropy_block_rows(acc_np):
    """As cross_entropy_rows with one block per row (grid-stride over rows): long rows
    (vocabularies), where one warp per row would leave most SMs idle."""
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)

    @kernel(launch_bounds=(BLOCK_ROWS_MAX_THREADS, 1))
    def cross_entropy_block_rows(logits, targets, ignore_index, losses, valid, bad):
        rows, c = logits.shape
        sm = cuda.shared.array(32, acc)
        ss = cuda.shared.array(32, acc)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        row = cuda.blockIdx.x
        while row < rows:  # block-uniform
            t = targets[row]
            if t == ignore_index or t < 0 or t >= c:
                if tid == 0:
                    if t != ignore_index:
                        cuda.atomic.min(bad, 0, row)
                    losses[row] = zero
                    valid[row] = zero
            else:
                m, s = neg_inf, zero
                for j in range(tid, c, nt):
                    m, s = update(m, s, acc(logits[row, j]))
                m, s = block_max_sumexp(m, s, sm, ss, neg_inf, zero)
                m, inv, logs = finish(m, s)
                if tid == 0:
                    losses[row] = (m - acc(logits[row, t])) + logs
                    valid[row] = one
            row += cuda.gridDim.x

    return cross_entropy_block_rows


@lru_cache(maxsize=None)
def sum_losses(acc_np):
    """One block: result[0] = sum(losses) (mean: / sum(valid), NaN when 0)."""
    acc, neg_inf, zero, one, update, finish = _helpers(acc_np)
    nan = acc_np(np.nan)

    @kernel(launch_bounds=(256,))
    def cross_entropy_reduce(losses, valid, mean, result):
        n = losses.shape[0]
        sa = cuda.shared.array(32, acc)
        sb = cuda.shared.array(32, acc)
        t = cuda.threadIdx.x
        a, b = zero, zero
        for j in range(t, n, cuda.blockDim.x):
            a += losses[j]
            b += valid[j]
        a, b = block_sum2(a, b, sa, sb, zero)
        if t == 0:
            if mean:
                result[0] = a / b if b > zero else nan
            else:
                result[0] = a

    return cross_entropy_reduce


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _ce_args(dt):
    return (arr(dt, 2), arr(types.int64, 1), types.int64, arr(acc_type(dt), 1), arr(acc_type(dt), 1),
            arr(types.int64, 1))


PTX = [
    PtxBuild("softmax.warp_rows", "softmax", lambda dt: warp_rows(acc_np(dt)),
             lambda dt: (arr(dt, 2), arr(dt, 2), types.boolean), threads=WARP_ROWS_THREADS),
    PtxBuild("softmax.block_rows", "softmax", lambda dt: block_rows(acc_np(dt)),
             lambda dt: (arr(dt, 2), arr(dt, 2), types.boolean), threads=BLOCK_ROWS_MAX_THREADS),
    *(PtxBuild(f"softmax.{kind}_vec_rows", "softmax",
               (lambda kind: lambda dt: vec_rows(kind, acc_np(dt), vec_width(np.dtype(str(dt)).itemsize)))(kind),
               lambda dt: (arr(dt, 2), arr(dt, 2), types.boolean),
               threads=WARP_ROWS_THREADS if kind == "warp" else VEC_ROWS_MAX_THREADS, dtypes=VEC_ROW_DTYPES)
      for kind in ("warp", "block")),
    PtxBuild("softmax.block_stream_vec_rows", "softmax",
             lambda dt: stream_vec_rows(acc_np(dt), vec_width(np.dtype(str(dt)).itemsize)),
             lambda dt: (arr(dt, 2), arr(dt, 2), types.boolean), threads=VEC_ROWS_MAX_THREADS, dtypes=VEC_ROW_DTYPES),
    PtxBuild("softmax.columns", "softmax", lambda dt: columns(acc_np(dt)),
             lambda dt: (arr(dt, 3), arr(dt, 3), types.boolean), threads=128),
    PtxBuild("cross_entropy.warp_rows", "softmax", lambda dt: cross_entropy_rows(acc_np(dt)), _ce_args,
             threads=WARP_ROWS_THREADS),
    PtxBuild("cross_entropy.block_rows", "softmax", lambda dt: cross_entropy_block_rows(acc_np(dt)), _ce_args,
             threads=BLOCK_ROWS_MAX_THREADS),
    PtxBuild("cross_entropy.reduce", "softmax", lambda dt: sum_losses(acc_np(dt)),
             lambda dt: (arr(acc_type(dt), 1), arr(acc_type(dt), 1), types.boolean, arr(dt, 1)), threads=256),
]
