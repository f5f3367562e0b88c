"""Tiled, register-blocked (batched) GEMM with the fused bias + activation epilogue.

C[b] = act(A[a_idx[b]] @ op(B[b_idx[b]]) + bias), A (Ba, M, K) C-contiguous, B (Bb, K, N)
or, with trans_b (linear's weight), (Bb, N, K); C (batch, M, N).

A block computes a BM x BN tile of C with (BM/TM) x (BN/TN) threads, each holding a
TM x TN accumulator in registers (a local array indexed only by unrolled constants).
Per step of BK along K, the block stages an A tile (stored K-major, As[k][m]) and a B
tile (Bs[k][n]) in shared memory with coalesced global loads (consecutive threads read
consecutive addresses of the row-major source; the shared rows are padded by one word
so the transposing stores do not all hit one bank), then each thread runs BK rank-1
updates reading TM + TN shared values for TM x TN FMAs.  Thread (ty, tx) owns rows
ty + i*(BM/TM) and columns tx + j*(BN/TN): the B-fragment reads of a warp are
consecutive words (conflict-free) and the epilogue's stores are coalesced.
float16 inputs are converted to float32 when staged (float32 accumulation).

float16 runs on tensor cores instead (gemm_tc_kernel: mma.sync m16n8k16 through inline
PTX, kernels_cuda/mma.py); gemm_tc_wide_kernel with register-prefetched 32-bit loads, and
gemm_tc_async_kernel with a multi-stage cp.async pipeline and ldmatrix fragments from
swizzled shared memory (16-byte rows and alignment).
"""
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int64, types, uint32, uint64

from kernels_common.cuda_tiles import GEMM_TILES as CONFIGS  # (BM, BN, BK, TM, TN) per tile name
from kernels_common.cuda_tiles import GEMM_VEC_KERNEL, GEMM_VEC_TILE
from kernels_common.cuda_tiles import (GEMV_KN_WARPS, GEMV_MAX_M, GEMV_WARPS, STATIC_SMEM, TC_ASYNC_DEFAULT,
                                       TC_ASYNC_RUN, TC_ASYNC_TILES, TC_KERNEL, TC_TILE, TC_WARPS,
                                       TC_WIDE_KERNEL, TC_WIDE_TILE, TC_WIDE_WARPS, gemm_threads, gemm_tile_dtypes,
                                       gemv_kn_columns, gemv_unroll, tc_async_fits, tc_async_kernel_name)

from ._jit import FULL_MASK, PtxBuild, acc_np, acc_of, arr, device, kernel
from .activation import act_fn
from .mma import (cp_async16, cp_async16_at, cp_async_commit, ctaid_x_fresh, global_address, cp_async_wait,
                  ldmatrix_x4, ldmatrix_x4_trans, mma_16816, tid_x_fresh)
from .primitives import vec_io, warp_sum
from .simt_tile import geometry, tile_clear, tile_fma


@lru_cache(maxsize=None)
def gemm_kernel(acc_np, cfg):
    T = geometry(cfg)
    BM, BN, BK, TM, TN = T.bm, T.bn, T.bk, T.tm, T.tn
    NTX, NTY, NT, A_LOADS, B_LOADS = T.ntx, T.nty, T.nt, T.a_loads, T.b_loads
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)
    act = act_fn(acc_np)
    AS_SHAPE, BS_SHAPE, ACC_SHAPE = T.as_shape, T.bs_shape, T.acc_shape
    fma, clear = tile_fma(cfg), tile_clear(cfg)

    @kernel(launch_bounds=(NT, 2))
    def gemm_tiled(a, b, a_idx, b_idx, bias, c, code, has_bias, trans_b):
        m_total = a.shape[1]
        k_total = a.shape[2]
        n_total = c.shape[2]
        # one grid dimension (x: up to 2^31 - 1 blocks; y and z stop at 65,535, which a
        # 9M-row linear or a 70,000-matrix batch would pass): column block fastest, then
        # row block, then batch
        nbn = (n_total + BN - 1) // BN
        nbm = (m_total + BM - 1) // BM
        blk = cuda.blockIdx.x
        bn = blk % nbn
        rest = blk // nbn
        bz = rest // nbm
        ab = a_idx[bz]
        bb = b_idx[bz]
        m0 = (rest - bz * nbm) * BM
        n0 = bn * BN
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
            # stage A[m0:m0+BM, k0:k0+BK] as As[k][m]; consecutive threads: consecutive k
            for l in range(A_LOADS):
                e = t + l * NT
                mm = e // BK
                kk = e - mm * BK
                gm = m0 + mm
                gk = k0 + kk
                v = zero
                if gm < m_total and gk < k_total:
                    v = acc(a[ab, gm, gk])
                As[kk, mm] = v
            # stage B[k0:k0+BK, n0:n0+BN] as Bs[k][n]
            if trans_b:  # b is (N, K): consecutive threads read consecutive k
                for l in range(B_LOADS):
                    e = t + l * NT
                    nn = e // BK
                    kk = e - nn * BK
                    gn = n0 + nn
                    gk = k0 + kk
                    v = zero
                    if gn < n_total and gk < k_total:
                        v = acc(b[bb, gn, gk])
                    Bs[kk, nn] = v
            else:  # b is (K, N): consecutive threads read consecutive n
                for l in range(B_LOADS):
                    e = t + l * NT
                    kk = e // BN
                    nn = e - kk * BN
                    gn = n0 + nn
                    gk = k0 + kk
                    v = zero
                    if gn < n_total and gk < k_total:
                        v = acc(b[bb, gk, gn])
                    Bs[kk, nn] = v
            cuda.syncthreads()
            fma(As, Bs, accr, af, bf, tx, ty)
            cuda.syncthreads()
        # epilogue: + bias, activation, store (coalesced over tx)
        for i in range(TM):
            gm = m0 + ty + i * NTY
            if gm < m_total:
                for j in range(TN):
                    gn = n0 + tx + j * NTX
                    if gn < n_total:
                        v = accr[i, j]
                        if has_bias:
                            v += acc(bias[gn])
                        c[bz, gm, gn] = act(v, code)

    return gemm_tiled


@lru_cache(maxsize=None)
def gemm_vec_kernel(trans_b):
    """The float32 GEMM in 16-byte vectors (the classic SGEMM design): a block of 256 threads
    computes a 128 x 128 tile of C, thread (ty, tx) of 16 x 16 an 8 x 8 part: rows
    4 ty .. 4 ty + 3 and 64 + 4 ty .., columns 4 tx .. and 64 + 4 tx .. (two float4 groups,
    64 apart, so that a warp's shared reads cover 128 consecutive words: no bank conflict).
    Per K tile of 8: A (128 x 8) and B (8 x 128) are loaded as one float4 per thread each
    (A along K, B along N; with trans_b, B (N, K) along K), the next tile's loads in flight
    in registers while the current one is multiplied from shared memory; A is stored
    K-major (As[k][m], transposed by the storing thread), B as Bs[k][n]; two stage buffers,
    one barrier per tile.  Per k: 4 LDS.128 for 64 FFMA.  Requires K % 4 == 0, (K, N) b's
    N % 4 == 0, 16-byte aligned a, b and c (the dispatcher checks), float32.  Arguments and
    epilogue as gemm_kernel's (bias + activation), c written as float4 where whole."""
    BM, BN, BK = GEMM_VEC_TILE
    NT = 256
    zero = np.float32(0.0)
    act = act_fn(np.float32)
    load4, store4 = vec_io(4)

    @kernel(launch_bounds=(NT, 2))
    def gemm_vec(a, b, a_idx, b_idx, bias, c, code, has_bias):
        m_total = a.shape[1]
        k_total = a.shape[2]
        n_total = c.shape[2]
        nbn = (n_total + BN - 1) // BN
        nbm = (m_total + BM - 1) // BM
        blk = cuda.blockIdx.x
        rest = blk // nbn
        bz = rest // nbm
        m0 = (rest - bz * nbm) * BM
        n0 = (blk - rest * nbn) * BN
        ab = a_idx[bz]
        bb = b_idx[bz]
        t = cuda.threadIdx.x
        tx = t & 15
        ty = t >> 4
        As = cuda.shared.array((2, BK, BM), float32, alignment=16)  # read as float4
        Bs = cuda.shared.array((2, BK, BN), float32, alignment=16)
        accr = cuda.local.array((8, 8), float32)
        ra = cuda.local.array(4, float32)   # the next tile's A float4
        rb = cuda.local.array(4, float32)   # and B's
        fa = cuda.local.array(8, float32)
        fb = cuda.local.array(8, float32)
        for i in range(8):
            for j in range(8):
                accr[i, j] = zero
        # this thread's loads: A row am, K chunk ak; B (K, N): K row bk, N chunk bn; B (N, K):
        # N row bn, K chunk bk (as A)
        am = t >> 1
        ak = (t & 1) * 4
        if trans_b:
            bn = t >> 1
            bk = (t & 1) * 4
        else:
            bk = t >> 5
            bn = (t & 31) * 4
        a_ok = m0 + am < m_total
        b_ok = (n0 + bn < n_total)
        ntiles = (k_total + BK - 1) // BK
        # tile 0 into registers
        for e in range(4):
            ra[e] = zero
            rb[e] = zero
        if a_ok and ak < k_total:
            load4(a, (ab, m0 + am, ak), ra, 0)
        if trans_b:
            if b_ok and bk < k_total:
                load4(b, (bb, n0 + bn, bk), rb, 0)
        elif b_ok and bk < k_total:
            load4(b, (bb, bk, n0 + bn), rb, 0)
        for kt in range(ntiles):
            s = kt & 1
            for e in range(4):  # stage the tile held in registers
                As[s, ak + e, am] = ra[e]
            if trans_b:
                for e in range(4):
                    Bs[s, bk + e, bn] = rb[e]
            else:
                store4(Bs, (s, bk, bn), rb, 0)
            cuda.syncthreads()
            k1 = (kt + 1) * BK
            if k1 < k_total:  # the next tile's loads, in flight during the products below
                for e in range(4):
                    ra[e] = zero
                    rb[e] = zero
                if a_ok and k1 + ak < k_total:
                    load4(a, (ab, m0 + am, k1 + ak), ra, 0)
                if trans_b:
                    if b_ok and k1 + bk < k_total:
                        load4(b, (bb, n0 + bn, k1 + bk), rb, 0)
                elif b_ok and k1 + bk < k_total:
                    load4(b, (bb, k1 + bk, n0 + bn), rb, 0)
            for kk in range(BK):
                load4(As, (s, kk, 4 * ty), fa, 0)
                load4(As, (s, kk, 64 + 4 * ty), fa, 4)
                load4(Bs, (s, kk, 4 * tx), fb, 0)
                load4(Bs, (s, kk, 64 + 4 * tx), fb, 4)
                for i in range(8):
                    for j in range(8):
                        accr[i, j] += fa[i] * fb[j]
            # (no second barrier: the next iteration stages into the other buffer, and the
            # barrier there orders it after every warp's reads of this one)
        for i in range(8):
            gm = m0 + 4 * ty + (i & 3) + 64 * (i >> 2)
            if gm < m_total:
                for h in range(2):
                    gn = n0 + 4 * tx + 64 * h
                    if gn < n_total:  # N % 4 == 0 (c is (.., N) float32, 16-byte rows): whole float4
                        for j in range(4):
                            v = accr[i, 4 * h + j]
                            if has_bias:
                                v += bias[gn + j]
                            fb[4 * h + j] = act(v, code)
                        store4(c, (bz, gm, gn), fb, 4 * h)

    return gemm_vec


@lru_cache(maxsize=None)
def _tc_parts(BM, BN, MT, NT8):
    """Device functions both tensor-core kernels use, for a block tile BM x BN and a warp
    tile of MT m16 x NT8 n8 products:
      tile_of(m_total, n_total): (batch, m0, n0) of this block (grid x = batch x row blocks
        x column blocks, columns fastest);
      place(): (g, q, wm, wn) of this thread: its lane's group and place in the group, and
        its warp's first row and column in the block tile (warps row-major over the tile);
      mma_step(As, Bs, d, wm, wn, g, q, kw): the warp's MT x NT8 mma of one K step of 16
        from the staged words at column kw (see mma.py for the fragment layout);
      store(c, bias, d, bz, m0 + wm, n0 + wn, g, q, code, has_bias, m_total, n_total): the
        epilogue; register r of tile (i, j) is C[16i + g + 8(r >> 1), 8j + 2q + (r & 1)] of
        the warp's part."""
    act = act_fn(np.float32)

    @device
    def tile_at(blk, m_total, n_total):
        nbn = (n_total + BN - 1) // BN
        nbm = (m_total + BM - 1) // BM
        rest = blk // nbn
        bz = rest // nbm
        return bz, (rest - bz * nbm) * BM, (blk - rest * nbn) * BN

    @device
    def tile_of(m_total, n_total):
        return tile_at(cuda.blockIdx.x, m_total, n_total)

    WARPS_ACROSS = BN // (NT8 * 8)  # a power of two
    SHIFT = WARPS_ACROSS.bit_length() - 1

    @device
    def place_at(t):
        lane = t & 31
        warp = t >> 5
        return lane >> 2, lane & 3, (warp >> SHIFT) * (MT * 16), (warp & (WARPS_ACROSS - 1)) * (NT8 * 8)

    @device
    def place():
        return place_at(cuda.threadIdx.x)

    @device
    def mma_step(As, Bs, d, wm, wn, g, q, kw):
        for i in range(MT):
            r = wm + i * 16 + g
            a0 = As[r, kw + q]
            a1 = As[r + 8, kw + q]
            a2 = As[r, kw + q + 4]
            a3 = As[r + 8, kw + q + 4]
            for j in range(NT8):
                cn = wn + j * 8 + g
                d0, d1, d2, d3 = mma_16816(a0, a1, a2, a3, Bs[cn, kw + q], Bs[cn, kw + q + 4],
                                           d[i, j, 0], d[i, j, 1], d[i, j, 2], d[i, j, 3])
                d[i, j, 0] = d0
                d[i, j, 1] = d1
                d[i, j, 2] = d2
                d[i, j, 3] = d3

    @device
    def store(c, bias, d, bz, row0, col0, g, q, code, has_bias, m_total, n_total):
        for i in range(MT):
            for h in range(2):
                gm = row0 + i * 16 + g + 8 * h
                if gm < m_total:
                    for j in range(NT8):
                        for e2 in range(2):
                            gn = col0 + j * 8 + 2 * q + e2
                            if gn < n_total:
                                v = d[i, j, 2 * h + e2]
                                if has_bias:
                                    v += float32(bias[gn])
                                c[bz, gm, gn] = act(v, code)

    return tile_of, place, mma_step, store, tile_at, place_at


@lru_cache(maxsize=None)
def gemm_tc_kernel():
    """The float16 GEMM on tensor cores (mma.m16n8k16, float32 accumulation): a block of
    TC_WARPS warps computes a TC_BM x TC_BN tile of C, each warp a 32 x 32 quarter as 2 x 4
    m16n8 products per 16-wide K step.  Per step the block stages A (TC_BM rows) and B
    (TC_BN columns) as 32-bit pairs of halves along K in shared memory (A row-major, B one
    row per column: the "col" operand), rows padded to 12 words so that the fragment reads
    of a warp (word 12g + t) hit 32 different banks.  a and b are uint16 views of the
    float16 inputs (the pairs are built with integer ops); bias and c are float16."""
    BM, BN, BK = TC_TILE
    KP = BK // 2                 # 32-bit words (pairs of halves) per staged row
    LD = KP + 4                  # padded row (see above)
    NT = 32 * TC_WARPS
    A_LOADS = BM * KP // NT
    B_LOADS = BN * KP // NT
    zero = np.float32(0.0)
    tile_of, place, mma_step, store, _, _ = _tc_parts(BM, BN, 2, 4)

    @kernel(launch_bounds=(NT, 2))
    def gemm_tc(a, b, a_idx, b_idx, bias, c, code, has_bias, trans_b):
        m_total = a.shape[1]
        k_total = a.shape[2]
        n_total = c.shape[2]
        bz, m0, n0 = tile_of(m_total, n_total)
        ab = a_idx[bz]
        bb = b_idx[bz]
        t = cuda.threadIdx.x
        g, q, wm, wn = place()
        As = cuda.shared.array((BM, LD), uint32)
        Bs = cuda.shared.array((BN, LD), uint32)
        d = cuda.local.array((2, 4, 4), float32)  # [m16 tile][n8 tile][fragment register]
        for i in range(2):
            for j in range(4):
                for r in range(4):
                    d[i, j, r] = zero
        for k0 in range(0, k_total, BK):
            # consecutive threads: consecutive pairs along K of one row (A; B stored (N, K))
            for l in range(A_LOADS):
                e = t + l * NT
                mm = e // KP
                pp = e - mm * KP
                gm = m0 + mm
                gk = k0 + 2 * pp
                lo = uint32(0)
                hi = uint32(0)
                if gm < m_total:
                    if gk < k_total:
                        lo = uint32(a[ab, gm, gk])
                    if gk + 1 < k_total:
                        hi = uint32(a[ab, gm, gk + 1])
                As[mm, pp] = lo | (hi << 16)
            for l in range(B_LOADS):
                e = t + l * NT
                if trans_b:
                    nn = e // KP
                    pp = e - nn * KP
                else:  # b stored (K, N): consecutive threads: consecutive columns
                    pp = e // BN
                    nn = e - pp * BN
                gn = n0 + nn
                gk = k0 + 2 * pp
                lo = uint32(0)
                hi = uint32(0)
                if gn < n_total:
                    if trans_b:
                        if gk < k_total:
                            lo = uint32(b[bb, gn, gk])
                        if gk + 1 < k_total:
                            hi = uint32(b[bb, gn, gk + 1])
                    else:
                        if gk < k_total:
                            lo = uint32(b[bb, gk, gn])
                        if gk + 1 < k_total:
                            hi = uint32(b[bb, gk + 1, gn])
                Bs[nn, pp] = lo | (hi << 16)
            cuda.syncthreads()
            mma_step(As, Bs, d, wm, wn, g, q, 0)
            cuda.syncthreads()
        store(c, bias, d, bz, m0 + wm, n0 + wn, g, q, code, has_bias, m_total, n_total)

    return gemm_tc


@lru_cache(maxsize=None)
def gemm_tc_wide_kernel(trans_b):
    """The float16 GEMM on tensor cores for large products: a block of TC_WIDE_WARPS warps
    computes a 128 x 128 tile of C, warp w the 64 x 32 part at rows 64 (w // 4), columns
    32 (w % 4), as 4 x 4 mma.m16n8k16 per K step of 16 (float32 accumulators in registers).
    a is a flat uint32 view of the C-contiguous float16 A (batch, M, K / 2): pairs of halves
    along K, as the mma operands hold them; b likewise (batch, N, K / 2) with trans_b, else
    a flat uint32 view of a (K, N) b, (batch, K, N / 2), each thread turning two rows' words
    (2 x 2 halves) into two columns' pairs along K.  kw_total = K / 2; b_rows, b_cols: the
    (K, N) b's K and N / 2.  Per K tile of 32 the block stores the tile it holds in
    registers to shared memory (rows of 16 words padded to 20: a warp's fragment reads, word
    20 g + t, hit 32 banks), loads the next tile from global memory into registers, then
    runs the mma on the stored one, so the loads are in flight while the tensor cores work.
    Out-of-range rows, columns and K pairs read as zero.  bias and c are float16."""
    BM, BN, BK = TC_WIDE_TILE
    KP = BK // 2                  # words (pairs of halves) per staged row
    LD = KP + 4
    NT = 32 * TC_WIDE_WARPS
    A_LOADS = BM * KP // NT       # words per thread per tile
    B_LOADS = BN * KP // NT
    B_PAIRS = B_LOADS // 2        # (K, N) b: 2 x 2 blocks of halves per thread
    NCOLW = BN // 2               # (K, N) b: words per row of the tile
    MT, NT8 = 4, 4                # m16 and n8 tiles per warp
    zero = np.float32(0.0)
    tile_of, place, mma_step, store, _, _ = _tc_parts(BM, BN, MT, NT8)
    LO = uint32(0xFFFF)
    HI = uint32(0xFFFF0000)

    @device
    def load_tile(a, b, kw0, t, pa, pb, aoff, boff, ok_rows, kw_total, b_rows, b_cols):
        """The K tile at word kw0 into registers.  a and b are flat; aoff / boff hold each
        load's row offset (fixed for the whole K loop), ok_rows a bit per load whose row
        exists.  Every load reads a clamped, in-range index and is then replaced by zero
        where out of range (a select on bitwise-combined conditions: no branches around
        the loads)."""
        gw = kw0 + (t % KP)
        wok = gw < kw_total
        w = uint64(min(gw, kw_total - 1))
        for l in range(A_LOADS):
            v = a[uint64(aoff[l]) + w]
            pa[l] = v if wok & ((ok_rows >> l) & 1 == 1) else uint32(0)
        if trans_b:  # b: (batch, N, K / 2)
            for l in range(B_LOADS):
                v = b[uint64(boff[l]) + w]
                pb[l] = v if wok & ((ok_rows >> (A_LOADS + l)) & 1 == 1) else uint32(0)
        else:  # b: (batch, K, N / 2); boff[0] its column's offset, b_rows = K, b_cols = N / 2
            cok = (ok_rows >> A_LOADS) & 1 == 1
            for l in range(B_PAIRS):
                gk = 2 * (kw0 + (t + l * NT) // NCOLW)
                v0 = b[uint64(boff[0] + min(gk, b_rows - 1) * b_cols)]
                v1 = b[uint64(boff[0] + min(gk + 1, b_rows - 1) * b_cols)]
                pb[2 * l] = v0 if cok & (gk < b_rows) else uint32(0)
                pb[2 * l + 1] = v1 if cok & (gk + 1 < b_rows) else uint32(0)

    @kernel(launch_bounds=(NT, 1))
    def gemm_tc_wide(a, b, a_idx, b_idx, bias, c, kw_total, b_rows, b_cols, code, has_bias):
        m_total = c.shape[1]
        n_total = c.shape[2]
        bz, m0, n0 = tile_of(m_total, n_total)
        ab = a_idx[bz]
        bb = b_idx[bz]
        t = cuda.threadIdx.x
        g, q, wm, wn = place()
        As = cuda.shared.array((BM, LD), uint32)
        Bs = cuda.shared.array((BN, LD), uint32)
        pa = cuda.local.array(A_LOADS, uint32)
        pb = cuda.local.array(B_LOADS, uint32)
        d = cuda.local.array((MT, NT8, 4), float32)  # [m16 tile][n8 tile][fragment register]
        for i in range(MT):
            for j in range(NT8):
                for r in range(4):
                    d[i, j, r] = zero
        # each load's row offset and whether its row exists: fixed for the whole K loop
        aoff = cuda.local.array(A_LOADS, int64)
        boff = cuda.local.array(B_LOADS, int64)
        ok_rows = uint32(0)
        for l in range(A_LOADS):
            gm = m0 + (t + l * NT) // KP
            aoff[l] = (ab * m_total + min(gm, m_total - 1)) * kw_total
            ok_rows |= uint32(gm < m_total) << l
        if trans_b:
            for l in range(B_LOADS):
                gn = n0 + (t + l * NT) // KP
                boff[l] = (bb * n_total + min(gn, n_total - 1)) * kw_total
                ok_rows |= uint32(gn < n_total) << (A_LOADS + l)
        else:
            gc = n0 // 2 + t % NCOLW
            boff[0] = bb * b_rows * b_cols + min(gc, b_cols - 1)
            ok_rows |= uint32(gc < b_cols) << A_LOADS
        kw0 = 0
        load_tile(a, b, kw0, t, pa, pb, aoff, boff, ok_rows, kw_total, b_rows, b_cols)
        while kw0 < kw_total:
            for l in range(A_LOADS):
                e = t + l * NT
                As[e // KP, e % KP] = pa[l]
            if trans_b:
                for l in range(B_LOADS):
                    e = t + l * NT
                    Bs[e // KP, e % KP] = pb[l]
            else:  # rows 2p, 2p + 1 of columns 2c, 2c + 1 -> column pairs along K
                for l in range(B_PAIRS):
                    e = t + l * NT
                    kp = e // NCOLW
                    cc = 2 * (e % NCOLW)
                    w0 = pb[2 * l]
                    w1 = pb[2 * l + 1]
                    Bs[cc, kp] = (w0 & LO) | (w1 << 16)
                    Bs[cc + 1, kp] = (w0 >> 16) | (w1 & HI)
            cuda.syncthreads()
            kw0 += KP
            if kw0 < kw_total:  # the next tile into registers: in flight during the mma below
                load_tile(a, b, kw0, t, pa, pb, aoff, boff, ok_rows, kw_total, b_rows, b_cols)
            for ks in range(BK // 16):
                mma_step(As, Bs, d, wm, wn, g, q, ks * 8)
            cuda.syncthreads()
        store(c, bias, d, bz, m0 + wm, n0 + wn, g, q, code, has_bias, m_total, n_total)

    return gemm_tc_wide


@lru_cache(maxsize=None)
def _grouped_tile_at(BM, BN, GROUP):
    """tile_at(blk, m_total, n_total) -> (batch, m0, n0) of block blk, GROUP row blocks swept together,
    column by column (grid x = batch x row blocks x column blocks): the blocks running at
    once share GROUP rows of A and a few B panels, which stay in L2, where row-major order
    streams all of B past every row of blocks (Triton's matmul tutorial, "L2 cache
    optimizations")."""

    @device
    def tile_at(blk, m_total, n_total):
        nbn = (n_total + BN - 1) // BN
        nbm = (m_total + BM - 1) // BM
        per = nbm * nbn
        bz = blk // per
        r = blk - bz * per
        gid = r // (GROUP * nbn)
        first = gid * GROUP
        rows = min(nbm - first, GROUP)
        w = r - gid * (GROUP * nbn)
        col = w // rows
        return bz, (first + w - col * rows) * BM, col * BN

    return tile_at


@lru_cache(maxsize=None)
def gemm_tc_async_kernel(trans_b, tile=TC_ASYNC_DEFAULT):
    """The float16 GEMM on tensor cores with a cp.async pipeline, built for `tile` (a name of
    cuda_tiles.TC_ASYNC_TILES or a TcAsyncTile): a BM x BN block tile over K tiles of BK,
    warps_m x warps_n warps of MT m16 x NT8 n8 mma tiles each (the default 128 x 128 x 32:
    8 warps of 64 x 32, 4 x 4 mma.m16n8k16 per K step of 16), arguments (a, b flat uint32
    views; kw_total = K / 2, b_rows = K, b_cols = N / 2), for K % 8 == 0, a (K, N) b's
    N % 8 == 0 and 16-byte aligned a and b (the dispatcher checks; rows are then whole
    16-byte chunks).
      Loads: each thread copies A_CP + B_CP chunks of 16 bytes per K tile global -> shared
    with cp.async (no registers staged, no stores); a chunk of absent rows, columns or K
    reads as zero (source size 0, from a clamped in-range address).  STAGES buffers of A and
    B: the tiles kt + 1 .. kt + STAGES - 1 are in flight while the tensor cores work on
    tile kt.  Per K tile one barrier: wait for tile kt's group, __syncthreads (its chunks are
    visible to all and every warp is done with tile kt - 1), issue tile kt + STAGES - 1 into
    tile kt - 1's buffer, then the mma.  Buffers over 48 KB are dynamic shared memory
    (launch with _jit.launch_dynamic and tile.shared_bytes).
      Shared layout, no padding: A (and B with trans_b) row-major, a row of BK halves = CH
    16-byte chunks, chunk c of row r stored at chunk c ^ ((r >> 1) & 3) for BK = 32 (two
    rows per 128 bytes), c ^ (r & 7) for BK = 64; a (K, N) B row of BN halves, chunk c of
    row k at c ^ (k & 7).  Eight rows an ldmatrix reads (or eight chunks a quarter-warp's
    cp.async writes) then fall in eight different 16-byte bank groups: no conflicts.
      Fragments: ldmatrix.x4 per m16 tile of A (a0..a3) and per pair of n8 tiles of B (b0,
    b1 of both: .x4 from B stored (N, K), .x4.trans from B stored (K, N)): MT + NT8 / 2 per
    K step of 16 for MT x NT8 mma.  bias and c are float16 (the wide kernel's epilogue)."""
    cfg = TC_ASYNC_TILES[tile] if isinstance(tile, str) else tile
    BM, BN, BK, STAGES = cfg.bm, cfg.bn, cfg.bk, cfg.stages
    NT = cfg.threads
    MT = BM // (16 * cfg.warps_m)
    NT8 = BN // (8 * cfg.warps_n)
    KP = BK // 2                  # words per A row of a tile (and per B row with trans_b)
    CH = BK // 8                  # 16-byte chunks per A row
    KS = BK // 16                 # mma K steps per tile
    SWS = 1 if CH == 4 else 0     # chunk c of row r at c ^ ((r >> SWS) & SWM)
    SWM = CH - 1
    A_STAGE = BM * KP             # words of a stage's A tile
    B_STAGE = BN * KP             # words of a stage's B tile ((K, N): BK rows of BN / 2 words)
    SW = A_STAGE + B_STAGE        # words per stage
    S_WORDS = STAGES * SW
    A_CP = BM * CH // NT          # cp.async per thread per tile
    B_CP = B_STAGE // 4 // NT
    BNW = BN // 2                 # (K, N) B: words per row of the tile
    BNC = BN // 8                 #           chunks per row
    ROWS_PER_PASS = NT // BNC     #           rows one pass of the block's copies covers
    DYN = cfg.dynamic
    # a thread's copies are NT / CH rows apart (A, (N, K) B) or ROWS_PER_PASS rows ((K, N)
    # B): multiples of the swizzle's period of 8 rows, so their places differ by constants
    assert NT // CH % 8 == 0 and ROWS_PER_PASS % 8 == 0
    A_DST_STEP = NT // CH * KP
    B_DST_STEP = A_DST_STEP if trans_b else ROWS_PER_PASS * BNW
    assert CH in (4, 8) and MT >= 1 and NT8 % 2 == 0 and BM == 16 * MT * cfg.warps_m and BN == 8 * NT8 * cfg.warps_n
    assert STAGES >= 2 and A_CP >= 1 and B_CP >= 1 and A_CP + B_CP <= 32
    assert BM * CH % NT == 0 and B_STAGE // 4 % NT == 0 and NT % CH == 0 and NT % BNC == 0 and BNC >= 8
    assert DYN or S_WORDS * 4 <= STATIC_SMEM
    WAIT = STAGES - 2             # groups left pending when tile kt must be complete
    zero = np.float32(0.0)
    _, _, _, store, tile_at, place_at = _tc_parts(BM, BN, MT, NT8)
    if cfg.group_m > 1:
        tile_at = _grouped_tile_at(BM, BN, cfg.group_m)

    @device
    def row_place(r, c):
        """Word of chunk c of row r in an A tile (or a B tile stored (N, K)): the swizzle."""
        return r * KP + ((c ^ ((r >> SWS) & SWM)) << 2)

    @device
    def kn_place(kr, c):
        """Word of chunk c of K row kr in a B tile stored (K, N)."""
        return kr * BNW + ((c ^ (kr & 7)) << 2)

    @device
    def load_full(S, base, kw0, pa, pb, a_dst, b_dst, ok_rows, b_cols):
        """Issue the copies of the whole K tile at word kw0 into the stage at word base: from
        fixed addresses plus the tile's offset (pa[l], pb[l]: the global_address of each
        copy's chunk in K tile 0, rows clamped in range), to a_dst + l * A_DST_STEP (b_dst +
        l * B_DST_STEP) in a stage; ok_rows a bit per copy whose row ((K, N) b: column)
        exists, the others read zero."""
        step = uint64(4 * kw0)
        for l in range(A_CP):
            cp_async16_at(S, base + a_dst + l * A_DST_STEP, pa[l] + step, 16 if (ok_rows >> l) & 1 == 1 else 0)
        if trans_b:
            for l in range(B_CP):
                cp_async16_at(S, base + A_STAGE + b_dst + l * B_DST_STEP, pb[l] + step,
                              16 if (ok_rows >> (A_CP + l)) & 1 == 1 else 0)
        else:  # K row 2 kw0 of b; the thread's column is the same for all its copies
            bstep = uint64(8 * kw0 * b_cols)
            nb = 16 if (ok_rows >> A_CP) & 1 == 1 else 0
            for l in range(B_CP):
                cp_async16_at(S, base + A_STAGE + b_dst + l * B_DST_STEP, pb[l] + bstep, nb)

    @device
    def load_partial(S, a, b, base, kw0, t, ab, bb, m0, n0, m_total, n_total, kw_total, b_rows, b_cols):
        """The copies of the last, partial K tile (at word kw0) into the stage at word base:
        chunks past K, or of absent rows / columns, read as zero from clamped addresses.
        Their places recomputed here, so that nothing of this tile stays live through the
        main loop (registers: the 2-blocks-per-SM build has 128)."""
        ch = t % CH
        kv = kw0 + 4 * ch  # this thread's word of K
        kok = kv < kw_total
        kc = min(kv, kw_total - 4)
        for l in range(A_CP):
            r = (t + l * NT) // CH
            gm = m0 + r
            src = (ab * m_total + min(gm, m_total - 1)) * kw_total + kc
            cp_async16(S, base + row_place(r, ch), a, src, 16 if kok and gm < m_total else 0)
        if trans_b:
            for l in range(B_CP):
                r = (t + l * NT) // CH
                gn = n0 + r
                src = (bb * n_total + min(gn, n_total - 1)) * kw_total + kc
                cp_async16(S, base + A_STAGE + row_place(r, ch), b, src,
                           16 if kok and gn < n_total else 0)
        else:
            cn = t % BNC
            gw = n0 // 2 + 4 * cn
            for l in range(B_CP):
                kr = t // BNC + l * ROWS_PER_PASS
                gk = 2 * kw0 + kr  # this copy's row of K
                src = (bb * b_rows + min(gk, b_rows - 1)) * b_cols + min(gw, b_cols - 4)
                cp_async16(S, base + A_STAGE + kn_place(kr, cn), b, src,
                           16 if gw < b_cols and gk < b_rows else 0)

    @device
    def mma_tile(S, rb, a_lane, b_lane, d, af, bf):
        """The warp's MT x NT8 mma over the K tile in the stage at word rb, fragments by
        ldmatrix from this lane's row addresses: a_lane / b_lane its A / B row and chunk at
        K step 0 (and n8 pair 0); the chunk of K step ks (or pair jj of a (K, N) B) is that
        chunk XOR 2 ks (2 jj), as the swizzle is an XOR of the low chunk bits (see below)."""
        for ks in range(KS):
            ao = rb + (a_lane ^ (ks << 3))
            for i in range(MT):
                af[i, 0], af[i, 1], af[i, 2], af[i, 3] = ldmatrix_x4(S, ao + i * 16 * KP)
            if trans_b:
                bo = rb + (b_lane ^ (ks << 3))
                for jj in range(NT8 // 2):
                    bf[2 * jj, 0], bf[2 * jj, 1], bf[2 * jj + 1, 0], bf[2 * jj + 1, 1] = ldmatrix_x4(S, bo + jj * 16 * KP)
            else:
                for jj in range(NT8 // 2):
                    bo = rb + ks * 16 * BNW + (b_lane ^ (jj << 3))
                    bf[2 * jj, 0], bf[2 * jj, 1], bf[2 * jj + 1, 0], bf[2 * jj + 1, 1] = ldmatrix_x4_trans(S, bo)
            for i in range(MT):
                for j in range(NT8):
                    d0, d1, d2, d3 = mma_16816(af[i, 0], af[i, 1], af[i, 2], af[i, 3], bf[j, 0], bf[j, 1],
                                               d[i, j, 0], d[i, j, 1], d[i, j, 2], d[i, j, 3])
                    d[i, j, 0] = d0
                    d[i, j, 1] = d1
                    d[i, j, 2] = d2
                    d[i, j, 3] = d3

    @kernel(launch_bounds=(NT, cfg.min_blocks))
    def gemm_tc_async(a, b, a_idx, b_idx, bias, c, kw_total, b_rows, b_cols, code, has_bias):
        m_total = c.shape[1]
        n_total = c.shape[2]
        bz, m0, n0 = tile_at(cuda.blockIdx.x, m_total, n_total)
        ab = a_idx[bz]
        bb = b_idx[bz]
        t = cuda.threadIdx.x
        _, _, wm, wn = place_at(t)
        S = cuda.shared.array(0 if DYN else S_WORDS, uint32, alignment=128)
        d = cuda.local.array((MT, NT8, 4), float32)  # [m16 tile][n8 tile][fragment register]
        af = cuda.local.array((MT, 4), uint32)
        bf = cuda.local.array((NT8, 2), uint32)
        for i in range(MT):
            for j in range(NT8):
                for r in range(4):
                    d[i, j, r] = zero
        # ---- the copies of this thread for the whole K tiles: fixed for the whole K loop
        pa = cuda.local.array(A_CP, uint64)
        pb = cuda.local.array(B_CP, uint64)
        ok_rows = uint32(0)
        ch = t % CH  # the thread's chunk of an A row: the same for all its copies (NT % CH == 0)
        kq = 4 * ch  # its word of K within a tile's row
        r = t // CH
        a_dst = row_place(r, ch)  # copy l's: + l * A_DST_STEP
        b_dst = a_dst
        for l in range(A_CP):
            r = (t + l * NT) // CH
            gm = m0 + r
            ok_rows |= uint32(gm < m_total) << l
            # the copy's address in K tile 0 (the kernel's arrays need not be empty: clamped rows)
            pa[l] = global_address(a, (ab * m_total + min(gm, m_total - 1)) * kw_total + kq)
        if trans_b:
            for l in range(B_CP):
                r = (t + l * NT) // CH
                gn = n0 + r
                ok_rows |= uint32(gn < n_total) << (A_CP + l)
                pb[l] = global_address(b, (bb * n_total + min(gn, n_total - 1)) * kw_total + kq)
        else:
            cn = t % BNC  # the thread's chunk of a B row (NT % BNC == 0)
            gw = n0 // 2 + 4 * cn  # its first word in a row of b
            ok_rows |= uint32(gw < b_cols) << A_CP
            kr = t // BNC
            b_dst = kn_place(kr, cn)
            for l in range(B_CP):
                kr = t // BNC + l * ROWS_PER_PASS  # < BK <= b_rows wherever a whole K tile exists
                pb[l] = global_address(b, (bb * b_rows + min(kr, b_rows - 1)) * b_cols + min(gw, b_cols - 4))
        # ---- ldmatrix row addresses of this lane (words within a stage); chunks per K step in mma_tile
        lane = t & 31
        mi = lane >> 3  # the matrix this lane addresses a row of
        r8 = lane & 7   # and the row
        sw = (r8 >> SWS) & SWM
        # Chunk c of K step ks is 2 ks + (mi >> 1) (A) or + (mi & 1) (B as (N, K)), stored at
        # (2 ks + x) ^ sw = (x ^ sw) ^ 2 ks (x < 2); a row's offset has no bits below its
        # chunks, so the step is an XOR of the word offset by ks << 3.  A (K, N) B's pair jj
        # of n8 tiles: chunk (wn >> 3) + 2 jj + (mi >> 1) of row k, stored at that ^ r8 =
        # ((wn >> 3) + (mi >> 1)) ^ r8 ^ 2 jj (wn >> 3 a multiple of NT8 > 2 jj).
        a_lane = (wm + 8 * (mi & 1) + r8) * KP + (((mi >> 1) ^ sw) << 2)
        if trans_b:  # rows n (16 per pair of n8 tiles), chunks of K
            b_lane = A_STAGE + (wn + 8 * (mi >> 1) + r8) * KP + (((mi & 1) ^ sw) << 2)
        else:  # rows k of the tile, chunks of N
            b_lane = A_STAGE + (8 * (mi & 1) + r8) * BNW + ((((wn >> 3) + (mi >> 1)) ^ r8) << 2)
        # ---- prologue: whole tiles 0 .. STAGES - 2 in flight (a group each, empty past the last)
        kfull = kw_total // KP        # whole K tiles; a partial last one follows the loop
        for s in range(STAGES - 1):
            if s < kfull:
                load_full(S, s * SW, s * KP, pa, pb, a_dst, b_dst, ok_rows, b_cols)
            cp_async_commit()
        rb = 0                        # the stage read this iteration
        for kt in range(kfull):
            cp_async_wait(WAIT)       # this thread's copies of tile kt are complete
            cuda.syncthreads()        # everyone's are; every warp is done with tile kt - 1
            nk = kt + STAGES - 1
            if nk < kfull:            # into tile kt - 1's buffer, the stage before rb
                wb = rb - SW if rb >= SW else rb + (S_WORDS - SW)
                load_full(S, wb, nk * KP, pa, pb, a_dst, b_dst, ok_rows, b_cols)
            cp_async_commit()
            mma_tile(S, rb, a_lane, b_lane, d, af, bf)
            rb += SW
            if rb == S_WORDS:
                rb = 0
        if kfull * KP < kw_total:
            # the partial last tile into stage rb (tile kfull's: no copies were issued into
            # it, and every warp passed the last barrier after its tile kfull - STAGES)
            load_partial(S, a, b, rb, kfull * KP, t, ab, bb, m0, n0, m_total, n_total, kw_total, b_rows, b_cols)
            cp_async_commit()
            cp_async_wait(0)
            cuda.syncthreads()
            mma_tile(S, rb, a_lane, b_lane, d, af, bf)
        cp_async_wait(0)  # nothing left in flight (the groups past the last tile are empty)
        # the block's tile and the warp's place again, from fresh reads of the indices: not
        # held in registers through the K loop (the 2-blocks-per-SM builds have 128)
        bz, m0, n0 = tile_at(ctaid_x_fresh(), m_total, n_total)
        g, q, wm, wn = place_at(tid_x_fresh())
        store(c, bias, d, bz, m0 + wm, n0 + wn, g, q, code, has_bias, m_total, n_total)

    return gemm_tc_async


@lru_cache(maxsize=None)
def gemv_kernel(acc_np, trans_b, columns=8, rows=GEMV_MAX_M, warps=GEMV_KN_WARPS):
    """C = act(A @ op(B) + bias) for few rows of A (decode), no tiles; one kernel per B
    layout (each with only the registers and shared memory its own loop needs).  Rows are
    taken `rows` at a time (accumulators in registers), each weight element read once per
    group of rows: GEMV_MAX_M, or 1 for a single row (decode), whose build has no loads and
    FMAs predicated off for absent rows and fewer registers.  Each warp keeps
    gemv_unroll(rows) independent weight loads in flight per step (coalesced: consecutive
    lanes, consecutive addresses), then a remainder loop.
      trans_b (linear's (N, K) weight): one warp per output column, its lanes striding over
        K, a warp sum; warps grid-stride over (batch, column).
      (K, N) b: a block of `warps` warps (GEMV_KN_WARPS, fewer on a part that takes
        smaller blocks) per `columns` consecutive columns (one
        32-byte sector of a row, kernels_common.cuda_tiles.gemv_kn_columns), lane l on
        column l % columns of row l // columns; the block's warps interleave over K, the
        lanes of a column are summed by shuffles, the warps' partial sums in shared memory
        in warp order (deterministic); blocks grid-stride over (batch, column group)."""
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)
    act = act_fn(acc_np)
    NT = 32 * GEMV_WARPS
    MM = rows
    U = gemv_unroll(rows)

    @kernel(launch_bounds=(NT, 4))
    def gemv_nk(a, b, a_idx, b_idx, bias, c, code, has_bias, trans_b_unused):
        m_total = a.shape[1]
        k_total = a.shape[2]
        n_total = c.shape[2]
        s = cuda.local.array(MM, acc)
        w = cuda.local.array(U, acc)
        lane = cuda.threadIdx.x & 31
        total = c.shape[0] * n_total
        for item in range(cuda.blockIdx.x * GEMV_WARPS + (cuda.threadIdx.x >> 5), total, cuda.gridDim.x * GEMV_WARPS):
            bz = item // n_total  # the same item for every lane of the warp
            n = item - bz * n_total
            ab = a_idx[bz]
            bb = b_idx[bz]
            for m0 in range(0, m_total, MM):
                for mm in range(MM):
                    s[mm] = zero
                k = lane
                while k + 32 * (U - 1) < k_total:
                    for u in range(U):
                        w[u] = acc(b[bb, n, k + 32 * u])
                    for u in range(U):
                        for mm in range(MM):
                            if m0 + mm < m_total:
                                s[mm] += acc(a[ab, m0 + mm, k + 32 * u]) * w[u]
                    k += 32 * U
                while k < k_total:
                    w0 = acc(b[bb, n, k])
                    for mm in range(MM):
                        if m0 + mm < m_total:
                            s[mm] += acc(a[ab, m0 + mm, k]) * w0
                    k += 32
                for mm in range(MM):
                    if m0 + mm < m_total:
                        v = warp_sum(s[mm])
                        if lane == 0:
                            if has_bias:
                                v += acc(bias[n])
                            c[bz, m0 + mm, n] = act(v, code)

    W = warps
    C = columns
    R = 32 // C  # rows of K per warp step

    # two blocks per SM where the registers allow it without spilling (ptxas: the 8-row
    # build and float64's one-row build on sm_80 spill under the 64-register cap of (512, 2))
    @kernel(launch_bounds=(32 * W, 2 if rows == 1 and acc_np is not np.float64 else 1))
    def gemv_kn(a, b, a_idx, b_idx, bias, c, code, has_bias, trans_b_unused):
        m_total = a.shape[1]
        k_total = a.shape[2]
        n_total = c.shape[2]
        s = cuda.local.array(MM, acc)
        w = cuda.local.array(U, acc)
        part = cuda.shared.array((W, MM, C), acc)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        col = lane % C
        k_first = warp * R + lane // C
        step = R * W
        groups = (n_total + C - 1) // C
        total = c.shape[0] * groups
        for item in range(cuda.blockIdx.x, total, cuda.gridDim.x):  # the same item for the whole block
            bz = item // groups
            n = (item - bz * groups) * C + col
            ab = a_idx[bz]
            bb = b_idx[bz]
            for m0 in range(0, m_total, MM):
                for mm in range(MM):
                    s[mm] = zero
                if n < n_total:
                    k = k_first
                    while k + step * (U - 1) < k_total:
                        # unsigned row indices: numba's negative-index wrap-around select on
                        # each signed one kept the row offsets from being strength-reduced
                        for u in range(U):
                            w[u] = acc(b[bb, uint64(k + step * u), n])
                        for u in range(U):
                            for mm in range(MM):
                                if m0 + mm < m_total:
                                    s[mm] += acc(a[ab, m0 + mm, uint64(k + step * u)]) * w[u]
                        k += step * U
                    while k < k_total:
                        w0 = acc(b[bb, k, n])
                        for mm in range(MM):
                            if m0 + mm < m_total:
                                s[mm] += acc(a[ab, m0 + mm, k]) * w0
                        k += step
                off = C
                while off < 32:  # the lanes of one column (a warp-uniform loop: all lanes shuffle)
                    for mm in range(MM):
                        s[mm] += cuda.shfl_xor_sync(FULL_MASK, s[mm], off)
                    off *= 2
                if lane < C:
                    for mm in range(MM):
                        part[warp, mm, col] = s[mm]
                cuda.syncthreads()
                if warp == 0 and lane < C and n < n_total:
                    for mm in range(MM):
                        if m0 + mm < m_total:
                            v = part[0, mm, col]
                            for w2 in range(1, W):
                                v += part[w2, mm, col]
                            if has_bias:
                                v += acc(bias[n])
                            c[bz, m0 + mm, n] = act(v, code)
                cuda.syncthreads()

    return gemv_nk if trans_b else gemv_kn


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _itemsize(dt):
    return np.dtype(str(dt)).itemsize


def _gemm_args(dt):
    i64 = types.int64
    return (arr(dt, 3), arr(dt, 3), arr(i64, 1), arr(i64, 1), arr(dt, 1), arr(dt, 3), i64, types.boolean,
            types.boolean)


def _gemm_vec_args(dt):
    i64 = types.int64
    return (arr(dt, 3), arr(dt, 3), arr(i64, 1), arr(i64, 1), arr(dt, 1), arr(dt, 3), i64, types.boolean)


def _gemm_tc_args(dt):
    i64, u16 = types.int64, types.uint16
    return (arr(u16, 3), arr(u16, 3), arr(i64, 1), arr(i64, 1), arr(dt, 1), arr(dt, 3), i64, types.boolean,
            types.boolean)


def _gemm_tc_wide_args(dt):
    i64, u32 = types.int64, types.uint32
    return (arr(u32, 1), arr(u32, 1), arr(i64, 1), arr(i64, 1), arr(dt, 1), arr(dt, 3), i64, i64, i64, i64,
            types.boolean)


PTX = [
    PtxBuild(TC_KERNEL, "linalg", lambda dt: gemm_tc_kernel(), _gemm_tc_args, threads=32 * TC_WARPS,
             dtypes=("float16",), requires=("mma.sync.aligned.m16n8k16",)),
    PtxBuild(TC_WIDE_KERNEL, "linalg", lambda dt: gemm_tc_wide_kernel(False), _gemm_tc_wide_args,
             threads=32 * TC_WIDE_WARPS, dtypes=("float16",), requires=("mma.sync.aligned.m16n8k16",)),
    PtxBuild(TC_WIDE_KERNEL + ".nk", "linalg", lambda dt: gemm_tc_wide_kernel(True), _gemm_tc_wide_args,
             threads=32 * TC_WIDE_WARPS, dtypes=("float16",), requires=("mma.sync.aligned.m16n8k16",)),
] + [
    PtxBuild(tc_async_kernel_name(build, nk), "linalg",
             (lambda build, nk: lambda dt: gemm_tc_async_kernel(nk, build))(build, nk), _gemm_tc_wide_args, threads=TC_ASYNC_TILES[build].threads, dtypes=("float16",),
             requires=("mma.sync.aligned.m16n8k16", "cp.async.cg.shared.global",
                       "ldmatrix.sync.aligned.m8n8.x4" + ("" if nk else ".trans")),
             fits=(lambda build: lambda optin, per_sm: tc_async_fits(build, optin, per_sm))(build),
             dynamic_shared=TC_ASYNC_TILES[build].shared_bytes if TC_ASYNC_TILES[build].dynamic else 0)
    for build in TC_ASYNC_RUN for nk in (False, True)
] + [
    PtxBuild(GEMM_VEC_KERNEL, "linalg", lambda dt: gemm_vec_kernel(False), _gemm_vec_args, threads=256,
             dtypes=("float32",)),
    PtxBuild(GEMM_VEC_KERNEL + ".nk", "linalg", lambda dt: gemm_vec_kernel(True), _gemm_vec_args, threads=256,
             dtypes=("float32",)),
    PtxBuild("gemm.gemv_nk", "linalg", lambda dt: gemv_kernel(acc_np(dt), True), _gemm_args, threads=32 * GEMV_WARPS),
    PtxBuild("gemm.gemv_kn", "linalg", lambda dt: gemv_kernel(acc_np(dt), False, gemv_kn_columns(_itemsize(dt))),
             _gemm_args, threads=32 * GEMV_KN_WARPS),
    PtxBuild("gemm.gemv_nk.m1", "linalg", lambda dt: gemv_kernel(acc_np(dt), True, rows=1), _gemm_args,
             threads=32 * GEMV_WARPS),
    PtxBuild("gemm.gemv_kn.m1", "linalg", lambda dt: gemv_kernel(acc_np(dt), False, gemv_kn_columns(_itemsize(dt)), 1),
             _gemm_args, threads=32 * GEMV_KN_WARPS),
] + [
    PtxBuild(f"gemm.{tile}", "linalg", (lambda tile: lambda dt: gemm_kernel(acc_np(dt), tile))(tile), _gemm_args,
             threads=gemm_threads(tile), dtypes=gemm_tile_dtypes(tile))
    for tile in CONFIGS
]
