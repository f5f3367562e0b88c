"""Backward ops of softmax, log_softmax and cross_entropy (issue #13).

softmax_backward(grad_out, y, axis)      dx = y * (g - sum(g * y))   (y: softmax's output)
log_softmax_backward(grad_out, y, axis)  dx = g - exp(y) * sum(g)     (y: log_softmax's output)
cross_entropy_with_grad(logits, targets) (loss, dloss/dlogits) in the forward's own sweep
cross_entropy_backward(grad_loss, logits, targets)  the gradient, softmax recomputed

Any reduction axis (as the forwards), float32 / float64.  The cross-entropy ops follow
dispatch.cross_entropy's semantics (PyTorch's): (N, C) logits, (N,) integer targets,
reduction "mean" (over rows whose target is not ignore_index; NaN loss when all are
ignored), "sum" or "none"; ignored rows get loss 0 and a zero gradient row.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_cpu import softmax_grad as K

from .. import devices
from .. import validate as V
from ..registry import Call, Implementation, Op, bucket, draw_normal, register, register_op, shape_only
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_rule, size_bucket
from .softmax import PARALLEL_THRESHOLD as FORWARD_PARALLEL_THRESHOLD
from .softmax import REDUCTIONS, _host_targets

# The serial / parallel crossover is the forward kernels' (dispatch/ops/softmax.py: 2^14
# elements, measured on a quieter host): these kernels have the forward's shape (rows of
# two or three in-cache passes) and cross where they do.  Measured side by side with the
# forward's softmax kernels in one run (float32 kernels alone, medians of 15 interleaved
# rounds, 2026-11-25, Intel Xeon, 2 cores under load average ~5.7 from other jobs):
#   elements (rows x 1024)     2^14          2^16          2^20            2^22
#   softmax_backward  s / p    7.2 / 32.8    22.1 / 58.3   905 / 1287      4816 / 4742 us
#   ce_with_grad      s / p    17.3 / 42.7   55.0 / 103    1089 / 1387     7017 / 7831 us
#   softmax forward   s / p    17.0 / 48.8   63.1 / 124    1108 / 1222     6446 / 5175 us
# Under that load a second thread pays off for none of them below 2^22.  On a quiet host
# (2026-11-26, Sapphire Rapids, tbb layer, through dispatch with each kernel forced; serial /
# parallel us per call in (a) a loop and (e) batches of 10 calls after 10 ms pauses):
#   rows x 1024             2^14               2^16               2^17                2^18
#   softmax_backward  (a)   10 / 26            17 / 38            45 / 45             101 / 48
#                     (e)   26 / 45            38 / 50            63 / 108            107 / 138
#   ce_with_grad      (a)   16 / 31            32 / 48            57 / 77             119 / 121
#                     (e)   18 / 40            35 / 54            63 / 93             125 / 171
# the same crossover as the forward's: serial ahead through 2^16, the two trade places from
# 2^17.  One threshold for the family keeps forward and backward alike: the forward's.
PARALLEL_THRESHOLD = FORWARD_PARALLEL_THRESHOLD
_MEASURED = "the forward softmax kernels' crossover (dispatch/ops/softmax.py); the backward kernels cross with them"
_RULE = serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)
_KERNELS = ("kernels_cpu.softmax_grad", "kernels_cpu.softmax", "kernels_cpu.approx", "kernels_cpu.parallel")


class SoftmaxGradKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int          # bucket of y.size
    row_len: int       # bucket of the reduced length
    last_axis: bool    # the reduction runs along the last axis


class SoftmaxGradArgs(NamedTuple):
    grad_out: object
    y: object
    axis: int          # non-negative, < y.ndim
    out: object
    log: bool          # False: softmax backward, True: log_softmax backward


class CrossEntropyGradKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int          # bucket of logits.size
    row_len: int       # bucket of C
    reduction: str


class CrossEntropyGradArgs(NamedTuple):
    logits: object     # (N, C)
    targets: object    # (N,) integer
    reduction: str
    ignore_index: int
    grad_out: object   # where the gradient goes (None: a new array); may be logits itself
    grad_loss: object  # upstream gradient: None (1), a float, a 0-d array, or (N,) for "none"
    with_loss: bool    # cross_entropy_with_grad (True) or cross_entropy_backward (False)


# ---- softmax_backward / log_softmax_backward ----------------------------------------------

def _describe_softmax_grad(name, log):
    def describe(grad_out, y, axis=-1, *, out=None):
        """Call.args = SoftmaxGradArgs; key SoftmaxGradKey."""
        V.required(grad_out=grad_out, y=y)
        dev = V.device_of(grad_out=grad_out, y=y, out=out)
        dt = V.float_dtype("y", y)
        V.same_dtype("grad_out", grad_out, "y", dt)
        if len(y.shape) == 0:
            raise ValueError(f"y must have at least 1 dimensions, got shape {tuple(y.shape)}")
        V.shape("grad_out", grad_out, tuple(y.shape), " (the shape of y)")
        ax = V.axis("axis", axis, len(y.shape))
        V.out(out, tuple(y.shape), dt, grad_out=grad_out, y=y)
        key = SoftmaxGradKey(name, dev, dt, size_bucket(*y.shape), bucket(y.shape[ax]), ax == len(y.shape) - 1)
        return Call(key, SoftmaxGradArgs(grad_out, y, ax, out, log))

    return describe


def _split(shape, axis):
    outer = 1
    for s in shape[:axis]:
        outer *= s
    inner = 1
    for s in shape[axis + 1:]:
        inner *= s
    return outer, shape[axis], inner


def _softmax_grad_host(row_kernel, col_kernel):
    def run(params, grad_out, y, axis, out, log):
        shape = tuple(y.shape)
        g, yc = contiguous(grad_out), contiguous(y)
        res = result_buffer(out, shape, y.dtype)
        if y.size:
            outer, n, inner = _split(shape, axis)
            if inner == 1:
                row_kernel(g.reshape(outer, n), yc.reshape(outer, n), res.reshape(outer, n), log)
            else:
                s3 = (outer, n, inner)
                col_kernel(g.reshape(s3), yc.reshape(s3), res.reshape(s3), log, K.col_tasks(s3))
        return deliver(res, out)

    return run


def _sm_flops(call):
    # sum: multiply-add (softmax) or add (log); write: subtract and multiply (log: exp too)
    return 4 * call.args.y.size


def _sm_bytes(call):
    y = call.args.y
    return 3 * y.size * y.dtype.itemsize


def _sm_synthesize(log):
    def synthesize(shapes, params, rng, dtype):
        """Benchmark inputs: y = (log_)softmax of standard-normal logits along the axis,
        grad_out standard normal."""
        if shape_only(rng):  # the CUDA model's inputs: shapes only
            return {"grad_out": draw_normal(rng, shapes["grad_out"], dtype), "y": draw_normal(rng, shapes["y"], dtype)}
        x = rng.standard_normal(shapes["y"])
        axis = params.get("axis", -1)
        x = x - x.max(axis=axis, keepdims=True)
        ls = x - np.log(np.exp(x).sum(axis=axis, keepdims=True))
        y = ls if log else np.exp(ls)
        return {"grad_out": rng.standard_normal(shapes["grad_out"]).astype(dtype), "y": y.astype(dtype)}

    return synthesize


def _sig_sm(i):
    return (i["grad_out"], i["y"]), {"axis": i.get("axis", -1)}


_NOTE_AXIS = "; another reduction axis runs on (outer, n, inner) in chunks of the inner axis, no transposed copy"


def _register_sm(name, log):
    op = register_op(Op(name, _describe_softmax_grad(name, log), memo=True, family="softmax_grad", bound="memory",
                        signature=_sig_sm, flops=_sm_flops, bytes=_sm_bytes, rules={"cpu": _RULE},
                        synthesize=_sm_synthesize(log)))
    register(Implementation(name, "cpu-serial", "cpu", _softmax_grad_host(K.rows_serial, K.cols_serial),
                            notes=HOST_COPY_NOTE + _NOTE_AXIS, kernel_modules=_KERNELS))
    register(Implementation(name, "cpu-parallel", "cpu", _softmax_grad_host(K.rows_parallel, K.cols_parallel),
                            notes=HOST_COPY_NOTE + _NOTE_AXIS + "; rows (or column chunks) split over threads",
                            kernel_modules=_KERNELS))
    return op


_softmax_backward = _register_sm("softmax_backward", False)
_log_softmax_backward = _register_sm("log_softmax_backward", True)


# ---- cross_entropy_with_grad / cross_entropy_backward --------------------------------------

def _same_array(a, b) -> bool:
    """a and b are the same elements of the same memory (same start, shape and strides)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        ia, ib = a.__array_interface__, b.__array_interface__
        return (ia["data"][0] == ib["data"][0] and a.shape == b.shape and a.strides == b.strides)
    ha, hb = devices._sim_host(a), devices._sim_host(b)  # simulator arrays
    if ha is not None and hb is not None:
        return _same_array(ha, hb)
    if not (hasattr(a, "__cuda_array_interface__") and hasattr(b, "__cuda_array_interface__")):
        return False
    ia, ib = a.__cuda_array_interface__, b.__cuda_array_interface__
    return (ia["data"][0] == ib["data"][0] and tuple(ia["shape"]) == tuple(ib["shape"])
            and ia.get("strides") == ib.get("strides"))


def _check_grad_out(grad_out, logits, targets, dt):
    if tuple(grad_out.shape) != tuple(logits.shape):
        raise ValueError(f"grad_out must have shape {tuple(logits.shape)} (the shape of logits), "
                         f"got {tuple(grad_out.shape)}")
    if V.dtype_of(grad_out) != dt:
        raise TypeError(f"grad_out must have dtype {dt} (the dtype of logits), got {V.dtype_of(grad_out)}")
    if isinstance(grad_out, np.ndarray) and not grad_out.flags.writeable:
        raise ValueError("grad_out must be writeable, got a read-only array")
    inputs = {"targets": targets}
    if not _same_array(grad_out, logits):  # logits itself is allowed: the gradient overwrites them
        inputs["logits"] = logits
    V._written("grad_out", grad_out, "", "pass logits itself (to overwrite them) or a separate array", inputs)


def _ce_common(logits, targets, reduction, ignore_index, **others):
    V.required(logits=logits, targets=targets)
    dev = V.device_of(logits=logits, targets=targets, **others)
    dt = V.float_dtype("logits", logits)
    V.rank("logits", logits, 2, " (N, C)")
    tdt = V.dtype_of(targets)
    if tdt.kind not in "iu":
        raise TypeError(f"targets must have an integer dtype, got {tdt}")
    V.shape("targets", targets, (logits.shape[0],), " (N,) to match logits (N, C)")
    V.choice("reduction", reduction, REDUCTIONS)
    ignore_index = V.integer("ignore_index", ignore_index, np.int64)
    return dev, dt, ignore_index


def _ce_key(name, dev, dt, logits, reduction):
    return CrossEntropyGradKey(name, dev, dt, size_bucket(*logits.shape), bucket(logits.shape[1]), reduction)


def _describe_with_grad(logits, targets, *, reduction="mean", ignore_index=-100, grad_out=None):
    """Call.args = CrossEntropyGradArgs (with_loss True); key CrossEntropyGradKey."""
    dev, dt, ignore_index = _ce_common(logits, targets, reduction, ignore_index, grad_out=grad_out)
    if grad_out is not None:
        _check_grad_out(grad_out, logits, targets, dt)
    key = _ce_key("cross_entropy_with_grad", dev, dt, logits, reduction)
    return Call(key, CrossEntropyGradArgs(logits, targets, reduction, ignore_index, grad_out, None, True))


def _describe_backward(grad_loss, logits, targets, *, reduction="mean", ignore_index=-100):
    """Call.args = CrossEntropyGradArgs (with_loss False); grad_loss a real number or an
    array of shape () or (1,) for "mean" / "sum", an (N,) array for "none" (logits' dtype)."""
    V.required(grad_loss=grad_loss)
    arr = not isinstance(grad_loss, (int, float, np.integer, np.floating)) or isinstance(grad_loss, bool)
    dev, dt, ignore_index = _ce_common(logits, targets, reduction, ignore_index,
                                       **({"grad_loss": grad_loss} if arr else {}))
    if arr:
        V.same_dtype("grad_loss", grad_loss, "logits", dt)
        if reduction == "none":
            V.shape("grad_loss", grad_loss, (logits.shape[0],), " for reduction 'none' (one per row)")
        elif tuple(grad_loss.shape) not in ((), (1,)):
            raise ValueError(f"grad_loss must have shape () or (1,) for reduction {reduction!r} (the loss is a "
                             f"scalar), got {tuple(grad_loss.shape)}")
    else:
        if reduction == "none":
            raise ValueError(f"grad_loss must be an array of shape ({logits.shape[0]},) for reduction 'none', "
                             f"got a scalar")
        grad_loss = V.real("grad_loss", grad_loss)
    key = _ce_key("cross_entropy_backward", dev, dt, logits, reduction)
    return Call(key, CrossEntropyGradArgs(logits, targets, reduction, ignore_index, None, grad_loss, False))


def _bad_target(t, bad, c, ignore_index):
    return ValueError(f"targets[{bad}] = {t[bad]} is out of range: class indices must be in "
                      f"[0, {c}) or equal ignore_index={ignore_index}")


def _ce_grad_host(kernel):
    def run(params, logits, targets, reduction, ignore_index, grad_out, grad_loss, with_loss):
        n, c = logits.shape
        dt = logits.dtype
        t = _host_targets(targets, ignore_index, c)
        bad, count = K.ce_check_count(t, c, ignore_index)
        if bad >= 0:
            raise _bad_target(t, bad, c, ignore_index)
        x = contiguous(logits)
        grad = result_buffer(grad_out, (n, c), dt)
        per_row = reduction == "none" and grad_loss is not None
        if grad_loss is None:
            scales = np.ones(1, dt)
        elif isinstance(grad_loss, float):
            scales = np.full(1, grad_loss, dt)
        else:
            scales = contiguous(np.asarray(grad_loss).reshape(-1))
        base = 1.0 / count if reduction == "mean" and count else 1.0
        losses = np.empty(n, dt)
        total = kernel(x, t, ignore_index, grad, losses, scales, per_row, base) if n else 0.0
        grad = deliver(grad, grad_out)
        if not with_loss:
            return grad
        if reduction == "none":
            loss = losses
        elif reduction == "sum":
            loss = np.asarray(total, dt)
        else:
            loss = np.asarray(total / count if count else np.nan, dt)
        return loss, grad

    return run


def _ce_flops(call):
    return 6 * call.args.logits.size


def _ce_bytes(call):
    a = call.args
    n_out = a.logits.shape[0] if a.reduction == "none" else 1
    return (2 * a.logits.size + n_out) * a.logits.dtype.itemsize + a.targets.size * a.targets.dtype.itemsize


def _ce_synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: standard-normal logits (N, C), targets drawn from [0, C); for the
    backward, grad_loss 1 (a 0-d array; (N,) ones for reduction 'none')."""
    n, c = shapes["logits"]
    out = {"logits": rng.standard_normal((n, c)).astype(dtype),
           "targets": rng.integers(0, c, size=n, dtype=np.int64)}
    if "grad_loss" in shapes:
        out["grad_loss"] = np.ones(shapes["grad_loss"], dtype)
    return out


_WITH_GRAD_NOTE = ("one sweep per row: max, exp written to the gradient with the sum, the row scaled "
                   "(softmax - onehot) * scale; targets converted to int64; ")
_with_grad = register_op(Op(
    "cross_entropy_with_grad", _describe_with_grad, family="softmax_grad", bound="memory",
    signature=lambda i: ((i["logits"], i["targets"]), {"reduction": i.get("reduction", "mean")}),
    flops=_ce_flops, bytes=_ce_bytes, rules={"cpu": _RULE}, synthesize=_ce_synthesize))
_ce_backward = register_op(Op(
    "cross_entropy_backward", _describe_backward, family="softmax_grad", bound="memory",
    signature=lambda i: ((i["grad_loss"], i["logits"], i["targets"]), {"reduction": i.get("reduction", "mean")}),
    flops=_ce_flops, bytes=_ce_bytes, rules={"cpu": _RULE}, synthesize=_ce_synthesize))
for _name in ("cross_entropy_with_grad", "cross_entropy_backward"):
    register(Implementation(_name, "cpu-serial", "cpu", _ce_grad_host(K.ce_grad_serial),
                            notes=_WITH_GRAD_NOTE + HOST_COPY_NOTE, kernel_modules=_KERNELS))
    register(Implementation(_name, "cpu-parallel", "cpu", _ce_grad_host(K.ce_grad_parallel),
                            notes=_WITH_GRAD_NOTE + HOST_COPY_NOTE + "; rows split over threads",
                            kernel_modules=_KERNELS))

# Example shapes (dispatch.examples: warmup and the contract tests): these input patterns
# are new.  "large" passes the serial / parallel threshold.
_SM_EX = {"small": {"grad_out": (5, 37), "y": (5, 37)}, "large": {"grad_out": (64, 1100), "y": (64, 1100)},
          "decode": {"grad_out": (1, 4096), "y": (1, 4096)}}
EXAMPLE_SHAPES = {
    "softmax_backward": _SM_EX,
    "log_softmax_backward": _SM_EX,
    "cross_entropy_backward": {"small": {"grad_loss": (), "logits": (5, 37)},
                               "large": {"grad_loss": (), "logits": (64, 1100)},
                               "decode": {"grad_loss": (), "logits": (1, 3000)}},
}


# ---- public functions --------------------------------------------------------------------

@_softmax_backward.expose
def softmax_backward(grad_out, y, axis=-1, *, out=None):
    """Gradient of softmax along `axis`: dx = y * (grad_out - sum(grad_out * y, axis)),
    y being softmax's output (what PyTorch's _softmax_backward_data takes).  Returns an
    array of y's shape and dtype (out= when given).  NaN in grad_out or y gives NaN along
    that row."""
    return _softmax_backward(grad_out, y, axis, out=out)


@_log_softmax_backward.expose
def log_softmax_backward(grad_out, y, axis=-1, *, out=None):
    """Gradient of log_softmax along `axis`: dx = grad_out - exp(y) * sum(grad_out, axis),
    y being log_softmax's output (PyTorch's _log_softmax_backward_data)."""
    return _log_softmax_backward(grad_out, y, axis, out=out)


@_with_grad.expose
def cross_entropy_with_grad(logits, targets, *, reduction="mean", ignore_index=-100, grad_out=None):
    """(loss, grad_logits): dispatch.cross_entropy's loss and its gradient with respect to
    logits for an upstream gradient of 1, computed in the forward's own sweep over each row
    (no probability matrix is stored): grad[i] = (softmax(logits[i]) - onehot(t_i)) * scale,
    scale 1 / (number of rows not ignored) for "mean", 1 for "sum" and "none"; ignored rows
    get a zero gradient (all of them when every row is ignored, where the "mean" loss is
    NaN).  A backward pass multiplies the gradient by the upstream scalar ("mean" / "sum").

    grad_out: an array of logits' shape and dtype to write the gradient into (returned as
    the second result).  It may be logits itself when the caller no longer needs them: the
    gradient then overwrites the logits in place and no second (N, C) buffer is allocated
    (Liger-Kernel's memory saving for large vocabularies).  Any other overlap with logits or
    targets is refused.  A target outside [0, C) that is not ignore_index raises ValueError
    naming targets before anything is written."""
    return _with_grad(logits, targets, reduction=reduction, ignore_index=ignore_index, grad_out=grad_out)


@_ce_backward.expose
def cross_entropy_backward(grad_loss, logits, targets, *, reduction="mean", ignore_index=-100):
    """Gradient of dispatch.cross_entropy with respect to logits, the softmax recomputed
    from logits: grad[i] = (softmax(logits[i]) - onehot(t_i)) * g_i with g_i = grad_loss /
    (rows not ignored) for "mean", grad_loss for "sum" (grad_loss a number or an array of
    shape () or (1,)),
    grad_loss[i] for "none" (an (N,) array).  Ignored rows get a zero gradient.  Returns a
    new (N, C) array of logits' dtype."""
    return _ce_backward(grad_loss, logits, targets, reduction=reduction, ignore_index=ignore_index)
