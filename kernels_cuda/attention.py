"""Flash-style attention and split-KV decode on the GPU.

q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); out (B, Hq, Sq, D); group = Hq // Hkv.
A block owns BQ "rows" of one (batch, kv head): the rows are the (query head of the
group, query position) pairs flattened, so the K/V tiles a block stages in shared memory
serve every query head of the GQA group (MQA and decode included: Sq = 1 with 8 heads in
a group fills 8 rows).  Each of the NW warps owns RPW = BQ / NW rows.  Per K/V tile of
BK = 32 keys (streamed through shared memory, the K rows padded by one word against bank
conflicts):
  - lane j computes the score of key j for each of its warp's rows (Q rows from shared,
    pre-scaled), with the causal rule (query i sees keys <= i + Skv - Sq) and the mask
    (bool: attend where True; additive), broadcast by strides of 1-sized mask dims;
  - online softmax per row: tile max and sum by warp shuffles, running (m, l) rescaled;
  - P goes to a per-row shared slot and each lane accumulates its D/32 output columns
    o[d] = o[d] * alpha + sum_j P[j] V[j, d] (consecutive lanes, consecutive d).
Tiles wholly above the causal diagonal of the block's last query are never loaded.
grid = (row blocks x B x Hkv, 1, splits).  With splits == 1 the block writes out / l (0 for a
query that sees no key).  With splits > 1 (split-KV, for decode: few rows, long KV) split
s takes a contiguous range of KV tiles and writes its normalized partial output and
(m, l); `combine` (the second pass) merges the splits with the usual rescaling.
With want_lse, each row's log-sum-exp m + log l (-inf when it saw no key) goes to lse
(B, Hq, Sq), by the one pass or by the combine (attention(return_lse=True), what
attention_backward recomputes the probabilities from).
NaN in, NaN out (as PyTorch; same rules as kernels_cpu/attention.py): a NaN or +inf
score makes p, then l and o, NaN, and the output NaN; a bool mask adds -inf (a NaN score
at a masked key still counts), keys past the causal limit never get a score.
"""
import math
from functools import lru_cache

import numpy as np
from numba import cuda, int32, types

from kernels_common.attention import MASK_BOOL, MASK_NONE
from kernels_common import acc_dtype
from kernels_common.cuda_tiles import ATTN_BK as BK, ATTN_TILES as TILES, ATTN_WARPS as NW, STATIC_SMEM, attn_shared_bytes

from ._jit import FULL_MASK, PtxBuild, acc_np, acc_of, acc_type, arr, kernel
from .primitives import warp_max, warp_sum


@lru_cache(maxsize=None)
def flash_kernel(acc_np, dmax):
    acc, _ = acc_of(acc_np)
    BQ = TILES[dmax][1]
    RPW = BQ // NW
    DPL = dmax // 32
    NT = NW * 32
    QS, KS, VS, PS = (BQ, dmax), (BK, dmax + 1), (BK, dmax), (BQ, BK)
    RS, OS = (RPW,), (RPW, DPL)
    neg_inf, zero, one = acc_np(-np.inf), acc_np(0.0), acc_np(1.0)

    @kernel(launch_bounds=(NT, 2))
    def attention_flash(q, k, v, mask, mkind, causal, scale, out, part_o, part_ml, lse, want_lse):
        nb, hq, sq, d = q.shape
        hkv = k.shape[1]
        skv = k.shape[2]
        group = hq // hkv
        nrows = group * sq
        # (row block, batch x kv head) folded into grid x: y would stop at 65,535 batch x
        # kv heads (B = 4096, Hkv = 16)
        nrb = (nrows + BQ - 1) // BQ
        bh = cuda.blockIdx.x // nrb
        r0 = (cuda.blockIdx.x - bh * nrb) * BQ
        b = bh // hkv
        kvh = bh - b * hkv
        split = cuda.blockIdx.z
        nsplit = cuda.gridDim.z
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        off = skv - sq
        Qs = cuda.shared.array(QS, acc)
        Ks = cuda.shared.array(KS, acc)
        Vs = cuda.shared.array(VS, acc)
        Ps = cuda.shared.array(PS, acc)
        m = cuda.local.array(RS, acc)
        rq = cuda.local.array(RS, int32)  # query head within the group of each row
        rp = cuda.local.array(RS, int32)  # query position of each row
        l = cuda.local.array(RS, acc)
        o = cuda.local.array(OS, acc)
        sc = acc(scale)
        # 64-bit integer division is costly on the GPU: rows are walked warp by warp and
        # columns lane by lane, and each row's (head, position) is computed once.
        for rr in range(warp, BQ, NW):
            r = r0 + rr
            if r < nrows:
                hq_r = kvh * group + r // sq
                qp_r = r - (r // sq) * sq
                for dd in range(lane, d, 32):
                    Qs[rr, dd] = acc(q[b, hq_r, qp_r, dd]) * sc
            else:
                for dd in range(lane, d, 32):
                    Qs[rr, dd] = zero
        for i in range(RPW):
            m[i] = neg_inf
            l[i] = zero
            r = r0 + warp * RPW + i
            rq[i] = r // sq
            rp[i] = r - rq[i] * sq
            for c in range(DPL):
                o[i, c] = zero
        # last key any row of this block may see (causal): tiles past it are skipped
        kv_end = skv
        if causal:
            r_end = min(nrows, r0 + BQ)
            if r_end - r0 >= sq:
                last = sq - 1
            else:
                first_p = r0 % sq
                last_p = (r_end - 1) % sq
                last = last_p if last_p >= first_p else sq - 1
            kv_end = min(skv, max(0, last + off + 1))
        ntiles = (skv + BK - 1) // BK
        per = (ntiles + nsplit - 1) // nsplit
        t_lo = split * per
        t_hi = min(ntiles, t_lo + per)
        mb_b = mask.shape[0] != 1
        mb_h = mask.shape[1] != 1
        mb_q = mask.shape[2] != 1
        mb_k = mask.shape[3] != 1
        my_rows = max(0, min(RPW, nrows - r0 - warp * RPW))
        cuda.syncthreads()
        for t in range(t_lo, t_hi):
            j0 = t * BK
            if j0 >= kv_end:  # block-uniform: causal tile skipping
                break
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
            cuda.syncthreads()
            j = j0 + lane
            for i in range(my_rows):  # warp-uniform runtime bound: padding rows skipped
                rr = warp * RPW + i
                r = r0 + rr
                s = neg_inf
                if r < nrows and j < skv:
                    qp = rp[i]
                    h = kvh * group + rq[i]
                    if not (causal and j > qp + off):
                        s = zero
                        for dd in range(d):
                            s += Qs[rr, dd] * Ks[lane, dd]
                        if mkind != MASK_NONE:
                            mv = mask[b if mb_b else 0, h if mb_h else 0, qp if mb_q else 0, j if mb_k else 0]
                            if mkind == MASK_BOOL:
                                if not mv:
                                    s += neg_inf  # as an additive -inf (PyTorch): NaN stays NaN
                            else:
                                s += acc(mv)
                mt = warp_max(s)
                m_new = max(m[i], mt)
                p = zero
                alpha = one
                # NaN carries through p: max() skips a NaN s (mt >= every other lane's s
                # still holds), so a NaN score gives exp(NaN - m_new) = NaN even when
                # m_new is -inf, and +inf gives exp(inf - inf) = NaN; warp_sum then makes
                # l NaN and Ps carries it into o.  Both stay NaN (NaN * alpha + ...).
                if s != neg_inf:
                    p = math.exp(s - m_new)
                if m_new != neg_inf and m[i] != neg_inf:
                    alpha = math.exp(m[i] - m_new)
                l[i] = l[i] * alpha + warp_sum(p)
                m[i] = m_new
                Ps[rr, lane] = p
                cuda.syncwarp(FULL_MASK)
                kt = min(BK, skv - j0)  # a runtime bound: keys past Skv skipped, loop not unrolled
                for c in range(DPL):
                    dd = lane + 32 * c
                    if dd < d:
                        a = o[i, c] * alpha
                        for jj in range(kt):
                            a += Ps[rr, jj] * Vs[jj, dd]
                        o[i, c] = a
                cuda.syncwarp(FULL_MASK)
            cuda.syncthreads()
        for i in range(RPW):
            r = r0 + warp * RPW + i
            if r < nrows:
                qp = rp[i]
                h = kvh * group + rq[i]
                li = l[i]
                seen = li != zero  # l > 0, or NaN (NaN in, NaN out)
                inv = one / li if seen else zero
                for c in range(DPL):
                    dd = lane + 32 * c
                    if dd < d:
                        # a query that sees no key: zeros (o may hold 0 * NaN from V)
                        y = o[i, c] * inv if seen else zero
                        if nsplit == 1:
                            out[b, h, qp, dd] = y
                        else:
                            part_o[split, b, h, qp, dd] = y
                if nsplit > 1 and lane == 0:
                    part_ml[split, b, h, qp, 0] = m[i]
                    part_ml[split, b, h, qp, 1] = l[i]
                if nsplit == 1 and want_lse and lane == 0:
                    lse[b, h, qp] = m[i] + math.log(li) if seen else neg_inf

    return attention_flash


@lru_cache(maxsize=None)
def combine_kernel(acc_np):
    """out[b, h, i, d] = sum_s o_s l_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s."""
    acc, _ = acc_of(acc_np)
    neg_inf, zero = acc_np(-np.inf), acc_np(0.0)

    @kernel(launch_bounds=(256,))
    def attention_combine(part_o, part_ml, out, lse, want_lse):
        nsplit, nb, hq, sq, d = part_o.shape
        total = nb * hq * sq * d
        g = cuda.grid(1)
        step = cuda.gridsize(1)
        while g < total:
            dd = g % d
            rest = g // d
            i = rest % sq
            rest = rest // sq
            h = rest % hq
            b = rest // hq
            mx = neg_inf
            for s in range(nsplit):
                mx = max(mx, part_ml[s, b, h, i, 0])
            if mx == neg_inf:  # only splits that saw no key, or whose l is NaN, are left
                mx = zero
            num = zero
            den = zero
            for s in range(nsplit):
                ls = part_ml[s, b, h, i, 1]
                if ls != zero:  # saw a key (l > 0), or NaN: NaN carries into num and den
                    w = ls * math.exp(part_ml[s, b, h, i, 0] - mx)
                    num += w * part_o[s, b, h, i, dd]
                    den += w
            out[b, h, i, dd] = zero if den == zero else num / den
            if want_lse and dd == 0:
                lse[b, h, i] = neg_inf if den == zero else mx + math.log(den)
            g += step

    return attention_combine


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _flash_args(dt):
    acc = acc_type(dt)
    return (arr(dt, 4), arr(dt, 4), arr(dt, 4), arr(types.boolean, 4), types.int64, types.boolean, types.float64,
            arr(dt, 4), arr(acc, 5), arr(acc, 5), arr(dt, 3), types.boolean)


def _fitting_dtypes(dmax):
    """The input dtypes whose tiles of width dmax fit in static shared memory (float64 at
    dmax 128 would need 86 KB: the dispatcher refuses it, dispatch/cuda_impls/attention.py)."""
    bq = TILES[dmax][1]
    return tuple(dt for dt in ("float32", "float16", "float64")
                 if attn_shared_bytes(dmax, bq, np.dtype(acc_dtype(np.dtype(dt))).itemsize) <= STATIC_SMEM)


PTX = [
    PtxBuild(f"attention.flash_d{dmax}", "attention", (lambda dmax: lambda dt: flash_kernel(acc_np(dt), dmax))(dmax),
             _flash_args, threads=32 * NW, dtypes=_fitting_dtypes(dmax))
    for dmax in sorted(TILES)
] + [
    PtxBuild("attention.combine", "attention", lambda dt: combine_kernel(acc_np(dt)),
             lambda dt: (arr(acc_type(dt), 5), arr(acc_type(dt), 5), arr(dt, 4), arr(dt, 3), types.boolean),
             threads=256),
]
