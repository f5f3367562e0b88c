"""Flash attention (float16, head dim 64 or 128) on Hopper's warpgroup tensor cores (wgmma,
sm_90a): the arguments, results, special values, causal rule, lse and NaN behaviour of
kernels_cuda.attention.flash_tc_async_kernel.  Off in the dispatcher until a GPU has timed it
(cuda_tiles.TC_ATTN_WGMMA_ENABLED); bench/gpu_probe_attention.py times its builds
(cuda_tiles.WGMMA_ATTN_BUILDS, "wg*" variants) on a Hopper GPU.

A block of NWG warpgroups owns 64 NWG query rows of one (batch, query head); warpgroup w rows
64 w .. 64 w + 63 (its warp v rows 16 v .., the layout of wgmma's fragments, which is the
mma.sync kernel's).  Shared memory (dynamic, 1024-byte aligned: kernels_cuda/wgmma.py's
128-byte swizzle): the block's Q tile, then `stages` buffers of a K tile and a V tile of bk
keys; each tile stored as panels of 64 columns (dmax / 64 of them), a panel's rows of 128
bytes, 16-byte chunk c of row r at chunk c ^ (r & 7).  Per key tile:
  S = Q K^T: dmax / 16 wgmma.m64n{bk}k16 with both operands in shared memory (Q K-major,
      K's rows K-major as B);
  the online softmax on S's fragment registers (flash_tc_async_kernel's: base-2 scores, the
      running max and sums, -inf past Skv and above the causal diagonal);
  O += P V: bk / 16 wgmma.m64n{dmax}k16 with A = P from registers (packed from S's
      fragment, which is the A fragment's layout) and B = V's rows read N-major (trans-b).
Each product group is waited for before its results are read (S) or the tile's buffer is
refilled (O).  K/V tiles come by cp.async, tiles j + 1 .. j + stages - 1 in flight while tile
j is computed, one barrier per tile; Q once, first.  A negative scale negates the scores
(flash_tc_async_kernel negates q instead, which it holds in registers).
"""
from functools import lru_cache
import math

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from kernels_common.cuda_tiles import (TC_ATTN_WGMMA_BUILD, WGMMA_ATTN_BUILDS, wgmma_attention_kernel_name,
                                       wgmma_attention_shared_bytes)

from ._jit import PtxBuild, arr, device, kernel
from .attention import _tc_softmax, _tc_store_rows, udiv32
from .mma import cp_async16_at, cp_async_commit, cp_async_wait, global_address, pack_f16x2
from .wgmma import fence_proxy_async, shared_address, smem_desc, wgmma_commit, wgmma_f16, wgmma_f16_rs, wgmma_fence, wgmma_wait


@lru_cache(maxsize=None)
def flash_wgmma_kernel(dmax, bk=64, stages=3, nwg=1, min_blocks=1):
    """The kernel (module docstring); launch with _jit.launch_dynamic, 128 nwg threads,
    cuda_tiles.wgmma_attention_shared_bytes(dmax, bk, stages, nwg) bytes, and
    cdiv(sq, 64 nwg) x nb x hq blocks."""
    BK, STAGES, NWG = bk, stages, nwg
    BQ = 64 * NWG
    NT = 128 * NWG
    CH = dmax // 8              # 16-byte chunks per row
    ROWB = dmax * 2             # bytes per row in global memory
    Q_WORDS = BQ * dmax // 2
    KVW = BK * dmax // 2        # words of a K (or V) tile
    SW = 2 * KVW                # words of a stage
    KS = dmax // 16             # k-steps of QK^T
    NS = BK // 8                # n8 tiles of S
    ND = dmax // 8              # n8 tiles of O
    RSTEP = NT // CH            # rows one pass of the block's copies covers
    CP = BK // RSTEP            # copies per thread per K (and per V) tile
    QCP = BQ // RSTEP
    assert dmax in (64, 128) and BK in (64, 128) and RSTEP % 8 == 0 and BK % RSTEP == 0 and STAGES >= 2
    WAIT = STAGES - 2
    neg_inf, zero = np.float32(-np.inf), np.float32(0.0)
    LOG2E = math.log2(math.e)
    TINY = np.float32(1e-30)
    store_rows = _tc_store_rows(dmax)
    smx = _tc_softmax(BK, dmax)
    mask_tile, softmax_update, row_sums = smx.mask, smx.update, smx.row_sums

    @device
    def place(rows, r, c):
        """Word of 16-byte chunk c of row r in a tile of `rows` rows (panels of 64 columns)."""
        return (c >> 3) * (rows * 32) + r * 32 + (((c & 7) ^ (r & 7)) << 2)

    @device
    def load_kv(S, base, gk, gv, dst, j0, r0t, skv):
        """This thread's copies of the K/V tile of keys j0.. into the stage at word base (gk,
        gv: its chunk's address in key row 0; keys past skv read zero)."""
        for l in range(CP):
            row = j0 + r0t + l * RSTEP
            nbytes = 16 if row < skv else 0
            at = uint64(min(row, skv - 1) * ROWB)
            cp_async16_at(S, base + dst + l * RSTEP * 32, gk + at, nbytes)
            cp_async16_at(S, base + KVW + dst + l * RSTEP * 32, gv + at, nbytes)

    @kernel(launch_bounds=(NT, min_blocks))
    def attention_wgmma(q, k, v, nb, hq, sq, hkv, skv, causal, scale, out, lse, want_lse):
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
        wg = t >> 7
        g = lane >> 2
        tq = lane & 3
        S = cuda.shared.array(0, uint32, alignment=1024)
        s0 = ((1024 - (shared_address(S, 0) & 1023)) & 1023) >> 2
        sacc = cuda.local.array((NS, 4), float32)
        o = cuda.local.array((ND, 4), float32)
        m = cuda.local.array(2, float32)
        ls = cuda.local.array(2, float32)
        off = skv - sq
        sc = float32(abs(scale) * LOG2E)
        if sc == zero:
            sc = TINY
        neg = scale < 0
        rw0 = r0 + warp * 16        # the warp's first query row
        rw = rw0 + g                # this lane's rows rw and rw + 8
        rg0 = r0 + wg * 64          # the warpgroup's first row
        orow = bh * sq + rw
        ch = t % CH
        r0t = t // CH
        dst = place(BK, r0t, ch)
        # Q: this thread's chunks of rows r0t, r0t + RSTEP, ... (rows past sq read zero)
        qrow0 = (b * hq + h) * sq
        gq = global_address(q, qrow0 * (dmax // 2) + ch * 4)
        for l in range(QCP):
            row = r0 + r0t + l * RSTEP
            cp_async16_at(S, s0 + place(BQ, r0t + l * RSTEP, ch), gq + uint64(min(row, sq - 1) * ROWB),
                          16 if row < sq else 0)
        cp_async_commit()
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
        kvw = (b * hkv + kvh) * skv * (dmax // 2)
        gk = global_address(k, kvw + ch * 4)
        gv = global_address(v, kvw + ch * 4)
        sbase = s0 + Q_WORDS
        for s in range(STAGES - 1):
            if s < ntiles:
                load_kv(S, sbase + s * SW, gk, gv, dst, s * BK, r0t, skv)
            cp_async_commit()
        rb = 0
        wb = (STAGES - 1) * SW
        for it in range(ntiles):
            cp_async_wait(WAIT)      # this thread's copies of tile it (and Q) are complete
            fence_proxy_async()
            cuda.syncthreads()       # everyone's; every warpgroup is done with tile it - 1
            nt = it + STAGES - 1
            if nt < ntiles:
                load_kv(S, sbase + wb, gk, gv, dst, nt * BK, r0t, skv)
            cp_async_commit()
            j0 = it * BK
            if not causal or j0 <= rg0 + 63 + off:  # warpgroup-uniform: some row of it sees a key
                for j in range(NS):
                    for r in range(4):
                        sacc[j, r] = zero
                wgmma_fence()
                for ks in range(KS):
                    da = smem_desc(S, s0 + (ks >> 2) * (BQ * 32) + wg * 64 * 32 + (ks & 3) * 8, 16, 1024)
                    db = smem_desc(S, sbase + rb + (ks >> 2) * (BK * 32) + (ks & 3) * 8, 16, 1024)
                    wgmma_f16(sacc, S, da, db, BK, 0)
                wgmma_commit()
                wgmma_wait(0)
                if neg:
                    for j in range(NS):
                        for r in range(4):
                            sacc[j, r] = -sacc[j, r]
                mask_tile(sacc, j0, rw0, rw, off, skv, causal, tq)
                softmax_update(sacc, m, ls, o, sc)
                wgmma_fence()  # o was rescaled in registers
                for kk in range(BK // 16):
                    a0 = pack_f16x2(sacc[2 * kk, 0], sacc[2 * kk, 1])
                    a1 = pack_f16x2(sacc[2 * kk, 2], sacc[2 * kk, 3])
                    a2 = pack_f16x2(sacc[2 * kk + 1, 0], sacc[2 * kk + 1, 1])
                    a3 = pack_f16x2(sacc[2 * kk + 1, 2], sacc[2 * kk + 1, 3])
                    dv = smem_desc(S, sbase + rb + KVW + kk * 16 * 32, BK * 128, 1024)
                    wgmma_f16_rs(o, a0, a1, a2, a3, S, dv, dmax, 1)
                wgmma_commit()
                wgmma_wait(0)
            rb += SW
            if rb == STAGES * SW:
                rb = 0
            wb += SW
            if wb == STAGES * SW:
                wb = 0
        cp_async_wait(0)
        row_sums(ls)
        store_rows(out, lse, o, m, ls, rw, orow, sq, tq, want_lse)

    assert wgmma_attention_shared_bytes(dmax, BK, STAGES, NWG) >= 4 * (Q_WORDS + STAGES * SW)
    return attention_wgmma


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _args(dt):
    i64, u32 = types.int64, types.uint32
    return (arr(u32, 1), arr(u32, 1), arr(u32, 1), i64, i64, i64, i64, i64, types.boolean, types.float64,
            arr(dt, 1), arr(dt, 1), types.boolean)


# The build the dispatcher may run (the others are the probe's: each costs CI's PTX step ~11 s;
# `python -m bench.ptx` gates what can be launched)
PTX = [
    PtxBuild(wgmma_attention_kernel_name(d, name), "attention",
             (lambda d, cfg: lambda dt: flash_wgmma_kernel(d, *cfg))(d, cfg), _args, threads=128 * cfg[2],
             dtypes=("float16",), requires=("wgmma.mma_async.sync.aligned",), archs=("sm_90",), arch_specific=True,
             dynamic_shared=wgmma_attention_shared_bytes(d, *cfg))
    for d in (64, 128) for name, cfg in WGMMA_ATTN_BUILDS.items() if name == TC_ATTN_WGMMA_BUILD
]
