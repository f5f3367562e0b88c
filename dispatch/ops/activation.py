"""Public activations and gated linear units: gelu, silu, relu, swiglu, geglu.

All are elementwise: any shape, float32 or float64, result of the input's shape.  On the
CPU bfloat16 (ml_dtypes.bfloat16) and float16 too, as PyTorch's 16-bit activations:
computed in float32 on the widened values, the result rounded once to the input's dtype
(the gated units round act(gate) * up once, where PyTorch's two ops round act(gate) first).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU, FLOPS_PER_ELEMENT
from kernels_cpu import activation as K

from .. import validate as V
from ..registry import FLOAT_DTYPES, Call, Implementation, Op, register, register_op
from ._common import (HOST_COPY_NOTE, contiguous, deliver, draw_case, half_bits, result_buffer, serial_parallel_rule,
                      size_bucket)

# Serial vs parallel through dispatch with each kernel forced (2 cores, AMD EPYC Zen 5 with
# AVX-512, numba's tbb layer, float32, 2026-11-27), us per call:
#   (a) a warm loop (20 ms of calls, then the best of 2 medians of 15 rounds of 10 calls),
#       rows of 1536:  gelu 2^15.6 17.1 / 15.0, 2^16.6 30.5 / 21.0, 2^17.6 54.3 / 33.1;
#       geglu 2^15.6 18.4 / 16.2, 2^16.6 32.0 / 22.6;  relu 2^15.6 6.2 / 8.4, 2^16.6 10.8 / 9.6,
#       2^17.6 18.4 / 12.6
#   (e) batches of 10 calls after 10 ms pauses, rows of ~3100 (medians of 9 interleaved
#       rounds):  gelu 2^16 37 / 40, 2^17 55 / 64, 2^18 116 / 134, 2^19 174 / 206;
#       relu 2^16 22 / 27, 2^17 30 / 38, 2^18 64 / 55;  geglu 2^17 64 / 91, 2^18 130 / 139
#   (b) one call after 0.2 s idle:  gelu 2^16 221 / 283, 2^18 329 / 401;  relu 2^16 191 / 258
# The parallel kernel wins from about 2^16 once its threads are awake and loses up to 2^19
# in bursts after pauses: the second thread needs ~0.1 ms to wake after 10 ms of idle and
# 2-4 ms after 50-200 ms on these VMs (python -m bench.runtime --wake).  The threshold keeps
# the warm-loop crossover (the report's setting too: MiniLM's gelu 128x1536 36.5 us parallel,
# 56.6 serial); bursty callers lose up to ~20% at 2^16-2^19.  (A first pass that timed the
# loop right after the other kernel's idle call read serial ahead up to 2^18: the second
# thread had not woken yet.)
PARALLEL_THRESHOLD = 1 << 16
_MEASURED = ("float32 gelu / geglu / relu, serial vs parallel (tbb): parallel ahead from ~2^16 in a warm loop "
             "(behind up to 2^19 in bursts after pauses)")


class Key(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int          # bucket of the element count
    code: int          # kernels_common.activation.ACT_*


class UnaryArgs(NamedTuple):
    x: object
    out: object
    code: int


class GatedArgs(NamedTuple):
    gate: object
    up: object
    out: object
    code: int


def _describe_unary(name, code):
    def describe(x, *, out=None):
        """Call.args = UnaryArgs(x, out, code)."""
        # a host array and no out=: the device without device_of's general walk (0.3 us)
        dev = "cpu" if out is None and type(x) is np.ndarray else V.device_of(x=x, out=out)
        dt = V.cpu_float_dtype("x", x, dev)
        V.out(out, x.shape, dt, x=x)
        return Call(Key(name, dev, dt, size_bucket(*x.shape), code), UnaryArgs(x, out, code))

    return describe


def _describe_gated(name, code):
    def describe(gate, up, *, out=None):
        """Call.args = GatedArgs(gate, up, out, code): gate and up of one shape."""
        dev = V.device_of(gate=gate, up=up, out=out)
        dt = V.cpu_float_dtype("gate", gate, dev)
        V.same_dtype("up", up, "gate", dt)
        if tuple(up.shape) != tuple(gate.shape):
            raise ValueError(f"up must have the shape of gate {tuple(gate.shape)}, got {tuple(up.shape)}")
        V.out(out, gate.shape, dt, gate=gate, up=up)
        return Call(Key(name, dev, dt, size_bucket(*gate.shape), code), GatedArgs(gate, up, out, code))

    return describe


def _flat(a, half):
    """a C-contiguous array as the kernels' 1-D view (bfloat16 / float16: its bits)."""
    a = a if a.ndim == 1 else a.reshape(-1)
    return half_bits(a) if half else a


def _unary_host(kernels):
    kernel, kernel_half = kernels

    def run(params, x, out, code):
        xc = contiguous(x)
        res = result_buffer(out, x.shape, x.dtype)
        half = x.dtype.itemsize == 2   # bfloat16 / float16 (validate.cpu_float_dtype)
        (kernel_half if half else kernel)(_flat(xc, half), _flat(res, half), code)
        return deliver(res, out)

    return run


def _gated_host(kernels):
    kernel, kernel_half = kernels

    def run(params, gate, up, out, code):
        g, u = contiguous(gate), contiguous(up)
        res = result_buffer(out, gate.shape, gate.dtype)
        half = gate.dtype.itemsize == 2
        (kernel_half if half else kernel)(_flat(g, half), _flat(u, half), _flat(res, half), code)
        return deliver(res, out)

    return run


def _unary_flops(call):
    return FLOPS_PER_ELEMENT[call.args.code] * call.args.x.size


def _unary_bytes(call):
    x = call.args.x
    return 2 * x.size * x.dtype.itemsize


def _gated_flops(call):
    return (FLOPS_PER_ELEMENT[call.args.code] + 1) * call.args.gate.size


def _gated_bytes(call):
    gate = call.args.gate
    return 3 * gate.size * gate.dtype.itemsize


_RULE = serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)
_APPROXIMATE = ("none", "tanh")


def _approximate(approximate):
    if not isinstance(approximate, str) or approximate not in _APPROXIMATE:
        raise ValueError(f"approximate must be one of {list(_APPROXIMATE)}, got {approximate!r}")
    return ACT_GELU_TANH if approximate == "tanh" else ACT_GELU


def _sig_unary(i):
    return (i["x"],), {}


def _sig_gelu(i):
    return (i["x"],), {"approximate": i.get("approximate", "none")}


def _sig_gated(i):
    return (i["gate"], i["up"]), {}


def _sig_geglu(i):
    return (i["gate"], i["up"]), {"approximate": i.get("approximate", "none")}


def _register_family(name, describe, signature, host_run, flops, bytes_, kernels):
    op = register_op(Op(name, describe, memo=True, family="activation", bound="memory", signature=signature,
                        flops=flops, bytes=bytes_, rules={"cpu": _RULE}, synthesize=draw_case))
    (serial, parallel), (serial_half, parallel_half) = kernels
    mods = ("kernels_cpu.activation", "kernels_cpu.approx", "kernels_cpu.half")
    register(Implementation(name, "cpu-serial", "cpu", host_run((serial, serial_half)), dtypes=_DTYPES,
                            notes=HOST_COPY_NOTE + _HALF_NOTE, kernel_modules=mods))
    register(Implementation(name, "cpu-parallel", "cpu", host_run((parallel, parallel_half)), dtypes=_DTYPES,
                            kernel_modules=mods,
                            notes=HOST_COPY_NOTE + f"; chunks of {K.CHUNK} elements over threads" + _HALF_NOTE))
    return op


_DTYPES = FLOAT_DTYPES + V.HALF_DTYPES
_HALF_NOTE = ("; bfloat16 / float16: each value widened to float32, the result rounded once to the input's dtype "
              "(nearest even)")
# (the parallel kernels take every dtype: their worker picks the 16-bit blocks by the arrays' type)
_UNARY = ((K.activation_serial, K.activation_parallel), (K.activation_half_serial, K.activation_parallel))
_GATED = ((K.gated_serial, K.gated_parallel), (K.gated_half_serial, K.gated_parallel))
_gelu_describe = {code: _describe_unary("gelu", code) for code in (ACT_GELU, ACT_GELU_TANH)}
_geglu_describe = {code: _describe_gated("geglu", code) for code in (ACT_GELU, ACT_GELU_TANH)}


def _describe_gelu(x, approximate="none", *, out=None):
    """Call.args = UnaryArgs(x, out, ACT_GELU or ACT_GELU_TANH)."""
    return _gelu_describe[_approximate(approximate)](x, out=out)


def _describe_geglu(gate, up, approximate="none", *, out=None):
    """Call.args = GatedArgs(gate, up, out, ACT_GELU or ACT_GELU_TANH)."""
    return _geglu_describe[_approximate(approximate)](gate, up, out=out)


_relu = _register_family("relu", _describe_unary("relu", ACT_RELU), _sig_unary, _unary_host, _unary_flops,
                         _unary_bytes, _UNARY)
_silu = _register_family("silu", _describe_unary("silu", ACT_SILU), _sig_unary, _unary_host, _unary_flops,
                         _unary_bytes, _UNARY)
_gelu = _register_family("gelu", _describe_gelu, _sig_gelu, _unary_host, _unary_flops, _unary_bytes, _UNARY)
_swiglu = _register_family("swiglu", _describe_gated("swiglu", ACT_SILU), _sig_gated, _gated_host, _gated_flops,
                           _gated_bytes, _GATED)
_geglu = _register_family("geglu", _describe_geglu, _sig_geglu, _gated_host, _gated_flops, _gated_bytes, _GATED)


@_relu.expose
def relu(x, *, out=None):
    """max(x, 0) elementwise."""
    return _relu(x, out=out)


@_silu.expose
def silu(x, *, out=None):
    """x * sigmoid(x) elementwise (a.k.a. swish)."""
    return _silu(x, out=out)


@_gelu.expose
def gelu(x, approximate="none", *, out=None):
    """GELU elementwise: exact x*Phi(x) (approximate="none") or the tanh form ("tanh"),
    as torch.nn.functional.gelu."""
    return _gelu(x, approximate, out=out)


@_swiglu.expose
def swiglu(gate, up, *, out=None):
    """silu(gate) * up; gate and up of one shape (the LLaMA MLP's gated unit)."""
    return _swiglu(gate, up, out=out)


@_geglu.expose
def geglu(gate, up, approximate="none", *, out=None):
    """gelu(gate) * up; gate and up of one shape."""
    return _geglu(gate, up, approximate, out=out)
