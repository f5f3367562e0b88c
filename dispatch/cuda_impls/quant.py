"""CUDA implementations of quantize / dequantize ("cuda-elementwise").

quantize: with scales to compute, quant.range (a block per channel, or G blocks per channel
when there are few channels, so a per-tensor scale still spreads over the GPU), the (G, C)
partials copied to the host, scales and zero points computed there with the CPU's code
(dispatch.ops.quant.scales_from_range: the same numbers on both devices), then
quant.quantize, grid-stride elementwise.  The result's values are a device array; its
scale / zero point are host arrays (dispatch/quantized.py), copied to the device once per
QuantizedArray (QuantizedArray.cached).
dequantize: quant.dequantize, grid-stride elementwise.

Launch: 256-thread blocks, the grid capped at one full wave of resident blocks (the
elementwise family's rule, dispatch/cuda_impls/activation.py).  Not measured on a GPU
(none lent yet).  The range pass over channels along the last axis (I == 1) reads with a
stride of C elements: uncoalesced, a known cost of that layout.
"""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS
from kernels_common.quant import QTYPES

from .. import validate as V
from ..ops.quant import _channels, check_finite, compute_dtype, given_params, result, scales_from_range
from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, as_input, c_view, cdiv, deliver, device_copy, device_empty, kernels,
                      occupancy_blocks, output, props, register_cuda, size)

PARAMS = {"block": ELEMENTWISE_THREADS, "waves": 1}
GRID_YZ_MAX = 65535


def _fit(block, n):
    """The block for n work items: params' block, or the power of two >= n (at least one
    warp) when that is smaller: a 240-element tensor gets one 256-thread block either way,
    but a channel of 6 elements gets one warp, not 256 threads of which 250 idle (which the
    simulator runs one Python thread each: the (6, 40) round trip took 60 s)."""
    return min(block, max(32, 1 << max(0, int(n) - 1).bit_length()))


def _elementwise(params, n, kernel):
    p = props()
    block = _fit(params["block"], n)
    cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
    return {"kernel": kernel, "grid": max(1, min(cdiv(n, block), cap)), "block": block, "elements": n,
            "device": p.name}


def _range_launch(params, shape, axis):
    p = props()
    o, c, i = _channels(shape, axis)
    block = _fit(params["block"], o * i)
    cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
    g = max(1, min(cdiv(cap, c), cdiv(o * i, block * 4), GRID_YZ_MAX))
    return {"kernel": "quant.range", "grid": (c, g), "block": block, "channels": c, "partials": g,
            "device": p.name}


def launch_quantize(params, x, qd, axis, symmetric, scale, zero_point):
    shape = tuple(int(s) for s in x.shape)
    cfg = _elementwise(params, size(shape), "quant.quantize")
    if scale is None:
        first = _range_launch(params, shape, axis)
        first["reduce"] = cfg  # the follow-up pass (bench.ptx / the CUDA model follow "reduce")
        return first
    return cfg


def launch_dequantize(params, values, q, dt, out):
    return _elementwise(params, size(values.shape), "quant.dequantize")


def _device_params(q, acc, cuda):
    """q's scale (acc) and zero point (int32 for quantize, acc for dequantize), on the device."""
    return q.cached(("cuda-params", np.dtype(acc).name),
                    lambda: (cuda.to_device(np.ascontiguousarray(q.scale.ravel(), acc)),
                             cuda.to_device(np.ascontiguousarray(q.zero_point.ravel(), acc)),
                             cuda.to_device(np.ascontiguousarray(q.zero_point.ravel(), np.int32))))


def _run_quantize(params, x, qd, axis, symmetric, scale, zero_point):
    scale, zero_point = given_params(scale, zero_point, qd)
    K = kernels("quant")
    shape = tuple(int(s) for s in x.shape)
    dt = V.dtype_of(x)
    acc = compute_dtype(dt)
    o, c, i = _channels(shape, axis)
    n = size(shape)
    xd = as_input(x)
    if scale is None:
        if n:
            cfg = _range_launch(params, shape, axis)
            g = cfg["partials"]
            parts = [device_empty((g, c), acc) for _ in range(4)]
            K.range_kernel(acc.type)[cfg["grid"], cfg["block"]](c_view(xd, o, c, i), *parts)
            amax, lo, hi, bad = (p.copy_to_host() for p in parts)
            amax, lo, hi, bad = amax.max(axis=0), lo.min(axis=0), hi.max(axis=0), bad.max(axis=0) > 0
        else:
            amax = lo = hi = np.zeros(c, acc)
            bad = np.zeros(c, bool)
        check_finite(bad, axis)
        scale, zero_point = scales_from_range(dt, qd, symmetric, amax, lo, hi)
    q = device_empty(shape, qd)
    if n:
        lo_q, hi_q = QTYPES[qd.name][1:]
        cfg = _elementwise(params, n, "quant.quantize")
        K.quantize_kernel(acc.type)[cfg["grid"], cfg["block"]](
            c_view(xd, n), device_copy(scale.astype(acc)), device_copy(zero_point.astype(np.int32)),
            np.int32(lo_q), np.int32(hi_q), c_view(q, n), c, i)
    return result(q, scale, zero_point, axis)


def _run_dequantize(params, values, q, dt, out):
    from numba import cuda

    K = kernels("quant")
    shape = q.shape
    n = size(shape)
    acc = compute_dtype(dt)
    res, od = output(out, shape, dt)
    if n:
        o, c, i = _channels(shape, q.axis)
        sd, zd, _ = _device_params(q, acc, cuda)
        cfg = launch_dequantize(params, values, q, dt, out)
        K.dequantize_kernel(acc.type)[cfg["grid"], cfg["block"]](c_view(as_input(values), n), sd, zd,
                                                                 c_view(res, n), c, i)
    return deliver(res, od, out)


NOTES = "grid-stride elementwise kernels; float16 computed in float32; " + DEVICE_COPY_NOTE
register_cuda("quantize", "cuda-elementwise", _run_quantize, launch_quantize, kernels=("quant",), params=PARAMS,
              notes="per-channel range by block reductions (partials combined on the host, scales computed "
                    "there), then one elementwise pass; " + NOTES)
set_rule("quantize", "cuda", fixed_rule(("cuda-elementwise",), "one range pass (dynamic scales) and one elementwise pass"))
register_cuda("dequantize", "cuda-elementwise", _run_dequantize, launch_dequantize, kernels=("quant",),
              params=PARAMS, notes=NOTES)
set_rule("dequantize", "cuda", fixed_rule(("cuda-elementwise",), "one elementwise pass"))
