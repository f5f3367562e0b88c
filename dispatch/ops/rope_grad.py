"""Backward of rope (issue #13): rope_backward(grad_out, cos, sin) -> dx.

rope rotates each pair of x by an orthogonal 2x2 matrix R(t, i), so dx = R^T grad_out: the
inverse rotation, rope with sin negated (exact; the tables have no gradient here: a model
builds them from positions).  The CPU implementations run rope's own kernels on a negated
copy of sin, (S, D/2): a 1/(2 x batch x heads) fraction of grad_out's bytes.  Shapes and layouts as dispatch.rope: grad_out (..., S, D), D
even, cos / sin (S, D/2), rotate-half (default) or interleaved pairs.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_cpu import rope as K

from ..registry import Call, Implementation, Op, register, register_op
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_rule, size_bucket
from .rope import check_rotation, tables

# rope's threshold (dispatch/ops/rope.py: crossover 2^13..2^14 elements, float32, D=128, S=64, the
# same loop with the signs of sin flipped).  Measured for this kernel (float32 rotate-half, D=128,
# S=64, kernels alone, medians of 15 interleaved rounds of 20 calls, 2026-11-25) only on a loaded
# host (load average 9 on the 2 cores: no free core for the second thread): serial / parallel
# 2^14 2.6 / 7.9 us, 2^16 14.8 / 20.9 us: the dynamic hand-out costs ~5 us when threads cannot help.
# Kept at rope's value until a quiet re-measure.
PARALLEL_THRESHOLD = 1 << 14
_MEASURED = ("rope's crossover 2^13..2^14 elements (the same loop); here, loaded host, serial / parallel "
             "14.8 / 20.9 us at 2^16")

_KERNELS = ("kernels_cpu.rope", "kernels_cpu.approx", "kernels_cpu.parallel")

# The contract tests' and warmup's example inputs (dispatch/examples.py): rope's shapes.
EXAMPLE_SHAPES = {"rope_backward": {"small": {"grad_out": (2, 3, 6, 16)}, "large": {"grad_out": (2, 8, 64, 64)},
                                    "decode": {"grad_out": (1, 4, 1, 8)}}}


class RopeGradKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int            # bucket of grad_out.size
    interleaved: bool


class RopeGradArgs(NamedTuple):
    grad_out: object     # (..., S, D), D even
    cos: object          # (S, D/2)
    sin: object          # (S, D/2)
    interleaved: bool
    out: object


def _describe(grad_out, cos, sin, *, interleaved=False, out=None):
    """Call.args = RopeGradArgs, key RopeGradKey (rope's checks, naming grad_out)."""
    dev, dt, interleaved = check_rotation("grad_out", grad_out, cos, sin, interleaved, out)
    return Call(RopeGradKey("rope_backward", dev, dt, size_bucket(*grad_out.shape), interleaved),
                RopeGradArgs(grad_out, cos, sin, interleaved, out))


def _host(kernel):
    def run(params, grad_out, cos, sin, interleaved, out):
        res = result_buffer(out, grad_out.shape, grad_out.dtype)
        if grad_out.size:
            d = grad_out.shape[-1]
            kernel(contiguous(grad_out).reshape(-1, d), contiguous(cos), np.negative(sin), res.reshape(-1, d),
                   interleaved)
        return deliver(res, out)

    return run


def _flops(call):
    # per pair: 4 multiplies, 2 adds
    return 3 * call.args.grad_out.size


def _bytes(call):
    g, cos, sin = call.args.grad_out, call.args.cos, call.args.sin
    return (2 * g.size + cos.size + sin.size) * g.dtype.itemsize


def _synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: standard-normal grad_out (..., S, D) and the real tables of its S and D."""
    g = rng.standard_normal(shapes["grad_out"]).astype(dtype)
    return {"grad_out": g, **tables(g.shape[-2], g.shape[-1], dtype)}


_rope_backward = register_op(Op(
    "rope_backward", _describe, memo=True, family="rope_grad", bound="memory",
    signature=lambda i: ((i["grad_out"], i["cos"], i["sin"]), {"interleaved": i.get("interleaved", False)}),
    flops=_flops, bytes=_bytes, rules={"cpu": serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)},
    synthesize=_synthesize))
register(Implementation("rope_backward", "cpu-serial", "cpu", _host(K.rope_serial), notes=HOST_COPY_NOTE,
                        kernel_modules=_KERNELS))
register(Implementation("rope_backward", "cpu-parallel", "cpu", _host(K.rope_parallel), kernel_modules=_KERNELS,
                        notes=HOST_COPY_NOTE + "; rows (batch x position) split over threads"))


@_rope_backward.expose
def rope_backward(grad_out, cos, sin, *, interleaved=False, out=None):
    """Gradient of rope(x, cos, sin, interleaved=...) with respect to x: each pair (a, b) of
    grad_out becomes (a cos + b sin, b cos - a sin), the inverse rotation.  grad_out
    (..., S, D), D even, cos / sin (S, D/2).  Returns a new array of grad_out's shape (or out=)."""
    return _rope_backward(grad_out, cos, sin, interleaved=interleaved, out=out)
