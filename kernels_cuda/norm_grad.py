"""Backward of layer_norm / rms_norm over the last dimension (see kernels_cpu/norm_grad.py
for the formulas and dispatch/ops/norm_grad.py for the arguments).

Two kernels, deterministic (no atomics; every sum has a fixed order for a given shape):
- grad_rows: one block of W warps per group of ROWS_PER_BLOCK rows.  Phase 1, one warp per
  row (rows r = warp, warp + W, ... of the group): the row's statistics, recomputed from x
  exactly as kernels_cuda/norm.py does (layer_norm: shifted mean m0, the corrected
  two-pass remainder mc and rstd; rms_norm: rstd from the sum of squares), the sums of
  g = grad_out * w and g * (x - m0) (g * x for rms_norm) by warp shuffles
  (primitives.warp_sum2), then dx written (+ grad_residual).  Lane 0 keeps the row's
  (m0, mc, rstd) in shared memory.  Phase 2, after a barrier, one thread per column
  (coalesced): the group's partial dweight (sum of grad_out * xhat over its rows, in row
  order) and dbias (sum of grad_out) written to row `block` of the (n_blocks, D) partials,
  in the accumulation type.  Its rows were just read by phase 1: L1/L2 hits.
- reduce_blocks: one thread per column adds the partial rows in block order in float64
  and rounds once to the output's dtype.
Accumulation: x's dtype for float32 / float64, float32 for float16 (kernels_common).
"""
import math
from functools import lru_cache

from numba import cuda, float64, types

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, WARP_ROWS_THREADS

from ._jit import PtxBuild, acc_np, acc_of, acc_type, arr, kernel
from .primitives import warp_sum, warp_sum2

# Rows per block: 2 rows per warp of a 4-warp block.  Not measured on a GPU (none was lent
# when this was written): small enough that a (512, 4096) Llama prefill still makes 64
# blocks, large enough that the partials (n_blocks x D) are 1/8 of x's size.
ROWS_PER_BLOCK = 8


@lru_cache(maxsize=None)
def make(rms, acc_np):
    """grad_rows for rms (True: rms_norm) and the accumulation type."""
    acc, _ = acc_of(acc_np)
    zero, one = acc_np(0.0), acc_np(1.0)

    # launch bounds: at least 4 resident blocks of 128 threads (up to 128 registers): at 8
    # (64 registers) ptxas spilled 8-192 bytes (sm_80/87/90, layer_norm all dtypes, rms_norm
    # float64); at 4 none spill (python -m bench.ptx).
    @kernel(launch_bounds=(WARP_ROWS_THREADS, 4))
    def grad_rows(go, x, w, gr, eps, dx, pw, pb, has_w, has_gr):
        rows, d = x.shape
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        nwarps = cuda.blockDim.x >> 5
        base = cuda.blockIdx.x * ROWS_PER_BLOCK
        nrows = min(ROWS_PER_BLOCK, rows - base)
        s_m0 = cuda.shared.array(ROWS_PER_BLOCK, acc)
        s_mc = cuda.shared.array(ROWS_PER_BLOCK, acc)
        s_rstd = cuda.shared.array(ROWS_PER_BLOCK, acc)
        inv_d = one / acc(d)
        epsa = acc(eps)
        # phase 1: one warp per row; the loop bound is warp-uniform (shuffles need all lanes)
        for r in range(warp, nrows, nwarps):
            row = base + r
            m0 = zero
            mc = zero
            if rms:
                q = zero
                gx = zero
                for j in range(lane, d, 32):
                    v = acc(x[row, j])
                    g = acc(go[row, j])
                    if has_w:
                        g *= acc(w[j])
                    q += v * v
                    gx += g * v
                q, gx = warp_sum2(q, gx)
                rstd = one / math.sqrt(q * inv_d + epsa)
                a = zero
                b = rstd * gx * inv_d
            else:
                x0 = acc(x[row, 0])
                s = zero
                for j in range(lane, d, 32):
                    s += acc(x[row, j]) - x0
                s = warp_sum(s)
                m0 = x0 + s * inv_d
                sd = zero
                q = zero
                gs = zero
                gd = zero
                for j in range(lane, d, 32):
                    c = acc(x[row, j]) - m0
                    g = acc(go[row, j])
                    if has_w:
                        g *= acc(w[j])
                    sd += c
                    q += c * c
                    gs += g
                    gd += g * c
                sd, q = warp_sum2(sd, q)
                gs, gd = warp_sum2(gs, gd)
                mc = sd * inv_d
                rstd = one / math.sqrt(max(q * inv_d - mc * mc, zero) + epsa)
                a = gs * inv_d
                b = rstd * (gd - mc * gs) * inv_d
            for j in range(lane, d, 32):
                xh = ((acc(x[row, j]) - m0) - mc) * rstd
                g = acc(go[row, j])
                if has_w:
                    g *= acc(w[j])
                v = rstd * (g - a - xh * b)
                if has_gr:
                    v += acc(gr[row, j])
                dx[row, j] = v
            if lane == 0:
                s_m0[r] = m0
                s_mc[r] = mc
                s_rstd[r] = rstd
        cuda.syncthreads()
        # phase 2: this group's partial dweight / dbias, one thread per column, rows in order
        blk = cuda.blockIdx.x
        for j in range(cuda.threadIdx.x, d, cuda.blockDim.x):
            sw = zero
            sb = zero
            for r in range(nrows):
                g = acc(go[base + r, j])
                sw += g * (((acc(x[base + r, j]) - s_m0[r]) - s_mc[r]) * s_rstd[r])
                sb += g
            pw[blk, j] = sw
            if not rms:
                pb[blk, j] = sb

    return grad_rows


@lru_cache(maxsize=None)
def reduce_kernel():
    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 1))
    def reduce_blocks(p, out):
        """out[j] = sum over k of p[k, j], k in order, in float64."""
        j = cuda.grid(1)
        if j < out.shape[0]:
            s = float64(0.0)
            for k in range(p.shape[0]):
                s += float64(p[k, j])
            out[j] = s

    return reduce_blocks


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _grad_args(dt):
    a = acc_type(dt)
    return (arr(dt, 2), arr(dt, 2), arr(dt, 1), arr(dt, 2), types.float64, arr(dt, 2), arr(a, 2), arr(a, 2),
            types.boolean, types.boolean)


def _reduce_args(dt):
    return (arr(acc_type(dt), 2), arr(dt, 1))


PTX = [
    PtxBuild(f"{name}_backward.grad_rows", "norm_grad", (lambda rms: lambda dt: make(rms, acc_np(dt)))(rms),
             _grad_args, threads=WARP_ROWS_THREADS)
    for name, rms in (("layer_norm", False), ("rms_norm", True))
] + [PtxBuild("norm_backward.reduce_blocks", "norm_grad", lambda dt: reduce_kernel(), _reduce_args,
              threads=ELEMENTWISE_THREADS)]
