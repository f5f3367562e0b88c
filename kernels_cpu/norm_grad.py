"""Backward of layer_norm and rms_norm over the last dim of C-contiguous 2-D arrays (rows x D).

The backward needs only the tensor that was normalized (x, or h = x + residual when the
forward fused a residual): each row's statistics are recomputed here, as the
forward computes them (kernels_cpu/norm.py: the shifted, corrected two-pass mean and
variance for layer_norm, the sum of squares for rms_norm, accumulated in the input's
dtype), so a training step saves O(1) state per norm instead of mean / rstd vectors.
The row is 3 KiB at D = 768: the recomputation reads it from L1/L2, not DRAM.

With xhat = (x - mean) * rstd (layer_norm) or x * rstd (rms_norm) and g = grad_out * w:
    layer_norm  dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    rms_norm    dx = rstd * (g - xhat * mean(g * xhat))
    dweight = sum over rows of grad_out * xhat,   dbias = sum over rows of grad_out,
plus grad_residual (the gradient reaching h through the forward's second output) added
to dx in the same pass.

Determinism.  dweight / dbias are sums over rows.  The rows are cut into blocks of
rows_per_block(n, D) rows, a number fixed by the shape alone (never the thread count): each block
sums its rows into its own row of a (n_blocks, D) scratch (in the dtype, rows in order),
then reduce_blocks adds the block rows in block order (float64 accumulator, rounded once).
Which thread runs a block changes nothing, so every run, every thread count and the
serial and parallel kernels give the same bits: both call the one compiled block function
by address (layer_norm_grad_block / rms_norm_grad_block, parallel.call_address).  As a
plain callee it was linked into each driver and optimized again there, and which copy ran
depended on whether the driver was compiled in the process or loaded from numba's cache:
a cached serial driver and a freshly compiled parallel one differed in the last bit of
2.6% of dx at (700, 768) float32 (2026-12-02; tests/test_norm_grad.py's determinism
test, run after tests/test_autograd.py had filled an empty cache).
"""
import math

import numpy as np
from numba import njit, prange

from .approx import JIT, JIT_BY_ADDRESS, bits_to_float, float_to_bits, fma, like
from . import team
from .parallel import (blocks_worker, c_array_at, call_address, claim_address, keep_alive, launch,
                       like_dtype, num_threads, row_block, row_buffer, row_of, run_dynamic,
                       worker_address)

# Row blocks: at most BLOCK_ELEMENTS elements, and at least MIN_BLOCKS blocks when there are
# that many rows.  Both depend on the shape only, never on the thread count (see the module
# doc).  Large blocks mean fewer partial rows to zero, accumulate and reduce; measured on
# layer_norm_backward (4096, 768) float32, 2 threads, medians of 15 interleaved rounds
# (2026-11-25, the 2 cores shared with other jobs, load average ~8): 2^12 / 2^13 / 2^14 /
# 2^15 / 2^16 elements per block 11.7 / 10.9 / 10.2 / 9.5 / 9.5 ms; rms_norm_backward
# (512, 4096): 7.5 / 5.4 / 4.6 / 4.4 / 4.0 ms.  MIN_BLOCKS keeps smaller calls splittable
# between threads (as parallel.TASKS_PER_THREAD does for the forwards): at 2^16 alone,
# BERT-base's (128, 768) would be 2 blocks of 85 and 43 rows.
BLOCK_ELEMENTS = 1 << 16
MIN_BLOCKS = 8


@njit(inline="always")
def rows_per_block(n, d):
    """Rows per block for n rows of d elements: a function of the shape only."""
    by_size = max(1, BLOCK_ELEMENTS // max(d, 1))
    return max(1, min(by_size, -(-n // MIN_BLOCKS)))




@njit(inline="always")
def _reduce_parts(p, sums):
    """sums[k] = the block rows of p[k] added in block order (reduce_blocks), each part."""
    for k in range(sums.shape[0]):
        reduce_blocks(p[k], sums[k])


@njit(inline="always")
def layer_norm_grad_blocks(go, x, w, gr, eps, dx, pw, pb, has_gr, rpb, blo, bhi):
    """Blocks blo..bhi-1 (rows [k * rpb, (k + 1) * rpb)): dx rows and the blocks' partial
    sums pw[k] = sum grad_out * xhat, pb[k] = sum grad_out.  Per row, the forward's
    statistics (kernels_cpu/norm.py layer_norm_rows) and then:
      pass 2 also sums gs = sum(g) and gd = sum(g * (x - m0)), so that with
      mc = sd / D the needed means are mean(g) = gs / D and
      mean(g * xhat) = rstd * (gd - mc * gs) / D  (sum g * (x - m0 - mc) = gd - mc * gs);
      it only sums: a loop that both sums and stores gives bits that depend on where the
      arrays lie (tests/ir_checks.py);
      pass 3 forms xhat = (x - m0 - mc) * rstd as fma(x - m0, rstd, -mc * rstd), the dx
      row and the block's partial rows.  llvm.fma is opaque to fastmath reassociation,
      which could otherwise fold m0 + mc into one rounded mean.  (x - m0 went through dx
      before, written by a pass of its own and read back in pass 3: the fma saves that
      store and load per element; layer_norm_grad_serial 512x768 float32, old / new
      processes alternating, medians of 11 x 300 calls, Zen 4, 2026-12-05: 145-164 ->
      119-136 us, 2 threads 78-90 -> 66-73; no change at 128x768.)"""
    n, d = x.shape
    inv_d = like(eps, 1.0 / d)
    zero = like(eps, 0.0)
    one = like(eps, 1.0)
    for k in range(blo, bhi):
        pwr = row_of(pw, k)
        pbr = row_of(pb, k)
        for j in range(d):
            pwr[j] = zero
            pbr[j] = zero
        for i in range(k * rpb, min(n, (k + 1) * rpb)):
            xr = row_of(x, i)
            gor = row_of(go, i)
            dxr = row_of(dx, i)
            x0 = xr[0]
            s = zero
            for j in range(d):
                s += xr[j] - x0
            m0 = x0 + s * inv_d
            sd = zero
            q = zero
            gs = zero
            gd = zero
            for j in range(d):  # no store here: tests/ir_checks.py
                c = xr[j] - m0
                g = gor[j] * w[j]
                sd += c
                q += c * c
                gs += g
                gd += g * c
            mc = sd * inv_d
            rstd = one / math.sqrt(max(q * inv_d - mc * mc, zero) + eps)
            a = gs * inv_d
            b = rstd * (gd - mc * gs) * inv_d
            if d == 1:
                # one element: the output is the bias whatever x, so dx is exactly 0 (+
                # grad_residual); rstd = 0 gives that (xhat is 0 either way, NaN stays NaN).
                # The formula would give rstd * fma(grad_out, w, -mean(g)): fastmath
                # contracts g - mean(g), measured 2.5e-6 * rstd instead of 0.
                a = zero
                b = zero
                rstd = zero
            nmr = -mc * rstd
            if has_gr:
                grr = row_of(gr, i)
                for j in range(d):
                    xh = fma(xr[j] - m0, rstd, nmr)
                    gj = gor[j]
                    pwr[j] += gj * xh
                    pbr[j] += gj
                    dxr[j] = rstd * (gj * w[j] - a - xh * b) + grr[j]
            else:
                for j in range(d):
                    xh = fma(xr[j] - m0, rstd, nmr)
                    gj = gor[j]
                    pwr[j] += gj * xh
                    pbr[j] += gj
                    dxr[j] = rstd * (gj * w[j] - a - xh * b)


@njit(inline="always")
def rms_norm_grad_blocks(go, x, w, gr, eps, dx, pw, has_gr, rpb, blo, bhi):
    """As layer_norm_grad_blocks for rms_norm: one pass sums q = sum(x^2) and
    gx = sum(g * x) (mean(g * xhat) = rstd * gx / D), the second writes dx and pw.
    dx is formed from xhat, not as rstd * g - x * rstd^3 * gx / D: rstd^3 overflows for a
    zero row under a tiny eps (rstd = 1e15 at eps = 1e-30), where xhat keeps it finite."""
    n, d = x.shape
    inv_d = like(eps, 1.0 / d)
    zero = like(eps, 0.0)
    one = like(eps, 1.0)
    for k in range(blo, bhi):
        pwr = row_of(pw, k)
        for j in range(d):
            pwr[j] = zero
        for i in range(k * rpb, min(n, (k + 1) * rpb)):
            xr = row_of(x, i)
            gor = row_of(go, i)
            dxr = row_of(dx, i)
            q = zero
            gx = zero
            for j in range(d):
                v = xr[j]
                q += v * v
                gx += gor[j] * w[j] * v
            rstd = one / math.sqrt(q * inv_d + eps)
            m = rstd * gx * inv_d
            if has_gr:
                grr = row_of(gr, i)
                for j in range(d):
                    xh = xr[j] * rstd
                    gj = gor[j]
                    pwr[j] += gj * xh
                    dxr[j] = rstd * (gj * w[j] - xh * m) + grr[j]
            else:
                for j in range(d):
                    xh = xr[j] * rstd
                    gj = gor[j]
                    pwr[j] += gj * xh
                    dxr[j] = rstd * (gj * w[j] - xh * m)


@njit(inline="always")
def reduce_blocks(p, out):
    """out[j] = sum over k of p[k, j], k in order, in float64, rounded once to out's dtype
    (p has at least one row).  Inlined into the drivers, as rows_per_block: compiled as
    functions of their own they cost layer_norm_backward's cold first call 0.3 s more."""
    nb, d = p.shape
    acc = np.empty(d, np.float64)
    first = row_of(p, 0)
    for j in range(d):
        acc[j] = first[j]
    for k in range(1, nb):
        pr = row_of(p, k)
        for j in range(d):
            acc[j] += pr[j]
    for j in range(d):
        out[j] = acc[j]


# ---- the block functions, called by address --------------------------------------------

# Their argument block (int64): addresses of grad_out, x, w, grad_residual, dx and the
# partial sums (pb: layer_norm only), rows, row length, blocks, eps (float64 bits), whether
# there is a grad_residual, rows per block.
(B_GO, B_X, B_W, B_GR, B_DX, B_PW, B_PB, B_N, B_D, B_NB, B_EPS, B_HAS_GR, B_RPB) = range(13)
B_COUNT = 13


@njit(inline="always")
def _block_params(go, x, w, gr, eps, dx, pw, pb, has_gr, rpb):
    """The argument block of a call (pb: pw again for rms_norm)."""
    p = np.empty(B_COUNT, np.int64)
    p[B_GO], p[B_X], p[B_W], p[B_GR] = go.ctypes.data, x.ctypes.data, w.ctypes.data, gr.ctypes.data
    p[B_DX], p[B_PW], p[B_PB] = dx.ctypes.data, pw.ctypes.data, pb.ctypes.data
    p[B_N], p[B_D], p[B_NB] = x.shape[0], x.shape[1], pw.shape[0]
    p[B_EPS] = float_to_bits(np.float64(eps))
    p[B_HAS_GR], p[B_RPB] = has_gr, rpb
    return p


@njit(inline="always")
def _setup(go, x, w, gr, eps, dx, sums, has_gr):
    """A driver's call: (the (parts, n_blocks, D) scratch of per-block partial sums, parts =
    sums' rows, and the argument block p of the block function, whose pw / pb are its
    first and last part)."""
    n, d = x.shape
    rpb = rows_per_block(n, d)
    parts = np.empty((sums.shape[0], (n + rpb - 1) // rpb, d), x.dtype)
    return parts, _block_params(go, x, w, gr, eps, dx, parts[0], parts[parts.shape[0] - 1], has_gr, rpb)


@njit(inline="always")
def _block_views(params, is64):
    p = c_array_at(params, np.int64(0), (B_COUNT,))
    z = like_dtype(is64)
    n, d, nb = p[B_N], p[B_D], p[B_NB]
    return (c_array_at(p[B_GO], z, (n, d)), c_array_at(p[B_X], z, (n, d)), c_array_at(p[B_W], z, (d,)),
            c_array_at(p[B_GR], z, (n, d)), like(z, bits_to_float(p[B_EPS])), c_array_at(p[B_DX], z, (n, d)),
            c_array_at(p[B_PW], z, (nb, d)), c_array_at(p[B_PB], z, (nb, d)), p[B_HAS_GR] != 0, p[B_RPB])


@njit(**JIT_BY_ADDRESS)
def layer_norm_grad_block(k, params, is64):
    """Block k of a layer_norm backward (layer_norm_grad_blocks) from the argument block."""
    go, x, w, gr, eps, dx, pw, pb, has_gr, rpb = _block_views(params, is64)
    layer_norm_grad_blocks(go, x, w, gr, eps, dx, pw, pb, has_gr, rpb, k, k + 1)


@njit(**JIT_BY_ADDRESS)
def rms_norm_grad_block(k, params, is64):
    """Block k of an rms_norm backward (rms_norm_grad_blocks) from the argument block."""
    go, x, w, gr, eps, dx, pw, _, has_gr, rpb = _block_views(params, is64)
    rms_norm_grad_blocks(go, x, w, gr, eps, dx, pw, has_gr, rpb, k, k + 1)


def _address(block_fn, x):
    return worker_address(block_fn, (bool(x.dtype == np.float64),))


# ---- serial and parallel drivers: the same block function, blocks in a loop or over threads ----
#
# Each driver takes sums, a (parts, D) output: row 0 dweight, row 1 dbias (layer_norm, parts
# 2) or dweight alone (rms_norm, parts 1).  It makes the per-block partials itself and adds
# them into sums before it returns: one call from Python, where dispatch used to size and
# allocate the partials and reduce each into a result of its own.  Inside an autograd step
# (512x768, Zen 4, 2026-12-05) those steps took 7-8 of the 20 us that layer_norm_backward
# spent around its kernel (sizing 1-2, the partials 1.4, the two reductions 3.1, one more
# result 1.5); through dispatch at 4x8, 11.9 -> 8.6 us a call (old / new processes
# alternating, two of three pairs; the third new run fell in a noisy phase).

@njit(**JIT)
def _grad_serial(go, x, w, gr, eps, dx, sums, has_gr, fn):
    parts, p = _setup(go, x, w, gr, eps, dx, sums, has_gr)
    addr = p.ctypes.data
    for k in range(parts.shape[1]):
        call_address(fn, (k, addr))
    keep_alive((p,))
    _reduce_parts(parts, sums)


@njit(parallel=True, **JIT)
def _grad_parallel(go, x, w, gr, eps, dx, sums, has_gr, fn, tasks):
    parts, p = _setup(go, x, w, gr, eps, dx, sums, has_gr)
    addr = p.ctypes.data
    for k in prange(tasks):
        call_address(fn, (k, addr))
    keep_alive((p,))
    _reduce_parts(parts, sums)


@njit(**JIT)
def _grad_team(go, x, w, gr, eps, dx, sums, has_gr, fn, worker, nw, claim_fn, buf, team_run, team_state):
    """The blocks on the thread team, each thread claiming ranges of them (parallel.
    blocks_worker), then the partials added into sums; False (sums untouched) when the team
    could not take them (off, or busy)."""
    parts, p = _setup(go, x, w, gr, eps, dx, sums, has_gr)
    workers = row_block(buf, parts.shape[1], 0, 0.0, 0, 0, 0, 1, nw, claim_fn)
    buf[0], buf[1] = fn, p.ctypes.data
    rest = launch(worker, buf.ctypes.data, workers, team_run, team_state)
    keep_alive((p,))
    if rest != 0:
        return False
    _reduce_parts(parts, sums)
    return True


def _grad(go, x, w, gr, eps, dx, sums, has_gr, fn):
    nw = num_threads()
    if not _grad_team(go, x, w, gr, eps, dx, sums, has_gr, fn, worker_address(blocks_worker, ()), nw,
                      claim_address(), row_buffer(nw), *team.entry()):
        n, d = x.shape
        rpb = rows_per_block.py_func(n, d)  # the plain function: nothing to compile for this rare path
        run_dynamic(_grad_parallel, (n + rpb - 1) // rpb, go, x, w, gr, eps, dx, sums, has_gr, fn)


def layer_norm_grad_serial(go, x, w, gr, eps, dx, sums, has_gr):
    """dx, and sums (2, D): dweight and dbias (module doc), the blocks in order on this
    thread."""
    _grad_serial(go, x, w, gr, eps, dx, sums, has_gr, _address(layer_norm_grad_block, x))


def layer_norm_grad_parallel(go, x, w, gr, eps, dx, sums, has_gr):
    """layer_norm_grad_serial's result (bit for bit): ranges of blocks claimed by the team's
    threads (parallel.blocks_worker); numba's threads when the team is busy."""
    _grad(go, x, w, gr, eps, dx, sums, has_gr, _address(layer_norm_grad_block, x))


def rms_norm_grad_serial(go, x, w, gr, eps, dx, sums, has_gr):
    """dx, and sums (1, D): dweight (module doc), the blocks in order on this thread."""
    _grad_serial(go, x, w, gr, eps, dx, sums, has_gr, _address(rms_norm_grad_block, x))


def rms_norm_grad_parallel(go, x, w, gr, eps, dx, sums, has_gr):
    """rms_norm_grad_serial's result (bit for bit), as layer_norm_grad_parallel."""
    _grad(go, x, w, gr, eps, dx, sums, has_gr, _address(rms_norm_grad_block, x))
