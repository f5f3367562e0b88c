"""CUDA implementations of causal_conv1d ("cuda-rows": one thread per output) and
causal_conv1d_update ("cuda-rows": one thread per (batch, dim) row).

causal_conv1d launch: blocks of up to ELEMENTWISE_THREADS (256) threads along the time
axis (the power of two >= max(L, W - 1), at least a warp), grid (time tiles, rows) with
the rows capped at CUDA's 65,535 (the kernel strides over the rest): Mamba's dim 1536 x
L 1024 is 4 x 1536 blocks.  The update: UPDATE_BLOCK-thread blocks over the rows.  Neither
is measured on a GPU (none lent yet).
"""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, GRID_YZ_MAX

from .. import devices
from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, deliver, device_empty, dummy, kernels,
                      output, pow2_at_least, props, register_cuda)

PARAMS = {"block": ELEMENTWISE_THREADS}
# A decode step has few rows (1536 to 4096 at batch 1) and a thread does a few loads per
# row: 64-thread blocks spread them over 24 to 64 SMs where 256-thread ones would occupy
# 6 to 16 of an H100's 132 (the CUDA model's grid fill); batch 16 still gives 384+ blocks.
UPDATE_PARAMS = {"block": 64}


def _block(params, n):
    return min(params["block"], max(32, pow2_at_least(n)))


def launch(params, x, weight, bias, initial_state, code, final, out):
    b, d, n = (int(s) for s in x.shape)
    cols = max(n, int(weight.shape[1]) - 1)
    block = _block(params, cols)
    return {"kernel": "causal_conv.conv_rows", "grid": (max(1, cdiv(cols, block)), max(1, min(b * d, GRID_YZ_MAX))),
            "block": block, "device": props().name}


def _run(params, x, weight, bias, initial_state, code, final, out):
    K = kernels("causal_conv")
    b, d, n = (int(s) for s in x.shape)
    h = int(weight.shape[1]) - 1
    rows = b * d
    dt = np.dtype(x.dtype)
    res, od = output(out, (b, d, n), dt)
    fin = device_empty((b, d, h), dt)
    if rows and max(n, h):
        cfg = launch(params, x, weight, bias, initial_state, code, final, out)
        init = c_view(dummy(dt), 1, 1) if initial_state is None else c_view(as_input(initial_state), rows, h)
        bvec = dummy(dt) if bias is None else as_input(bias)
        K.conv_kernel(acc_dtype(dt))[cfg["grid"], cfg["block"]](
            c_view(as_input(x), rows, n), as_input(weight), bvec, init, c_view(res, rows, n), c_view(fin, rows, h),
            bias is not None, initial_state is not None, code)
    y = deliver(res, od, out)
    return (y, fin) if final else y


def update_launch(params, conv_state, x, weight, bias, code, out):
    rows = int(conv_state.shape[0]) * int(conv_state.shape[1])
    block = _block(params, rows)
    return {"kernel": "causal_conv.update_rows", "grid": max(1, cdiv(rows, block)), "block": block,
            "device": props().name}


def _run_update(params, conv_state, x, weight, bias, code, out):
    K = kernels("causal_conv")
    b, d, slen = (int(s) for s in conv_state.shape)
    rows = b * d
    n = int(x.shape[2]) if x.ndim == 3 else 1
    dt = np.dtype(x.dtype)
    res, od = output(out, tuple(x.shape), dt)
    if rows:
        cfg = update_launch(params, conv_state, x, weight, bias, code, out)
        sd = devices.as_device(conv_state)
        lay = kernels("layout")
        state = sd if sd.is_c_contiguous() else lay.contiguous(sd)  # a strided view: updated through a copy
        bvec = dummy(dt) if bias is None else as_input(bias)
        K.update_kernel(acc_dtype(dt))[cfg["grid"], cfg["block"]](
            c_view(state, rows, slen), c_view(as_input(x), rows, n), as_input(weight), bvec, c_view(res, rows, n),
            bias is not None, code)
        if state is not sd:
            lay.copy(state, sd)
    return deliver(res, od, out)


register_cuda("causal_conv1d", "cuda-rows", _run, launch, kernels=("causal_conv", "activation"), params=PARAMS,
              notes="one thread per output, the W taps read from x (initial state before time 0), bias + SiLU "
                    "fused; float16 computed in float32; " + DEVICE_COPY_NOTE)
set_rule("causal_conv1d", "cuda", fixed_rule(("cuda-rows",), "one kernel: a thread per output"))

register_cuda("causal_conv1d_update", "cuda-rows", _run_update, update_launch, kernels=("causal_conv", "activation"),
              params=UPDATE_PARAMS,
              notes="one thread per (batch, dim) row: outputs, then the state shifted in place; " + DEVICE_COPY_NOTE)
set_rule("causal_conv1d_update", "cuda", fixed_rule(("cuda-rows",), "one kernel: a thread per row"))
