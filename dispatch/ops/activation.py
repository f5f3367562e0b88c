"""Public activations and gated linear units: gelu, silu, relu, swiglu, geglu.

All are elementwise: any shape, float32 or float64, result of the input's shape.
"""
from __future__ import annotations

from kernels_cpu import activation as K
from kernels_cpu.approx import ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU

from .. import validate as V
from ..registry import Call, Implementation, Op, register, register_op
from ..select import select
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_order, size_bucket

# Measured on this machine kind (2 cores), relu on float32 with `python -m bench.threshold
# activation`: the parallel kernel starts to win between 2^15 and 2^16 elements.
PARALLEL_THRESHOLD = 1 << 16
_MEASURED = "relu float32, serial vs parallel crossover measured at 2^15..2^16 elements"

# FLOPs per element of each activation, counted as the formula's arithmetic
# (exp counted as one): what the roofline uses for "work".
FLOPS_PER_ELEMENT = {ACT_RELU: 1, ACT_SILU: 4, ACT_GELU: 8, ACT_GELU_TANH: 9}


def _describe_unary(name, code):
    def describe(x, *, out=None):
        dev = V.device_of(x=x, out=out)
        dt = V.float_dtype("x", x)
        V.out(out, x.shape, dt, x=x)
        return Call((name, dev, dt, size_bucket(*x.shape), code), (x, out, code))

    return describe


def _describe_gated(name, code):
    def describe(gate, up, *, out=None):
        dev = V.device_of(gate=gate, up=up, out=out)
        dt = V.float_dtype("gate", gate)
        V.same_dtype("up", up, "gate", dt)
        if tuple(up.shape) != tuple(gate.shape):
            raise ValueError(f"up must have the shape of gate {tuple(gate.shape)}, got {tuple(up.shape)}")
        V.out(out, gate.shape, dt, gate=gate, up=up)
        return Call((name, dev, dt, size_bucket(*gate.shape), code), (gate, up, out, code))

    return describe


def _unary_host(kernel):
    def run(params, x, out, code):
        xc = contiguous(x)
        res = result_buffer(out, x.shape, x.dtype)
        kernel(xc.reshape(-1), res.reshape(-1), code)
        return deliver(res, out)

    return run


def _gated_host(kernel):
    def run(params, gate, up, out, code):
        g, u = contiguous(gate), contiguous(up)
        res = result_buffer(out, gate.shape, gate.dtype)
        kernel(g.reshape(-1), u.reshape(-1), res.reshape(-1), code)
        return deliver(res, out)

    return run


def _unary_flops(call):
    x, code = call.args[0], call.args[2]
    return FLOPS_PER_ELEMENT[code] * x.size


def _unary_bytes(call):
    x = call.args[0]
    return 2 * x.size * x.dtype.itemsize


def _gated_flops(call):
    gate, code = call.args[0], call.args[3]
    return (FLOPS_PER_ELEMENT[code] + 1) * gate.size


def _gated_bytes(call):
    gate = call.args[0]
    return 3 * gate.size * gate.dtype.itemsize


_order = serial_parallel_order(3, PARALLEL_THRESHOLD, _MEASURED)
_GELU_CODES = {"none": ACT_GELU, "tanh": ACT_GELU_TANH}


def _register_family(name, describe, host_run, flops, bytes_, kernels):
    op = register_op(Op(name, describe, _order, flops, bytes_, family="activation"))
    serial, parallel = kernels
    register(Implementation(name, "cpu-serial", "cpu", host_run(serial), notes=HOST_COPY_NOTE))
    register(Implementation(name, "cpu-parallel", "cpu", host_run(parallel),
                            notes=HOST_COPY_NOTE + f"; chunks of {K.CHUNK} elements over threads"))
    return op


_UNARY = (K.activation_serial, K.activation_parallel)
_GATED = (K.gated_serial, K.gated_parallel)
_relu = _register_family("relu", _describe_unary("relu", ACT_RELU), _unary_host, _unary_flops, _unary_bytes, _UNARY)
_silu = _register_family("silu", _describe_unary("silu", ACT_SILU), _unary_host, _unary_flops, _unary_bytes, _UNARY)
_gelu_exact = _describe_unary("gelu", ACT_GELU)
_gelu_tanh = _describe_unary("gelu", ACT_GELU_TANH)


def _describe_gelu(x, approximate="none", *, out=None):
    if approximate == "tanh":
        return _gelu_tanh(x, out=out)
    if approximate != "none":
        raise ValueError(f"approximate must be one of ['none', 'tanh'], got {approximate!r}")
    return _gelu_exact(x, out=out)


_gelu = _register_family("gelu", _describe_gelu, _unary_host, _unary_flops, _unary_bytes, _UNARY)
_swiglu = _register_family("swiglu", _describe_gated("swiglu", ACT_SILU), _gated_host, _gated_flops, _gated_bytes, _GATED)
_geglu_exact = _describe_gated("geglu", ACT_GELU)
_geglu_tanh = _describe_gated("geglu", ACT_GELU_TANH)


def _describe_geglu(gate, up, approximate="none", *, out=None):
    if approximate == "tanh":
        return _geglu_tanh(gate, up, out=out)
    if approximate != "none":
        raise ValueError(f"approximate must be one of ['none', 'tanh'], got {approximate!r}")
    return _geglu_exact(gate, up, out=out)


_geglu = _register_family("geglu", _describe_geglu, _gated_host, _gated_flops, _gated_bytes, _GATED)


def _call(call):
    impl, params = select(call.key)
    return impl.run(params, *call.args)


def relu(x, *, out=None):
    """max(x, 0) elementwise."""
    return _call(_relu.describe(x, out=out))


def silu(x, *, out=None):
    """x * sigmoid(x) elementwise (a.k.a. swish)."""
    return _call(_silu.describe(x, out=out))


def gelu(x, approximate="none", *, out=None):
    """GELU elementwise: exact x*Phi(x) (approximate="none") or the tanh form ("tanh"),
    as torch.nn.functional.gelu."""
    return _call(_describe_gelu(x, approximate, out=out))


def swiglu(gate, up, *, out=None):
    """silu(gate) * up; gate and up of one shape (the LLaMA MLP's gated unit)."""
    return _call(_swiglu.describe(gate, up, out=out))


def geglu(gate, up, approximate="none", *, out=None):
    """gelu(gate) * up; gate and up of one shape."""
    return _call(_describe_geglu(gate, up, approximate, out=out))
