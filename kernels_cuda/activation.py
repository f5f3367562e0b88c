"""Elementwise activations and gated linear units on flat contiguous device arrays.

Each thread handles VEC elements per step, VEC independent coalesced loads in flight
(element base + j*blockDim + threadIdx for j < VEC), over a grid-stride loop, so a grid
sized to fill the GPU once (the dispatcher's choice) covers any length.  float16 and
float32 inputs compute in float32, float64 in float64 (the kernel factory is keyed by
the accumulation type; numba specializes each kernel on the array dtypes).  The
activation code (kernels_common.activation.ACT_*) is a runtime argument; the branch is uniform
over the grid.  vec_kernel: the same with 16-byte vector loads and stores (float16, float32
arrays starting on a 16-byte boundary).
"""
import math
from functools import lru_cache

import numpy as np
from numba import cuda

from numba import types

from kernels_common.cuda_tiles import ELEMENTWISE_VEC_STEPS

from ._jit import ELEMENTWISE_THREADS, VEC_ROW_DTYPES, PtxBuild, acc_np, acc_of, arr, device, kernel
from .primitives import vec_io, vec_width

from kernels_common.activation import ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU, INV_SQRT2, SQRT_2_OVER_PI

VEC = 4  # the kernels below unroll exactly 4


@lru_cache(maxsize=None)
def act_fn(acc_np):
    """Device function act(x, code) in accumulation type acc_np (np.float32/np.float64)."""
    zero, one, half = acc_np(0.0), acc_np(1.0), acc_np(0.5)
    c2 = acc_np(2.0 * SQRT_2_OVER_PI)
    cg = acc_np(0.044715)
    inv_sqrt2 = acc_np(INV_SQRT2)
    # exp's argument is clamped where exp would overflow anyway (x / (1 + inf) = -0 then):
    # same result to within the type's smallest normals, and the CUDA simulator (Python's
    # math.exp raises OverflowError) computes what the GPU does.
    big = acc_np(88.0 if acc_np == np.float32 else 708.0)

    @device
    def act(x, code):
        if code == ACT_RELU:
            # a select, not max(): on a GPU numba's float max is fmax, which returns 0 for a
            # NaN (seen on an H200, 2026-11-26; the simulator's Python max kept the NaN)
            return zero if x < zero else x
        if code == ACT_SILU:
            return x / (one + math.exp(min(-x, big)))
        if code == ACT_GELU:
            return half * x * math.erfc(-x * inv_sqrt2)
        if code == ACT_GELU_TANH:
            u = c2 * (x + cg * x * x * x)
            return x / (one + math.exp(min(-u, big)))
        return x

    return act


@lru_cache(maxsize=None)
def unary_kernel(acc_np):
    """kernel(x, out, code): out = act(x), 1-D arrays of equal length."""
    acc, _ = acc_of(acc_np)
    act = act_fn(acc_np)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def unary(x, out, code):
        n = x.shape[0]
        tpb = cuda.blockDim.x
        step = cuda.gridDim.x * tpb * VEC
        base = cuda.blockIdx.x * tpb * VEC + cuda.threadIdx.x
        while base < n:
            if base + 3 * tpb < n:  # all four in range: four loads issued before any store
                a0, a1, a2, a3 = x[base], x[base + tpb], x[base + 2 * tpb], x[base + 3 * tpb]
                out[base] = act(acc(a0), code)
                out[base + tpb] = act(acc(a1), code)
                out[base + 2 * tpb] = act(acc(a2), code)
                out[base + 3 * tpb] = act(acc(a3), code)
            else:
                for j in range(VEC):
                    i = base + j * tpb
                    if i < n:
                        out[i] = act(acc(x[i]), code)
            base += step

    return unary


@lru_cache(maxsize=None)
def gated_kernel(acc_np):
    """kernel(gate, up, out, code): out = act(gate) * up (SwiGLU, GeGLU)."""
    acc, _ = acc_of(acc_np)
    act = act_fn(acc_np)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def gated(gate, up, out, code):
        n = gate.shape[0]
        tpb = cuda.blockDim.x
        step = cuda.gridDim.x * tpb * VEC
        base = cuda.blockIdx.x * tpb * VEC + cuda.threadIdx.x
        while base < n:
            if base + 3 * tpb < n:
                g0, g1, g2, g3 = gate[base], gate[base + tpb], gate[base + 2 * tpb], gate[base + 3 * tpb]
                u0, u1, u2, u3 = up[base], up[base + tpb], up[base + 2 * tpb], up[base + 3 * tpb]
                out[base] = act(acc(g0), code) * acc(u0)
                out[base + tpb] = act(acc(g1), code) * acc(u1)
                out[base + 2 * tpb] = act(acc(g2), code) * acc(u2)
                out[base + 3 * tpb] = act(acc(g3), code) * acc(u3)
            else:
                for j in range(VEC):
                    i = base + j * tpb
                    if i < n:
                        out[i] = act(acc(gate[i]), code) * acc(up[i])
            base += step

    return gated


@lru_cache(maxsize=None)
def vec_kernel(acc_np, vec, gated):
    """kernel(x, up, out, code): out = act(x) (* up when gated; up is ignored otherwise), as
    unary_kernel / gated_kernel with 16-byte loads and stores (primitives.vec_io): thread t
    of the grid takes vectors t and t + threads per step of a grid-stride loop (two loads in
    flight per input), the last n % vec elements one each.  x, up and out must start on a
    16-byte boundary (dispatch checks)."""
    acc, _ = acc_of(acc_np)
    act = act_fn(acc_np)
    load_vec, store_vec = vec_io(vec)
    U = ELEMENTWISE_VEC_STEPS  # vectors a thread has in flight per input
    UV = U * vec

    # 2 resident blocks per SM (up to 128 registers a thread): under the scalar kernels' 4
    # (64 registers) the gated float16 build spilled (ptxas sm_90: gelu's erfc, 16 values)
    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 2))
    def unary_vec(x, up, out, code):
        n = x.shape[0]
        nv = n // vec
        nt = cuda.gridDim.x * cuda.blockDim.x
        t = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        xs = cuda.local.array(UV, acc)
        us = cuda.local.array(UV, acc)
        for v0 in range(t, nv, nt * U):
            for k in range(U):
                if v0 + k * nt < nv:
                    load_vec(x, (v0 + k * nt) * vec, xs, k * vec)
                    if gated:
                        load_vec(up, (v0 + k * nt) * vec, us, k * vec)
            for k in range(U):
                if v0 + k * nt < nv:
                    for i in range(vec):
                        y = act(xs[k * vec + i], code)
                        xs[k * vec + i] = y * us[k * vec + i] if gated else y
                    store_vec(out, (v0 + k * nt) * vec, xs, k * vec)
        i = nv * vec + t
        if i < n:
            y = act(acc(x[i]), code)
            out[i] = y * acc(up[i]) if gated else y

    return unary_vec


def kernel_for(kind, dtype):
    acc_np = acc_of(dtype)[1]
    return (unary_kernel if kind == "unary" else gated_kernel)(acc_np)


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild("activation.unary", "activation", lambda dt: unary_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 1), arr(dt, 1), types.int64), threads=ELEMENTWISE_THREADS),
    PtxBuild("activation.gated", "activation", lambda dt: gated_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 1), arr(dt, 1), arr(dt, 1), types.int64), threads=ELEMENTWISE_THREADS),
    *(PtxBuild(f"activation.{kind}_vec", "activation",
               (lambda g: lambda dt: vec_kernel(acc_np(dt), vec_width(np.dtype(str(dt)).itemsize), g))(kind == "gated"),
               lambda dt: (arr(dt, 1), arr(dt, 1), arr(dt, 1), types.int64), threads=ELEMENTWISE_THREADS,
               dtypes=VEC_ROW_DTYPES)
      for kind in ("unary", "gated")),
]
