"""Mixture-of-experts FFN: a grouped GEMM over the tokens sorted by expert.

The host sorts the T*k (token, slot) pairs by expert (dispatch/ops/moe.route) and uploads
int32 tables: offs (E + 1,) the rows of each expert in sorted order, active (the experts
with rows), tok (R = T*k,) the token of each sorted row, inv (R,) the sorted row of each
slot t*k + j, and for the tiled kernel the row tiles (e, first row, rows) of at most BM
rows of one expert.  Both phases write float32 (float64 for float64 inputs) workspaces:

  phase 0 (gated): hid[r, f] = act(w_gate[e, f] . x[tok[r]]) * (w_up[e, f] . x[tok[r]])
  phase 1:         ybuf[r, h] = w_down[e, h] . hid[r]
  combine:         out[t, h] = sum over j of weights[t, j] * ybuf[inv[t*k + j], h]

so no two blocks write one element (no atomics) and the sum over slots has a fixed order:
results are reproducible run to run.

grouped_kernel (a GEMM tile of kernels_common.cuda_tiles.GEMM_TILES): the tiled GEMM of
kernels_cuda/gemm.py over (row tile, column tile) blocks, A the tile's rows (x gathered
through tok, or hid), B an expert's weight rows in the (N, K) Linear layout (consecutive
threads load consecutive k).  In phase 0 a block's BN columns are BN/2 gate rows and the
same BN/2 up rows, so the thread holding gate column c holds its up column c + BN/2 in its
own registers (columns tx + j*NTX: j < TN/2 gate, j + TN/2 up) and writes act(g) * u
directly; the register tile is the GEMM's, so its register and spill figures carry over.
Each expert's weight tile is read by its row tiles only: once per call when an expert has
at most BM rows.

gemv_kernel (decode: few rows per expert): one warp per (active expert, weight row), its
lanes striding over K (coalesced), up to GEMV_MAX_M of the expert's rows per pass of the
weight row (a register each), warp sums.  Every weight row of every active expert is read
once: the memory-bound T = 1 step.  float16 inputs are converted to float32 when loaded.
"""
from functools import lru_cache

import numpy as np
from numba import cuda, types

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, GEMV_MAX_M, GEMV_WARPS
from kernels_common.cuda_tiles import GEMM_TILES as CONFIGS
from kernels_common.cuda_tiles import gemm_threads, gemm_tile_dtypes

from ._jit import PtxBuild, acc_np, acc_of, acc_type, arr, kernel
from .activation import act_fn
from .primitives import warp_sum
from .simt_tile import geometry, tile_clear, tile_fma


@lru_cache(maxsize=None)
def grouped_kernel(acc_np, cfg):
    """grouped(x, hid, w0, w1, tiles, tok, dst, code, gated): phase 0 (gated) reads A rows
    x[tok[r]] (K = H) and B rows w0 = w_gate, w1 = w_up (N = F), writes hid = dst; phase 1
    reads A rows hid[r] (K = F) and B rows w0 = w_down (w1 unused; N = H), writes ybuf = dst.
    Grid: one dimension, column block fastest, then the row tile (blocks past the tile
    table's end return at once: the grid is sized from shapes, the table from the data)."""
    T = geometry(cfg)
    BN, BK, TM, TN = T.bn, T.bk, T.tm, T.tn
    NTX, NTY, NT, A_LOADS, B_LOADS = T.ntx, T.nty, T.nt, T.a_loads, T.b_loads
    HALF = BN // 2
    THALF = TN // 2
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)
    act = act_fn(acc_np)
    AS_SHAPE, BS_SHAPE, ACC_SHAPE = T.as_shape, T.bs_shape, T.acc_shape
    fma, clear = tile_fma(cfg), tile_clear(cfg)

    @kernel(launch_bounds=(NT, 2))
    def grouped(x, hid, w0, w1, tiles, tok, dst, code, gated):
        k_total = x.shape[1] if gated else hid.shape[1]
        n_total = w0.shape[1]
        per_block = HALF if gated else BN   # weight rows (outputs) per block
        nbn = (n_total + per_block - 1) // per_block
        blk = cuda.blockIdx.x
        bn = blk % nbn
        tix = blk // nbn
        if tix >= tiles.shape[0]:
            return
        e = tiles[tix, 0]
        r0 = tiles[tix, 1]
        rows = tiles[tix, 2]
        n0 = bn * per_block
        t = cuda.threadIdx.x
        tx = t % NTX
        ty = t // NTX
        As = cuda.shared.array(AS_SHAPE, acc)
        Bs = cuda.shared.array(BS_SHAPE, acc)
        accr = cuda.local.array(ACC_SHAPE, acc)
        af = cuda.local.array(TM, acc)
        bf = cuda.local.array(TN, acc)
        clear(accr, zero)
        for k0 in range(0, k_total, BK):
            # A tile as As[k][m]; consecutive threads: consecutive k of one row
            for l in range(A_LOADS):
                ee = t + l * NT
                mm = ee // BK
                kk = ee - mm * BK
                gk = k0 + kk
                v = zero
                if mm < rows and gk < k_total:
                    if gated:
                        v = acc(x[tok[r0 + mm], gk])
                    else:
                        v = hid[r0 + mm, gk]
                As[kk, mm] = v
            # B tile as Bs[k][n]: column n < HALF of w0, the rest of w1 (phase 0)
            for l in range(B_LOADS):
                ee = t + l * NT
                nn = ee // BK
                kk = ee - nn * BK
                gk = k0 + kk
                v = zero
                if gated and nn >= HALF:
                    gn = n0 + nn - HALF
                    if gn < n_total and gk < k_total:
                        v = acc(w1[e, gn, gk])
                else:
                    gn = n0 + nn
                    if gn < n_total and gk < k_total:
                        v = acc(w0[e, gn, gk])
                Bs[kk, nn] = v
            cuda.syncthreads()
            fma(As, Bs, accr, af, bf, tx, ty)
            cuda.syncthreads()
        # epilogue (coalesced over tx): act(gate) * up, or the plain product
        for i in range(TM):
            gm = ty + i * NTY
            if gm < rows:
                for j in range(THALF if gated else TN):
                    gn = n0 + tx + j * NTX
                    if gn < n_total:
                        if gated:
                            dst[r0 + gm, gn] = act(accr[i, j], code) * accr[i, j + THALF]
                        else:
                            dst[r0 + gm, gn] = accr[i, j]

    return grouped


@lru_cache(maxsize=None)
def gemv_kernel(acc_np, gated):
    """gemv(x, hid, w0, w1, offs, active, tok, dst, code): phase 0 (gated) or 1 of
    grouped_kernel for few rows per expert, one kernel per phase; warps grid-stride over the
    items (active expert, weight row) (module docstring).  Rows per pass of a weight row:
    GEMV_MAX_M, half as many for float64's gate/up (two sets of 8 float64 accumulators
    spilled 96-104 bytes on sm_90 under the launch bound, ptxas)."""
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)
    act = act_fn(acc_np)
    MM = GEMV_MAX_M // 2 if gated and acc_np == np.float64 else GEMV_MAX_M

    @kernel(launch_bounds=(32 * GEMV_WARPS, 4))
    def gemv(x, hid, w0, w1, offs, active, tok, dst, code):
        k_total = x.shape[1] if gated else hid.shape[1]
        n_total = w0.shape[1]
        s0 = cuda.local.array(MM, acc)
        s1 = cuda.local.array(MM, acc)
        rowx = cuda.local.array(MM, types.int32)
        lane = cuda.threadIdx.x & 31
        total = active.shape[0] * n_total
        for item in range(cuda.blockIdx.x * GEMV_WARPS + (cuda.threadIdx.x >> 5), total, cuda.gridDim.x * GEMV_WARPS):
            ai = item // n_total  # the same item for every lane of the warp
            n = item - ai * n_total
            e = active[ai]
            r0 = offs[e]
            r1 = offs[e + 1]
            for m0 in range(r0, r1, MM):
                for mm in range(MM):
                    s0[mm] = zero
                    s1[mm] = zero
                    if gated:
                        rowx[mm] = tok[m0 + mm] if m0 + mm < r1 else 0
                for kk in range(lane, k_total, 32):
                    wa = acc(w0[e, n, kk])
                    if gated:
                        wb = acc(w1[e, n, kk])
                        for mm in range(MM):
                            if m0 + mm < r1:
                                xv = acc(x[rowx[mm], kk])
                                s0[mm] += xv * wa
                                s1[mm] += xv * wb
                    else:
                        for mm in range(MM):
                            if m0 + mm < r1:
                                s0[mm] += hid[m0 + mm, kk] * wa
                for mm in range(MM):
                    if m0 + mm < r1:  # uniform over the warp: every lane sums
                        v = warp_sum(s0[mm])
                        if gated:
                            v = act(v, code) * warp_sum(s1[mm])
                        if lane == 0:
                            dst[m0 + mm, n] = v

    return gemv


@lru_cache(maxsize=None)
def combine_kernel(acc_np):
    """combine(ybuf, weights, inv, out): out[t, h] = sum over j of weights[t, j] *
    ybuf[inv[t*k + j], h], one thread per output element (consecutive threads: consecutive h)."""
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def combine(ybuf, weights, inv, out):
        n_h = out.shape[1]
        k = weights.shape[1]
        i = cuda.grid(1)
        if i < out.shape[0] * n_h:
            t = i // n_h
            h = i - t * n_h
            v = zero
            for j in range(k):
                v += acc(weights[t, j]) * ybuf[inv[t * k + j], h]
            out[t, h] = v

    return combine


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _phase_args(dt, table):
    i32 = types.int32
    return (arr(dt, 2), arr(acc_type(dt), 2), arr(dt, 3), arr(dt, 3)) + table + (arr(i32, 1), arr(acc_type(dt), 2),
                                                                              types.int64)


def _grouped_args(dt):
    return _phase_args(dt, (arr(types.int32, 2),)) + (types.boolean,)


def _gemv_args(dt):
    return _phase_args(dt, (arr(types.int32, 1), arr(types.int32, 1)))


def _combine_args(dt):
    return (arr(acc_type(dt), 2), arr(dt, 2), arr(types.int32, 1), arr(dt, 2))


PTX = [
    PtxBuild(f"moe.grouped_{tile}", "moe", (lambda tile: lambda dt: grouped_kernel(acc_np(dt), tile))(tile),
             _grouped_args, threads=gemm_threads(tile), dtypes=gemm_tile_dtypes(tile))
    for tile in CONFIGS
] + [
    PtxBuild(f"moe.gemv_{phase}", "moe", (lambda gated: lambda dt: gemv_kernel(acc_np(dt), gated))(gated), _gemv_args,
             threads=32 * GEMV_WARPS)
    for phase, gated in (("gate_up", True), ("down", False))
] + [
    PtxBuild("moe.combine", "moe", lambda dt: combine_kernel(acc_np(dt)), _combine_args, threads=ELEMENTWISE_THREADS),
]
