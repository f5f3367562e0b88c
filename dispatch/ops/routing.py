"""Public topk_softmax: the router of a mixture-of-experts layer (Mixtral, DeepSeek, Qwen-MoE).

    topk_softmax(logits, k, *, renormalize=True) -> (weights, indices)
        logits (T, E): each token's router logits over E experts.
        indices (T, k) int64: the k experts of largest probability, in descending order of
            probability, equal probabilities (equal logits) toward the lower expert index;
        weights (T, k): their softmax probabilities (softmax over all E, computed in the
            accumulation type: float32 for float32 / float16, float64 for float64), divided
            by their sum when renormalize (Mixtral's top-2 renormalization), else as they are
            (DeepSeek-V2).

Conventions chosen: indices are int64, as torch.topk's; weights have the logits' dtype for
float32 and float64, and are float32 for float16 logits (CUDA), as vLLM's fused top-k
softmax returns its float32 topk_weights whatever the gating dtype: the weights feed the
expert combine in float32.  The ranking is by logit, which is the exact order of the
probabilities (exp is increasing), so rounding of the float32 probabilities never reorders
experts.  A row holding NaN, +inf, or only -inf has no softmax (PyTorch's softmax gives
NaN): its weights are NaN and its indices 0..k-1.  k must satisfy 1 <= k <= E.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_cpu import routing as K

from .. import validate as V
from ..registry import Call, Implementation, Op, bucket, register, register_op
from ._common import contiguous, serial_parallel_rule, size_bucket

# Serial below 2^16 logits (bucketed T * E).  Measured 2026-11-23 (AMD znver3, 2 cores, a
# host loaded by other jobs; cpu-serial vs cpu-parallel, medians of 7 alternating rounds
# back to back, and of 7 single calls after 0.2 s idle; float32): E 8 / k 2 at 2^15 343 /
# 188 us in one run, 311 / 323 us in another; E 64 / k 6 at 2^16 474 / 256 us, at 2^18
# 1905 / 1334 us; E 160 / k 6 even at 2^19.3 and 2^21.3; behind after idle up to 2^18.
PARALLEL_THRESHOLD = 1 << 16
_MEASURED = "parallel ahead back to back from 2^16 logits, mixed at 2^15 (measured, 2 cores)"

_KERNELS = ("kernels_cpu.routing", "kernels_cpu.approx", "kernels_cpu.parallel")

# Example inputs for warmup and the contract tests (dispatch/examples.py), k = 2 (the
# signature's default): Mixtral's 8 experts, a DeepSeek-V2-Lite-sized 64 past the
# parallel threshold, one token over DeepSeek-V2's 160.
EXAMPLE_SHAPES = {"topk_softmax": {"small": {"logits": (5, 8)},
                                   "large": {"logits": (3000, 64)},
                                   "decode": {"logits": (1, 160)}}}


def weights_dtype(dtype) -> np.dtype:
    """The dtype of the weights for logits of this dtype (see the module docstring)."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


class RoutingKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int           # bucket of T * E
    tokens: int         # bucket of T
    experts: int        # bucket of E
    k: int
    renormalize: bool


class RoutingArgs(NamedTuple):
    logits: object      # (T, E)
    k: int              # 1 <= k <= E
    renormalize: bool


def _describe(logits, k, *, renormalize=True):
    """Call.args = RoutingArgs, key RoutingKey."""
    V.required(logits=logits)
    dev = V.device_of(logits=logits)
    dt = V.float_dtype("logits", logits)
    V.rank("logits", logits, 2, " (T, E): tokens x experts")
    t, e = int(logits.shape[0]), int(logits.shape[1])
    k = V.integer("k", k)
    if not 1 <= k <= e:
        raise ValueError(f"k must be in [1, E] = [1, {e}] (E: logits' last dimension, the experts), got {k}")
    renormalize = V.flag("renormalize", renormalize)
    key = RoutingKey("topk_softmax", dev, dt, size_bucket(t, e), bucket(t), bucket(e), k, renormalize)
    return Call(key, RoutingArgs(logits, k, renormalize))


def _host(kernel):
    def run(params, logits, k, renormalize):
        t = logits.shape[0]
        weights = np.empty((t, k), weights_dtype(logits.dtype))
        indices = np.empty((t, k), np.int64)
        if t:
            kernel(contiguous(logits), k, renormalize, weights, indices)
        return weights, indices

    return run


def _flops(call):
    """Per logit: the max and the selection compare, and subtract + exp + add for the
    full-row sum without renormalization; per chosen expert: subtract, exp, add, scale."""
    a = call.args
    t, e = a.logits.shape
    return t * e * (2 if a.renormalize else 5) + 4 * t * a.k


def _bytes(call):
    """The logits read once, weights and int64 indices written."""
    a = call.args
    t, e = a.logits.shape
    dt = V.dtype_of(a.logits)
    return t * e * np.dtype(dt).itemsize + t * a.k * (weights_dtype(dt).itemsize + 8)


def _signature(i):
    return (i["logits"], i.get("k", 2)), {"renormalize": i.get("renormalize", True)}


_topk_softmax = register_op(Op("topk_softmax", _describe, family="routing", bound="memory", signature=_signature,
                               memo=True, flops=_flops, bytes=_bytes,
                               rules={"cpu": serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)}))
_NOTES = ("per row one pass keeping the k best logits in an insertion list (rows of 64+ skip the logits under a "
          "bound from 16 group maxima), exp of the chosen (fexp; a vectorized full-row exp sum without "
          "renormalize); non-contiguous logits are copied to C order first")
register(Implementation("topk_softmax", "cpu-serial", "cpu", _host(K.topk_serial), kernel_modules=_KERNELS,
                        notes=_NOTES))
register(Implementation("topk_softmax", "cpu-parallel", "cpu", _host(K.topk_parallel), kernel_modules=_KERNELS,
                        notes=_NOTES + "; blocks of rows over threads (a worker called by address)"))


@_topk_softmax.expose
def topk_softmax(logits, k, *, renormalize=True):
    """Mixture-of-experts routing: softmax of the router logits (T, E) over the experts,
    then the k most probable experts per token.

    Returns (weights, indices), both (T, k): indices int64 in descending order of
    probability, ties (equal logits) toward the lower expert index; weights the chosen
    probabilities, divided by their sum when renormalize (they then sum to 1), in the
    logits' dtype (float32 for float16 logits on CUDA).  A row holding NaN or +inf, or only
    -inf, gives NaN weights and indices 0..k-1.  1 <= k <= E, else ValueError naming k."""
    return _topk_softmax(logits, k, renormalize=renormalize)
