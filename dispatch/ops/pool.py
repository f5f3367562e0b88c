"""Public 2-D pooling (torch.nn.functional semantics, NCHW): max_pool2d, avg_pool2d,
adaptive_avg_pool2d.

x is (N, C, H, W) or (C, H, W) with H, W >= 1, float32 or float64 on the host (float16 too
on CUDA); the result has x's dtype and x's leading dimensions with (OH, OW) last.  Window
arguments are an int or a pair (height, width) (dispatch/ops/_spatial.pair); output sizes
are PyTorch's formula (_spatial.out_size, ceil_mode included: the last window must start
inside the input or the left padding).  As PyTorch: padding <= kernel_size // 2 on each
axis, a window larger than the padded input (an empty output) is an error, max pooling
treats padding as -inf and propagates NaN, average pooling's divisor is PyTorch's (see
avg_pool2d).  Every check raises naming the argument before anything is written.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from kernels_cpu import pool as K

from .. import validate as V
from ..registry import Call, Implementation, Op, Rule, bucket, register, register_op
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_rule
from ._spatial import out_size, pair

# Measured 2026-11-26 (Sapphire Rapids, 2 cores, the register-tiled kernels; describe + run,
# cpu-serial / cpu-parallel, medians of 7 interleaved rounds, back to back | after 0.2 s
# idle, float32, 1xCx56x56).  max_pool2d 3x3/2: C=16 (2^15.9 input + output elements) 40 /
# 49 | 48 / 58 us, C=32 (2^16.9) 56 / 60 | 56 / 57, C=64 (2^17.9) 99 / 87 | 104 / 93, C=256
# 448 / 289 | 554 / 333.  avg_pool2d 2x2/2: C=32 36 / 45 | 37 / 44, C=64 58 / 56 | 58 / 58,
# C=256 314 / 214 | 325 / 225.  The key counts input + output elements (about 5x the output
# for these strides); parallel from 2^17 of that, where both crossovers are.
PARALLEL_THRESHOLD = 1 << 17
# adaptive pooling with one output per row (global pooling: each window one contiguous run,
# a vector of planes at a time): serial until 2^18 input + output elements.  2026-12-06,
# Zen 4, 2 threads, dispatch calls, interleaved medians of 9 rounds back to back | medians of
# 12 single calls after 0.2 s idle (which this VM's wake-up dominates: a 10-element numpy
# add took 84 us there), serial / parallel: 1x2048x7x7 (2^16.6) 17.9 / 19.3 | 289 / 371 us,
# 2x (2^17.6) 27.8 / 25.0 | 344 / 378, 3x (2^18.2) 36.9 / 32.4 | 440 / 497, 4x (2^18.6)
# 66.5 / 46.2 | 492 / 481, 8x 104 / 70 | 704 / 557.  Tiling windows (VGG's 14 -> 7, run as
# an avg_pool) take PARALLEL_THRESHOLD.
WHOLE_ROWS_THRESHOLD = 1 << 18
_MEASURED = ("max / avg pooling parallel ahead from about 2^17 input + output elements, back to back and "
             "after idle (measured, 2 cores)")

_KERNELS = ("kernels_cpu.pool", "kernels_cpu.approx", "kernels_cpu.parallel")

# Inputs for warmup and the contract tests (dispatch/examples.py): NCHW images, which no
# shared input pattern has.  small: the serial side of the rule, odd sizes; large: 2^17
# input elements, past the threshold; decode: one image, many channels, small planes.
_SHAPES = {"small": {"x": (2, 3, 9, 11)}, "large": {"x": (2, 16, 64, 64)}, "decode": {"x": (1, 64, 8, 8)}}
EXAMPLE_SHAPES = {name: _SHAPES for name in ("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")}


class PoolKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int           # bucket of input + output elements (the serial/parallel rule)
    planes: int         # bucket of N * C
    window: int         # bucket of the window's element count (adaptive: of a bound on the largest)
    whole_rows: bool    # adaptive with one output per row: each window one contiguous run


class PoolArgs(NamedTuple):
    x: object                 # (N, C, H, W) or (C, H, W)
    kernel: tuple             # (kh, kw); None for adaptive_avg_pool2d
    stride: tuple             # (sh, sw); None for adaptive
    padding: tuple            # (ph, pw); None for adaptive
    dilation: tuple           # (dh, dw): (1, 1) for avg_pool2d; None for adaptive
    output: tuple             # (OH, OW)
    count_include_pad: bool   # avg_pool2d only (True elsewhere)
    divisor: int              # avg_pool2d's divisor_override, 0 when None
    out: object


def _image(x, out):
    """(device, dtype, leading dims, H, W) after the checks common to the three ops."""
    dev = V.device_of(x=x, out=out)
    dt = V.float_dtype("x", x)
    V.rank("x", x, (3, 4), " (N, C, H, W) or (C, H, W)")
    h, w = (int(s) for s in x.shape[-2:])
    if h < 1 or w < 1:
        raise ValueError(f"x must have H >= 1 and W >= 1 (its last two dimensions), got shape {tuple(x.shape)}")
    return dev, dt, tuple(int(s) for s in x.shape[:-2]), h, w


def _window_args(x, kernel_size, stride, padding, dilation, ceil_mode, out):
    dev, dt, lead, h, w = _image(x, out)
    k = pair("kernel_size", kernel_size, minimum=1)
    if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0):
        s = k
    else:
        s = pair("stride", stride, minimum=1)
    p = pair("padding", padding, minimum=0)
    d = pair("dilation", dilation, minimum=1)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ValueError(f"padding must be at most half of kernel_size on each axis (PyTorch's rule): got "
                         f"padding {p} for kernel_size {k}")
    ceil_mode = V.flag("ceil_mode", ceil_mode)
    o = (out_size(h, k[0], s[0], p[0], d[0], ceil_mode), out_size(w, k[1], s[1], p[1], d[1], ceil_mode))
    if o[0] < 1 or o[1] < 1:
        span = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
        raise ValueError(f"kernel_size {k} (dilated span {span}) is larger than the padded input "
                         f"({h + 2 * p[0]}, {w + 2 * p[1]}): the output would be empty")
    return dev, dt, lead, h, w, k, s, p, d, o


def _key(name, dev, dt, lead, h, w, o, window, whole_rows=False):
    planes = math.prod(lead)
    return PoolKey(name, dev, dt, bucket(planes * (h * w + o[0] * o[1])), bucket(planes), bucket(window),
                   whole_rows)


def _describe_max(x, kernel_size, stride=None, padding=0, dilation=1, *, ceil_mode=False, out=None):
    """Call.args = PoolArgs, key PoolKey."""
    dev, dt, lead, h, w, k, s, p, d, o = _window_args(x, kernel_size, stride, padding, dilation, ceil_mode, out)
    V.out(out, lead + o, dt, x=x)
    return Call(_key("max_pool2d", dev, dt, lead, h, w, o, k[0] * k[1]), PoolArgs(x, k, s, p, d, o, True, 0, out))


def _describe_avg(x, kernel_size, stride=None, padding=0, *, ceil_mode=False, count_include_pad=True,
                  divisor_override=None, out=None):
    """Call.args = PoolArgs (dilation (1, 1)), key PoolKey."""
    dev, dt, lead, h, w, k, s, p, d, o = _window_args(x, kernel_size, stride, padding, 1, ceil_mode, out)
    cip = V.flag("count_include_pad", count_include_pad)
    div = 0
    if divisor_override is not None:
        div = V.integer("divisor_override", divisor_override)
        if div < 1:
            raise ValueError(f"divisor_override must be a positive int or None, got {divisor_override!r}")
    V.out(out, lead + o, dt, x=x)
    return Call(_key("avg_pool2d", dev, dt, lead, h, w, o, k[0] * k[1]), PoolArgs(x, k, s, p, d, o, cip, div, out))


def _span(n, o):
    """The largest adaptive window along an axis of n with o outputs: n / o when the windows
    tile it, else at most ceil(n / o) + 1 (the bound: the key only needs its bucket)."""
    return n // o if n % o == 0 else -(-n // o) + 1


def _describe_adaptive(x, output_size, *, out=None):
    """Call.args = PoolArgs (window fields None), key PoolKey."""
    dev, dt, lead, h, w = _image(x, out)
    if isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        output_size = tuple(n if v is None else v for v, n in zip(output_size, (h, w)))  # None keeps that size
    o = pair("output_size", output_size, minimum=1)
    V.out(out, lead + o, dt, x=x)
    window = _span(h, o[0]) * _span(w, o[1])
    return Call(_key("adaptive_avg_pool2d", dev, dt, lead, h, w, o, window, o[1] == 1),
                PoolArgs(x, None, None, None, None, o, True, 0, out))


def _host(kind, kernel):
    def run(params, x, k, s, p, d, output, count_include_pad, divisor, out):
        lead = tuple(x.shape[:-2])
        h, w = x.shape[-2:]
        oh, ow = output
        res = result_buffer(out, lead + output, x.dtype)
        planes = math.prod(lead)
        if planes:
            xc = contiguous(x).reshape(planes, h * w)
            oc = res.view(np.ndarray).reshape(planes, oh * ow)
            if kind == "max":
                kernel(xc, oc, h, w, oh, ow, k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1])
            elif kind == "avg":
                kernel(xc, oc, h, w, oh, ow, k[0], k[1], s[0], s[1], p[0], p[1], count_include_pad, divisor)
            else:
                kernel(xc, oc, h, w, oh, ow)
        return deliver(res, out)

    return run


def _elements(call):
    a = call.args
    lead = math.prod(a.x.shape[:-2])
    return lead * math.prod(a.x.shape[-2:]), lead * a.output[0] * a.output[1]


def _flops_window(call):
    """One compare (max) or add (avg) per window element; avg adds a divide per output."""
    _, n_out = _elements(call)
    k = call.args.kernel
    return n_out * (k[0] * k[1] + (call.key.op == "avg_pool2d"))


def _flops_adaptive(call):
    n_in, n_out = _elements(call)
    return n_in + n_out  # windows tile the input (overlapping ones re-read a little more)


def _bytes(call):
    """x read once, out written once."""
    n_in, n_out = _elements(call)
    return (n_in + n_out) * call.key.dtype.itemsize


# Benchmark and example inputs -> the public call: the public defaults, kernel_size 3 when a
# case gives none (bench/cases always give the window; the examples use the default).
def _sig_max(i):
    return (i["x"], i.get("kernel_size", 3)), {"stride": i.get("stride"), "padding": i.get("padding", 0),
                                               "dilation": i.get("dilation", 1),
                                               "ceil_mode": i.get("ceil_mode", False)}


def _sig_avg(i):
    return (i["x"], i.get("kernel_size", 3)), {"stride": i.get("stride"), "padding": i.get("padding", 0),
                                               "ceil_mode": i.get("ceil_mode", False),
                                               "count_include_pad": i.get("count_include_pad", True),
                                               "divisor_override": i.get("divisor_override")}


def _sig_adaptive(i):
    return (i["x"], i.get("output_size", (7, 7))), {}


_RULE = serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)
_WHOLE_ROWS_RULE = serial_parallel_rule("size", WHOLE_ROWS_THRESHOLD, "adaptive pooling to one output per row: "
                                        "parallel ahead from about 2^18 input + output elements (measured, 2 cores)")


def _choose_adaptive(key):
    return (_WHOLE_ROWS_RULE if key.whole_rows else _RULE).choose(key)


def _register(name, kind, describe, signature, flops, serial, parallel):
    rule = Rule(_RULE.names, _choose_adaptive) if kind == "adaptive" else _RULE
    op = register_op(Op(name, describe, memo=True, family="pool", bound="memory", signature=signature, flops=flops,
                        bytes=_bytes, rules={"cpu": rule}))
    register(Implementation(name, "cpu-serial", "cpu", _host(kind, serial), kernel_modules=_KERNELS,
                            notes=HOST_COPY_NOTE + ("; max / avg: per plane, blocks of 7 rows x one vector pooled in "
                                                    "registers from the plane (column stride 1 or 2), else stride phases "
                                                    "of the padded plane and one vector loop per window tap; adaptive: "
                                                    "output rows in order, innermost loop along W")))
    register(Implementation(name, "cpu-parallel", "cpu", _host(kind, parallel), kernel_modules=_KERNELS,
                            notes=HOST_COPY_NOTE + "; as cpu-serial, blocks of planes (adaptive: of output rows) over threads"))
    return op


_max = _register("max_pool2d", "max", _describe_max, _sig_max, _flops_window, K.max_pool_serial, K.max_pool_parallel)
_avg = _register("avg_pool2d", "avg", _describe_avg, _sig_avg, _flops_window, K.avg_pool_serial, K.avg_pool_parallel)
_adaptive = _register("adaptive_avg_pool2d", "adaptive", _describe_adaptive, _sig_adaptive, _flops_adaptive,
                      K.adaptive_avg_pool_serial, K.adaptive_avg_pool_parallel)


@_max.expose
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, *, ceil_mode=False, out=None):
    """Max over each (dilated) kernel_size window of x (N, C, H, W) or (C, H, W), as
    torch.nn.functional.max_pool2d.

    kernel_size, stride, padding, dilation: int or (height, width); stride None (or []) is
    kernel_size.  Padding counts as -inf and must be at most kernel_size // 2 on each axis;
    a NaN in a window gives NaN.  ceil_mode: the output size rounds up (the last window
    must start inside the input or the left padding).  A window larger than the padded
    input is a ValueError naming kernel_size."""
    return _max(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode, out=out)


@_avg.expose
def avg_pool2d(x, kernel_size, stride=None, padding=0, *, ceil_mode=False, count_include_pad=True,
               divisor_override=None, out=None):
    """Mean over each kernel_size window of x (N, C, H, W) or (C, H, W), as
    torch.nn.functional.avg_pool2d, with PyTorch's divisor: for a window starting at
    hstart = oh * stride - padding, hend = min(hstart + kernel, H + padding) (W alike) and
    pool = (hend - hstart) * (wend - wstart) before clipping the window to the image; the
    divisor is pool with count_include_pad (zeros of the padding counted), else the number
    of image elements in the window; divisor_override (a positive int) replaces either."""
    return _avg(x, kernel_size, stride, padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                divisor_override=divisor_override, out=out)


@_adaptive.expose
def adaptive_avg_pool2d(x, output_size, *, out=None):
    """Mean pooling of x (N, C, H, W) or (C, H, W) to output_size (an int, or a pair whose
    None entry keeps that input size), as torch.nn.functional.adaptive_avg_pool2d: output
    i of n inputs to o outputs averages [floor(i * n / o), ceil((i + 1) * n / o)).
    output_size (1, 1) is global average pooling (a plane sum)."""
    return _adaptive(x, output_size, out=out)
