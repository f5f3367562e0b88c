"""Rotary position embedding on C-contiguous rows.

x is viewed as (rows, D) with rows = batch * S in C order, so row r has position r % S;
cos / sin are (S, D/2).  Pair i of a row is rotated by the angle whose cos / sin are
cos[t, i] / sin[t, i]:
  rotate-half (Llama / NeoX, interleaved=False): pairs (i, i + D/2);
  interleaved (GPT-J, interleaved=True):          pairs (2i, 2i + 1).
(a, b) -> (a cos - b sin, b cos + a sin).  Each element is read once and written once; the
cos / sin rows of one position are reused from cache by every batch row.

16-bit x (rope_half_*: x and out bfloat16 or float16 bits, uint16 / int16, half.py; cos /
sin bits of x's format or float32): each value widened, the rotation in float32, each
result rounded once to x's format.

The row loop and the pair loop live in one function with the layout branch outside both:
calling a per-row helper (D = 128) cost 0.48 ns/element in cache against 0.14 for this
form (a plain copy: 0.10), the call and its alias checks dominating such short rows.
"""
from numba import njit

from .approx import JIT, JIT_BY_ADDRESS, JIT_INNER, wide_loops
from .half import round_to, widen
from .parallel import (RW_D, RW_I, RW_I2, RW_I3, RW_N, c_array_at, launch, only_if, row_args, row_block,
                       row_claim, row_of, row_run, worker_address, zero_of)

ROWS_PER_TASK = 64  # at least this many rows per parallel task (64 x 128 floats = 32 KiB); not measured on its own


@njit(**JIT_INNER)
def rope_rows(x, cos, sin, out, lo, hi, interleaved):
    """Rows lo..hi-1 of x (rows, D) -> out; row r uses position r % S."""
    # 16 lanes on AVX-512 (approx.wide_loops; rope_rows_half had it, this did not): loop
    # medians, old / new trees alternating three times (Xeon with AMX, 2026-12-07), us, 1 / 2
    # threads: Llama-7B prefill 512 rope 790-836 / 456-485 -> 735-769 / 450-453, rope_backward
    # 816-850 / 509-520 -> 762-803 / 471-480; decode (1x32x1x128, through dispatch, medians
    # of 3000 calls, four pairs) 7.2-7.7 -> 7.8-8.3 on one or two threads (kept: 0.5 us a
    # call against 30-50 us a prefill).
    wide_loops()
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


@njit(**JIT_BY_ADDRESS)
def rope_worker(me, params, fmt, tables, half):
    """Rows claimed from the block (parallel.row_block: n rows of d, i = interleaved, i2, i3
    = cos's and sin's (S, h); arrays x, cos, sin, out).  fmt / tables: the literal type
    characters (parallel.zero_of) of x and out ("f", "d", or 16-bit bits "H" / "h", which
    take rope_rows_half: half, a parallel.only_if literal) and of cos / sin (fmt, or "f")."""
    p, _ = row_args(params)
    z, tz = zero_of(fmt), zero_of(tables)
    n, d = p[RW_N], p[RW_D]
    x = c_array_at(p[0], z, (n, d))
    cos = c_array_at(p[1], tz, (p[RW_I2], p[RW_I3]))
    sin = c_array_at(p[2], tz, (p[RW_I2], p[RW_I3]))
    out = c_array_at(p[3], z, (n, d))
    interleaved = p[RW_I] != 0
    lo, hi = row_claim(p, me)
    while lo < hi:
        if half is not None:
            rope_rows_half(x, cos, sin, out, lo, hi, interleaved)
        else:
            rope_rows(x, cos, sin, out, lo, hi, interleaved)
        lo, hi = row_claim(p, me)


def _variant(x, cos):
    """rope_worker's literals for x and its tables (dtype.char: 0.04 us, dtype.name 1.8)."""
    return x.dtype.char, cos.dtype.char, only_if(x.dtype.itemsize == 2)


@njit(**JIT)
def _launch(x, cos, sin, out, interleaved, worker, nw, fn, buf, team_run, team_state):
    workers = row_block(buf, x.shape[0], x.shape[1], 0.0, interleaved, cos.shape[0], cos.shape[1], ROWS_PER_TASK,
                        nw, fn)
    buf[0], buf[1], buf[2], buf[3] = x.ctypes.data, cos.ctypes.data, sin.ctypes.data, out.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def rope_parallel(x, cos, sin, out, interleaved):
    """rope_serial's result, rows claimed by the team's threads (parallel.row_run)."""
    row_run(_launch, worker_address(rope_worker, _variant(x, cos)), x, cos, sin, out, interleaved)


@njit(**JIT_INNER)
def rope_rows_half(x, cos, sin, out, lo, hi, interleaved):
    """rope_rows for 16-bit rows (x, out bits of one format; cos / sin bits of it or float32)."""
    wide_loops()
    seq = cos.shape[0]
    h = cos.shape[1]
    t = lo % seq
    for r in range(lo, hi):
        xr = row_of(x, r)
        orow = row_of(out, r)
        c = row_of(cos, t)
        s = row_of(sin, t)
        if interleaved:
            for i in range(h):
                a = widen(xr[2 * i])
                b = widen(xr[2 * i + 1])
                ci, si = widen(c[i]), widen(s[i])
                orow[2 * i] = round_to(a * ci - b * si, out)
                orow[2 * i + 1] = round_to(b * ci + a * si, out)
        else:
            for i in range(h):
                a = widen(xr[i])
                b = widen(xr[i + h])
                ci, si = widen(c[i]), widen(s[i])
                orow[i] = round_to(a * ci - b * si, out)
                orow[i + h] = round_to(b * ci + a * si, out)
        t += 1
        if t == seq:
            t = 0


@njit(**JIT)
def rope_half_serial(x, cos, sin, out, interleaved):
    rope_rows_half(x, cos, sin, out, 0, x.shape[0], interleaved)
