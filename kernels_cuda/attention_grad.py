"""Backward of attention on the GPU (FlashAttention-2's, in two kernels, no atomics).

Layouts as kernels_cuda/attention.py: q, grad_out, out (B, Hq, Sq, D); k, v (B, Hkv, Skv,
D); lse (B, Hq, Sq) the forward's row log-sum-exp; mask a 4-D array broadcast through its
size-1 dims.  The rows of a (batch, kv head) are the (query head of its group, query)
pairs flattened, as in the forward, so K/V tiles serve the whole GQA group.  Both kernels
recompute, for a tile of BQ rows x BK = 32 keys staged in shared memory (Q, dO rows; K, V
rows padded by one word against bank conflicts), P = exp(scale q.k + mask - lse) and
dS = P (dO.v - D_i), D_i = rowsum(dO * O), into shared tiles (thread (warp w, lane j):
key j of rows w, w + NW, ...), zero at keys the row does not see (causal: j > i + Skv -
Sq; mask False / -inf; a row that saw no key, lse = -inf).

  dkdv: a block owns BK keys of one (batch, kv head) and walks every row of its group in
        tiles of BQ: lane j accumulates dV[j, d] += sum_r P[r, j] dO[r, d] and
        dK[j, d] += sum_r dS[r, j] q[r, d] for the columns d = w, w + NW, ... of its warp w
        (in registers), stored times scale at the end: dK, dV summed over the group's
        query heads with no atomics.  Row tiles wholly above the causal diagonal skipped.
  dq:   a block owns BQ rows of one (batch, kv head) and walks the key tiles they see:
        dQ[r, d] += sum_j dS[r, j] K[j, d] (warp w: rows w*RPW.., lane: columns lane +
        32c), stored times scale.

Correctness first (no tensor cores): the products are FMA loops over shared memory.
NaN: a NaN score / lse / dO / O makes P or dS NaN at the keys the row sees, as the CPU
kernel and the float64 reference.
"""
import math
from functools import lru_cache

import numpy as np
from numba import cuda, int32, types

from kernels_common.attention import MASK_BOOL, MASK_NONE
from kernels_common.cuda_tiles import ATTN_BK as BK, ATTN_WARPS as NW

from ._jit import PtxBuild, acc_np, acc_of, arr, device, kernel
from .primitives import warp_sum

# Row tile: 8 rows (2 per warp) keep a 128-wide float32 tile set (Q, dO, K, V, P, dS) in
# 43 KB and a 64-wide float64 one in 46 KB of the 48 KB of static shared memory; not
# measured on a GPU (none lent to this project yet).
BQ = 8
RPW = BQ // NW
NT = 32 * NW
TILES = (64, 128)


def shared_bytes(dmax, itemsize):
    """Q, dO (BQ x dmax), K, V (BK x dmax + 1), P, dS (BQ x BK), lse, D (BQ)."""
    return itemsize * (2 * BQ * dmax + 2 * BK * (dmax + 1) + 2 * BQ * BK + 2 * BQ) + 8 * BQ


def tile_for(d):
    for dmax in TILES:
        if d <= dmax:
            return dmax
    return None


@lru_cache(maxsize=None)
def _pieces(acc_np_, dmax):
    acc, _ = acc_of(acc_np_)
    neg_inf, pos_inf, zero = acc_np_(-np.inf), acc_np_(np.inf), acc_np_(0.0)

    @device
    def stage_rows(q, go, o, lse, Qs, Gs, Ls, Ds, Rh, Rp, b, kvh, group, r0, nrows, sq, d, warp, lane):
        """Rows r0 .. r0 + BQ - 1 of the group into shared: q, dO, lse (-inf -> +inf), D."""
        for rr in range(warp, BQ, NW):
            r = r0 + rr
            part = zero
            if r < nrows:
                h = kvh * group + r // sq
                qp = r - (r // sq) * sq
                for dd in range(lane, d, 32):
                    Qs[rr, dd] = acc(q[b, h, qp, dd])
                    g = acc(go[b, h, qp, dd])
                    Gs[rr, dd] = g
                    part += g * acc(o[b, h, qp, dd])
                if lane == 0:
                    Rh[rr] = h
                    Rp[rr] = qp
                    li = acc(lse[b, h, qp])
                    Ls[rr] = pos_inf if li == neg_inf else li
            else:
                for dd in range(lane, d, 32):
                    Qs[rr, dd] = zero
                    Gs[rr, dd] = zero
                if lane == 0:
                    Rh[rr] = -1
                    Rp[rr] = 0
                    Ls[rr] = pos_inf
            tot = warp_sum(part)
            if lane == 0:
                Ds[rr] = tot

    @device
    def stage_keys(k, v, Ks, Vs, b, kvh, j0, skv, d, warp, lane):
        for jj in range(warp, BK, NW):
            j = j0 + jj
            if j < skv:
                for dd in range(lane, d, 32):
                    Ks[jj, dd] = acc(k[b, kvh, j, dd])
                    Vs[jj, dd] = acc(v[b, kvh, j, dd])
            else:
                for dd in range(lane, d, 32):
                    Ks[jj, dd] = zero
                    Vs[jj, dd] = zero

    @device
    def pairs(Qs, Gs, Ks, Vs, Ls, Ds, Rh, Rp, Ps, Ss, mask, mkind, causal, sc, b, j0, skv, off, d, warp, lane):
        """P and dS of the staged rows x keys into Ps, Ss (0 where the row does not see the key)."""
        j = j0 + lane
        mb_b = mask.shape[0] != 1
        mb_h = mask.shape[1] != 1
        mb_q = mask.shape[2] != 1
        mb_k = mask.shape[3] != 1
        for rr in range(warp, BQ, NW):
            p = zero
            ds = zero
            h = Rh[rr]
            if h >= 0 and j < skv:
                qp = Rp[rr]
                if not (causal and j > qp + off):
                    s = zero
                    dp = zero
                    for dd in range(d):
                        s += Qs[rr, dd] * Ks[lane, dd]
                        dp += Gs[rr, dd] * Vs[lane, dd]
                    s *= sc
                    if mkind != MASK_NONE:
                        mv = mask[b if mb_b else 0, h if mb_h else 0, qp if mb_q else 0, j if mb_k else 0]
                        if mkind == MASK_BOOL:
                            if not mv:
                                s += neg_inf
                        else:
                            s += acc(mv)
                    if s != neg_inf:
                        p = math.exp(s - Ls[rr])
                        ds = p * (dp - Ds[rr])
            Ps[rr, lane] = p
            Ss[rr, lane] = ds

    def last_query(r0, nrows, sq):
        """Largest query position among rows r0 .. r0 + BQ - 1 (as the forward's)."""
        r_end = min(nrows, r0 + BQ)
        if r_end - r0 >= sq:
            return sq - 1
        first_p = r0 % sq
        last_p = (r_end - 1) % sq
        return last_p if last_p >= first_p else sq - 1

    return acc, stage_rows, stage_keys, pairs, device(last_query)


@lru_cache(maxsize=None)
def dkdv_kernel(acc_np_, dmax):
    acc, stage_rows, stage_keys, pairs, last_query = _pieces(acc_np_, dmax)
    zero = acc_np_(0.0)
    CPW = dmax // NW  # columns per warp
    KS = (BK, dmax + 1)  # shapes must be compile-time constants

    @kernel(launch_bounds=(NT, 1))
    def attention_grad_dkdv(q, k, v, go, o, lse, mask, mkind, causal, scale, dk, dv):
        nb, hq, sq, d = q.shape
        hkv = k.shape[1]
        skv = k.shape[2]
        group = hq // hkv
        nrows = group * sq
        nkt = (skv + BK - 1) // BK
        bh = cuda.blockIdx.x // nkt
        j0 = (cuda.blockIdx.x - bh * nkt) * BK
        b = bh // hkv
        kvh = bh - b * hkv
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        off = skv - sq
        sc = acc(scale)
        Qs = cuda.shared.array((BQ, dmax), acc)
        Gs = cuda.shared.array((BQ, dmax), acc)
        Ks = cuda.shared.array(KS, acc)
        Vs = cuda.shared.array(KS, acc)
        Ps = cuda.shared.array((BQ, BK), acc)
        Ss = cuda.shared.array((BQ, BK), acc)
        Ls = cuda.shared.array(BQ, acc)
        Ds = cuda.shared.array(BQ, acc)
        Rh = cuda.shared.array(BQ, int32)
        Rp = cuda.shared.array(BQ, int32)
        ak = cuda.local.array(CPW, acc)
        av = cuda.local.array(CPW, acc)
        cols = min(CPW, (d - warp + NW - 1) // NW)  # this warp's columns warp, warp + NW, ... < d
        for c in range(CPW):
            ak[c] = zero
            av[c] = zero
        stage_keys(k, v, Ks, Vs, b, kvh, j0, skv, d, warp, lane)
        for r0 in range(0, nrows, BQ):
            if causal and last_query(r0, nrows, sq) + off < j0:  # block-uniform: no row sees these keys
                continue
            cuda.syncthreads()
            stage_rows(q, go, o, lse, Qs, Gs, Ls, Ds, Rh, Rp, b, kvh, group, r0, nrows, sq, d, warp, lane)
            cuda.syncthreads()
            pairs(Qs, Gs, Ks, Vs, Ls, Ds, Rh, Rp, Ps, Ss, mask, mkind, causal, sc, b, j0, skv, off, d, warp, lane)
            cuda.syncthreads()
            for c in range(cols):  # a run-time bound: not unrolled (unrolled at D <= 64: 255 registers, spills)
                dd = warp + NW * c
                a1 = ak[c]
                a2 = av[c]
                for rr in range(BQ):
                    a1 += Ss[rr, lane] * Qs[rr, dd]
                    a2 += Ps[rr, lane] * Gs[rr, dd]
                ak[c] = a1
                av[c] = a2
        j = j0 + lane
        if j < skv:
            for c in range(cols):
                dd = warp + NW * c
                dk[b, kvh, j, dd] = ak[c] * sc
                dv[b, kvh, j, dd] = av[c]

    return attention_grad_dkdv


@lru_cache(maxsize=None)
def dq_kernel(acc_np_, dmax):
    acc, stage_rows, stage_keys, pairs, last_query = _pieces(acc_np_, dmax)
    zero = acc_np_(0.0)
    DPL = dmax // 32
    KS = (BK, dmax + 1)

    @kernel(launch_bounds=(NT, 1))
    def attention_grad_dq(q, k, v, go, o, lse, mask, mkind, causal, scale, dq):
        nb, hq, sq, d = q.shape
        hkv = k.shape[1]
        skv = k.shape[2]
        group = hq // hkv
        nrows = group * sq
        nrb = (nrows + BQ - 1) // BQ
        bh = cuda.blockIdx.x // nrb
        r0 = (cuda.blockIdx.x - bh * nrb) * BQ
        b = bh // hkv
        kvh = bh - b * hkv
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        off = skv - sq
        sc = acc(scale)
        Qs = cuda.shared.array((BQ, dmax), acc)
        Gs = cuda.shared.array((BQ, dmax), acc)
        Ks = cuda.shared.array(KS, acc)
        Vs = cuda.shared.array(KS, acc)
        Ps = cuda.shared.array((BQ, BK), acc)
        Ss = cuda.shared.array((BQ, BK), acc)
        Ls = cuda.shared.array(BQ, acc)
        Ds = cuda.shared.array(BQ, acc)
        Rh = cuda.shared.array(BQ, int32)
        Rp = cuda.shared.array(BQ, int32)
        aq = cuda.local.array((RPW, DPL), acc)
        for i in range(RPW):
            for c in range(DPL):
                aq[i, c] = zero
        stage_rows(q, go, o, lse, Qs, Gs, Ls, Ds, Rh, Rp, b, kvh, group, r0, nrows, sq, d, warp, lane)
        kv_end = skv
        if causal:
            kv_end = min(skv, max(0, last_query(r0, nrows, sq) + off + 1))
        for j0 in range(0, kv_end, BK):
            cuda.syncthreads()
            stage_keys(k, v, Ks, Vs, b, kvh, j0, skv, d, warp, lane)
            cuda.syncthreads()
            pairs(Qs, Gs, Ks, Vs, Ls, Ds, Rh, Rp, Ps, Ss, mask, mkind, causal, sc, b, j0, skv, off, d, warp, lane)
            cuda.syncthreads()
            for i in range(RPW):
                rr = warp * RPW + i
                for c in range(DPL):
                    dd = lane + 32 * c
                    if dd < d:
                        a = aq[i, c]
                        for jj in range(BK):
                            a += Ss[rr, jj] * Ks[jj, dd]
                        aq[i, c] = a
        for i in range(RPW):
            rr = warp * RPW + i
            r = r0 + rr
            if r < nrows:
                h = kvh * group + r // sq
                qp = r - (r // sq) * sq
                for c in range(DPL):
                    dd = lane + 32 * c
                    if dd < d:
                        dq[b, h, qp, dd] = aq[i, c] * sc

    return attention_grad_dq


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _common_args(dt):
    return (arr(dt, 4), arr(dt, 4), arr(dt, 4), arr(dt, 4), arr(dt, 4), arr(dt, 3), arr(types.boolean, 4),
            types.int64, types.boolean, types.float64)


def _fitting(dmax):
    return tuple(dt for dt in ("float32", "float64")
                 if shared_bytes(dmax, 8 if dt == "float64" else 4) <= 48 * 1024)


PTX = [
    PtxBuild(f"attention_grad.dkdv_d{dmax}", "attention_grad",
             (lambda dmax: lambda dt: dkdv_kernel(acc_np(dt), dmax))(dmax),
             lambda dt: _common_args(dt) + (arr(dt, 4), arr(dt, 4)), threads=NT, dtypes=_fitting(dmax))
    for dmax in TILES
] + [
    PtxBuild(f"attention_grad.dq_d{dmax}", "attention_grad",
             (lambda dmax: lambda dt: dq_kernel(acc_np(dt), dmax))(dmax),
             lambda dt: _common_args(dt) + (arr(dt, 4),), threads=NT, dtypes=_fitting(dmax))
    for dmax in TILES
]
