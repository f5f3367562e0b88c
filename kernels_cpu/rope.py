"""Rotary position embedding on C-contiguous rows.

x is viewed as (rows, D) with rows = batch * S in C order, so row r has position r % S;
cos / sin are (S, D/2).  Pair i of a row is rotated by the angle whose cos / sin are
cos[t, i] / sin[t, i]:
  rotate-half (Llama / NeoX, interleaved=False): pairs (i, i + D/2);
  interleaved (GPT-J, interleaved=True):          pairs (2i, 2i + 1).
(a, b) -> (a cos - b sin, b cos + a sin).  Each element is read once and written once; the
cos / sin rows of one position are reused from cache by every batch row.

bfloat16 x (rope_bf16_*: x and out their 16-bit patterns, uint16; cos / sin bfloat16 bits
or float32): each value widened, the rotation in float32, each result rounded once to
bfloat16.

The row loop and the pair loop live in one function with the layout branch outside both:
calling a per-row helper (D = 128) cost 0.48 ns/element in cache against 0.14 for this
form (a plain copy: 0.10), the call and its alias checks dominating such short rows.
"""
import numpy as np
from numba import njit, types
from numba.extending import overload

from .approx import JIT, JIT_BY_ADDRESS, JIT_INNER, OVERLOAD, wide_loops
from .bf16 import as_f32, from_bf16, to_bf16
from .parallel import (RW_D, RW_I, RW_I2, RW_I3, RW_N, c_array_at, launch, like_dtype, row_args, row_block,
                       row_claim, row_of, row_run, worker_address)

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


@njit(**JIT_BY_ADDRESS)
def rope_worker(me, params, is64):
    """Rows claimed from the block (parallel.row_block: n rows of d, i = interleaved, i2, i3
    = cos's and sin's (S, h); arrays x, cos, sin, out)."""
    p, _ = row_args(params)
    z = like_dtype(is64)
    n, d = p[RW_N], p[RW_D]
    x = c_array_at(p[0], z, (n, d))
    cos = c_array_at(p[1], z, (p[RW_I2], p[RW_I3]))
    sin = c_array_at(p[2], z, (p[RW_I2], p[RW_I3]))
    out = c_array_at(p[3], z, (n, d))
    interleaved = p[RW_I] != 0
    lo, hi = row_claim(p, me)
    while lo < hi:
        rope_rows(x, cos, sin, out, lo, hi, interleaved)
        lo, hi = row_claim(p, me)


@njit(**JIT)
def _launch(x, cos, sin, out, interleaved, worker, nw, fn, buf, team_run, team_state):
    workers = row_block(buf, x.shape[0], x.shape[1], 0.0, interleaved, cos.shape[0], cos.shape[1], ROWS_PER_TASK,
                        nw, fn)
    buf[0], buf[1], buf[2], buf[3] = x.ctypes.data, cos.ctypes.data, sin.ctypes.data, out.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def rope_parallel(x, cos, sin, out, interleaved):
    """rope_serial's result, rows claimed by the team's threads (parallel.row_run)."""
    row_run(_launch, worker_address(rope_worker, (bool(x.dtype == np.float64),)), x, cos, sin, out, interleaved)


@njit(**JIT_INNER)
def rope_rows_bf16(x, cos, sin, out, lo, hi, interleaved):
    """rope_rows for bfloat16 rows (x, out uint16; cos / sin uint16 bits or float32)."""
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
                a = from_bf16(xr[2 * i])
                b = from_bf16(xr[2 * i + 1])
                ci, si = as_f32(c[i]), as_f32(s[i])
                orow[2 * i] = to_bf16(a * ci - b * si)
                orow[2 * i + 1] = to_bf16(b * ci + a * si)
        else:
            for i in range(h):
                a = from_bf16(xr[i])
                b = from_bf16(xr[i + h])
                ci, si = as_f32(c[i]), as_f32(s[i])
                orow[i] = to_bf16(a * ci - b * si)
                orow[i + h] = to_bf16(b * ci + a * si)
        t += 1
        if t == seq:
            t = 0


@njit(**JIT)
def rope_bf16_serial(x, cos, sin, out, interleaved):
    rope_rows_bf16(x, cos, sin, out, 0, x.shape[0], interleaved)


def _table_zero(tables_bf16):
    return np.float32(0)


@overload(_table_zero, **OVERLOAD)
def _table_zero_overload(tables_bf16):
    """A zero of the tables' element type for the literal flag (uint16 bits, or float32)."""
    if not isinstance(tables_bf16, types.BooleanLiteral):
        return None
    if tables_bf16.literal_value:
        return lambda tables_bf16: np.uint16(0)
    return lambda tables_bf16: np.float32(0)


@njit(**JIT_BY_ADDRESS)
def rope_bf16_worker(me, params, tables_bf16):
    """rope_worker for bfloat16 rows; the literal tables_bf16 says whether cos / sin are
    bfloat16 bits (else float32)."""
    p, _ = row_args(params)
    n, d = p[RW_N], p[RW_D]
    x = c_array_at(p[0], np.uint16(0), (n, d))
    tz = _table_zero(tables_bf16)
    cos = c_array_at(p[1], tz, (p[RW_I2], p[RW_I3]))
    sin = c_array_at(p[2], tz, (p[RW_I2], p[RW_I3]))
    out = c_array_at(p[3], np.uint16(0), (n, d))
    interleaved = p[RW_I] != 0
    lo, hi = row_claim(p, me)
    while lo < hi:
        rope_rows_bf16(x, cos, sin, out, lo, hi, interleaved)
        lo, hi = row_claim(p, me)


def rope_bf16_parallel(x, cos, sin, out, interleaved):
    """rope_bf16_serial's result, rows claimed by the team's threads."""
    row_run(_launch, worker_address(rope_bf16_worker, (bool(cos.dtype == np.uint16),)), x, cos, sin, out,
            interleaved)
