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
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, int64, types, uint32, uint64

from kernels_common.attention import MASK_BOOL, MASK_NONE
from kernels_common import acc_dtype
from kernels_common.cuda_tiles import ATTN_BK as BK, ATTN_TILES as TILES, ATTN_WARPS as NW, STATIC_SMEM, attn_shared_bytes
from kernels_common.cuda_tiles import (TC_ATTN_ASYNC_BK, TC_ATTN_ASYNC_PROBED_WARPS, TC_ATTN_ASYNC_STAGES,
                                       TC_ATTN_ASYNC_WARPS, TC_ATTN_BK, TC_ATTN_BQ, TC_ATTN_WARPS, tc_attn_async_kernel)
from kernels_common.cuda_tiles import (DECODE_HEAD_DIMS, DECODE_MAX_ROWS, DECODE_UNROLL, DECODE_WARPS, VEC_ROW_DTYPES,
                                       vec_width)

from ._jit import FULL_MASK, PtxBuild, acc_np, acc_of, acc_type, arr, device, kernel
from .mma import (cp_async16_at, cp_async_commit, cp_async_wait, ex2_approx, ex2_approx_ftz, global_address,
                  ldmatrix_x4, ldmatrix_x4_trans, max_skip_nan, mma_16816, pack_f16x2)
from .primitives import vec_io, warp_max, warp_sum, word_io


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


@device
def udiv32(a, b):
    """a // b for non-negative a, b < 2^32, as a 32-bit division (numba types integer // as
    int64, whose division SASS calls a subroutine for; LLVM narrows the zero-extended one)."""
    return int64(uint32(a) // uint32(b))


@lru_cache(maxsize=None)
def _tc_store_rows(dmax):
    """The epilogue both tensor-core kernels end with: a lane's rows g and g + 8 (rw, rw + 8;
    orow: row g's index among all (batch, head, query) rows) of O / l into the flat out (0 for
    a row that saw no key), and with want_lse its m + log l (base-2 m, so times ln 2; -inf
    for no key) into lse; rows past sq are not stored."""
    ND = dmax // 8
    zero, one, neg_inf = np.float32(0.0), np.float32(1.0), np.float32(-np.inf)
    LN2 = np.float32(math.log(2.0))

    @device
    def store_rows(out, lse, o, m, ls, rw, orow, sq, tq, want_lse):
        for hh in range(2):
            if rw + 8 * hh < sq:
                inv = one / ls[hh] if ls[hh] != zero else zero
                obase = (orow + 8 * hh) * dmax
                for i in range(ND):
                    for e2 in range(2):
                        out[uint64(obase + i * 8 + 2 * tq + e2)] = o[i, 2 * hh + e2] * inv
                if want_lse and tq == 0:
                    lse[uint64(orow + 8 * hh)] = m[hh] * LN2 + math.log(ls[hh]) if ls[hh] != zero else neg_inf

    return store_rows


class _TcSoftmax(NamedTuple):
    """The device functions of _tc_softmax."""
    mask: object
    update: object
    row_sums: object


@lru_cache(maxsize=None)
def _tc_softmax(bk, dmax):
    """The online softmax on m16n8 accumulator fragments that attention_tc_async and
    attention_wgmma run per key tile: a warp's 16 query rows x bk keys of base-2 raw scores
    in sacc (NS = bk / 8 n8 tiles x 4), its 16 rows x dmax of O in o (ND = dmax / 8 x 4);
    lane (g, tq) holds rows rw = rw0 + g (hh = 0) and rw + 8 (hh = 1), columns 8j + 2tq + e2.
      mask(sacc, j0, rw0, rw, off, skv, causal, tq): -inf at keys j0 + 8j + 2tq + e2 past skv
        or above the causal diagonal (key > row + off, off = skv - sq), only in a tile that
        has such keys for some row of the warp (row rw0 has the lowest causal limit);
      update(sacc, m, ls, o, sc): per row, the tile's max of the raw scores (a NaN takes no
        part) times sc (scale x log2 e) against the running max m, p = 2^(s sc - m) in place
        of the scores, the lane's partial row sums ls and O rescaled by 2^(m_old - m_new);
      row_sums(ls): the 4 lanes' partial sums of each row added (once, at the end)."""
    BK, NS, ND = bk, bk // 8, dmax // 8
    neg_inf, zero = np.float32(-np.inf), np.float32(0.0)

    @device
    def mask(sacc, j0, rw0, rw, off, skv, causal, tq):
        if j0 + BK > skv or (causal and j0 + BK > rw0 + off + 1):
            for hh in range(2):
                limit = skv
                if causal:
                    limit = min(skv, rw + 8 * hh + off + 1)
                # key j0 + 8j + 2tq + e2 >= limit, as 32-bit compares with constants
                rel = int32(max(-1, min(BK, limit - j0 - 2 * tq)))
                for j in range(NS):
                    for e2 in range(2):
                        if j * 8 + e2 >= rel:
                            sacc[j, 2 * hh + e2] = neg_inf

    @device
    def update(sacc, m, ls, o, sc):
        for hh in range(2):
            mx = neg_inf  # the tile's raw row max (a NaN score takes no part)
            for j in range(NS):
                for e2 in range(2):
                    mx = max_skip_nan(mx, sacc[j, 2 * hh + e2])
            mx = max_skip_nan(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 1))
            mx = max_skip_nan(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 2))
            mn = max_skip_nan(mx * sc, m[hh])
            # no key seen yet (mn = -inf): subtract 0 instead, so that every p and the
            # rescale of the (empty) state are 2^-inf = 0, without a branch
            mz = mn if mn != neg_inf else zero
            alpha = ex2_approx_ftz(m[hh] - mz)
            rs = zero
            for j in range(NS):
                for e2 in range(2):
                    pv = ex2_approx_ftz(sacc[j, 2 * hh + e2] * sc - mz)
                    sacc[j, 2 * hh + e2] = pv
                    rs += pv
            ls[hh] = ls[hh] * alpha + rs
            m[hh] = mn
            for i in range(ND):
                o[i, 2 * hh] *= alpha
                o[i, 2 * hh + 1] *= alpha

    @device
    def row_sums(ls):
        for hh in range(2):
            lsum = ls[hh] + cuda.shfl_xor_sync(FULL_MASK, ls[hh], 1)
            ls[hh] = lsum + cuda.shfl_xor_sync(FULL_MASK, lsum, 2)

    return _TcSoftmax(mask, update, row_sums)


@lru_cache(maxsize=None)
def flash_tc_kernel(dmax):
    """float16 flash attention on tensor cores (mma.m16n8k16, float32 accumulation), no mask,
    head dim exactly dmax (64 or 128), one pass (no KV split).  A block of TC_ATTN_WARPS
    warps owns TC_ATTN_BQ query rows of one (batch, query head), warp w rows 16w..16w+15;
    K/V tiles of TC_ATTN_BK[dmax] keys stream through shared memory, K as rows of 32-bit pairs
    along d (the QK^T "col" operand), V transposed into pairs along keys (the PV operand:
    each thread turns two keys' words of two columns into two columns' pairs).  Per tile:
      S = Q K^T: the warp's 16 x BK scores, Q's fragments in registers for the whole pass
        (32-bit loads of the input pairs), then scaled in float32, -inf past the keys and
        above the causal diagonal (bottom-right: query i sees keys <= i + Skv - Sq);
      online softmax on the accumulators: a lane holds columns 2t, 2t + 1 of every n8 tile
        for rows g and g + 8, so a row's max and sum are the lane's 16 values and two
        shuffles within its group of 4 lanes;
      O += P V with P rounded to float16 pairs straight from S's registers (the C layout of
        one mma is the A layout of the next: no shared memory round trip).
    Tiles past the causal limit of the block's last row are not loaded.  The output is O / l
    (0 for a query that sees no key), lse = m + log l (-inf then) when want_lse.  NaN in a
    score makes its row NaN (it takes no part in the max, and exp(NaN) poisons l and O), as
    the other kernels.  q, k, v are flat uint32 views of the C-contiguous float16 (B, H, S,
    dmax) arrays; out and lse flat float16 views of (B, H, S, dmax) and (B, H, S)."""
    BQ, BK, NWT = TC_ATTN_BQ, TC_ATTN_BK[dmax], TC_ATTN_WARPS
    DW = dmax // 2              # words per row
    KLD = DW + 4                # K rows padded: fragment reads at word 36 g + t / 68 g + t hit 32 banks
    VLD = BK // 2 + 4           # V^T rows (32 words of key pairs) padded likewise
    KS = dmax // 16             # k-steps of QK^T
    NS = BK // 8                # n8 tiles of S
    ND = dmax // 8              # n8 tiles of O
    NT = 32 * NWT
    assert NT % DW == 0, "a block's threads load whole rows of words"
    RSTEP = NT // DW            # rows a block's load step covers
    K_LOADS = BK // RSTEP
    V_PAIRS = (BK // 2) // RSTEP
    V_WORDS = 2 * V_PAIRS       # V words a thread holds between load_v and store_v
    neg_inf, zero = np.float32(-np.inf), np.float32(0.0)
    LOG2E = math.log2(math.e)
    store_rows = _tc_store_rows(dmax)
    LO = uint32(0xFFFF)
    HI = uint32(0xFFFF0000)

    @device
    def load_k(k, Ks, kvw, j0, skv, cw, r0t, partial):
        """K rows of the tile as words into Ks, each load at a constant offset from one view's
        start ([R + imm] in SASS: one 64-bit address for all, where a 64-bit address per load
        filled the 255 registers and spilled at d = 128, ptxas sm_80/87).  `partial` (a
        constant at each call: the test folds away) reads only keys below skv, the others as
        zeros (their scores become -inf); a whole tile keeps no per-load predicate alive.
        (The view's start is clamped to the array's end only where all of this thread's keys
        are past skv: nothing is read.)"""
        kt = k[uint64(kvw + (j0 + r0t) * DW + cw):]
        for l in range(K_LOADS):
            kr = r0t + l * RSTEP
            Ks[kr, cw] = kt[uint64(l * RSTEP * DW)] if not partial or j0 + kr < skv else uint32(0)

    @device
    def load_v(v, vw, kvw, j0, skv, cw, r0t, partial):
        """The tile's V words this thread stores later (store_v) into registers vw: keys 2p,
        2p + 1 of word column cw for its pairs p (`partial` and the offsets as load_k)."""
        vt = v[uint64(kvw + (j0 + 2 * r0t) * DW + cw):]
        for l in range(V_PAIRS):
            key = j0 + 2 * (r0t + l * RSTEP)
            vw[2 * l] = vt[uint64(2 * l * RSTEP * DW)] if not partial or key < skv else uint32(0)
            vw[2 * l + 1] = vt[uint64((2 * l * RSTEP + 1) * DW)] if not partial or key + 1 < skv else uint32(0)

    @device
    def store_v(vw, Vs, cw, r0t):
        """keys 2p, 2p + 1 of columns 2c, 2c + 1 -> V^T rows 2c, 2c + 1 at word p"""
        for l in range(V_PAIRS):
            kp = r0t + l * RSTEP
            w0 = vw[2 * l]
            w1 = vw[2 * l + 1]
            Vs[2 * cw, kp] = (w0 & LO) | (w1 << 16)
            Vs[2 * cw + 1, kp] = (w0 >> 16) | (w1 & HI)

    @kernel(launch_bounds=(NT, 2))
    def attention_tc(q, k, v, nb, hq, sq, hkv, skv, causal, scale, out, lse, want_lse):
        # the block's (batch, head, query tile) in 32-bit divisions (udiv32): numba's int64
        # ones are subroutine calls in SASS (and cost the d = 128 build 9-11 more registers)
        nqb = (sq + BQ - 1) // BQ
        bh = udiv32(cuda.blockIdx.x, nqb)
        r0 = (cuda.blockIdx.x - bh * nqb) * BQ
        b = udiv32(bh, hq)
        h = bh - b * hq
        kvh = udiv32(h, udiv32(hq, hkv))
        t = cuda.threadIdx.x
        lane = t & 31
        warp = t >> 5
        g = lane >> 2
        tq = lane & 3
        Ks = cuda.shared.array((BK, KLD), uint32)
        Vs = cuda.shared.array((dmax, VLD), uint32)
        qa = cuda.local.array((KS, 4), uint32)
        sacc = cuda.local.array((NS, 4), float32)
        o = cuda.local.array((ND, 4), float32)
        m = cuda.local.array(2, float32)
        ls = cuda.local.array(2, float32)
        off = skv - sq
        sc = float32(scale * LOG2E)  # scores in base 2: exp(s) = 2^(s log2 e), one MUFU.EX2 each
        # this warp's query rows g and g + 8 (clamped for the loads; rows past sq are not stored)
        rw = r0 + warp * 16 + g
        orow = bh * sq + rw  # row g's index among all (batch, head, query) rows: the epilogue's one index
        qbase = ((b * hq + h) * sq) * DW
        row_a = uint64(qbase + min(rw, sq - 1) * DW)
        row_b = uint64(qbase + min(rw + 8, sq - 1) * DW)
        for ks in range(KS):
            w0 = uint64(ks * 8 + tq)
            qa[ks, 0] = q[row_a + w0]
            qa[ks, 1] = q[row_b + w0]
            qa[ks, 2] = q[row_a + w0 + 4]
            qa[ks, 3] = q[row_b + w0 + 4]
        for i in range(ND):
            for r in range(4):
                o[i, r] = zero
        for hh in range(2):
            m[hh] = neg_inf
            ls[hh] = zero
        kv_end = skv
        if causal:
            kv_end = min(skv, max(0, min(sq, r0 + BQ) - 1 + off + 1))
        kvw = (b * hkv + kvh) * skv * DW  # the (batch, kv head)'s first word
        # thread t loads word cw = t % DW of rows t // DW, + RSTEP, ... of each tile: the
        # index arithmetic of a load is an add, a min and a multiply-add (per-element
        # division and 64-bit products made the load loops 51 instructions a word, ptxas sm_90)
        cw = t % DW
        r0t = t // DW
        vw = cuda.local.array(V_WORDS, uint32)
        for j0 in range(0, kv_end, BK):
            # K into shared memory now; V's words stay in registers until S and P are done, so
            # their loads overlap QK^T and the softmax.  (Ks is free: every warp passed the
            # barrier after its last QK^T; Vs only after the barrier below.)
            if j0 + BK <= skv:  # block-uniform: a whole tile, no key to clamp
                load_k(k, Ks, kvw, j0, skv, cw, r0t, False)
                load_v(v, vw, kvw, j0, skv, cw, r0t, False)
            else:
                load_k(k, Ks, kvw, j0, skv, cw, r0t, True)
                load_v(v, vw, kvw, j0, skv, cw, r0t, True)
            cuda.syncthreads()
            for j in range(NS):
                for r in range(4):
                    sacc[j, r] = zero
            for ks in range(KS):
                for j in range(NS):
                    kr = j * 8 + g
                    d0, d1, d2, d3 = mma_16816(qa[ks, 0], qa[ks, 1], qa[ks, 2], qa[ks, 3],
                                               Ks[kr, ks * 8 + tq], Ks[kr, ks * 8 + tq + 4],
                                               sacc[j, 0], sacc[j, 1], sacc[j, 2], sacc[j, 3])
                    sacc[j, 0] = d0
                    sacc[j, 1] = d1
                    sacc[j, 2] = d2
                    sacc[j, 3] = d3
            # scale, mask, and the online softmax of rows g (hh = 0) and g + 8 (hh = 1)
            for hh in range(2):
                row = rw + 8 * hh
                limit = skv
                if causal:
                    limit = min(skv, row + off + 1)
                mx = m[hh]
                for j in range(NS):
                    for e2 in range(2):
                        key = j0 + j * 8 + 2 * tq + e2
                        sv = sacc[j, 2 * hh + e2] * sc
                        if key >= limit:
                            sv = neg_inf
                        sacc[j, 2 * hh + e2] = sv
                        if sv > mx:
                            mx = sv
                mo = cuda.shfl_xor_sync(FULL_MASK, mx, 1)
                if mo > mx:
                    mx = mo
                mo = cuda.shfl_xor_sync(FULL_MASK, mx, 2)
                if mo > mx:
                    mx = mo
                # no key seen yet (mx = -inf): subtract 0 instead, so that every p and the
                # rescale of the (empty) state are 2^-inf = 0, without a branch
                mz = mx if mx != neg_inf else zero
                alpha = ex2_approx(m[hh] - mz)
                rs = zero
                for j in range(NS):
                    for e2 in range(2):
                        pv = ex2_approx(sacc[j, 2 * hh + e2] - mz)
                        sacc[j, 2 * hh + e2] = pv
                        rs += pv
                rs += cuda.shfl_xor_sync(FULL_MASK, rs, 1)
                rs += cuda.shfl_xor_sync(FULL_MASK, rs, 2)
                ls[hh] = ls[hh] * alpha + rs
                m[hh] = mx
                for i in range(ND):
                    o[i, 2 * hh] *= alpha
                    o[i, 2 * hh + 1] *= alpha
            store_v(vw, Vs, cw, r0t)
            cuda.syncthreads()
            # O += P V: P's A fragments from S's registers, k-step kk = keys 16kk..16kk + 15
            for kk in range(BK // 16):
                a0 = pack_f16x2(sacc[2 * kk, 0], sacc[2 * kk, 1])
                a1 = pack_f16x2(sacc[2 * kk, 2], sacc[2 * kk, 3])
                a2 = pack_f16x2(sacc[2 * kk + 1, 0], sacc[2 * kk + 1, 1])
                a3 = pack_f16x2(sacc[2 * kk + 1, 2], sacc[2 * kk + 1, 3])
                for i in range(ND):
                    dr = i * 8 + g
                    d0, d1, d2, d3 = mma_16816(a0, a1, a2, a3, Vs[dr, kk * 8 + tq], Vs[dr, kk * 8 + tq + 4],
                                               o[i, 0], o[i, 1], o[i, 2], o[i, 3])
                    o[i, 0] = d0
                    o[i, 1] = d1
                    o[i, 2] = d2
                    o[i, 3] = d3
        store_rows(out, lse, o, m, ls, rw, orow, sq, tq, want_lse)

    return attention_tc


@lru_cache(maxsize=None)
def flash_tc_async_kernel(dmax, warps=TC_ATTN_ASYNC_WARPS, bk=0, stages=0, min_blocks=0):
    """flash_tc_kernel's float16 attention (same arguments, results, special values, causal
    rule, lse and NaN behaviour) with a cp.async pipeline and ldmatrix fragments, for q, k, v
    16-byte aligned (the dispatcher checks; rows of dmax = 64 or 128 halves are then whole
    16-byte chunks) on sm_80 and later.  A block of `warps` warps owns 16 x warps query rows
    of one (batch, query head), warp w rows 16w..16w+15 (Q's fragments in registers for the
    whole pass, as flash_tc_kernel); K/V tiles of bk keys (TC_ATTN_ASYNC_BK[dmax] when 0) in
    `stages` buffers (TC_ATTN_ASYNC_STAGES when 0), launch bounds of min_blocks blocks per SM
    (when 0: 2 below 8 warps, else 1).
      Loads: each thread copies the same chunk of bk * dmax / (4 x 32 x warps) rows of K and
    of V per tile global -> shared by cp.async (16 bytes a copy, no registers staged); keys
    past Skv read as zeros (source size 0, from a clamped in-range address).  Tiles j + 1 ..
    j + stages - 1 are in flight while tile j is computed; per tile one barrier: wait for tile
    j's group, __syncthreads (its chunks are visible to all and every warp is done with tile
    j - 1), issue tile j + stages - 1 into tile j - 1's buffer, compute tile j.
      Shared layout: per stage the K tile then the V tile, both row-major as in memory (a row
    of dmax halves = dmax / 8 chunks of 16 bytes), chunk c of key row r stored at chunk
    c ^ (r & 7) (no padding): the eight rows one ldmatrix matrix reads, and the eight chunks
    a quarter-warp's cp.async writes, fall in eight different 16-byte bank groups.
      Fragments: S = Q K^T takes K's "col" B operand (b0 = K[key g, d 2t:2t+2]) by ldmatrix.x4
    from K's rows (b0, b1 of two n8 tiles of keys per k-step of 16 along d); O += P V takes V's
    (b0 = V[keys 2t, 2t+1, column g]) by ldmatrix.x4.trans from V's rows (b0, b1 of two n8
    tiles of columns per k-step of 16 keys): no thread transposes V.
      Softmax, per tile: the scores' row max (raw scores: q is negated instead when scale < 0,
    exactly in float16, so the scale in the exponent is positive; 0 is taken as 1e-30, which
    gives the same probabilities), p = 2^(s x scale x log2 e - m) by one FFMA and one MUFU.EX2,
    the running m and each lane's partial row sum l rescaled (the 4 lanes of a row are summed
    once, at the end); P from S's registers as flash_tc_kernel.  Keys past Skv and above the
    causal diagonal are set to -inf only in tiles that have such keys for some row of the
    warp; a warp skips the tiles none of its rows sees (a block's tiles end at its last row's
    causal limit, as flash_tc_kernel's).  Causal grids run their query blocks last first (the
    blocks with the most tiles start first: a shorter tail)."""
    BK = bk or TC_ATTN_ASYNC_BK[dmax]
    STAGES = stages or TC_ATTN_ASYNC_STAGES
    NWT = warps
    BQ = 16 * NWT
    NT = 32 * NWT
    DW = dmax // 2              # words per row of K, V (and Q)
    CH = dmax // 8              # 16-byte chunks per row
    KVW = BK * DW               # words of a K (or V) tile
    SW = 2 * KVW                # words of a stage
    S_WORDS = STAGES * SW
    RSTEP = NT // CH            # rows one pass of the block's copies covers
    CP = BK // RSTEP            # copies per thread per K (and per V) tile
    ROWB = DW * 4               # bytes per row
    KS = dmax // 16             # k-steps of QK^T
    NS = BK // 8                # n8 tiles of S
    ND = dmax // 8              # n8 tiles of O
    assert dmax in (64, 128) and NT % CH == 0 and RSTEP % 8 == 0 and BK % RSTEP == 0 and BK % 16 == 0
    assert STAGES >= 2 and S_WORDS * 4 <= STATIC_SMEM
    WAIT = STAGES - 2           # groups left pending when tile j must be complete
    # blocks per SM of the launch bound: 255 registers either way by default; min_blocks (a
    # probe's choice) caps them lower (3 blocks of 4 warps: 170)
    MINB = min_blocks or (1 if NWT >= 8 else 2)
    neg_inf, zero = np.float32(-np.inf), np.float32(0.0)
    LOG2E = math.log2(math.e)
    store_rows = _tc_store_rows(dmax)
    smx = _tc_softmax(BK, dmax)
    mask_tile, softmax_update, row_sums = smx.mask, smx.update, smx.row_sums
    TINY = np.float32(1e-30)
    SIGNS = uint32(0x80008000)

    @device
    def load_tile(S, base, gk, gv, dst, j0, r0t, skv):
        """Issue the copies of this thread for the K/V tile of keys j0.. into the stage at word
        base: gk, gv the global_address of its chunk in key row 0 of the (batch, kv head), dst
        its first word in a tile.  A whole tile copies from one address plus constants; the
        last, partial one reads rows past skv as zeros (clamped addresses, size 0)."""
        if j0 + BK <= skv:
            step = uint64((j0 + r0t) * ROWB)
            ak = gk + step
            av = gv + step
            for l in range(CP):
                cp_async16_at(S, base + dst + l * RSTEP * DW, ak + uint64(l * RSTEP * ROWB), 16)
                cp_async16_at(S, base + KVW + dst + l * RSTEP * DW, av + uint64(l * RSTEP * ROWB), 16)
        else:
            for l in range(CP):
                row = j0 + r0t + l * RSTEP
                nbytes = 16 if row < skv else 0
                at = uint64(min(row, skv - 1) * ROWB)
                cp_async16_at(S, base + dst + l * RSTEP * DW, gk + at, nbytes)
                cp_async16_at(S, base + KVW + dst + l * RSTEP * DW, gv + at, nbytes)

    @kernel(launch_bounds=(NT, MINB))
    def attention_tc_async(q, k, v, nb, hq, sq, hkv, skv, causal, scale, out, lse, want_lse):
        nqb = (sq + BQ - 1) // BQ
        bh = udiv32(cuda.blockIdx.x, nqb)
        qb = cuda.blockIdx.x - bh * nqb
        if causal:  # the last query blocks (the most key tiles) first
            qb = nqb - 1 - qb
        r0 = qb * BQ
        b = udiv32(bh, hq)
        h = bh - b * hq
        kvh = udiv32(h, udiv32(hq, hkv))
        t = cuda.threadIdx.x
        lane = t & 31
        warp = t >> 5
        g = lane >> 2
        tq = lane & 3
        S = cuda.shared.array(S_WORDS, uint32, alignment=128)
        qa = cuda.local.array((KS, 4), uint32)
        sacc = cuda.local.array((NS, 4), float32)
        o = cuda.local.array((ND, 4), float32)
        m = cuda.local.array(2, float32)
        ls = cuda.local.array(2, float32)
        koff = cuda.local.array(4, int32)
        voff = cuda.local.array(4, int32)
        off = skv - sq
        # scores in base 2 (exp(s) = 2^(s log2 e)) with a positive scale: a negative one negates q
        sc = float32(abs(scale) * LOG2E)
        if sc == zero:
            sc = TINY
        flip = SIGNS if scale < 0 else uint32(0)
        rw0 = r0 + warp * 16        # the warp's first query row
        rw = rw0 + g                # this lane's rows rw and rw + 8 (clamped for the loads)
        orow = bh * sq + rw
        qbase = ((b * hq + h) * sq) * DW
        row_a = uint64(qbase + min(rw, sq - 1) * DW)
        row_b = uint64(qbase + min(rw + 8, sq - 1) * DW)
        for ks in range(KS):
            w0 = uint64(ks * 8 + tq)
            qa[ks, 0] = q[row_a + w0] ^ flip
            qa[ks, 1] = q[row_b + w0] ^ flip
            qa[ks, 2] = q[row_a + w0 + 4] ^ flip
            qa[ks, 3] = q[row_b + w0 + 4] ^ flip
        for i in range(ND):
            for r in range(4):
                o[i, r] = zero
        for hh in range(2):
            m[hh] = neg_inf
            ls[hh] = zero
        kv_end = skv
        if causal:
            kv_end = min(skv, max(0, min(sq, r0 + BQ) + off))
        ntiles = (kv_end + BK - 1) // BK
        # this thread's copies: chunk ch of rows r0t, r0t + RSTEP, ... of each tile
        ch = t % CH
        r0t = t // CH
        dst = r0t * DW + ((ch ^ (r0t & 7)) << 2)
        kvw = (b * hkv + kvh) * skv * DW
        gk = global_address(k, kvw + ch * 4)
        gv = global_address(v, kvw + ch * 4)
        # ldmatrix rows of this lane: lane 8 mi + r8 addresses row r8 of matrix mi.  K (x4):
        # matrices (keys +0, d chunk 2ks), (+0, 2ks + 1), (+8, 2ks), (+8, 2ks + 1); V (x4.trans):
        # (keys +0, column chunk 2i), (+8, 2i), (+0, 2i + 1), (+8, 2i + 1).  Key rows of a
        # matrix start at multiples of 8, so a row's swizzle is ^ r8; koff / voff per k-step mod 4
        mi = lane >> 3
        r8 = lane & 7
        for qq in range(4):
            koff[qq] = (8 * (mi >> 1) + r8) * DW + (((2 * qq + (mi & 1)) ^ r8) << 2)
            voff[qq] = KVW + (8 * (mi & 1) + r8) * DW + (((2 * qq + (mi >> 1)) ^ r8) << 2)
        for s in range(STAGES - 1):  # prologue: tiles 0 .. STAGES - 2 in flight, a group each
            if s < ntiles:
                load_tile(S, s * SW, gk, gv, dst, s * BK, r0t, skv)
            cp_async_commit()
        rb = 0                       # the stage read this iteration
        wb = (STAGES - 1) * SW       # the stage written
        for it in range(ntiles):
            cp_async_wait(WAIT)      # this thread's copies of tile it are complete
            cuda.syncthreads()       # everyone's are; every warp is done with tile it - 1
            nt = it + STAGES - 1
            if nt < ntiles:          # into tile it - 1's buffer
                load_tile(S, wb, gk, gv, dst, nt * BK, r0t, skv)
            cp_async_commit()
            j0 = it * BK
            if not causal or j0 <= rw0 + 15 + off:  # warp-uniform: some row of the warp sees a key
                for j in range(NS):
                    for r in range(4):
                        sacc[j, r] = zero
                for ks in range(KS):
                    kb = rb + koff[ks & 3] + 32 * (ks >> 2)
                    for jj in range(NS // 2):
                        b0, b1, b2, b3 = ldmatrix_x4(S, kb + jj * 16 * DW)
                        j = 2 * jj
                        d0, d1, d2, d3 = mma_16816(qa[ks, 0], qa[ks, 1], qa[ks, 2], qa[ks, 3], b0, b1,
                                                   sacc[j, 0], sacc[j, 1], sacc[j, 2], sacc[j, 3])
                        sacc[j, 0] = d0
                        sacc[j, 1] = d1
                        sacc[j, 2] = d2
                        sacc[j, 3] = d3
                        d0, d1, d2, d3 = mma_16816(qa[ks, 0], qa[ks, 1], qa[ks, 2], qa[ks, 3], b2, b3,
                                                   sacc[j + 1, 0], sacc[j + 1, 1], sacc[j + 1, 2], sacc[j + 1, 3])
                        sacc[j + 1, 0] = d0
                        sacc[j + 1, 1] = d1
                        sacc[j + 1, 2] = d2
                        sacc[j + 1, 3] = d3
                # -inf past Skv and above the diagonal; the online softmax of rows rw and rw + 8
                mask_tile(sacc, j0, rw0, rw, off, skv, causal, tq)
                softmax_update(sacc, m, ls, o, sc)
                # O += P V: P's A fragments from S's registers, k-step kk = keys 16kk..16kk + 15
                for kk in range(BK // 16):
                    a0 = pack_f16x2(sacc[2 * kk, 0], sacc[2 * kk, 1])
                    a1 = pack_f16x2(sacc[2 * kk, 2], sacc[2 * kk, 3])
                    a2 = pack_f16x2(sacc[2 * kk + 1, 0], sacc[2 * kk + 1, 1])
                    a3 = pack_f16x2(sacc[2 * kk + 1, 2], sacc[2 * kk + 1, 3])
                    for ii in range(ND // 2):
                        b0, b1, b2, b3 = ldmatrix_x4_trans(S, rb + voff[ii & 3] + 32 * (ii >> 2) + kk * 16 * DW)
                        i = 2 * ii
                        d0, d1, d2, d3 = mma_16816(a0, a1, a2, a3, b0, b1, o[i, 0], o[i, 1], o[i, 2], o[i, 3])
                        o[i, 0] = d0
                        o[i, 1] = d1
                        o[i, 2] = d2
                        o[i, 3] = d3
                        d0, d1, d2, d3 = mma_16816(a0, a1, a2, a3, b2, b3,
                                                   o[i + 1, 0], o[i + 1, 1], o[i + 1, 2], o[i + 1, 3])
                        o[i + 1, 0] = d0
                        o[i + 1, 1] = d1
                        o[i + 1, 2] = d2
                        o[i + 1, 3] = d3
            rb += SW
            if rb == S_WORDS:
                rb = 0
            wb += SW
            if wb == S_WORDS:
                wb = 0
        cp_async_wait(0)  # nothing left in flight (the groups past the last tile are empty)
        row_sums(ls)
        store_rows(out, lse, o, m, ls, rw, orow, sq, tq, want_lse)

    return attention_tc_async


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


@lru_cache(maxsize=None)
def decode_kernel(acc_np, vec, d, rows):
    """Split-KV attention for few query rows (decode), read in 16-byte vectors.

    q (B, Hq, Sq, d), k, v (B, Hkv, Skv, d) of an item size of 16 / vec bytes; the block of
    grid x = (batch x kv head) x splits x rgroups owns `rows` (DECODE_MAX_ROWS at most) of
    the (query head of the group, query position) rows of one (batch, kv head), row group g
    the rows g rows .. (rgroups groups cover the group x Sq rows; a group's blocks are
    adjacent, so the K/V tiles the later ones read come from L2), against the keys of its
    split (a contiguous range of Skv / splits).  A key's row is read by L = d / vec
    lanes, each its vec dims (lane l % L: dims vec (l % L) ..), so a warp takes 32 / L keys a
    step and DECODE_UNROLL steps at once (their K and V loads in flight together); the lanes
    of a key sum their partial q.k by xor-shuffles within the group of L.  Per row and lane
    group: an online softmax state (m, l) and the lane's vec output dims, rescaled once per
    unrolled chunk.  At the end the block merges its lane groups' states through shared
    memory: with one split it writes out = o / l (0 for a row that saw no key) and lse = m +
    log l; with several, the split's o / l and (m, l) to part_o (splits, B, Hq, Sq, d) and
    part_ml (splits, B, Hq, Sq, 2) for combine_kernel.  Causal: query i sees keys <= i + Skv -
    Sq.  NaN in a score makes its row NaN (the max skips it, exp(NaN) poisons l and o), -inf
    scores add nothing, as the flash kernels."""
    acc, _ = acc_of(acc_np)
    L = d // vec                 # lanes per key
    KPW = 32 // L                # keys per warp step
    U = DECODE_UNROLL
    NWD = DECODE_WARPS
    NT = 32 * NWD
    NG = NWD * KPW               # lane groups in the block
    RV = rows * vec
    U4 = U * 4                   # words of U vectors
    URV = U * rows
    HALVES = vec == 8            # float16 (two elements a word), else float32 (one; float64 is refused)
    assert vec in (4, 8)
    CHUNK = NWD * KPW * U        # keys a block step covers
    assert L * KPW == 32 and L & (L - 1) == 0
    neg_inf, zero = acc_np(-np.inf), acc_np(0.0)
    load_vec, _ = vec_io(vec)
    load_words, half_of, float_of = word_io()

    # blocks per SM the launch bound promises: registers for `rows` rows of q and output in
    # float32 and U keys of K and V as loaded (ptxas float16 d = 128, no spills: sm_90 79 /
    # 108 / 156 registers at 1 / 2 / 4 rows, sm_80 95 / 154 / 226; 4 rows spilled 224 bytes
    # under 4 blocks' 128)
    @kernel(launch_bounds=(NT, {1: 4, 2: 3}.get(rows, 2)))
    def attention_decode(q, k, v, causal, scale, splits, rgroups, out, part_o, part_ml, lse, want_lse):
        nb, hq, sq, dd = q.shape
        hkv = k.shape[1]
        skv = k.shape[2]
        # 32-bit divisions (udiv32): numba's int64 ones are subroutine calls in SASS, whose
        # registers spilled on sm_80
        group = udiv32(hq, hkv)
        blk = cuda.blockIdx.x
        bs = udiv32(blk, rgroups)  # the row group fastest: its blocks read the same K/V (from L2)
        r0 = (blk - bs * rgroups) * rows
        nrows = min(rows, group * sq - r0)  # this block's rows: r0 .. r0 + nrows - 1 of the kv head's
        bk = udiv32(bs, splits)
        split = bs - bk * splits
        b = udiv32(bk, hkv)
        kvh = bk - b * hkv
        per = udiv32(skv + splits - 1, splits)
        j_lo = split * per
        j_hi = min(skv, j_lo + per)
        t = cuda.threadIdx.x
        lane = t & 31
        warp = t >> 5
        sub = lane // L            # this lane's key within a warp step
        c0 = (lane % L) * vec      # its first dim
        grp = warp * KPW + sub     # its lane group in the block
        sm_m = cuda.shared.array((NG, rows), acc)
        sm_l = cuda.shared.array((NG, rows), acc)
        sm_o = cuda.shared.array((NG, rows, d), acc)
        qv = cuda.local.array(RV, acc)
        o = cuda.local.array(RV, acc)
        m = cuda.local.array(rows, acc)
        ls = cuda.local.array(rows, acc)
        lim = cuda.local.array(rows, int64)
        kw = cuda.local.array(U4, uint32)  # K and V vectors as loaded: 4 words each
        vw = cuda.local.array(U4, uint32)
        sc = cuda.local.array(URV, acc)
        sca = acc(scale)
        for r in range(rows):
            m[r] = neg_inf
            ls[r] = zero
            lim[r] = 0
            for i in range(vec):
                o[r * vec + i] = zero
                qv[r * vec + i] = zero
            if r < nrows:
                hg = udiv32(r0 + r, sq)
                h = kvh * group + hg
                qi = r0 + r - hg * sq
                load_vec(q, (b, h, qi, c0), qv, r * vec)
                for i in range(vec):
                    qv[r * vec + i] *= sca
                lim[r] = min(skv, qi + skv - sq + 1) if causal else skv
        # keys j0 + warp * KPW * U + u * KPW + sub of each block step
        for j0 in range(j_lo, j_hi, CHUNK):
            jw = j0 + warp * (KPW * U) + sub
            for u in range(U):
                j = jw + u * KPW
                if j < j_hi:
                    load_words(k, (b, kvh, j, c0), kw, 4 * u)
                    load_words(v, (b, kvh, j, c0), vw, 4 * u)
                else:  # zeros: p = 0 times stale bits could be 0 * NaN
                    for wi in range(4):
                        kw[4 * u + wi] = uint32(0)
                        vw[4 * u + wi] = uint32(0)
            for u in range(U):
                j = jw + u * KPW
                for r in range(rows):
                    s = zero
                    for wi in range(4):
                        w = kw[4 * u + wi]
                        if HALVES:
                            s += qv[r * vec + 2 * wi] * half_of(w, 0) + qv[r * vec + 2 * wi + 1] * half_of(w, 1)
                        else:
                            s += qv[r * vec + wi] * float_of(w)
                    off = L >> 1
                    while off > 0:  # the key's L lanes: xor-shuffles within the group
                        s += cuda.shfl_xor_sync(FULL_MASK, s, off)
                        off >>= 1
                    sc[u * rows + r] = s if j < j_hi and j < lim[r] else neg_inf
            for r in range(rows):
                mx = m[r]
                for u in range(U):
                    if sc[u * rows + r] > mx:
                        mx = sc[u * rows + r]
                mz = mx if mx != neg_inf else zero  # nothing seen yet: every term below is 0
                alpha = math.exp(m[r] - mz)
                ls[r] *= alpha
                for i in range(vec):
                    o[r * vec + i] *= alpha
                for u in range(U):
                    p = math.exp(sc[u * rows + r] - mz)
                    ls[r] += p
                    for wi in range(4):
                        w = vw[4 * u + wi]
                        if HALVES:
                            o[r * vec + 2 * wi] += p * half_of(w, 0)
                            o[r * vec + 2 * wi + 1] += p * half_of(w, 1)
                        else:
                            o[r * vec + wi] += p * float_of(w)
                m[r] = mx
        # merge the NG lane groups' states: every lane of a group holds the same (m, l)
        for r in range(rows):
            if lane % L == 0:
                sm_m[grp, r] = m[r]
                sm_l[grp, r] = ls[r]
            for i in range(vec):
                sm_o[grp, r, c0 + i] = o[r * vec + i]
        cuda.syncthreads()
        for e in range(t, nrows * d, NT):
            r = e // d
            c = e - r * d
            mx = neg_inf
            for gi in range(NG):
                if sm_m[gi, r] > mx:
                    mx = sm_m[gi, r]
            mz = mx if mx != neg_inf else zero
            num = zero
            den = zero
            for gi in range(NG):
                w = math.exp(sm_m[gi, r] - mz)
                den += sm_l[gi, r] * w
                num += sm_o[gi, r, c] * w
            hg = udiv32(r0 + r, sq)
            h = kvh * group + hg
            qi = r0 + r - hg * sq
            res = zero if den == zero else num / den
            if splits == 1:
                out[b, h, qi, c] = res
                if want_lse and c == 0:
                    lse[b, h, qi] = neg_inf if den == zero else mx + math.log(den)
            else:
                part_o[split, b, h, qi, c] = res
                if c == 0:
                    part_ml[split, b, h, qi, 0] = mx
                    part_ml[split, b, h, qi, 1] = den

    return attention_decode


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _flash_args(dt):
    acc = acc_type(dt)
    return (arr(dt, 4), arr(dt, 4), arr(dt, 4), arr(types.boolean, 4), types.int64, types.boolean, types.float64,
            arr(dt, 4), arr(acc, 5), arr(acc, 5), arr(dt, 3), types.boolean)


def _decode_args(dt):
    acc = acc_type(dt)
    return (arr(dt, 4), arr(dt, 4), arr(dt, 4), types.boolean, types.float64, types.int64, types.int64, arr(dt, 4),
            arr(acc, 5), arr(acc, 5), arr(dt, 3), types.boolean)


def _fitting_dtypes(dmax):
    """The input dtypes whose tiles of width dmax fit in static shared memory (float64 at
    dmax 128 would need 86 KB: the dispatcher refuses it, dispatch/cuda_impls/attention.py)."""
    bq = TILES[dmax][1]
    return tuple(dt for dt in ("float32", "float16", "float64")
                 if attn_shared_bytes(dmax, bq, np.dtype(acc_dtype(np.dtype(dt))).itemsize) <= STATIC_SMEM)


def _flash_tc_args(dt):
    i64, u32 = types.int64, types.uint32
    return (arr(u32, 1), arr(u32, 1), arr(u32, 1), i64, i64, i64, i64, i64, types.boolean, types.float64, arr(dt, 1),
            arr(dt, 1), types.boolean)


PTX = [
    PtxBuild(f"attention.flash_d{dmax}", "attention", (lambda dmax: lambda dt: flash_kernel(acc_np(dt), dmax))(dmax),
             _flash_args, threads=32 * NW, dtypes=_fitting_dtypes(dmax))
    for dmax in sorted(TILES)
] + [
    PtxBuild(f"attention.tc_d{dmax}", "attention", (lambda dmax: lambda dt: flash_tc_kernel(dmax))(dmax),
             _flash_tc_args, threads=32 * TC_ATTN_WARPS, dtypes=("float16",), requires=("mma.sync.aligned.m16n8k16",))
    for dmax in sorted(TC_ATTN_BK)
] + [
    PtxBuild(tc_attn_async_kernel(dmax, w), "attention",
             (lambda dmax, w: lambda dt: flash_tc_async_kernel(dmax, w))(dmax, w), _flash_tc_args, threads=32 * w,
             dtypes=("float16",), requires=("mma.sync.aligned.m16n8k16", "cp.async.cg.shared.global",
                                            "ldmatrix.sync.aligned.m8n8.x4.shared", "ldmatrix.sync.aligned.m8n8.x4.trans"))
    for dmax in sorted(TC_ATTN_ASYNC_BK) for w in TC_ATTN_ASYNC_PROBED_WARPS
] + [
    PtxBuild("attention.combine", "attention", lambda dt: combine_kernel(acc_np(dt)),
             lambda dt: (arr(acc_type(dt), 5), arr(acc_type(dt), 5), arr(dt, 4), arr(dt, 3), types.boolean),
             threads=256),
] + [
    PtxBuild(f"attention.decode_d{d}", "attention",
             (lambda d: lambda dt: decode_kernel(acc_np(dt), vec_width(np.dtype(str(dt)).itemsize), d,
                                                 DECODE_MAX_ROWS))(d),
             _decode_args, threads=32 * DECODE_WARPS, dtypes=VEC_ROW_DTYPES)
    for d in DECODE_HEAD_DIMS
]
