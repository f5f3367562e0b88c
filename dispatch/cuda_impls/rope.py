"""CUDA implementation of rope ("cuda-elementwise"): one thread per rotated pair,
grid-stride, the grid capped at one wave of resident blocks (as the activations)."""
from __future__ import annotations

import numpy as np

from ._common import (DEVICE_COPY_NOTE, as_input, cdiv, deliver, install_order, kernels, occupancy_blocks,
                      output, props, register_cuda, size)

PARAMS = {"block": 256, "waves": 1}


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
        acc = np.float64 if dt == np.float64 else np.float32
        K.rope_kernel(acc)[cfg["grid"], cfg["block"]](
            as_input(x).reshape(rows, d), as_input(cos), as_input(sin), res.reshape(rows, d), bool(interleaved))
    return deliver(res, od, out)


register_cuda("rope", "cuda-elementwise", _run, launch, params=PARAMS,
              notes="one thread per rotated pair, coalesced over pairs, grid-stride; " + DEVICE_COPY_NOTE)
install_order("rope", lambda key: (("cuda-elementwise",), "elementwise pair rotation"))
