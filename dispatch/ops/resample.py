"""Public interpolate: nearest / nearest-exact / bilinear resampling of NCHW images, with
PyTorch's semantics (torch.nn.functional.interpolate) and numpy conventions (out=, dtype
preserved).

Where each output pixel reads from is decided here, on the host, once per call: per axis, a
small table of source indices (and, for bilinear, the two weights), computed with
PyTorch's CPU formulas in PyTorch's arithmetic (aten/src/ATen/native/UpSample.h):

- the scale of an axis is 1 / scale_factor when scale_factor is given and
  recompute_scale_factor is not True, else in / out (align_corners: (in - 1) / (out - 1),
  0 when out == 1);
- nearest:        src = min(floor(dst * scale), in - 1);
- nearest-exact:  src = min(floor(max((dst + 0.5) * scale - 0.5, 0) + 0.5), in - 1)
                  (= floor((dst + 0.5) * scale) up to rounding);
- bilinear:       src = max((dst + 0.5) * scale - 0.5, 0) (align_corners: dst * scale),
                  i0 = min(floor(src), in - 1), i1 = i0 + 1 capped at in - 1,
                  l1 = clamp(src - i0, 0, 1), l0 = 1 - l1; out == in copies (i1 = i0, l1 = 0);

all in the input's accumulation type (float32 for float32 / float16, float64 for float64:
PyTorch's opmath type), and every floor is C's floorf (a float64 coordinate is rounded to
float32 first), as PyTorch's contiguous-NCHW CPU kernels do (HelperInterpNearest /
HelperInterpNearestExact / HelperInterpLinear in UpSampleKernel.cpp; its channels-last and
CUDA kernels use a float32 scale and, on the CPU, integer shortcuts at out == in and
out == 2 in, and can pick other pixels at factors such as 1.2 or 2.01; PyTorch's CPU also
takes that path for contiguous outputs narrower than about 128 columns).  So nearest picks
exactly the pixels of PyTorch's contiguous-NCHW CPU kernels, on both devices and at every
size.  The kernels then do no division and no coordinate arithmetic at all.
Tables are cached per (in, out, mode, align_corners, scale, type) in a bounded lru_cache of
read-only arrays (thread-safe: lru_cache locks its bookkeeping and the arrays never change).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from kernels_common import acc_dtype
from kernels_cpu import resample as K

from .. import validate as V
from ..registry import Call, Implementation, Op, register, register_op
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_rule, size_bucket
from ._spatial import nchw, pair

MODES = ("nearest", "nearest-exact", "bilinear")

# Measured 2026-11-23 (AMD znver3, 2 cores; cpu-serial vs cpu-parallel, medians of 7
# alternating rounds, back to back and after 0.2 s idle, float32 2x upsampling of 1xCx32x32):
# the parallel kernels were never ahead at 2^11..2^18 output elements, nearest or bilinear
# (2^18 nearest: serial 141 / 565 us, parallel 215 / 768 us; bilinear 583 / 1145 vs
# 612 / 1340 us), and at the SD U-Net's 2^20.3 (1x320x64x64 -> 128x128) about even (2.70
# vs 2.56 ms).  Threads from 2^20 output elements.
# Re-measured on the thread team (parallel.row_run; the numbers above were numba's threads),
# forced serial / parallel through dispatch, 2x upsampling of 1xCx32x32 float32, Xeon with
# AVX-512, 2 vCPUs (2026-12-03), us, [loop | after 0.2 s idle | paced: 10 calls after 10
# ms]: nearest 2^18 output elements 37 / 30 | 518 / 576 | 59 / 70; 2^19 100 / 45 | 659 / 683 |
# 139 / 104; 2^20 219 / 148 | 940 / 888 | 269 / 172; 2^20.3 264 / 166 | 1018 / 887 | 317 /
# 219; bilinear 2^19 709 / 395 | 1112 / 966 | 684 / 396; 2^20 1234 / 671 | 1766 / 1261 |
# 1289 / 754.  Threads from 2^19 (2^18 is mixed).
PARALLEL_THRESHOLD = 1 << 19
_MEASURED = ("on the thread team parallel ahead from 2^19 output elements back to back and paced, even after "
             "idle; mixed at 2^18 (measured, 2 cores)")

_KERNELS = ("kernels_cpu.resample", "kernels_cpu.approx", "kernels_cpu.parallel")

# The contract tests, warmup and explain examples: an NCHW pattern no other op has.
EXAMPLE_SHAPES = {"interpolate": {"small": {"x": (2, 3, 5, 7)},
                                  "large": {"x": (2, 16, 40, 36)},
                                  "decode": {"x": (1, 3, 1, 1)}}}


class ResampleKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int            # bucket of the output's element count
    mode: str
    align_corners: bool


class ResampleArgs(NamedTuple):
    x: object            # (N, C, H, W)
    size: tuple          # (Ho, Wo), both >= 1
    mode: str            # one of MODES
    align_corners: bool  # bilinear only (False for the nearest modes)
    scale: tuple         # (sh, sw): the user's scale factors the index maths uses, or (None, None)
    out: object


def _scale_factors(scale_factor):
    if isinstance(scale_factor, (tuple, list)):
        if len(scale_factor) != 2:
            raise ValueError(f"scale_factor must be a positive number or a pair of them (height, width), "
                             f"got {scale_factor!r}")
        vals = scale_factor
    else:
        vals = (scale_factor, scale_factor)
    return tuple(V.finite("scale_factor", v, positive=True) for v in vals)


def _describe(x, size=None, scale_factor=None, *, mode="nearest", align_corners=None, recompute_scale_factor=None,
              out=None):
    """Call.args = ResampleArgs, key ResampleKey."""
    dev = V.device_of(x=x, out=out)
    dt = V.float_dtype("x", x)
    n, c, h, w = nchw("x", x)
    if h == 0 or w == 0:
        raise ValueError(f"x must have a non-empty image (H, W >= 1), got shape {tuple(x.shape)}")
    V.choice("mode", mode, MODES)
    if align_corners is not None:
        align_corners = V.flag("align_corners", align_corners)
        if mode != "bilinear":
            raise ValueError(f"align_corners can only be set with mode='bilinear', got align_corners={align_corners!r} "
                             f"with mode={mode!r} (leave it None)")
    align = bool(align_corners)
    if recompute_scale_factor is not None:
        recompute_scale_factor = V.flag("recompute_scale_factor", recompute_scale_factor)
    if (size is None) == (scale_factor is None):
        raise ValueError("exactly one of size and scale_factor must be given, got "
                         + ("both" if size is not None else "neither"))
    if size is not None:
        if recompute_scale_factor:
            raise ValueError("recompute_scale_factor=True is not meaningful with an explicit size "
                             "(it applies to scale_factor)")
        oh, ow = pair("size", size, minimum=1)
        scale = (None, None)
    else:
        sh, sw = _scale_factors(scale_factor)
        # floor(in * scale) in float64, as PyTorch (int() of the double product)
        ph, pw = h * sh, w * sw
        if max(ph, pw) >= 2.0**31:  # the tables hold int32 indices (and 1e308 * 7 is inf)
            raise ValueError(f"scale_factor={scale_factor!r} gives an output image of about {(ph, pw)}: "
                             "at most 2^31 - 1 per axis")
        oh, ow = math.floor(ph), math.floor(pw)
        if oh < 1 or ow < 1:
            raise ValueError(f"scale_factor={scale_factor!r} gives an empty output {(oh, ow)} for an input image of "
                             f"{(h, w)}: floor(in * scale_factor) must be >= 1")
        scale = (None, None) if recompute_scale_factor else (sh, sw)
    if max(oh, ow) > np.iinfo(np.int32).max:  # the tables hold int32 indices
        name = "size" if size is not None else "scale_factor"
        raise ValueError(f"{name} gives an output image of {(oh, ow)}: at most 2^31 - 1 per axis")
    oshape = (n, c, oh, ow)
    V.out(out, oshape, dt, x=x)
    key = ResampleKey("interpolate", dev, dt, size_bucket(*oshape), mode, align)
    return Call(key, ResampleArgs(x, (oh, ow), mode, align, scale, out))


# ---- the per-axis tables ---------------------------------------------------------------------

class AxisTable(NamedTuple):
    """Per output index along one axis: source indices i0, i1 (int32) and weights l0, l1 (the
    accumulation type; nearest: i1 == i0, l0 == 1, l1 == 0, unused by the kernels);
    doubles: the CPU 2x fast paths (out == 2 in): nearest, i0 == dst >> 1 for every dst;
    bilinear, half-pixel centres inside (dst = 2j + 1, 2j + 2 blend in j and j + 1 with
    weights 3/4, 1/4 and 1/4, 3/4; the edges may be anything)."""
    i0: np.ndarray
    i1: np.ndarray
    l0: np.ndarray
    l1: np.ndarray
    doubles: bool


def _floorf(src):
    """floorf(src): C's float floor, which rounds a double argument to float first."""
    return np.floor(src.astype(np.float32)).astype(np.int64)


def _nearest_index(n_in, n_out, scale, exact, acc):
    d = np.arange(n_out, dtype=np.int64).astype(acc)
    s = acc(1.0 / scale) if scale is not None else acc(n_in) / acc(n_out)
    if exact:
        src = np.maximum(s * (d + acc(0.5)) - acc(0.5), acc(0))
        idx = _floorf(src.astype(np.float64) + 0.5)
    else:
        idx = _floorf(s * d)
    return np.minimum(idx, n_in - 1)


def _linear_index(n_in, n_out, align, scale, acc):
    d = np.arange(n_out, dtype=np.int64)
    if n_out == n_in:
        return d, d, np.ones(n_out, acc), np.zeros(n_out, acc)
    if align:
        s = acc(n_in - 1) / acc(n_out - 1) if n_out > 1 else acc(0)
        src = s * d.astype(acc)
    else:
        s = acc(1.0 / scale) if scale is not None else acc(n_in) / acc(n_out)
        src = np.maximum(s * (d.astype(acc) + acc(0.5)) - acc(0.5), acc(0))
    i0 = np.minimum(_floorf(src), n_in - 1)
    l1 = np.clip(src - i0.astype(acc), acc(0), acc(1)).astype(acc)
    i1 = np.where(i0 < n_in - 1, i0 + 1, i0)
    return i0, i1, (acc(1) - l1).astype(acc), l1


@functools.lru_cache(maxsize=256)
def axis_table(n_in: int, n_out: int, mode: str, align: bool, scale, acc) -> AxisTable:
    """The (cached, read-only) table of one axis; acc: np.float32 or np.float64 (the weights'
    type and, for bilinear, the type of the coordinate arithmetic)."""
    if mode == "bilinear":
        i0, i1, l0, l1 = _linear_index(n_in, n_out, align, scale, acc)
    else:
        i0 = i1 = _nearest_index(n_in, n_out, scale, mode == "nearest-exact", acc)
        l0, l1 = np.ones(n_out, acc), np.zeros(n_out, acc)
    arrays = []
    for a in (i0.astype(np.int32), i1.astype(np.int32), l0, l1):
        a = np.ascontiguousarray(a)
        a.flags.writeable = False
        arrays.append(contiguous(a))  # a writeable-typed alias: one kernel specialization
    if mode == "bilinear":
        doubles = n_out == 2 * n_in and n_in >= 2 and _half_pixel_2x(i0, i1, l0, l1)
    else:
        doubles = n_out == 2 * n_in and bool(np.array_equal(i0, np.arange(n_out) >> 1))
    return AxisTable(*arrays, doubles)


def _half_pixel_2x(i0, i1, l0, l1) -> bool:
    """Whether a bilinear table's interior is the 2x half-pixel pattern (AxisTable.doubles)."""
    dst = np.arange(1, len(i0) - 1)
    j = (dst - 1) >> 1
    odd = (dst & 1) == 1
    return bool(np.array_equal(i0[1:-1], j) and np.array_equal(i1[1:-1], j + 1)
                and np.array_equal(l0[1:-1], np.where(odd, 0.75, 0.25))
                and np.array_equal(l1[1:-1], np.where(odd, 0.25, 0.75)))


def tables(x_shape, size, mode, align_corners, scale, acc):
    """(height table, width table) of a call (its ResampleArgs fields; acc: the weights' type)."""
    h, w = (int(s) for s in x_shape[2:])
    (oh, ow), (sh, sw) = size, scale
    return (axis_table(h, oh, mode, align_corners, sh, acc),
            axis_table(w, ow, mode, align_corners, sw, acc))


# ---- CPU implementations --------------------------------------------------------------------

def _host(parallel):
    nearest = K.nearest_parallel if parallel else K.nearest_serial
    bilinear = K.bilinear_parallel if parallel else K.bilinear_serial

    def run(params, x, size, mode, align_corners, scale, out):
        n, c, h, w = x.shape
        oh, ow = size
        dt = x.dtype
        oshape = (n, c, oh, ow)
        res = result_buffer(out, oshape, dt)
        planes = n * c
        if planes:
            xc = contiguous(x).reshape(planes * h, w)
            r2 = res.reshape(planes * oh, ow)
            th, tw = tables(x.shape, size, mode, align_corners, scale, acc_dtype(dt))
            if mode == "bilinear":
                bilinear(xc, r2, h, oh, th.i0, th.i1, th.l0, th.l1, tw.i0, tw.i1, tw.l0, tw.l1, tw.doubles)
            else:
                nearest(xc, r2, h, oh, th.i0, tw.i0, tw.doubles)
        return deliver(res, out)

    return run


def _flops(call):
    """bilinear: 6 per output element (4 multiplies, 2 adds: a row blend of input columns and
    a column blend, counted per output); nearest: 0 (a gather)."""
    n, c, _, _ = call.args.x.shape
    oh, ow = call.args.size
    return (6 if call.args.mode == "bilinear" else 0) * n * c * oh * ow


def _bytes(call):
    """The input read once, the output written once (tables are negligible)."""
    x = call.args.x
    n, c, _, _ = x.shape
    oh, ow = call.args.size
    return (int(np.prod(x.shape)) + n * c * oh * ow) * np.dtype(V.dtype_of(x)).itemsize


def _signature(i):
    size, sf = i.get("size"), i.get("scale_factor")
    if size is None and sf is None:
        sf = 2.0  # the example inputs (contract tests, warmup): the U-Net's 2x upsample
    return (i["x"],), {"size": size, "scale_factor": sf, "mode": i.get("mode", "nearest"),
                       "align_corners": i.get("align_corners"),
                       "recompute_scale_factor": i.get("recompute_scale_factor")}


_interpolate = register_op(Op("interpolate", _describe, family="resample", bound="memory", signature=_signature,
                              memo=True, flops=_flops, bytes=_bytes,
                              rules={"cpu": serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)},
                              variants={"bilinear": lambda a, k: (a, {**k, "mode": "bilinear"})}))
register(Implementation("interpolate", "cpu-serial", "cpu", _host(False), kernel_modules=_KERNELS,
                        notes="per output row: nearest gathers (2x: each input element written twice, repeated "
                              "rows copied), bilinear blends two input rows then gathers columns (2x: blends neighbour "
                              "pairs); " + HOST_COPY_NOTE))
register(Implementation("interpolate", "cpu-parallel", "cpu", _host(True), kernel_modules=_KERNELS,
                        notes="cpu-serial's kernels, blocks of output rows (over all planes) split over threads; "
                              + HOST_COPY_NOTE))


@_interpolate.expose
def interpolate(x, size=None, scale_factor=None, *, mode="nearest", align_corners=None, recompute_scale_factor=None,
                out=None):
    """Resample NCHW images as torch.nn.functional.interpolate: mode "nearest", "nearest-exact"
    or "bilinear".

    Exactly one of size (an int or a pair (Ho, Wo) of positive ints) and scale_factor (a
    finite positive number or a pair) is given; with scale_factor the output is
    floor(in * scale_factor) per axis (at least 1).  The source coordinates use
    1 / scale_factor unless recompute_scale_factor=True (then in / out, as with size).
    align_corners (bilinear only; None means False) maps the corner pixels' centres onto
    each other.  x: float32 or float64 on the host, also float16 on CUDA (blended in
    float32).  NaN in a source pixel gives NaN in every output that reads it (bilinear: with
    any weight, zero included, as PyTorch)."""
    return _interpolate(x, size, scale_factor, mode=mode, align_corners=align_corners,
                        recompute_scale_factor=recompute_scale_factor, out=out)
