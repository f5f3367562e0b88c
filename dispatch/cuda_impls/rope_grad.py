"""CUDA implementation of rope_backward ("cuda-elementwise"): one thread per rotated pair,
grid-stride, the grid capped at one wave of resident blocks (as rope's)."""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, cdiv, deliver, kernels, occupancy_blocks, output, props,
                      register_cuda, size)

PARAMS = {"block": ELEMENTWISE_THREADS, "waves": 1}  # as rope's; not measured on a GPU


def launch(params, grad_out, cos, sin, interleaved, out):
    pairs = size(grad_out.shape) // 2
    p = props()
    block = min(params["block"], p.max_threads_per_block)
    cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
    return {"kernel": "rope_grad.pairs", "grid": max(1, min(cdiv(pairs, block), cap)), "block": block,
            "pairs": pairs, "device": p.name}


def _run(params, grad_out, cos, sin, interleaved, out):
    K = kernels("rope_grad")
    dt = np.dtype(grad_out.dtype)
    res, od = output(out, grad_out.shape, dt)
    if size(grad_out.shape):
        d = grad_out.shape[-1]
        rows = size(grad_out.shape) // d
        cfg = launch(params, grad_out, cos, sin, interleaved, out)
        K.rope_grad_kernel(acc_dtype(dt))[cfg["grid"], cfg["block"]](
            as_input(grad_out).reshape(rows, d), as_input(cos), as_input(sin), res.reshape(rows, d), bool(interleaved))
    return deliver(res, od, out)


register_cuda("rope_backward", "cuda-elementwise", _run, launch, kernels=("rope_grad",), params=PARAMS,
              notes="one thread per rotated pair (inverse rotation), coalesced over pairs, grid-stride; "
                    + DEVICE_COPY_NOTE)
set_rule("rope_backward", "cuda", fixed_rule(("cuda-elementwise",), "elementwise pair rotation"))
