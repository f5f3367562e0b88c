"""CUDA implementations of batch_norm ("cuda-elementwise") and group_norm ("cuda-block-row"),
the activation fused.

batch_norm launch: blocks of 256 threads shaped (tx, ty), tx the power of two >= S capped at
256 (the threads along a plane), ty = 256 / tx planes per block; the grid covers the planes
first (grid.x, so a thread folds one plane's statistics for all its elements), then the
plane's elements (grid.y) up to one wave of resident blocks in all; both grid-stride.
group_norm launch: softmax's block-per-row rule on (N*G rows of (C/G) * S): about 8
elements per thread, 32..1024 threads, the grid capped at one wave.  One block per (sample,
group): Stable Diffusion's 32 groups fill 32 SMs (splitting a group's reduction over
blocks would need a second pass; not done).  Neither launch is measured on a GPU (none lent).
"""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, GRID_YZ_MAX

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, deliver, dummy, kernels, occupancy_blocks,
                      output, pow2_at_least, props, register_cuda, row_launch, size)
from .softmax import BLOCK_PARAMS

BN_PARAMS = {"block": ELEMENTWISE_THREADS, "waves": 1}


def _nc_s(shape):
    n, c = int(shape[0]), int(shape[1])
    return n, c, (size(shape) // (n * c) if n * c else 0)


def bn_launch(params, x, running_mean, running_var, weight, bias, eps, code, out):
    n, c, s = _nc_s(x.shape)
    planes = n * c
    p = props()
    block = min(params["block"], p.max_threads_per_block)
    tx = min(block, pow2_at_least(max(s, 1)))
    ty = block // tx
    cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
    gx = max(1, min(cdiv(planes, ty), cap))
    gy = max(1, min(cdiv(s, tx), max(1, cap // gx), GRID_YZ_MAX))
    return {"kernel": "batch_norm.planes", "grid": (gx, gy), "block": (tx, ty), "planes": planes,
            "plane_elements": s, "device": p.name}


def _run_bn(params, x, running_mean, running_var, weight, bias, eps, code, out):
    K = kernels("channel_norm")
    dt = np.dtype(x.dtype)
    res, od = output(out, x.shape, dt)
    n, c, s = _nc_s(x.shape)
    if n * c * s:
        cfg = bn_launch(params, x, running_mean, running_var, weight, bias, eps, code, out)
        w = as_input(weight) if weight is not None else dummy(dt)
        b = as_input(bias) if bias is not None else dummy(dt)
        K.batch_norm_kernel(acc_dtype(dt))[cfg["grid"], cfg["block"]](
            c_view(as_input(x), n * c, s), as_input(running_mean), as_input(running_var), w, b, float(eps),
            c_view(res, n * c, s), weight is not None, bias is not None, code)
    return deliver(res, od, out)


GN_PARAMS = dict(BLOCK_PARAMS)


def gn_launch(params, x, num_groups, weight, bias, eps, code, out):
    n, c, s = _nc_s(x.shape)
    return row_launch(params, n * num_groups, (c // num_groups) * s, "group_norm")


def _run_gn(params, x, num_groups, weight, bias, eps, code, out):
    K = kernels("channel_norm")
    dt = np.dtype(x.dtype)
    res, od = output(out, x.shape, dt)
    n, c, s = _nc_s(x.shape)
    if n * c * s:
        cg = c // num_groups
        rows, row_len = n * num_groups, cg * s
        cfg = gn_launch(params, x, num_groups, weight, bias, eps, code, out)
        w = as_input(weight) if weight is not None else dummy(dt)
        b = as_input(bias) if bias is not None else dummy(dt)
        K.group_norm_kernel(acc_dtype(dt))[cfg["grid"], cfg["block"]](
            c_view(as_input(x), rows, row_len), w, b, float(eps), c_view(res, rows, row_len), num_groups, cg, s,
            weight is not None, bias is not None, code)
    return deliver(res, od, out)


register_cuda("batch_norm", "cuda-elementwise", _run_bn, bn_launch, kernels=("channel_norm", "activation"),
              params=BN_PARAMS,
              notes="planes x elements grid, statistics folded once per plane and thread, FMA + activation "
                    "streaming pass; float16/float32 computed in float32; " + DEVICE_COPY_NOTE)
set_rule("batch_norm", "cuda", fixed_rule(("cuda-elementwise",), "one elementwise kernel"))

register_cuda("group_norm", "cuda-block-row", _run_gn, gn_launch, kernels=("channel_norm", "activation"),
              params=GN_PARAMS,
              notes="one block per (sample, group), shifted two-pass statistics reduced by warp shuffles + shared "
                    "slots, output pass with weight, bias and activation fused; float16 accumulates in float32; "
                    + DEVICE_COPY_NOTE)
set_rule("group_norm", "cuda", fixed_rule(("cuda-block-row",), "one block per (sample, group) block"))
