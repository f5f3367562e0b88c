"""The CUDA-core (SIMT) register tile shared by the float32 / float64 GEMM-shaped kernels:
gemm.gemm_kernel (gemm_tiled), conv.conv_kernel (conv_igemm), linalg_grad.gemm_grad_kernel
(gemm_grad) and moe.grouped_kernel (grouped).

A block of NT = NTX * NTY threads computes a BM x BN block of C.  Thread t = ty * NTX + tx
holds the TM x TN outputs at rows ty + i * NTY and columns tx + j * NTX (i < TM, j < TN):
strided, so that consecutive threads store consecutive columns.  Per K step of BK, the
block stages A's tile transposed as As[k][m] and B's as Bs[k][n] in shared memory (one
padding column each: the transposing stores then spread over the banks), each thread
A_LOADS and B_LOADS elements of them; after a barrier every thread runs `tile_fma`: per
k, its TM values of A's column and TN of B's row into registers, TM x TN FMAs.

How each kernel stages its tiles (plain, transposed, gathered rows, implicit-GEMM taps,
a derivative applied on the way) is its own; the geometry and the product are here, once.
The tile shapes (BM, BN, BK, TM, TN) are kernels_common.cuda_tiles.GEMM_TILES.
"""
from functools import lru_cache
from typing import NamedTuple

from kernels_common.cuda_tiles import GEMM_TILES

from ._jit import device


class Geometry(NamedTuple):
    """One GEMM_TILES entry and what follows from it (see the module docstring)."""
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    ntx: int            # threads along N
    nty: int            # threads along M
    nt: int             # threads per block
    a_loads: int        # A elements each thread stages per K step
    b_loads: int        # B elements each thread stages per K step
    as_shape: tuple     # shared As[k][m] (+1 padding column)
    bs_shape: tuple     # shared Bs[k][n] (+1 padding column)
    acc_shape: tuple    # a thread's accumulators (TM, TN)


@lru_cache(maxsize=None)
def geometry(cfg: str) -> Geometry:
    bm, bn, bk, tm, tn = GEMM_TILES[cfg]
    ntx, nty = bn // tn, bm // tm
    nt = ntx * nty
    return Geometry(bm, bn, bk, tm, tn, ntx, nty, nt, bm * bk // nt, bn * bk // nt, (bk, bm + 1), (bk, bn + 1),
                    (tm, tn))


@lru_cache(maxsize=None)
def tile_fma(cfg: str):
    """Device function fma(As, Bs, accr, af, bf, tx, ty): accr[i, j] += sum over k < BK of
    As[k, ty + i*NTY] * Bs[k, tx + j*NTX]; af (TM) and bf (TN) are the thread's local
    scratch for one k's operands.  The loops have compile-time bounds (this factory's
    constants), so they unroll and accr, af, bf stay in registers, as when each kernel
    wrote the loop itself (bench.ptx: the same registers and inner-loop SASS)."""
    g = geometry(cfg)
    BK, TM, TN, NTX, NTY = g.bk, g.tm, g.tn, g.ntx, g.nty

    @device
    def fma(As, Bs, accr, af, bf, tx, ty):
        for kk in range(BK):
            for i in range(TM):
                af[i] = As[kk, ty + i * NTY]
            for j in range(TN):
                bf[j] = Bs[kk, tx + j * NTX]
            for i in range(TM):
                for j in range(TN):
                    accr[i, j] += af[i] * bf[j]

    return fma


@lru_cache(maxsize=None)
def tile_clear(cfg: str):
    """Device function clear(accr, zero): every accumulator to zero."""
    g = geometry(cfg)
    TM, TN = g.tm, g.tn

    @device
    def clear(accr, zero):
        for i in range(TM):
            for j in range(TN):
                accr[i, j] = zero

    return clear
