"""layer_norm / rms_norm over the last dimension, with the fused residual add.

x, residual, h, out: (rows, D) C-contiguous; w, b: (D,) (a 1-element dummy when absent,
flagged by has_w / has_b).  With has_res, pass 1 forms h = x + residual, writes it and
the later passes read h back (each thread reads only the elements it wrote itself, so no
barrier is needed).  layer_norm uses two reductions, the corrected two-pass algorithm
(as kernels_cpu/norm.py): s = sum(h - h[0]) gives m0 = h[0] + s / D (shifting by the row's
first element makes a constant row exact: m0 == c, output == bias), then sd = sum(h - m0)
and q = sum((h - m0)^2) give the mean's remainder mc = sd / D (the rounding of m0 to the
accumulation type, which would otherwise cost up to ulp(mean) / 2 in every output: 5e-4 at
a float32 offset of 1e4) and var = q / D - mc^2; the output is ((h - m0) - mc) * rstd
(no fastmath on the GPU: evaluated as written).  rms_norm has one reduction (a sum of
squares: nothing cancels).
- warp_rows: one warp per row (block of W warps = W rows), shuffles only;
- block_rows: one block per row, grid-stride over rows, shuffles + 32 shared slots.
"""
import math
from functools import lru_cache

import numpy as np

from numba import cuda, types, uint64

from ._jit import (BLOCK_ROWS_MAX_THREADS, VEC_ROW_DTYPES, VEC_ROW_ELEMENTS, VEC_ROWS_MAX_THREADS, WARP_ROWS_THREADS,
                   PtxBuild, acc_np, acc_of, arr, device, kernel, row_unroll)
from .primitives import block_sum, block_sum2, row_owner, vec_io, vec_width, warp_sum, warp_sum2


@lru_cache(maxsize=None)
def _row_stats(acc_np, warp):
    """The reductions both kernels (make, make_vec) turn a thread's partial sums into: the
    row's sum over the warp (warp) or the block, then rms_norm's rstd, or layer_norm's m0
    and its (mc, rstd) (the algorithm of the module docstring)."""
    acc, _ = acc_of(acc_np)
    zero, one = acc_np(0.0), acc_np(1.0)

    @device
    def row_sum(v, scratch):
        return warp_sum(v) if warp else block_sum(v, scratch, zero)

    @device
    def rms_rstd(s1, inv_d, epsa, scratch):
        return one / math.sqrt(row_sum(s1, scratch) * inv_d + epsa)

    @device
    def shifted_mean(s1, x0, inv_d, scratch):
        return x0 + row_sum(s1, scratch) * inv_d  # m0

    @device
    def centered_rstd(sd, s2, inv_d, epsa, scratch, scratch2):
        if warp:
            sd, s2 = warp_sum2(sd, s2)
        else:
            sd, s2 = block_sum2(sd, s2, scratch, scratch2, zero)
        mc = sd * inv_d
        return mc, one / math.sqrt(max(s2 * inv_d - mc * mc, zero) + epsa)

    return rms_rstd, shifted_mean, centered_rstd


@lru_cache(maxsize=None)
def make(kind, rms, acc_np):
    """The kernel for kind "warp" / "block", rms (True: rms_norm), accumulation type."""
    acc, _ = acc_of(acc_np)
    zero, one = acc_np(0.0), acc_np(1.0)
    warp = kind == "warp"
    rms_rstd, shifted_mean, centered_rstd = _row_stats(acc_np, warp)
    # fewer than a softmax's step: the residual, weight and bias paths hold more per element
    # (ptxas sm_80/90 under the 64-register cap: at 8 float32 elements every build spilled,
    # at 4 layer_norm's still did)
    U = max(1, row_unroll(acc_np) // (2 if rms else 4))
    # (the guards below read `U == 1 or ...`: with one element a step the range's own bound
    # suffices, and folding the test away keeps float64's builds within their registers)

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 8) if warp else (BLOCK_ROWS_MAX_THREADS, 1))
    def norm_rows(x, residual, h, w, b, eps, out, has_w, has_b, has_res):
        rows, d = x.shape
        row, start, step, row_step = row_owner(warp, rows)
        if row >= rows:  # a warp past the last row leaves at once (its registers: 64 at most)
            return
        scratch = cuda.shared.array(32, acc)
        scratch2 = cuda.shared.array(32, acc)
        vs = cuda.local.array(U, acc)
        rs = cuda.local.array(U, acc)
        inv_d = one / acc(d)
        epsa = acc(eps)
        while row < rows:  # warp: runs once; block: block-uniform grid-stride loop
            src = h if has_res else x
            # shift of the mean's sum: h[row, 0], formed here by every thread (the thread
            # that stores it may not have yet); acc is x's dtype, so it rounds the same.
            x0 = zero
            if not rms:
                x0 = acc(x[row, 0])
                if has_res:
                    x0 += acc(residual[row, 0])
            s1 = zero
            # each pass U elements per thread at a time (_jit.row_unroll), their loads in
            # flight together; elements past the row's end predicated off
            for j in range(start, d, step * U):
                for u in range(U):
                    if U == 1 or j + step * u < d:
                        vs[u] = acc(x[row, uint64(j + step * u)])
                if has_res:
                    for u in range(U):
                        if U == 1 or j + step * u < d:
                            rs[u] = acc(residual[row, uint64(j + step * u)])
                    for u in range(U):
                        if U == 1 or j + step * u < d:
                            h[row, uint64(j + step * u)] = vs[u] + rs[u]
                            vs[u] = acc(h[row, uint64(j + step * u)])  # the value stored (rounded to h's dtype)
                for u in range(U):
                    if U == 1 or j + step * u < d:
                        s1 += vs[u] * vs[u] if rms else vs[u] - x0
            mean = zero
            mc = zero
            if rms:
                rstd = rms_rstd(s1, inv_d, epsa, scratch)
            else:
                mean = shifted_mean(s1, x0, inv_d, scratch)
                s2 = zero
                sd = zero
                for j in range(start, d, step * U):
                    for u in range(U):
                        if U == 1 or j + step * u < d:
                            vs[u] = acc(src[row, uint64(j + step * u)])
                    for u in range(U):
                        if U == 1 or j + step * u < d:
                            dv = vs[u] - mean
                            sd += dv
                            s2 += dv * dv
                mc, rstd = centered_rstd(sd, s2, inv_d, epsa, scratch, scratch2)
            for j in range(start, d, step * U):
                for u in range(U):
                    if U == 1 or j + step * u < d:
                        vs[u] = acc(src[row, uint64(j + step * u)])
                for u in range(U):
                    jj = uint64(j + step * u)
                    if U == 1 or j + step * u < d:
                        y = vs[u] * rstd if rms else ((vs[u] - mean) - mc) * rstd
                        if has_w:
                            y *= acc(w[jj])
                        if has_b:
                            y += acc(b[jj])
                        out[row, jj] = y
            row += row_step

    return norm_rows


@lru_cache(maxsize=None)
def make_vec(kind, rms, acc_np, vec):
    """The row-in-registers kernel for kind "warp" / "block": each thread loads its share of a
    row once, VEC_ROW_ELEMENTS elements at most, as 16-byte vectors of `vec` elements (thread
    t of the row's nt holds vectors t, t + nt, ...: consecutive threads, consecutive 16 bytes),
    reduces from registers and writes the output with 16-byte stores: one read and one write
    of the row, where make() reads it two or three times element by element.  The same
    arithmetic as make() (the shifted two-pass mean and variance of layer_norm), so both give
    the same results.  Requires d % vec == 0, d <= nt * VEC_ROW_ELEMENTS and 16-byte aligned
    x, residual, h, w, b and out (dispatch checks)."""
    acc, _ = acc_of(acc_np)
    zero, one = acc_np(0.0), acc_np(1.0)
    warp = kind == "warp"
    rms_rstd, shifted_mean, centered_rstd = _row_stats(acc_np, warp)
    NV = VEC_ROW_ELEMENTS // vec   # vectors per thread
    E = NV * vec
    load_vec, store_vec = vec_io(vec)

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 4) if warp else (VEC_ROWS_MAX_THREADS, 1))
    def norm_vec_rows(x, residual, h, w, b, eps, out, has_w, has_b, has_res):
        rows, d = x.shape
        nvec = d // vec
        row, start, step, row_step = row_owner(warp, rows)
        if row >= rows:  # a warp past the last row leaves at once (its registers: 64 at most)
            return
        scratch = cuda.shared.array(32, acc)
        scratch2 = cuda.shared.array(32, acc)
        vs = cuda.local.array(E, acc)
        rs = cuda.local.array(vec, acc)  # a residual, weight or bias vector
        inv_d = one / acc(d)
        epsa = acc(eps)
        while row < rows:  # warp: runs once; block: block-uniform grid-stride loop
            for k in range(NV):
                v = start + k * step
                if v < nvec:
                    load_vec(x, (row, v * vec), vs, k * vec)
            x0 = zero
            if not rms:  # the shift of make(): x[row, 0] (+ residual[row, 0]) in acc
                x0 = acc(x[row, 0])
                if has_res:
                    x0 += acc(residual[row, 0])
            s1 = zero
            for k in range(NV):
                if start + k * step < nvec:
                    if has_res:
                        load_vec(residual, (row, (start + k * step) * vec), rs, 0)
                        for i in range(vec):
                            vs[k * vec + i] += rs[i]
                        store_vec(h, (row, (start + k * step) * vec), vs, k * vec)  # vs: the stored h
                    for i in range(vec):
                        s1 += vs[k * vec + i] * vs[k * vec + i] if rms else vs[k * vec + i] - x0
            mean = zero
            mc = zero
            if rms:
                rstd = rms_rstd(s1, inv_d, epsa, scratch)
            else:
                mean = shifted_mean(s1, x0, inv_d, scratch)
                s2 = zero
                sd = zero
                for k in range(NV):
                    if start + k * step < nvec:
                        for i in range(vec):
                            dv = vs[k * vec + i] - mean
                            sd += dv
                            s2 += dv * dv
                mc, rstd = centered_rstd(sd, s2, inv_d, epsa, scratch, scratch2)
            for k in range(NV):
                v = start + k * step
                if v < nvec:
                    for i in range(vec):
                        y = vs[k * vec + i]
                        vs[k * vec + i] = y * rstd if rms else ((y - mean) - mc) * rstd
                    if has_w:
                        load_vec(w, v * vec, rs, 0)
                        for i in range(vec):
                            vs[k * vec + i] *= rs[i]
                    if has_b:
                        load_vec(b, v * vec, rs, 0)
                        for i in range(vec):
                            vs[k * vec + i] += rs[i]
                    store_vec(out, (row, v * vec), vs, k * vec)
            row += row_step

    return norm_vec_rows


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _norm_args(dt):
    return (arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 1), arr(dt, 1), types.float64, arr(dt, 2),
            types.boolean, types.boolean, types.boolean)


PTX = [
    PtxBuild(f"{family}.{kind}_rows", "norm", (lambda kind, rms: lambda dt: make(kind, rms, acc_np(dt)))(kind, rms),
             _norm_args, threads=WARP_ROWS_THREADS if kind == "warp" else BLOCK_ROWS_MAX_THREADS)
    for family, rms in (("layer_norm", False), ("rms_norm", True)) for kind in ("warp", "block")
] + [
    PtxBuild(f"{family}.{kind}_vec_rows", "norm",
             (lambda kind, rms: lambda dt: make_vec(kind, rms, acc_np(dt), vec_width(np.dtype(str(dt)).itemsize)))(kind, rms),
             _norm_args, threads=WARP_ROWS_THREADS if kind == "warp" else VEC_ROWS_MAX_THREADS,
             dtypes=VEC_ROW_DTYPES)
    for family, rms in (("layer_norm", False), ("rms_norm", True)) for kind in ("warp", "block")
]
