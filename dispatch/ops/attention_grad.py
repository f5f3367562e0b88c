"""Backward of attention (issue #13): attention_backward(grad_out, q, k, v, output, lse, *,
causal=False, mask=None, scale=None) -> (dq, dk, dv).

``output`` is the forward's result (aten names it ``out``; here ``out`` means an output
buffer in every op, which the contract tests rely on).

FlashAttention-2's backward: the probabilities are recomputed tile by tile from the row
log-sum-exp the forward returns (``out, lse = dispatch.attention(q, k, v, ...,
return_lse=True)``), so a training step saves q, k, v, out and lse (B, Hq, Sq): O(S) extra
memory, never the (Sq, Skv) matrix.  Arguments: the incoming gradient grad_out (output's
shape), the forward's inputs and its two outputs, then the forward's options with its
defaults; shapes and mask forms as dispatch.attention (GQA: dk, dv summed over the query
heads of each group; causal bottom-right; a bool or additive mask broadcastable to (B, Hq,
Sq, Skv), which gets no gradient).  Returns new C-contiguous arrays (dq q's shape, dk and dv
k's), q's dtype.  q/k/v/grad_out/output views with unit-stride rows (the transposed views of a
fused QKV projection) are read in place.  Deterministic: the same bits on every run, at
every thread count, from either CPU implementation (kernels_cpu/attention_grad.py).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common.attention import MASK_ADD, MASK_BOOL, MASK_NONE
from kernels_cpu import attention_grad as K
from kernels_cpu.parallel import num_threads

from .. import validate as V
from ..registry import Call, Implementation, Op, Rule, register, register_op
from . import _arena
from ._common import kernel_input, rows_input
from .attention import SERIAL_MAX_FLOPS, _ZERO, describe as _describe_forward, visible_pairs

_KERNELS = ("kernels_cpu.attention_grad", "kernels_cpu.attention", "kernels_cpu.approx", "kernels_cpu.parallel")

# Chunks of keys per (batch, kv head): enough work items for the threads when B x Hkv is
# small (MQA, one sequence), 1 (no dq reduction pass) otherwise.  A function of the shape
# only, never of the thread count, so the dq summation order -- the result's bits -- is the
# same at every thread count.  MIN_ITEMS = 8: four items per thread on this machine kind's
# 2 cores, as the forward's split-KV hands out (items_per_thread 4).
MIN_ITEMS = 8

EXAMPLE_SHAPES = {"attention_backward": {
    "small": {"q": (1, 4, 6, 16), "k": (1, 2, 9, 16)},
    "large": {"q": (1, 8, 40, 32), "k": (1, 4, 70, 32)},
    "decode": {"q": (1, 8, 1, 16), "k": (1, 2, 300, 16)},
}}


class AttentionGradKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    heads: int          # bucket of B * Hq
    sq: int             # bucket of Sq
    skv: int            # bucket of Skv
    head_dim: int       # bucket_up of D
    group: int          # bucket of Hq // Hkv
    causal: bool
    mask_kind: int      # kernels_common.attention.MASK_*


class AttentionGradArgs(NamedTuple):
    grad_out: object    # (B, Hq, Sq, D)
    q: object           # (B, Hq, Sq, D)
    k: object           # (B, Hkv, Skv, D)
    v: object           # (B, Hkv, Skv, D)
    output: object      # the forward's output (B, Hq, Sq, D)
    lse: object         # the forward's row log-sum-exp (B, Hq, Sq)
    mask: object        # None, bool or q's dtype, unbroadcast
    causal: bool
    scale: float


def _describe(grad_out, q, k, v, output, lse, *, causal=False, mask=None, scale=None):
    """Call.args = AttentionGradArgs, key AttentionGradKey."""
    V.required(grad_out=grad_out, q=q, k=k, v=v, output=output, lse=lse)
    dev = V.device_of(grad_out=grad_out, q=q, k=k, v=v, output=output, lse=lse, mask=mask)
    fcall = _describe_forward(q, k, v, causal=causal, mask=mask, scale=scale)
    fwd = fcall.key
    dt = fwd.dtype
    B, Hq, Sq, D = (int(s) for s in q.shape)
    for name, a in (("grad_out", grad_out), ("output", output)):
        V.same_dtype(name, a, "q", dt)
        V.shape(name, a, (B, Hq, Sq, D), " (B, Hq, Sq, D), q's shape")
    V.same_dtype("lse", lse, "q", dt)
    V.shape("lse", lse, (B, Hq, Sq), " (B, Hq, Sq): the forward's return_lse")
    key = AttentionGradKey("attention_backward", dev, dt, fwd.heads, fwd.sq, fwd.skv, fwd.head_dim, fwd.group,
                           fwd.causal, fwd.mask_kind)
    return Call(key, AttentionGradArgs(grad_out, q, k, v, output, lse, mask, fwd.causal, fcall.args.scale))


def chunks(B, Hkv, Skv):
    """(number of key chunks per kv head, keys per chunk: a multiple of the key tile)."""
    tiles = max(1, -(-Skv // K.BK))
    n = 1 if B * Hkv >= MIN_ITEMS else min(tiles, -(-MIN_ITEMS // (B * Hkv)))
    per = -(-tiles // n)
    return -(-tiles // per), per * K.BK


def _mask4(q, k, mask):
    B, Hq, Sq, _ = q.shape
    Skv = k.shape[2]
    if mask is None:  # a read-only zero with all strides 0 (as the forward's)
        return np.ndarray((B, Hq, Sq, Skv), q.dtype, buffer=_ZERO, strides=(0, 0, 0, 0)), MASK_NONE
    m = mask.view(np.ndarray) if type(mask) is not np.ndarray else mask
    if min(m.strides, default=0) < 0:
        m = np.ascontiguousarray(m)
    return np.broadcast_to(m, (B, Hq, Sq, Skv)), (MASK_BOOL if mask.dtype == np.bool_ else MASK_ADD)


def _host(parallel):
    def run(params, grad_out, q, k, v, output, lse, mask, causal, scale):
        dq, dk, dv = _arena.empty(q.shape, q.dtype), _arena.empty(k.shape, q.dtype), _arena.empty(k.shape, q.dtype)
        if dk.size and not dq.size:
            dk[...] = 0
            dv[...] = 0
        if not dq.size:
            return dq, dk, dv
        m4, mkind = _mask4(q, k, mask)
        B, Hkv, Skv = k.shape[0], k.shape[1], k.shape[2]
        nchunk, chunk = chunks(B, Hkv, Skv)
        K.backward(rows_input(q), rows_input(k), rows_input(v), m4, mkind, causal, scale, rows_input(grad_out),
                   rows_input(output), kernel_input(lse), dq, dk, dv, nchunk, chunk,
                   num_threads() if parallel else 1)
        return dq, dk, dv

    return run


def _flops(call):
    # five products of 2 D FLOPs per visible (query, key) pair: S, dP, dV, dK, dQ
    q, k = call.args.q, call.args.k
    B, Hq, Sq, D = q.shape
    return 10.0 * B * Hq * D * visible_pairs(Sq, k.shape[2], call.args.causal)


def _bytes(call):
    a = call.args
    n = 4 * a.q.size + 4 * a.k.size + a.lse.size
    if a.mask is not None:
        n += a.mask.size * a.mask.dtype.itemsize / a.q.dtype.itemsize
    return float(n * a.q.dtype.itemsize)


def _synthesize(shapes, params, rng, dtype):
    """q, k, v drawn, grad_out too, output and lse from the forward (dispatch.attention; for
    float16, which only the CUDA side takes, the CPU forward on the float32 values, rounded)."""
    from .attention import attention

    qs, ks = shapes["q"], shapes["k"]
    q = rng.standard_normal(qs).astype(dtype)
    k = rng.standard_normal(ks).astype(dtype)
    v = rng.standard_normal(ks).astype(dtype)
    up = (lambda a: a.astype(np.float32)) if np.dtype(dtype) == np.float16 else (lambda a: a)
    out, lse = attention(up(q), up(k), up(v), causal=params.get("causal", False), return_lse=True)
    return {"grad_out": rng.standard_normal(qs).astype(dtype), "q": q, "k": k, "v": v,
            "output": out.astype(dtype, copy=False), "lse": lse.astype(dtype, copy=False)}


def _order(key):
    work = 4 * key.heads * key.sq * key.skv * key.head_dim  # the forward's FLOPs, as its rule
    if work < SERIAL_MAX_FLOPS:
        return (("cpu-serial", "cpu-flash"),
                f"~{work} forward FLOPs < {SERIAL_MAX_FLOPS}: less work than a thread launch costs (the forward's "
                "crossover)")
    return (("cpu-flash", "cpu-serial"),
            f"(batch, kv head, key chunk) items over threads, {K.BQ}-row query tiles x {K.BK}-key tiles")


_op = register_op(Op(
    "attention_backward", _describe, memo=True, family="attention_grad", bound="compute",
    signature=lambda i: ((i["grad_out"], i["q"], i["k"], i["v"], i["output"], i["lse"]),
                         {"causal": i.get("causal", False), "mask": i.get("mask")}),
    flops=_flops, bytes=_bytes, rules={"cpu": Rule(("cpu-serial", "cpu-flash"), _order)}, synthesize=_synthesize))
_NOTE = ("q/k/v/grad_out/output views with unit-stride rows are read in place (others copied); per item K, V of "
         "its key chunk packed into 16-key panels; S, dP, dV, dK, dQ on the forward's register-blocked micro-kernel; "
         "P recomputed from lse, never stored whole; deterministic (no atomics)")
register(Implementation(
    "attention_backward", "cpu-flash", "cpu", _host(True), kernel_modules=_KERNELS,
    notes=_NOTE + "; work items (batch, kv head, key chunk) handed out dynamically over threads, a dq reduction "
          f"pass over the chunks when there are several (B x Hkv < {MIN_ITEMS})"))
register(Implementation(
    "attention_backward", "cpu-serial", "cpu", _host(False), kernel_modules=_KERNELS,
    notes=_NOTE + "; the same kernel on the calling thread"))


@_op.expose
def attention_backward(grad_out, q, k, v, output, lse, *, causal=False, mask=None, scale=None):
    """Gradients (dq, dk, dv) of attention(q, k, v, causal=..., mask=..., scale=...) for the
    incoming gradient grad_out, from the forward's output and lse: ``output, lse =
    attention(q, k, v, ..., return_lse=True)``.  See the module docstring."""
    return _op(grad_out, q, k, v, output, lse, causal=causal, mask=mask, scale=scale)
