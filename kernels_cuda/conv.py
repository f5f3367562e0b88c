"""2-D convolution (NCHW) with the per-channel bias and the activation fused.

conv_igemm (cfg a GEMM tile of kernels_common.cuda_tiles.GEMM_TILES): an implicit GEMM,
the tiled GEMM of kernels_cuda/gemm.py with B gathered from the image.  Per image n and
group g: out[n, g] (Cout_g, P = OH*OW) = W_g (Cout_g, Kc) @ col (Kc, P), Kc = Cin_g*KH*KW.
A block computes a BM x BN tile (output channels x pixels): per BK step it stages the
weight tile (consecutive threads: consecutive k of a weight row) and the col tile
(consecutive threads: consecutive pixels, i.e. consecutive input columns for stride 1),
zeros for the padding.  No division in the K loop: the row k -> (channel, tap) mapping is
a per-geometry int32 table (tap_off[k] = ci*H*W + ky*dh*W + kx*dw, tap_dy[k] = ky*dh,
tap_dx[k] = kx*dw; built once per geometry by the dispatcher and kept on the device), and
each thread decomposes its B_LOADS pixels into (oy, ox) once, before the loop.  The grid
is one dimension: pixel block fastest, then channel block, then (image, group).
float16 inputs are converted to float32 when staged (float32 accumulation).

depthwise (groups == C, Cout = C * multiplier): one thread per output element, the
KH x KW taps of one input plane; consecutive threads take consecutive output columns.
"""
from functools import lru_cache

import numpy as np
from numba import cuda, types

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS
from kernels_common.cuda_tiles import GEMM_TILES as CONFIGS
from kernels_common.cuda_tiles import gemm_threads, gemm_tile_dtypes

from ._jit import PtxBuild, acc_np, acc_of, arr, kernel
from .activation import act_fn
from .simt_tile import geometry, tile_clear, tile_fma


@lru_cache(maxsize=None)
def conv_kernel(acc_np, cfg):
    T = geometry(cfg)
    BM, BN, BK, TM, TN = T.bm, T.bn, T.bk, T.tm, T.tn
    NTX, NTY, NT, A_LOADS, B_LOADS = T.ntx, T.nty, T.nt, T.a_loads, T.b_loads
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)
    act = act_fn(acc_np)
    AS_SHAPE, BS_SHAPE, ACC_SHAPE = T.as_shape, T.bs_shape, T.acc_shape
    fma, clear = tile_fma(cfg), tile_clear(cfg)

    @kernel(launch_bounds=(NT, 2))
    def conv_igemm(xf, C, H, W, w, tap_off, tap_dy, tap_dx, bias, out, groups, sh, sw, ph, pw, code, has_bias):
        # xf: x (N, C, H, W) flattened; w (Cout, Kc) (the weight's 2-D view); out (N, Cout, OH, OW)
        cout, kc_total = w.shape[0], w.shape[1]
        OH, OW = out.shape[2], out.shape[3]
        P = OH * OW
        cin_g = C // groups
        cout_g = cout // groups
        nbn = (P + BN - 1) // BN
        nbm = (cout_g + BM - 1) // BM
        blk = cuda.blockIdx.x
        bn = blk % nbn
        rest = blk // nbn
        ng = rest // nbm
        m0 = (rest - ng * nbm) * BM
        n0 = bn * BN
        img = ng // groups
        g = ng - img * groups
        xbase = (img * C + g * cin_g) * H * W
        wrow = g * cout_g
        t = cuda.threadIdx.x
        tx = t % NTX
        ty = t // NTX
        As = cuda.shared.array(AS_SHAPE, acc)
        Bs = cuda.shared.array(BS_SHAPE, acc)
        accr = cuda.local.array(ACC_SHAPE, acc)
        af = cuda.local.array(TM, acc)
        bf = cuda.local.array(TN, acc)
        # this thread's B_LOADS pixels, decomposed once: top-left input corner (or a
        # sentinel row far outside the image for pixels past P)
        iy0 = cuda.local.array(B_LOADS, types.int32)
        ix0 = cuda.local.array(B_LOADS, types.int32)
        for l in range(B_LOADS):
            e = t + l * NT
            gp = n0 + (e % BN)
            oy = gp // OW
            iy0[l] = oy * sh - ph if gp < P else -(1 << 30)
            ix0[l] = (gp - oy * OW) * sw - pw
        clear(accr, zero)
        for k0 in range(0, kc_total, BK):
            for l in range(A_LOADS):  # weight tile as As[k][m]; consecutive threads: consecutive k
                e = t + l * NT
                mm = e // BK
                kk = e - mm * BK
                gm = m0 + mm
                gk = k0 + kk
                v = zero
                if gm < cout_g and gk < kc_total:
                    v = acc(w[wrow + gm, gk])
                As[kk, mm] = v
            for l in range(B_LOADS):  # col tile as Bs[k][p]; consecutive threads: consecutive pixels
                e = t + l * NT
                kk = e // BN
                gk = k0 + kk
                v = zero
                if gk < kc_total:
                    iy = iy0[l] + tap_dy[gk]
                    ix = ix0[l] + tap_dx[gk]
                    if iy >= 0 and iy < H and ix >= 0 and ix < W:
                        v = acc(xf[xbase + tap_off[gk] + iy0[l] * W + ix0[l]])
                Bs[kk, e % BN] = v
            cuda.syncthreads()
            fma(As, Bs, accr, af, bf, tx, ty)
            cuda.syncthreads()
        # epilogue: + bias, activation, store (coalesced over tx: consecutive pixels)
        for j in range(TN):
            gp = n0 + tx + j * NTX
            if gp < P:
                oy = gp // OW
                ox = gp - oy * OW
                for i in range(TM):
                    gm = m0 + ty + i * NTY
                    if gm < cout_g:
                        v = accr[i, j]
                        if has_bias:
                            v += acc(bias[wrow + gm])
                        out[img, wrow + gm, oy, ox] = act(v, code)

    return conv_igemm


def tap_tables(cin_g, kh, kw, dh, dw, H, W):
    """(tap_off, tap_dy, tap_dx) int32 host tables of conv_igemm for one geometry: row k of
    the im2col matrix reads channel ci, tap (ky, kx) of the image."""
    k = np.arange(cin_g * kh * kw, dtype=np.int64)
    ci, r = np.divmod(k, kh * kw)
    ky, kx = np.divmod(r, kw)
    off = ci * H * W + ky * dh * W + kx * dw
    if off.size and off.max() >= 2**31:
        raise ValueError("conv2d: an image of more than 2^31 elements per group")
    return off.astype(np.int32), (ky * dh).astype(np.int32), (kx * dw).astype(np.int32)


@lru_cache(maxsize=None)
def depthwise_kernel(acc_np):
    acc, _ = acc_of(acc_np)
    act = act_fn(acc_np)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def depthwise(x, w, bias, out, sh, sw, ph, pw, dh, dw, code, has_bias):
        # grid: blocks_per_plane blocks for each output plane (n, co), folded into x
        C, H, W = x.shape[1], x.shape[2], x.shape[3]
        cout, KH, KW = w.shape[0], w.shape[2], w.shape[3]
        OH, OW = out.shape[2], out.shape[3]
        mult = cout // C
        per = OH * OW
        bpp = (per + cuda.blockDim.x - 1) // cuda.blockDim.x
        plane = cuda.blockIdx.x // bpp
        idx = (cuda.blockIdx.x - plane * bpp) * cuda.blockDim.x + cuda.threadIdx.x
        if idx >= per:
            return
        img = plane // cout
        co = plane - img * cout
        ci = co // mult
        oy = idx // OW
        ox = idx - oy * OW
        s = acc(bias[co]) if has_bias else acc(0.0)
        for ky in range(KH):
            iy = oy * sh - ph + ky * dh
            if iy >= 0 and iy < H:
                for kx in range(KW):
                    ix = ox * sw - pw + kx * dw
                    if ix >= 0 and ix < W:
                        s += acc(w[co, 0, ky, kx]) * acc(x[img, ci, iy, ix])
        out[img, co, oy, ox] = act(s, code)

    return depthwise


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _igemm_args(dt):
    i32, i64 = types.int32, types.int64
    return (arr(dt, 1), i64, i64, i64, arr(dt, 2), arr(i32, 1), arr(i32, 1), arr(i32, 1), arr(dt, 1), arr(dt, 4),
            i64, i64, i64, i64, i64, i64, types.boolean)


def _dw_args(dt):
    i64 = types.int64
    return (arr(dt, 4), arr(dt, 4), arr(dt, 1), arr(dt, 4)) + (i64,) * 7 + (types.boolean,)


PTX = [
    PtxBuild(f"conv.igemm_{tile}", "conv", (lambda tile: lambda dt: conv_kernel(acc_np(dt), tile))(tile), _igemm_args,
             threads=gemm_threads(tile), dtypes=gemm_tile_dtypes(tile))
    for tile in CONFIGS
] + [PtxBuild("conv.depthwise", "conv", lambda dt: depthwise_kernel(acc_np(dt)), _dw_args,
              threads=ELEMENTWISE_THREADS)]
