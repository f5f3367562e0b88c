"""CUDA implementations of layer_norm and rms_norm ("cuda-warp-row", "cuda-block-row"),
with the residual add fused (h = x + residual written in the same pass).

Shape rule (CUDA keys) as softmax's: D < BLOCK_MIN -> one warp per row, longer rows
one block per row (about 32 elements per thread, 32..1024 threads: softmax's ROW_BLOCK_PARAMS).
Either kernel holds the row in registers, read and written in 16-byte vectors (make_vec),
where D is a multiple of the vector and fits (row_launch); otherwise it streams (make).
"""
from __future__ import annotations

import numpy as np

from ..registry import set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, deliver, device_empty, dummy, kernels, output,
                      register_cuda, row_launch, row_vector, size, vec_width)
from .softmax import ROW_BLOCK_PARAMS, ROW_RULE, WARP_PARAMS


def _launch(family):
    def launch(params, x, weight, bias, residual, eps, out):
        d = x.shape[-1]
        vector = row_vector(d, x.dtype, x, weight, bias, residual, out)
        return row_launch(params, size(x.shape) // d if d else 0, d, family, vector)

    return launch


def _make_run(rms):
    def run(params, x, weight, bias, residual, eps, out):
        K = kernels("norm")

        dt = np.dtype(x.dtype)
        d = x.shape[-1]
        res, od = output(out, x.shape, dt)
        h = device_empty(tuple(x.shape), dt) if residual is not None else None
        if size(x.shape):
            rows = size(x.shape) // d
            xd = c_view(as_input(x), rows, d)
            rd = c_view(as_input(residual), rows, d) if residual is not None else xd
            hd = c_view(h, rows, d) if h is not None else xd
            w = as_input(weight) if weight is not None else dummy(dt)
            b = as_input(bias) if bias is not None else dummy(dt)
            cfg = _launch("rms_norm" if rms else "layer_norm")(params, x, weight, bias, residual, eps, out)
            acc = acc_dtype(dt)
            if "_vec_" in cfg["kernel"]:
                k = K.make_vec(params["mode"], rms, acc, vec_width(dt.itemsize))
            else:
                k = K.make(params["mode"], rms, acc)
            k[cfg["grid"], cfg["block"]](xd, rd, hd, w, b, float(eps), c_view(res, rows, d),
                                         weight is not None, bias is not None, residual is not None)
        y = deliver(res, od, out)
        return y if residual is None else (y, h)

    return run


for _op, _rms in (("layer_norm", False), ("rms_norm", True)):
    what = "sum of squares" if _rms else "mean, then squared deviations"
    register_cuda(_op, "cuda-warp-row", _make_run(_rms), _launch(_op), kernels=("norm",), params=WARP_PARAMS,
                  notes=f"one warp per row, {what} reduced by warp shuffles; residual add fused; " + DEVICE_COPY_NOTE)
    register_cuda(_op, "cuda-block-row", _make_run(_rms), _launch(_op), kernels=("norm",), params=ROW_BLOCK_PARAMS,
                  notes=f"one block per row, {what} reduced by warp shuffles + shared slots; residual add fused; " + DEVICE_COPY_NOTE)
    set_rule(_op, "cuda", ROW_RULE)  # the row-length rule of the softmax family (key.row_len is D)
