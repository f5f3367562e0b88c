"""Device-side copies between strided and C-contiguous arrays (what the run wrappers use
for non-contiguous device inputs and out=), without a trip through the host."""
import numpy as np
from numba import cuda

from ._jit import PtxBuild, arr, kernel


@kernel(launch_bounds=(256,))
def _copy1(src, dst):
    i = cuda.grid(1)
    if i < dst.shape[0]:
        dst[i] = src[i]


@kernel(launch_bounds=(256,))
def _copy2(src, dst):
    i = cuda.grid(1)
    n1 = dst.shape[1]
    if i < dst.shape[0] * n1:
        a, b = i // n1, i % n1
        dst[a, b] = src[a, b]


@kernel(launch_bounds=(256,))
def _copy3(src, dst):
    i = cuda.grid(1)
    n1, n2 = dst.shape[1], dst.shape[2]
    if i < dst.shape[0] * n1 * n2:
        a = i // (n1 * n2)
        r = i - a * (n1 * n2)
        dst[a, r // n2, r % n2] = src[a, r // n2, r % n2]


@kernel(launch_bounds=(256,))
def _copy4(src, dst):
    i = cuda.grid(1)
    n1, n2, n3 = dst.shape[1], dst.shape[2], dst.shape[3]
    if i < dst.shape[0] * n1 * n2 * n3:
        a = i // (n1 * n2 * n3)
        r = i - a * (n1 * n2 * n3)
        b = r // (n2 * n3)
        r = r - b * (n2 * n3)
        dst[a, b, r // n3, r % n3] = src[a, b, r // n3, r % n3]


_COPY = {1: _copy1, 2: _copy2, 3: _copy3, 4: _copy4}
BLOCK = 256  # threads per block of the copy kernels (not measured: no GPU yet)


def copy(src, dst):
    """dst[...] = src (same shape, any strides, up to 4 dimensions)."""
    n = 1
    for s in dst.shape:
        n *= s
    if n == 0:
        return dst
    nd = len(dst.shape)
    if nd == 0:
        src, dst, nd = src.reshape(1), dst.reshape(1), 1
    if nd > 4:
        raise ValueError(
            f"non-contiguous CUDA arrays of {nd} dimensions are not supported; "
            "pass a contiguous array (at most 4 dimensions may be strided)")
    _COPY[nd][(n + BLOCK - 1) // BLOCK, BLOCK](src, dst)
    return dst


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild(f"layout.copy{nd}", "layout", (lambda nd: lambda dt: _COPY[nd])(nd),
             (lambda nd: lambda dt: (arr(dt, nd, "A"), arr(dt, nd)))(nd), threads=BLOCK, dtypes=("float32",))
    for nd in sorted(_COPY)
]
