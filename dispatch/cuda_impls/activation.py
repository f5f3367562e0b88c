"""CUDA implementations of relu, silu, gelu, swiglu, geglu ("cuda-elementwise").

Launch rule: blocks of `block` threads (256: 8 warps, enough to hide latency with VEC=4
loads in flight per thread), each thread VEC elements per step; the grid is the number
of blocks the array needs, capped at one full wave of resident blocks (SM count x
blocks per SM), beyond which the grid-stride loop reuses the threads instead of paying
for more block launches.  float16 / float32 arrays that start on a 16-byte boundary use
the vector kernel (16-byte loads and stores, VEC_STEPS vectors a thread per step); the
launch's 'vector' entry says which, and why not.
"""
from __future__ import annotations

import numpy as np

from kernels_common.activation import ACT_GELU
from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, ELEMENTWISE_VEC_STEPS as VEC_STEPS

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, VEC_BYTES, acc_dtype, as_input, c_view, cdiv, deliver, kernels,
                      occupancy_blocks, output, props, register_cuda, size, vec_width, vector_width)

VEC = 4
VEC_REGS = 64   # the vector kernel's registers a thread, about (ptxas sm_80/90: 45-72): its one-wave grid
# The block and the one-wave grid are the usual grid-stride choices (not varied on a GPU); the
# vector kernel's gains are measured (cuda_tiles.ELEMENTWISE_VEC_STEPS).
PARAMS = {"block": ELEMENTWISE_THREADS, "vec": VEC, "waves": 1}


def launch(params, x, *rest):
    n = size(x.shape)
    p = props()
    block = params["block"]
    kind = "gated" if len(rest) == 3 else "unary"
    vec, why = vector_width(x.dtype, x, *rest[:-1])  # x (gate), up, out (unary: out)
    if vec and rest and rest[-1] == ACT_GELU:
        # the exact gelu's erfc is dozens of instructions an element: more threads of fewer
        # elements hide its chains better.  H200 GPU time, bert-base FFN 128 x 3072: the vector
        # kernel 4.2 us float16 / 3.7 float32 (bench/gpu_results/2026-11-27b-h200/call2), the
        # scalar one 3.3 / 3.6 (2026-11-26c-h200); relu 2.5 against 2.7, swiglu 5.0 against 6.0.
        vec, why = 0, "the exact gelu (erfc) is compute-bound: the scalar kernel's 4 elements a thread ran faster"
    if vec:  # 16-byte loads, VEC_STEPS vectors a thread per step (kernels_cuda.activation.vec_kernel)
        need = max(1, cdiv(cdiv(n, vec), block * VEC_STEPS))
        cap = p.sm_count * occupancy_blocks(p, block, regs=VEC_REGS) * params["waves"]
        return {"kernel": f"activation.{kind}_vec", "grid": min(need, cap), "block": block,
                "vector": f"{vec} elements ({VEC_BYTES} bytes)", "elements": n, "device": p.name}
    need = max(1, cdiv(n, block * VEC))
    cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
    return {"kernel": f"activation.{kind}", "grid": min(need, cap), "block": block, "vec": VEC,
            "vector": f"none: {why}", "elements": n, "device": p.name}


def _run_unary(params, x, out, code):
    K = kernels("activation")
    xd = as_input(x)
    res, od = output(out, x.shape, x.dtype)
    n = size(x.shape)
    if n:
        cfg = launch(params, x, out, code)
        if cfg["kernel"].endswith("_vec"):
            k = K.vec_kernel(acc_dtype(x.dtype), vec_width(np.dtype(x.dtype).itemsize), False)
            k[cfg["grid"], cfg["block"]](c_view(xd, n), c_view(xd, n), c_view(res, n), code)
        else:
            K.kernel_for("unary", x.dtype)[cfg["grid"], cfg["block"]](c_view(xd, n), c_view(res, n), code)
    return deliver(res, od, out)


def _run_gated(params, gate, up, out, code):
    K = kernels("activation")
    gd, ud = as_input(gate), as_input(up)
    res, od = output(out, gate.shape, gate.dtype)
    n = size(gate.shape)
    if n:
        cfg = launch(params, gate, up, out, code)
        if cfg["kernel"].endswith("_vec"):
            k = K.vec_kernel(acc_dtype(gate.dtype), vec_width(np.dtype(gate.dtype).itemsize), True)
        else:
            k = K.kernel_for("gated", gate.dtype)
        k[cfg["grid"], cfg["block"]](c_view(gd, n), c_view(ud, n), c_view(res, n), code)
    return deliver(res, od, out)


NOTES = ("grid-stride elementwise kernel, 4 coalesced loads in flight per thread; float16/float32 "
         "computed in float32, float64 in float64; " + DEVICE_COPY_NOTE)

_RULE = fixed_rule(("cuda-elementwise",), "one elementwise kernel")
for _op in ("relu", "silu", "gelu"):
    register_cuda(_op, "cuda-elementwise", _run_unary, launch, kernels=("activation",), notes=NOTES, params=PARAMS)
    set_rule(_op, "cuda", _RULE)
for _op in ("swiglu", "geglu"):
    register_cuda(_op, "cuda-elementwise", _run_gated, launch, kernels=("activation",), notes=NOTES, params=PARAMS)
    set_rule(_op, "cuda", _RULE)
