"""Backward of matmul and linear with the fused bias + activation epilogue (issue #13).

    linear_backward(grad_out, x, weight, pre=None, *, activation=None, has_bias=False)
        -> (dx, dweight, dbias)
        for y = act(x @ weight.T + bias): grad_out (..., N), x (..., K), weight (N, K), and
        with an activation the pre-activation pre = x @ weight.T + bias (..., N) that the
        forward kept.  g' = grad_out * act'(pre); dx = g' @ weight (..., K),
        dweight = g'^T @ x (N, K) summed over all leading dims of x, dbias = the column
        sums of g' (N,) when has_bias, else None.
    matmul_backward(grad_out, a, b, pre=None, *, activation=None, has_bias=False)
        -> (da, db, dbias)
        for y = act(a @ b + bias), a (..., M, K), b (..., K, N) with numpy batch
        broadcasting: grad_out and pre (batch..., M, N) of the broadcast batch; da = g' @ b^T
        and db = a^T @ g', each summed over the batch dims its operand was broadcast along
        (as PyTorch's autograd reduces them), dbias = the sums of g' over every batch and row.

Why `pre` and `has_bias` (and not the bias): act'(.) needs the pre-activation, which only
the forward had (recomputing it is a third GEMM; the output y alone determines act' only for
relu), so the differentiable forward runs the GEMM with its bias epilogue, keeps pre, and
applies the activation (dispatch.autograd); the bias's value is not needed for any gradient,
only whether there is one.  Without an activation pre is not read (may be None).
activation as the forwards' (None, "relu", "gelu", "gelu_tanh", "silu"); float32 or float64,
every array of one dtype.

The fusion (kernels_cpu/linalg_grad.py): g' is formed inside the two backward GEMMs' packing
of it (their prologue) - never stored as an (M, N) array, no elementwise pass - and dbias is
the column sums of the packed panels of the GEMM that reads g' by columns (dweight / db).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACT_NONE, ACTIVATION_CODES
from kernels_common.activation_grad import DERIVATIVE_FLOPS_PER_ELEMENT
from kernels_cpu import activation_grad as KA
from kernels_cpu.parallel import num_threads
from kernels_cpu import gemm as K
from kernels_cpu import linalg_grad as KG

from .. import validate as V
from ..registry import Call, Implementation, Op, Rule, bucket, register, register_op
from . import _arena
from ._common import HOST_COPY_NOTE, kernel_input
from .linalg import (GEMV_ROWS, SMALL_PRODUCT, WIDE_GEMM_MIN_N, WIDE_GEMM_PRODUCT, _batch_index, _gemm_blocks,
                     _panel_buffers, _zeros)

_KERNELS = ("kernels_cpu.linalg_grad", "kernels_cpu.gemm", "kernels_cpu.activation_grad", "kernels_cpu.approx",
            "kernels_cpu.parallel")


def _ex(m, n, k, batch=()):
    return {"grad_out": batch + (m, n), "pre": batch + (m, n)}


EXAMPLE_SHAPES = {
    "linear_backward": {
        "small": {**_ex(5, 19, 24), "x": (5, 24), "weight": (19, 24)},
        "large": {**_ex(64, 256, 256), "x": (64, 256), "weight": (256, 256)},
        "decode": {**_ex(1, 200, 96), "x": (1, 96), "weight": (200, 96)},
    },
    "matmul_backward": {
        "small": {**_ex(5, 19, 24, (2,)), "a": (2, 5, 24), "b": (24, 19)},
        "large": {**_ex(64, 256, 256), "a": (64, 256), "b": (256, 256)},
        "decode": {**_ex(1, 200, 96), "a": (1, 96), "b": (96, 200)},
    },
}


class GemmGradKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    batch: int          # bucket of the broadcast batch (1 for linear)
    m: int              # bucket of M (linear: the product of x's leading dims)
    n: int
    k: int
    act: int            # kernels_common.activation.ACT_*
    has_bias: bool


class GemmGradArgs(NamedTuple):
    grad_out: object    # (batch..., M, N); linear: (..., N)
    a: object           # matmul: a (..., M, K); linear: x (..., K)
    b: object           # matmul: b (..., K, N); linear: weight (N, K)
    pre: object         # like grad_out, or None without an activation
    act: int
    has_bias: bool
    b_is_nk: bool       # linear


def _common(grad_out, first_name, first, second_name, second, pre, activation, has_bias):
    V.required(grad_out=grad_out, **{first_name: first, second_name: second})
    dev = V.device_of(grad_out=grad_out, **{first_name: first, second_name: second}, pre=pre)
    dt = V.float_dtype("grad_out", grad_out)
    V.same_dtype(first_name, first, "grad_out", dt)
    V.same_dtype(second_name, second, "grad_out", dt)
    V.choice("activation", activation, list(ACTIVATION_CODES))
    code = ACTIVATION_CODES[activation]
    if pre is None and code != ACT_NONE:
        raise ValueError(f"pre (the forward's pre-activation) is required with activation={activation!r}")
    if pre is not None:
        V.same_dtype("pre", pre, "grad_out", dt)
    return dev, dt, code, V.flag("has_bias", has_bias)


def _check_grad_shapes(grad_out, pre, shape, what):
    if tuple(grad_out.shape) != tuple(shape):
        raise ValueError(f"grad_out must have the forward's output shape {tuple(shape)} ({what}), "
                         f"got {tuple(grad_out.shape)}")
    if pre is not None and tuple(pre.shape) != tuple(shape):
        raise ValueError(f"pre must have the forward's output shape {tuple(shape)} (that of grad_out), "
                         f"got {tuple(pre.shape)}")


def describe_linear_backward(grad_out, x, weight, pre=None, *, activation=None, has_bias=False):
    """Call.args = GemmGradArgs(b_is_nk True), key GemmGradKey."""
    dev, dt, code, has_bias = _common(grad_out, "x", x, "weight", weight, pre, activation, has_bias)
    V.rank("x", x, (1, 64), " (..., K)")
    V.rank("weight", weight, 2, " (N, K)")
    k = x.shape[-1]
    n, kw = weight.shape
    if kw != k:
        raise ValueError(f"weight must have K={k} columns to match x (..., {k}), got shape {tuple(weight.shape)}")
    _check_grad_shapes(grad_out, pre, tuple(x.shape[:-1]) + (n,), "x's leading dims, N")
    m = math.prod(x.shape[:-1])
    key = GemmGradKey("linear_backward", dev, dt, 1, bucket(m), bucket(n), bucket(k), code, has_bias)
    return Call(key, GemmGradArgs(grad_out, x, weight, pre if code != ACT_NONE else None, code, has_bias, True))


def describe_matmul_backward(grad_out, a, b, pre=None, *, activation=None, has_bias=False):
    """Call.args = GemmGradArgs(b_is_nk False), key GemmGradKey."""
    dev, dt, code, has_bias = _common(grad_out, "a", a, "b", b, pre, activation, has_bias)
    V.rank("a", a, (2, 64), " (..., M, K)")
    V.rank("b", b, (2, 64), " (..., K, N)")
    m, k = a.shape[-2:]
    kb, n = b.shape[-2:]
    if kb != k:
        raise ValueError(f"b must have K={k} rows to match a (..., {m}, {k}), got {kb} (b has shape {tuple(b.shape)})")
    try:
        batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise ValueError(f"batch dimensions of a {tuple(a.shape[:-2])} and b {tuple(b.shape[:-2])} do not broadcast") \
            from None
    _check_grad_shapes(grad_out, pre, batch + (m, n), "the broadcast batch, M, N")
    key = GemmGradKey("matmul_backward", dev, dt, bucket(math.prod(batch)), bucket(m), bucket(n), bucket(k), code,
                      has_bias)
    return Call(key, GemmGradArgs(grad_out, a, b, pre if code != ACT_NONE else None, code, has_bias, False))


# ---- host helpers -------------------------------------------------------------------------------

def reduce_batch(full, target_batch):
    """full (B..., R, C) summed over the batch dims that target_batch broadcasts (missing
    leading dims, and dims of size 1 where full's is larger): the gradient of a broadcast
    operand.  numpy's sum, in a fixed order (deterministic)."""
    fb = full.shape[:-2]
    lead = len(fb) - len(target_batch)
    axes = tuple(range(lead)) + tuple(lead + i for i, t in enumerate(target_batch) if t == 1 and fb[lead + i] != 1)
    if not axes:
        return full.reshape(tuple(target_batch) + full.shape[-2:])
    return full.sum(axis=axes).reshape(tuple(target_batch) + full.shape[-2:])


def _identity_index(n):
    return np.arange(n, dtype=np.int64)


def _pro_gemm(a3, transa, b3, transb, ai, bi, out3, g_side, kind, pre3, code, dbias, accumulate=False, both=False,
              rows_into=None, ahead=()):
    """out3 = op(a3) @ op(b3) on the own GEMM, the operand g_side ("a" / "b") packed by the
    linalg_grad prologue packer `kind` (None: plain packers), reading pre3 and writing dbias
    (or nothing: None); accumulate: out3 += the product instead; both: run the GEMM worker
    variant holding both A forms (gemm_parallel's both_a_forms), for a backward whose dA
    product reads g (or g') by rows while the other packs its transposed A: one worker
    compiled, not two.  Kind "rows" packs g' by rows (gemm's a_rows) into rows_into, an
    array of (batches of a3, rows rounded up to the tile's, columns) (_rows_scratch), which
    holds g' afterwards; ahead: the next GEMM's prologue kernels, compiled beside this one's
    (KG.grad_prologue)."""
    nbatch, m, n = out3.shape
    k = a3.shape[1] if transa else a3.shape[2]
    tile = K.active_tile()
    ti = K.TILE_NAMES.index(tile.name)
    dt = out3.dtype
    # Blocked as the forward's GEMM (linalg._gemm_setup): where the call packs B, the task
    # blocks are capped so that the tasks can pack their B panels themselves (gemm's
    # B_TASK_SLICE) instead of all B up front.  2 threads, medians of 5 rounds alternating
    # in one process (Xeon with AMX, 2026-12-07), ms, up front -> in the tasks:
    # linear_backward 128x4096x4096 49.5 -> 38.5 (+gelu+bias 50.9 -> 41.6), matmul_backward
    # 128x4096x4096 44.5 -> 33.3, 128x768x3072 4.83 -> 4.30; BERT-sized 128 / 512 x 768 x
    # 768 / 3072, 3168x384x1536 within +-3%.
    in_task = not K.reads_b_in_place(n, transb, tile.nr(dt), dt.itemsize) and b3.shape[0] == nbatch
    mc, nc, kc = _gemm_blocks(m, n, k, nbatch, tile.nr(dt), tile, dt.itemsize if in_task else 0)
    packer, extra = None, ()
    if kind is not None:
        packer, extra = KG.grad_prologue(kind, pre3, dbias, dt, code, ti, both, ahead)
    pack_a, pack_b = (packer, None) if g_side == "a" else (None, packer)
    a_rows = kind == "rows"
    args = K.plan_args(a3.shape[0], b3.shape[0], nbatch, m, n, k, transa, transb, dt, tile, False, mc, nc, kc, False,
                       ACT_NONE, num_threads(), pack_a, pack_b, len(extra), accumulate, both, a_rows)
    # buffers as large as the plan needs: where the tasks pack A (gemm's A_TASK_OK), the
    # workers' slices, not a copy of A (linear_cross_entropy's chunk-sized gradient); g' by
    # rows into the caller's array
    if a_rows:
        buffers = lambda na, nb: (rows_into.reshape(-1), _panel_buffers((0,), (nb,), dt)[1])  # noqa: E731
    else:
        buffers = lambda na, nb: _panel_buffers((na,), (nb,), dt)  # noqa: E731
    K.gemm_launch(args, a3, None, b3, None, out3, ai, bi, _zeros(n, dt), extra, buffers=buffers)


def _fused_needed(code, has_bias):
    return code != ACT_NONE or has_bias


def _run_linear_gemm(g, x, w, pre, code, has_bias):
    n, k = w.shape
    m = math.prod(x.shape[:-1])
    if not (m and n and k):
        return _run_blas(None, g, x, w, pre, code, has_bias, True)
    dt = g.dtype
    g3 = kernel_input(g).reshape(1, m, n)
    p3 = g3 if pre is None else kernel_input(pre).reshape(1, m, n)
    x3 = kernel_input(x).reshape(1, m, k)
    w3 = kernel_input(w).reshape(1, n, k)
    dx = _arena.empty((1, m, k), dt)
    dw = _arena.empty((1, n, k), dt)
    dbias = np.empty(n, dt) if has_bias else None
    # dx = g' @ W: g' is A read by rows (g in place, or with an activation g' packed by rows
    # by the prologue); W (N, K) is B stored (K_gemm, N_gemm)
    gp = None if code == ACT_NONE else _rows_scratch(1, m, n, dt)
    _pro_gemm(g3, False, w3, False, K_ZERO, K_ZERO, dx, "a", None if gp is None else "rows", p3, code, None,
              both=True, rows_into=gp, ahead=_next_prologue("cols_a" if has_bias else None, dt))
    # dW = g'^T @ x: g' (M, N) is A stored transposed (packed by columns, summed: dbias), x
    # is B; g' as dx's prologue left it (its first m rows: its derivative is not formed twice)
    g3 = g3 if gp is None else gp[:, :m]
    _pro_gemm(g3, True, x3, False, K_ZERO, K_ZERO, dw, "a", "cols_a" if has_bias else None, g3, ACT_NONE, dbias,
              both=True)
    return dx.reshape(tuple(x.shape[:-1]) + (k,)), dw.reshape(n, k), dbias


def _next_prologue(kind, dt):
    """grad_prologue's `ahead` for a next GEMM packing g' (already formed) with `kind`."""
    return () if kind is None else KG.prologue_kernels(kind, dt, ACT_NONE, K.active_index())


def _rows_scratch(nbatch, m, n, dt):
    """Where the "rows" prologue packs g': (nbatch, m rounded up to the tile's rows, n)."""
    mr = K.active_tile().mr
    return _arena.empty((nbatch, -(-m // mr) * mr, n), dt)


def _gprime(g, pre, code):
    """g * act'(pre) as an array (the unfused path and the degenerate shapes)."""
    if code == ACT_NONE:
        return np.asarray(g)
    gc, pc = kernel_input(g), kernel_input(pre)
    out = _arena.empty(gc.shape, gc.dtype)
    KA.unary_grad_parallel(gc.reshape(-1), pc.reshape(-1), out.reshape(-1), code)
    return out


def _run_matmul_gemm(g, a, b, pre, code, has_bias):
    m, k = a.shape[-2:]
    n = b.shape[-1]
    dt = g.dtype
    a_batch, b_batch = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    full = np.broadcast_shapes(a_batch, b_batch)
    nbatch = math.prod(full)
    if not (nbatch and m and n and k):
        return _run_blas(None, g, a, b, pre, code, has_bias, False)
    g3 = kernel_input(g).reshape(nbatch, m, n)
    p3 = g3 if pre is None else kernel_input(pre).reshape(nbatch, m, n)
    a3 = kernel_input(a).reshape(math.prod(a_batch), m, k)
    b3 = kernel_input(b).reshape(math.prod(b_batch), k, n)
    _, ai, bi = _batch_index(a_batch, b_batch)
    ident = np.arange(nbatch, dtype=np.int64)
    # da = g' @ b^T: g' is A read by rows (g in place, or with an activation g' packed by
    # rows by the prologue); b (K, N) is read as B^T stored (N_gemm, K_gemm) (transb)
    da_full = _arena.empty((nbatch, m, k), dt)
    gp = None if code == ACT_NONE else _rows_scratch(nbatch, m, n, dt)
    _pro_gemm(g3, False, b3, True, ident, bi, da_full, "a", None if gp is None else "rows", p3, code, None,
              both=True, rows_into=gp, ahead=_next_prologue("cols_b" if has_bias else None, dt))
    da = reduce_batch(da_full.reshape(full + (m, k)), a_batch)
    if gp is not None and (gp.shape[1] == m or nbatch == 1):
        g3 = p3 = gp[:, :m]  # g' as da's prologue left it: db does not form its derivative again
        code = ACT_NONE
    kind = "cols_b" if _fused_needed(code, has_bias) else None
    if not b_batch:  # b shared by every batch: one GEMM whose reduction runs over batch x rows
        db = _arena.empty((1, k, n), dt)
        dbias = np.empty(n, dt) if has_bias else None
        _pro_gemm(a3.reshape(1, nbatch * m, k), True, g3.reshape(1, nbatch * m, n), False, K_ZERO, K_ZERO, db, "b",
                  kind, p3.reshape(1, nbatch * m, n), code, dbias, both=True)
        return da, db.reshape(k, n), dbias
    # per output batch, then summed over the dims b was broadcast along; dbias per batch, summed
    db_full = _arena.empty((nbatch, k, n), dt)
    part = np.empty((nbatch, n), dt) if has_bias else None
    _pro_gemm(a3, True, g3, False, ai, ident, db_full, "b", kind, p3, code, part, both=True)
    db = reduce_batch(db_full.reshape(full + (k, n)), b_batch)
    return da, db, (part.sum(axis=0) if has_bias else None)


K_ZERO = np.zeros(1, np.int64)


def _run_gemm(params, grad_out, a, b, pre, code, has_bias, b_is_nk):
    if b_is_nk:
        return _run_linear_gemm(grad_out, a, b, pre, code, has_bias)
    return _run_matmul_gemm(grad_out, a, b, pre, code, has_bias)


def _run_blas(params, grad_out, a, b, pre, code, has_bias, b_is_nk):
    """Unfused: g' by the elementwise backward kernel (an (M, N) array), then numpy.matmul
    (OpenBLAS) twice and numpy's column sums."""
    gp = _gprime(grad_out, pre, code)
    if b_is_nk:
        n, k = b.shape
        g2, x2 = gp.reshape(-1, n), np.asarray(a).reshape(-1, k)
        dx = np.matmul(g2, b).reshape(tuple(a.shape[:-1]) + (k,))
        dw = np.matmul(g2.T, x2)
        return dx, dw, (g2.sum(axis=0) if has_bias else None)
    m, k = a.shape[-2:]
    n = b.shape[-1]
    full = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    da = reduce_batch(np.matmul(gp, np.swapaxes(b, -1, -2)).reshape(full + (m, k)), a.shape[:-2])
    if b.ndim == 2:
        db = np.matmul(np.broadcast_to(a, full + (m, k)).reshape(-1, k).T, gp.reshape(-1, n))
    else:
        db = reduce_batch(np.matmul(np.swapaxes(a, -1, -2), gp).reshape(full + (k, n)), b.shape[:-2])
    return da, db, (gp.reshape(-1, n).sum(axis=0) if has_bias else None)


# ---- work model ---------------------------------------------------------------------------------

def _dims(call):
    g, a, b = call.args.grad_out, call.args.a, call.args.b
    if call.args.b_is_nk:
        return 1, math.prod(a.shape[:-1]), b.shape[0], a.shape[-1]
    return math.prod(g.shape[:-2]), a.shape[-2], b.shape[-1], a.shape[-1]


def _flops(call):
    """Two GEMMs (4 M N K), act'(pre) and its product with grad_out (once per element in the
    model; the kernels form it in both GEMMs' packing), the column sums for dbias."""
    batch, m, n, k = _dims(call)
    per = 4 * k + (DERIVATIVE_FLOPS_PER_ELEMENT[call.args.act] + 1 if call.args.act != ACT_NONE else 0)
    return batch * m * n * per + (batch * m * n if call.args.has_bias else 0)


def _bytes(call):
    """Fewest bytes: read grad_out, pre, the two operands once; write da, db, dbias."""
    g, a, b, pre = call.args.grad_out, call.args.a, call.args.b, call.args.pre
    elems = g.size + (pre.size if pre is not None else 0) + 2 * (a.size + b.size)
    if call.args.has_bias:
        elems += g.shape[-1]
    return elems * g.dtype.itemsize


# ---- selection ----------------------------------------------------------------------------------

# Measured on this host (Sapphire Rapids, 2 cores shared with other jobs, load average 8-10,
# 2026-11-25; float32; the report's interleaved method, /tmp scripts, numbers per call):
#   two threads (numba's default here), wall clock, medians of 9-11 rounds:
#     linear 128x768x3072 + gelu backward: cpu-gemm 55-69 ms, blas (gelu_backward pass +
#     OpenBLAS x 2) 150-304 ms, PyTorch's aten backward 94-156 ms (OpenBLAS's and torch's
#     spinning threads lose most on the loaded cores; numba's GEMM takes its tasks from a
#     counter, so a thread that loses its core does not hold the other up)
#   one thread, CPU time (process_time, OPENBLAS_NUM_THREADS=1), medians of 9:
#     128x768x3072 + gelu: cpu-gemm 12.1-15.2 ms, blas 12.2;  128x384x1536 + gelu: 4.66 / 3.76;
#     no activation, + dbias: 128x768x768 4.07 / 3.16, 128x3072x768 13.3 / 11.6.
#   The prologue itself costs < 1 ms of a 12 ms backward (the GEMMs alone with and without it:
#   dx 6.4 / 6.6 ms, dweight + dbias 5.7 / 4.9), where the unfused pass costs 1.26 ms; the
#   one-thread gap is OpenBLAS's GEMM being faster than ours at M = 128 (dx 5.7 vs 6.6 ms).
# So: with an activation, the fused GEMMs (they win clearly at the machine's thread count,
# lose ~20% of CPU time on one thread); without one, the plain products go to OpenBLAS as
# linalg's rule sends plain forward products there (faster in CPU time), dbias a numpy sum.
# Tiny or decode-like products (linalg's thresholds): packing and a parallel region cost more.
# Without an activation, on the 16-lane tiles' hosts, our GEMM after all (from linalg's
# wide-product size, WIDE_GEMM_PRODUCT / WIDE_GEMM_MIN_N): a 2-layer MLP's backward (128 tokens, 768 ->
# 3072 -> 768; linear_backward without activation, then with gelu), Sapphire Rapids-class
# Xeon, 2 threads, medians of 11 x 5 after 0.25 s pauses (2026-12-02): the no-activation
# layer alone blas 5.69 / cpu-gemm 5.90 ms, the two layers 15.33 / 12.59 ms (OpenBLAS's
# spinning threads slow the gelu layer's GEMMs).  Cold first call of matmul_backward
# 128x768x768 then 0.02 -> 2.6 s (it compiles the GEMM; under issue #8's 3 s).
def _order(key):
    m, n, k = key.m, key.n, key.k
    if m < GEMV_ROWS:
        return ("blas", "cpu-gemm"), f"M bucket {m} < {GEMV_ROWS}: packing panels for a few rows does not pay"
    if m * n * k < SMALL_PRODUCT:
        return ("blas", "cpu-gemm"), (f"M*N*K bucket {m * n * k} < 2^22: BLAS calls cost less than packing + a "
                                      "parallel region")
    if key.act != ACT_NONE:
        return ("cpu-gemm", "blas"), ("activation: act'(pre) * grad_out formed in the backward GEMMs' packing "
                                      "(no elementwise pass, no (M, N) g' array), dbias from the same panels")
    if m * n * k >= WIDE_GEMM_PRODUCT and n >= WIDE_GEMM_MIN_N and K.active_tile().lanes32 == 16:
        return ("cpu-gemm", "blas"), (f"no activation, {K.active_tile().name} tile: as fast as OpenBLAS alone, and no "
                                      "OpenBLAS threads left spinning to slow the next parallel kernel")
    return ("blas", "cpu-gemm"), "no activation: two plain products, OpenBLAS as fast or faster (linalg's rule)"


_RULE = Rule(("cpu-gemm", "blas"), _order)

_NOTES_GEMM = ("own cache-blocked GEMM (linalg's) twice; the operand that is g' = grad_out * act'(pre) is formed by "
               "its packers (the prologue: no (M, N) g' array, no elementwise pass), dbias = the column sums of the "
               "packed panels of dweight's / db's GEMM; " + HOST_COPY_NOTE)
_NOTES_BLAS = ("unfused: g' by the elementwise backward kernel into an (M, N) array, numpy.matmul (OpenBLAS) twice, "
               "numpy column sums for dbias")


def _synthesize(shapes, params, rng, dtype):
    out = {nm: rng.standard_normal(s).astype(dtype) for nm, s in shapes.items()}
    if "weight" in out:
        out["weight"] *= dtype(1.0 / math.sqrt(out["weight"].shape[-1]))
    return out


def _sig_linear(i):
    return (i["grad_out"], i["x"], i["weight"], i.get("pre")), {"activation": i.get("activation"),
                                                                "has_bias": i.get("has_bias", False)}


def _sig_matmul(i):
    return (i["grad_out"], i["a"], i["b"], i.get("pre")), {"activation": i.get("activation"),
                                                           "has_bias": i.get("has_bias", False)}


def _act_variants():
    """warmup: each activation compiles its derivative loop (kernels_cpu.linalg_grad.grad_chunk),
    and with / without dbias the packers differ."""
    def variant(activation):
        def make(args, kwargs):
            args = list(args)
            if args[3] is None:
                args[3] = np.zeros(args[0].shape, args[0].dtype)
            return tuple(args), dict(kwargs, activation=activation, has_bias=True)
        return make
    return {str(a): variant(a) for a in ACTIVATION_CODES if a is not None}


def _register(name, describe, signature):
    op = register_op(Op(name, describe, family="linalg_grad", bound="compute", signature=signature, flops=_flops,
                        bytes=_bytes, rules={"cpu": _RULE}, synthesize=_synthesize, variants=_act_variants(),
                        memo=True))
    register(Implementation(name, "cpu-gemm", "cpu", _run_gemm, notes=_NOTES_GEMM, kernel_modules=_KERNELS))
    register(Implementation(name, "blas", "cpu", _run_blas, notes=_NOTES_BLAS, kernel_modules=_KERNELS))
    return op


_linear_backward = _register("linear_backward", describe_linear_backward, _sig_linear)
_matmul_backward = _register("matmul_backward", describe_matmul_backward, _sig_matmul)


@_linear_backward.expose
def linear_backward(grad_out, x, weight, pre=None, *, activation=None, has_bias=False):
    """Gradients of y = act(x @ weight.T + bias) (dispatch.linear): returns (dx, dweight,
    dbias).  grad_out (..., N) = dL/dy; x (..., K) and weight (N, K) the forward's inputs;
    pre (..., N) = x @ weight.T + bias, the pre-activation the forward kept (required with an
    activation, unused without); activation as the forward's; has_bias: whether the forward
    had a bias (dbias (N,) is returned, else None).  dx has x's shape, dweight weight's."""
    return _linear_backward(grad_out, x, weight, pre, activation=activation, has_bias=has_bias)


@_matmul_backward.expose
def matmul_backward(grad_out, a, b, pre=None, *, activation=None, has_bias=False):
    """Gradients of y = act(a @ b + bias) (dispatch.matmul): returns (da, db, dbias).
    grad_out and pre (batch..., M, N) of the forward's broadcast batch; a (..., M, K),
    b (..., K, N); da / db have a's / b's shapes (summed over the batch dims each was
    broadcast along), dbias (N,) when has_bias, else None."""
    return _matmul_backward(grad_out, a, b, pre, activation=activation, has_bias=has_bias)
