"""Rotary position embedding on C-contiguous rows.

x is viewed as (rows, D) with rows = batch * S in C order, so row r has position r % S;
cos / sin are (S, D/2).  Pair i of a row is rotated by the angle whose cos / sin are
cos[t, i] / sin[t, i]:
  rotate-half (Llama / NeoX, interleaved=False): pairs (i, i + D/2);
  interleaved (GPT-J, interleaved=True):          pairs (2i, 2i + 1).
(a, b) -> (a cos - b sin, b cos + a sin).  Each element is read once and written once; the
cos / sin rows of one position are reused from cache by every batch row.

The row loop and the pair loop live in one function with the layout branch outside both:
calling a per-row helper (D = 128) cost 0.48 ns/element in cache against 0.14 for this
form (a plain copy: 0.10), the call and its alias checks dominating such short rows.
"""
from numba import njit, prange

from .approx import JIT, JIT_INNER
from .parallel import claim, claims_for, row_of, row_split

ROWS_PER_TASK = 64  # at least this many rows per parallel task (64 x 128 floats = 32 KiB); not measured on its own


@njit(**JIT_INNER)
def rope_rows(x, cos, sin, out, lo, hi, interleaved):
    """Rows lo..hi-1 of x (rows, D) -> out; row r uses position r % S."""
    seq = cos.shape[0]
    h = cos.shape[1]
    t = lo % seq
    if interleaved:
        for r in range(lo, hi):
            xr = row_of(x, r)
            orow = row_of(out, r)
            c = row_of(cos, t)
            s = row_of(sin, t)
            for i in range(h):
                a = xr[2 * i]
                b = xr[2 * i + 1]
                orow[2 * i] = a * c[i] - b * s[i]
                orow[2 * i + 1] = b * c[i] + a * s[i]
            t += 1
            if t == seq:
                t = 0
    else:
        for r in range(lo, hi):
            xr = row_of(x, r)
            orow = row_of(out, r)
            c = row_of(cos, t)
            s = row_of(sin, t)
            for i in range(h):
                a = xr[i]
                b = xr[i + h]
                orow[i] = a * c[i] - b * s[i]
                orow[i + h] = b * c[i] + a * s[i]
            t += 1
            if t == seq:
                t = 0


@njit(**JIT)
def rope_serial(x, cos, sin, out, interleaved):
    """x, out: (rows, D); cos, sin: (S, D/2); row r uses position r % S."""
    rope_rows(x, cos, sin, out, 0, x.shape[0], interleaved)


@njit(parallel=True, **JIT)
def _rope_parallel(x, cos, sin, out, interleaved, nw, fn, counters):
    n = x.shape[0]
    least, workers = claims_for(n, nw, ROWS_PER_TASK)
    for me in prange(workers):
        lo, hi = claim(fn, counters, n, workers, least, me)
        while lo < hi:
            rope_rows(x, cos, sin, out, lo, hi, interleaved)
            lo, hi = claim(fn, counters, n, workers, least, me)


def rope_parallel(x, cos, sin, out, interleaved):
    """rope_serial's result, rows claimed by numba's threads (parallel.claim)."""
    _rope_parallel(x, cos, sin, out, interleaved, *row_split())
