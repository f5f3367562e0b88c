"""Backward of the activations and gated linear units: relu_backward, silu_backward,
gelu_backward, swiglu_backward, geglu_backward (issue #13).

Elementwise, like the forwards: grad_out and the forward's input(s) of one shape (any
shape), float32 or float64; results of that shape and dtype.  The unary ones take out=; the
gated ones return (dgate, dup).  The formulas and their stability are in
kernels_cpu/activation_grad.py.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU
from kernels_common.activation_grad import DERIVATIVE_FLOPS_PER_ELEMENT
from kernels_cpu import activation_grad as K

from .. import validate as V
from ..registry import Call, Implementation, Op, register, register_op
from . import _arena
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_rule, size_bucket
from .activation import _approximate

# The forwards' threshold (dispatch/ops/activation.py: parallel ahead from ~2^16 in a warm
# loop, behind up to 2^19 in bursts after pauses).  Measured for these kernels (2 cores,
# AMD EPYC Zen 5, tbb, float32, 2026-11-27), serial / parallel us per call, (e) batches of
# 10 after 10 ms pauses and (b) one call after 0.2 s idle, medians of 9 interleaved rounds:
#   gelu_backward   2^16 (e) 42 / 52  (b) 220 / 252;  2^17 (e) 70 / 71  (b) 237 / 369;
#                   2^18 (e) 109 / 117  (b) 304 / 344
#   swiglu_backward 2^16 (e) 42 / 44  (b) 198 / 262;  2^17 (e) 65 / 74  (b) 245 / 311
# and in a warm loop (20 ms of calls, 15 rounds of 10) at 2^19: gelu_backward 169 / 115 us
# (173 with the parallel kernel on 1 thread), silu_backward 141 / 92, swiglu_backward
# 147 / 107.
PARALLEL_THRESHOLD = 1 << 16
_MEASURED = ("as the forwards: parallel ahead from ~2^16 in a warm loop, behind in bursts after pauses "
             "(gelu_backward / swiglu_backward float32, tbb)")

_KERNELS = ("kernels_cpu.activation_grad", "kernels_cpu.activation", "kernels_cpu.approx")

# The contract tests' and warmup's example inputs (dispatch/examples.py): the forwards' shapes
# with grad_out beside them.
_UNARY_SHAPES = {size: {"grad_out": s, "x": s} for size, s in (("small", (5, 37)), ("large", (64, 1100)),
                                                                ("decode", (1, 4096)))}
_GATED_SHAPES = {size: {"grad_out": s, "gate": s, "up": s} for size, s in (("small", (5, 37)), ("large", (64, 1100)),
                                                                           ("decode", (1, 11)))}
EXAMPLE_SHAPES = {**{op: _UNARY_SHAPES for op in ("relu_backward", "silu_backward", "gelu_backward")},
                  **{op: _GATED_SHAPES for op in ("swiglu_backward", "geglu_backward")}}


class Key(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int          # bucket of the element count
    code: int          # kernels_common.activation.ACT_*


class UnaryGradArgs(NamedTuple):
    grad_out: object
    x: object
    out: object
    code: int


class GatedGradArgs(NamedTuple):
    grad_out: object
    gate: object
    up: object
    code: int


def _same_shape(name, arr, ref_name, ref):
    if tuple(arr.shape) != tuple(ref.shape):
        raise ValueError(f"{name} must have the shape of {ref_name} {tuple(ref.shape)}, got {tuple(arr.shape)}")


def _describe_unary(name, code):
    def describe(grad_out, x, *, out=None):
        """Call.args = UnaryGradArgs(grad_out, x, out, code)."""
        V.required(grad_out=grad_out, x=x)
        dev = V.device_of(grad_out=grad_out, x=x, out=out)
        dt = V.float_dtype("grad_out", grad_out)
        V.same_dtype("x", x, "grad_out", dt)
        _same_shape("x", x, "grad_out", grad_out)
        V.out(out, grad_out.shape, dt, grad_out=grad_out, x=x)
        return Call(Key(name, dev, dt, size_bucket(*x.shape), code), UnaryGradArgs(grad_out, x, out, code))

    return describe


def _describe_gated(name, code):
    def describe(grad_out, gate, up):
        """Call.args = GatedGradArgs(grad_out, gate, up, code)."""
        V.required(grad_out=grad_out, gate=gate, up=up)
        dev = V.device_of(grad_out=grad_out, gate=gate, up=up)
        dt = V.float_dtype("grad_out", grad_out)
        V.same_dtype("gate", gate, "grad_out", dt)
        V.same_dtype("up", up, "grad_out", dt)
        _same_shape("gate", gate, "grad_out", grad_out)
        _same_shape("up", up, "grad_out", grad_out)
        return Call(Key(name, dev, dt, size_bucket(*gate.shape), code), GatedGradArgs(grad_out, gate, up, code))

    return describe


def _unary_host(kernel):
    def run(params, grad_out, x, out, code):
        g, xc = contiguous(grad_out), contiguous(x)
        res = result_buffer(out, x.shape, x.dtype)
        kernel(g.reshape(-1), xc.reshape(-1), res.reshape(-1), code)
        return deliver(res, out)

    return run


def _gated_host(kernel):
    def run(params, grad_out, gate, up, code):
        g, ga, u = contiguous(grad_out), contiguous(gate), contiguous(up)
        dgate, dup = _arena.empty(gate.shape, gate.dtype), _arena.empty(gate.shape, gate.dtype)
        kernel(g.reshape(-1), ga.reshape(-1), u.reshape(-1), dgate.reshape(-1), dup.reshape(-1), code)
        return dgate, dup

    return run


def _unary_flops(call):
    # act'(x), then the multiply by grad_out
    return (DERIVATIVE_FLOPS_PER_ELEMENT[call.args.code] + 1) * call.args.x.size


def _unary_bytes(call):
    x = call.args.x
    return 3 * x.size * x.dtype.itemsize  # grad_out, x read; the result written


def _gated_flops(call):
    # act(gate) and act'(gate) share their exp: the derivative's FLOPs and the value's
    # multiply, then grad_out * up * act' and grad_out * act
    return (DERIVATIVE_FLOPS_PER_ELEMENT[call.args.code] + 4) * call.args.gate.size


def _gated_bytes(call):
    gate = call.args.gate
    return 5 * gate.size * gate.dtype.itemsize  # grad_out, gate, up read; dgate, dup written


_RULE = serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)


def _sig_unary(i):
    return (i["grad_out"], i["x"]), {}


def _sig_gelu(i):
    return (i["grad_out"], i["x"]), {"approximate": i.get("approximate", "none")}


def _sig_gated(i):
    return (i["grad_out"], i["gate"], i["up"]), {}


def _sig_geglu(i):
    return (i["grad_out"], i["gate"], i["up"]), {"approximate": i.get("approximate", "none")}


def _register_family(name, describe, signature, host_run, flops, bytes_, kernels):
    op = register_op(Op(name, describe, memo=True, family="activation_grad", bound="memory", signature=signature,
                        flops=flops, bytes=bytes_, rules={"cpu": _RULE}))
    serial, parallel = kernels
    register(Implementation(name, "cpu-serial", "cpu", host_run(serial), notes=HOST_COPY_NOTE,
                            kernel_modules=_KERNELS))
    register(Implementation(name, "cpu-parallel", "cpu", host_run(parallel), kernel_modules=_KERNELS,
                            notes=HOST_COPY_NOTE + "; chunks of 16384 elements over threads"))
    return op


_UNARY = (K.unary_grad_serial, K.unary_grad_parallel)
_GATED = (K.gated_grad_serial, K.gated_grad_parallel)
_gelu_describe = {code: _describe_unary("gelu_backward", code) for code in (ACT_GELU, ACT_GELU_TANH)}
_geglu_describe = {code: _describe_gated("geglu_backward", code) for code in (ACT_GELU, ACT_GELU_TANH)}


def _describe_gelu(grad_out, x, approximate="none", *, out=None):
    """Call.args = UnaryGradArgs(grad_out, x, out, ACT_GELU or ACT_GELU_TANH)."""
    return _gelu_describe[_approximate(approximate)](grad_out, x, out=out)


def _describe_geglu(grad_out, gate, up, approximate="none"):
    """Call.args = GatedGradArgs(grad_out, gate, up, ACT_GELU or ACT_GELU_TANH)."""
    return _geglu_describe[_approximate(approximate)](grad_out, gate, up)


_relu = _register_family("relu_backward", _describe_unary("relu_backward", ACT_RELU), _sig_unary, _unary_host,
                         _unary_flops, _unary_bytes, _UNARY)
_silu = _register_family("silu_backward", _describe_unary("silu_backward", ACT_SILU), _sig_unary, _unary_host,
                         _unary_flops, _unary_bytes, _UNARY)
_gelu = _register_family("gelu_backward", _describe_gelu, _sig_gelu, _unary_host, _unary_flops, _unary_bytes, _UNARY)
_swiglu = _register_family("swiglu_backward", _describe_gated("swiglu_backward", ACT_SILU), _sig_gated, _gated_host,
                           _gated_flops, _gated_bytes, _GATED)
_geglu = _register_family("geglu_backward", _describe_geglu, _sig_geglu, _gated_host, _gated_flops, _gated_bytes,
                          _GATED)


@_relu.expose
def relu_backward(grad_out, x, *, out=None):
    """Gradient of relu at x: grad_out where x > 0, 0 where x <= 0 (PyTorch's
    threshold_backward), NaN where x is NaN."""
    return _relu(grad_out, x, out=out)


@_silu.expose
def silu_backward(grad_out, x, *, out=None):
    """Gradient of silu at x: grad_out * s (1 + x (1 - s)), s = sigmoid(x)."""
    return _silu(grad_out, x, out=out)


@_gelu.expose
def gelu_backward(grad_out, x, approximate="none", *, out=None):
    """Gradient of gelu(x, approximate) at x (torch.ops.aten.gelu_backward): exact,
    grad_out * (Phi(x) + x phi(x)), or the tanh form's derivative with approximate="tanh"."""
    return _gelu(grad_out, x, approximate, out=out)


@_swiglu.expose
def swiglu_backward(grad_out, gate, up):
    """Gradients of swiglu(gate, up) = silu(gate) * up: (dgate, dup) =
    (grad_out * up * silu'(gate), grad_out * silu(gate))."""
    return _swiglu(grad_out, gate, up)


@_geglu.expose
def geglu_backward(grad_out, gate, up, approximate="none"):
    """Gradients of geglu(gate, up, approximate) = gelu(gate) * up: (dgate, dup) =
    (grad_out * up * gelu'(gate), grad_out * gelu(gate))."""
    return _geglu(grad_out, gate, up, approximate)
