"""Argument rules shared by the spatial (NCHW) ops: convolution, pooling, interpolation.

PyTorch's conventions: a window parameter (kernel_size, stride, padding, dilation) is an
int or a pair of ints (height, width); the output size along one axis is

    floor((n + 2 p - d (k - 1) - 1) / s) + 1          (ceil instead of floor with ceil_mode,
                                                      and then the last window must start
                                                      inside the input or left padding)

Every check raises naming the argument, before anything is allocated or written.
"""
from __future__ import annotations

import numpy as np

from .. import validate as V

_INT64_MAX = 2 ** 63 - 1


def pair(name: str, value, *, minimum: int = 0) -> tuple:
    """(h, w) from an int or a pair (tuple / list) of ints, each >= minimum."""
    if type(value) is int and minimum <= value <= _INT64_MAX:
        return value, value  # the common case (0.7 -> 0.15 us)
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints (height, width), got {value!r}")
        h, w = (V.integer(name, v) for v in value)
    else:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int or a pair of ints (height, width), got "
                            f"{type(value).__name__} {value!r}")
        h = w = V.integer(name, value)
    if h < minimum or w < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return h, w


def out_size(n: int, k: int, s: int, p: int, d: int = 1, ceil_mode: bool = False) -> int:
    """Output length along one axis (PyTorch's formula; see the module docstring).  May be
    <= 0 when the (dilated) window is larger than the padded input: callers raise."""
    span = n + 2 * p - d * (k - 1) - 1
    if span < 0:
        return 0
    if ceil_mode:
        o = -(-span // s) + 1
        if (o - 1) * s >= n + p:  # the last window would start in the right padding only
            o -= 1
        return o
    return span // s + 1


def nchw(name: str, x, what: str = " (N, C, H, W)") -> tuple:
    """x's (N, C, H, W) after checking its rank is 4."""
    V.rank(name, x, 4, what)
    return tuple(int(s) for s in x.shape)
