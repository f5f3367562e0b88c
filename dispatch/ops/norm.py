"""Public layer_norm and rms_norm over the last dimension.

Both take x of any shape (..., D), optional (D,) weight (and bias for layer_norm), and an
optional residual of x's shape: then h = x + residual is formed in the same pass and the
call returns (norm(h), h) -- the pre-norm transformer pattern, one pass over memory.
float32 or float64; mixed dtypes are a TypeError.
"""
from __future__ import annotations

import functools

import numpy as np

from kernels_cpu import norm as K

from .. import validate as V
from ..registry import Call, Implementation, Op, bucket, register, register_op
from ..select import select
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_order, size_bucket

# Measured on this machine kind (2 cores, float32, no residual; medians of 11 interleaved
# rounds of the kernels alone, 2026-11-22, other jobs running): layer_norm D=768: serial
# 4.7 / 9.8 us, parallel 4.9 / 9.5 us at 2^14 / 2^15 elements (D=64: parallel ahead from
# 2^13); rms_norm D=768 (less work per element): serial still ahead at 2^15 (7.4 vs 8.3 us),
# even at 2^16-2^17 within noise.  Crossovers: layer_norm 2^15, rms_norm 2^16.
PARALLEL_THRESHOLD = {"layer_norm": 1 << 15, "rms_norm": 1 << 16}
_MEASURED = {"layer_norm": "layer_norm float32 serial vs parallel crossover measured at 2^14..2^15 elements",
             "rms_norm": "rms_norm float32 serial vs parallel crossover measured at 2^15..2^17 elements"}


def _check(name, x, weight, bias, eps, residual, out):
    dev = V.device_of(x=x, weight=weight, bias=bias, residual=residual, out=out)
    dt = V.float_dtype("x", x)
    V.rank("x", x, (1, 64), " (..., D)")
    d = x.shape[-1]
    for pname, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            V.same_dtype(pname, p, "x", dt)
            V.shape(pname, p, (d,), " (D,) for x's last dimension")
    if residual is not None:
        V.same_dtype("residual", residual, "x", dt)
        V.shape("residual", residual, tuple(x.shape), " (x's shape)")
    eps = V.finite("eps", eps, positive=True)
    V.out(out, x.shape, dt, x=x, weight=weight, bias=bias, residual=residual)
    key = (name, dev, dt, size_bucket(*x.shape), bucket(d),
           weight is not None, bias is not None, residual is not None)
    return Call(key, (x, weight, bias, residual, eps, out))


def _describe_ln(x, weight=None, bias=None, *, eps=1e-5, residual=None, out=None):
    """Call.args = (x, weight, bias, residual, eps, out): x (..., D); weight, bias None or
    (D,) arrays of x's dtype; residual None or an array of x's shape and dtype; eps a
    positive finite Python float; out None or an array of x's shape and dtype (receives
    the normalized output).  Key: ("layer_norm", device, dtype, size bucket of x,
    bucket of D, has weight, has bias, has residual).  run() returns out, or (out, h)
    with a residual."""
    return _check("layer_norm", x, weight, bias, eps, residual, out)


def _describe_rms(x, weight=None, *, eps=1e-6, residual=None, out=None):
    """Call.args = (x, weight, None, residual, eps, out): as layer_norm's, with bias
    always None.  Key: ("rms_norm", device, dtype, size bucket of x, bucket of D,
    has weight, False, has residual)."""
    return _check("rms_norm", x, weight, None, eps, residual, out)


@functools.lru_cache(maxsize=64)
def _const_vector(d, dtype, value):
    v = np.full(d, value, dtype)
    v.flags.writeable = False
    return v


def _host(kernel, with_bias):
    def run(params, x, weight, bias, residual, eps, out):
        d = x.shape[-1]
        dt = x.dtype
        res = result_buffer(out, x.shape, dt)
        h = None if residual is None else np.empty(x.shape, dt)
        if x.size:
            xc = contiguous(x)
            if xc.ndim != 2:
                xc = xc.reshape(-1, d)
            res2 = res if res.ndim == 2 else res.reshape(-1, d)
            w = _const_vector(d, dt, 1.0) if weight is None else contiguous(weight)
            if residual is None:
                r = hc = xc  # not touched when has_res is False
            else:
                r, hc = contiguous(residual).reshape(-1, d), h.reshape(-1, d)
            if with_bias:
                b = _const_vector(d, dt, 0.0) if bias is None else contiguous(bias)
                kernel(xc, r, hc, w, b, dt.type(eps), res2, residual is not None)
            else:
                kernel(xc, r, hc, w, dt.type(eps), res2, residual is not None)
        res = deliver(res, out)
        return res if residual is None else (res, h)

    return run


def _flops_ln(call):
    # sum, subtract+square+sum, normalize (sub, mul, mul, add); +1 per element with residual
    x, residual = call.args[0], call.args[3]
    return (8 + (residual is not None)) * x.size


def _flops_rms(call):
    x, residual = call.args[0], call.args[3]
    return (4 + (residual is not None)) * x.size


def _bytes(call):
    """x read, out written; with a residual also residual read and h written; parameters."""
    x, weight, bias, residual = call.args[:4]
    streams = 2 if residual is None else 4
    params = sum(p.size for p in (weight, bias) if p is not None)
    return (streams * x.size + params) * x.dtype.itemsize


def _register(name, describe, flops, serial, parallel, with_bias):
    order = serial_parallel_order(3, PARALLEL_THRESHOLD[name], _MEASURED[name])
    op = register_op(Op(name, describe, order, flops, _bytes, family="norm"))
    register(Implementation(name, "cpu-serial", "cpu", _host(serial, with_bias), notes=HOST_COPY_NOTE))
    register(Implementation(name, "cpu-parallel", "cpu", _host(parallel, with_bias),
                            notes=HOST_COPY_NOTE + "; rows split over threads"))
    return op


_layer_norm = _register("layer_norm", _describe_ln, _flops_ln, K.layer_norm_serial, K.layer_norm_parallel, True)
_rms_norm = _register("rms_norm", _describe_rms, _flops_rms, K.rms_norm_serial, K.rms_norm_parallel, False)


def layer_norm(x, weight=None, bias=None, *, eps=1e-5, residual=None, out=None):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension (biased
    variance, as torch.nn.functional.layer_norm).  weight/bias: (D,) or None.

    With residual (x's shape): h = x + residual, returns (layer_norm(h), h), computed in
    one pass; out= then receives the normalized output and h is a new array.
    eps must be finite and > 0 (ValueError naming eps)."""
    call = _describe_ln(x, weight, bias, eps=eps, residual=residual, out=out)
    impl, params = select(call.key)
    return impl.run(params, *call.args)


def rms_norm(x, weight=None, *, eps=1e-6, residual=None, out=None):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension (as
    torch.nn.functional.rms_norm).  weight: (D,) or None.

    With residual (x's shape): h = x + residual, returns (rms_norm(h), h) in one pass;
    out= then receives the normalized output and h is a new array.
    eps must be finite and > 0 (ValueError naming eps)."""
    call = _describe_rms(x, weight, eps=eps, residual=residual, out=out)
    impl, params = select(call.key)
    return impl.run(params, *call.args)
