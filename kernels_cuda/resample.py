"""Nearest and bilinear resampling of image planes: one thread per output pixel.

x: (planes, H, W), out: (planes, Ho, Wo), C-contiguous device arrays (the N*C planes of an
NCHW array).  The launch is 3-D: threadIdx.x / blockIdx.x along Wo (consecutive threads
write consecutive pixels and read nearly consecutive ones: coalesced), y along Ho, z over
planes; the y and z loops stride by the grid, so any size fits the grid limits.  A thread
reads its source rows and columns (and weights) from the per-axis tables once and then
walks the planes: no division, no coordinate arithmetic on the device.

Tables (made on the host by dispatch.ops.resample, PyTorch's formulas in PyTorch's
arithmetic, copied to the device per call): ti int32 = [i0 of the Ho rows, i1 of the rows,
i0 of the Wo columns, i1 of the columns] and, for bilinear, tl (the accumulation type) =
[l0 rows, l1 rows, l0 columns, l1 columns]; nearest reads only the i0 parts.  bilinear
blends l0h * (l0w * x00 + l1w * x01) + l1h * (l0w * x10 + l1w * x11) in the accumulation
type (float32 for float16 and float32, float64 for float64), PyTorch's order; every weight
multiplies, zero included, so NaN spreads as in PyTorch.
"""
from functools import lru_cache

from numba import cuda, types

from ._jit import ELEMENTWISE_THREADS, PtxBuild, acc_np, acc_of, acc_type, arr, kernel


@lru_cache(maxsize=None)
def make(kind, acc_np):
    """The kernel for kind "nearest" / "bilinear" and accumulation type acc_np."""
    acc, _ = acc_of(acc_np)

    if kind == "nearest":
        @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
        def resample_nearest(x, out, ti, tl):
            planes, ho, wo = out.shape
            ox = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
            if ox >= wo:
                return
            ix = ti[2 * ho + ox]
            oy = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
            while oy < ho:
                iy = ti[oy]
                p = cuda.blockIdx.z
                while p < planes:
                    out[p, oy, ox] = x[p, iy, ix]
                    p += cuda.gridDim.z
                oy += cuda.gridDim.y * cuda.blockDim.y

        return resample_nearest

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def resample_bilinear(x, out, ti, tl):
        planes, ho, wo = out.shape
        ox = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if ox >= wo:
            return
        cw = 2 * ho
        x0 = ti[cw + ox]
        x1 = ti[cw + wo + ox]
        b0 = acc(tl[cw + ox])
        b1 = acc(tl[cw + wo + ox])
        oy = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        while oy < ho:
            y0 = ti[oy]
            y1 = ti[ho + oy]
            a0 = acc(tl[oy])
            a1 = acc(tl[ho + oy])
            p = cuda.blockIdx.z
            while p < planes:
                top = b0 * acc(x[p, y0, x0]) + b1 * acc(x[p, y0, x1])
                bottom = b0 * acc(x[p, y1, x0]) + b1 * acc(x[p, y1, x1])
                out[p, oy, ox] = a0 * top + a1 * bottom
                p += cuda.gridDim.z
            oy += cuda.gridDim.y * cuda.blockDim.y

    return resample_bilinear


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
def _args(dt):
    return (arr(dt, 3), arr(dt, 3), arr(types.int32, 1), arr(acc_type(dt), 1))


PTX = [
    PtxBuild(f"resample.{kind}", "resample", (lambda kind: lambda dt: make(kind, acc_np(dt)))(kind), _args,
             threads=ELEMENTWISE_THREADS)
    for kind in ("nearest", "bilinear")
]
