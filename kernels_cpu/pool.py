"""2-D pooling over the planes of C-contiguous (P, H*W) arrays (P = N*C planes, each plane
a flat row-major H x W image), writing (P, OH*OW).

Window sizes, strides, paddings and dilations are runtime integers: one compiled kernel per
dtype.  adaptive pooling splits its work into output rows: row r of the P*OH rows is output
row r % OH of plane r // OH (plane and row counters stepped, window bounds from per-axis
tables: no division per output).

- max_pool / avg_pool (window_worker, called by address: one compiled worker per dtype
  for both ops, serial and parallel): per plane, the padded plane split into stride
  phases, then each window tap one long vector loop over the whole output plane (see
  window_worker); work is handed out in blocks of planes.
- max keeps NaN: m = v if (v > m or v != v) else m (PyTorch's rule; the fastmath flags
  exclude nnan, so the v != v test stays), a select the loop vectorizes.
- adaptive_avg_pool: per output element, the window [floor(i*n/o), ceil((i+1)*n/o)) on
  each axis; a window spanning whole rows (every output of width 1: global pooling,
  ResNet's 7x7 head) is one contiguous run of the flat plane, summed by one vectorized loop.
  Windows that tile the plane (n divisible by o on both axes, more than one output per
  row: VGG's 14 -> 7) run as an avg_pool with window = stride = n / o (window_worker).

Inner-loop indexes are cast to uintp (they are >= 0 by construction): numba wraps negative
signed indexes around (idx < 0 -> idx + n), a select per element that LLVM cannot drop
for an index that does not count up from 0, and that kept these loops scalar.

Sums accumulate in the input's dtype (windows are small; the global pool of a 7x7 plane
adds 49 terms).  The parallel kernels hand out blocks of output rows (parallel.tasks_for).
"""
import math

import numpy as np

import numba
from numba import carray, njit, prange
from numpy import uintp

from .approx import JIT, JIT_INNER, JIT_BY_ADDRESS, like
from .parallel import (TASKS_PER_THREAD, fetch_add, like_dtype, ptr_as, run_dynamic, run_serial, run_workers,
                       tasks_for, worker_address)


@njit(**JIT_INNER)
def adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, lo, hi):
    """Output rows lo..hi of the P*OH rows.  The window bounds come from per-axis tables made
    once per call and the plane / row counters are stepped, not divided: 64-bit divisions
    per output (five of them) made ResNet-50's global pool of 1x2048x7x7 35 us on one
    thread, 13-14 us with the tables (Sapphire Rapids, 2026-11-26)."""
    xf = x.ravel()
    of = out.ravel()
    zero = like(xf[0], 0.0)
    hw = h * w
    ys = np.empty(oh_n, np.int64)
    ye = np.empty(oh_n, np.int64)
    xs = np.empty(ow_n, np.int64)
    xe = np.empty(ow_n, np.int64)
    for i in range(oh_n):
        ys[i] = (i * h) // oh_n
        ye[i] = ((i + 1) * h + oh_n - 1) // oh_n
    for i in range(ow_n):
        xs[i] = (i * w) // ow_n
        xe[i] = ((i + 1) * w + ow_n - 1) // ow_n
    whole = ow_n == 1  # each window spans whole rows: one contiguous run of the flat plane
    p = lo // oh_n
    oy = lo - p * oh_n
    for r in range(lo, hi):
        xb = p * hw
        ob = r * ow_n
        y0, y1 = ys[oy], ye[oy]
        if whole:
            s = zero
            for k in range(xb + y0 * w, xb + y1 * w):
                s += xf[uintp(k)]
            of[uintp(ob)] = s / like(zero, (y1 - y0) * w)
        else:
            for q in range(ow_n):
                x0, x1 = xs[q], xe[q]
                s = zero
                for iy in range(y0, y1):
                    rb = xb + iy * w
                    for k in range(rb + x0, rb + x1):
                        s += xf[uintp(k)]
                of[uintp(ob + q)] = s / like(zero, (y1 - y0) * (x1 - x0))
        oy += 1
        if oy == oh_n:
            oy = 0
            p += 1


# ---- serial and parallel entry points (rows = P * OH output rows) ---------------------------

# The int64 argument block of window_worker.
(S_SYNC, S_X, S_OUT, S_PLANES, S_H, S_W, S_OH, S_OW, S_KH, S_KW, S_SH, S_SW, S_PH, S_PW, S_DH, S_DW, S_AVG,
 S_CIP, S_DIV, S_PER, S_COUNT) = range(21)


@njit(**JIT_BY_ADDRESS)
def window_worker(wk, params, is64):
    """Worker wk of a max / avg pooling call (the S_* slots): takes blocks of planes from the
    counter.  Per plane:
      1. the plane is split into sh x sw phases with its padding (-inf for max, 0 for
         avg; also past the bottom / right for ceil_mode): padded row r*sh + py goes to
         phase py, row r (likewise columns), so every window tap (ky, kx) reads one phase
         at a fixed offset and consecutive outputs read consecutive values;
      2. each tap is then one long vector loop over the whole output plane (row pitch
         Wq): max into the other of two buffers (in place, LLVM turns the NaN-keeping
         select into a vmaskmovps masked store), sums in place;
      3. the rows are copied out (avg: divided by PyTorch's divisor, the product of a row
         and a column factor, or divisor_override).
    Per output row and tap, as before, the loops were short (56 outputs) and strided: 0.75
    ms on one thread for ResNet-50's stem pool against onnxruntime's 0.27 ms on two."""
    p = carray(ptr_as(params, np.int64(0)), S_COUNT)
    z = like_dtype(is64)
    P, h, w, oh, ow = p[S_PLANES], p[S_H], p[S_W], p[S_OH], p[S_OW]
    kh, kw, sh, sw, ph, pw, dh, dw = p[S_KH], p[S_KW], p[S_SH], p[S_SW], p[S_PH], p[S_PW], p[S_DH], p[S_DW]
    avg, cip, divisor, per = p[S_AVG] != 0, p[S_CIP] != 0, p[S_DIV], p[S_PER]
    sync = carray(ptr_as(p[S_SYNC], np.int64(0)), 1)
    xf = carray(ptr_as(p[S_X], z), P * h * w)
    of = carray(ptr_as(p[S_OUT], z), P * oh * ow)
    hq = oh + (kh - 1) * dh // sh
    wq = ow + (kw - 1) * dw // sw
    pq = hq * wq
    fill = like(z, 0.0) if avg else like(z, -math.inf)
    xq = np.empty(sh * sw * pq, of.dtype)
    a = np.empty(oh * wq, of.dtype)
    b = np.empty(oh * wq, of.dtype)
    nt = (oh - 1) * wq + ow
    # one padded input row: columns [pw_lo, pw_hi) hold the image, the rest the fill
    trow = np.empty(wq * sw, of.dtype)
    pw_lo = min(pw, wq * sw)
    pw_hi = max(pw_lo, min(pw + w, wq * sw))
    # avg divisor factors: rows and columns
    rf = np.empty(oh, of.dtype)
    cf = np.empty(ow, of.dtype)
    for oy in range(oh):
        y0 = oy * sh - ph
        y1 = min(y0 + kh, h + ph)
        rf[oy] = (y1 - y0) if cip else (min(y1, h) - max(y0, 0))
    for ox in range(ow):
        x0 = ox * sw - pw
        x1 = min(x0 + kw, w + pw)
        cf[ox] = (x1 - x0) if cip else (min(x1, w) - max(x0, 0))
    dv = like(z, 1.0) * divisor
    while True:
        first = fetch_add(sync, 0, per)
        if first >= P:
            break
        for pl in range(first, min(first + per, P)):
            xb = pl * h * w
            for py in range(sh):
                for qy in range(hq):
                    iy = qy * sh + py - ph
                    d0 = (py * sw * hq + qy) * wq  # phase (py, 0), row qy
                    if iy < 0 or iy >= h:
                        for px in range(sw):
                            for qx in range(wq):
                                xq[uintp(d0 + px * pq + qx)] = fill
                        continue
                    # the padded input row, contiguous, then split into the sw column
                    # phases (for sw == 2 one loop over both: an interleaved pair LLVM
                    # vectorizes with shuffles; a single strided phase stayed scalar)
                    src = xb + iy * w
                    for c in range(pw_lo):
                        trow[uintp(c)] = fill
                    for c in range(pw_lo, pw_hi):
                        trow[uintp(c)] = xf[uintp(src + c - pw)]
                    for c in range(pw_hi, wq * sw):
                        trow[uintp(c)] = fill
                    if sw == 1:
                        for qx in range(wq):
                            xq[uintp(d0 + qx)] = trow[uintp(qx)]
                    elif sw == 2:
                        for qx in range(wq):
                            xq[uintp(d0 + qx)] = trow[uintp(2 * qx)]
                            xq[uintp(d0 + pq + qx)] = trow[uintp(2 * qx + 1)]
                    else:
                        for px in range(sw):
                            for qx in range(wq):
                                xq[uintp(d0 + px * pq + qx)] = trow[uintp(qx * sw + px)]
            cur = a
            nxt = b
            first_tap = True
            for ky in range(kh):
                for kx in range(kw):
                    ty, tx = ky * dh, kx * dw
                    off = (((ty % sh) * sw + tx % sw) * hq + ty // sh) * wq + tx // sw
                    if first_tap:
                        for o in range(nt):
                            cur[uintp(o)] = xq[uintp(off + o)]
                        first_tap = False
                    elif avg:
                        for o in range(nt):
                            cur[uintp(o)] += xq[uintp(off + o)]
                    else:
                        for o in range(nt):
                            v = xq[uintp(off + o)]
                            m = cur[uintp(o)]
                            nxt[uintp(o)] = v if (v > m or v != v) else m
                        cur, nxt = nxt, cur
            ob = pl * oh * ow
            for oy in range(oh):
                o0 = ob + oy * ow
                t0 = oy * wq
                if not avg:
                    for ox in range(ow):
                        of[uintp(o0 + ox)] = cur[uintp(t0 + ox)]
                elif divisor > 0:
                    for ox in range(ow):
                        of[uintp(o0 + ox)] = cur[uintp(t0 + ox)] / dv
                else:
                    r = rf[oy]
                    for ox in range(ow):
                        of[uintp(o0 + ox)] = cur[uintp(t0 + ox)] / (r * cf[ox])


def _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, avg, cip, divisor, nworkers):
    """Run window_worker over the planes of x (P, h*w) into out (P, oh_n*ow_n)."""
    P = x.shape[0]
    if P == 0 or oh_n * ow_n == 0:
        return
    for arr in (x, out):
        if not (arr.flags.c_contiguous and arr.dtype == out.dtype):
            raise ValueError(f"pooling: arrays must be C-contiguous {out.dtype}")
    sync = np.zeros(1, np.int64)
    p = np.zeros(S_COUNT, np.int64)
    p[S_SYNC], p[S_X], p[S_OUT] = sync.ctypes.data, x.ctypes.data, out.ctypes.data
    p[S_PLANES], p[S_H], p[S_W], p[S_OH], p[S_OW] = P, h, w, oh_n, ow_n
    p[S_KH], p[S_KW], p[S_SH], p[S_SW], p[S_PH], p[S_PW], p[S_DH], p[S_DW] = kh, kw, sh, sw, ph, pw, dh, dw
    p[S_AVG], p[S_CIP], p[S_DIV] = avg, cip, divisor
    fn = worker_address(window_worker, (bool(out.dtype == np.float64),))
    if nworkers <= 1:
        p[S_PER] = P
        run_serial(fn, p)
    else:
        p[S_PER] = max(1, P // (nworkers * TASKS_PER_THREAD))
        run_workers(fn, p, min(nworkers, P))


def max_pool_serial(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw):
    """x: (P, h*w) planes, out: (P, oh_n*ow_n); on the calling thread."""
    _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, 0, 0, 0, 1)


def max_pool_parallel(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw):
    """max_pool_serial's result, blocks of planes over numba's threads (dynamic hand-out)."""
    _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, 0, 0, 0, numba.get_num_threads())


def avg_pool_serial(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor):
    """As max_pool_serial; PyTorch's divisor (count_include_pad, divisor_override > 0)."""
    _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, 1, 1, 1, bool(count_include_pad), divisor, 1)


def avg_pool_parallel(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor):
    """avg_pool_serial's result, blocks of planes over numba's threads."""
    _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, 1, 1, 1, bool(count_include_pad), divisor,
            numba.get_num_threads())


@njit(**JIT)
def _adaptive_avg_pool_serial(x, out, h, w, oh_n, ow_n):
    adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, 0, x.shape[0] * oh_n)


@njit(parallel=True, **JIT)
def _adaptive_avg_pool_parallel(x, out, h, w, oh_n, ow_n, tasks):
    n = x.shape[0] * oh_n
    for k in prange(tasks):
        adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, k * n // tasks, (k + 1) * n // tasks)


def _tiles(h, w, oh_n, ow_n):
    """Whether adaptive pooling from (h, w) to (oh_n, ow_n) is an avg_pool of window =
    stride = (h / oh_n, w / ow_n) (the windows tile the plane), with more than one output
    per row: then window_worker's vector loop per tap runs it (VGG's 14 -> 7 head, 512
    planes: 200 us by rows on one thread, 107 us as an avg_pool, Sapphire Rapids
    2026-11-26).  Global pooling (one output per row) keeps the contiguous runs of
    adaptive_avg_pool_rows."""
    return h % oh_n == 0 and w % ow_n == 0 and ow_n > 1


def _adaptive(x, out, h, w, oh_n, ow_n, nworkers):
    if _tiles(h, w, oh_n, ow_n):
        kh, kw = h // oh_n, w // ow_n
        _window(x, out, h, w, oh_n, ow_n, kh, kw, kh, kw, 0, 0, 1, 1, 1, 1, 0, nworkers)
    elif nworkers <= 1:
        _adaptive_avg_pool_serial(x, out, h, w, oh_n, ow_n)
    else:
        run_dynamic(_adaptive_avg_pool_parallel, tasks_for(x.shape[0] * oh_n), x, out, h, w, oh_n, ow_n)


def adaptive_avg_pool_serial(x, out, h, w, oh_n, ow_n):
    """x: (P, h*w) planes, out: (P, oh_n*ow_n): PyTorch's adaptive windows
    [floor(i*n/o), ceil((i+1)*n/o)) per axis; on the calling thread."""
    _adaptive(x, out, h, w, oh_n, ow_n, 1)


def adaptive_avg_pool_parallel(x, out, h, w, oh_n, ow_n):
    """adaptive_avg_pool_serial's result, over numba's threads: blocks of planes (tiling
    windows) or of output rows."""
    _adaptive(x, out, h, w, oh_n, ow_n, numba.get_num_threads())
