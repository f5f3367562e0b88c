"""Public scaled dot-product attention: dispatch.attention.

attention(q, k, v, *, causal=False, mask=None, scale=None, out=None, return_lse=False)
  q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) with Hq % Hkv == 0 (MHA, GQA, MQA: query head h
  uses kv head h // (Hq // Hkv)); result (B, Hq, Sq, D) = softmax(q k^T * scale + mask) v.
  scale defaults to 1/sqrt(D).  mask: bool (True = attend) or additive (q's dtype),
  broadcastable to (B, Hq, Sq, Skv).  causal: query i sees keys j <= i + Skv - Sq (the
  diagonal aligned to the bottom right, so decode with a KV cache, Sq = 1, is the same
  call); causal and mask combine.  A query that sees no key gets zeros, not NaN.
  return_lse=True: returns (out, lse), lse (B, Hq, Sq) in q's dtype the natural log of each
  row's sum of exp(scores) (scores = q k^T * scale + mask over the keys the row sees,
  the max included): -inf for a query that sees no key, NaN where the row is NaN.  What
  attention_backward (dispatch/ops/attention_grad.py) recomputes the probabilities from;
  the flash and split-KV kernels have the running max and sum at the end of each row, so
  it costs one store per row.
  bfloat16 / float16 q / k / v on the CPU (PyTorch's 16-bit attention): widened to float32
  copies (an additive mask too), computed in float32, the result rounded once to q's dtype;
  lse is then float32.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from kernels_common.attention import MASK_ADD, MASK_BOOL, MASK_NONE
from kernels_cpu import attention as K
from kernels_cpu import half as KH
from kernels_cpu.parallel import num_threads

from .. import validate as V
from ..registry import FLOAT_DTYPES, Call, Implementation, Op, Rule, bucket, bucket_up, register, register_op
from . import _arena
from ._common import deliver, draw_case, half_bits, result_buffer, rows_input, widened

# q/k/v views whose rows (last axis) are contiguous, e.g. qkv.reshape(B, S, 3, H, D)[:, :, i]
# .transpose(0, 2, 1, 3), are read in place (_common.rows_input), and such an out= view written in place.
ROWS_NOTE = ("q/k/v views with unit-stride rows are read in place, other non-contiguous inputs are "
             "copied to C order first; an out= view with unit-stride rows (e.g. a (B, S, H, D) buffer "
             "transposed) is written in place, another non-contiguous out= is filled by one copy")

_KERNELS = ("kernels_cpu.attention", "kernels_cpu.half", "kernels_cpu.approx", "kernels_cpu.parallel")
_DTYPES = FLOAT_DTYPES + V.HALF_DTYPES
_HALF_NOTE = ("; bfloat16 / float16 q / k / v (and an additive mask): widened to float32 copies, the result rounded "
              "once to q's dtype")


class AttentionKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    heads: int          # bucket of B * Hq
    sq: int             # bucket of Sq
    skv: int            # bucket of Skv
    head_dim: int       # bucket_up of D: which head-dim tile holds it (<= 64, <= 128, ...)
    group: int          # bucket of Hq // Hkv (query heads per kv head)
    causal: bool
    mask_kind: int      # kernels_common.attention.MASK_*
    lse: bool           # return_lse: the rows' log-sum-exp asked for too


class AttentionArgs(NamedTuple):
    q: object           # (B, Hq, Sq, D), any strides
    k: object           # (B, Hkv, Skv, D)
    v: object           # (B, Hkv, Skv, D)
    mask: object        # None, bool or q's dtype, unbroadcast
    causal: bool
    scale: float        # 1/sqrt(D) when scale=None; finite in q's dtype
    out: object
    return_lse: bool    # also return the rows' log-sum-exp (B, Hq, Sq)


def describe(q, k, v, *, causal=False, mask=None, scale=None, out=None, return_lse=False):
    """Validate an attention call: Call.args = AttentionArgs, key AttentionKey."""
    V.required(q=q, k=k, v=v)
    dev = V.device_of(q=q, k=k, v=v, mask=mask, out=out)
    dt = V.cpu_float_dtype("q", q, dev)
    V.same_dtype("k", k, "q", dt)
    V.same_dtype("v", v, "q", dt)
    V.rank("q", q, 4, " (B, Hq, Sq, D)")
    V.rank("k", k, 4, " (B, Hkv, Skv, D)")
    V.rank("v", v, 4, " (B, Hkv, Skv, D)")
    B, Hq, Sq, D = (int(s) for s in q.shape)
    Bk, Hkv, Skv, Dk = (int(s) for s in k.shape)
    if D < 1:
        raise ValueError(f"q must have a head dim D >= 1, got shape {tuple(q.shape)}")
    if Bk != B:
        raise ValueError(f"k must have batch size {B} (q's), got shape {tuple(k.shape)}")
    if Dk != D:
        raise ValueError(f"k must have head dim {D} (q's last dim), got shape {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the shape of k {tuple(k.shape)} (same Skv, heads, D), got {tuple(v.shape)}")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"k has {Hkv} heads, which must divide q's {Hq} heads (Hq % Hkv == 0)")
    causal = V.flag("causal", causal)
    return_lse = V.flag("return_lse", return_lse)
    mkind = MASK_NONE
    if mask is not None:
        mdt = V.dtype_of(mask)
        if mdt == np.bool_:
            mkind = MASK_BOOL
        elif mdt == dt:
            mkind = MASK_ADD
        else:
            raise TypeError(f"mask must have dtype bool or {dt} (q's dtype), got {mdt}")
        V.broadcastable("mask", tuple(mask.shape), (B, Hq, Sq, Skv), "(B, Hq, Sq, Skv)")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    else:
        scale = V.finite("scale", scale, dtype=np.float32 if dev == "cpu" and V.is_half(dt) else dt)
    V.out(out, (B, Hq, Sq, D), dt, q=q, k=k, v=v, mask=mask)
    key = AttentionKey("attention", dev, dt, bucket(B * Hq), bucket(Sq), bucket(Skv), bucket_up(D),
                       bucket(Hq // Hkv), causal, mkind, return_lse)
    return Call(key, AttentionArgs(q, k, v, mask, causal, scale, out, return_lse))


# ---- work model --------------------------------------------------------------------------

def visible_pairs(Sq, Skv, causal):
    """Number of (query, key) pairs a call computes (causal: only those on or below the
    bottom-right-aligned diagonal)."""
    if not causal:
        return Sq * Skv
    off = Skv - Sq
    c = np.clip(np.arange(Sq, dtype=np.int64) + off + 1, 0, Skv)
    return int(c.sum())


def _flops(call):
    q, k = call.args.q, call.args.k
    B, Hq, Sq, D = q.shape
    return 4.0 * B * Hq * D * visible_pairs(Sq, k.shape[2], call.args.causal)


def _bytes(call):
    q, k, v, mask = call.args.q, call.args.k, call.args.v, call.args.mask
    n = 2 * q.size * q.dtype.itemsize + (k.size + v.size) * k.dtype.itemsize
    if mask is not None:
        n += mask.size * mask.dtype.itemsize
    return float(n)


# ---- order rule --------------------------------------------------------------------------

# Speed (float32, this machine kind: 2 shared cores, Zen 4; 2026-11-22, heavily loaded by other
# jobs, so two views): single-thread CPU time (robust to the load; torch/ort at 1 thread):
#   1x12x512x64          cpu-serial 10.6-11.9 ms (68-76 GFLOP/s) | torch 11.6 | ort 11.3-12.1 | numpy ~30+
#   1x12x2048x64 causal  cpu-serial 81-84 ms (76-79 GFLOP/s)     | torch 102-114 | ort 183-225
#   decode 32 heads, 1 q x 4096 kv, d128 causal  cpu-splitkv 7.3-7.5 ms (18 GB/s) | torch 18-20 | ort 14-15
# 2 threads, wall, interleaved (load 7-9 on 2 cores: medians meaningless, minimums shown):
#   1x12x512x64 cpu-flash 6.6-6.8 ms vs ort 6.35, torch 6.8-12; causal 2048: 124 vs torch 162;
#   decode: cpu-splitkv 5.3-6.7 ms vs torch 12.8-16.6, ort 13.9-17.3.
# The flash kernel runs its GEMM parts at ~95 GFLOP/s per core (the 4x16 micro-kernel
# peaks at ~105 here); the rest is the online softmax (~1.5 ms of exp/max on 3.1M scores
# for 1x12x512x64) and tile bookkeeping.

# Shape rule, from measurements on this machine kind (2 cores; float32; causal; medians of
# interleaved runs, single-thread CPU time to see through other jobs' load; 1 thread):
#  * split-KV vs flash by the query rows per kv head R = G * Sq (G = Hq // Hkv):
#      Hq=Hkv=32, Skv=4096, D=128:  R=1: 7.9 vs 31 ms, R=8: 21 vs 37, R=16: 45 vs 49, R=32: 88 vs 64
#      Hq=32, Hkv=4, Skv=4096, D=128:  R=8: 3.1 vs 4.0, R=16: 5.5 vs 5.8, R=32: 9.4 vs 6.7
#      Hq=Hkv=12, Skv=1024, D=64:  R=4: 0.77 vs 1.09, R=8: 1.5 vs 1.85, R=16: 2.6 vs 2.1
#    split-KV streams K/V once with dot products (memory-bound decode, no K^T packing pass);
#    flash's 4x16 register-blocked micro-kernel wins once a kv head has > 8-16 query rows.
#    Rule: split-KV when bucket(G) * bucket(Sq) <= 8 (exact sizes: both are <= 16).
SPLITKV_MAX_ROWS = 8
#  * serial vs threaded flash: below ~2^21 FLOPs (4 B Hq Sq Skv D; e.g. 1x4x32x32x64 = 2^20)
#    the thread launch costs as much as the work (tens of microseconds).
SERIAL_MAX_FLOPS = 1 << 21


def _order(key):
    rows = key.group * key.sq
    if rows <= SPLITKV_MAX_ROWS:
        return (("cpu-splitkv", "cpu-flash", "cpu-serial"),
                f"{rows} query rows per kv head <= {SPLITKV_MAX_ROWS}: decode shape, split-KV streams K/V "
                "once, split over threads")
    from .attention_amx import first  # (it registers an implementation of this op: imported after it)
    why = first(key)
    if why is not None:
        return (("cpu-flash-amx", "cpu-flash", "cpu-serial", "cpu-splitkv"),
                f"{rows} query rows per kv head > {SPLITKV_MAX_ROWS}: {why}")
    work = 4 * key.heads * key.sq * key.skv * key.head_dim
    if work < SERIAL_MAX_FLOPS:
        return (("cpu-serial", "cpu-flash", "cpu-splitkv"),
                f"~{work} FLOPs < {SERIAL_MAX_FLOPS}: less work than a thread launch costs")
    return (("cpu-flash", "cpu-serial", "cpu-splitkv"),
            f"{rows} query rows per kv head > {SPLITKV_MAX_ROWS}: flash tiles of {K.BQ} rows x "
            f"{K.BK} keys (all keys as one tile up to {K.ONE_TILE}) over threads")


# ---- host implementations ----------------------------------------------------------------

_ZERO = bytes(8)  # backing store of the dummy mask: a read-only zero with all strides 0


def _prepare(q, k, v, mask, out):
    qc, kc, vc = rows_input(q), rows_input(k), rows_input(v)
    B, Hq, Sq, D = q.shape
    Skv = k.shape[2]
    if mask is None:  # (np.broadcast_to costs ~5 us; this view is the same thing)
        m4 = np.ndarray((B, Hq, Sq, Skv), q.dtype, buffer=_ZERO, strides=(0, 0, 0, 0))
        mkind = MASK_NONE
    else:
        m = mask.view(np.ndarray) if type(mask) is not np.ndarray else mask
        if min(m.strides, default=0) < 0:  # the kernel reads the mask from its first element on
            m = np.ascontiguousarray(m)
        m4 = np.broadcast_to(m, (B, Hq, Sq, Skv))
        mkind = MASK_BOOL if mask.dtype == np.bool_ else MASK_ADD
    res = result_buffer(out, q.shape, q.dtype, rows=True)  # a (B, S, H, D) buffer's transposed view: written in place
    return qc, kc, vc, m4, mkind, res


def _lse_buffer(q, return_lse):
    return np.empty(q.shape[:3], q.dtype) if return_lse else None


def _result(res, out, lse):
    res = deliver(res, out)
    return res if lse is None else (res, lse)


def _run_flash(parallel):
    def run(params, q, k, v, mask, causal, scale, out, return_lse=False):
        qc, kc, vc, m4, mkind, res = _prepare(q, k, v, mask, out)
        lse = _lse_buffer(q, return_lse)
        if res.size:
            K.flash(qc, kc, vc, m4, mkind, causal, scale, res, num_threads() if parallel else 1, lse)
        return _result(res, out, lse)

    return run


def _run_splitkv(params, q, k, v, mask, causal, scale, out, return_lse=False):
    qc, kc, vc, m4, mkind, res = _prepare(q, k, v, mask, out)
    lse = _lse_buffer(q, return_lse)
    if res.size:
        B, Hq, Sq, D = q.shape
        Hkv, Skv = k.shape[1], k.shape[2]
        R = (Hq // Hkv) * Sq
        items = B * Hkv * ((R + K.RC - 1) // K.RC)
        want = params.get("items_per_thread", 4) * num_threads()
        nsplit = max(1, min((Skv + K.SPLIT_MIN - 1) // K.SPLIT_MIN, -(-want // items)))
        split_len = -(-max(Skv, 1) // nsplit)
        split_len = -(-split_len // K.BK) * K.BK
        nsplit = max(1, -(-Skv // split_len))
        # split-KV's partials: this call's scratch, from the result arena (reused by the next
        # call once freed; a decode step's pacc is 256 KiB at 8 kv heads x 16 splits x 4 x 128)
        pm = _arena.empty((B, Hkv, nsplit, R), q.dtype)
        pl = _arena.empty((B, Hkv, nsplit, R), q.dtype)
        pacc = _arena.empty((B, Hkv, nsplit, R, D), q.dtype)
        K.splitkv(qc, kc, vc, m4, mkind, causal, scale, res, nsplit, split_len, pm, pl, pacc, num_threads(),
                  lse)
    return _result(res, out, lse)


def _half(run32, kv_bits=False):
    """run32 for bfloat16 / float16 q / k / v as well (PyTorch's 16-bit attention on the
    CPU): q and an additive mask widened to float32 copies (exact), k and v too (O(S x D)
    beside the flash kernels' O(S^2 x D) work) or, with kv_bits (split-KV, whose decode
    step is a stream of K / V), passed as their bits for the kernel to widen as it reads
    them; the float32 kernel, and the result rounded once to q's dtype (the log-sum-exp of
    return_lse stays float32)."""
    def run(params, q, k, v, mask, causal, scale, out, return_lse=False):
        if q.dtype.itemsize != 2:
            return run32(params, q, k, v, mask, causal, scale, out, return_lse)
        m = mask if mask is None or mask.dtype == np.bool_ else widened(mask)
        kk, vv = (half_bits(k), half_bits(v)) if kv_bits else (widened(k), widened(v))
        got = run32(params, widened(q), kk, vv, m, causal, scale, None, return_lse)
        res32, lse = got if return_lse else (got, None)
        res = result_buffer(out, q.shape, q.dtype)   # C-contiguous: out itself, or copied into it
        KH.round_into(res32.reshape(-1), half_bits(res.reshape(-1)))
        return _result(res, out, lse)

    return run


def _strided_views(x):
    """x (B, H, S, D) as the transposed view of a (B, S, H + 1, D) buffer: the layout of
    q/k/v sliced out of a fused QKV projection (unit-stride rows that are not adjacent)."""
    B, H, S, D = x.shape
    buf = np.empty((B, S, H + 1, D), x.dtype)
    view = buf[:, :, :H].transpose(0, 2, 1, 3)
    view[...] = x
    return view


def _bert_layout(args, kwargs):
    """The call as a BERT layer makes it (bench/model.py): q/k/v views of a fused QKV,
    a bool padding mask (B, 1, 1, Skv), out= the transposed view of a (B, S, H, D)
    buffer; each differs in type from the contiguous call, so it compiles its own kernel."""
    q, k, v = args
    B, Hq, Sq, D = q.shape
    mask = np.ones((B, 1, 1, k.shape[2]), np.bool_)
    out = np.empty((B, Sq, Hq, D), q.dtype).transpose(0, 2, 1, 3)
    return tuple(_strided_views(a) for a in (q, k, v)), {**kwargs, "mask": mask, "out": out}


_op = register_op(Op(
    "attention", describe, memo=True, family="attention", bound="compute",
    signature=lambda i: ((i["q"], i["k"], i["v"]), {"causal": i.get("causal", False), "mask": i.get("mask")}),
    flops=_flops, bytes=_bytes, rules={"cpu": Rule(("cpu-splitkv", "cpu-flash", "cpu-serial", "cpu-flash-amx"), _order)},
    variants={"bert": _bert_layout}, synthesize=draw_case))
register(Implementation(
    "attention", "cpu-flash", "cpu", _half(_run_flash(True)), kernel_modules=_KERNELS, dtypes=_DTYPES,
    notes=ROWS_NOTE + f"; each thread packs the K of its current kv head into 16-key K^T panels (and copies a "
          "V whose rows are not adjacent) when the head changes; work items (batch, kv head, "
          f"tile of {K.BQ} (query head, query) rows of its GQA group), handed out dynamically over threads; "
          f"up to {K.ONE_TILE} keys as one tile, longer key ranges in {K.BK}-key tiles streamed with an online "
          "softmax, causal tiles above the diagonal skipped; "
          "mask read through broadcast strides, converted to an additive row once per K tile for rows sharing it"
          + _HALF_NOTE))
register(Implementation(
    "attention", "cpu-serial", "cpu", _half(_run_flash(False)), kernel_modules=_KERNELS, dtypes=_DTYPES,
    notes=ROWS_NOTE + "; the flash kernel on the calling thread" + _HALF_NOTE))
register(Implementation(
    "attention", "cpu-splitkv", "cpu", _half(_run_splitkv, kv_bits=True), kernel_modules=_KERNELS, dtypes=_DTYPES,
    notes=ROWS_NOTE + f"; decode: work items (batch, kv head, kv split of >= {K.SPLIT_MIN} keys, "
          f"{K.RC} query rows of the GQA group) then a combine pass; K/V rows read once per group"
          "; bfloat16 / float16 K / V read as they are (each element widened to float32 as it is read), q and an "
          "additive mask widened to float32 copies, the result rounded once to q's dtype",
    params={"items_per_thread": 4}, tunables={"items_per_thread": [1, 2, 4, 8]}))


@_op.expose
def attention(q, k, v, *, causal=False, mask=None, scale=None, out=None, return_lse=False):
    """softmax(q k^T * scale + mask) v per (batch, head); with return_lse=True the pair
    (out, lse), lse (B, Hq, Sq) the rows' log-sum-exp.  See the module docstring."""
    return _op(q, k, v, causal=causal, mask=mask, scale=scale, out=out, return_lse=return_lse)
