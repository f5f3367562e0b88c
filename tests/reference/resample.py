"""float64 numpy reference for dispatch.interpolate, same signature (written from PyTorch's
formulas, one output index at a time, not from the kernels' tables).

The source coordinate of each output index follows torch.nn.functional.interpolate on
contiguous NCHW CPU tensors: nearest picks must be the same pixels, so their coordinates
are computed in PyTorch's arithmetic (float32 for float32 / float16 inputs, float64 for
float64; every floor is C's floorf, which rounds a float64 argument to float32 first).
The bilinear coordinates are computed in float64 for every dtype (the kernels, like PyTorch,
use float32 for float32 inputs: the tests allow for that difference) and the blend is
l0_h * (l0_w * x00 + l1_w * x01) + l1_h * (l0_w * x10 + l1_w * x11) in float64, both
weights multiplied even when zero, so NaN spreads to every output that reads it.
"""
import math

import numpy as np


def _floorf(v):
    return int(math.floor(float(np.float32(v))))


def _out_sizes(h, w, size, scale_factor, recompute_scale_factor):
    if size is not None:
        oh, ow = (size, size) if isinstance(size, int) else tuple(size)
        return (oh, ow), (None, None)
    sh, sw = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor, scale_factor)
    oh, ow = int(math.floor(h * float(sh))), int(math.floor(w * float(sw)))
    return (oh, ow), ((None, None) if recompute_scale_factor else (float(sh), float(sw)))


def nearest_source(dst, n_in, n_out, scale, exact, ctype):
    """PyTorch's source index of output index dst (ctype: np.float32 or np.float64)."""
    s = ctype(1.0 / scale) if scale is not None else ctype(n_in) / ctype(n_out)
    if exact:
        src = ctype(s * (ctype(dst) + ctype(0.5)) - ctype(0.5))
        src = max(src, ctype(0))
        i = _floorf(float(src) + 0.5)
    else:
        i = _floorf(ctype(s * ctype(dst)))
    return min(i, n_in - 1)


def linear_source(dst, n_in, n_out, align_corners, scale):
    """(i0, i1, l0, l1) in float64."""
    if n_in == n_out:
        return dst, dst, 1.0, 0.0
    if align_corners:
        s = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        src = s * dst
    else:
        s = 1.0 / scale if scale is not None else n_in / n_out
        src = max(s * (dst + 0.5) - 0.5, 0.0)
    i0 = min(int(math.floor(src)), n_in - 1)
    l1 = min(max(src - i0, 0.0), 1.0)
    i1 = i0 + 1 if i0 < n_in - 1 else i0
    return i0, i1, 1.0 - l1, l1


def interpolate(x, size=None, scale_factor=None, *, mode="nearest", align_corners=None, recompute_scale_factor=None,
                out=None):
    dt = np.asarray(x).dtype
    x = np.asarray(x, dtype=np.float64)
    n, c, h, w = x.shape
    (oh, ow), (sh, sw) = _out_sizes(h, w, size, scale_factor, recompute_scale_factor)
    if mode in ("nearest", "nearest-exact"):
        ctype = np.float64 if dt == np.float64 else np.float32
        exact = mode == "nearest-exact"
        rows = [nearest_source(i, h, oh, sh, exact, ctype) for i in range(oh)]
        cols = [nearest_source(j, w, ow, sw, exact, ctype) for j in range(ow)]
        return x[:, :, rows, :][:, :, :, cols]
    assert mode == "bilinear", mode
    ac = bool(align_corners)
    y0, y1, a0, a1 = (np.array(v) for v in zip(*[linear_source(i, h, oh, ac, sh) for i in range(oh)]))
    x0, x1, b0, b1 = (np.array(v) for v in zip(*[linear_source(j, w, ow, ac, sw) for j in range(ow)]))
    a0, a1 = a0[:, None], a1[:, None]
    with np.errstate(invalid="ignore"):  # inf * 0 = NaN, as PyTorch
        top = b0 * x[:, :, y0, :][:, :, :, x0] + b1 * x[:, :, y0, :][:, :, :, x1]
        bottom = b0 * x[:, :, y1, :][:, :, :, x0] + b1 * x[:, :, y1, :][:, :, :, x1]
        return a0 * top + a1 * bottom
