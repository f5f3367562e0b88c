"""2-D pooling on C-contiguous (P, H, W) device arrays (P = N*C planes), writing (P, OH, OW).

One thread per output element over a 3-D grid: x along OW (consecutive threads write
consecutive outputs and read neighbouring inputs: coalesced), y along OH, z along the
planes, each a grid-stride loop, so a grid capped by the dispatcher (y and z at 65,535 blocks,
the planes' z also at a few waves of resident blocks) still covers any shape.  The thread's (plane, row, column) come from
the grid directly: no index division.  Window sizes, strides, paddings and dilations are
runtime integers; the kernel factory is keyed by the accumulation type only (numba
specializes each kernel on the array dtypes).  float16 and float32 inputs compute in
float32, float64 in float64.

- max: the window's elements inside the image (padding is -inf), NaN-propagating as
  PyTorch: m = v when v > m or v is NaN (no fastmath on the GPU: the test stays).
- avg: the sum over the clipped window divided by PyTorch's divisor (divisor > 0: the
  override; else the padded pool size, hend = min(hstart + k, H + p), with
  count_include_pad, or the clipped window's element count).
- adaptive avg: window [floor(i*n/o), ceil((i+1)*n/o)) on each axis: four integer divisions
  per output element, of small nonnegative values (NVPTX's bypass of slow division runs them
  as 32-bit divides); a table of window bounds would need a host-to-device copy per call.
"""
import math
from functools import lru_cache

from numba import cuda, types

from ._jit import ELEMENTWISE_THREADS, PtxBuild, acc_np, acc_of, arr, kernel

KINDS = ("max", "avg", "adaptive_avg")


@lru_cache(maxsize=None)
def make(kind, acc_np):
    """The kernel of kind "max" / "avg" / "adaptive_avg" accumulating in acc_np."""
    acc, _ = acc_of(acc_np)
    zero = acc_np(0.0)
    ninf = acc_np(-math.inf)

    if kind == "max":
        @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
        def max_pool(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
            planes, h, w = x.shape
            _, oh_n, ow_n = out.shape
            ox0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
            oy0 = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
            p = cuda.blockIdx.z * cuda.blockDim.z + cuda.threadIdx.z
            step_x = cuda.gridDim.x * cuda.blockDim.x
            step_y = cuda.gridDim.y * cuda.blockDim.y
            step_p = cuda.gridDim.z * cuda.blockDim.z
            while p < planes:
                oy = oy0
                while oy < oh_n:
                    y0 = oy * sh - ph
                    ox = ox0
                    while ox < ow_n:
                        x0 = ox * sw - pw
                        m = ninf
                        for i in range(kh):
                            iy = y0 + i * dh
                            if iy >= 0 and iy < h:
                                for j in range(kw):
                                    ix = x0 + j * dw
                                    if ix >= 0 and ix < w:
                                        v = acc(x[p, iy, ix])
                                        if v > m or v != v:
                                            m = v
                        out[p, oy, ox] = m
                        ox += step_x
                    oy += step_y
                p += step_p

        return max_pool

    if kind == "avg":
        @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
        def avg_pool(x, out, kh, kw, sh, sw, ph, pw, count_include_pad, divisor):
            planes, h, w = x.shape
            _, oh_n, ow_n = out.shape
            ox0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
            oy0 = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
            p = cuda.blockIdx.z * cuda.blockDim.z + cuda.threadIdx.z
            step_x = cuda.gridDim.x * cuda.blockDim.x
            step_y = cuda.gridDim.y * cuda.blockDim.y
            step_p = cuda.gridDim.z * cuda.blockDim.z
            while p < planes:
                oy = oy0
                while oy < oh_n:
                    y0 = oy * sh - ph
                    y1 = min(y0 + kh, h + ph)
                    ys = max(y0, 0)
                    ye = min(y1, h)
                    ox = ox0
                    while ox < ow_n:
                        x0 = ox * sw - pw
                        x1 = min(x0 + kw, w + pw)
                        xs = max(x0, 0)
                        xe = min(x1, w)
                        s = zero
                        for i in range(kh):  # as max: a bounds test per element (no unrolled tails)
                            iy = y0 + i
                            if iy >= 0 and iy < h:
                                for j in range(kw):
                                    ix = x0 + j
                                    if ix >= 0 and ix < w:
                                        s += acc(x[p, iy, ix])
                        if divisor > 0:
                            d = divisor
                        elif count_include_pad:
                            d = (y1 - y0) * (x1 - x0)
                        else:
                            d = (ye - ys) * (xe - xs)
                        out[p, oy, ox] = s / acc(d)
                        ox += step_x
                    oy += step_y
                p += step_p

        return avg_pool

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def adaptive_avg_pool(x, out):
        planes, h, w = x.shape
        _, oh_n, ow_n = out.shape
        ox0 = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        oy0 = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        p = cuda.blockIdx.z * cuda.blockDim.z + cuda.threadIdx.z
        step_x = cuda.gridDim.x * cuda.blockDim.x
        step_y = cuda.gridDim.y * cuda.blockDim.y
        step_p = cuda.gridDim.z * cuda.blockDim.z
        while p < planes:
            oy = oy0
            while oy < oh_n:
                ys = (oy * h) // oh_n
                ye = ((oy + 1) * h + oh_n - 1) // oh_n
                ox = ox0
                while ox < ow_n:
                    xs = (ox * w) // ow_n
                    xe = ((ox + 1) * w + ow_n - 1) // ow_n
                    s = zero
                    for iy in range(ys, ye):
                        for ix in range(xs, xe):
                            s += acc(x[p, iy, ix])
                    out[p, oy, ox] = s / acc((ye - ys) * (xe - xs))
                    ox += step_x
                oy += step_y
            p += step_p

    return adaptive_avg_pool


def kernel_for(kind, dtype):
    return make(kind, acc_of(dtype)[1])


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
_I = types.int64


def _args(kind):
    def argtypes(dt):
        base = (arr(dt, 3), arr(dt, 3))
        if kind == "max":
            return base + (_I,) * 8
        if kind == "avg":
            return base + (_I,) * 6 + (types.boolean, _I)
        return base

    return argtypes


PTX = [PtxBuild(f"pool.{kind}", "pool", (lambda kind: lambda dt: make(kind, acc_np(dt)))(kind), _args(kind),
                threads=ELEMENTWISE_THREADS) for kind in KINDS]
