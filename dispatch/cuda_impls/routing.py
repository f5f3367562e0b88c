"""CUDA implementation of topk_softmax ("cuda-warp-row"): one warp per token row.

Launch: softmax's warp-per-row launch (4 warps = 4 rows per block; dispatch.cuda_impls._common.row_launch).
A row of E <= 256 logits is 1..8 per lane, short enough that a block-wide reduction would
leave most of a block idle; at T = 1 (decode) one warp does the whole call, a launch-bound
few microseconds.  Not measured on a GPU (none lent yet).
"""
from __future__ import annotations

import numpy as np

from ..ops.routing import weights_dtype
from ..registry import fixed_rule, set_rule
from ._common import DEVICE_COPY_NOTE, acc_dtype, as_input, device_empty, kernels, register_cuda, row_launch
from .softmax import WARP_PARAMS


def launch(params, logits, k, renormalize):
    t, e = (int(s) for s in logits.shape)
    return row_launch(params, t, e, "routing")


def _run(params, logits, k, renormalize):
    t = int(logits.shape[0])
    dt = np.dtype(logits.dtype)
    weights = device_empty((t, k), weights_dtype(dt))
    indices = device_empty((t, k), np.int64)
    if t:
        cfg = launch(params, logits, k, renormalize)
        kernels("routing").warp_rows(acc_dtype(dt))[cfg["grid"], cfg["block"]](as_input(logits), k, renormalize,
                                                                              weights, indices)
    return weights, indices


register_cuda("topk_softmax", "cuda-warp-row", _run, launch, kernels=("routing",), params=WARP_PARAMS,
              notes="one warp per row: max and sum by shuffles, k rounds of a shuffle argmax over the logits "
                    "ranked below the previous winner; weights in float32 for float16 logits; " + DEVICE_COPY_NOTE)
set_rule("topk_softmax", "cuda", fixed_rule(("cuda-warp-row",), "one warp per token row"))
