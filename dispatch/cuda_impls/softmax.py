"""CUDA implementations of softmax, log_softmax ("cuda-warp-row", "cuda-block-row") and
cross_entropy ("cuda-warp-row").

Shape rule (CUDA keys): rows shorter than BLOCK_MIN elements (bucket < BLOCK_MIN) go to the warp-per-row kernel (a
row's 32 lanes each hold <= 32 elements; a block-wide reduction would leave most of a
block idle on short rows and pay two barriers), longer rows to block-per-row with about
32 elements per thread (ROW_BLOCK_PARAMS; cross_entropy 8), 32..1024 threads, the grid
capped at 4 waves (cross_entropy one) of resident
blocks and grid-striding over the rows.  Reductions along a non-last axis use the
column kernel (one thread per (outer, inner) column, coalesced over inner) in both.
BLOCK_MIN (2048, i.e. rows up to 2047 on warps) follows the usual crossover of hand-written softmax kernels (Apex / OneFlow switch
from warp to block reduction at 1024 columns); it is not measured here (no GPU).
"""
from __future__ import annotations

import numpy as np

from ..registry import Rule, set_rule
from ._common import (DEVICE_COPY_NOTE, VEC_BYTES, VEC_ROWS_MAX_THREADS, acc_dtype, as_input, c_view, cdiv, deliver,
                      device_copy, device_empty, kernels, output, props, register_cuda, row_launch, row_vector, size,
                      vec_width, vector_width)

BLOCK_MIN = 2048  # a power of two: compared with the key's floor-power-of-two bucket
# Launch parameters: 4 warps per block and ~8 elements per thread are the common choices of
# hand-written row-reduction kernels (OneFlow, Apex; the backward and cross-entropy block
# kernels keep them, not measured on a GPU); 128-thread blocks for the column kernel.
WARP_PARAMS = {"mode": "warp", "warps_per_block": 4}
BLOCK_PARAMS = {"mode": "block", "per_thread": 8, "max_block": 1024, "waves": 1}
# softmax, log_softmax and the norms: ~32 elements a thread (128 threads for a row of 4096),
# the grid capped at 4 waves.  GPU time on the H200 (2026-11-27, bench/gpu_results/
# 2026-11-27-h200, call2/probe_rows.log), at 8 / 16 / 32 elements a thread: (4096, 4096)
# float16 softmax 105 / 82 / 71 us, layer_norm 112 / 89 / 80, rms_norm 84 / 71 / 65 (float32
# alike; (8192, 2048) and (1024, 8192) the same order).  Smaller blocks put more rows in
# flight on each SM, each row a chain of loads and barriers.  64 elements won in float16
# by 0-4 us and lost in float32 by up to 23 (call3/probe_rows2.log); 4 waves instead of 1
# gained 1-4% at 4096 rows (the same run; equal at 1024 rows, under either cap).  (A block
# holding its row in registers, 8 or 16 elements a thread, was no faster than 32 elements
# in two passes except rms_norm's 59 against 65 us: not kept.)
ROW_BLOCK_PARAMS = {**BLOCK_PARAMS, "per_thread": 32, "waves": 4}
COLUMN_BLOCK = 128


def _split(shape, axis):
    outer = size(shape[:axis])
    inner = size(shape[axis + 1:])
    return outer, shape[axis], inner


def launch(params, x, axis, out, log):
    outer, n, inner = _split(tuple(x.shape), axis)
    if inner != 1:
        g = cdiv(outer * inner, COLUMN_BLOCK)
        return {"kernel": "softmax.columns", "grid": max(1, g), "block": COLUMN_BLOCK,
                "device": props().name}
    cfg = row_launch(params, outer, n, "softmax", row_vector(n, x.dtype, x, out))
    if cfg["kernel"] == "softmax.block_rows":  # long or odd rows: streamed, in vectors where aligned
        vec, why = vector_width(x.dtype, x, out)
        if vec:
            cfg["kernel"] = "softmax.block_stream_vec_rows"
            cfg["block"] = min(cfg["block"], VEC_ROWS_MAX_THREADS)
            cfg["elements_per_thread"] = cdiv(n, cfg["block"])
            cfg["vector"] = f"{vec} elements ({VEC_BYTES} bytes), streamed: " + cfg["vector"].removeprefix("none: ")
    return cfg


def _run_softmax(params, x, axis, out, log):
    K = kernels("softmax")
    xd = as_input(x)
    res, od = output(out, x.shape, x.dtype)
    if size(x.shape):
        outer, n, inner = _split(tuple(x.shape), axis)
        cfg = launch(params, x, axis, out, log)
        acc = acc_dtype(x.dtype)
        if inner != 1:
            k = K.columns(acc)
            k[cfg["grid"], cfg["block"]](c_view(xd, outer, n, inner), c_view(res, outer, n, inner), log)
        else:
            if cfg["kernel"] == "softmax.block_stream_vec_rows":
                k = K.stream_vec_rows(acc, vec_width(np.dtype(x.dtype).itemsize))
            elif "_vec_" in cfg["kernel"]:
                k = K.vec_rows(params["mode"], acc, vec_width(np.dtype(x.dtype).itemsize))
            else:
                k = K.warp_rows(acc) if params["mode"] == "warp" else K.block_rows(acc)
            k[cfg["grid"], cfg["block"]](c_view(xd, outer, n), c_view(res, outer, n), log)
    return deliver(res, od, out)


def _order(key):
    n = key.row_len
    if n < BLOCK_MIN:
        return ("cuda-warp-row", "cuda-block-row"), f"row length bucket {n} < {BLOCK_MIN}: one warp per row"
    return ("cuda-block-row", "cuda-warp-row"), f"row length bucket {n} >= {BLOCK_MIN}: one block per row"


ROW_RULE = Rule(("cuda-warp-row", "cuda-block-row"), _order)  # softmax family and norms


NOTES_W = "online max/sum-exp per lane merged by warp shuffles, second pass writes; " + DEVICE_COPY_NOTE
NOTES_B = "online max/sum-exp per thread merged by warp shuffles + 32 shared slots, second pass writes; " + DEVICE_COPY_NOTE
for _op in ("softmax", "log_softmax"):
    register_cuda(_op, "cuda-warp-row", _run_softmax, launch, kernels=("softmax",), notes=NOTES_W,
                  params=WARP_PARAMS)
    register_cuda(_op, "cuda-block-row", _run_softmax, launch, kernels=("softmax",), notes=NOTES_B,
                  params=ROW_BLOCK_PARAMS)
    set_rule(_op, "cuda", ROW_RULE)


# ---- cross_entropy -------------------------------------------------------------------------

def ce_launch(params, logits, targets, reduction, ignore_index):
    n, c = logits.shape
    cfg = row_launch(params, n, c, "cross_entropy")
    cfg["reduce"] = {"kernel": "cross_entropy.reduce", "grid": 1, "block": 256} if reduction != "none" else None
    return cfg


def _run_ce(params, logits, targets, reduction, ignore_index):
    K = kernels("softmax")
    n, c = logits.shape
    dt = np.dtype(logits.dtype)
    acc = acc_dtype(dt)
    ld, td = as_input(logits), as_input(targets)
    losses = device_empty(n, dt if reduction == "none" else acc)
    valid = device_empty(max(n, 1), acc)
    bad = device_copy(np.array([n], np.int64))
    if n:
        cfg = ce_launch(params, logits, targets, reduction, ignore_index)
        k = K.cross_entropy_rows(acc) if params["mode"] == "warp" else K.cross_entropy_block_rows(acc)
        k[cfg["grid"], cfg["block"]](ld, td, ignore_index, losses, valid, bad)
        b = int(bad.copy_to_host()[0])
        if b < n:
            tval = int(td[b:b + 1].copy_to_host()[0])
            raise ValueError(f"targets[{b}] = {tval} is out of range: class indices must be in "
                             f"[0, {c}) or equal ignore_index={ignore_index}")
    if reduction == "none":
        return losses
    result = device_empty(1, dt)
    K.sum_losses(acc)[1, 256](losses, valid[:n], reduction == "mean", result)
    return result.reshape(())


CE_NOTE = ("online logsumexp by shuffles, target checked on the device (one 8-byte read back to "
           "raise), one-block deterministic sum/mean pass; ")
register_cuda("cross_entropy", "cuda-warp-row", _run_ce, ce_launch, kernels=("softmax",), params=WARP_PARAMS,
              notes="one warp per row: " + CE_NOTE + DEVICE_COPY_NOTE)
register_cuda("cross_entropy", "cuda-block-row", _run_ce, ce_launch, kernels=("softmax",), params=BLOCK_PARAMS,
              notes="one block per row: " + CE_NOTE + DEVICE_COPY_NOTE)
set_rule("cross_entropy", "cuda", ROW_RULE)
