"""linear_cross_entropy: cross_entropy(linear(x, weight, bias), targets) without the logits.

x (T, H), weight (V, H), bias (V,) or None, targets (T,) integers; float32 or float64.
The loss is PyTorch's ``F.cross_entropy(F.linear(x, weight, bias), targets, reduction=,
ignore_index=)``.  The (T, V) logits are never held at once: rows are taken in chunks of
``rows_per_chunk`` (a chunk's logits take at most ``chunk_bytes``, or up to an eighth of
all the logits: most_rows), and each chunk's logits are made by the linear GEMM, reduced
by cross_entropy, and dropped.

`linear_cross_entropy_with_grad` also returns the gradients of the loss (for an incoming
gradient of 1) w.r.t. x, weight and bias, computed in the same sweep, as Liger-Kernel's
fused linear cross-entropy does: per chunk, cross_entropy_with_grad writes the chunk's
d(loss)/d(logits) over its own logits buffer, then dx[chunk] = g @ W (written in place),
dW += g.T @ x[chunk] (the own GEMM accumulating into dW on the CPU; on the GPU through a
(block_v, H) scratch and an add: no second weight-sized array either way) and dbias +=
column sums of g.  Extra memory: one chunk of logits plus the scratch,
besides the gradients themselves (which PyTorch's composition also has, with the full
logits and their gradient on top).  reduction="none" has per-row weights that are only
known in the backward pass: the autograd layer recomputes the chunks there
(`linear_cross_entropy_backward`).

These ops compose registered kernels (the GEMMs of linear / matmul, cross_entropy_with_grad)
rather than adding one: their implementations run on whichever device the arrays are on.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np

from .. import validate as V
from ..registry import Call, Implementation, Op, bucket, draw_normal, fixed_rule, register, register_op, shape_only
from .softmax import REDUCTIONS

# A chunk's logits at most 32 MiB: at V = 50257 float32 that is 167 rows, enough for the
# GEMM to run at its large-M speed (the 128-row prepacked GEMM already reaches ~0.75x of
# onnxruntime, 2026-11-25 notes) while staying far under the logits' size at model shapes
# (T = 4096, V = 32768 float32: 512 MiB of logits).
# Larger chunks are faster (below).  GPT-2 lm head with its gradient, 2 threads, Zen 4
# (2026-12-05), separate processes alternating, chunk 32 / 64 / 128 MiB: 4096 rows
# 6.04-6.21 / 5.38-5.56 / 5.64-5.68 s, 512 rows 821-824 / 705-714 / 648-681 ms (the logits
# GEMM at 4096 rows 167 / 180 / 191 GFLOP/s).  (Then the dweight GEMM packed a copy of each
# chunk's gradient: two chunks of extra memory.)
CHUNK_BYTES = 32 << 20
# Above that floor a chunk may take up to 1 / CHUNK_LOGITS_SHARE of the whole logits' bytes
# (the bound: well under a quarter), at most CHUNK_MAX_BYTES and CHUNK_MAX_ROWS rows.
# Each chunk re-reads the weight twice (the logits GEMM, dx) and reads and writes dweight
# once: 0.6 GB at GPT-2's head, so fewer, larger chunks pay.  The dweight GEMM packs its A
# (the chunk's gradient, transposed) in its tasks (kernels_cpu.gemm.A_TASK_OK), so a chunk's
# extra memory is its logits alone; CHUNK_MAX_ROWS (float32 rows; half as many float64)
# keeps that A's task blocks within gemm.A_IN_TASK_BYTES (33 panels x 8 rows x 512 x 4
# bytes = 528 KiB).  GPT-2 lm head with its gradient, T = 4096, 2 threads, a process per
# setting, two runs each (Xeon with AMX, 2026-12-07, /tmp/w/lce3.py), chunk 32 / 64 / 96 /
# 128 MiB: 4.57-4.80 / 3.94-4.28 / 3.51-3.64 / 3.40-3.67 s (PyTorch's composition: 3.43).
CHUNK_LOGITS_SHARE = 8
CHUNK_MAX_BYTES = 128 << 20
CHUNK_MAX_ROWS = 512
# On the GPU dW is accumulated through a (BLOCK_V, H) scratch: 4096 x 768 float32 = 12 MiB.
BLOCK_V = 4096


class LceKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    rows: int          # bucket of T
    hidden: int        # bucket of H
    vocab: int         # bucket of V
    has_bias: bool
    reduction: str


class LceArgs(NamedTuple):
    x: object          # (T, H)
    weight: object     # (V, H)
    targets: object    # (T,) integers
    bias: object       # (V,) or None
    reduction: str
    ignore_index: int
    with_grad: bool


def _describe(name, with_grad):
    def describe(x, weight, targets, bias=None, *, reduction="mean", ignore_index=-100):
        V.required(x=x, weight=weight, targets=targets)
        dev = V.device_of(x=x, weight=weight, targets=targets, bias=bias)
        dt = V.float_dtype("x", x)
        V.rank("x", x, 2, " (T, H)")
        V.same_dtype("weight", weight, "x", dt)
        V.rank("weight", weight, 2, " (V, H)")
        t, h = x.shape
        if weight.shape[1] != h:
            raise ValueError(f"weight must have shape (V, {h}) for x of shape {tuple(x.shape)}, "
                             f"got {tuple(weight.shape)}")
        v = weight.shape[0]
        if bias is not None:
            V.same_dtype("bias", bias, "x", dt)
            V.shape("bias", bias, (v,), " (V,) for weight (V, H)")
        tdt = V.dtype_of(targets)
        if tdt.kind not in "iu":
            raise TypeError(f"targets must have an integer dtype, got {tdt}")
        V.shape("targets", targets, (t,), " (T,) to match x (T, H)")
        V.choice("reduction", reduction, REDUCTIONS)
        if with_grad and reduction == "none":
            raise ValueError("reduction='none' has no gradient in the forward sweep (its rows' weights come "
                             "with the backward pass): use linear_cross_entropy_backward")
        ignore_index = V.integer("ignore_index", ignore_index, np.int64)
        key = LceKey(name, dev, dt, bucket(t), bucket(h), bucket(v), bias is not None, reduction)
        return Call(key, LceArgs(x, weight, targets, bias, reduction, ignore_index, with_grad))
    return describe


def chunk_rows(v: int, itemsize: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk: the chunk's (rows, V) logits take at most chunk_bytes (>= 1 row)."""
    return max(1, chunk_bytes // max(1, v * itemsize))


def _ops():
    import dispatch  # the public ops this composition runs (imported late: dispatch imports this module)
    return dispatch


# Chunks of at least LOGITS_OWN_GEMM_ROWS rows leave the logits' linear to linalg's rule
# (the own GEMM on 16-lane hosts): x[chunk] @ W^T at GPT-2's head, 512 rows, 2 threads
# (Xeon with AMX, 2026-12-07, /tmp/w/lg.py): OpenBLAS 137 ms, the own GEMM 119; dx = g W
# stays on OpenBLAS there (130 against 157: W read as a (K, N) B).
LOGITS_OWN_GEMM_ROWS = 256


def _plain_products_on_blas(d, bias, host=True, rows=0):
    """The override that keeps this op's plain host products on OpenBLAS, where linalg's
    rule sent them before it moved wide plain products to the own GEMM on 16-lane hosts
    (dispatch/ops/linalg.py): the logits' linear without bias (chunks of fewer than
    LOGITS_OWN_GEMM_ROWS rows), dx = g W and the db column sums.  On the own GEMM, the cold
    first call compiles its plain paths as well (the in-place-weight kernel, the (V, H)
    packer): linear_cross_entropy_with_grad, GPT-2 lm head 512, empty cache, Sapphire
    Rapids-class Xeon (2026-12-03), 3.8 -> 5.8 s; the forward at 128 rows 1.7 -> 3.0 s,
    against issue #8's 3 s per op.  Chunks as large as LOGITS_OWN_GEMM_ROWS come with
    T >= 2048, a sweep of seconds at a vocabulary's size."""
    if not host:
        return contextlib.nullcontext()
    plain_linear = bias is None and rows < LOGITS_OWN_GEMM_ROWS
    return d.use(matmul="blas", **({"linear": "blas"} if plain_linear else {}))


def _count(targets, ignore_index):
    return int(np.count_nonzero(np.asarray(targets) != ignore_index))


def _check_targets(targets, v, ignore_index):
    """Every target in [0, V) or ignore_index, checked before any chunk runs (so that the
    error names the index in targets, not in a chunk)."""
    t = np.asarray(targets)
    bad = np.flatnonzero((t != ignore_index) & ((t < 0) | (t >= v)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"targets[{i}] = {t[i]} is out of range: class indices must be in [0, {v}) "
                         f"or equal ignore_index={ignore_index}")


class HostArrays:
    """Where the sweep's buffers live and how they are updated: numpy on the CPU (the CUDA
    implementation passes its device twin, dispatch/cuda_impls/linear_cross_entropy.py)."""

    empty = staticmethod(np.empty)
    zeros = staticmethod(np.zeros)

    @staticmethod
    def scratch(shape, dtype):
        return None   # add_gt_x accumulates in place

    @staticmethod
    def ones(shape, dtype):
        return np.ones(shape, dtype)

    @staticmethod
    def add(dst, src):
        dst += src

    @staticmethod
    def scale(dst, s):
        dst *= dst.dtype.type(s)

    @staticmethod
    def copy(dst, src):
        dst[...] = src

    @staticmethod
    def add_gt_x(d, dw, g, xc, scratch):
        """dw += g.T @ xc: the own GEMM accumulating into dw (K = the chunk's rows), so no
        weight-sized scratch and no second pass over dw."""
        from .linalg_grad import _pro_gemm
        from ._common import kernel_input
        ones = np.zeros(1, np.int64)
        g3, x3 = kernel_input(g)[None], kernel_input(xc)[None]
        _pro_gemm(g3, True, x3, False, ones, ones, dw[None], "a", None, None, 0, None, accumulate=True)

    @staticmethod
    def compile_ahead(dtype):
        """Start compiling add_gt_x's GEMM kernels (g.T packed, x packed: its V rows are
        many row blocks) in a helper process while the first chunk compiles and runs the
        cross-entropy gradient (kernels_cpu.parallel.compile_ahead; nothing when they are
        compiled or cached).  Cold first call, GPT-2 head 128 rows, a fresh process each
        (bench.compile_time, Zen 4, 2026-12-05): 2.48-2.82 s with the GEMM's own helper
        only, 1.98-2.20 s with this (2.58-2.83 with no helper)."""
        from kernels_cpu import gemm as KG
        from kernels_cpu.parallel import compile_ahead
        compile_ahead(KG.packed_kernels(dtype, KG.TILE_NAMES.index(KG.active_tile().name), True, False))

    @staticmethod
    def scalar(a) -> float:
        return float(a)

    @staticmethod
    def to_host(a):
        return a


class _Grads:
    """dx, dweight, dbias being accumulated chunk by chunk (see the module docstring)."""

    def __init__(self, mem, x, weight, bias):
        t, h = x.shape
        v = weight.shape[0]
        dt = np.dtype(x.dtype)
        self.mem = mem
        self.dx = mem.empty((t, h), dt)
        self.dw = mem.zeros((v, h), dt)
        self.db = mem.zeros(v, dt) if bias is not None else None
        self.scratch = mem.scratch((min(BLOCK_V, v), h), dt)
        self.ones = {}

    def add_chunk(self, d, g, x, weight, r0, r1):
        """g = d(loss)/d(logits) of rows r0:r1."""
        d.matmul(g, weight, out=self.dx[r0:r1])
        self.mem.add_gt_x(d, self.dw, g, x[r0:r1], self.scratch)
        if self.db is not None:
            n = r1 - r0
            if n not in self.ones:
                self.ones[n] = self.mem.ones((1, n), np.dtype(g.dtype))
            self.mem.add(self.db, d.matmul(self.ones[n], g).reshape(weight.shape[0]))

    def scaled(self, scale):
        if scale != 1.0:
            for a in (self.dx, self.dw, self.db):
                if a is not None:
                    self.mem.scale(a, scale)
        return self.dx, self.dw, self.db


def most_rows(params, v, itemsize, t) -> int:
    """The most rows a chunk of t rows' sweep over a vocabulary of v takes: chunk_rows of
    params' chunk_bytes, or more where 1 / CHUNK_LOGITS_SHARE of the logits allows (up to
    CHUNK_MAX_BYTES and CHUNK_MAX_ROWS)."""
    floor = chunk_rows(v, itemsize, params.get("chunk_bytes", CHUNK_BYTES))
    share = min(CHUNK_MAX_BYTES, t * v * itemsize // CHUNK_LOGITS_SHARE)
    return max(floor, min(chunk_rows(v, itemsize, share), max(1, CHUNK_MAX_ROWS * 4 // itemsize)))


def rows_per_chunk(params, weight, dtype, t):
    """Rows per chunk for t rows: at most most_rows, spread evenly over the chunks.  GPT-2's
    512 rows at most 166 a chunk are four chunks of 128, not three of 166 and one of 14:
    linear then takes one GEMM path for all of them (the in-place-weight kernel, up to 128
    rows), so a cold call compiles one (5.1 -> 3.6 s, Zen 5, 2026-11-27)."""
    most = most_rows(params, weight.shape[0], np.dtype(dtype).itemsize, t)
    n = max(1, -(-t // most))
    return max(1, -(-t // n))


def run_chunks(params, x, weight, targets, bias, reduction, ignore_index, with_grad, mem=HostArrays):
    """The chunked sweep (see the module docstring); returns the loss, or (loss, dx,
    dweight, dbias) with_grad.  mem: where the buffers live (HostArrays, or the device's)."""
    d = _ops()
    t = x.shape[0]
    dt = np.dtype(x.dtype)
    _check_targets(mem.to_host(targets), weight.shape[0], ignore_index)
    rows = rows_per_chunk(params, weight, dt, t)
    per_row = reduction == "none"
    losses = mem.empty(t, dt) if per_row else None
    grads = _Grads(mem, x, weight, bias) if with_grad else None
    if with_grad and mem is HostArrays:
        mem.compile_ahead(dt)
    total = 0.0
    with _plain_products_on_blas(d, bias, host=mem is HostArrays, rows=rows):
        for r0 in range(0, t, rows):
            r1 = min(t, r0 + rows)
            logits = d.linear(x[r0:r1], weight, bias)
            tc = targets[r0:r1]
            if with_grad:
                loss, g = d.cross_entropy_with_grad(logits, tc, reduction="sum", ignore_index=ignore_index,
                                                    grad_out=logits)
                grads.add_chunk(d, g, x, weight, r0, r1)
                total += mem.scalar(loss)
                del g
            elif per_row:
                mem.copy(losses[r0:r1], d.cross_entropy(logits, tc, reduction="none", ignore_index=ignore_index))
            else:
                total += mem.scalar(d.cross_entropy(logits, tc, reduction="sum", ignore_index=ignore_index))
            del logits   # before the next chunk's are made: one chunk alive at a time
    if per_row:
        return losses
    scale = 1.0
    if reduction == "mean":
        n = _count(mem.to_host(targets), ignore_index)
        scale = 1.0 / n if n else float("nan")
    loss = np.asarray(total * scale, dtype=dt)
    return (loss, *grads.scaled(scale)) if with_grad else loss


def backward_per_row(grad_loss, x, weight, targets, bias=None, *, ignore_index=-100, chunk_bytes=CHUNK_BYTES):
    """(dx, dweight, dbias) of linear_cross_entropy(reduction="none") for the per-row
    incoming gradient grad_loss (T,): the chunks' logits are recomputed (one more GEMM per
    chunk), their gradient formed by cross_entropy_backward, and accumulated as in the
    forward sweep.  The autograd layer's backward for reduction="none" (host arrays)."""
    d = _ops()
    x = np.asarray(x)
    gl = np.asarray(grad_loss, dtype=x.dtype)
    if gl.shape != (x.shape[0],):
        raise ValueError(f"grad_loss must have shape ({x.shape[0]},) (one per row of x), got {gl.shape}")
    grads = _Grads(HostArrays, x, weight, bias)
    rows = rows_per_chunk({"chunk_bytes": chunk_bytes}, weight, x.dtype, x.shape[0])
    with _plain_products_on_blas(d, bias, rows=rows):
        for r0 in range(0, x.shape[0], rows):
            r1 = min(x.shape[0], r0 + rows)
            logits = d.linear(x[r0:r1], weight, bias)
            g = d.cross_entropy_backward(gl[r0:r1], logits, targets[r0:r1], reduction="none",
                                         ignore_index=ignore_index)
            grads.add_chunk(d, g, x, weight, r0, r1)
            del logits, g
    return grads.scaled(1.0)


def _flops(call):
    a = call.args
    t, h = a.x.shape
    v = a.weight.shape[0]
    # forward GEMM + softmax sweep; with the gradients, the two backward GEMMs
    return 2.0 * t * h * v * (3 if a.with_grad else 1) + 5.0 * t * v


def _bytes(call):
    a = call.args
    it = np.dtype(a.x.dtype).itemsize
    t, h = a.x.shape
    v = a.weight.shape[0]
    base = (t * h + v * h + (v if a.bias is not None else 0)) * it + t * 8
    return base + ((t * h + v * h) * it if a.with_grad else 0)


def _synthesize(shapes, params, rng, dtype):
    t, h = shapes["x"]
    v = shapes["weight"][0]
    x = draw_normal(rng, (t, h), dtype)
    return {"x": x,
            "weight": draw_normal(rng, (v, h), dtype) if shape_only(rng) else
                      (rng.standard_normal((v, h)) / np.sqrt(h)).astype(dtype),
            "targets": rng.integers(0, v, size=t, dtype=np.int64)}


def _signature(i):
    return (i["x"], i["weight"], i["targets"]), {"bias": i.get("bias"), "reduction": i.get("reduction", "mean")}


_SHAPES = {"small": {"x": (37, 16), "weight": (300, 16)},
           "large": {"x": (256, 64), "weight": (5000, 64)},
           "decode": {"x": (1, 64), "weight": (5000, 64)}}
EXAMPLE_SHAPES = {"linear_cross_entropy": _SHAPES, "linear_cross_entropy_with_grad": _SHAPES}

WHY = ("chunks of rows through the registered linear GEMM and cross_entropy kernels: the (T, V) logits "
        "are never held at once")
_lce = register_op(Op("linear_cross_entropy", _describe("linear_cross_entropy", False), family="linear_cross_entropy",
                      bound="compute", signature=_signature, flops=_flops, bytes=_bytes,
                      rules={"cpu": fixed_rule(("cpu-chunked",), WHY)}, synthesize=_synthesize))
_lce_grad = register_op(Op("linear_cross_entropy_with_grad", _describe("linear_cross_entropy_with_grad", True),
                           family="linear_cross_entropy", bound="compute", signature=_signature, flops=_flops,
                           bytes=_bytes, rules={"cpu": fixed_rule(("cpu-chunked",), WHY)}, synthesize=_synthesize))
for _name in ("linear_cross_entropy", "linear_cross_entropy_with_grad"):
    register(Implementation(_name, "cpu-chunked", "cpu", run_chunks, params={"chunk_bytes": CHUNK_BYTES},
                            tunables={"chunk_bytes": (8 << 20, 32 << 20, 128 << 20)},
                            notes="composes the linear GEMM and cross_entropy kernels over chunks of rows",
                            kernel_modules=("kernels_cpu.gemm", "kernels_cpu.softmax_grad"),
                            composes=("linear", "matmul", "cross_entropy", "cross_entropy_with_grad",
                                      "cross_entropy_backward")))


@_lce.expose
def linear_cross_entropy(x, weight, targets, bias=None, *, reduction="mean", ignore_index=-100):
    """cross_entropy(linear(x, weight, bias), targets) for x (T, H), weight (V, H), targets
    (T,), computed in chunks of rows so that the (T, V) logits never exist at once.  Returns
    a 0-d array ("mean", "sum") or (T,) ("none"), as dispatch.cross_entropy.
    `dispatch.autograd.linear_cross_entropy` is the differentiable form."""
    return _lce(x, weight, targets, bias, reduction=reduction, ignore_index=ignore_index)


@_lce_grad.expose
def linear_cross_entropy_with_grad(x, weight, targets, bias=None, *, reduction="mean", ignore_index=-100):
    """(loss, dx, dweight, dbias) of linear_cross_entropy for an incoming gradient of 1,
    from one chunked sweep (dbias None without a bias).  reduction "mean" or "sum"."""
    return _lce_grad(x, weight, targets, bias, reduction=reduction, ignore_index=ignore_index)
