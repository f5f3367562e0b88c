"""CUDA implementation of linear with a low-precision weight (dispatch/ops/weight_only.py):
"cuda-wo-gemv", kernels_cuda.weight_only's warp-per-output-row GEMV, the weight read once
per GEMV_MAX_M rows of x in 32-bit words and widened in registers.

Inputs: x float32 or float16 on the device; the weight a device array of float16 or
bfloat16 (its dtype named "bfloat16": dispatch.devices.to_device(w) copies an ml_dtypes
bfloat16 array w, whose dtype numba-cuda's own to_device cannot export) or
a QuantizedArray whose values are an int8 device array (its scales stay on the host; their
float32 device copy is made once per object, cached on it with the contiguous values).
The only CUDA implementation for such weights: many rows of x re-read the weight from L2
once per GEMV_MAX_M rows (no tiled low-precision GEMM yet).
"""
from __future__ import annotations

import math

import numpy as np

from kernels_common.cuda_tiles import GEMV_WARPS
from kernels_common.quant import WEIGHT_BF16, WEIGHT_F16, WEIGHT_FORMAT_NAMES, WEIGHT_INT8

from ..ops.weight_only import refuse_dense
from ..validate import is_bfloat16
from ..quantized import QuantizedArray
from ._common import (DEVICE_COPY_NOTE, as_input, c_view, cdiv, deliver, dummy, kernels, occupancy_blocks, output,
                      props, register_cuda)

PARAMS = {"waves": 2}  # grid capped at two waves of resident blocks (grid-stride over rows beyond)


def _weight(weight):
    """(fmt, words, w, scale_d, zp_d): the kernel's weight operand (uint32 words when K is a
    multiple of the word, else 16-bit / int8 elements) and the device scale / zero point."""
    from numba import cuda

    if isinstance(weight, QuantizedArray):
        n, k = weight.shape
        words = k % 4 == 0

        def make():
            v = as_input(weight.values)
            sc = np.ascontiguousarray(np.broadcast_to(weight.scale, (n,)), np.float32)
            zp = np.ascontiguousarray(np.broadcast_to(weight.zero_point, (n,)), np.float32)
            return (v.view(np.uint32) if words and k else v), cuda.to_device(sc), cuda.to_device(zp)
        w, sc, zp = weight.cached(("cuda-wo", n, k), make)
        return WEIGHT_INT8, words, w, sc, zp
    fmt = WEIGHT_BF16 if is_bfloat16(weight.dtype) else WEIGHT_F16
    n, k = weight.shape
    w = as_input(weight.view(np.uint16))  # the bits: the kernel widens them (K = 0: no words, act(bias))
    words = k % 2 == 0
    f32 = dummy(np.float32)
    return fmt, words, (w.view(np.uint32) if words and k else w), f32, f32


def _dims(x, weight):
    k = x.shape[-1]
    n = weight.shape[0]
    return math.prod(x.shape[:-1]), n, k


def launch(params, x, weight, bias, out, code, b_is_nk, packed=None):
    from kernels_cuda.weight_only import KERNEL_NAMES, rows_for

    m, n, k = _dims(x, weight)
    p = props()
    if isinstance(weight, QuantizedArray):
        fmt, words = WEIGHT_INT8, k % 4 == 0
    else:
        fmt, words = (WEIGHT_BF16 if is_bfloat16(weight.dtype) else WEIGHT_F16), k % 2 == 0
    block = 32 * GEMV_WARPS
    cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
    rows = rows_for(m)
    return {"kernel": KERNEL_NAMES[(fmt, words, rows)], "rows_per_pass": rows,
            "grid": max(1, min(cdiv(n, GEMV_WARPS), cap)), "block": block,
            "row_per": "warp", "weight": WEIGHT_FORMAT_NAMES[fmt],
            "weight_reads": max(1, cdiv(m, rows)), "device": p.name}


def _run(params, x, weight, bias, out, code, b_is_nk, packed=None):
    K = kernels("weight_only")
    m, n, k = _dims(x, weight)
    dt = np.dtype(x.dtype)
    res, od = output(out, tuple(x.shape[:-1]) + (n,), dt)
    if m and n:
        res2 = c_view(res, m, n)
        fmt, words, w, sc, zp = _weight(weight)
        x2 = c_view(as_input(x), m, k)
        bias_d = as_input(bias) if bias is not None else dummy(dt)
        cfg = launch(params, x, weight, bias, out, code, b_is_nk)
        K.wo_gemv_kernel(fmt, words, cfg["rows_per_pass"])[cfg["grid"], cfg["block"]](
            x2, w, sc, zp, bias_d, res2, code, bias is not None)
    return deliver(res, od, out)


NOTES = ("weight-only low precision (float16 / bfloat16 / int8 per-channel weights, float32 accumulation): one warp "
         "per output row, 32-bit words of 2 halves / 4 bytes widened in registers, up to 8 rows of x per weight read, "
         "int8 zero point subtracted exactly and the scale applied after the warp sum; bias + activation fused; "
         + DEVICE_COPY_NOTE)

register_cuda("linear", "cuda-wo-gemv", _run, launch, kernels=("weight_only", "activation"), notes=NOTES,
              params=PARAMS, dtypes=(np.dtype(np.float32), np.dtype(np.float16)), supports=refuse_dense)
