"""Peers of interpolate (see bench/peer_ops/__init__.py): numpy fancy indexing (bilinear with
per-axis index and weight tables), torch.nn.functional.interpolate, onnxruntime Resize
(opset 17, output sizes given: the scales the cases use are integers or sizes)."""
from __future__ import annotations

import math

import numpy as np


def _out_size(i):
    _, _, h, w = i["x"].shape
    if i.get("size") is not None:
        s = i["size"]
        return (s, s) if isinstance(s, int) else tuple(s)
    s = i["scale_factor"]
    sh, sw = s if isinstance(s, (tuple, list)) else (s, s)
    return math.floor(h * sh), math.floor(w * sw)


def _linear_axis(n_in, n_out, align):
    """(i0, i1, l1) per output index, the in / out scale (what a numpy user writes)."""
    d = np.arange(n_out, dtype=np.float64)
    if align:
        src = d * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    else:
        src = np.maximum((d + 0.5) * (n_in / n_out) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, np.clip(src - i0, 0.0, 1.0)


def _numpy(i):
    x = i["x"]
    _, _, h, w = x.shape
    oh, ow = _out_size(i)
    mode = i.get("mode", "nearest")
    if mode == "nearest":
        rows = np.minimum(np.floor(np.arange(oh) * (h / oh)).astype(np.int64), h - 1)
        cols = np.minimum(np.floor(np.arange(ow) * (w / ow)).astype(np.int64), w - 1)
        return x[:, :, rows[:, None], cols]
    if mode == "nearest-exact":
        rows = np.minimum(np.floor((np.arange(oh) + 0.5) * (h / oh)).astype(np.int64), h - 1)
        cols = np.minimum(np.floor((np.arange(ow) + 0.5) * (w / ow)).astype(np.int64), w - 1)
        return x[:, :, rows[:, None], cols]
    align = bool(i.get("align_corners"))
    y0, y1, ly = _linear_axis(h, oh, align)
    x0, x1, lx = _linear_axis(w, ow, align)
    ly = ly.astype(x.dtype)[:, None]
    lx = lx.astype(x.dtype)
    rows = x[:, :, y0, :] * (1 - ly) + x[:, :, y1, :] * ly
    return rows[:, :, :, x0] * (1 - lx) + rows[:, :, :, x1] * lx


def _torch(t, torch):
    kw = {"size": t.get("size"), "scale_factor": t.get("scale_factor"), "mode": t.get("mode", "nearest")}
    if kw["mode"] == "bilinear":
        kw["align_corners"] = bool(t.get("align_corners"))
    if kw["size"] is None and kw["scale_factor"] is None:
        kw["scale_factor"] = 2.0
    return torch.nn.functional.interpolate(t["x"], **kw)


def _ort(i, g):
    n, c, _, _ = i["x"].shape
    oh, ow = _out_size(i)
    sizes = g.const([n, c, oh, ow], np.int64)
    mode = i.get("mode", "nearest")
    if mode == "bilinear":
        ct = "align_corners" if i.get("align_corners") else "pytorch_half_pixel"
        y = g.op("Resize", "x", "", "", sizes, mode="linear", coordinate_transformation_mode=ct)
    elif mode == "nearest":
        y = g.op("Resize", "x", "", "", sizes, mode="nearest", coordinate_transformation_mode="asymmetric",
                 nearest_mode="floor")
    else:  # nearest-exact: floor((d + 0.5) * in / out) = round-half-up of the half-pixel coordinate
        y = g.op("Resize", "x", "", "", sizes, mode="nearest", coordinate_transformation_mode="half_pixel",
                 nearest_mode="round_prefer_ceil")
    return {"x": i["x"]}, y


NUMPY = {"interpolate": _numpy}
TORCH = {"interpolate": _torch}
ORT = {"interpolate": _ort}
