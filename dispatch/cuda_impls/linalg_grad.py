"""CUDA implementation of linear_backward / matmul_backward ("cuda-gemm"):
kernels_cuda.linalg_grad.gemm_grad_kernel twice, g' = grad_out * act'(pre) formed while the
g' operand's tiles are staged into shared memory (no (M, N) g' array, no elementwise pass),
dbias from the same staged tiles; the batch dims an operand was broadcast along are summed by
sum_groups_kernel.  Tile rule: the forward's (dispatch/cuda_impls/linalg.choose_tile: the
largest tile whose grid still gives a block per SM).  Not measured on a GPU yet.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, device_empty, kernels, occupancy_blocks,
                      output, props, register_cuda)
from .linalg import PARAMS, choose_tile

def _dev(a):
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))


@functools.lru_cache(maxsize=128)
def _index_host(a_batch, b_batch):
    full = np.broadcast_shapes(a_batch, b_batch)
    ai = np.broadcast_to(np.arange(math.prod(a_batch), dtype=np.int64).reshape(a_batch), full).ravel()
    bi = np.broadcast_to(np.arange(math.prod(b_batch), dtype=np.int64).reshape(b_batch), full).ravel()
    return np.ascontiguousarray(ai), np.ascontiguousarray(bi), np.arange(math.prod(full), dtype=np.int64)


_dev_cache: dict = {}


def _on_device(key, host):
    hit = _dev_cache.get(key)
    if hit is None:
        hit = _dev_cache.setdefault(key, _dev(host))  # racing threads: first wins
    return hit


def _groups(idx, ngroups):
    """(order, starts) on the device: the output batches of each group, in order."""
    order = np.argsort(idx, kind="stable").astype(np.int64)
    starts = np.zeros(ngroups + 1, np.int64)
    np.cumsum(np.bincount(idx, minlength=ngroups), out=starts[1:])
    return _on_device(("order", idx.tobytes(), ngroups), order), _on_device(("starts", idx.tobytes(), ngroups), starts)


def launch(params, grad_out, a, b, pre, code, has_bias, b_is_nk):
    """The first product's launch (dx / da: M x K output blocks); dweight / db's is the same
    kernel on an N x K (K x N) output, its tile chosen the same way."""
    batch, m, n, k = _dims(grad_out, a, b, b_is_nk)
    p = props()
    name, bm, bn, thr, smem = choose_tile(p, batch, m, k, params["min_blocks_per_sm"], np.dtype(a.dtype))
    side = "a" if code != 0 else "none"
    return {"kernel": f"linalg_grad.{name}.{side}", "tile": name, "grid": (cdiv(k, bn) * cdiv(m, bm) * batch, 1, 1),
            "block": thr, "shared_bytes": smem, "device": p.name}


def _dims(grad_out, a, b, b_is_nk):
    if b_is_nk:
        return 1, math.prod(a.shape[:-1]), b.shape[0], a.shape[-1]
    return math.prod(grad_out.shape[:-2]), a.shape[-2], b.shape[-1], a.shape[-1]


def _gemm(K, acc, tile, side, a3, b3, pre3, ai, bi, out3, dbias2, code, ta, tb):
    nbatch, m, n = out3.shape
    name, bm, bn, thr, _ = choose_tile(props(), nbatch, m, n, PARAMS["min_blocks_per_sm"], np.dtype(str(out3.dtype)))
    K.gemm_grad_kernel(acc, name, side)[cdiv(n, bn) * cdiv(m, bm) * nbatch, thr](
        a3, b3, pre3, ai, bi, out3, dbias2, code, ta, tb, dbias2.shape[0] > 0 and dbias2.shape[1] > 0)


def _reduce(K, acc, full2, idx, ngroups, out2):
    """out2 (G, E) = group sums of full2 (B, E) by idx (B,)."""
    order, starts = _groups(idx, ngroups)
    total = out2.shape[0] * out2.shape[1]
    p = props()
    grid = max(1, min(cdiv(total, 256), p.sm_count * occupancy_blocks(p, 256)))
    K.sum_groups_kernel(acc)[grid, 256](full2, order, starts, out2)


def _run(params, grad_out, a, b, pre, code, has_bias, b_is_nk):
    K = kernels("linalg_grad")
    dt = np.dtype(grad_out.dtype)
    acc = acc_dtype(dt)
    batch, m, n, k = _dims(grad_out, a, b, b_is_nk)
    if b_is_nk:
        a_batch = b_batch = ()
        da_shape, db_shape = tuple(a.shape), tuple(b.shape)
    else:
        a_batch, b_batch = tuple(a.shape[:-2]), tuple(b.shape[:-2])
        da_shape, db_shape = tuple(a.shape), tuple(b.shape)
    da, _ = output(None, da_shape, dt)
    db, _ = output(None, db_shape, dt)
    dbias = output(None, (n,), dt)[0] if has_bias else None
    if not (batch and m and n and k):
        _zero_fill(grad_out, pre, code, da, db, dbias, n)
        return da, db, dbias
    gd = c_view(as_input(grad_out), batch, m, n)
    pd = c_view(as_input(pre), batch, m, n) if pre is not None else gd
    ai_h, bi_h, ident_h = _index_host(a_batch, b_batch)
    ai, bi = _on_device(("ai", a_batch, b_batch), ai_h), _on_device(("bi", a_batch, b_batch), bi_h)
    ident = _on_device(("id", a_batch, b_batch), ident_h)
    none2 = device_empty((0, 0), dt)  # no dbias output
    side_g = "a" if code != 0 else "none"
    if b_is_nk:
        xd = c_view(as_input(a), 1, m, k)
        wd = c_view(as_input(b), 1, n, k)
        # dx = g' @ W: g' is A (M, N); W (N, K) is B stored (K_gemm, N_gemm)
        _gemm(K, acc, None, side_g, gd, wd, pd, ai, bi, c_view(da, 1, m, k), none2, code, False, False)
        # dW = g'^T @ x: g' is A stored (K_gemm = M, M_gemm = N): trans_a; dbias from its tiles
        db_part = device_empty((1, n), dt) if has_bias else none2
        _gemm(K, acc, None, "a" if (code != 0 or has_bias) else "none", gd, xd, pd, ai, bi, c_view(db, 1, n, k),
              db_part, code, True, False)
        if has_bias:
            _reduce(K, acc, db_part, np.zeros(1, np.int64), 1, c_view(dbias, 1, n))
        return da, db, dbias
    a3 = c_view(as_input(a), max(1, math.prod(a_batch)), m, k)
    b3 = c_view(as_input(b), max(1, math.prod(b_batch)), k, n)
    na, nb = a3.shape[0], b3.shape[0]
    # da = g' @ b^T (b read transposed), per output batch, then summed to a's batch
    da_full = c_view(da, batch, m, k) if na == batch else device_empty((batch, m, k), dt)
    _gemm(K, acc, None, side_g, gd, b3, pd, ident, bi, da_full, none2, code, False, True)
    if na != batch:
        _reduce(K, acc, c_view(da_full, batch, m * k), ai_h, na, c_view(da, na, m * k))
    # db = a^T @ g': g' is B; dbias partials per output batch from its staged tiles
    db_full = c_view(db, batch, k, n) if nb == batch else device_empty((batch, k, n), dt)
    part = device_empty((batch, n), dt) if has_bias else none2
    _gemm(K, acc, None, "b" if (code != 0 or has_bias) else "none", a3, gd, pd, ai, ident, db_full, part, code, True,
          False)
    if nb != batch:
        _reduce(K, acc, c_view(db_full, batch, k * n), bi_h, nb, c_view(db, nb, k * n))
    if has_bias:
        _reduce(K, acc, part, np.zeros(batch, np.int64), 1, c_view(dbias, 1, n))
    return da, db, dbias


def _zero_fill(grad_out, pre, code, da, db, dbias, n):
    """Some size is 0: da and db are sums over nothing (zeros); dbias too unless g' has
    elements (K == 0), then it is summed on the host (a degenerate call, not a kernel path)."""
    for arr_ in (da, db):
        if arr_.size:
            arr_.copy_to_device(np.zeros(arr_.shape, arr_.dtype))
    if dbias is not None and dbias.size:
        g = np.ascontiguousarray(grad_out.copy_to_host()).reshape(-1, n)
        if code and g.size:
            from kernels_cpu.activation_grad import unary_grad_serial
            gp = np.empty_like(g)
            unary_grad_serial(g.reshape(-1), np.ascontiguousarray(pre.copy_to_host()).reshape(-1), gp.reshape(-1), code)
            g = gp
        dbias.copy_to_device(g.sum(axis=0).astype(g.dtype))


NOTES = ("the forward's tiled GEMM with a prologue: g' = grad_out * act'(pre) formed while its tiles are staged in "
         "shared memory (no (M, N) g' array), dbias summed from the staged tiles of the first column / row block; "
         "broadcast batch dims summed by a group-sum kernel; " + DEVICE_COPY_NOTE)

for _op in ("linear_backward", "matmul_backward"):
    register_cuda(_op, "cuda-gemm", _run, launch, kernels=("linalg_grad", "activation_grad"), notes=NOTES,
                  params=PARAMS, dtypes=(np.dtype(np.float32), np.dtype(np.float64)))
    set_rule(_op, "cuda", fixed_rule(("cuda-gemm",), "the tiled GEMM with the g' prologue (one CUDA kernel)"))
