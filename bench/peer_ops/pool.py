"""Peers of the pooling ops (see bench/peer_ops/__init__.py for the tables).

Each peer reads the case's inputs through the op's own signature (dispatch's Op.signature),
so the window arguments and their defaults are the ones dispatch is called with.
- numpy: numpy.lib.stride_tricks.sliding_window_view over a padded copy (-inf for max,
  zeros for the sums, and a window sum of ones for count_include_pad=False); adaptive
  pooling a reshape-mean when the windows tile the image, else a loop over the windows.
- PyTorch: torch.nn.functional's functions, which take the same argument names.
- onnxruntime: MaxPool / AveragePool (pads, strides, dilations, ceil_mode,
  count_include_pad attributes) and GlobalAveragePool for an adaptive pool to 1x1; ONNX
  has no adaptive pooling to other sizes and no divisor override.
"""
from __future__ import annotations

import inspect

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from bench.peers import Unavailable


def _named(op, i):
    """x and the other arguments of op's public call for the inputs i, by name."""
    from dispatch import registry

    o = registry.OPS[op]
    args, kw = o.signature(i)
    named = dict(zip(inspect.signature(o.public).parameters, args))
    named.update(kw)
    return named.pop("x"), named


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _window(a):
    """(kernel, stride, padding, dilation) pairs, stride None / [] meaning kernel_size."""
    k = _pair(a["kernel_size"])
    s = a.get("stride")
    s = k if s is None or (isinstance(s, (tuple, list)) and not s) else _pair(s)
    return k, s, _pair(a.get("padding", 0)), _pair(a.get("dilation", 1))


def _osize(n, k, s, p, d, ceil_mode):
    from dispatch.ops._spatial import out_size

    return out_size(n, k, s, p, d, ceil_mode)


# ---- numpy -------------------------------------------------------------------------------------

def _windows(x, k, s, p, d, ceil_mode, fill):
    """Every pooling window of x padded with fill: (..., OH, OW, kh, kw)."""
    H, W = x.shape[-2:]
    o = (_osize(H, k[0], s[0], p[0], d[0], ceil_mode), _osize(W, k[1], s[1], p[1], d[1], ceil_mode))
    span = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
    # ceil_mode's last window may run past the right padding: pad that far with fill too
    extra = [max(0, (o[a] - 1) * s[a] + span[a] - (x.shape[-2 + a] + 2 * p[a])) for a in (0, 1)]
    pads = [(0, 0)] * (x.ndim - 2) + [(p[0], p[0] + extra[0]), (p[1], p[1] + extra[1])]
    xp = np.pad(x, pads, constant_values=fill)
    win = sliding_window_view(xp, span, axis=(-2, -1))[..., ::s[0], ::s[1], ::d[0], ::d[1]]
    return win[..., :o[0], :o[1], :, :]


def _np_max(i):
    x, a = _named("max_pool2d", i)
    k, s, p, d = _window(a)
    return _windows(x, k, s, p, d, a.get("ceil_mode", False), -np.inf).max(axis=(-2, -1))


def _np_avg(i):
    x, a = _named("avg_pool2d", i)
    k, s, p, _ = _window(a)
    ceil = a.get("ceil_mode", False)
    total = _windows(x, k, s, p, (1, 1), ceil, 0).sum(axis=(-2, -1))
    oh, ow = total.shape[-2:]
    if a.get("divisor_override") is not None:
        div = a["divisor_override"]
    elif a.get("count_include_pad", True):
        H, W = x.shape[-2:]
        hs, ws = np.arange(oh) * s[0] - p[0], np.arange(ow) * s[1] - p[1]
        div = np.outer(np.minimum(hs + k[0], H + p[0]) - hs, np.minimum(ws + k[1], W + p[1]) - ws)
    else:
        div = _windows(np.ones(x.shape[-2:], x.dtype), k, s, p, (1, 1), ceil, 0).sum(axis=(-2, -1))
    return (total / div).astype(x.dtype)


def _np_adaptive(i):
    x, a = _named("adaptive_avg_pool2d", i)
    H, W = x.shape[-2:]
    o = a["output_size"]
    oh, ow = (o, o) if not isinstance(o, (tuple, list)) else (H if o[0] is None else o[0], W if o[1] is None else o[1])
    if H % oh == 0 and W % ow == 0:
        return x.reshape(x.shape[:-2] + (oh, H // oh, ow, W // ow)).mean(axis=(-3, -1))
    y = np.empty(x.shape[:-2] + (oh, ow), x.dtype)
    for r in range(oh):
        h0, h1 = r * H // oh, -(-(r + 1) * H // oh)
        for c in range(ow):
            w0, w1 = c * W // ow, -(-(c + 1) * W // ow)
            y[..., r, c] = x[..., h0:h1, w0:w1].mean(axis=(-2, -1))
    return y


NUMPY = {"max_pool2d": _np_max, "avg_pool2d": _np_avg, "adaptive_avg_pool2d": _np_adaptive}


# ---- PyTorch -----------------------------------------------------------------------------------

def _torch(op):
    def run(t, torch):
        x, a = _named(op, t)
        return getattr(torch.nn.functional, op)(x, **a)

    return run


TORCH = {op: _torch(op) for op in NUMPY}


# ---- onnxruntime -------------------------------------------------------------------------------

def _ort_input(x):
    if x.ndim != 4:
        raise Unavailable("onnxruntime pooling takes (N, C, H, W) inputs only")
    return {"x": x}


def _ort_max(i, g):
    x, a = _named("max_pool2d", i)
    k, s, p, d = _window(a)
    y = g.op("MaxPool", "x", kernel_shape=list(k), strides=list(s), pads=[p[0], p[1], p[0], p[1]],
             dilations=list(d), ceil_mode=int(a.get("ceil_mode", False)))
    return _ort_input(x), y


def _ort_avg(i, g):
    x, a = _named("avg_pool2d", i)
    if a.get("divisor_override") is not None:
        raise Unavailable("onnxruntime AveragePool has no divisor override")
    k, s, p, _ = _window(a)
    cip = bool(a.get("count_include_pad", True))
    y = g.op("AveragePool", "x", kernel_shape=list(k), strides=list(s), pads=[p[0], p[1], p[0], p[1]],
             ceil_mode=int(a.get("ceil_mode", False)), count_include_pad=int(cip))
    return _ort_input(x), y


def _ort_adaptive(i, g):
    x, a = _named("adaptive_avg_pool2d", i)
    o = a["output_size"]
    o = (o, o) if not isinstance(o, (tuple, list)) else tuple(o)
    full = (x.shape[-2] if o[0] is None else o[0], x.shape[-1] if o[1] is None else o[1])
    if full != (1, 1):
        raise Unavailable(f"onnxruntime has no adaptive average pooling to {full} (GlobalAveragePool is 1x1 only)")
    return _ort_input(x), g.op("GlobalAveragePool", "x")


ORT = {"max_pool2d": _ort_max, "avg_pool2d": _ort_avg, "adaptive_avg_pool2d": _ort_adaptive}
