"""Backward of matmul / linear with the fused epilogue on CUDA: kernels_cuda/gemm.py's tiled
GEMM with a prologue.  The operand that is g' = grad_out * act'(pre) is formed while its tile
is staged into shared memory (grad_out and pre read side by side, act' by
kernels_cuda/activation_grad.grad_input_fn, the twin of the CPU formulas), so no (M, N) g'
array and no elementwise pass exist; dbias comes from the same staged tiles.

gemm_grad_kernel(acc, cfg, g_side): C[bz] = op(A[a_idx[bz]]) @ op(B[b_idx[bz]]) with
  trans_a: A stored (Ba, K, M) (element (m, k) at a[., k, m]; dW = g'^T x reads g' so),
           else (Ba, M, K);
  trans_b: B stored (Bb, N, K), else (Bb, K, N);
  g_side "a" / "b": which operand is g' (pre laid out as that operand); "none": plain.
The tile loop is gemm_tiled's (BM x BN block, TM x TN per thread, BK steps, shared rows
padded by one word); the staging loops put consecutive threads on consecutive addresses of
the source for either layout (coalesced).  dbias: g' is summed over K (the forward's rows M)
in the blocks of the first output column block (g' = A, whose columns are the output's
rows: dW) or of the first row block (g' = B: db), one thread per staged column, in k order,
into dbias[bz, column] (partial per output batch; deterministic, no atomics).

sum_groups_kernel: out[j, :] = sum of full[i, :] over the output batches i in group j (in
order): the batch dims an operand was broadcast along (da / db / the dbias partials).
"""
from functools import lru_cache

from numba import cuda, types

from kernels_common.cuda_tiles import GEMM_TILES as CONFIGS
from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, gemm_threads, gemm_tile_dtypes

from ._jit import PtxBuild, acc_np, acc_of, arr, kernel
from .activation_grad import grad_input_fn
from .simt_tile import geometry, tile_clear, tile_fma

G_SIDES = ("none", "a", "b")


@lru_cache(maxsize=None)
def gemm_grad_kernel(acc_np, cfg, g_side):
    T = geometry(cfg)
    BM, BN, BK, TM, TN = T.bm, T.bn, T.bk, T.tm, T.tn
    NTX, NTY, NT, A_LOADS, B_LOADS = T.ntx, T.nty, T.nt, T.a_loads, T.b_loads
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)
    gi = grad_input_fn(acc_np)
    GA = g_side == "a"
    GB = g_side == "b"
    AS_SHAPE, BS_SHAPE, ACC_SHAPE = T.as_shape, T.bs_shape, T.acc_shape
    fma, clear = tile_fma(cfg), tile_clear(cfg)

    # one block per SM guaranteed (the forward asks for 2): with the prologue's derivative
    # (erfc, exp) and the dbias sums, the 128x64 and 64x64 tiles spilled under the forward's
    # 128-register cap (bench.ptx, sm_80/87/90); here they may use up to 255
    @kernel(launch_bounds=(NT, 1))
    def gemm_grad(a, b, pre, a_idx, b_idx, c, dbias, code, trans_a, trans_b, has_dbias):
        m_total = c.shape[1]
        n_total = c.shape[2]
        k_total = a.shape[1] if trans_a else a.shape[2]
        nbn = (n_total + BN - 1) // BN
        nbm = (m_total + BM - 1) // BM
        blk = cuda.blockIdx.x
        bn = blk % nbn
        rest = blk // nbn
        bz = rest // nbm
        ab = a_idx[bz]
        bb = b_idx[bz]
        bmi = rest - bz * nbm
        m0 = bmi * BM
        n0 = bn * BN
        t = cuda.threadIdx.x
        tx = t % NTX
        ty = t // NTX
        As = cuda.shared.array(AS_SHAPE, acc)
        Bs = cuda.shared.array(BS_SHAPE, acc)
        accr = cuda.local.array(ACC_SHAPE, acc)
        af = cuda.local.array(TM, acc)
        bf = cuda.local.array(TN, acc)
        # dbias: the first column block sums A's columns (g' = A), the first row block B's
        sums = (GA and has_dbias and bn == 0) or (GB and has_dbias and bmi == 0)
        colsum = zero
        colsum2 = zero  # BM / BN may be twice the thread count: a second column per thread
        clear(accr, zero)
        for k0 in range(0, k_total, BK):
            for l in range(A_LOADS):
                e = t + l * NT
                if trans_a:  # a (K, M): consecutive threads, consecutive m
                    kk = e // BM
                    mm = e - kk * BM
                else:        # a (M, K): consecutive threads, consecutive k
                    mm = e // BK
                    kk = e - mm * BK
                gm = m0 + mm
                gk = k0 + kk
                v = zero
                if gm < m_total and gk < k_total:
                    if trans_a:
                        v = acc(a[ab, gk, gm])
                        if GA:
                            v = gi(v, acc(pre[ab, gk, gm]), code)
                    else:
                        v = acc(a[ab, gm, gk])
                        if GA:
                            v = gi(v, acc(pre[ab, gm, gk]), code)
                As[kk, mm] = v
            for l in range(B_LOADS):
                e = t + l * NT
                if trans_b:  # b (N, K): consecutive threads, consecutive k
                    nn = e // BK
                    kk = e - nn * BK
                else:        # b (K, N): consecutive threads, consecutive n
                    kk = e // BN
                    nn = e - kk * BN
                gn = n0 + nn
                gk = k0 + kk
                v = zero
                if gn < n_total and gk < k_total:
                    if trans_b:
                        v = acc(b[bb, gn, gk])
                        if GB:
                            v = gi(v, acc(pre[bb, gn, gk]), code)
                    else:
                        v = acc(b[bb, gk, gn])
                        if GB:
                            v = gi(v, acc(pre[bb, gk, gn]), code)
                Bs[kk, nn] = v
            cuda.syncthreads()
            if sums:
                if GA:
                    if t < BM:
                        for kk in range(BK):
                            colsum += As[kk, t]
                    if t + NT < BM:
                        for kk in range(BK):
                            colsum2 += As[kk, t + NT]
                else:
                    if t < BN:
                        for kk in range(BK):
                            colsum += Bs[kk, t]
                    if t + NT < BN:
                        for kk in range(BK):
                            colsum2 += Bs[kk, t + NT]
            fma(As, Bs, accr, af, bf, tx, ty)
            cuda.syncthreads()
        if sums:
            if GA:
                cols, c0 = m_total, m0
            else:
                cols, c0 = n_total, n0
            if t < (BM if GA else BN) and c0 + t < cols:
                dbias[bz, c0 + t] = colsum
            if t + NT < (BM if GA else BN) and c0 + t + NT < cols:
                dbias[bz, c0 + t + NT] = colsum2
        for i in range(TM):
            gm = m0 + ty + i * NTY
            if gm < m_total:
                for j in range(TN):
                    gn = n0 + tx + j * NTX
                    if gn < n_total:
                        c[bz, gm, gn] = accr[i, j]

    return gemm_grad


@lru_cache(maxsize=None)
def sum_groups_kernel(acc_np):
    """kernel(full (B, E), order (B,), starts (G + 1,), out (G, E)): out[j, e] = sum over
    i in order[starts[j]:starts[j + 1]] of full[i, e], in that order (deterministic)."""
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def sum_groups(full, order, starts, out):
        groups = out.shape[0]
        width = out.shape[1]
        total = groups * width
        for item in range(cuda.grid(1), total, cuda.gridsize(1)):
            j = item // width
            e = item - j * width
            s = zero
            for p in range(starts[j], starts[j + 1]):
                s += acc(full[order[p], e])
            out[j, e] = s

    return sum_groups


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _gemm_grad_args(dt):
    i64 = types.int64
    return (arr(dt, 3), arr(dt, 3), arr(dt, 3), arr(i64, 1), arr(i64, 1), arr(dt, 3), arr(dt, 2), i64, types.boolean,
            types.boolean, types.boolean)


PTX = [
    PtxBuild(f"linalg_grad.{tile}.{side}", "linalg_grad",
             (lambda tile, side: lambda dt: gemm_grad_kernel(acc_np(dt), tile, side))(tile, side), _gemm_grad_args,
             threads=gemm_threads(tile), dtypes=tuple(d for d in gemm_tile_dtypes(tile) if d != "float16"))
    for tile in CONFIGS for side in G_SIDES
] + [
    PtxBuild("linalg_grad.sum_groups", "linalg_grad", lambda dt: sum_groups_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 2), arr(types.int64, 1), arr(types.int64, 1), arr(dt, 2)),
             threads=ELEMENTWISE_THREADS, dtypes=("float32", "float64")),
]
