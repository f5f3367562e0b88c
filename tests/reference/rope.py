"""float64 numpy reference for dispatch.rope, same signature."""
import numpy as np


def rope(x, cos, sin, *, interleaved=False, out=None):
    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(cos, dtype=np.float64)
    s = np.asarray(sin, dtype=np.float64)
    y = np.empty_like(x)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2] = a * c - b * s
        y[..., 1::2] = b * c + a * s
    else:
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        y[..., :h] = a * c - b * s
        y[..., h:] = b * c + a * s
    return y
