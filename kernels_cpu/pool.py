"""2-D pooling over the planes of C-contiguous (P, H*W) arrays (P = N*C planes, each plane
a flat row-major H x W image), writing (P, OH*OW).

The work is split into output rows: row r of the P*OH rows is output row r % OH of plane
r // OH (one integer division per output row, none per element).  Window sizes, strides,
paddings and dilations are runtime integers: one compiled kernel per op and dtype.

- max_pool / avg_pool: the output row is the accumulator.  It is initialized (-inf / 0),
  then for every window row i that falls inside the image and every window column j, one
  pass over the output row adds (or maxes) the input row shifted by j: the valid output
  columns [qlo, qhi) of that shift are computed once per (row, i, j), so the innermost
  loop has no bounds test and runs along W over contiguous memory (stride 1: a vectorized
  loop; stride s: every s-th element, scalar).  avg_pool then divides by PyTorch's divisor
  (computed per column with integer min/max, no integer division).
- max keeps NaN: m = v if (v > m or v != v) else m (PyTorch's rule; the fastmath flags
  exclude nnan, so the v != v test stays), a select the loop vectorizes.
- adaptive_avg_pool: per output element, the window [floor(i*n/o), ceil((i+1)*n/o)) on
  each axis; a window spanning whole rows (every output of width 1: global pooling,
  ResNet's 7x7 head) is one contiguous run of the flat plane, summed by one vectorized loop.

Inner-loop indexes are cast to uintp (they are >= 0 by construction): numba wraps negative
signed indexes around (idx < 0 -> idx + n), a select per element that LLVM cannot drop
for an index that does not count up from 0, and that kept these loops scalar.

Sums accumulate in the input's dtype (windows are small; the global pool of a 7x7 plane
adds 49 terms).  The parallel kernels hand out blocks of output rows (parallel.tasks_for).
"""
import math

import numpy as np

from numba import njit, prange
from numpy import uintp

from .approx import JIT, like
from .parallel import row_of, run_dynamic, tasks_for


@njit(**JIT)
def _shift_range(off, s, w, ow_n):
    """[qlo, qhi): the output columns q with 0 <= q*s + off < w."""
    qlo = 0
    if off < 0:
        qlo = (-off + s - 1) // s
    last = w - 1 - off
    qhi = 0
    if last >= 0:
        qhi = min(ow_n, last // s + 1)
    return qlo, qhi


@njit(**JIT)
def max_pool_rows(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, lo, hi):
    ninf = like(x[0, 0], -math.inf)
    # two scratch rows, written alternately: each window element's pass reads one and writes
    # the other.  In place (acc[q] = v if v > acc[q] else acc[q]) LLVM turns the select into
    # a masked store of v (vmaskmovps: microcoded on x86, slower than the scalar loop).
    buf = np.empty((2, ow_n), x.dtype)
    # each window column's valid output columns, once per call (two integer divisions
    # per row and window element were most of the time: 0.82 ms of the ResNet stem's pool)
    qr = np.empty((kw, 2), np.int64)
    for j in range(kw):
        qr[j, 0], qr[j, 1] = _shift_range(j * dw - pw, sw, w, ow_n)
    for r in range(lo, hi):
        p = r // oh_n
        oy = r - p * oh_n
        xp = row_of(x, p)
        op = row_of(out, p)
        bo = oy * ow_n
        cur = 0
        acc = row_of(buf, 0)
        for q in range(ow_n):
            acc[q] = ninf
        y0 = oy * sh - ph
        for i in range(kh):
            iy = y0 + i * dh
            if iy < 0 or iy >= h:
                continue
            bx = iy * w
            for j in range(kw):
                off = j * dw - pw
                qlo, qhi = qr[j, 0], qr[j, 1]
                src = bx + off
                a = row_of(buf, cur)
                b = row_of(buf, 1 - cur)
                for q in range(qlo):
                    b[q] = a[q]
                # strides 1 and 2 as loops of their own: LLVM vectorizes both (contiguous /
                # interleaved loads); another runtime stride stays scalar
                if sw == 1:
                    for q in range(qlo, qhi):
                        v = xp[uintp(src + q)]
                        m = a[uintp(q)]
                        b[uintp(q)] = v if (v > m or v != v) else m
                elif sw == 2:
                    for q in range(qlo, qhi):
                        v = xp[uintp(src + 2 * q)]
                        m = a[uintp(q)]
                        b[uintp(q)] = v if (v > m or v != v) else m
                else:
                    for q in range(qlo, qhi):
                        v = xp[uintp(src + q * sw)]
                        m = a[uintp(q)]
                        b[uintp(q)] = v if (v > m or v != v) else m
                for q in range(qhi, ow_n):
                    b[uintp(q)] = a[uintp(q)]
                cur = 1 - cur
        acc = row_of(buf, cur)
        for q in range(ow_n):
            op[uintp(bo + q)] = acc[q]


@njit(**JIT)
def avg_pool_rows(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, lo, hi):
    zero = like(x[0, 0], 0.0)
    qr = np.empty((kw, 2), np.int64)  # as in max_pool_rows
    for j in range(kw):
        qr[j, 0], qr[j, 1] = _shift_range(j - pw, sw, w, ow_n)
    # the divisor of each output column does not depend on the row except through the
    # window's rows: its column factors, once per call
    cfull = np.empty(ow_n, x.dtype)
    cin_ = np.empty(ow_n, x.dtype)
    for q in range(ow_n):
        x0 = q * sw - pw
        x1 = min(x0 + kw, w + pw)
        cfull[q] = x1 - x0
        cin_[q] = min(x1, w) - max(x0, 0)
    for r in range(lo, hi):
        p = r // oh_n
        oy = r - p * oh_n
        xp = row_of(x, p)
        op = row_of(out, p)
        bo = oy * ow_n
        for q in range(ow_n):
            op[bo + q] = zero
        y0 = oy * sh - ph
        y1 = min(y0 + kh, h + ph)
        pool_h = y1 - y0
        ys = max(y0, 0)
        ye = min(y1, h)
        for iy in range(ys, ye):
            bx = iy * w
            for j in range(kw):
                off = j - pw
                qlo, qhi = qr[j, 0], qr[j, 1]
                src = bx + off
                if sw == 1:  # the vectorized stride-1 and 2 loops, as in max_pool_rows
                    for q in range(qlo, qhi):
                        op[uintp(bo + q)] += xp[uintp(src + q)]
                elif sw == 2:
                    for q in range(qlo, qhi):
                        op[uintp(bo + q)] += xp[uintp(src + 2 * q)]
                else:
                    for q in range(qlo, qhi):
                        op[uintp(bo + q)] += xp[uintp(src + q * sw)]
        rows_in = ye - ys
        if divisor > 0:
            dv = like(zero, divisor)
            for q in range(ow_n):
                op[uintp(bo + q)] = op[uintp(bo + q)] / dv
        elif count_include_pad:
            ph_ = like(zero, pool_h)
            for q in range(ow_n):
                op[uintp(bo + q)] = op[uintp(bo + q)] / (ph_ * cfull[q])
        else:
            ri = like(zero, rows_in)
            for q in range(ow_n):
                op[uintp(bo + q)] = op[uintp(bo + q)] / (ri * cin_[q])


@njit(**JIT)
def adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, lo, hi):
    zero = like(x[0, 0], 0.0)
    for r in range(lo, hi):
        p = r // oh_n
        oy = r - p * oh_n
        xp = row_of(x, p)
        op = row_of(out, p)
        bo = oy * ow_n
        ys = (oy * h) // oh_n
        ye = ((oy + 1) * h + oh_n - 1) // oh_n
        for q in range(ow_n):
            xs = (q * w) // ow_n
            xe = ((q + 1) * w + ow_n - 1) // ow_n
            s = zero
            if xs == 0 and xe == w:  # whole rows: one contiguous run of the plane
                for k in range(ys * w, ye * w):
                    s += xp[uintp(k)]
            else:
                for iy in range(ys, ye):
                    for k in range(iy * w + xs, iy * w + xe):
                        s += xp[uintp(k)]
            op[bo + q] = s / like(zero, (ye - ys) * (xe - xs))


# ---- serial and parallel entry points (rows = P * OH output rows) ---------------------------

@njit(**JIT)
def max_pool_serial(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw):
    max_pool_rows(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, 0, x.shape[0] * oh_n)


@njit(parallel=True, **JIT)
def _max_pool_parallel(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, tasks):
    n = x.shape[0] * oh_n
    for k in prange(tasks):
        max_pool_rows(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, k * n // tasks, (k + 1) * n // tasks)


def max_pool_parallel(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw):
    """max_pool_serial's result, blocks of output rows split over numba's threads."""
    run_dynamic(_max_pool_parallel, tasks_for(x.shape[0] * oh_n), x, out, h, w, oh_n, ow_n,
                kh, kw, sh, sw, ph, pw, dh, dw)


@njit(**JIT)
def avg_pool_serial(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor):
    avg_pool_rows(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, 0,
                  x.shape[0] * oh_n)


@njit(parallel=True, **JIT)
def _avg_pool_parallel(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, tasks):
    n = x.shape[0] * oh_n
    for k in prange(tasks):
        avg_pool_rows(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor,
                      k * n // tasks, (k + 1) * n // tasks)


def avg_pool_parallel(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor):
    """avg_pool_serial's result, blocks of output rows split over numba's threads."""
    run_dynamic(_avg_pool_parallel, tasks_for(x.shape[0] * oh_n), x, out, h, w, oh_n, ow_n,
                kh, kw, sh, sw, ph, pw, count_include_pad, divisor)


@njit(**JIT)
def adaptive_avg_pool_serial(x, out, h, w, oh_n, ow_n):
    adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, 0, x.shape[0] * oh_n)


@njit(parallel=True, **JIT)
def _adaptive_avg_pool_parallel(x, out, h, w, oh_n, ow_n, tasks):
    n = x.shape[0] * oh_n
    for k in prange(tasks):
        adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, k * n // tasks, (k + 1) * n // tasks)


def adaptive_avg_pool_parallel(x, out, h, w, oh_n, ow_n):
    """adaptive_avg_pool_serial's result, blocks of output rows split over numba's threads."""
    run_dynamic(_adaptive_avg_pool_parallel, tasks_for(x.shape[0] * oh_n), x, out, h, w, oh_n, ow_n)
