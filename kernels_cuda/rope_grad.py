"""Backward of rope on the GPU: dx = R^T grad_out, each pair (a, b) -> (a cos + b sin,
b cos - a sin), the inverse rotation: kernels_cuda/rope.py's kernel built with
inverse=True (same layout, launch and grid-stride walk).
"""
from numba import types

from ._jit import ELEMENTWISE_THREADS, PtxBuild, acc_np, arr
from .rope import rope_kernel


def rope_grad_kernel(acc_np):
    return rope_kernel(acc_np, True)


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild("rope_grad.pairs", "rope_grad", lambda dt: rope_grad_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 2), types.boolean), threads=ELEMENTWISE_THREADS),
]
