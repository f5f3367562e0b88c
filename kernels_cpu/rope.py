"""Rotary position embedding on C-contiguous rows.

x is viewed as (rows, D) with rows = batch * S in C order, so row r has position r % S;
cos / sin are (S, D/2).  Pair i of a row is rotated by the angle whose cos / sin are
cos[t, i] / sin[t, i]:
  rotate-half (Llama / NeoX, interleaved=False): pairs (i, i + D/2);
  interleaved (GPT-J, interleaved=True):          pairs (2i, 2i + 1).
(a, b) -> (a cos - b sin, b cos + a sin).  Each element is read once and written once; the
cos / sin rows of one position are reused from cache by every batch row.
"""
from numba import njit, prange

from .approx import JIT


@njit(**JIT)
def rope_row(xr, c, s, orow, interleaved):
    h = c.shape[0]
    if interleaved:
        for i in range(h):
            a = xr[2 * i]
            b = xr[2 * i + 1]
            orow[2 * i] = a * c[i] - b * s[i]
            orow[2 * i + 1] = b * c[i] + a * s[i]
    else:
        x1 = xr[:h]
        x2 = xr[h:]
        o1 = orow[:h]
        o2 = orow[h:]
        for i in range(h):
            a = x1[i]
            b = x2[i]
            o1[i] = a * c[i] - b * s[i]
            o2[i] = b * c[i] + a * s[i]


@njit(**JIT)
def rope_serial(x, cos, sin, out, interleaved):
    """x, out: (rows, D); cos, sin: (S, D/2); row r uses position r % S."""
    seq = cos.shape[0]
    for r in range(x.shape[0]):
        t = r % seq
        rope_row(x[r], cos[t], sin[t], out[r], interleaved)


@njit(parallel=True, **JIT)
def rope_parallel(x, cos, sin, out, interleaved):
    seq = cos.shape[0]
    for r in prange(x.shape[0]):
        t = r % seq
        rope_row(x[r], cos[t], sin[t], out[r], interleaved)
