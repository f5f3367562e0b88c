"""CUDA implementation of interpolate ("cuda-gather"): one thread per output pixel.

Launch rule: blocks of up to ELEMENTWISE_THREADS (256) threads shaped (bx, by): bx along
the output width, the smallest power of two >= Wo up to 256 (a warp covers 32 consecutive
pixels of a row, or of 32 / bx consecutive rows of a narrow image: coalesced either way),
by = 256 / bx rows (fewer for short images); grid (Wo / bx, Ho / by, planes), y and z
capped at CUDA's 65,535 (the kernel strides over the rest).  Each thread reads its table
entries once and walks the planes.  Not measured on a GPU (none lent yet).

The per-axis index / weight tables are built (and cached) on the host by
dispatch.ops.resample and copied to the device on every call: two small host-to-device
copies (ints, and for bilinear weights) of 2 * (Ho + Wo) entries.  Computing the
coordinates on the device instead would need the same float32 rounding as PyTorch's host
code, which contraction into FMAs does not guarantee; a device-side cache of the tables
would have to be per CUDA context and bounded (not done: the copies are tiny).
"""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, GRID_YZ_MAX

from ..ops.resample import tables
from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, deliver, device_copy, dummy, kernels,
                      output, pow2_at_least, props, register_cuda)

PARAMS = {"block": ELEMENTWISE_THREADS}


def launch(params, x, size, mode, align_corners, scale, out):
    n, c, _, _ = (int(s) for s in x.shape)
    oh, ow = size
    block = params["block"]
    bx = min(block, pow2_at_least(ow))
    by = min(block // bx, pow2_at_least(oh))
    grid = (cdiv(ow, bx), min(cdiv(oh, by), GRID_YZ_MAX), max(1, min(n * c, GRID_YZ_MAX)))
    kind = "bilinear" if mode == "bilinear" else "nearest"
    return {"kernel": f"resample.{kind}", "grid": grid, "block": (bx, by), "output": (n, c, oh, ow),
            "device": props().name}


def _run(params, x, size, mode, align_corners, scale, out):
    K = kernels("resample")
    n, c, h, w = (int(s) for s in x.shape)
    oh, ow = size
    dt = np.dtype(x.dtype)
    res, od = output(out, (n, c, oh, ow), dt)
    if n * c:
        acc = acc_dtype(dt)
        th, tw = tables(x.shape, size, mode, align_corners, scale, acc)
        ti = device_copy(np.concatenate([th.i0, th.i1, tw.i0, tw.i1]))
        tl = device_copy(np.concatenate([th.l0, th.l1, tw.l0, tw.l1])) if mode == "bilinear" else dummy(acc)
        cfg = launch(params, x, size, mode, align_corners, scale, out)
        kind = "bilinear" if mode == "bilinear" else "nearest"
        K.make(kind, acc)[cfg["grid"], cfg["block"]](c_view(as_input(x), n * c, h, w), c_view(res, n * c, oh, ow),
                                                       ti, tl)
    return deliver(res, od, out)


register_cuda("interpolate", "cuda-gather", _run, launch, kernels=("resample",), params=PARAMS,
              notes="one thread per output pixel, per-axis source tables (host-built, PyTorch's coordinates) "
                    "read once per thread, planes walked by the z grid; float16 blended in float32; "
                    + DEVICE_COPY_NOTE)
set_rule("interpolate", "cuda", fixed_rule(("cuda-gather",), "one gather kernel per mode"))
