"""Public layer_norm and rms_norm over the last dimension.

Both take x of any shape (..., D), optional (D,) weight (and bias for layer_norm), and an
optional residual of x's shape: then h = x + residual is formed in the same pass and the
call returns (norm(h), h) -- the pre-norm transformer pattern, one pass over memory.
float32 or float64; mixed dtypes are a TypeError.  On the CPU x may also be bfloat16
(ml_dtypes.bfloat16) or float16, as PyTorch's bfloat16 / float16 norms: residual in x's
dtype, weight and bias in x's dtype or float32; computed in float32 and rounded to x's
dtype (nearest even), with h = x + residual rounded first and normalized as rounded.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_cpu import norm as K

from .. import validate as V
from ..registry import FLOAT_DTYPES, Call, Implementation, Op, bucket, register, register_op
from . import _arena
from ._common import (HOST_COPY_NOTE, case_dtype, const_vector, contiguous, deliver, half_bits, kernel_rows,
                      result_buffer, serial_parallel_rule, size_bucket)

# Measured through dispatch with each kernel forced (2 cores, Sapphire Rapids host, numba's
# tbb layer, float32, D = 768, no residual; medians, 2026-11-26, quiet host; /tmp/xover.py
# of the session note), per call in (a) a loop and (e) batches of 10 calls after 10 ms
# pauses, serial / parallel microseconds:
#   layer_norm 128 rows (2^16.6) (a) 26.5 / 35.0 (e) 29.1 / 47.8;  256 rows (a) 50-52 / 62-64
#   (e) 55-57 / 74;  512 rows (2^18.6) (a) 113-128 / 110-144 (e) 126-133 / 96-162 (a tie,
#   run to run);  1024 rows (a) 257-261 / 145-155 (e) 258-268 / 206-221.
#   rms_norm 256 rows (a) 36-40 / 49-55 (e) 41-46 / 60-68;  512 rows (a) 102-109 / 52-55
#   (e) 109-125 / 141-153;  1024 rows (a) 245 / 137 (e) 256 / 287.
# Under tbb a parallel call costs ~10 us more than a serial one at these sizes (16 rows:
# 18.3 vs 10.4 us); the earlier thresholds (2^15 / 2^16, from 2026-11-22 under another
# threading layer, 3-4 us per hand-out) sent 64-256 rows to the slower kernel.
# On an AVX2 Zen 3 VM (2026-12-02) the verdict at 512 rows (2^18.6) depended on what ran
# between calls: the forward alone in a loop, serial / parallel 128-189 / 178-263 us, and
# right after a PyTorch linear 597-744 / 737-898 us; but batches of 20 autograd forward +
# backward calls 1276-1438 / 1011-1083 us.  2^18 stays (git log of this line: 5c32445 and
# its revert).
# Re-measured on the thread team (parallel.row_run), forced serial / parallel through
# dispatch, float32, Xeon with AVX-512, 2 vCPUs (2026-12-03), us, [loop | after 0.2 s idle |
# paced: 10 calls after 10 ms]: layer_norm D=768, 128 rows (2^16.6) 24-29 / 21-24 | 436-467
# / 501-574 | 38-41 / 48-58; 256 rows (2^17.6) 53-58 / 33-34 | 537-564 / 489-542 | 74-90 /
# 69-80; 384 rows (2^18.2) 89 / 42 | 556 / 496 | 113 / 92.  rms_norm D=768, 256 rows 41 / 24
# | 472 / 503 | 60 / 74; D=4096, 64 rows (2^18) 67 / 32 | 565 / 584 | 93 / 69.  Serial
# wins below 2^17 in every setting but the loop, 2^17.6 is mixed, parallel wins from 2^18:
# 2^18 stays.
# Re-checked after the team stopped sharing the caller's CPU (Zen 4, 2026-12-06, forced
# through dispatch, serial / parallel us, [loop | one call after 0.2 s idle | paced | 500
# calls after 0.2 s | right after our matmul 128x768x768 | right after torch's]):
# layer_norm 128x768 29.1 / 30.9 | 283 / 353 | 42.7 / 67.7 | 29.2 / 31.5 | 42.5 / 75.9 | 38.8 /
# 93.0; 128x384 20.7 / 17.6 | 244 / 343 | 32.1 / 42.5 | 19.7 / 21.2 | 27.7 / 46.1 | 29.7 /
# 43.2; 256x768 (2^17.6) 49.9 / 46.1 | 310 / 410 | 78.8 / 90.3 | 67.9 / 43.8 | 96.8 / 71.2 |
# 107 / 106; rms_norm 128x768 23.8 / 18.4 | 327 / 373 | 37.5 / 54.9 | 30.3 / 23.8 | 57.8 /
# 47.4 | 36.5 / 66.4.  The same picture: 2^18 stays.
# bfloat16 x (the same kernels' arithmetic on widened rows, Zen 4, 2026-12-06,
# /tmp/w/xover55.py, same columns): layer_norm 64x768 24.5 / 21.3 | 272 / 329 | 40.1 / 39.0 |
# 25.4 / 23.1 | 35.6 / 29.8 | 48.1 / 46.6; 128x768 40.1 / 31.0 | 307 / 382 | 51.0 / 47.8 | 41.0
# / 33.9 | 51.7 / 61.7 | 52.4 / 71.6; 256x768 69.7 / 48.6 | 333 / 394 | 76.9 / 66.0 | 70.0 /
# 49.4 | 80.1 / 61.1 | 77.7 / 92.4; 512x768 128 / 80.3 | 416 / 452 | 166 / 122 | 130 / 101 |
# 131 / 122 | 137 / 206.  Parallel wins more of the settings than for float32 below 2^18
# but still loses after idle and next to PyTorch: the same threshold.
# Re-checked after the heartbeat began parking on a futex (Sapphire Rapids, 2026-12-07,
# /tmp/w/thr.py: forced through dispatch.use, medians of 12 rounds, serial / parallel us,
# [loop | one call after 0.2 s idle | 10 calls after 10 ms | right after a PyTorch linear]):
# layer_norm 128x768 26.9 / 29.2 | 317 / 344 | 27.7 / 25.3 | 89.7 / 111; 128x384 17.7 / 19.0
# | 247 / 402 | 18.0 / 17.4 | 76.9 / 95.0; 256x768 52.1 / 56.8 | 381 / 569 | 53.6 / 37.7 |
# 122 / 146; rms_norm 128x768 19.0 / 22.7 | 319 / 373 | 19.6 / 18.7 | 91.8 / 106: 2^18 stays.
PARALLEL_THRESHOLD = {"layer_norm": 1 << 18, "rms_norm": 1 << 18}
_MEASURED = {"layer_norm": "layer_norm float32 serial vs parallel (thread team, loop, after idle and paced): serial "
                           "ahead below 2^17, mixed at 2^17.6, parallel ahead from 2^18 elements",
             "rms_norm": "rms_norm float32 serial vs parallel (thread team, loop, after idle and paced): serial "
                         "ahead below 2^17 but in a loop, mixed at 2^17.6, parallel ahead from 2^18 elements"}


_KERNELS = ("kernels_cpu.norm", "kernels_cpu.half", "kernels_cpu.approx", "kernels_cpu.parallel")
_F32 = np.dtype(np.float32)
_DTYPES = FLOAT_DTYPES + V.HALF_DTYPES
_HALF_NOTE = ("; bfloat16 / float16: rows widened to float32 a few at a time, h = x + residual and the output rounded to "
              "x's dtype (nearest even)")


class NormKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int           # bucket of x.size
    row_len: int        # bucket of D
    has_weight: bool
    has_bias: bool
    has_residual: bool


class NormArgs(NamedTuple):
    x: object           # (..., D)
    weight: object      # (D,) or None
    bias: object        # (D,) or None (always None for rms_norm)
    residual: object    # x's shape or None
    eps: float          # finite, > 0, finite in x's dtype
    out: object


def _check(name, x, weight, bias, eps, residual, out):
    dev = V.device_of(x=x, weight=weight, bias=bias, residual=residual, out=out)
    dt = V.cpu_float_dtype("x", x, dev)
    half = V.is_half(dt)
    V.rank("x", x, (1, 64), " (..., D)")
    d = x.shape[-1]
    for pname, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            if half:   # PyTorch's mixed form too: float32 parameters of a bfloat16 / float16 x
                pdt = V.dtype_of(p)
                if not (pdt == dt or pdt == np.float32):
                    raise TypeError(f"{pname} must have dtype {dt} or float32 for a {dt} x, got {pdt}")
            else:
                V.same_dtype(pname, p, "x", dt)
            V.shape(pname, p, (d,), " (D,) for x's last dimension")
    if residual is not None:
        V.same_dtype("residual", residual, "x", dt)
        V.shape("residual", residual, tuple(x.shape), " (x's shape)")
    eps = V.finite("eps", eps, positive=True, dtype=np.float32 if half else dt)
    V.out(out, x.shape, dt, x=x, weight=weight, bias=bias, residual=residual)
    key = NormKey(name, dev, dt, size_bucket(*x.shape), bucket(d),
                  weight is not None, bias is not None, residual is not None)
    return Call(key, NormArgs(x, weight, bias, residual, eps, out))


def _describe_ln(x, weight=None, bias=None, *, eps=1e-5, residual=None, out=None):
    """Call.args = NormArgs, key NormKey.  run() returns out, or (out, h) with a residual."""
    return _check("layer_norm", x, weight, bias, eps, residual, out)


def _describe_rms(x, weight=None, *, eps=1e-6, residual=None, out=None):
    """Call.args = NormArgs with bias None, key NormKey with has_bias False."""
    return _check("rms_norm", x, weight, None, eps, residual, out)


def _f32(p, d, fill):
    """A weight / bias of a bfloat16 / float16 call as the kernel's float32 vector (None: `fill`)."""
    if p is None:
        return const_vector(d, _F32, fill)
    return contiguous(p) if p.dtype == _F32 else np.ascontiguousarray(p, dtype=_F32)


def _run_half(kernel, rms, x, weight, bias, residual, eps, res, h, d):
    """The 16-bit kernels (kernels_cpu/norm.py) on the bit patterns of x, residual, h and
    the result (bfloat16 or float16), with float32 weight and bias."""
    xc = half_bits(kernel_rows(x, d))
    res2 = half_bits(res if res.ndim == 2 else res.reshape(-1, d))
    r = hc = xc
    if residual is not None:
        r, hc = half_bits(kernel_rows(residual, d)), half_bits(h.reshape(-1, d))
    kernel(xc, r, hc, _f32(weight, d, 1.0), _f32(bias, d, 0.0), _F32.type(eps), res2, residual is not None, rms)


def _host(kernel, with_bias, kernel_half):
    def run(params, x, weight, bias, residual, eps, out):
        d = x.shape[-1]
        dt = x.dtype
        res = result_buffer(out, x.shape, dt)
        h = None if residual is None else _arena.empty(x.shape, dt)
        if x.size and dt.itemsize == 2:   # bfloat16 / float16 (validate.cpu_float_dtype in _check)
            _run_half(kernel_half, not with_bias, x, weight, bias, residual, eps, res, h, d)
        elif x.size:
            xc = kernel_rows(x, d)
            res2 = res if res.ndim == 2 else res.reshape(-1, d)
            w = const_vector(d, dt, 1.0) if weight is None else contiguous(weight)
            if residual is None:
                r = hc = xc  # not touched when has_res is False
            else:
                r, hc = kernel_rows(residual, d), h.reshape(-1, d)
            if with_bias:
                b = const_vector(d, dt, 0.0) if bias is None else contiguous(bias)
                kernel(xc, r, hc, w, b, dt.type(eps), res2, residual is not None)
            else:
                kernel(xc, r, hc, w, dt.type(eps), res2, residual is not None)
        res = deliver(res, out)
        return res if residual is None else (res, h)

    return run


def _flops_ln(call):
    # sum, subtract+square+sum, normalize (sub, mul, mul, add); +1 per element with residual
    return (8 + (call.args.residual is not None)) * call.args.x.size


def _flops_rms(call):
    return (4 + (call.args.residual is not None)) * call.args.x.size


def _bytes(call):
    """x read, out written; with a residual also residual read and h written; parameters."""
    x, weight, bias, residual = call.args.x, call.args.weight, call.args.bias, call.args.residual
    streams = 2 if residual is None else 4
    params = sum(p.size for p in (weight, bias) if p is not None)
    return (streams * x.size + params) * x.dtype.itemsize


def _synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: standard-normal x (and bias, residual), weight near 1; with
    activations="bfloat16" / "float16" every array in that dtype (a 16-bit model's norm)."""
    dtype = case_dtype(params, dtype)
    out = {}
    for name, shape in shapes.items():
        v = rng.standard_normal(shape)
        out[name] = (1.0 + 0.1 * v if name == "weight" else v).astype(dtype)
    return out


def _sig_ln(i):
    return (i["x"], i.get("weight"), i.get("bias")), {"eps": i.get("eps", 1e-5), "residual": i.get("residual")}


def _sig_rms(i):
    return (i["x"], i.get("weight")), {"eps": i.get("eps", 1e-6), "residual": i.get("residual")}


def _register(name, describe, signature, flops, serial, parallel, with_bias):
    rule = serial_parallel_rule("size", PARALLEL_THRESHOLD[name], _MEASURED[name])
    op = register_op(Op(name, describe, memo=True, family="norm", bound="memory", signature=signature, flops=flops,
                        bytes=_bytes, rules={"cpu": rule}, synthesize=_synthesize))
    register(Implementation(name, "cpu-serial", "cpu", _host(serial, with_bias, K.norm_half_serial),
                            dtypes=_DTYPES, notes=HOST_COPY_NOTE + _HALF_NOTE, kernel_modules=_KERNELS))
    register(Implementation(name, "cpu-parallel", "cpu", _host(parallel, with_bias, K.norm_half_parallel),
                            dtypes=_DTYPES, kernel_modules=_KERNELS,
                            notes=HOST_COPY_NOTE + "; rows split over threads" + _HALF_NOTE))
    return op


_layer_norm = _register("layer_norm", _describe_ln, _sig_ln, _flops_ln, K.layer_norm_serial,
                        K.layer_norm_parallel, True)
_rms_norm = _register("rms_norm", _describe_rms, _sig_rms, _flops_rms, K.rms_norm_serial, K.rms_norm_parallel,
                      False)


@_layer_norm.expose
def layer_norm(x, weight=None, bias=None, *, eps=1e-5, residual=None, out=None):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension (biased
    variance, as torch.nn.functional.layer_norm).  weight/bias: (D,) or None.

    With residual (x's shape): h = x + residual, returns (layer_norm(h), h), computed in
    one pass; out= then receives the normalized output and h is a new array.
    eps must be finite and > 0 (ValueError naming eps).  x float32 / float64, or on the CPU
    bfloat16 (ml_dtypes) or float16 (weight / bias in x's dtype or float32): float32
    inside, h and the result rounded to x's dtype."""
    return _layer_norm(x, weight, bias, eps=eps, residual=residual, out=out)


@_rms_norm.expose
def rms_norm(x, weight=None, *, eps=1e-6, residual=None, out=None):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension (as
    torch.nn.functional.rms_norm).  weight: (D,) or None.

    With residual (x's shape): h = x + residual, returns (rms_norm(h), h) in one pass;
    out= then receives the normalized output and h is a new array.
    eps must be finite and > 0 (ValueError naming eps).  bfloat16 / float16 x on the
    CPU as layer_norm."""
    return _rms_norm(x, weight, eps=eps, residual=residual, out=out)
