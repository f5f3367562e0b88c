"""float64 numpy references for dispatch.{max_pool2d, avg_pool2d, adaptive_avg_pool2d}, same
signatures (torch.nn.functional semantics), written from the definitions with one loop over
the output positions and numpy reductions over the window (all planes at once): no padded
copies, no sliding views, nothing shared with the kernels.

Window of output (oh, ow) along H (W alike):
  max_pool2d:  rows oh*s - p + i*d for i < k that fall inside [0, H)  (padding is -inf:
               an empty window gives -inf); the max propagates NaN (np.max does).
  avg_pool2d:  hstart = oh*s - p, hend = min(hstart + k, H + p), pool = (hend - hstart) x
               (wend - wstart) before clipping to [0, H); divisor = divisor_override, else
               pool (count_include_pad) or the clipped window's element count.
  adaptive:    [floor(i*n/o), ceil((i+1)*n/o)).
"""
import math

import numpy as np


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _osize(n, k, s, p, d, ceil_mode):
    # PyTorch's pooling_output_shape, written out
    num = n + 2 * p - d * (k - 1) - 1
    o = (num + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= n + p:
        o -= 1
    return o


def _x64(x):
    return np.asarray(x, dtype=np.float64)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, *, ceil_mode=False, out=None):
    x = _x64(x)
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(kernel_size if stride is None or (isinstance(stride, (tuple, list)) and not stride) else stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    H, W = x.shape[-2:]
    OH, OW = _osize(H, kh, sh, ph, dh, ceil_mode), _osize(W, kw, sw, pw, dw, ceil_mode)
    y = np.empty(x.shape[:-2] + (OH, OW))
    for oh in range(OH):
        rows = [oh * sh - ph + i * dh for i in range(kh)]
        rows = [r for r in rows if 0 <= r < H]
        for ow in range(OW):
            cols = [ow * sw - pw + j * dw for j in range(kw)]
            cols = [c for c in cols if 0 <= c < W]
            if not rows or not cols:
                y[..., oh, ow] = -np.inf
                continue
            win = x[..., rows, :][..., cols]
            y[..., oh, ow] = win.max(axis=(-2, -1))
    return y


def avg_pool2d(x, kernel_size, stride=None, padding=0, *, ceil_mode=False, count_include_pad=True,
               divisor_override=None, out=None):
    x = _x64(x)
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(kernel_size if stride is None or (isinstance(stride, (tuple, list)) and not stride) else stride)
    ph, pw = _pair(padding)
    H, W = x.shape[-2:]
    OH, OW = _osize(H, kh, sh, ph, 1, ceil_mode), _osize(W, kw, sw, pw, 1, ceil_mode)
    y = np.empty(x.shape[:-2] + (OH, OW))
    for oh in range(OH):
        hs = oh * sh - ph
        he = min(hs + kh, H + ph)
        for ow in range(OW):
            ws = ow * sw - pw
            we = min(ws + kw, W + pw)
            pool = (he - hs) * (we - ws)
            h0, h1, w0, w1 = max(hs, 0), min(he, H), max(ws, 0), min(we, W)
            total = x[..., h0:h1, w0:w1].sum(axis=(-2, -1))
            if divisor_override is not None:
                div = divisor_override
            elif count_include_pad:
                div = pool
            else:
                div = (h1 - h0) * (w1 - w0)
            y[..., oh, ow] = total / div
    return y


def adaptive_avg_pool2d(x, output_size, *, out=None):
    x = _x64(x)
    H, W = x.shape[-2:]
    if isinstance(output_size, (tuple, list)):
        OH, OW = (H if output_size[0] is None else int(output_size[0]),
                  W if output_size[1] is None else int(output_size[1]))
    else:
        OH = OW = int(output_size)
    y = np.empty(x.shape[:-2] + (OH, OW))
    for oh in range(OH):
        h0, h1 = math.floor(oh * H / OH), math.ceil((oh + 1) * H / OH)
        for ow in range(OW):
            w0, w1 = math.floor(ow * W / OW), math.ceil((ow + 1) * W / OW)
            y[..., oh, ow] = x[..., h0:h1, w0:w1].mean(axis=(-2, -1))
    return y
