"""Warp- and block-level reductions built on warp shuffles.

All are device functions inlined into the kernels.  A warp reduction is five
``shfl_xor_sync`` butterfly steps (every lane ends with the result); a block reduction
reduces each warp, passes one value per warp through a 32-slot shared scratch array and
reduces those in every warp (every thread ends with the result, no second barrier
needed to broadcast).  The block size must be a multiple of 32 and every lane must call
them (full shuffle mask).

The CUDA simulator has no warp shuffles; tests/cuda/simwarp.py emulates them lane by lane
so these functions run unchanged there.
"""
import math

from numba import cuda

from ._jit import FULL_MASK, device


@device
def warp_sum(v):
    v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
    return v


@device
def warp_max(v):
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 16))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 8))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 4))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 2))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 1))
    return v


@device
def _merge_ms(m, s, m2, s2):
    """Merge two online-softmax states (running max m, sum of exp(x - m) s)."""
    mn = max(m, m2)
    if mn == -math.inf:
        return mn, s + s2
    return mn, s * math.exp(m - mn) + s2 * math.exp(m2 - mn)


@device
def warp_max_sumexp(m, s):
    """Warp reduction of online-softmax states: (max, sum of exp(x - max))."""
    for off in (16, 8, 4, 2, 1):
        m2 = cuda.shfl_xor_sync(FULL_MASK, m, off)
        s2 = cuda.shfl_xor_sync(FULL_MASK, s, off)
        m, s = _merge_ms(m, s, m2, s2)
    return m, s


@device
def warp_sum2(a, b):
    """Two warp sums at once (mean and mean of squares for layer_norm)."""
    for off in (16, 8, 4, 2, 1):
        a += cuda.shfl_xor_sync(FULL_MASK, a, off)
        b += cuda.shfl_xor_sync(FULL_MASK, b, off)
    return a, b


@device
def block_sum(v, scratch, zero):
    """Sum of v over the block; scratch: shared array of >= 32 acc-typed slots."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    nwarps = (cuda.blockDim.x + 31) >> 5
    v = warp_sum(v)
    cuda.syncthreads()  # scratch may still be read by a previous reduction
    if lane == 0:
        scratch[warp] = v
    cuda.syncthreads()
    w = scratch[lane] if lane < nwarps else zero
    return warp_sum(w)


@device
def block_max(v, scratch, lowest):
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    nwarps = (cuda.blockDim.x + 31) >> 5
    v = warp_max(v)
    cuda.syncthreads()
    if lane == 0:
        scratch[warp] = v
    cuda.syncthreads()
    w = scratch[lane] if lane < nwarps else lowest
    return warp_max(w)


@device
def block_sum2(a, b, scratch_a, scratch_b, zero):
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    nwarps = (cuda.blockDim.x + 31) >> 5
    a, b = warp_sum2(a, b)
    cuda.syncthreads()
    if lane == 0:
        scratch_a[warp] = a
        scratch_b[warp] = b
    cuda.syncthreads()
    wa = scratch_a[lane] if lane < nwarps else zero
    wb = scratch_b[lane] if lane < nwarps else zero
    return warp_sum2(wa, wb)


@device
def block_max_sumexp(m, s, scratch_m, scratch_s, lowest, zero):
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    nwarps = (cuda.blockDim.x + 31) >> 5
    m, s = warp_max_sumexp(m, s)
    cuda.syncthreads()
    if lane == 0:
        scratch_m[warp] = m
        scratch_s[warp] = s
    cuda.syncthreads()
    wm = scratch_m[lane] if lane < nwarps else lowest
    ws = scratch_s[lane] if lane < nwarps else zero
    return warp_max_sumexp(wm, ws)
