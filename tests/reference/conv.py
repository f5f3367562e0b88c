"""float64 numpy reference for dispatch.conv2d, same signature (written from the definition:
a sum over kernel taps of strided slices of the zero-padded input, no im2col)."""
import math

import numpy as np

_ACT = {
    None: lambda y: y,
    "relu": lambda y: np.maximum(y, 0),
    "silu": lambda y: y / (1 + np.exp(-y)),
    "gelu": lambda y: 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2))) if y.size else y,
    "gelu_tanh": lambda y: 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3))),
}


def _pair(v):
    return (v, v) if isinstance(v, (int, np.integer)) else tuple(int(u) for u in v)


def conv2d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, activation=None, out=None):
    x = np.asarray(x, np.float64)
    w = np.asarray(getattr(weight, "weight", weight), np.float64)
    unbatched = x.ndim == 3
    if unbatched:
        x = x[None]
    n, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    if padding == "valid":
        pt = pb = pl = pr = 0
    elif padding == "same":
        th, tw = dh * (kh - 1), dw * (kw - 1)
        pt, pl = th // 2, tw // 2
        pb, pr = th - pt, tw - pl
    else:
        pt, pl = _pair(padding)
        pb, pr = pt, pl
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, cout, oh, ow))
    cout_g = cout // groups
    for g in range(groups):
        xs = xp[:, g * cin_g:(g + 1) * cin_g]
        wg = w[g * cout_g:(g + 1) * cout_g]
        for ky in range(kh):
            for kx in range(kw):
                patch = xs[:, :, ky * dh:ky * dh + sh * (oh - 1) + 1:sh, kx * dw:kx * dw + sw * (ow - 1) + 1:sw]
                y[:, g * cout_g:(g + 1) * cout_g] += np.einsum("nchw,oc->nohw", patch, wg[:, :, ky, kx])
    if bias is not None:
        y += np.asarray(bias, np.float64)[None, :, None, None]
    y = _ACT[activation](y)
    return y[0] if unbatched else y
