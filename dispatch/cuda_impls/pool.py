"""CUDA implementations of max_pool2d, avg_pool2d and adaptive_avg_pool2d ("cuda-direct":
one thread per output element, kernels_cuda/pool.py).

Launch rule: a block of up to 256 threads (8 warps; the device's limit under the
simulator), halved down to one warp while the output would give fewer blocks than SMs
(ResNet's global pool has one output per plane: 2,048), shaped (bx, by, bz) over
(OW, OH, planes): bx the power of two >= OW (at most
the block), by the power of two >= OH in what is left, bz the rest over the planes, so a
small image (7x7, or the 1x1 output of global pooling) still fills the block with planes
instead of idle threads, and consecutive threads write consecutive outputs (when bx > OW
a warp covers several rows, which are contiguous in memory too).  The grid covers the
output once, with y and z capped at 65,535 and the planes' dimension capped at WAVES full
waves of resident blocks: beyond that the kernels' grid-stride loops reuse the threads.
Not measured on a GPU (none lent to this work): the usual elementwise choices.
"""
from __future__ import annotations

import math

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, GRID_YZ_MAX

from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, as_input, c_view, cdiv, deliver, kernels, occupancy_blocks, output,
                      pow2_at_least, props, register_cuda)

PARAMS = {"block": ELEMENTWISE_THREADS, "waves": 4}
_KIND = {"max_pool2d": "max", "avg_pool2d": "avg", "adaptive_avg_pool2d": "adaptive_avg"}


def _launch(op):
    kind = _KIND[op]

    def launch(params, x, k, s, p, d, output_hw, count_include_pad, divisor, out):
        dev = props()
        planes = math.prod(int(v) for v in x.shape[:-2])
        oh, ow = output_hw
        threads = min(params["block"], dev.max_threads_per_block)
        outputs = planes * oh * ow
        while threads > 32 and cdiv(outputs, threads) < dev.sm_count:
            threads //= 2  # few outputs (a global pool's one per plane): more, smaller blocks
        bx = min(pow2_at_least(ow), threads)
        by = min(pow2_at_least(oh), threads // bx)
        bz = max(1, min(pow2_at_least(max(planes, 1)), threads // (bx * by)))
        gx = cdiv(ow, bx)
        gy = min(cdiv(oh, by), GRID_YZ_MAX)
        cap = dev.sm_count * occupancy_blocks(dev, bx * by * bz) * params["waves"]
        gz = max(1, min(cdiv(planes, bz), GRID_YZ_MAX, cdiv(cap, gx * gy)))
        return {"kernel": f"pool.{kind}", "grid": (gx, gy, gz), "block": (bx, by, bz),
                "outputs": outputs, "device": dev.name}

    return launch


def _run(op):
    kind = _KIND[op]
    launch = _launch(op)

    def run(params, x, k, s, p, d, output_hw, count_include_pad, divisor, out):
        K = kernels("pool")
        lead = tuple(int(v) for v in x.shape[:-2])
        h, w = (int(v) for v in x.shape[-2:])
        oh, ow = output_hw
        xd = as_input(x)  # a numba device array (its numpy dtype, whatever x's library)
        res, od = output(out, lead + (oh, ow), xd.dtype)
        planes = math.prod(lead)
        if planes:
            cfg = launch(params, x, k, s, p, d, output_hw, count_include_pad, divisor, out)
            xd = c_view(xd, planes, h, w)
            rd = c_view(res, planes, oh, ow)
            fn = K.kernel_for(kind, xd.dtype)[cfg["grid"], cfg["block"]]
            if kind == "max":
                fn(xd, rd, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1])
            elif kind == "avg":
                fn(xd, rd, k[0], k[1], s[0], s[1], p[0], p[1], bool(count_include_pad), divisor)
            else:
                fn(xd, rd)
        return deliver(res, od, out)

    return run


_NOTES = {
    "max_pool2d": "one thread per output element, the window's max (padding -inf, NaN propagated)",
    "avg_pool2d": "one thread per output element, the window's sum over PyTorch's divisor",
    "adaptive_avg_pool2d": "one thread per output element, the mean of its [floor(i*n/o), ceil((i+1)*n/o)) window",
}

for _op in _KIND:
    register_cuda(_op, "cuda-direct", _run(_op), _launch(_op), kernels=("pool",), params=PARAMS,
                  notes=_NOTES[_op] + "; float16 accumulates in float32; " + DEVICE_COPY_NOTE)
    set_rule(_op, "cuda", fixed_rule(("cuda-direct",), "one kernel (one thread per output element)"))
