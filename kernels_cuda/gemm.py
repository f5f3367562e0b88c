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

Not done (stated in the report): double-buffered tile loads, 128-bit vector loads, tensor
cores (numba-cuda exposes no mma).
"""
from functools import lru_cache

from numba import cuda, types

from kernels_common.cuda_tiles import GEMM_TILES as CONFIGS  # (BM, BN, BK, TM, TN) per tile name
from kernels_common.cuda_tiles import gemm_threads, gemm_tile_dtypes

from ._jit import PtxBuild, acc_np, acc_of, arr, kernel
from .activation import act_fn


@lru_cache(maxsize=None)
def gemm_kernel(acc_np, cfg):
    BM, BN, BK, TM, TN = CONFIGS[cfg]
    NTX = BN // TN
    NTY = BM // TM
    NT = NTX * NTY
    A_LOADS = (BM * BK) // NT
    B_LOADS = (BN * BK) // NT
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)
    act = act_fn(acc_np)
    AS_SHAPE = (BK, BM + 1)  # +1: the transposing stores spread over the banks
    BS_SHAPE = (BK, BN + 1)
    ACC_SHAPE = (TM, TN)

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
        for i in range(TM):
            for j in range(TN):
                accr[i, j] = zero
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
            for kk in range(BK):
                for i in range(TM):
                    af[i] = As[kk, ty + i * NTY]
                for j in range(TN):
                    bf[j] = Bs[kk, tx + j * NTX]
                for i in range(TM):
                    for j in range(TN):
                        accr[i, j] += af[i] * bf[j]
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


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _gemm_args(dt):
    i64 = types.int64
    return (arr(dt, 3), arr(dt, 3), arr(i64, 1), arr(i64, 1), arr(dt, 1), arr(dt, 3), i64, types.boolean,
            types.boolean)


PTX = [
    PtxBuild(f"gemm.{tile}", "linalg", (lambda tile: lambda dt: gemm_kernel(acc_np(dt), tile))(tile), _gemm_args,
             threads=gemm_threads(tile), dtypes=gemm_tile_dtypes(tile))
    for tile in CONFIGS
]
