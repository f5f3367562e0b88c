"""Nearest and bilinear resampling of image planes, row by row, from per-axis tables.

x: (planes * H, W) and out: (planes * Ho, Wo), C-contiguous (the N*C planes of an NCHW
array stacked); output row r is row oy = r % Ho of plane p = r // Ho.  Where each output
pixel reads from comes in per-axis tables made by the caller (int32 source indices and, for
bilinear, weights in x's dtype), so the kernels do no coordinate arithmetic.

- nearest: the output row gathers columns iw[j] of input row ih[oy]; when the table says
  "each input column twice" (w2x: the U-Net's 2x upsample) each input element is stored
  twice instead (no gather); an output row reading the same input row as the row before it
  (every second row at 2x) is a contiguous copy of that row, when this task wrote it.
- bilinear (separable): tmp = l0 * row(i0) + l1 * row(i1) over the W input columns
  (contiguous, vectorized), then out[j] = lw0[j] * tmp[iw0[j]] + lw1[j] * tmp[iw1[j]].
  Both weights multiply, zero included, so a NaN (or inf) neighbour gives NaN as in PyTorch.

Parallel variants split the output rows of all planes into blocks handed out dynamically
(parallel.run_dynamic / tasks_for).
"""
import numpy as np
from numba import njit, prange

from .approx import JIT, JIT_INNER
from .parallel import row_of, run_dynamic, tasks_for


@njit(**JIT_INNER)
def nearest_rows(x, out, h, ho, ih, iw, w2x, lo, hi):
    w = x.shape[1]
    wo = out.shape[1]
    for r in range(lo, hi):
        p = r // ho
        oy = r - p * ho
        orow = row_of(out, r)
        if r > lo and oy > 0 and ih[oy] == ih[oy - 1]:
            prev = row_of(out, r - 1)
            for j in range(wo):
                orow[j] = prev[j]
            continue
        src = row_of(x, p * h + ih[oy])
        if w2x:
            for j in range(w):
                v = src[j]
                orow[2 * j] = v
                orow[2 * j + 1] = v
        else:
            for j in range(wo):
                orow[j] = src[iw[j]]


@njit(**JIT_INNER)
def bilinear_rows(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, lo, hi):
    w = x.shape[1]
    wo = out.shape[1]
    tmp = np.empty(w, x.dtype)
    for r in range(lo, hi):
        p = r // ho
        oy = r - p * ho
        a = row_of(x, p * h + ih0[oy])
        b = row_of(x, p * h + ih1[oy])
        l0 = lh0[oy]
        l1 = lh1[oy]
        for j in range(w):
            tmp[j] = l0 * a[j] + l1 * b[j]
        orow = row_of(out, r)
        for j in range(wo):
            orow[j] = lw0[j] * tmp[iw0[j]] + lw1[j] * tmp[iw1[j]]


@njit(**JIT)
def nearest_serial(x, out, h, ho, ih, iw, w2x):
    nearest_rows(x, out, h, ho, ih, iw, w2x, 0, out.shape[0])


@njit(parallel=True, **JIT)
def _nearest_parallel(x, out, h, ho, ih, iw, w2x, tasks):
    n = out.shape[0]
    for k in prange(tasks):
        nearest_rows(x, out, h, ho, ih, iw, w2x, k * n // tasks, (k + 1) * n // tasks)


def nearest_parallel(x, out, h, ho, ih, iw, w2x):
    """nearest_serial's result, blocks of output rows split over numba's threads."""
    run_dynamic(_nearest_parallel, tasks_for(out.shape[0]), x, out, h, ho, ih, iw, w2x)


@njit(**JIT)
def bilinear_serial(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1):
    bilinear_rows(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, 0, out.shape[0])


@njit(parallel=True, **JIT)
def _bilinear_parallel(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, tasks):
    n = out.shape[0]
    for k in prange(tasks):
        bilinear_rows(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, k * n // tasks, (k + 1) * n // tasks)


def bilinear_parallel(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1):
    """bilinear_serial's result, blocks of output rows split over numba's threads."""
    run_dynamic(_bilinear_parallel, tasks_for(out.shape[0]), x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1)
