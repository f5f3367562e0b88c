"""Public softmax, log_softmax and cross_entropy.

softmax / log_softmax reduce along one axis (any axis; float32 or float64, and bfloat16 /
float16 on the CPU: float32 inside, the result rounded to the input's dtype; the result has
the input's shape).
cross_entropy takes (N, C) logits and (N,) integer class targets, with
PyTorch's semantics for reduction and ignore_index.

Host implementations work on rows of the last axis: another axis is moved last and copied
(C order) first, and the result is moved back (one more copy).  Non-finite inputs: -inf
entries give 0 (log_softmax -inf); a row that is all -inf, or holds +inf or NaN, gives NaN
(PyTorch gives NaN for these rows too).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_cpu import softmax as K

from .. import validate as V
from ..registry import FLOAT_DTYPES, Call, Implementation, Op, bucket, register, register_op
from . import _arena
from ._common import (HOST_COPY_NOTE, contiguous, deliver, draw_case, half_bits, kernel_input, result_buffer,
                      serial_parallel_rule, size_bucket)

# Measured through dispatch with each kernel forced (2 cores, Sapphire Rapids host, numba's
# tbb layer, float32; medians, 2026-11-26, quiet host), serial / parallel us per call in
# (a) a loop and (e) batches of 10 calls after 10 ms pauses:
#   rows of 1024: 16 rows (2^14) (a) 11.7 / 21.5 (e) 12.3 / 30.0;  64 rows (a) 28-29 / 35-37
#   (e) 30-31 / 43-45;  128 rows (2^17) (a) 50-51 / 43-60 (e) 54-55 / 69-71;  256 rows (a)
#   106-110 / 116-117 (e) 112-119 / 104-134;  512 rows (a) 230 / 132 (e) 244 / 157.
#   rows of 128: 384 rows (2^15.6) (a) 27 / 36 (e) 31 / 61;  1536 rows (2^17.6, the
#   1x12x128x128 scores) (a) 101 / 66 (e) 105 / 122;  3072 rows (a) 308 / 159 (e) 322 / 250.
# A parallel call costs ~10 us more than a serial one under tbb (the 2026-11-22 threshold,
# 2^14, assumed 3-4 us under another threading layer): serial is ahead through 2^16 in both
# settings, the two trade places around 2^17-2^18.  Threshold 2^17.
PARALLEL_THRESHOLD = 1 << 17
_MEASURED = "float32 serial vs parallel (tbb, loop and paced): serial ahead through 2^16, crossover 2^17..2^18 elements"

REDUCTIONS = ("mean", "sum", "none")
_KERNELS = ("kernels_cpu.softmax", "kernels_cpu.half", "kernels_cpu.approx", "kernels_cpu.parallel")


class SoftmaxKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int          # bucket of x.size
    row_len: int       # bucket of the reduced length
    last_axis: bool    # the reduction runs along the last axis


class SoftmaxArgs(NamedTuple):
    x: object
    axis: int          # non-negative, < x.ndim
    out: object
    log: bool          # False: softmax, True: log_softmax


class CrossEntropyKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int          # bucket of logits.size
    row_len: int       # bucket of C
    reduction: str


class CrossEntropyArgs(NamedTuple):
    logits: object     # (N, C)
    targets: object    # (N,) integer
    reduction: str
    ignore_index: int
AXIS_NOTE = "; a reduction axis other than the last is moved last and copied, and the result moved back (copied)"


# ---- softmax / log_softmax ---------------------------------------------------------------

def _describe_softmax(name, log):
    def describe(x, axis=-1, *, out=None):
        """Call.args = SoftmaxArgs; key SoftmaxKey."""
        dev = V.device_of(x=x, out=out)
        dt = V.cpu_float_dtype("x", x, dev)
        if x.ndim == 0:
            raise ValueError(f"x must have at least 1 dimensions, got shape {tuple(x.shape)}")
        ax = V.axis("axis", axis, x.ndim)
        V.out(out, x.shape, dt, x=x)
        key = SoftmaxKey(name, dev, dt, size_bucket(*x.shape), bucket(x.shape[ax]), ax == x.ndim - 1)
        return Call(key, SoftmaxArgs(x, ax, out, log))

    return describe


def _softmax_host(kernels):
    kernel32, kernel_half = kernels   # (held by the closure one by one: the contract tests find them there)

    def run(params, x, axis, out, log):
        half = x.dtype.itemsize == 2   # bfloat16 / float16 (cpu_float_dtype): the kernels take its bits
        kernel = kernel_half if half else kernel32
        last = axis == x.ndim - 1
        xm = x if last else np.moveaxis(x, axis, -1)
        xc = contiguous(xm)
        n = xc.shape[-1]
        if last:
            res = result_buffer(out, x.shape, x.dtype)
        else:
            res = _arena.empty(xc.shape, x.dtype)
        if xc.size:
            x2, r2 = (xc, res) if xc.ndim == 2 else (xc.reshape(-1, n), res.reshape(-1, n))
            kernel(half_bits(x2), half_bits(r2), log) if half else kernel(x2, r2, log)
        if not last:
            res = np.moveaxis(res, -1, axis)
        return deliver(res, out)

    return run


def _softmax_flops(call):
    # max, subtract, exp (counted as one), add, scale: 5 per element
    return 5 * call.args.x.size


def _softmax_bytes(call):
    x = call.args.x
    return 2 * x.size * x.dtype.itemsize


_RULE = serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)
_DTYPES = FLOAT_DTYPES + V.HALF_DTYPES
_HALF_NOTE = ("; bfloat16 / float16: rows widened to float32 a block at a time, the result rounded to the input's "
              "dtype (nearest even)")


def _sig_softmax(i):
    return (i["x"],), {"axis": i.get("axis", -1)}


def _register_softmax(name, log):
    op = register_op(Op(name, _describe_softmax(name, log), memo=True, family="softmax", bound="memory",
                        signature=_sig_softmax, flops=_softmax_flops, bytes=_softmax_bytes, rules={"cpu": _RULE},
                        synthesize=draw_case))
    register(Implementation(name, "cpu-serial", "cpu", _softmax_host((K.softmax_serial, K.softmax_half_serial)),
                            dtypes=_DTYPES, notes=HOST_COPY_NOTE + AXIS_NOTE + _HALF_NOTE, kernel_modules=_KERNELS))
    register(Implementation(name, "cpu-parallel", "cpu",
                            _softmax_host((K.softmax_parallel, K.softmax_parallel)), dtypes=_DTYPES,
                            notes=HOST_COPY_NOTE + AXIS_NOTE + "; rows split over threads" + _HALF_NOTE,
                            kernel_modules=_KERNELS))
    return op


_softmax = _register_softmax("softmax", False)
_log_softmax = _register_softmax("log_softmax", True)


# ---- cross_entropy -----------------------------------------------------------------------

def _describe_cross_entropy(logits, targets, *, reduction="mean", ignore_index=-100):
    """Call.args = CrossEntropyArgs: targets any integer dtype (values are checked by the
    implementation, which raises ValueError naming targets), ignore_index a Python int in
    int64's range.  Key CrossEntropyKey."""
    V.required(logits=logits, targets=targets)
    dev = V.device_of(logits=logits, targets=targets)
    dt = V.float_dtype("logits", logits)
    V.rank("logits", logits, 2, " (N, C)")
    tdt = V.dtype_of(targets)
    if tdt.kind not in "iu":
        raise TypeError(f"targets must have an integer dtype, got {tdt}")
    V.shape("targets", targets, (logits.shape[0],), " (N,) to match logits (N, C)")
    V.choice("reduction", reduction, REDUCTIONS)
    ignore_index = V.integer("ignore_index", ignore_index, np.int64)
    key = CrossEntropyKey("cross_entropy", dev, dt, size_bucket(*logits.shape), bucket(logits.shape[1]), reduction)
    return Call(key, CrossEntropyArgs(logits, targets, reduction, ignore_index))


_INT64_MAX = np.iinfo(np.int64).max


def _host_targets(targets, ignore_index, n_classes):
    """targets as C-contiguous int64 (uint64 values beyond int64 are out of range)."""
    if targets.dtype == np.uint64 and targets.size and targets.max() > _INT64_MAX:
        i = int(np.argmax(targets > _INT64_MAX))
        raise ValueError(f"targets[{i}] = {targets[i]} is out of range: class indices must be in "
                         f"[0, {n_classes}) or equal ignore_index={ignore_index}")
    return kernel_input(np.ascontiguousarray(targets, dtype=np.int64))


def _cross_entropy_host(kernel):
    def run(params, logits, targets, reduction, ignore_index):
        n, c = logits.shape
        t = _host_targets(targets, ignore_index, c)
        bad = K.ce_check(t, c, ignore_index)
        if bad >= 0:
            raise ValueError(f"targets[{bad}] = {t[bad]} is out of range: class indices must be in "
                             f"[0, {c}) or equal ignore_index={ignore_index}")
        x = contiguous(logits)
        losses = np.empty(n, logits.dtype)
        total, count = kernel(x, t, ignore_index, losses)
        if reduction == "none":
            return losses
        if reduction == "sum":
            return np.asarray(total, logits.dtype)
        return np.asarray(total / count if count else np.nan, logits.dtype)

    return run


def _ce_flops(call):
    return 4 * call.args.logits.size


def _ce_bytes(call):
    logits, targets, reduction = call.args.logits, call.args.targets, call.args.reduction
    n_out = logits.shape[0] if reduction == "none" else 1
    return (logits.size + n_out) * logits.dtype.itemsize + targets.size * targets.dtype.itemsize


def _ce_synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: standard-normal logits (N, C), targets drawn from [0, C)."""
    n, c = shapes["logits"]
    return {"logits": rng.standard_normal((n, c)).astype(dtype),
            "targets": rng.integers(0, c, size=n, dtype=np.int64)}


_cross_entropy = register_op(Op(
    "cross_entropy", _describe_cross_entropy, family="softmax", bound="memory",
    signature=lambda i: ((i["logits"], i["targets"]), {"reduction": i.get("reduction", "mean")}),
    flops=_ce_flops, bytes=_ce_bytes, rules={"cpu": _RULE}, synthesize=_ce_synthesize))
register(Implementation("cross_entropy", "cpu-serial", "cpu", _cross_entropy_host(K.cross_entropy_serial),
                        notes=HOST_COPY_NOTE + "; targets converted to int64", kernel_modules=_KERNELS))
register(Implementation("cross_entropy", "cpu-parallel", "cpu", _cross_entropy_host(K.cross_entropy_parallel),
                        notes=HOST_COPY_NOTE + "; targets converted to int64; rows split over threads",
                        kernel_modules=_KERNELS))


# ---- public functions --------------------------------------------------------------------

@_softmax.expose
def softmax(x, axis=-1, *, out=None):
    """exp(x - max) / sum(exp(x - max)) along `axis` (numerically stable for any finite
    input).  -inf entries give 0; a row of all -inf (or holding +inf / NaN) gives NaN, as
    PyTorch.  Returns an array of x's shape and dtype (out= when given).  bfloat16 / float16
    x (CPU): computed in float32, each result rounded to x's dtype."""
    return _softmax(x, axis, out=out)


@_log_softmax.expose
def log_softmax(x, axis=-1, *, out=None):
    """x - max - log(sum(exp(x - max))) along `axis`; -inf entries give -inf; a row of all
    -inf (or holding +inf / NaN) gives NaN."""
    return _log_softmax(x, axis, out=out)


@_cross_entropy.expose
def cross_entropy(logits, targets, *, reduction="mean", ignore_index=-100):
    """Cross-entropy of (N, C) logits against (N,) integer class targets, as
    torch.nn.functional.cross_entropy: loss_i = logsumexp(logits[i]) - logits[i, t_i].

    reduction "mean": mean over rows whose target is not ignore_index (NaN when every row
    is ignored, as PyTorch); "sum": their sum; both return a 0-d array of logits' dtype.
    "none": an (N,) array with 0 for ignored rows.  A target outside [0, C) that is not
    ignore_index raises ValueError naming targets (before anything is computed)."""
    return _cross_entropy(logits, targets, reduction=reduction, ignore_index=ignore_index)
