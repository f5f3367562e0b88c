"""Public layer_norm_backward and rms_norm_backward: the gradients of dispatch.layer_norm /
dispatch.rms_norm (issue #13).

Arguments as the forward's, after the incoming gradient: ``grad_out`` (x's shape), then
``x`` -- the tensor that was normalized, i.e. h = x + residual when the forward fused a
residual -- and the forward's weight (and bias), keyword eps with the forward's default.
The backward needs nothing else the forward computed: the per-row mean / rstd are
recomputed from x inside the kernel (as the forward computes them), so a training step
saves x (or h) and the parameters only: O(1) state besides tensors it keeps anyway.

``grad_residual`` (x's shape, optional) is the gradient arriving at h through the
forward's second output (h feeds the next residual branch); it is added to dx in the same
pass, so with a fused residual the returned dx is the gradient of both x and residual.

Returns (dx, dweight, dbias) / (dx, dweight): dweight None when weight is None, dbias None
when bias is None (the bias only contributes dbias = the sum of grad_out over rows).  New
arrays, x's dtype (float32 / float64; mixed dtypes are a TypeError); dweight and dbias are
the two rows of one (2, D) array, which the kernel sums the row blocks into.

Deterministic: dweight / dbias are summed over fixed blocks of rows (their size depends on
the shape only) and the block sums added in block order, so the result is the same bits on every
run, at every thread count and from either CPU implementation (kernels_cpu/norm_grad.py).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_cpu import norm_grad as K

from .. import validate as V
from ..registry import Call, Implementation, Op, bucket, register, register_op
from . import _arena
from ._common import HOST_COPY_NOTE, const_vector, contiguous, kernel_rows, serial_parallel_rule, size_bucket

# Serial vs parallel: measured on this machine kind (2 cores, float32, D = 768, weight and
# bias; medians of 15 interleaved rounds of the ops, 2026-11-25) while other jobs kept the
# load average at ~8 on the 2 cores: serial stayed ahead at every size from 2^13.6 to
# 2^20.6 elements (layer_norm_backward 16 rows 107 vs 130 us, 512 rows 325 vs 645 us, 2048
# rows 1.88 vs 1.98 ms; rms_norm_backward alike): the second core was never free.  The
# forwards' crossovers on a less loaded machine were 2^15 (layer_norm) and 2^16 (rms_norm)
# (dispatch/ops/norm.py); the backward does about twice the forward's work per element, so
# its crossover is no higher.  Re-measured on a quiet host (2026-11-26, Sapphire Rapids, tbb
# layer, weight and bias, through dispatch with each kernel forced; serial / parallel us
# per call in (a) a loop and (e) batches of 10 calls after 10 ms pauses, as for the
# forwards in dispatch/ops/norm.py):
#   layer_norm_backward 128 rows (a) 53 / 59 (e) 57 / 73;  256 rows (a) 105 / 75 (e) 114 /
#   134;  512 rows (a) 209 / 211 (e) 225 / 210;  1024 rows (a) 470 / 266 (e) 479 / 298.
#   rms_norm_backward 128 rows (a) 39 / 48 (e) 42 / 65;  256 rows (a) 99 / 111 (e) 105 / 113;
#   512 rows (a) 198 / 115 (e) 208 / 216;  1024 rows (a) 417 / 245 (e) 428 / 268.
# Crossovers between 2^17.6 and 2^18.6 elements: 2^18 for both (the tuner, python -m
# bench tune, overrides the rule per shape where it measures otherwise).
# (On an AVX2 Zen 3 VM, 2026-12-02, layer_norm_backward at 512 rows: serial / parallel 239 /
# 288 us in a loop, but the autograd forward + backward pair ran faster parallel: see
# dispatch/ops/norm.py.)
# On the thread team (kernels_cpu/team.py; 2026-12-03, Xeon with AVX-512, same method,
# blocks claimed in ranges by parallel.blocks_worker):
#   layer_norm_backward 64 rows (2^15.6) (a) 37.5 / 36.0 (e) 48.1 / 52.6;  128 rows (a)
#   59.1 / 46.5 (e) 77.1 / 63.9;  256 rows (a) 128 / 68 (e) 166 / 109;  128x384 (2^15.6)
#   (a) 37.3 / 35.4 (e) 45.6 / 51.3.
#   rms_norm_backward 64 rows (a) 30.1 / 29.2 (e) 38.9 / 48.2;  128 rows (a) 47.5 / 36.3
#   (e) 70.6 / 62.0;  256 rows (a) 109 / 54 (e) 132 / 104.
# Crossovers between 2^15.6 and 2^16.6 elements: 2^16 for both.
PARALLEL_THRESHOLD = {"layer_norm_backward": 1 << 16, "rms_norm_backward": 1 << 16}
_MEASURED = {op: f"{op} float32 serial vs parallel (thread team, loop and paced): crossover between 2^15.6 and "
                 "2^16.6 elements (see dispatch/ops/norm_grad.py)" for op in PARALLEL_THRESHOLD}

_KERNELS = ("kernels_cpu.norm_grad", "kernels_cpu.approx", "kernels_cpu.parallel")

# Example inputs (dispatch/examples.py: warmup and the contract tests): the serial side with
# an odd D, past the parallel threshold, and one decode row of Llama's width.
_SHAPES = {"small": (5, 37), "large": (64, 1100), "decode": (1, 4096)}
EXAMPLE_SHAPES = {
    "layer_norm_backward": {size: {"grad_out": s, "x": s, "weight": s[-1:], "bias": s[-1:]}
                            for size, s in _SHAPES.items()},
    "rms_norm_backward": {size: {"grad_out": s, "x": s, "weight": s[-1:]} for size, s in _SHAPES.items()},
}


class NormGradKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int                 # bucket of x.size
    row_len: int              # bucket of D
    has_weight: bool
    has_bias: bool
    has_grad_residual: bool


class NormGradArgs(NamedTuple):
    grad_out: object          # x's shape
    x: object                 # (..., D): the normalized tensor (h with a fused residual)
    weight: object            # (D,) or None
    bias: object              # (D,) or None (always None for rms_norm_backward)
    grad_residual: object     # x's shape or None
    eps: float                # finite, > 0, finite in x's dtype


def _check(name, grad_out, x, weight, bias, eps, grad_residual):
    V.required(grad_out=grad_out, x=x)
    dev = V.device_of(grad_out=grad_out, x=x, weight=weight, bias=bias, grad_residual=grad_residual)
    dt = V.float_dtype("x", x)
    V.rank("x", x, (1, 64), " (..., D)")
    V.same_dtype("grad_out", grad_out, "x", dt)
    V.shape("grad_out", grad_out, tuple(x.shape), " (x's shape)")
    d = x.shape[-1]
    for pname, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            V.same_dtype(pname, p, "x", dt)
            V.shape(pname, p, (d,), " (D,) for x's last dimension")
    if grad_residual is not None:
        V.same_dtype("grad_residual", grad_residual, "x", dt)
        V.shape("grad_residual", grad_residual, tuple(x.shape), " (x's shape)")
    eps = V.finite("eps", eps, positive=True, dtype=dt)
    key = NormGradKey(name, dev, dt, size_bucket(*x.shape), bucket(d), weight is not None, bias is not None,
                      grad_residual is not None)
    return Call(key, NormGradArgs(grad_out, x, weight, bias, grad_residual, eps))


def _describe_ln(grad_out, x, weight=None, bias=None, *, eps=1e-5, grad_residual=None):
    """Call.args = NormGradArgs, key NormGradKey.  run() returns (dx, dweight, dbias)."""
    return _check("layer_norm_backward", grad_out, x, weight, bias, eps, grad_residual)


def _describe_rms(grad_out, x, weight=None, *, eps=1e-6, grad_residual=None):
    """Call.args = NormGradArgs with bias None.  run() returns (dx, dweight)."""
    return _check("rms_norm_backward", grad_out, x, weight, None, eps, grad_residual)


def _empty(shape, dtype):
    """Where the kernels' outputs and scratch come from: the result arena (large ones reused
    once freed, no page faults per call); the tests poison them with NaN here."""
    return _arena.empty(shape if type(shape) is tuple else (shape,), dtype)


def _host(kernel, ln):
    def run(params, grad_out, x, weight, bias, grad_residual, eps):
        d = x.shape[-1]
        dt = x.dtype
        dx = _empty(x.shape, dt)
        # dweight (and dbias) are the rows of one array the kernel sums the row blocks into
        sums = _empty((2 if ln else 1, d), dt)
        if not x.size:  # no rows: dweight / dbias are sums over nothing
            sums[...] = 0
        else:
            xc = kernel_rows(x, d)
            has_gr = grad_residual is not None
            gr = kernel_rows(grad_residual, d) if has_gr else xc  # not read without it
            w = const_vector(d, dt, 1.0) if weight is None else contiguous(weight)
            kernel(kernel_rows(grad_out, d), xc, w, gr, dt.type(eps), kernel_rows(dx, d), sums, has_gr)
        dw = None if weight is None else sums[0]
        if ln:
            return dx, dw, None if bias is None else sums[1]
        return dx, dw

    return run


# FLOPs per element, counted on the kernels' three passes (layer_norm: shifted sum 2; centered
# sums, g = grad_out * w, sum g, sum g * d 9; xhat, dweight and dbias partials, dx 9) and
# two (rms_norm: sum of squares and of g * x 5; xhat, partial, dx 6); +1 with grad_residual.
def _flops_ln(call):
    return (20 + (call.args.grad_residual is not None)) * call.args.x.size


def _flops_rms(call):
    return (11 + (call.args.grad_residual is not None)) * call.args.x.size


def _bytes(call):
    """grad_out and x read, dx written (grad_residual read too); weight read, dweight and
    dbias written."""
    a = call.args
    streams = 3 + (a.grad_residual is not None)
    params = (2 if a.weight is not None else 0) + (a.bias is not None)
    return (streams * a.x.size + params * a.x.shape[-1]) * a.x.dtype.itemsize


def _synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: standard-normal x, grad_out, bias, grad_residual; weight near 1."""
    out = {}
    for name, shape in shapes.items():
        v = rng.standard_normal(shape)
        out[name] = (1.0 + 0.1 * v if name == "weight" else v).astype(dtype)
    return out


def _sig_ln(i):
    return ((i["grad_out"], i["x"], i.get("weight"), i.get("bias")),
            {"eps": i.get("eps", 1e-5), "grad_residual": i.get("grad_residual")})


def _sig_rms(i):
    return ((i["grad_out"], i["x"], i.get("weight")),
            {"eps": i.get("eps", 1e-6), "grad_residual": i.get("grad_residual")})


def _register(name, describe, signature, flops, serial, parallel, ln):
    rule = serial_parallel_rule("size", PARALLEL_THRESHOLD[name], _MEASURED[name])
    op = register_op(Op(name, describe, memo=True, family="norm_grad", bound="memory", signature=signature, flops=flops,
                        bytes=_bytes, rules={"cpu": rule}, synthesize=_synthesize))
    note = HOST_COPY_NOTE + "; statistics recomputed from x; dweight/dbias summed per fixed row block, blocks in order"
    register(Implementation(name, "cpu-serial", "cpu", _host(serial, ln), notes=note, kernel_modules=_KERNELS))
    register(Implementation(name, "cpu-parallel", "cpu", _host(parallel, ln), kernel_modules=_KERNELS,
                            notes=note + "; row blocks split over threads (same bits as cpu-serial)"))
    return op


_layer_norm_backward = _register("layer_norm_backward", _describe_ln, _sig_ln, _flops_ln, K.layer_norm_grad_serial,
                                 K.layer_norm_grad_parallel, True)
_rms_norm_backward = _register("rms_norm_backward", _describe_rms, _sig_rms, _flops_rms, K.rms_norm_grad_serial,
                               K.rms_norm_grad_parallel, False)


@_layer_norm_backward.expose
def layer_norm_backward(grad_out, x, weight=None, bias=None, *, eps=1e-5, grad_residual=None):
    """Gradients of dispatch.layer_norm: returns (dx, dweight, dbias).

    grad_out: the gradient of the normalized output (x's shape); x: the tensor the forward
    normalized (h = x + residual when it fused a residual); weight, bias, eps: the
    forward's.  grad_residual (x's shape, optional): the gradient reaching h through the
    forward's second output, added to dx (dx is then the gradient of x and of residual).
    dweight is None without weight, dbias None without bias.  mean / rstd are recomputed
    from x (nothing else needs saving); dweight / dbias are deterministic (fixed row
    blocks summed in order)."""
    return _layer_norm_backward(grad_out, x, weight, bias, eps=eps, grad_residual=grad_residual)


@_rms_norm_backward.expose
def rms_norm_backward(grad_out, x, weight=None, *, eps=1e-6, grad_residual=None):
    """Gradients of dispatch.rms_norm: returns (dx, dweight).

    grad_out: the gradient of the normalized output (x's shape); x: the tensor the forward
    normalized (h = x + residual when it fused a residual); weight, eps: the forward's.
    grad_residual (x's shape, optional): the gradient reaching h through the forward's
    second output, added to dx.  dweight is None without weight.  rstd is recomputed from
    x; dweight is deterministic (fixed row blocks summed in order)."""
    return _rms_norm_backward(grad_out, x, weight, eps=eps, grad_residual=grad_residual)
