"""CUDA implementations of softmax_backward, log_softmax_backward, cross_entropy_with_grad
and cross_entropy_backward ("cuda-warp-row", "cuda-block-row").

The shape rule and launch parameters are the forwards' (dispatch/cuda_impls/softmax.py:
ROW_RULE, rows shorter than 2048 on one warp each, longer rows on one block each; not
measured on a GPU): the backward kernels have the forward's access pattern (two passes over
a row, a warp or block reduction between them), so the same crossover applies.  Reductions
along a non-last axis use the column kernel in both implementations.
"""
from __future__ import annotations

import numpy as np

from ..registry import set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, deliver, device_copy, device_empty,
                      kernels, output, props, register_cuda, row_launch, size)
from .softmax import BLOCK_PARAMS, COLUMN_BLOCK, ROW_RULE, WARP_PARAMS

CHECK_THREADS = 256  # kernels_cuda.softmax_grad.CHECK_THREADS (read here without importing numba.cuda)
# kernels_cuda.softmax_grad.CE_BLOCK_MAX_THREADS: the cross-entropy gradient's block kernel
# is built for blocks of at most 512 threads (at 1024 its float64 build spills on sm_90)
CE_BLOCK_PARAMS = {**BLOCK_PARAMS, "max_block": 512}


def _split(shape, axis):
    return size(shape[:axis]), shape[axis], size(shape[axis + 1:])


# ---- softmax_backward / log_softmax_backward -----------------------------------------------

def sm_launch(params, grad_out, y, axis, out, log):
    outer, n, inner = _split(tuple(y.shape), axis)
    if inner != 1:
        return {"kernel": "softmax_grad.columns", "grid": max(1, cdiv(outer * inner, COLUMN_BLOCK)),
                "block": COLUMN_BLOCK, "device": props().name}
    return row_launch(params, outer, n, "softmax_grad")


def _run_sm(params, grad_out, y, axis, out, log):
    K = kernels("softmax_grad")
    gd, yd = as_input(grad_out), as_input(y)
    res, od = output(out, y.shape, y.dtype)
    if size(y.shape):
        outer, n, inner = _split(tuple(y.shape), axis)
        cfg = sm_launch(params, grad_out, y, axis, out, log)
        acc = acc_dtype(y.dtype)
        if inner != 1:
            s3 = (outer, n, inner)
            K.columns(acc)[cfg["grid"], cfg["block"]](c_view(gd, *s3), c_view(yd, *s3), c_view(res, *s3), log)
        else:
            k = K.warp_rows(acc) if params["mode"] == "warp" else K.block_rows(acc)
            k[cfg["grid"], cfg["block"]](c_view(gd, outer, n), c_view(yd, outer, n), c_view(res, outer, n), log)
    return deliver(res, od, out)


_NOTES = {"cuda-warp-row": "one warp per row: sum by shuffles, second pass writes; ",
          "cuda-block-row": "one block per row: sum by shuffles + 32 shared slots, second pass writes; "}
for _op in ("softmax_backward", "log_softmax_backward"):
    register_cuda(_op, "cuda-warp-row", _run_sm, sm_launch, kernels=("softmax_grad",), params=WARP_PARAMS,
                  notes=_NOTES["cuda-warp-row"] + DEVICE_COPY_NOTE)
    register_cuda(_op, "cuda-block-row", _run_sm, sm_launch, kernels=("softmax_grad",), params=BLOCK_PARAMS,
                  notes=_NOTES["cuda-block-row"] + DEVICE_COPY_NOTE)
    set_rule(_op, "cuda", ROW_RULE)


# ---- cross_entropy_with_grad / cross_entropy_backward --------------------------------------

_ones: dict = {}


def _one(dt):
    """A 1-element device array holding 1 (the upstream gradient of cross_entropy_with_grad),
    made once per dtype (read-only to the kernels)."""
    d = _ones.get(dt)
    if d is None:
        from numba import cuda

        d = _ones.setdefault(dt, cuda.to_device(np.ones(1, dt)))  # a racing thread keeps the first
    return d


def ce_launch(params, logits, targets, reduction, ignore_index, grad_out, grad_loss, with_loss):
    n, c = logits.shape
    cfg = row_launch(params, n, c, "cross_entropy_grad")
    cfg["check"] = {"kernel": "cross_entropy_grad.check", "grid": 1, "block": CHECK_THREADS}
    cfg["reduce"] = ({"kernel": "cross_entropy.reduce", "grid": 1, "block": 256}
                     if with_loss and reduction != "none" else None)
    return cfg


def _run_ce(params, logits, targets, reduction, ignore_index, grad_out, grad_loss, with_loss):
    Kg, Kf = kernels("softmax_grad"), kernels("softmax")
    n, c = logits.shape
    dt = np.dtype(logits.dtype)
    acc = acc_dtype(dt)
    td = as_input(targets)
    cfg = ce_launch(params, logits, targets, reduction, ignore_index, grad_out, grad_loss, with_loss)
    count = device_empty(1, np.float64)
    bad = device_copy(np.array([n], np.int64))
    if n:
        Kg.ce_check()[1, CHECK_THREADS](td, ignore_index, c, count, bad)
        b = int(bad.copy_to_host()[0])
        if b < n:
            tval = int(td[b:b + 1].copy_to_host()[0])
            raise ValueError(f"targets[{b}] = {tval} is out of range: class indices must be in "
                             f"[0, {c}) or equal ignore_index={ignore_index}")
    ld = as_input(logits)
    res, od = output(grad_out, logits.shape, dt)
    if grad_loss is None:
        scales = _one(dt)
    elif isinstance(grad_loss, float):
        scales = device_copy(np.full(1, grad_loss, dt))
    else:
        scales = as_input(grad_loss).reshape(-1) if len(grad_loss.shape) else as_input(grad_loss).reshape(1)
    per_row = reduction == "none" and grad_loss is not None
    losses = device_empty(max(n, 1), dt if reduction == "none" else acc)
    valid = device_empty(max(n, 1), acc)
    if n:
        k = Kg.ce_grad_warp_rows(acc) if params["mode"] == "warp" else Kg.ce_grad_block_rows(acc)
        k[cfg["grid"], cfg["block"]](ld, td, ignore_index, res, losses, valid, scales, per_row, count,
                                     reduction == "mean")
    grad = deliver(res, od, grad_out)
    if not with_loss:
        return grad
    if reduction == "none":
        return losses[:n], grad
    result = device_empty(1, dt)
    Kf.sum_losses(acc)[1, 256](losses[:n], valid[:n], reduction == "mean", result)
    return result.reshape(()), grad


CE_NOTE = ("target check and count in one block first (an 8-byte read back to raise before anything is "
           "written), then online max/sum-exp and one write pass of (softmax - onehot) * scale; ")
for _op in ("cross_entropy_with_grad", "cross_entropy_backward"):
    register_cuda(_op, "cuda-warp-row", _run_ce, ce_launch, kernels=("softmax_grad", "softmax"), params=WARP_PARAMS,
                  notes="one warp per row: " + CE_NOTE + DEVICE_COPY_NOTE)
    register_cuda(_op, "cuda-block-row", _run_ce, ce_launch, kernels=("softmax_grad", "softmax"),
                  params=CE_BLOCK_PARAMS, notes="one block per row: " + CE_NOTE + DEVICE_COPY_NOTE)
    set_rule(_op, "cuda", ROW_RULE)
