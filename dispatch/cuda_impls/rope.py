"""CUDA implementation of rope ("cuda-elementwise"): one thread per rotated pair,
grid-stride, the grid capped at one wave of resident blocks (as the activations)."""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, cdiv, deliver, kernels, occupancy_blocks, output, props,
                      register_cuda, size)

PARAMS = {"block": ELEMENTWISE_THREADS, "waves": 1}  # as the activations; not measured on a GPU


def launch(params, x, cos, sin, interleaved, out):
    pairs = size(x.shape) // 2
    p = props()
    block = min(params["block"], p.max_threads_per_block)
    cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
    return {"kernel": "rope.pairs", "grid": max(1, min(cdiv(pairs, block), cap)), "block": block,
            "pairs": pairs, "device": p.name}


def _run(params, x, cos, sin, interleaved, out):
    K = kernels("rope")
    dt = np.dtype(x.dtype)
    res, od = output(out, x.shape, dt)
    if size(x.shape):
        d = x.shape[-1]
        rows = size(x.shape) // d
        cfg = launch(params, x, cos, sin, interleaved, out)
        acc = acc_dtype(dt)
        K.rope_kernel(acc)[cfg["grid"], cfg["block"]](
            as_input(x).reshape(rows, d), as_input(cos), as_input(sin), res.reshape(rows, d), bool(interleaved))
    return deliver(res, od, out)


register_cuda("rope", "cuda-elementwise", _run, launch, kernels=("rope",), params=PARAMS,
              notes="one thread per rotated pair, coalesced over pairs, grid-stride; " + DEVICE_COPY_NOTE)
set_rule("rope", "cuda", fixed_rule(("cuda-elementwise",), "elementwise pair rotation"))
