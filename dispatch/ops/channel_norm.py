"""Public batch_norm (inference) and group_norm over the channel dimension 1 (NCHW and any
other (N, C, *spatial) layout of rank >= 2), with an activation fused.

    batch_norm(x, running_mean, running_var, weight=None, bias=None, *, eps=1e-5,
               activation=None, out=None)
    group_norm(x, num_groups, weight=None, bias=None, *, eps=1e-5, activation=None, out=None)

Semantics of torch.nn.functional.batch_norm(training=False) and group_norm (biased variance
over each (sample, group) block of C / num_groups channels x spatial), then the activation:
None, "relu", "gelu", "gelu_tanh" or "silu" (the diffusion U-Net's GroupNorm(32) + SiLU and
ResNet's BatchNorm + ReLU in one pass).  Running statistics, weight and bias are (C,).
float32 or float64 (float16 on CUDA); on the CPU x may also be bfloat16 (ml_dtypes) or
float16, as PyTorch's 16-bit norms: the parameters in x's dtype or float32, computed in
float32, each result rounded once to x's dtype.  Mixed dtypes otherwise are a TypeError.
A negative running_var gives NaN in its channel, as PyTorch.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACTIVATION_CODES, FLOPS_PER_ELEMENT
from kernels_cpu import channel_norm as K

from .. import validate as V
from ..registry import FLOAT_DTYPES, Call, Implementation, Op, Rule, bucket, register, register_op
from ._common import (HOST_COPY_NOTE, case_dtype, const_vector, contiguous, deliver, half_bits, result_buffer,
                      serial_parallel_rule, size_bucket)

# Measured 2026-11-23 (AMD znver3, 2 cores; cpu-serial vs cpu-parallel, medians of 7
# alternating rounds, back to back / after 0.2 s idle, float32): batch_norm + relu on
# 1xCx28x28 was never faster in parallel at 2^11..2^18 elements (2^18: 176 / 618 us serial,
# 212 / 808 us parallel), nor at ResNet's 1x64x112x112 (2^19.6: 422 vs 444 us): threads from
# 2^20.  group_norm 32 + silu on 1xCx16x16: parallel ahead back to back from 2^17 (249 vs
# 304 us) but behind after idle (1095 vs 740 us), about even at SD's 1x320x64x64 (2.68 vs
# 2.83 ms): threads from 2^17.
# Re-measured on the thread team (parallel.row_run; the numbers above were numba's threads),
# forced serial / parallel through dispatch, float32, Xeon with AVX-512, 2 vCPUs
# (2026-12-03), us, [loop | after 0.2 s idle | paced: 10 calls after 10 ms].  batch_norm +
# relu: 1x64x32x32 (2^16) 25 / 40 | 502 / 789 | 32 / 47; 1x128x32x32 (2^17) 35 / 30 | 617 /
# 624 | 57 / 66; 1x64x56x56 (2^17.6) 49 / 34 | 566 / 553 | 73 / 88 (another run 154 / 93);
# 1x64x64x64 (2^18) 74 / 40 | 649 / 632 | 110 / 95; 1x128x64x64 (2^19) 188 / 97 | 844 / 765
# | 232 / 142; ResNet's stem 1x64x112x112 (2^19.6) 275-298 / 151-155 | 1003-1158 / 900-937 |
# 334-336 / 208-217: threads from 2^18.  group_norm 32 + silu: 1x64x32x32 60 / 40 | 464 /
# 573 | 102 / 62; 1x128x32x32 76 / 51 | 502 / 599 | 92 / 122; 1x256x32x32 (2^18) 195 / 106
# | 739 / 656 | 215 / 144; SD's 1x320x64x64 1005 / 641 | 2536 / 1553 | 1072 / 762: 2^17,
# where the settings disagree, stays.
PARALLEL_THRESHOLD = {"batch_norm": 1 << 18, "group_norm": 1 << 17}
_MEASURED = {"batch_norm": "on the thread team parallel ahead from 2^18 elements back to back, after idle and paced; "
                           "mixed at 2^17-2^17.6 (measured, 2 cores)",
             "group_norm": "on the thread team parallel ahead back to back from 2^16, after idle and paced from 2^18; "
                           "mixed at 2^17 (measured, 2 cores)"}

_KERNELS = ("kernels_cpu.channel_norm", "kernels_cpu.half", "kernels_cpu.approx", "kernels_cpu.parallel")
_F32 = np.dtype(np.float32)
_HALF_NOTE = ("; bfloat16 / float16 x: widened to float32 (planes in pieces for batch_norm, whole (sample, group) "
              "rows for group_norm), float32 parameters, each result rounded once to x's dtype")

# Example inputs for warmup and the contract tests (dispatch/examples.py): the serial side
# (odd channel count, 5 x 7 planes), past the parallel threshold, and a batch of one
# without spatial dimensions (BatchNorm1d / GroupNorm on (N, C)).
_BN = {"small": (2, 12, 5, 7), "large": (2, 64, 24, 24), "decode": (1, 640)}
_GN = {"small": (2, 12, 5, 7), "large": (2, 64, 24, 24), "decode": (1, 640, 3)}
EXAMPLE_SHAPES = {
    "batch_norm": {size: {"x": s, "running_mean": (s[1],), "running_var": (s[1],), "weight": (s[1],),
                          "bias": (s[1],)} for size, s in _BN.items()},
    "group_norm": {size: {"x": s, "weight": (s[1],), "bias": (s[1],)} for size, s in _GN.items()},
}


class ChannelNormKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int           # bucket of x.size
    blocks: int         # bucket of the independent blocks: N*C planes (batch_norm), N*G groups (group_norm)
    plane: int          # bucket of S, the elements per channel plane (product of the spatial dims)
    has_weight: bool
    has_bias: bool
    code: int           # kernels_common.activation.ACT_*


class BatchNormArgs(NamedTuple):
    x: object               # (N, C, *spatial)
    running_mean: object    # (C,)
    running_var: object     # (C,)
    weight: object          # (C,) or None
    bias: object            # (C,) or None
    eps: float              # finite, > 0
    code: int               # ACT_*
    out: object


class GroupNormArgs(NamedTuple):
    x: object               # (N, C, *spatial)
    num_groups: int         # divides C
    weight: object          # (C,) or None
    bias: object            # (C,) or None
    eps: float              # finite, > 0, finite in x's dtype
    code: int               # ACT_*
    out: object


def _nc_s(shape):
    n, c = int(shape[0]), int(shape[1])
    s = 1
    for d in shape[2:]:
        s *= int(d)
    return n, c, s


def _params(x, dt, c, **params):
    half = V.is_half(dt)
    for pname, p in params.items():
        if p is not None:
            if half:   # PyTorch's mixed form too: float32 parameters of a 16-bit x
                pdt = V.dtype_of(p)
                if not (pdt == dt or pdt == np.float32):
                    raise TypeError(f"{pname} must have dtype {dt} or float32 for a {dt} x, got {pdt}")
            else:
                V.same_dtype(pname, p, "x", dt)
            V.shape(pname, p, (c,), " (C,) for x's channel dimension 1")


def _describe_bn(x, running_mean, running_var, weight=None, bias=None, *, eps=1e-5, activation=None, out=None):
    """Call.args = BatchNormArgs, key ChannelNormKey (blocks: N*C planes)."""
    dev = V.device_of(x=x, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias, out=out)
    dt = V.cpu_float_dtype("x", x, dev)
    V.rank("x", x, (2, 64), " (N, C, *spatial)")
    V.required(running_mean=running_mean, running_var=running_var)
    n, c, s = _nc_s(x.shape)
    _params(x, dt, c, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
    eps = V.finite("eps", eps, positive=True, dtype=_F32 if V.is_half(dt) else dt)
    V.choice("activation", activation, list(ACTIVATION_CODES))
    code = ACTIVATION_CODES[activation]
    V.out(out, x.shape, dt, x=x, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
    key = ChannelNormKey("batch_norm", dev, dt, size_bucket(*x.shape), bucket(n * c), bucket(s),
                         weight is not None, bias is not None, code)
    return Call(key, BatchNormArgs(x, running_mean, running_var, weight, bias, eps, code, out))


def _describe_gn(x, num_groups, weight=None, bias=None, *, eps=1e-5, activation=None, out=None):
    """Call.args = GroupNormArgs, key ChannelNormKey (blocks: N*G groups)."""
    dev = V.device_of(x=x, weight=weight, bias=bias, out=out)
    dt = V.cpu_float_dtype("x", x, dev)
    V.rank("x", x, (2, 64), " (N, C, *spatial)")
    n, c, s = _nc_s(x.shape)
    g = V.integer("num_groups", num_groups)
    if g < 1:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    if c % g:
        raise ValueError(f"num_groups must divide the channel count C = {c} (x's dimension 1), got {g}")
    _params(x, dt, c, weight=weight, bias=bias)
    eps = V.finite("eps", eps, positive=True, dtype=_F32 if V.is_half(dt) else dt)
    V.choice("activation", activation, list(ACTIVATION_CODES))
    code = ACTIVATION_CODES[activation]
    V.out(out, x.shape, dt, x=x, weight=weight, bias=bias)
    key = ChannelNormKey("group_norm", dev, dt, size_bucket(*x.shape), bucket(n * g), bucket(s),
                         weight is not None, bias is not None, code)
    return Call(key, GroupNormArgs(x, g, weight, bias, eps, code, out))


def fold(running_mean, running_var, weight, bias, eps, dtype):
    """(scale, shift) in dtype, computed in float64: scale = weight / sqrt(var + eps),
    shift = bias - mean * scale, so batch_norm is x * scale + shift (as PyTorch's CPU
    inference kernel folds them).  A negative var + eps gives NaN (numpy's warning silenced)."""
    f64 = np.float64
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        scale = 1.0 / np.sqrt(np.asarray(running_var, f64) + eps)
        if weight is not None:
            scale = scale * np.asarray(weight, f64)
        shift = -np.asarray(running_mean, f64) * scale
        if bias is not None:
            shift = shift + np.asarray(bias, f64)
        return scale.astype(dtype), shift.astype(dtype)


def _bn_host(kernel32, kernel_half):
    def run(params, x, running_mean, running_var, weight, bias, eps, code, out):
        dt = x.dtype
        res = result_buffer(out, x.shape, dt)
        if x.size:
            _, _, s = _nc_s(x.shape)
            if dt.itemsize == 2:   # bfloat16 / float16 (cpu_float_dtype): float32 scale / shift, the bits
                scale, shift = fold(running_mean, running_var, weight, bias, eps, _F32)
                kernel_half(half_bits(contiguous(x).reshape(-1)), scale, shift, half_bits(res.reshape(-1)), s, code)
            else:
                scale, shift = fold(running_mean, running_var, weight, bias, eps, dt)
                kernel32(contiguous(x).reshape(-1), scale, shift, res.reshape(-1), s, code)
        return deliver(res, out)

    return run


def _vector(p, c, dt, fill):
    """A weight / bias as the kernel's (C,) vector of dt (None: `fill`)."""
    if p is None:
        return const_vector(c, dt, fill)
    return contiguous(p) if p.dtype == dt else np.ascontiguousarray(p, dtype=dt)


def _gn_host(kernel32, kernel_half):
    def run(params, x, num_groups, weight, bias, eps, code, out):
        dt = x.dtype
        res = result_buffer(out, x.shape, dt)
        if x.size:
            n, c, s = _nc_s(x.shape)
            cg = c // num_groups
            rows, row_len = n * num_groups, cg * s
            half = dt.itemsize == 2   # bfloat16 / float16 (cpu_float_dtype): float32 parameters, the bits
            pdt = _F32 if half else dt
            w, b = _vector(weight, c, pdt, 1.0), _vector(bias, c, pdt, 0.0)
            xr, rr = contiguous(x).reshape(rows, row_len), res.reshape(rows, row_len)
            if half:
                kernel_half(half_bits(xr), w, b, _F32.type(eps), half_bits(rr), cg, s, code)
            else:
                kernel32(xr, w, b, dt.type(eps), rr, cg, s, code)
        return deliver(res, out)

    return run


def _flops_bn(call):
    return (2 + FLOPS_PER_ELEMENT[call.args.code]) * call.args.x.size


def _flops_gn(call):
    # sum, subtract + square + sum, then the FMA per element (as layer_norm's 8), the activation
    return (8 + FLOPS_PER_ELEMENT[call.args.code]) * call.args.x.size


def _bytes(call):
    """x read once and out written once; the (C,) parameters."""
    a = call.args
    params = [getattr(a, f) for f in ("running_mean", "running_var", "weight", "bias") if hasattr(a, f)]
    return (2 * a.x.size + sum(p.size for p in params if p is not None)) * np.dtype(a.x.dtype).itemsize


def _default_groups(c):
    """The largest divisor of C up to 32 (GroupNorm(32) when C allows)."""
    return max(g for g in range(1, min(c, 32) + 1) if c % g == 0) if c else 1


def _synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: standard-normal x and bias, weight near 1, running_mean near 0 and
    running_var near 1 (positive); every array in the 16-bit dtype of a case with
    activations="bfloat16" / "float16"."""
    dtype = case_dtype(params, dtype)
    out = {}
    for name, shape in shapes.items():
        v = rng.standard_normal(shape)
        if name == "weight":
            v = 1.0 + 0.1 * v
        elif name == "running_mean":
            v = 0.1 * v
        elif name == "running_var":
            v = 0.5 + np.abs(v)
        out[name] = np.asarray(v).astype(dtype)
    return out


def _synthesize_gn(shapes, params, rng, dtype):
    """_synthesize's arrays, and num_groups when the case does not give it: GroupNorm(32),
    or the largest divisor of C below 32."""
    out = _synthesize(shapes, params, rng, dtype)
    if "num_groups" not in params:
        out["num_groups"] = _default_groups(shapes["x"][1])
    return out


def _sig_bn(i):
    return ((i["x"], i["running_mean"], i["running_var"], i.get("weight"), i.get("bias")),
            {"eps": i.get("eps", 1e-5), "activation": i.get("activation")})


def _sig_gn(i):
    return ((i["x"], i["num_groups"], i.get("weight"), i.get("bias")),
            {"eps": i.get("eps", 1e-5), "activation": i.get("activation")})


def _gn_rule():
    """serial_parallel_rule's threshold, and serial for one (sample, group) block whatever
    its size: the parallel kernel splits over groups, one group is one thread's work."""
    base = serial_parallel_rule("size", PARALLEL_THRESHOLD["group_norm"], _MEASURED["group_norm"])

    def choose(key):
        if key.blocks < 2:
            return ("cpu-serial", "cpu-parallel"), "one (sample, group) block: the parallel kernel splits over groups"
        return base.choose(key)

    return Rule(base.names, choose)


def _register(name, describe, signature, flops, synthesize, rule, host, serial, parallel, what):
    op = register_op(Op(name, describe, family="channel_norm", bound="memory", signature=signature, flops=flops,
                        memo=True, bytes=_bytes, rules={"cpu": rule}, synthesize=synthesize))
    register(Implementation(name, "cpu-serial", "cpu", host(*serial), notes=HOST_COPY_NOTE + _HALF_NOTE,
                            dtypes=_DTYPES, kernel_modules=_KERNELS))
    register(Implementation(name, "cpu-parallel", "cpu", host(*parallel), kernel_modules=_KERNELS, dtypes=_DTYPES,
                            notes=f"{HOST_COPY_NOTE}; {what} split over threads" + _HALF_NOTE))
    return op


_DTYPES = FLOAT_DTYPES + V.HALF_DTYPES
_batch_norm = _register("batch_norm", _describe_bn, _sig_bn, _flops_bn, _synthesize,
                        serial_parallel_rule("size", PARALLEL_THRESHOLD["batch_norm"], _MEASURED["batch_norm"]),
                        _bn_host, (K.batch_norm_serial, K.batch_norm_half_serial),
                        (K.batch_norm_parallel, K.batch_norm_parallel), "even element ranges")
_group_norm = _register("group_norm", _describe_gn, _sig_gn, _flops_gn, _synthesize_gn, _gn_rule(), _gn_host,
                        (K.group_norm_serial, K.group_norm_half_serial),
                        (K.group_norm_parallel, K.group_norm_parallel), "(sample, group) blocks")


@_batch_norm.expose
def batch_norm(x, running_mean, running_var, weight=None, bias=None, *, eps=1e-5, activation=None, out=None):
    """Inference batch normalization over channel dimension 1 of x (N, C, *spatial), as
    torch.nn.functional.batch_norm(training=False), then the activation:

        act((x - running_mean) / sqrt(running_var + eps) * weight + bias)

    running_mean, running_var, weight, bias: (C,) (weight / bias may be None).  The
    per-channel scale and shift are folded once per call (in float64) and x streams through
    one fused multiply-add + activation pass, as PyTorch's CPU kernel does: like it, a
    channel whose values sit far from zero relative to their spread (|mean| >> sqrt(var))
    keeps the dtype's absolute precision of x * scale, not the relative precision of the
    result.  activation: None, "relu", "gelu", "gelu_tanh" or "silu".  A negative
    running_var gives NaN in its channel.  eps must be finite and > 0 (ValueError naming
    eps)."""
    return _batch_norm(x, running_mean, running_var, weight, bias, eps=eps, activation=activation, out=out)


@_group_norm.expose
def group_norm(x, num_groups, weight=None, bias=None, *, eps=1e-5, activation=None, out=None):
    """Group normalization of x (N, C, *spatial), as torch.nn.functional.group_norm, then
    the activation: the C channels are split into num_groups groups of C / num_groups
    consecutive channels, each (sample, group) block normalized by its own mean and biased
    variance, then weight[c] and bias[c] (C,) applied per channel (None: 1 and 0).

    num_groups must divide C (ValueError naming num_groups).  activation: None, "relu",
    "gelu", "gelu_tanh" or "silu" (GroupNorm + SiLU of a diffusion U-Net in one call).
    A constant block gives exactly bias (before the activation)."""
    return _group_norm(x, num_groups, weight, bias, eps=eps, activation=activation, out=out)
