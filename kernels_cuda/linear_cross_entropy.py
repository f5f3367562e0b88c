"""The two elementwise updates of the chunked linear cross-entropy sweep on the GPU (the
GEMMs and the loss are the linear and cross_entropy_with_grad kernels): dst += src over the
dW / dbias accumulators, and dst *= s for the "mean" scaling.  Flat (n,) views, one
element per thread, grid-stride."""
from functools import lru_cache

from numba import cuda, types

from ._jit import ELEMENTWISE_THREADS, PtxBuild, arr, kernel


@lru_cache(maxsize=None)
def add_kernel():
    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def add_into(dst, src):
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < dst.shape[0]:
            dst[i] += src[i]
            i += step

    return add_into


@lru_cache(maxsize=None)
def scale_kernel():
    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def scale_by(dst, s):
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < dst.shape[0]:
            dst[i] *= s
            i += step

    return scale_by


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild("lce.add", "linear_cross_entropy", lambda dt: add_kernel(), lambda dt: (arr(dt, 1), arr(dt, 1)),
             threads=ELEMENTWISE_THREADS, dtypes=("float32", "float64")),
    PtxBuild("lce.scale", "linear_cross_entropy", lambda dt: scale_kernel(), lambda dt: (arr(dt, 1), dt),
             threads=ELEMENTWISE_THREADS, dtypes=("float32", "float64")),
]
