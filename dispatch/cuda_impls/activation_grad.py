"""CUDA implementations of relu/silu/gelu/swiglu/geglu_backward ("cuda-elementwise").

Launch rule as the forwards' (dispatch/cuda_impls/activation.py): blocks of 256 threads,
each thread VEC = 4 elements per step, the grid the blocks the array needs capped at one
full wave of resident blocks (the grid-stride loop covers the rest).
"""
from __future__ import annotations

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, as_input, c_view, cdiv, deliver, kernels, occupancy_blocks, output, props,
                      register_cuda, size)

VEC = 4
# Not measured on a GPU: the forwards' grid-stride choice.
PARAMS = {"block": ELEMENTWISE_THREADS, "vec": VEC, "waves": 1}


def _launch(kind):
    def launch(params, grad_out, *rest):
        n = size(grad_out.shape)
        p = props()
        block = params["block"]
        need = max(1, cdiv(n, block * VEC))
        cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
        return {"kernel": f"activation_grad.{kind}", "grid": min(need, cap), "block": block, "vec": VEC,
                "elements": n, "device": p.name}

    return launch


launch_unary, launch_gated = _launch("unary"), _launch("gated")


def _run_unary(params, grad_out, x, out, code):
    K = kernels("activation_grad")
    gd, xd = as_input(grad_out), as_input(x)
    res, od = output(out, x.shape, x.dtype)
    n = size(x.shape)
    if n:
        cfg = launch_unary(params, grad_out, x, out, code)
        K.kernel_for("unary", x.dtype)[cfg["grid"], cfg["block"]](c_view(gd, n), c_view(xd, n), c_view(res, n), code)
    return deliver(res, od, out)


def _run_gated(params, grad_out, gate, up, code):
    K = kernels("activation_grad")
    gd, ga, ud = as_input(grad_out), as_input(gate), as_input(up)
    dgate, _ = output(None, gate.shape, gate.dtype)
    dup, _ = output(None, gate.shape, gate.dtype)
    n = size(gate.shape)
    if n:
        cfg = launch_gated(params, grad_out, gate, up, code)
        K.kernel_for("gated", gate.dtype)[cfg["grid"], cfg["block"]](
            c_view(gd, n), c_view(ga, n), c_view(ud, n), c_view(dgate, n), c_view(dup, n), code)
    return dgate, dup


NOTES = ("grid-stride elementwise kernel, 4 elements per thread per step; float16/float32 computed in float32, "
         "float64 in float64; " + DEVICE_COPY_NOTE)

_RULE = fixed_rule(("cuda-elementwise",), "one elementwise kernel")
for _op in ("relu_backward", "silu_backward", "gelu_backward"):
    register_cuda(_op, "cuda-elementwise", _run_unary, launch_unary, kernels=("activation_grad",), notes=NOTES,
                  params=PARAMS)
    set_rule(_op, "cuda", _RULE)
for _op in ("swiglu_backward", "geglu_backward"):
    register_cuda(_op, "cuda-elementwise", _run_gated, launch_gated, kernels=("activation_grad",), notes=NOTES,
                  params=PARAMS)
    set_rule(_op, "cuda", _RULE)
