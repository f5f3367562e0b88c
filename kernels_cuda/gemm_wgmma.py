"""The float16 GEMM on Hopper's warpgroup tensor cores (wgmma, sm_90a), with the fused bias +
activation epilogue of kernels_cuda.gemm.

C[b] = act(A[a_idx[b]] @ op(B[b_idx[b]]) + bias), A (Ba, M, K), B (Bb, K, N) or with
trans_b (Bb, N, K), C (batch, M, N) float16, float32 accumulation; the same arguments as
gemm_tc_async_kernel (a, b flat uint32 views; kw_total = K / 2, b_rows = K, b_cols = N / 2)
and the same conditions: K % 8 == 0, a (K, N) b's N % 8 == 0, a and b 16-byte aligned.

A block of bm / 64 warpgroups computes a bm x bn tile of C; warpgroup w its rows 64 w ..
64 w + 63, all bn columns, in bn / 2 float32 accumulators a thread (wgmma's fragment, which
is mma.sync's m16n8 fragment repeated: the mma.sync GEMM's epilogue stores it).  Per K tile
of 64 halves (one 128-byte row of the swizzle): cp.async copies the A tile (bm rows of K)
and the B tile ((N, K) b: bn rows of K; (K, N) b: 64 rows of N, stored as panels of 64
columns) into one of `stages` buffers in the 128-byte-swizzled layout wgmma reads
(kernels_cuda.wgmma), while the tensor cores work on the tiles before it; each warpgroup
issues 4 wgmma.m64n{bn}k16 per tile, one per K step of 16 (descriptors advanced by 32 bytes
of K, or by 16 rows of a (K, N) b).  Per K tile one barrier: wait for tile kt's copies,
fence them to the async proxy, __syncthreads, issue tile kt's products, then the copies of
tile kt + stages - 1 - pending into the buffer of tile kt - 1 - pending (whose products
every warpgroup waited for before this barrier), then wait until `pending` product groups
remain.  Whole K tiles copy from per-thread addresses fixed for the loop plus the tile's
offset; a partial last K tile follows the loop with its indices recomputed (registers: 128 a
thread at 2 blocks per SM, no spills on sm_90a).  Chunks of absent rows, columns or K read
zero (cp.async of 0 bytes from clamped addresses).
"""
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from kernels_common.cuda_tiles import WGMMA_RUN, WGMMA_TILES, wgmma_fits, wgmma_kernel_name

from ._jit import PtxBuild, arr, device, kernel
from .gemm import _tc_parts
from .mma import cp_async16, cp_async16_at, cp_async_commit, cp_async_wait, ctaid_x_fresh, global_address, tid_x_fresh
from .wgmma import fence_proxy_async, shared_address, smem_desc, wgmma_commit, wgmma_f16, wgmma_fence, wgmma_wait


@lru_cache(maxsize=None)
def gemm_wgmma_kernel(trans_b, tile):
    """The kernel for a WGMMA_TILES build (its name or a WgmmaTile); see the module docstring."""
    cfg = WGMMA_TILES[tile] if isinstance(tile, str) else tile
    BM, BN, BK, STAGES, PENDING = cfg.bm, cfg.bn, cfg.bk, cfg.stages, cfg.pending
    NT = cfg.threads
    assert BK == 64 and BM % 64 == 0 and BN % 64 == 0 and BN <= 256 and STAGES >= 2 + PENDING
    KP = 32                         # words per 128-byte row
    A_STAGE = BM * KP               # words of a stage's A tile
    B_STAGE = BN * KP               # words of a stage's B tile (either layout)
    SW = A_STAGE + B_STAGE          # words per stage (a multiple of 256: stages stay 1024-byte aligned)
    S_WORDS = STAGES * SW + 256     # + 1 KB to align the first stage
    A_CP = BM * 8 // NT             # cp.async of 16 bytes per thread per K tile
    B_CP = B_STAGE // 4 // NT
    NCH = BN // 8                   # (K, N) b: 16-byte chunks per row of the tile
    PANEL = BK * KP                 # (K, N) b: words per panel of 64 columns
    assert NT % 8 == 0 and NT % NCH == 0 and A_CP * NT == BM * 8 and B_CP * NT * 4 == B_STAGE
    # a thread's copies are 32 rows apart (A, (N, K) B) or NT / NCH rows ((K, N) B): multiples
    # of the swizzle's 8, so their places differ by constants
    assert (NT // 8) % 8 == 0 and (NT // NCH) % 8 == 0
    A_DST_STEP = NT // 8 * KP
    B_DST_STEP = A_DST_STEP if trans_b else NT // NCH * KP
    WAIT = STAGES - 2 - PENDING     # copy groups left pending when tile kt must be complete
    AHEAD = STAGES - 1 - PENDING    # tiles the copies run ahead of the products
    NT8 = BN // 8                   # n8 column tiles of the accumulator fragment
    zero = np.float32(0.0)
    _, _, _, store, tile_at, place_at = _tc_parts(BM, BN, 1, NT8)

    @device
    def load_tile(S, base, kt, a, b, t, ab, bb, m0, n0, m_total, n_total, kw_total, b_rows, b_cols):
        """Issue the copies of K tile kt into the stage at word base (absent chunks read 0)."""
        ch = t & 7                  # the thread's chunk of an A row (and of a (N, K) B row)
        kv = kt * KP + 4 * ch       # its word of K
        kok = kv < kw_total
        kc = min(kv, kw_total - 4)
        for l in range(A_CP):
            r = (t >> 3) + l * (NT // 8)
            gm = m0 + r
            src = (ab * m_total + min(gm, m_total - 1)) * kw_total + kc
            cp_async16(S, base + r * KP + ((ch ^ (r & 7)) << 2), a, src, 16 if kok and gm < m_total else 0)
        if trans_b:
            for l in range(B_CP):
                r = (t >> 3) + l * (NT // 8)
                gn = n0 + r
                src = (bb * n_total + min(gn, n_total - 1)) * kw_total + kc
                cp_async16(S, base + A_STAGE + r * KP + ((ch ^ (r & 7)) << 2), b, src,
                           16 if kok and gn < n_total else 0)
        else:
            cn = t % NCH            # the thread's chunk of a B row: panel cn >> 3, chunk cn & 7 in it
            gw = n0 // 2 + 4 * cn
            dst = base + A_STAGE + (cn >> 3) * PANEL
            for l in range(B_CP):
                kr = t // NCH + l * (NT // NCH)
                gk = kt * BK + kr
                src = (bb * b_rows + min(gk, b_rows - 1)) * b_cols + min(gw, b_cols - 4)
                cp_async16(S, dst + kr * KP + (((cn & 7) ^ (kr & 7)) << 2), b, src,
                           16 if gw < b_cols and gk < b_rows else 0)

    @device
    def load_full(S, base, kt, pa, pb, a_dst, b_dst, ok_rows, b_cols):
        """Issue the copies of the whole K tile kt into the stage at word base, from each
        copy's address in K tile 0 (pa[l], pb[l]: global_address, rows clamped in range)
        plus the tile's offset, to a_dst + l * A_DST_STEP (b_dst + l * B_DST_STEP); ok_rows a
        bit per copy whose row ((K, N) b: column) exists, the others read zero.  Fewer
        registers through the K loop than load_tile's indices (128 at 2 blocks per SM)."""
        step = uint64(128 * kt)  # bytes of a K tile along a row
        for l in range(A_CP):
            cp_async16_at(S, base + a_dst + l * A_DST_STEP, pa[l] + step, 16 if (ok_rows >> l) & 1 == 1 else 0)
        if trans_b:
            for l in range(B_CP):
                cp_async16_at(S, base + A_STAGE + b_dst + l * B_DST_STEP, pb[l] + step,
                              16 if (ok_rows >> (A_CP + l)) & 1 == 1 else 0)
        else:  # 64 rows of b per K tile; the thread's column is the same for all its copies
            bstep = uint64(4 * BK * kt) * uint64(b_cols)
            nb = 16 if (ok_rows >> A_CP) & 1 == 1 else 0
            for l in range(B_CP):
                cp_async16_at(S, base + A_STAGE + b_dst + l * B_DST_STEP, pb[l] + bstep, nb)

    @device
    def products(S, rb, wg, acc):
        """The warpgroup's 4 wgmma of the K tile in the stage at word rb, one group."""
        wgmma_fence()
        for ks in range(BK // 16):
            da = smem_desc(S, rb + wg * 64 * KP + ks * 8, 16, 1024)
            if trans_b:
                db = smem_desc(S, rb + A_STAGE + ks * 8, 16, 1024)
            else:
                db = smem_desc(S, rb + A_STAGE + ks * 16 * KP, PANEL * 4, 1024)
            wgmma_f16(acc, S, da, db, BN, 0 if trans_b else 1)
        wgmma_commit()

    @kernel(launch_bounds=(NT, cfg.min_blocks))
    def gemm_wgmma(a, b, a_idx, b_idx, bias, c, kw_total, b_rows, b_cols, code, has_bias):
        m_total = c.shape[1]
        n_total = c.shape[2]
        bz, m0, n0 = tile_at(cuda.blockIdx.x, m_total, n_total)
        ab = a_idx[bz]
        bb = b_idx[bz]
        t = cuda.threadIdx.x
        wg = t >> 7
        S = cuda.shared.array(0, uint32, alignment=1024)
        # the first 1024-byte boundary (the runtime's dynamic base is aligned in practice;
        # nothing here relies on it)
        s0 = ((1024 - (shared_address(S, 0) & 1023)) & 1023) >> 2
        acc = cuda.local.array((1, NT8, 4), float32)
        for j in range(NT8):
            for r in range(4):
                acc[0, j, r] = zero
        # ---- this thread's copies of whole K tiles: addresses in K tile 0, fixed for the loop
        pa = cuda.local.array(A_CP, uint64)
        pb = cuda.local.array(B_CP, uint64)
        ok_rows = uint32(0)
        ch = t & 7
        r = t >> 3
        a_dst = r * KP + ((ch ^ (r & 7)) << 2)
        b_dst = a_dst
        for l in range(A_CP):
            gm = m0 + r + l * (NT // 8)
            ok_rows |= uint32(gm < m_total) << l
            pa[l] = global_address(a, (ab * m_total + min(gm, m_total - 1)) * kw_total + 4 * ch)
        if trans_b:
            for l in range(B_CP):
                gn = n0 + r + l * (NT // 8)
                ok_rows |= uint32(gn < n_total) << (A_CP + l)
                pb[l] = global_address(b, (bb * n_total + min(gn, n_total - 1)) * kw_total + 4 * ch)
        else:
            cn = t % NCH
            gw = n0 // 2 + 4 * cn
            ok_rows |= uint32(gw < b_cols) << A_CP
            kr = t // NCH
            b_dst = (cn >> 3) * PANEL + kr * KP + (((cn & 7) ^ (kr & 7)) << 2)
            for l in range(B_CP):  # rows < 64 <= b_rows wherever a whole K tile exists
                pb[l] = global_address(b, (bb * b_rows + min(kr + l * (NT // NCH), b_rows - 1)) * b_cols
                                       + min(gw, b_cols - 4))
        kfull = kw_total // KP      # whole K tiles; a partial last one follows the loop
        for s in range(AHEAD):
            if s < kfull:
                load_full(S, s0 + s * SW, s, pa, pb, a_dst, b_dst, ok_rows, b_cols)
            cp_async_commit()
        rb = 0                      # the stage of tile kt (words from s0)
        for kt in range(kfull):
            cp_async_wait(WAIT)     # this thread's copies of tile kt are complete
            fence_proxy_async()     # and visible to wgmma's reads
            cuda.syncthreads()      # everyone's; every warpgroup's products of tile kt - 1 - pending done
            products(S, s0 + rb, wg, acc)
            nk = kt + AHEAD
            if nk < kfull:          # into the buffer of tile kt - 1 - pending
                wb = rb + AHEAD * SW
                if wb >= STAGES * SW:
                    wb -= STAGES * SW
                load_full(S, s0 + wb, nk, pa, pb, a_dst, b_dst, ok_rows, b_cols)
            cp_async_commit()
            wgmma_wait(PENDING)
            rb += SW
            if rb == STAGES * SW:
                rb = 0
        if kfull * KP < kw_total:
            # the partial last tile into its stage rb (tile kfull - STAGES's: every warpgroup's
            # products of it completed before the last barrier), indices recomputed here
            bz, m0, n0 = tile_at(ctaid_x_fresh(), m_total, n_total)
            load_tile(S, s0 + rb, kfull, a, b, tid_x_fresh(), a_idx[bz], b_idx[bz], m0, n0, m_total, n_total,
                      kw_total, b_rows, b_cols)
            cp_async_commit()
            cp_async_wait(0)
            fence_proxy_async()
            cuda.syncthreads()
            products(S, s0 + rb, wg, acc)
        wgmma_wait(0)
        cp_async_wait(0)
        bz, m0, n0 = tile_at(ctaid_x_fresh(), m_total, n_total)
        g, q, wm, wn = place_at(tid_x_fresh())
        store(c, bias, acc, bz, m0 + wm, n0 + wn, g, q, code, has_bias, m_total, n_total)

    assert cfg.shared_bytes >= 4 * S_WORDS  # the launch's bytes (cuda_tiles) hold this layout
    return gemm_wgmma


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _args(dt):
    i64, u32 = types.int64, types.uint32
    return (arr(u32, 1), arr(u32, 1), arr(i64, 1), arr(i64, 1), arr(dt, 1), arr(dt, 3), i64, i64, i64, i64,
            types.boolean)


PTX = [
    PtxBuild(wgmma_kernel_name(build, nk), "linalg", (lambda build, nk: lambda dt: gemm_wgmma_kernel(nk, build))(build, nk),
             _args, threads=WGMMA_TILES[build].threads, dtypes=("float16",),
             requires=("wgmma.mma_async.sync.aligned", "cp.async.cg.shared.global"),
             fits=(lambda build: lambda optin, per_sm: wgmma_fits(build, optin, per_sm))(build),
             dynamic_shared=WGMMA_TILES[build].shared_bytes, archs=("sm_90",), arch_specific=True)
    for build in WGMMA_RUN for nk in (False, True)
]
