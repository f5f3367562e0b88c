"""Public rope: rotary position embedding of x (..., S, D) with cos / sin tables (S, D/2).

Layouts: rotate-half (Llama / GPT-NeoX, the default: pairs (i, i + D/2)) and interleaved
(GPT-J, interleaved=True: pairs (2i, 2i + 1)).  float32 or float64, or bfloat16 / float16 on
the CPU (tables of x's dtype or float32; the rotation in float32, rounded once); returns a new array
(or out=).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_cpu import rope as K

from .. import validate as V
from ..registry import FLOAT_DTYPES, Call, Implementation, Op, register, register_op
from ._common import (HOST_COPY_NOTE, case_dtype, contiguous, deliver, half_bits, result_buffer,
                      serial_parallel_rule, size_bucket)

# Measured on this machine kind (2 cores, float32, rotate-half, D=128, S=64; medians of 11
# interleaved rounds of the kernels alone, 2026-11-22, other jobs running): serial 5.1 / 10.4
# us, parallel 5.9 / 8.1 us at 2^13 / 2^14 elements.  Crossover 2^14.
PARALLEL_THRESHOLD = 1 << 14
_MEASURED = "rope float32 serial vs parallel crossover measured at 2^13..2^14 elements"


_KERNELS = ("kernels_cpu.rope", "kernels_cpu.half", "kernels_cpu.approx", "kernels_cpu.parallel")


class RopeKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int            # bucket of x.size
    interleaved: bool


class RopeArgs(NamedTuple):
    x: object            # (..., S, D), D even
    cos: object          # (S, D/2)
    sin: object          # (S, D/2)
    interleaved: bool
    out: object


def check_rotation(name, x, cos, sin, interleaved, out, *, half_ok=False):
    """(device, dtype, interleaved as a bool) of a rotation of x (the argument called `name`:
    x for rope, grad_out for rope_backward) by the tables cos / sin, after every check of
    rope's contract: x (..., S, D) with D even, cos and sin (S, D/2) of x's dtype, out.
    half_ok: x may also be bfloat16 / float16 on the CPU, its tables of x's dtype or float32
    (both the same; float32 tables are what a model computes them in)."""
    V.required(**{name: x}, cos=cos, sin=sin)
    dev = V.device_of(**{name: x}, cos=cos, sin=sin, out=out)
    dt = V.cpu_float_dtype(name, x, dev) if half_ok else V.float_dtype(name, x)
    if dev == "cpu" and V.is_half(dt):
        tdt = V.dtype_of(cos)
        if not (tdt == dt or tdt == np.float32):
            raise TypeError(f"cos must have dtype {dt} or float32 for a {dt} {name}, got {tdt}")
        V.same_dtype("sin", sin, "cos", tdt)
    else:
        V.same_dtype("cos", cos, name, dt)
        V.same_dtype("sin", sin, name, dt)
    V.rank(name, x, (2, 64), " (..., S, D)")
    s, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(f"{name} must have an even last dimension D (pairs are rotated), got shape "
                         f"{tuple(x.shape)}")
    V.shape("cos", cos, (s, d // 2), f" (S, D/2) for {name} of shape (..., S, D)")
    V.shape("sin", sin, (s, d // 2), f" (S, D/2) for {name} of shape (..., S, D)")
    interleaved = V.flag("interleaved", interleaved)
    V.out(out, x.shape, dt, **{name: x}, cos=cos, sin=sin)
    return dev, dt, interleaved


def _describe(x, cos, sin, *, interleaved=False, out=None):
    """Call.args = RopeArgs, key RopeKey."""
    dev, dt, interleaved = check_rotation("x", x, cos, sin, interleaved, out, half_ok=True)
    return Call(RopeKey("rope", dev, dt, size_bucket(*x.shape), interleaved), RopeArgs(x, cos, sin, interleaved, out))


def _bits(a):
    """A bfloat16 / float16 array as its bits (the kernels' view); others as they are."""
    return half_bits(a) if a.dtype.itemsize == 2 else a


def _host(kernels):
    kernel, kernel_half = kernels

    def run(params, x, cos, sin, interleaved, out):
        res = result_buffer(out, x.shape, x.dtype)
        if x.size:
            d = x.shape[-1]
            x2, r2, c, s = contiguous(x).reshape(-1, d), res.reshape(-1, d), contiguous(cos), contiguous(sin)
            if x.dtype.itemsize == 2:   # bfloat16 / float16 (check_rotation)
                kernel_half(half_bits(x2), _bits(c), _bits(s), half_bits(r2), interleaved)
            else:
                kernel(x2, c, s, r2, interleaved)
        return deliver(res, out)

    return run


def _flops(call):
    # per pair: 4 multiplies, 2 adds
    return 3 * call.args.x.size


def _bytes(call):
    x, cos, sin = call.args.x, call.args.cos, call.args.sin
    return (2 * x.size + cos.size + sin.size) * x.dtype.itemsize


def tables(seq: int, dim: int, dtype, base: float = 10000.0, offset: int = 0):
    """cos/sin tables (seq, dim/2) of rotary embeddings at positions offset..offset+seq-1."""
    inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    ang = np.outer(np.arange(offset, offset + seq, dtype=np.float64), inv)
    return {"cos": np.cos(ang).astype(dtype), "sin": np.sin(ang).astype(dtype)}


def _synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: standard-normal x (..., S, D) and the real tables of its S and D
    (all in the 16-bit dtype of a case with activations="bfloat16" / "float16")."""
    dtype = case_dtype(params, dtype)
    x = rng.standard_normal(shapes["x"]).astype(dtype)
    return {"x": x, **tables(x.shape[-2], x.shape[-1], dtype)}


_rope = register_op(Op(
    "rope", _describe, memo=True, family="rope", bound="memory",
    signature=lambda i: ((i["x"], i["cos"], i["sin"]), {"interleaved": i.get("interleaved", False)}),
    flops=_flops, bytes=_bytes, rules={"cpu": serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)},
    synthesize=_synthesize))
_HALF_NOTE = ("; bfloat16 / float16 x: each value widened, the rotation in float32, each result rounded once to x's "
              "dtype")
register(Implementation("rope", "cpu-serial", "cpu", _host((K.rope_serial, K.rope_half_serial)),
                        dtypes=FLOAT_DTYPES + V.HALF_DTYPES, notes=HOST_COPY_NOTE + _HALF_NOTE, kernel_modules=_KERNELS))
register(Implementation("rope", "cpu-parallel", "cpu", _host((K.rope_parallel, K.rope_parallel)),
                        dtypes=FLOAT_DTYPES + V.HALF_DTYPES, kernel_modules=_KERNELS,
                        notes=HOST_COPY_NOTE + "; rows (batch x position) split over threads" + _HALF_NOTE))


@_rope.expose
def rope(x, cos, sin, *, interleaved=False, out=None):
    """Rotary position embedding: x (..., S, D), D even, cos / sin (S, D/2).

    Each pair (a, b) becomes (a cos - b sin, b cos + a sin), pairs (i, i + D/2) by default
    (rotate-half: Llama, GPT-NeoX) or (2i, 2i + 1) with interleaved=True (GPT-J).
    Returns a new array of x's shape (or out=)."""
    return _rope(x, cos, sin, interleaved=interleaved, out=out)
