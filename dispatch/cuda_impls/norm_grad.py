"""CUDA implementation of layer_norm_backward and rms_norm_backward ("cuda-row-block"):
kernels_cuda/norm_grad.py's grad_rows (a block of 4 warps per group of ROWS_PER_BLOCK rows,
warp-per-row statistics and dx, then the group's partial dweight / dbias) and
reduce_blocks (the partials added in block order).  Deterministic: no atomics, the same
bits on every run of the same shape."""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, WARP_ROWS_THREADS

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, device_empty, dummy, kernels, props,
                      register_cuda, size)

ROWS_PER_BLOCK = 8  # kernels_cuda.norm_grad.ROWS_PER_BLOCK (that module loads numba.cuda: not imported here)
PARAMS = {"block": WARP_ROWS_THREADS}  # 4 warps, 2 rows each; not measured on a GPU


def _launch(family):
    def launch(params, grad_out, x, weight, bias, grad_residual, eps):
        d = x.shape[-1]
        rows = size(x.shape) // d if d else 0
        return {"kernel": f"{family}.grad_rows", "grid": max(1, cdiv(rows, ROWS_PER_BLOCK)), "block": params["block"],
                "rows_per_block": ROWS_PER_BLOCK, "device": props().name,
                "reduce": {"kernel": "norm_backward.reduce_blocks", "grid": max(1, cdiv(d, ELEMENTWISE_THREADS)),
                           "block": ELEMENTWISE_THREADS}}

    return launch


def _device_empty(shape, dtype):
    """Where the kernels' outputs and scratch come from (the tests poison them with NaN here)."""
    return device_empty(shape, dtype)


def _make_run(rms):
    family = "rms_norm_backward" if rms else "layer_norm_backward"

    def run(params, grad_out, x, weight, bias, grad_residual, eps):
        K = kernels("norm_grad")

        assert K.ROWS_PER_BLOCK == ROWS_PER_BLOCK
        dt = np.dtype(x.dtype)
        d = x.shape[-1]
        dx = _device_empty(tuple(x.shape), dt)
        dw = None if weight is None else _device_empty(d, dt)
        db = None if bias is None else _device_empty(d, dt)
        rows = size(x.shape) // d if d else 0
        if rows == 0:  # no rows: dweight / dbias are sums over nothing
            for t in (dw, db):
                if t is not None and d:
                    t.copy_to_device(np.zeros(d, dt))
            return (dx, dw) if rms else (dx, dw, db)
        if d:
            acc = acc_dtype(dt)
            cfg = _launch(family)(params, grad_out, x, weight, bias, grad_residual, eps)
            nb = cfg["grid"]
            xd = c_view(as_input(x), rows, d)
            god = c_view(as_input(grad_out), rows, d)
            grd = c_view(as_input(grad_residual), rows, d) if grad_residual is not None else xd
            w = as_input(weight) if weight is not None else dummy(dt)
            pw = _device_empty((nb, d), acc)
            pb = _device_empty((nb, d), acc) if not rms else pw  # not written by rms_norm
            K.make(rms, acc)[nb, cfg["block"]](god, xd, w, grd, float(eps), c_view(dx, rows, d), pw, pb,
                                                weight is not None, grad_residual is not None)
            red = K.reduce_kernel()
            if dw is not None:
                red[cfg["reduce"]["grid"], ELEMENTWISE_THREADS](pw, dw)
            if db is not None:
                red[cfg["reduce"]["grid"], ELEMENTWISE_THREADS](pb, db)
        return (dx, dw) if rms else (dx, dw, db)

    return run


for _op, _rms in (("layer_norm_backward", False), ("rms_norm_backward", True)):
    register_cuda(_op, "cuda-row-block", _make_run(_rms), _launch(_op), kernels=("norm_grad",), params=PARAMS,
                  notes="a block of 4 warps per 8 rows: warp-per-row statistics (recomputed from x) and dx, then "
                        "per-column partial dweight/dbias; partials reduced in block order (deterministic, no "
                        "atomics); " + DEVICE_COPY_NOTE)
    set_rule(_op, "cuda", fixed_rule(("cuda-row-block",), "the one CUDA implementation"))
