"""Nearest and bilinear resampling of image planes, row by row, from per-axis tables.

x: (planes * H, W) and out: (planes * Ho, Wo), C-contiguous (the N*C planes of an NCHW
array stacked); output row r is row oy = r % Ho of plane p = r // Ho.  Where each output
pixel reads from comes in per-axis tables made by the caller (int32 source indices and, for
bilinear, weights in x's dtype), so the kernels do no coordinate arithmetic.

- nearest: the output row gathers columns iw[j] of input row ih[oy]; when the table says
  "each input column twice" (w2x: the U-Net's 2x upsample) each input element is stored
  twice instead (no gather), in vector chunks (_twice_chunk: one load, two lane-doubling
  shuffles), into this output row and the next when that one reads the same input row
  (2x); otherwise an output row reading the same input row as the row before it is a
  contiguous copy of that row, when this task wrote it.  The loop LLVM vectorized needed
  rows of 32+ values and ran scalar on a 16-wide plane: 2x of 1x1280x16x16 on Zen 5
  (2026-11-26, medians of 9, 1 / 2 threads) 262-289 / 142-154 us -> 96-101 / 58-78.
- bilinear (separable): tmp = l0 * row(i0) + l1 * row(i1) over the W input columns
  (contiguous, vectorized), then out[j] = lw0[j] * tmp[iw0[j]] + lw1[j] * tmp[iw1[j]].
  Both weights multiply, zero included, so a NaN (or inf) neighbour gives NaN as in PyTorch.
  When the width table says "2x, half-pixel centres" (w2x: Wo = 2W, out[2j + 1] = 3/4
  tmp[j] + 1/4 tmp[j + 1], out[2j + 2] = 1/4 tmp[j] + 3/4 tmp[j + 1], what the table holds
  for align_corners=False), the interior runs as that loop over pairs of neighbours
  (contiguous loads, paired stores: LLVM vectorizes it) instead of the table's gathers, the
  same products; the two edge columns keep the table.  FPN's 1x256x32x32 -> 64x64, float32,
  one thread (Xeon with AMX, 2026-12-07, /tmp/w/bil.py): 1345 us through the gathers, 315
  as a standalone loop of this form.

Parallel variants let the team's threads claim ranges of the output rows of all planes
(parallel.row_run).
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .approx import JIT, JIT_BY_ADDRESS, JIT_INNER
from .llvm_ir import lane_mask, masked_ops
from .parallel import (RW_D, RW_I, RW_I2, RW_I3, RW_I4, RW_MORE, RW_N, c_array_at, launch, like_dtype, only_if,
                       row_args, row_block, row_claim, row_of, row_run, worker_address)
from .planes import arg_access, vector_type


@intrinsic
def _twice_chunk(typingctx, o, d, src, s, n):
    """o[d + 2i] = o[d + 2i + 1] = src[s + i] for i < k = min(n, L) (L = lanes(dtype)): one
    vector load, two lane-doubling shuffles, two stores (masked for a row's last part).
    Returns L."""
    if not (isinstance(src, types.Array) and src.dtype in (types.float32, types.float64)
            and isinstance(o, types.Array) and o.dtype == src.dtype):
        return None

    def codegen(context, builder, sig, args):
        width, _, vty = vector_type(context, sig.args[2].dtype)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        i64_of, at = arg_access(context, builder, sig, args)

        n = i64_of(4)
        load, store = masked_ops(builder, vty)
        half = width // 2
        dup = [ir.Constant(ir.VectorType(i32, width), [h * half + i // 2 for i in range(width)]) for h in (0, 1)]
        # a whole vector with plain loads and stores, masked ones only for a row's last part
        # (1x1280x16x16 2x on Zen 5, one thread: 129 us all masked, 96-101 so)
        with builder.if_else(builder.icmp_signed(">=", n, ir.Constant(i64, width))) as (full, part):
            with full:
                v = builder.load(builder.bitcast(at(2, i64_of(3)), vty.as_pointer()), align=1)
                for h in (0, 1):  # vector h doubles lanes h*half .. h*half + half - 1 of v
                    vec = builder.shuffle_vector(v, v, dup[h])
                    ptr = at(0, builder.add(i64_of(1), ir.Constant(i64, h * width)))
                    builder.store(vec, builder.bitcast(ptr, vty.as_pointer()), align=1)
            with part:
                k = builder.trunc(n, i32)
                v = load(at(2, i64_of(3)), lane_mask(builder, ir.Constant(i32, 0), k, width))
                k2 = builder.add(k, k)  # values written per row: lanes < k2 of the pair of vectors
                for h in (0, 1):
                    vec = builder.shuffle_vector(v, v, dup[h])
                    mask = lane_mask(builder, ir.Constant(i32, 0), builder.sub(k2, ir.Constant(i32, h * width)),
                                     width)
                    store(vec, at(0, builder.add(i64_of(1), ir.Constant(i64, h * width))), mask)
        return ir.Constant(i64, width)

    return types.int64(o, d, src, s, n), codegen


@njit(**JIT_INNER)
def nearest_rows(x, out, h, ho, ih, iw, w2x, lo, hi):
    w = x.shape[1]
    wo = out.shape[1]
    r = lo
    while r < hi:
        p = r // ho
        oy = r - p * ho
        orow = row_of(out, r)
        if r > lo and oy > 0 and ih[oy] == ih[oy - 1]:
            prev = row_of(out, r - 1)
            for j in range(wo):
                orow[j] = prev[j]
            r += 1
            continue
        src = row_of(x, p * h + ih[oy])
        if w2x:
            # each input column twice; the next output row too when it reads the same input
            # row (the 2x upsample), one row after the other (the two rows' stores
            # interleaved ran 64-wide rows at 1.6x the time on Zen 5: 830-900 us for 520-540)
            both = r + 1 < hi and oy + 1 < ho and ih[oy + 1] == ih[oy]
            j = 0
            while j < w:
                j += _twice_chunk(orow, 2 * j, src, j, w - j)
            if both:
                orow2 = row_of(out, r + 1)
                j = 0
                while j < w:
                    j += _twice_chunk(orow2, 2 * j, src, j, w - j)
            r += 2 if both else 1
            continue
        for j in range(wo):
            orow[j] = src[iw[j]]
        r += 1


@njit(inline="always")
def _table_col(orow, tmp, j, iw0, iw1, lw0, lw1):
    """Output column j of a bilinear row from tmp through the width table."""
    orow[j] = lw0[j] * tmp[iw0[j]] + lw1[j] * tmp[iw1[j]]


# nearest_rows / bilinear_rows keep LLVM's 8-lane loops on AVX-512: with approx.wide_loops
# (loop medians, old / new trees alternating three times, Xeon with AMX, 2026-12-07, 2
# threads) DeepLab's 8x bilinear took 2.63-2.83 -> 3.24-4.17 ms (its gathers), the 2x cases
# within noise.
@njit(**JIT_INNER)
def bilinear_rows(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, w2x, lo, hi):
    w = x.shape[1]
    wo = out.shape[1]
    tmp = np.empty(w, x.dtype)
    quarter, three = x.dtype.type(0.25), x.dtype.type(0.75)
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
        if w2x:  # 2x: the interior from neighbour pairs (the table's weights, 3/4 and 1/4)
            for j in range(w - 1):
                t0 = tmp[j]
                t1 = tmp[j + 1]
                orow[2 * j + 1] = three * t0 + quarter * t1
                orow[2 * j + 2] = quarter * t0 + three * t1
            _table_col(orow, tmp, 0, iw0, iw1, lw0, lw1)
            _table_col(orow, tmp, wo - 1, iw0, iw1, lw0, lw1)
        else:
            for j in range(wo):
                _table_col(orow, tmp, j, iw0, iw1, lw0, lw1)


@njit(**JIT)
def nearest_serial(x, out, h, ho, ih, iw, w2x):
    nearest_rows(x, out, h, ho, ih, iw, w2x, 0, out.shape[0])


@njit(**JIT_BY_ADDRESS)
def resample_worker(me, params, is64, bilinear):
    """Output rows claimed from the block (parallel.row_block: n = planes * Ho rows of d =
    Wo, i = h, i2 = ho, i3 = w2x, i4 = W; arrays x, out, then the tables: nearest ih (slot
    2) and iw (RW_MORE); bilinear ih0, ih1, lh0, lh1 (slots 2-5), iw0, iw1, lw0, lw1
    (RW_MORE..))."""
    p, _ = row_args(params)
    z = like_dtype(is64)
    n, wo, h, ho, w = p[RW_N], p[RW_D], p[RW_I], p[RW_I2], p[RW_I4]
    x = c_array_at(p[0], z, ((n // ho) * h, w))
    out = c_array_at(p[1], z, (n, wo))
    i32 = np.int32(0)
    lo, hi = row_claim(p, me)
    if bilinear is not None:
        ih0, ih1 = c_array_at(p[2], i32, (ho,)), c_array_at(p[3], i32, (ho,))
        lh0, lh1 = c_array_at(p[4], z, (ho,)), c_array_at(p[5], z, (ho,))
        iw0, iw1 = c_array_at(p[RW_MORE], i32, (wo,)), c_array_at(p[RW_MORE + 1], i32, (wo,))
        lw0, lw1 = c_array_at(p[RW_MORE + 2], z, (wo,)), c_array_at(p[RW_MORE + 3], z, (wo,))
        w2x = p[RW_I3] != 0
        while lo < hi:
            bilinear_rows(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, w2x, lo, hi)
            lo, hi = row_claim(p, me)
    else:
        ih, iw = c_array_at(p[2], i32, (ho,)), c_array_at(p[RW_MORE], i32, (wo,))
        w2x = p[RW_I3] != 0
        while lo < hi:
            nearest_rows(x, out, h, ho, ih, iw, w2x, lo, hi)
            lo, hi = row_claim(p, me)


@njit(**JIT)
def _launch(x, out, h, ho, w2x, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, worker, nw, fn, buf, team_run, team_state):
    workers = row_block(buf, out.shape[0], out.shape[1], 0.0, h, ho, w2x, 1, nw, fn)
    buf[RW_I4] = x.shape[1]
    buf[0], buf[1], buf[2], buf[3] = x.ctypes.data, out.ctypes.data, ih0.ctypes.data, ih1.ctypes.data
    buf[4], buf[5] = lh0.ctypes.data, lh1.ctypes.data
    buf[RW_MORE], buf[RW_MORE + 1] = iw0.ctypes.data, iw1.ctypes.data
    buf[RW_MORE + 2], buf[RW_MORE + 3] = lw0.ctypes.data, lw1.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def nearest_parallel(x, out, h, ho, ih, iw, w2x):
    """nearest_serial's result, output rows claimed by the team's threads (parallel.row_run)."""
    w = worker_address(resample_worker, (bool(x.dtype == np.float64), only_if(False)))
    row_run(_launch, w, x, out, h, ho, w2x, ih, ih, out, out, iw, iw, out, out)


@njit(**JIT)
def bilinear_serial(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, w2x):
    bilinear_rows(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, w2x, 0, out.shape[0])


def bilinear_parallel(x, out, h, ho, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1, w2x):
    """bilinear_serial's result, output rows claimed by the team's threads (parallel.row_run)."""
    w = worker_address(resample_worker, (bool(x.dtype == np.float64), only_if(True)))
    row_run(_launch, w, x, out, h, ho, w2x, ih0, ih1, lh0, lh1, iw0, iw1, lw0, lw1)
