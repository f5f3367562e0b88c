"""Public moe_ffn: the expert FFN of a mixture-of-experts layer (Mixtral's sparse MoE block
after its router), tokens grouped by expert so that each expert's weights are read once.

    moe_ffn(x, weights, indices, w_gate, w_up, w_down, *, activation="silu", out=None)
        x (T, H); weights (T, k) routing weights; indices (T, k) int32 / int64 expert ids
        in [0, E); w_gate, w_up (E, F, H) and w_down (E, H, F) in PyTorch Linear layout;
        result (T, H) = sum over the k slots j of
        weights[t, j] * w_down[e] @ (act(w_gate[e] @ x[t]) * (w_up[e] @ x[t])), e = indices[t, j].

activation: "silu" (SwiGLU: Mixtral, Qwen-MoE, DeepSeek-MoE), "gelu" or "gelu_tanh" (GeGLU).
float32 or float64 on the CPU, float32, float16 (float32 accumulation) or float64 on CUDA; every
float argument of one dtype.  The k experts of a token need not be distinct: a repeated
expert counts once per slot.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACT_GELU, ACT_GELU_TANH, ACT_SILU, FLOPS_PER_ELEMENT
from kernels_cpu import moe as K
from kernels_cpu.parallel import num_threads

from .. import validate as V
from ..registry import Call, Implementation, Op, bucket, register, register_op
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_rule

_KERNELS = ("kernels_cpu.moe", "kernels_cpu.approx", "kernels_cpu.parallel")

# The activation names moe_ffn takes: the gated units of MoE FFNs.
ACTIVATIONS = {"silu": ACT_SILU, "gelu": ACT_GELU, "gelu_tanh": ACT_GELU_TANH}
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


class MoeKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    tokens: int         # bucket of T
    hidden: int         # bucket of H
    ffn: int            # bucket of F
    experts: int        # bucket of E
    topk: int           # bucket of k
    size: int           # bucket of the multiply-adds: T*k rows x 3 H F
    act: int            # kernels_common.activation.ACT_*


class MoeArgs(NamedTuple):
    x: object           # (T, H)
    weights: object     # (T, k)
    indices: object     # (T, k) int32 / int64
    w_gate: object      # (E, F, H)
    w_up: object        # (E, F, H)
    w_down: object      # (E, H, F)
    act: int
    out: object


def check_index_range(indices, num_experts):
    """Every expert id in [0, num_experts): a ValueError naming indices otherwise (host arrays)."""
    if indices.size == 0:
        return
    lo, hi = int(indices.min()), int(indices.max())
    if lo < 0 or hi >= num_experts:
        raise ValueError(f"indices must be expert ids in [0, {num_experts}) (E = w_gate.shape[0]), "
                         f"got values from {lo} to {hi}")


def describe(x, weights, indices, w_gate, w_up, w_down, *, activation="silu", out=None):
    """Validate a moe_ffn call: Call.args = MoeArgs, key MoeKey.  Host indices are range-checked
    here; device indices by the CUDA implementation, which copies them to the host to build
    its row tables (before it launches or writes anything)."""
    V.required(x=x, weights=weights, indices=indices, w_gate=w_gate, w_up=w_up, w_down=w_down)
    dev = V.device_of(x=x, weights=weights, indices=indices, w_gate=w_gate, w_up=w_up, w_down=w_down, out=out)
    dt = V.float_dtype("x", x)
    for name, arr in (("weights", weights), ("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        V.same_dtype(name, arr, "x", dt)
    idt = V.dtype_of(indices)
    if idt not in INDEX_DTYPES:
        raise TypeError(f"indices must have dtype int32 or int64 (expert ids), got {idt}")
    V.rank("x", x, 2, " (T, H)")
    V.rank("indices", indices, 2, " (T, k)")
    V.rank("w_gate", w_gate, 3, " (E, F, H)")
    t, h = (int(s) for s in x.shape)
    k = int(indices.shape[1])
    e, f, hg = (int(s) for s in w_gate.shape)
    V.shape("indices", indices, (t, k), f" (T, k) with T = {t} rows of x")
    V.shape("weights", weights, (t, k), " (T, k), as indices")
    if hg != h:
        raise ValueError(f"w_gate must have shape (E, F, {h}) for x (T, {h}), got {tuple(w_gate.shape)}")
    V.shape("w_up", w_up, (e, f, h), " (E, F, H), as w_gate")
    V.shape("w_down", w_down, (e, h, f), " (E, H, F) for w_gate (E, F, H)")
    V.choice("activation", activation, list(ACTIVATIONS))
    V.out(out, (t, h), dt, x=x, weights=weights, indices=indices, w_gate=w_gate, w_up=w_up, w_down=w_down)
    if dev == "cpu":
        check_index_range(indices, e)
    code = ACTIVATIONS[activation]
    key = MoeKey("moe_ffn", dev, dt, bucket(t), bucket(h), bucket(f), bucket(e), bucket(k), bucket(t * k * 3 * h * f),
                 code)
    return Call(key, MoeArgs(x, weights, indices, w_gate, w_up, w_down, code, out))


def route(indices, num_experts):
    """The T*k (token, slot) pairs sorted by expert (stable: by slot t*k + j within one
    expert), from host indices (T, k) in [0, num_experts): (offs (E + 1,): expert e's rows
    are the sorted positions offs[e] .. offs[e + 1]; active: the experts with rows; order
    (T*k,): the slot at each sorted position), int64.  What both devices' kernels start
    from (O(T*k) numpy: the counts per expert and a stable argsort)."""
    flat = np.asarray(indices).reshape(-1).astype(np.int64)
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=num_experts)
    offs = np.zeros(num_experts + 1, np.int64)
    np.cumsum(counts, out=offs[1:])
    return offs, np.flatnonzero(counts).astype(np.int64), order


# ---- CPU ---------------------------------------------------------------------------------------

def _host(parallel):
    def run(params, x, weights, indices, w_gate, w_up, w_down, act, out):
        dt = x.dtype
        res = result_buffer(out, tuple(x.shape), dt)
        k = indices.shape[1]
        offs, active, order = route(indices, w_gate.shape[0])
        scale = np.ascontiguousarray(np.asarray(weights).reshape(-1)[order], dtype=dt)
        K.moe_ffn(contiguous(x), contiguous(w_gate), contiguous(w_up), contiguous(w_down), offs, active,
                  order // k if k else order, scale, act, res, num_threads() if parallel else 1)
        return deliver(res, out)

    return run


# ---- work model, inputs --------------------------------------------------------------------------

def _dims(a):
    t, h = a.x.shape
    e, f = a.w_gate.shape[:2]
    return int(t), int(h), int(f), int(e), int(a.indices.shape[1])


def _flops(call):
    """Per (token, slot): the gate and up products (2 x 2HF), act(g) * u, the down product
    (2HF), and the weighted add into the output (2H)."""
    t, h, f, e, k = _dims(call.args)
    return t * k * (6 * h * f + f * (FLOPS_PER_ELEMENT[call.args.act] + 1) + 2 * h)


def _bytes(call):
    """x, the routing weights and indices, the output, and the weights of min(E, T*k)
    experts once (the most a call can touch: exact at T = 1 with distinct experts, and
    when T*k >= E and every expert receives a token)."""
    a = call.args
    t, h, f, e, k = _dims(a)
    isz = np.dtype(V.dtype_of(a.x)).itemsize
    return (2 * t * h + t * k + min(e, t * k) * 3 * h * f) * isz + t * k * np.dtype(V.dtype_of(a.indices)).itemsize


def _draw(rng, shape, dtype, scale):
    """rng.standard_normal(shape) * scale as dtype, one expert at a time (a float64 draw of
    Mixtral's 8 experts at once would be 3.8 GB per matrix); a shape-only draw (zero
    strides: bench.cases.ShapeOnlyRng) stays a zero-stride view, not 5.6 GB of zeros."""
    first = rng.standard_normal(shape[1:])
    if first.size and not any(first.strides):
        return np.broadcast_to(np.zeros((), dtype), shape)
    w = np.empty(shape, dtype)
    for i in range(shape[0]):
        w[i] = (first if i == 0 else rng.standard_normal(shape[1:])) * scale
    return w


def _synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: x standard normal, expert weights scaled by 1/sqrt(fan-in); per
    token k distinct experts at random (the top k of random logits) with weights from a
    softmax over them, as a router gives them."""
    t, h = shapes["x"]
    e, f, _ = shapes["w_gate"]
    k = shapes["indices"][1]
    logits = rng.standard_normal((t, e))
    indices = np.argsort(-logits, axis=1, kind="stable")[:, :k].astype(np.int64)
    top = np.take_along_axis(logits, indices, axis=1)
    p = np.exp(top - top.max(axis=1, keepdims=True)) if top.size else top
    weights = p / p.sum(axis=1, keepdims=True) if top.size else p
    return {"x": rng.standard_normal((t, h)).astype(dtype), "weights": weights.astype(dtype), "indices": indices,
            "w_gate": _draw(rng, (e, f, h), dtype, 1 / np.sqrt(max(h, 1))),
            "w_up": _draw(rng, (e, f, h), dtype, 1 / np.sqrt(max(h, 1))),
            "w_down": _draw(rng, (e, h, f), dtype, 1 / np.sqrt(max(f, 1)))}


def _signature(i):
    return (i["x"], i["weights"], i["indices"], i["w_gate"], i["w_up"], i["w_down"]), \
        {"activation": i.get("activation", "silu")}


def _shapes(t, h, f, e, k):
    return {"x": (t, h), "weights": (t, k), "indices": (t, k), "w_gate": (e, f, h), "w_up": (e, f, h),
            "w_down": (e, h, f)}


# Warm-up / contract-test shapes (dispatch/examples.py): odd sizes (H, F not multiples of
# the 4 x 3 dot tile or the vector width), a decode step, and a batch past the threshold.
EXAMPLE_SHAPES = {"moe_ffn": {
    "small": _shapes(5, 24, 19, 4, 2),
    "large": _shapes(48, 160, 120, 8, 2),
    "decode": _shapes(1, 64, 80, 8, 2),
}}

# Serial below this many multiply-adds (T*k x 3 H F).  Measured 2026-11-23 (AMD znver3, 2
# cores shared with other jobs; cpu-serial vs cpu-parallel, medians of 21 interleaved rounds
# back to back, and of 9 calls after 0.2 s idle; E 8, k 2, H = F):
#   T 1:  2^20.6 (H 512) serial 309 / parallel 338 us, 2^22.6 (H 1024) 1317 / 1296 us;
#         small-moe decode (H 1024, F 2816, 2^24.1) 6.40 / 5.44 ms;
#   T 16: 2^20.6 (H 256) 451 / 315 us, 2^22.6 (H 512) 2258 / 1216 us, 2^24.6 8.0 / 4.6 ms;
#         after idle: even at 2^20.6, serial ahead at 2^22.6 (3.5 / 3.8 ms), parallel at 2^24.6.
PARALLEL_THRESHOLD = 1 << 22
_MEASURED = "crossover 2^20.6..2^22.6 multiply-adds back to back, 2^22.6..2^24.6 after idle"

def _activation(name):
    return lambda args, kwargs: (args, dict(kwargs, activation=name))


# Op.variants for warm-up: act(g) * u is a small function of its own per activation
# (kernels_cpu.moe.gated_epilogue), the worker is shared.
_moe = register_op(Op("moe_ffn", describe, family="moe", bound="memory", signature=_signature, flops=_flops,
                      bytes=_bytes, rules={"cpu": serial_parallel_rule("size", PARALLEL_THRESHOLD, _MEASURED)},
                      synthesize=_synthesize, variants={a: _activation(a) for a in ACTIVATIONS if a != "silu"}))
_NOTES = ("tokens grouped by expert (counting sort), each expert's weights read once: gate/up tasks (expert, "
          "block of F) and down tasks (block of H, all experts: a task owns its output columns, no races) on a "
          "4 x 3 dot-product tile along K (weight rows streamed straight from memory, no packing), act(g) * u "
          "fused; extra memory: a (T*k, F) hidden buffer")
register(Implementation("moe_ffn", "cpu-parallel", "cpu", _host(True), kernel_modules=_KERNELS,
                        notes=HOST_COPY_NOTE + "; " + _NOTES + "; tasks from an atomic counter over threads"))
register(Implementation("moe_ffn", "cpu-serial", "cpu", _host(False), kernel_modules=_KERNELS,
                        notes=HOST_COPY_NOTE + "; " + _NOTES + "; one thread"))


@_moe.expose
def moe_ffn(x, weights, indices, w_gate, w_up, w_down, *, activation="silu", out=None):
    """Mixture-of-experts FFN after the router: x (T, H), weights (T, k) routing weights,
    indices (T, k) int32 / int64 expert ids in [0, E), w_gate and w_up (E, F, H), w_down
    (E, H, F) (torch Linear layout: expert e's gate is x @ w_gate[e].T).

    Returns (T, H): out[t] = sum over j < k of weights[t, j] * w_down[e] @ (act(w_gate[e] @ x[t])
    * (w_up[e] @ x[t])) with e = indices[t, j]; activation "silu" (SwiGLU, Mixtral), "gelu"
    or "gelu_tanh" (GeGLU).  A repeated expert in a row counts once per slot; an id outside
    [0, E) is a ValueError naming indices (nothing written).  out= receives the result."""
    return _moe(x, weights, indices, w_gate, w_up, w_down, activation=activation, out=out)
