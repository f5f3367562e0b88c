"""CUDA implementations of conv2d: "cuda-implicit-gemm" (kernels_cuda.conv.conv_kernel, the
tiled GEMM with the im2col operand gathered from the image, bias + activation fused) and
"cuda-depthwise" (one thread per output element) for groups == C.

Tile rule as the GEMM's (dispatch/cuda_impls/linalg.choose_tile): the largest tile whose
grid still gives every SM a block, float64 on the 32x32 tile only.  Not measured on a GPU.
The implicit GEMM's k -> (channel, tap) tables are built once per geometry and kept on the
device (a bounded cache; racing threads keep the first copy).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS

from ..registry import Rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, deliver, dummy, kernels, output,
                      pow2_at_least, props, register_cuda)
from .linalg import choose_tile

PARAMS = {"min_blocks_per_sm": 1}


def _dims(x, weight, groups, out_hw):
    n = x.shape[0] if len(x.shape) == 4 else 1
    return n, int(weight.shape[0]), groups, out_hw[0] * out_hw[1]


def launch(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
    n, cout, g, pix = _dims(x, weight, groups, out_hw)
    p = props()
    name, bm, bn, thr, smem = choose_tile(p, n * g, cout // g, pix, params["min_blocks_per_sm"], x.dtype)
    return {"kernel": f"conv.igemm_{name}", "tile": name, "grid": (cdiv(pix, bn) * cdiv(cout // g, bm) * n * g, 1, 1),
            "block": thr, "shared_bytes": smem, "device": p.name}


def depthwise_launch(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
    n, cout, _, pix = _dims(x, weight, groups, out_hw)
    # a plane's outputs per block, at most ELEMENTWISE_THREADS: a 7x7 plane takes 64
    # threads, not 256 of which 207 would idle (and the simulator runs each as a thread)
    block = min(ELEMENTWISE_THREADS, max(32, pow2_at_least(pix)))
    return {"kernel": "conv.depthwise", "grid": (n * cout * cdiv(pix, block), 1, 1), "block": block,
            "device": props().name}


_TABLES: OrderedDict = OrderedDict()
_TABLES_LOCK = threading.Lock()
TABLES_KEEP = 64  # geometries whose device tables are kept (a few KiB each)


def _tables(cin_g, kh, kw, dh, dw, h, w):
    key = (cin_g, kh, kw, dh, dw, h, w)
    with _TABLES_LOCK:
        hit = _TABLES.get(key)
        if hit is not None:
            _TABLES.move_to_end(key)
            return hit
    from numba import cuda

    dev = tuple(cuda.to_device(t) for t in kernels("conv").tap_tables(*key))
    with _TABLES_LOCK:
        hit = _TABLES.setdefault(key, dev)
        while len(_TABLES) > TABLES_KEEP:
            _TABLES.popitem(last=False)
    return hit


def _prepare(x, weight, bias, out, out_hw):
    dt = np.dtype(x.dtype)
    cout = int(weight.shape[0])
    out_shape = tuple(x.shape[:-3]) + (cout,) + tuple(out_hw)
    res, od = output(out, out_shape, dt)
    xd = as_input(x)
    x4 = c_view(xd, 1, *x.shape) if len(x.shape) == 3 else xd
    res4 = c_view(res, x4.shape[0], cout, *out_hw)
    bias_d = as_input(bias) if bias is not None else dummy(dt)
    return dt, res, od, x4, res4, bias_d


def _run(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
    dt, res, od, x4, res4, bias_d = _prepare(x, weight, bias, out, out_hw)
    if res4.size:
        n, c, h, w = x4.shape
        cout, cin_g, kh, kw = (int(s) for s in weight.shape)
        offs, dys, dxs = _tables(cin_g, kh, kw, dilation[0], dilation[1], h, w)
        cfg = launch(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed)
        k = kernels("conv").conv_kernel(acc_dtype(dt), cfg["tile"])
        k[cfg["grid"], cfg["block"]](c_view(x4, x4.size), c, h, w, c_view(as_input(weight), cout, cin_g * kh * kw),
                                     offs, dys, dxs, bias_d, res4, groups, stride[0], stride[1], pad[0], pad[1], act,
                                     bias is not None)
    return deliver(res, od, out)


def _run_depthwise(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
    dt, res, od, x4, res4, bias_d = _prepare(x, weight, bias, out, out_hw)
    if res4.size:
        cfg = depthwise_launch(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed)
        kernels("conv").depthwise_kernel(acc_dtype(dt))[cfg["grid"], cfg["block"]](
            x4, as_input(weight), bias_d, res4, stride[0], stride[1], pad[0], pad[1], dilation[0], dilation[1], act,
            bias is not None)
    return deliver(res, od, out)


def _no_host_panels(key):
    return ["the weight is a PackedWeight (host panels for the CPU kernels): pass the device weight"] \
        if key.prepacked else []


def _depthwise_only(key):
    return _no_host_panels(key) + ([] if key.kind == "depthwise" else
                                   [f"groups is not the channel count ({key.kind} convolution)"])


def _order(key):
    if key.kind == "depthwise":
        return (("cuda-depthwise", "cuda-implicit-gemm"),
                "depthwise: Cout_g = multiplier rows would leave a GEMM tile almost empty; one thread per output")
    return ("cuda-implicit-gemm",), f"{key.kind} convolution: the implicit GEMM (tile chosen per launch)"


register_cuda("conv2d", "cuda-implicit-gemm", _run, launch, kernels=("conv", "activation"), params=PARAMS,
              supports=_no_host_panels,
              notes="implicit GEMM: weight and gathered image tiles in shared memory (zeros for padding), "
                    "per-thread register tile, k -> tap offsets from a per-geometry device table (no division "
                    "in the K loop), bias + activation fused; " + DEVICE_COPY_NOTE)
register_cuda("conv2d", "cuda-depthwise", _run_depthwise, depthwise_launch, kernels=("conv", "activation"),
              supports=_depthwise_only,
              notes="one thread per output element over the taps of one input plane, coalesced along "
                    "output columns; bias + activation fused; " + DEVICE_COPY_NOTE)
set_rule("conv2d", "cuda", Rule(("cuda-depthwise", "cuda-implicit-gemm"), _order))
