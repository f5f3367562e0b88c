"""CUDA implementation of rope ("cuda-elementwise"): one thread per rotated pair,
grid-stride, the grid capped at one wave of resident blocks (as the activations)."""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, deliver, kernels, occupancy_blocks,
                      output, props, register_cuda, size)

PARAMS = {"block": ELEMENTWISE_THREADS, "waves": 1}  # as the activations; not measured on a GPU


def register_rotation(op: str, family: str, inverse: bool, what: str):
    """Register the cuda-elementwise implementation of `op` (rope, or its backward with
    inverse=True: dispatch/cuda_impls/rope_grad.py) on kernels_cuda.<family>'s pair kernel."""

    def launch(params, x, cos, sin, interleaved, out):
        pairs = size(x.shape) // 2
        p = props()
        block = min(params["block"], p.max_threads_per_block)
        cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
        return {"kernel": f"{family}.pairs", "grid": max(1, min(cdiv(pairs, block), cap)), "block": block,
                "pairs": pairs, "device": p.name}

    def run(params, x, cos, sin, interleaved, out):
        dt = np.dtype(x.dtype)
        res, od = output(out, x.shape, dt)
        if size(x.shape):
            d = x.shape[-1]
            rows = size(x.shape) // d
            cfg = launch(params, x, cos, sin, interleaved, out)
            K = kernels(family)
            build = K.rope_grad_kernel if inverse else K.rope_kernel
            build(acc_dtype(dt))[cfg["grid"], cfg["block"]](
                c_view(as_input(x), rows, d), as_input(cos), as_input(sin), c_view(res, rows, d), bool(interleaved))
        return deliver(res, od, out)

    register_cuda(op, "cuda-elementwise", run, launch, kernels=(family,), params=PARAMS,
                  notes=f"one thread per rotated pair{what}, coalesced over pairs, grid-stride; " + DEVICE_COPY_NOTE)
    set_rule(op, "cuda", fixed_rule(("cuda-elementwise",), "elementwise pair rotation"))


register_rotation("rope", "rope", False, "")
