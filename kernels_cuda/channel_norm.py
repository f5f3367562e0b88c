"""batch_norm (inference) and group_norm on the GPU, the activation fused (a runtime code,
kernels_common.activation.ACT_*, the device function of kernels_cuda/activation.py).

x, out are seen as 2-D C-contiguous arrays; float16 / float32 inputs compute in float32,
float64 in float64.  w, b: (C,), a 1-element dummy when absent (flagged by has_w / has_b).

- batch_norm.planes: x (N*C planes, S), mean / var (C,).  2-D blocks (tx, ty): threadIdx.y
  picks one of ty planes, threadIdx.x runs along the plane (tx a power of two near S, so a
  warp reads consecutive addresses whether planes are long or a single element: BatchNorm1d
  on (N, C) has tx = 1 and a warp covers 32 consecutive planes).  grid.x strides over
  planes, grid.y over the plane's elements.  A thread folds its plane's statistics once,
  scale = weight / sqrt(var + eps), shift = bias - mean * scale (a negative var + eps gives
  NaN, as PyTorch), then streams x * scale + shift through the activation.  The channel
  p % C is found once per thread and advanced by the grid stride with an add and a compare
  (no 64-bit division per plane or element).
- group_norm.block_rows: x (N*G rows of L = (C/G) * S), one block per (sample, group) row,
  grid-stride over rows; the shifted, corrected two-pass statistics of kernels_cuda/norm.py
  (s = sum(x - x[0]) gives m0 = x[0] + s / L, then sd = sum(x - m0) and q = sum((x - m0)^2)
  give mc = sd / L and var = q / L - mc^2: a constant group is exactly bias, large offsets
  keep their precision), reduced with block_sum / block_sum2; the output pass reads x again
  (from L2) and writes act(((x - m0) - mc) * rstd * w[c] + b[c]), its channel advanced with
  adds and compares from each thread's first (channel, position) (no division per element).
"""
import math
from functools import lru_cache

import numpy as np
from numba import cuda, types

from ._jit import BLOCK_ROWS_MAX_THREADS, ELEMENTWISE_THREADS, PtxBuild, acc_np, acc_of, arr, kernel
from .activation import act_fn
from .primitives import block_sum, block_sum2


@lru_cache(maxsize=None)
def batch_norm_kernel(acc_np):
    """kernel(x, mean, var, w, b, eps, out, has_w, has_b, code) for accumulation type acc_np."""
    acc, _ = acc_of(acc_np)
    act = act_fn(acc_np)
    zero, one, nan = acc_np(0.0), acc_np(1.0), acc_np(np.nan)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def batch_norm_planes(x, mean, var, w, b, eps, out, has_w, has_b, code):
        planes, s = x.shape
        nc = mean.shape[0]
        ty = cuda.blockDim.y
        tx = cuda.blockDim.x
        p = cuda.blockIdx.x * ty + cuda.threadIdx.y
        pstep = cuda.gridDim.x * ty
        c = p % nc          # once per thread; then advanced by cstep (< nc) per plane step
        cstep = pstep % nc
        s0 = cuda.blockIdx.y * tx + cuda.threadIdx.x
        sstep = cuda.gridDim.y * tx
        epsa = acc(eps)
        while p < planes:
            if s0 < s:
                v = acc(var[c]) + epsa
                # NaN for a negative var + eps (and NaN var) without sqrt of a negative,
                # which the simulator's Python math rejects
                scale = one / math.sqrt(v) if v >= zero else nan
                if has_w:
                    scale *= acc(w[c])
                shift = -acc(mean[c]) * scale
                if has_b:
                    shift += acc(b[c])
                j = s0
                while j < s:
                    out[p, j] = act(acc(x[p, j]) * scale + shift, code)
                    j += sstep
            p += pstep
            c += cstep
            if c >= nc:
                c -= nc

    return batch_norm_planes


@lru_cache(maxsize=None)
def group_norm_kernel(acc_np):
    """kernel(x, w, b, eps, out, groups, cg, s, has_w, has_b, code): x, out (N*G, cg*s)."""
    acc, _ = acc_of(acc_np)
    act = act_fn(acc_np)
    zero, one = acc_np(0.0), acc_np(1.0)

    @kernel(launch_bounds=(BLOCK_ROWS_MAX_THREADS, 1))
    def group_norm_rows(x, w, b, eps, out, groups, cg, s, has_w, has_b, code):
        rows, d = x.shape
        tid = cuda.threadIdx.x
        step = cuda.blockDim.x
        scratch = cuda.shared.array(32, acc)
        scratch2 = cuda.shared.array(32, acc)
        inv_d = one / acc(d)
        epsa = acc(eps)
        # (channel in the group, position in the plane) of element tid and of the block
        # stride: the output pass advances them with adds and compares
        k0 = tid // s
        p0 = tid - k0 * s
        kstep = step // s
        pstep = step - kstep * s
        row = cuda.blockIdx.x
        while row < rows:  # block-uniform grid-stride loop
            x0 = acc(x[row, 0])
            s1 = zero
            for j in range(tid, d, step):
                s1 += acc(x[row, j]) - x0
            s1 = block_sum(s1, scratch, zero)
            m0 = x0 + s1 * inv_d
            sd = zero
            q = zero
            for j in range(tid, d, step):
                dv = acc(x[row, j]) - m0
                sd += dv
                q += dv * dv
            sd, q = block_sum2(sd, q, scratch, scratch2, zero)
            mc = sd * inv_d
            rstd = one / math.sqrt(max(q * inv_d - mc * mc, zero) + epsa)
            j = tid
            k = k0
            pos = p0
            base = (row % groups) * cg  # first channel of the row's group
            while j < d:
                y = ((acc(x[row, j]) - m0) - mc) * rstd
                if has_w:
                    y *= acc(w[base + k])
                if has_b:
                    y += acc(b[base + k])
                out[row, j] = act(y, code)
                j += step
                k += kstep
                pos += pstep
                if pos >= s:
                    pos -= s
                    k += 1
            row += cuda.gridDim.x

    return group_norm_rows


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _bn_args(dt):
    return (arr(dt, 2), arr(dt, 1), arr(dt, 1), arr(dt, 1), arr(dt, 1), types.float64, arr(dt, 2),
            types.boolean, types.boolean, types.int64)


def _gn_args(dt):
    return (arr(dt, 2), arr(dt, 1), arr(dt, 1), types.float64, arr(dt, 2), types.int64, types.int64, types.int64,
            types.boolean, types.boolean, types.int64)


PTX = [
    PtxBuild("batch_norm.planes", "channel_norm", lambda dt: batch_norm_kernel(acc_np(dt)), _bn_args,
             threads=ELEMENTWISE_THREADS),
    PtxBuild("group_norm.block_rows", "channel_norm", lambda dt: group_norm_kernel(acc_np(dt)), _gn_args,
             threads=BLOCK_ROWS_MAX_THREADS),
]
