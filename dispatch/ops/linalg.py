"""Public matmul and linear with a fused bias + activation epilogue.

    matmul(a, b, *, bias=None, activation=None, out=None)
        a (..., M, K) @ b (..., K, N), batch dims broadcast as in numpy, then + bias (N,)
        and the activation; result (..., M, N).
    linear(x, weight, bias=None, *, activation=None, out=None)
        x (..., K) @ weight.T with weight (N, K) as in torch.nn.functional.linear; result
        (..., N).  The weight is read in its (N, K) layout (no transposed copy).  A
        low-precision weight (float16, ml_dtypes.bfloat16, int8 QuantizedArray per output
        row or per tensor) with float32 x goes to the weight-only kernels
        (dispatch/ops/weight_only.py: widened in registers, float32 accumulation).

    prepack(weight, *, op="linear") -> PackedWeight
        packs a weight once into the own GEMM's panel layout; pass the result in place of
        linear's weight (or matmul's 2-D b) to skip packing it on every call.

activation: None, "relu", "gelu" (exact), "gelu_tanh" or "silu", applied after the bias.
float32 or float64; every argument of one dtype.  Inputs of rank < 2 (matmul) or 0
(linear x) are a ValueError: no numpy-style 1-D promotion, so a vector passed by mistake
is caught instead of silently turned into a row or a column (reshape it to (1, K)).
"""
from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACT_NONE, ACTIVATION_CODES, FLOPS_PER_ELEMENT
from kernels_common.memory import ALIGN, aligned_empty
from kernels_common.quant import WEIGHT_BF16, WEIGHT_DENSE, WEIGHT_F16, WEIGHT_FORMAT_NAMES, WEIGHT_INT8
from kernels_cpu import gemm as K
from kernels_cpu import half as KH
from kernels_cpu import weight_only as KW
from kernels_cpu.parallel import num_threads, worker_addresses

from .. import validate as V
from ..quantized import QuantizedArray
from ..registry import (FLOAT_DTYPES, Call, Implementation, Op, Rule, bucket, bucket_half, bucket_half_end,
                        draw_normal, register, register_op, shape_only)
from . import _arena
from ._common import deliver, half_bits, kernel_input, result_buffer, widened

_KERNELS = ("kernels_cpu.gemm", "kernels_cpu.approx", "kernels_cpu.parallel", "kernels_cpu.half",
            "kernels_cpu.weight_only")


class GemmKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    batch: int          # bucket of the broadcast batch size (1 for linear)
    m: int              # bucket of M (linear: the product of x's leading dims)
    n: int              # half-octave bucket of N (registry.bucket_half: 384 is not 256)
    k: int              # half-octave bucket of K
    act: int            # kernels_common.activation.ACT_*
    has_bias: bool
    prepacked: bool = False  # the weight / b came as a PackedWeight
    weight_format: int = WEIGHT_DENSE  # kernels_common.quant.WEIGHT_*: a low-precision linear weight (ops/weight_only.py)
    n48: bool = False   # N is a multiple of 48: whole column panels of the 16-lane tiles (8x48, 12x32)
    k_odd: bool = False  # K is odd: the bfloat16 pair kernel (ops/weight_only.py) reads K in pairs
    # N's row bytes conflict in the caches (kernels_cpu.gemm.b_rows_conflict): a (K, N) b is packed, not read in place
    rows_2k: bool = False
    # a 16-bit matmul b that cpu-gemm's tasks widen into their own panels (b16_in_tasks), not a float32 copy
    b16_tasks: bool = False


class GemmArgs(NamedTuple):
    a: object           # matmul: a (..., M, K); linear: x (..., K); as given
    b: object           # matmul: b (..., K, N); linear: weight (N, K); as given
    bias: object        # (N,) or None
    out: object
    act: int            # kernels_common.activation.ACT_*
    b_is_nk: bool       # True for linear: the second operand is (N, K), used transposed
    packed: object = None  # B's panels when the weight came as a PackedWeight, else None


__public__ = ("prepack", "PackedWeight")  # exported by dispatch/__init__ beside the ops


class PackedWeight:
    """A weight packed once by `prepack` into a CPU kernel's panel layout.

    Pass it in place of ``linear``'s weight (op="linear": the (N, K) weight, NR-column
    panels of the GEMM), ``matmul``'s b (op="matmul": a 2-D (K, N) b) or ``conv2d``'s weight
    (op="conv2d": MR-row panels of the implicit GEMM, per group; a 3x3 weight with groups 1
    also its Winograd-transformed filters' panels, 16/9 of its size more).  A bfloat16 /
    float16 weight's panels are the float32 panels of its widened values (the widening
    kernels read them), except where a bfloat16 kernel runs it: a bfloat16 b where
    cpu-bf16-dot runs (tile "bf16-dot", bf16_matmul.prepack_bf16) and a bfloat16 conv2d
    weight with groups 1 on a host with AVX-512 BF16 or AMX (tile "bf16-dot" / "bf16-amx",
    conv_bf16.prepack_bf16) get that kernel's own panels.  ``weight`` is the source
    array (read-only view), which the other implementations (OpenBLAS, gemv, depthwise;
    CUDA refuses host weights) still use; the panels are a snapshot: writing into the
    source afterwards is not seen by the packed kernel, so pack again after changing a
    weight.  Attributes: op, weight, shape, dtype, panels, groups (conv2d; 1 otherwise)."""

    __slots__ = ("op", "weight", "shape", "dtype", "panels", "groups", "_nr", "tile", "winograd", "kernel_weight",
                 "__weakref__")

    def __init__(self, op, weight, panels, nr, groups=1, tile=None, winograd=None):
        self.op, self.weight, self.panels, self._nr, self.groups = op, weight, panels, nr, groups
        self.tile = tile  # the GEMM register tile the panels are for (kernels_cpu.gemm.TILE_NAMES)
        self.winograd = winograd  # conv2d 3x3, groups 1: the transformed filters' panels too
        self.shape, self.dtype = tuple(weight.shape), weight.dtype
        # the source as the kernels take it (a writeable-typed alias of the read-only view),
        # made once: kernel_input makes it in 1.9 us, on every call otherwise
        self.kernel_weight = kernel_input(weight)

    @property
    def bf16_panels(self) -> bool:
        """Whether the panels are a bfloat16 kernel's own (uint32 pair words, tile "bf16-*")
        rather than float32 / float64 GEMM panels."""
        return self.panels.dtype == np.uint32

    def __memo_key__(self):
        """Its part of a call's signature (dispatch/memo.py): the object itself, and the
        active register tile, which describe checks the panels against."""
        return id(self), K.active_tile().name

    def __memo_arrays__(self):
        """The caller's memory it holds: the source weight's view, which describe checks
        out= against (dispatch/memo.py does for a remembered call)."""
        return (self.weight,)

    def __repr__(self):
        g = (f", groups={self.groups}" if self.op == "conv2d" else "") + f", tile={self.tile}"
        return (f"PackedWeight(op={self.op!r}, shape={self.shape}, dtype={self.dtype}{g}, "
                f"{self.panels.nbytes} bytes of panels)")


def _readonly_source(weight):
    """The source weight as the other implementations read it: a read-only view (a copy in
    C order when it is neither C- nor Fortran-ordered)."""
    if not (weight.flags.c_contiguous or weight.T.flags.c_contiguous):
        weight = np.ascontiguousarray(weight)  # copied once
    view = weight.view()
    view.flags.writeable = False
    return view


def _prepack_gemm(weight, dt, op, groups):
    """The GEMM's panels of linear's (N, K) weight or matmul's (K, N) b; a 16-bit one's are the
    float32 panels of its widened values (linear: weight_only's cpu-wo-gemm reads them;
    matmul: cpu-gemm after widening a, _half), the GEMVs and bfloat16 kernels the source."""
    if groups != 1:
        raise ValueError(f"groups is an argument of prepack(op='conv2d') only, got groups={groups!r} for op={op!r}")
    V.rank("weight", weight, 2, " (N, K)" if op == "linear" else " (K, N) (a batched b cannot be prepacked)")
    src = _readonly_source(weight)
    if op == "matmul" and V.is_bfloat16(dt):
        from .bf16_matmul import prepack_bf16   # (it imports this module)
        packed = prepack_bf16(src)   # run_kn's bfloat16 panels where cpu-bf16-dot runs
        if packed is not None:
            return packed
    if V.is_half(dt):
        weight, dt = np.asarray(weight, np.float32), np.dtype(np.float32)
    if op == "linear":
        n, k = weight.shape
        b3, transb = (weight.reshape(1, n, k), True) if weight.flags.c_contiguous else \
                     (np.ascontiguousarray(weight).reshape(1, n, k), True)
    else:
        k, n = weight.shape
        b3, transb = np.ascontiguousarray(weight).reshape(1, k, n), False
    tile = K.active_tile()
    _, sb = K.pack_shapes(1, 1, 1, n, k, dt, tile)
    panels = aligned_empty(sb, dt)  # B rows on cache lines: 1.5-5% faster GEMMs (kernels_common.memory)
    if n and k:
        K.pack_b(kernel_input(b3), transb, panels, tile)
    return PackedWeight(op, src, panels, tile.nr(dt), tile=tile.name)


# op -> packer(weight, dtype, op, groups) -> PackedWeight; another family adds its op with
# register_prepacker (conv2d: dispatch/ops/conv.py).
_PREPACKERS = {"linear": _prepack_gemm, "matmul": _prepack_gemm}
# op -> the op's call arguments prepack takes as well (conv2d: groups): what a caller holding
# a call's kwargs (the report's prepacked timing) passes on to prepack
_PREPACK_OPTIONS = {"linear": (), "matmul": ()}
# ops whose prepacker also takes bfloat16 / float16 weights (linear, matmul: float32 panels of
# the widened values for many rows; conv2d: dispatch/ops/conv.py)
_HALF_PREPACKERS = {"linear", "matmul"}


def register_prepacker(op, packer, options=(), half=False):
    """packer(weight, dtype, op, groups) -> PackedWeight for prepack(..., op=op); half: it also
    takes bfloat16 / float16 weights."""
    if op in _PREPACKERS:
        raise ValueError(f"a prepacker for {op!r} is already registered")
    _PREPACKERS[op] = packer
    _PREPACK_OPTIONS[op] = tuple(options)
    if half:
        _HALF_PREPACKERS.add(op)


def prepack_options(op, call_kwargs: dict) -> dict:
    """The subset of a call's keyword arguments that prepack(..., op=op) needs too."""
    return {k: call_kwargs[k] for k in _PREPACK_OPTIONS.get(op, ()) if k in call_kwargs}


def prepack(weight, *, op="linear", groups=1):
    """Pack a weight once for ``linear`` (weight (N, K), op="linear"), ``matmul`` (a 2-D
    b (K, N), op="matmul") or ``conv2d`` (weight (Cout, Cin/groups, KH, KW), op="conv2d",
    with the convolution's ``groups``) into the own kernel's panel layout.  Returns a
    PackedWeight to pass in the weight's place: the GEMM then packs only the activations
    on each call.  The weight is validated now (a float32 / float64 / bfloat16 / float16
    host array of the op's rank); the call validates the rest (shapes against x, dtypes,
    groups) as with a plain weight."""
    V.choice("op", op, list(_PREPACKERS))
    if isinstance(weight, PackedWeight):
        raise TypeError(f"weight is already a PackedWeight ({weight!r})")
    V.required(weight=weight)
    half = op in _HALF_PREPACKERS
    if isinstance(weight, QuantizedArray) or (getattr(getattr(weight, "dtype", None), "itemsize", 8) <= 2
                                              and not half):
        raise TypeError(f"prepack: a low-precision weight ({getattr(weight, 'dtype', None)}) is not prepacked for "
                        f"op={op!r}: pass it as it is (an int8 QuantizedArray weight is read in place, "
                        "dispatch/ops/weight_only.py)")
    if V.device_of(weight=weight) != "cpu":
        raise TypeError("prepack: weight must be a host (numpy) array: packing is for the CPU kernels")
    dt = V.cpu_float_dtype("weight", weight, "cpu") if half else V.float_dtype("weight", weight)
    return _PREPACKERS[op](weight, dt, op, V.integer("groups", groups))


def _unpack(name, w, op):
    """(array, panels or None) for a weight argument that may be a PackedWeight."""
    if not isinstance(w, PackedWeight):
        return w, None
    if w.op != op:
        raise TypeError(f"{name} is a PackedWeight packed for op={w.op!r}; {op} needs prepack(..., op={op!r})")
    if w.bf16_panels:   # bf16_matmul.prepack_bf16's
        from .bf16_matmul import packed_form   # (it imports this module)
        if w.tile != packed_form():
            raise ValueError(f"{name}: PackedWeight holds panels of the {w.tile} bfloat16 kernel; this host runs "
                             f"{packed_form() or 'another'}: prepack the weight again")
        return w.kernel_weight, w.panels
    tile = K.active_tile()
    if w.tile != tile.name or w._nr != tile.nr(w.panels.dtype):  # packed for another register tile
        raise ValueError(f"{name}: PackedWeight was packed for the {w.tile} GEMM tile ({w._nr}-column panels); "
                         f"this process runs the {tile.name} tile ({tile.nr(w.panels.dtype)} columns): prepack the "
                         "weight again")
    return w.kernel_weight, w.panels


def _common_checks(first_name, first, second_name, second, bias, out, activation, half_ok=False):
    """(device, dtype, activation code) after the checks both products share; half_ok: the
    first operand may also be bfloat16 / float16 on the CPU (matmul), the rest of its dtype."""
    V.required(**{first_name: first, second_name: second})
    dev = V.device_of(**{first_name: first, second_name: second, "bias": bias, "out": out})
    dt = V.cpu_float_dtype(first_name, first, dev) if half_ok else V.float_dtype(first_name, first)
    V.same_dtype(second_name, second, first_name, dt)
    if bias is not None:
        V.same_dtype("bias", bias, first_name, dt)
    V.choice("activation", activation, list(ACTIVATION_CODES))
    return dev, dt, ACTIVATION_CODES[activation]


def _check_bias(bias, n, what):
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape ({n},) to match {what}, got {tuple(bias.shape)}")


def gemm_key(op, dev, dt, batch, m, n, k, code, bias, packed, weight_format=WEIGHT_DENSE, b16_tasks=False):
    """The GemmKey of a product of these sizes (the one place they are bucketed)."""
    return GemmKey(op, dev, dt, bucket(batch), bucket(m), bucket_half(n), bucket_half(k), code, bias is not None,
                   packed is not None, weight_format=weight_format, n48=n % 48 == 0, k_odd=k % 2 == 1,
                   rows_2k=K.b_rows_conflict(n * np.dtype(dt).itemsize), b16_tasks=b16_tasks)


def describe_matmul(a, b, *, bias=None, activation=None, out=None):
    """Validate a matmul call: Call.args = GemmArgs (b_is_nk False; batch dims not yet
    broadcast), key GemmKey.  b may be a PackedWeight (op="matmul")."""
    b, packed = _unpack("b", b, "matmul")
    dev, dt, code = _common_checks("a", a, "b", b, bias, out, activation, half_ok=True)
    V.rank("a", a, (2, 64), " (..., M, K)")
    V.rank("b", b, (2, 64), " (..., K, N)")
    m, k = a.shape[-2], a.shape[-1]
    kb, n = b.shape[-2], b.shape[-1]
    if kb != k:
        raise ValueError(
            f"b must have K={k} rows to match a (..., {m}, {k}), got {kb} (b has shape {tuple(b.shape)})")
    try:
        batch_shape = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise ValueError(
            f"batch dimensions of a {tuple(a.shape[:-2])} and b {tuple(b.shape[:-2])} do not broadcast") from None
    _check_bias(bias, n, f"b (..., {k}, {n})")
    out_shape = batch_shape + (m, n)
    V.out(out, out_shape, dt, a=a, b=b, bias=bias)
    batch = math.prod(batch_shape)
    return Call(gemm_key("matmul", dev, dt, batch, m, n, k, code, bias, packed,
                         b16_tasks=dev == "cpu" and dt.itemsize == 2 and b16_in_tasks(a.shape, b.shape)),
                GemmArgs(a, b, bias, out, code, False, packed))


def describe_linear(x, weight, bias=None, *, activation=None, out=None):
    """Validate a linear call: Call.args = GemmArgs (a = x, b = weight, b_is_nk True), key
    GemmKey with batch 1 and M the product of x's leading dims.  weight may be a
    PackedWeight (op="linear")."""
    from .weight_only import describe_low_precision  # it imports this module
    if isinstance(weight, QuantizedArray) or getattr(getattr(weight, "dtype", None), "itemsize", 8) <= 2:
        call = describe_low_precision(x, weight, bias, activation=activation, out=out)
        if call is not None:  # None: float16 x with a float16 weight, a dense call
            return call
    if V.is_bfloat16(getattr(x, "dtype", None)):
        wdt = getattr(weight, "dtype", None)
        raise TypeError("x is bfloat16: linear takes it with a bfloat16 weight (PyTorch's bfloat16 linear), got "
                        + (f"a weight of dtype {wdt}" if wdt is not None else f"weight of type {type(weight).__name__}"))
    weight, packed = _unpack("weight", weight, "linear")
    dev, dt, code = _common_checks("x", x, "weight", weight, bias, out, activation)
    V.rank("x", x, (1, 64), " (..., K)")
    V.rank("weight", weight, 2, " (N, K)")
    k = x.shape[-1]
    n, kw = weight.shape
    if kw != k:
        raise ValueError(
            f"weight must have K={k} columns to match x (..., {k}), got shape {tuple(weight.shape)}")
    _check_bias(bias, n, f"weight ({n}, {k})")
    out_shape = tuple(x.shape[:-1]) + (n,)
    V.out(out, out_shape, dt, x=x, weight=weight, bias=bias)
    m = math.prod(x.shape[:-1])
    return Call(gemm_key("linear", dev, dt, 1, m, n, k, code, bias, packed),
                GemmArgs(x, weight, bias, out, code, True, packed))


# ---- host preparation ----------------------------------------------------------------------

def _as3(x):
    """(x3, trans): x (..., R, C) as a C-contiguous (B, R, C) array (trans False) or, when x is
    a transposed view of a C-contiguous array, its (B, C, R) base (trans True, no copy)."""
    r, c = x.shape[-2:]
    nb = math.prod(x.shape[:-2])
    if x.flags.c_contiguous:
        return x.reshape(nb, r, c), False
    s = np.swapaxes(x, -1, -2)
    if s.flags.c_contiguous:
        return s.reshape(nb, c, r), True
    return np.ascontiguousarray(x).reshape(nb, r, c), False


_ZERO_IDX = np.zeros(1, np.int64)


@functools.lru_cache(maxsize=256)
def _batch_index(a_batch, b_batch):
    """(n, a_idx, b_idx): output batch i reads a3[a_idx[i]] and b3[b_idx[i]]."""
    full = np.broadcast_shapes(a_batch, b_batch)
    n = math.prod(full)
    if n == 1:
        return 1, _ZERO_IDX, _ZERO_IDX
    # fresh writeable arrays whether or not a side broadcasts (a read-only ravel view would
    # make numba compile a second specialization of the kernels)
    ai = np.array(np.broadcast_to(np.arange(math.prod(a_batch), dtype=np.int64).reshape(a_batch), full).ravel())
    bi = np.array(np.broadcast_to(np.arange(math.prod(b_batch), dtype=np.int64).reshape(b_batch), full).ravel())
    return n, ai, bi


@functools.lru_cache(maxsize=64)
def _zeros(n, dtype):
    """The bias vector of a call without bias (kernels take one signature): shared by all
    threads, so frozen read-only (and passed as the kernels' writeable-typed alias)."""
    z = np.zeros(n, dtype)
    z.flags.writeable = False
    return kernel_input(z)


def _prepare(a, b, bias, out, b_is_nk):
    """Kernel arguments: (a3, b3, a_idx, b_idx, transa, transb, bias, out3, res, K)."""
    dt = a.dtype
    if b_is_nk:  # linear: a = x (..., K), b = weight (N, K)
        k = a.shape[-1]
        n = b.shape[0]
        m = math.prod(a.shape[:-1])
        out_shape = tuple(a.shape[:-1]) + (n,)
        if a.ndim == 2:
            a3, transa = _as3(a)
        else:
            a3, transa = np.ascontiguousarray(a).reshape(1, m, k), False
        if b.flags.c_contiguous:
            b3, transb = b.reshape(1, n, k), True
        elif b.T.flags.c_contiguous:   # weight given as W.T of a (K, N) array
            b3, transb = b.T.reshape(1, k, n), False
        else:
            b3, transb = np.ascontiguousarray(b).reshape(1, n, k), True
        nbatch, a_idx, b_idx = 1, _ZERO_IDX, _ZERO_IDX
    else:
        m, k = a.shape[-2:]
        n = b.shape[-1]
        nbatch, a_idx, b_idx = _batch_index(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
        out_shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)
        a3, transa = _as3(a)
        b3, transb = _as3(b)
    res = result_buffer(out, out_shape, dt)
    bias_v = _zeros(n, dt) if bias is None else kernel_input(bias)
    # read-only inputs as writeable-typed aliases: one kernel specialization for all
    a3, b3 = kernel_input(a3), kernel_input(b3)
    return a3, b3, a_idx, b_idx, transa, transb, bias_v, res.reshape(nbatch, m, n), res, k


_WORKSPACE = threading.local()
# Packing buffers up to this many elements (64 MiB of float32 per thread) are kept for the
# next call; larger ones are freed.  A memory bound, not a speed measurement.
WORKSPACE_KEEP = 1 << 24


def _workspace(n, dtype):
    """A scratch vector of n elements for the GEMM's packed panels, owned by the calling
    Python thread.  Reusing it saves the page faults of a fresh multi-MiB allocation on
    every call; per-thread ownership matters because the kernels release the GIL, so two
    threads calling at once must never pack into one buffer."""
    bufs = getattr(_WORKSPACE, "by_dtype", None)
    if bufs is None:
        bufs = _WORKSPACE.by_dtype = {}
    buf = bufs.get(dtype)
    if buf is None or buf.size < n:
        buf = aligned_empty(n, dtype)  # the micro-kernel's B rows on cache lines (kernels_common.memory)
        if n <= WORKSPACE_KEEP:
            bufs[dtype] = buf
    return buf[:n]


def _panel_buffers(sa, sb, dtype):
    """Workspace for packed A panels of shape sa and B panels of shape sb (K.pack_shapes),
    each starting on a cache line."""
    line = ALIGN // np.dtype(dtype).itemsize
    na, nb = math.prod(sa), math.prod(sb)
    skip = -(-na // line) * line
    ws = _workspace(skip + nb, dtype)
    return ws[:na].reshape(sa), ws[skip:skip + nb].reshape(sb)


def _degenerate(out3, bias, code):
    """K == 0: the product is zero, the result act(bias)."""
    out3[...] = 0
    K.epilogue(out3.reshape(-1, out3.shape[-1]), bias, code, num_threads())


# A call packing a B larger than the L3 (over ONE_BLOCK_B_MIN_BYTES; this Zen 4's L3 is 32
# MiB, and B of that size tied, below) takes its rows as one row block when there are at most
# ONE_BLOCK_M_MAX of them and one panel's K fits B_IN_TASK_BYTES: each task then packs its
# panels into L2 right before reading them (the cap below), where with several row blocks
# every panel was packed up front, written out to memory and read back once per row block.
# The cost: every task reads all of A (from L3 at these sizes) for its one or few panels.
# float32, 8x48 tile, 2 threads, forced one way or the other in one process, medians of 18
# calls after 0.2 s pauses, rotating with the prepacked weight and numpy (Zen 4, 2026-12-06,
# /tmp/w/mc53.py), ms, MxKxN, row blocks as before -> one (prepacked, OpenBLAS): matmul
# 512x4096x4096 95.5 / 93.8 -> 86.5 / 84.3 (80.5, 89.9), 300x4096x4096 59.4 -> 52.5 (47.4,
# 52.6), 512x4096x11008 244 -> 219 (210, 222), 768x4096x4096 133 -> 124 (123, 130),
# 1024x4096x4096 173 / 168 -> 165 / 166 (159, 175), 512x2048x8192 88.4 -> 81.3 (77.5, 87.2),
# 512x3072x8192 136 -> 124 (118, 134), 1024x2048x8192 170 -> 163 (157, 174); linear (an (N, K)
# weight) 512x4096x4096 93.8 -> 84.3, 300x4096x4096 61.1 -> 54.0, 512x4096x11008 239 -> 222.
# Not taken where it tied or lost: B of 32 MiB (512x4096x2048 42.9 -> 42.4, 512x2048x4096 43.4
# -> 41.9, 1024x4096x2048 82.2 -> 84.3), 16 MiB (512x2048x2048 21.3 -> 21.8, 512x4096x1024
# 22.8 -> 23.7), 2048 rows (2048x4096x4096 331 -> 335), MiniLM's 3168x384x1536 (17.7 -> 19.7);
# a panel over B_IN_TASK_BYTES is packed up front either way (linear 512x11008x4096 243 ->
# 242).
ONE_BLOCK_B_MIN_BYTES = 32 << 20
ONE_BLOCK_M_MAX = 1024


# A call that packs B (not prepacked) with one row block: each task packs its own column
# panels right before reading them, while they fit in L2 (kernels_cpu.gemm.B_IN_TASK_BYTES),
# else every panel is packed up front, written out to memory and read back.  With K = 4096
# one panel is 786 KB, so the task blocks of BLOCKING (12 panels after the TASKS_MIN split)
# never fit; at most as many panels per task as fit.  Plain matmul, (K, N) b, 2 threads,
# medians of 5 calls, two runs (Zen 4, 2026-12-06), ms, before -> capped (OpenBLAS):
# 128x4096x4096 32.1-36.2 -> 28.1-28.2 (24.9-25.0), 128x4096x11008 79.8-85.0 -> 73.1-73.4
# (64.2-65.7), 256x2048x2048 12.1-12.9 -> 11.8-12.3 (11.2-11.8), 200x3000x3000 20.0-20.4 ->
# 19.4-19.9 (18.9-19.1), 128x1024x4096 6.7-6.8 -> 6.4-6.7 (6.3).  OpenBLAS stays ahead on
# these: it packs B in K blocks that stay in L2 (ours packs a panel's whole K).
def _gemm_blocks(m, n, k, nbatch, nr, tile=None, packs_b_bytes=0):
    """(mc_panels, nc_panels, kc): task blocking for gemm_parallel and the tile (default the
    active one; see the measurements next to KC_MAX and BLOCKING).  packs_b_bytes: the
    element size of a B the call packs (0: B prepacked or not packed), which caps the
    column panels of a single row block's tasks (above) and, for a B over
    ONE_BLOCK_B_MIN_BYTES, makes up to ONE_BLOCK_M_MAX rows one row block."""
    tile = K.active_tile() if tile is None else tile
    kc_max, mc_panels, nc_panels, nc_min = BLOCKING.get(tile.name, (KC_MAX, MC_PANELS, NC_PANELS, NC_MIN))
    mp = -(-m // tile.mr)
    npn = -(-n // nr)
    nkb = -(-k // kc_max)
    kc = -(-k // nkb) if k else 1
    mc = -(-mp // -(-mp // mc_panels))   # equal row blocks of at most mc_panels panels
    nc = min(npn, nc_panels)
    # at least TASKS_MIN tasks so that both threads work and finish together
    while nbatch * -(-mp // mc) * -(-npn // nc) < TASKS_MIN and (mc > 1 or nc > 1):
        if nc > nc_min or mc == 1:
            nc = -(-nc // 2)
        else:
            mc = -(-mc // 2)
    # bytes of one B panel the tasks would pack: whole, or a K block of it (kernels_cpu.gemm's
    # B_TASK_KBLOCK: one B matrix, K > kc)
    kblock = bool(packs_b_bytes) and nbatch == 1 and K.packs_b_in_k_blocks(k, kc, 1, nr, packs_b_bytes)
    panel = (kc if kblock else k) * nr * packs_b_bytes
    if (packs_b_bytes and mc < mp and panel <= K.B_IN_TASK_BYTES and m <= ONE_BLOCK_M_MAX
            and k * n * packs_b_bytes > ONE_BLOCK_B_MIN_BYTES):
        mc = mp
    if packs_b_bytes and mc >= mp:
        nc = max(1, min(nc, K.B_IN_TASK_BYTES // panel))
    return mc, nc, kc


# The weight read in place (kernels_cpu.gemm.gemm_rows) instead of packed, for a linear
# (an (N, K) weight, contiguous) with few rows and a large weight, on the 8x48 tile's hosts,
# float32.  2 threads, Sapphire Rapids, interleaved medians (2026-11-26), ms, packed ->
# in place: 64x4096x4096 21.6 -> 11.3, 32x768x3072 1.14 -> 0.86, 128x768x3072 2.40 ->
# 2.20; where it lost (not taken): 128x3072x768 (N < K) 2.48 -> 2.72, 256x1024x1024 2.11 ->
# 2.61 (first version of the kernel, before the rule).
# Since the GEMM's tasks pack a weight's panels into their workers' own slices of the
# packing buffer (kernels_cpu/gemm.py, b_local), packing wins while the weight fits the L3:
# Zen 4 (32 MiB L3), 2 threads, medians of 5 rounds alternating in one process
# (2026-12-06, /tmp/w/lrows.py), ms, MxKxN, in place / packed: 9 MiB: 32x768x3072 1.44 /
# 1.07, 64x768x3072 2.64 / 1.85, 128x768x3072 4.07 / 3.38; 16 MiB: 16x1024x4096 2.17 / 1.61,
# 64x1024x4096 4.36 / 3.65, 128x1024x4096 6.88 / 6.42; 25 MiB: 64x1280x5120 6.31 / 5.55,
# 128x1280x5120 9.49 / 9.78; 32 MiB: 64x2048x4096 7.73 / 8.20, 128x2048x4096 11.8 / 13.1;
# 36 MiB: 128x1536x6144 13.2 / 13.4; 64 MiB: 32x4096x4096 8.36 / 11.7, 64x4096x4096 15.8 /
# 16.5, 128x4096x4096 23.9 / 26.1.  (The Sapphire Rapids figures above predate b_local.)
# So the weight goes in place from 3/4 of the host's L3 (rows_min_bytes; Zen 4: 24 MiB).  On
# a Xeon with AMX and a 480 MiB L3, packing won at every size tried (2 threads, medians of 5
# rounds of 3 calls alternating in one process, 2026-12-07, /tmp/w/br.py), ms, MxKxN, in
# place / packed / PyTorch: 128x4096x11008 67.9 / 44.5 / 47.8, 64x4096x11008 34.7 / 26.8 /
# 27.9, 16x4096x11008 18.9 / 17.2 / 19.2, 128x4096x4096 26.0 / 17.8 / 16.5, 32x4096x4096
# 7.19 / 7.30 / 6.89, 128x4000x11008 64.1 / 42.2 / 45.4, 128x3000x11008 50.0 / 33.5 / 34.3,
# 64x2048x8192 14.2 / 12.0 / 10.5.
ROWS_M_MAX = 128           # rows of x
ROWS_MIN_BYTES = 24 << 20  # the weight's bytes, at least (and where the L3's size is unknown)
ROWS_L3_SHARE = 0.75       # ... and at least this share of the host's L3
ROWS_EXAMPLE_MAX_BYTES = 64 << 20   # the largest weight an example call (warm-up) makes for the path


@functools.lru_cache(maxsize=None)
def rows_min_bytes() -> int:
    """The smallest weight (bytes) that gemm_rows reads in place: ROWS_MIN_BYTES, or
    ROWS_L3_SHARE of the host's L3 where that is more (the measurements above)."""
    from kernels_cpu import target
    return max(ROWS_MIN_BYTES, int(ROWS_L3_SHARE * target.cache_bytes(3)))


def _rows_in_place(m, n, k, nbatch, ta, tb, dtype, tile, packed) -> bool:
    return (packed is None and nbatch == 1 and not ta and tb and dtype == np.float32 and tile.name == "8x48"
            and m <= ROWS_M_MAX and n >= k and n * k * dtype.itemsize >= rows_min_bytes())


def _gemm_setup(a3, b3, ta, tb, out3, has_epilogue, code, packed):
    """What cpu-gemm runs for these operands' shapes and options: None (gemm_rows, the
    weight read in place) or (K.plan_args of the cache-blocked GEMM, packed A's shape,
    packed B's shape).  A function of shapes, layouts and options only (_GemmPlan keeps it)."""
    nbatch, m, n = out3.shape
    k = a3.shape[1] if ta else a3.shape[2]
    tile = K.active_tile()  # a PackedWeight's tile was checked against it in describe
    if _rows_in_place(m, n, k, nbatch, ta, tb, out3.dtype, tile, packed):
        return None
    nr, isz = tile.nr(out3.dtype), out3.dtype.itemsize
    # the tasks may pack B's panels themselves (gemm_worker's b_in_task): B packed by this
    # call (not prepacked, not read in place) and not shared by several output batches
    in_task = packed is None and not K.reads_b_in_place(n, tb, nr, isz) and b3.shape[0] == nbatch
    mc, nc, kc = _gemm_blocks(m, n, k, nbatch, nr, tile, isz if in_task else 0)
    sa, sb = K.pack_shapes(a3.shape[0], b3.shape[0], m, n, k, out3.dtype, tile)
    args = K.plan_args(a3.shape[0], b3.shape[0], nbatch, m, n, k, ta, tb, out3.dtype, tile, packed is not None, mc, nc,
                       kc, has_epilogue, code, num_threads())
    return args, sa, sb


def _gemm_launch(setup, a3, b3, ai, bi, bias_v, out3, packed):
    """The cache-blocked GEMM of _gemm_setup's answer on these arrays (the calling thread's
    packing workspace)."""
    args, sa, sb = setup
    if packed is None:
        ap, bp = _panel_buffers(sa, sb, out3.dtype)
    else:
        ap, bp = _workspace(math.prod(sa), out3.dtype).reshape(sa), kernel_input(packed)
    K.gemm_launch(args, a3, ap, b3, bp, out3, ai, bi, bias_v)


def _gemm(a3, b3, ai, bi, ta, tb, bias_v, code, has_epilogue, out3, packed):
    setup = _gemm_setup(a3, b3, ta, tb, out3, has_epilogue, code, packed)
    if setup is None:
        m, k = out3.shape[1], a3.shape[2]
        xp = _workspace(K.rows_workspace(m, k, out3.dtype), out3.dtype)
        K.gemm_rows(a3[0], b3[0], bias_v, has_epilogue, code, out3[0], xp, num_threads())
        return
    _gemm_launch(setup, a3, b3, ai, bi, bias_v, out3, packed)


def _gemv(a3, b3, ai, bi, ta, tb, bias_v, code, has_epilogue, out3, packed):
    if tb:
        K.gemv_nk(a3, b3, ai, bi, ta, bias_v, has_epilogue, code, out3, num_threads())
    else:
        K.gemv_kn(a3, b3, ai, bi, ta, bias_v, has_epilogue, code, out3, num_threads())


def _host(product):
    """run() of an own-kernel implementation: prepare, then product(...) or, for K == 0,
    the epilogue of a zero product."""

    def run(params, a, b, bias, out, code, b_is_nk, packed=None):
        a3, b3, ai, bi, ta, tb, bias_v, out3, res, k = _prepare(a, b, bias, out, b_is_nk)
        if out3.size:
            if k == 0:
                _degenerate(out3, bias_v, code)
            else:
                product(a3, b3, ai, bi, ta, tb, bias_v, code, bias is not None or code != ACT_NONE, out3, packed)
        return deliver(res, out)

    return run


_run_gemm_full, _run_gemv = _host(_gemm), _host(_gemv)


class _GemmPlan(NamedTuple):
    """A cpu-gemm call made ready once per call signature (_run_gemm): how to view a, b
    and the result as the kernel's 3-D arrays, and _gemm_setup's answer."""
    a3: tuple        # a as (batches, rows, columns) of its C-ordered memory
    a_swap: bool     # ... after swapping its last two axes (a transposed view)
    b3: tuple
    b_swap: bool
    out3: tuple      # (nbatch, M, N)
    out_shape: tuple
    ai: np.ndarray   # output batch -> a / b batch (_batch_index)
    bi: np.ndarray
    setup: tuple     # _gemm_setup(...)


# Calls that copy an operand, write out= through a copy, read the weight in place (gemm_rows)
# or have K = 0 or an empty result: the full path (_run_gemm_full) every time.
_FULL = "full"
_PLANS: dict = {}
PLANS_MAX = 256   # signatures kept (a memory bound, as dispatch.memo's MAX_ENTRIES)


def _new_plan(a, b, bias, out, code, b_is_nk, packed):
    """_GemmPlan of a call (_FULL where it has none): _prepare and _gemm_setup, once."""
    a3, b3, ai, bi, ta, tb, bias_v, out3, res, k = _prepare(a, b, bias, out, b_is_nk)
    if k == 0 or not out3.size or (out is not None and res is not out):
        return _FULL
    setup = _gemm_setup(a3, b3, ta, tb, out3, bias is not None or code != ACT_NONE, code, packed)
    if setup is None:
        return _FULL
    for x, x3 in ((a, a3), (b, b3)):
        if x3.ctypes.data != x.ctypes.data:
            return _FULL   # _prepare copied it
    # _prepare's 3-D views: a transposed a (ta) or matmul b (tb) is its swapped view
    # reshaped; a linear weight given as W.T of a (K, N) array (not tb) is too
    views = [a3.shape, ta, b3.shape, tb != b_is_nk]
    return _GemmPlan(*views, out3.shape, res.shape, ai, bi, setup)


def _run_gemm(params, a, b, bias, out, code, b_is_nk, packed=None):
    """cpu-gemm's run: _run_gemm_full's work with its decisions made once per call
    signature.  Each call's Python before the kernel was as long as the kernel's own
    parallel overhead: prepacked matmul (2 threads, Sapphire Rapids, 2026-12-07, medians
    of 15 rounds of 30-100 calls, heartbeat off), the kernel alone / through dispatch /
    dispatch with its run cut to the launch: 128x384x384 125 / 155 / 134 us, 128x768x768
    458 / 528 / 487 (onnxruntime 143 / 525 in a loop of its own)."""
    key = (a.shape, a.strides, a.dtype, b.shape, b.strides, bias is None, out is None or out.strides, code, b_is_nk,
           packed is None, num_threads(), K.active_index())
    plan = _PLANS.get(key)
    if plan is None:
        plan = _new_plan(a, b, bias, out, code, b_is_nk, packed)
        if len(_PLANS) >= PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    if plan is _FULL:
        return _run_gemm_full(params, a, b, bias, out, code, b_is_nk, packed)
    a3 = kernel_input((np.swapaxes(a, -1, -2) if plan.a_swap else a).reshape(plan.a3))
    b3 = kernel_input((np.swapaxes(b, -1, -2) if plan.b_swap else b).reshape(plan.b3))
    res = out if out is not None else _arena.empty(plan.out_shape, a.dtype)
    bias_v = _zeros(plan.out3[2], a.dtype) if bias is None else kernel_input(bias)
    _gemm_launch(plan.setup, a3, b3, plan.ai, plan.bi, bias_v, res.reshape(plan.out3), packed)
    return res


def _run_blas(params, a, b, bias, out, code, b_is_nk, packed=None):
    bmat = b.T if b_is_nk else b
    if out is not None and out.flags.c_contiguous:
        res = np.matmul(a, bmat, out=out)
    else:
        res = np.matmul(a, bmat)
    if (bias is not None or code != ACT_NONE) and res.size:
        n = res.shape[-1]
        bias_v = _zeros(n, res.dtype) if bias is None else kernel_input(bias)
        K.epilogue(res.reshape(-1, n), bias_v, code, num_threads())
    return deliver(res, out)


# ---- work model ----------------------------------------------------------------------------

def _dims(call):
    a, b, b_is_nk = call.args.a, call.args.b, call.args.b_is_nk
    if b_is_nk:
        return 1, math.prod(a.shape[:-1]), b.shape[0], a.shape[-1]
    batch = math.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return batch, a.shape[-2], b.shape[-1], a.shape[-1]


def _flops(call):
    batch, m, n, k = _dims(call)
    per_out = 2 * k + (call.args.bias is not None) + FLOPS_PER_ELEMENT[call.args.act]
    return batch * m * n * per_out


def _bytes(call):
    """Fewest bytes: read a, b and bias once (broadcast batches once), write the result."""
    a, b, bias = call.args.a, call.args.b, call.args.bias
    batch, m, n, k = _dims(call)
    if isinstance(b, QuantizedArray) or b.dtype.itemsize != a.dtype.itemsize:  # a low-precision weight
        wb = (b.values.nbytes if isinstance(b, QuantizedArray) else b.size * b.dtype.itemsize)
        return (a.size + (bias.size if bias is not None else 0) + batch * m * n) * a.dtype.itemsize + wb
    elems = a.size + b.size + (bias.size if bias is not None else 0) + batch * m * n
    return elems * a.dtype.itemsize


# ---- selection -----------------------------------------------------------------------------

# Blocking of gemm_parallel (float32 tile 6 x 16, float64 6 x 8).  Measured with one
# thread (CPU time, min of reps, so that other jobs on the machine do not count), direct
# kernel calls, GFLOP/s for (MC_PANELS, NC_PANELS, KC_MAX):
#   128x768x768:         (16,16,384) 82  (16,16,768) 90  (22,8,768) 88  (22,4,768) 85
#   128x768x3072 (B^T):  (16,16,384) 71  (16,16,768) 81  (22,8,768) 84  (22,4,768) 84
#   1024^3:              (16,16,384) 90  (16,16,1024) 86 (22,8,1024) 95 (32,8,1024) 83
# numpy (OpenBLAS, one thread) on the same runs: 80-86, 76-80 (no epilogue), 93-96.
# So: no K blocking up to K = 1024 (the 16-column B slice, 64 KiB, streams from L2 fine
# on Zen), 22 row panels (132 rows: M = 128 is one row block) and 8 column panels.
KC_MAX = 1024
MC_PANELS = 22
NC_PANELS = 8
TASKS_MIN = 8     # split blocks until there are this many tasks (2 threads, balance)
NC_MIN = 4        # split columns down to 4 panels before splitting rows
# (KC_MAX, MC_PANELS, NC_PANELS) of the AVX-512 tiles (kernels_cpu.gemm.TILES; the 6x16
# tile uses the constants above): about the 6x16 tile's row and column extents (264 rows,
# 256-288 columns) and no K blocking up to 1024 (L2 is 2 MiB per core).  Measured on
# Sapphire Rapids, one thread, CPU time, medians of 7-9 rounds on a loaded host
# (2026-11-25), GFLOP/s for 8x48 with (KC_MAX, rows, columns):
#   1024^3:       (1024,264,288) 145-164  (512,264,288) 151  (1024,128,288) 148
#                 (1024,264,576) 154  (1024,264,144) 156;  numpy 160-162
#   128x768x768:  (1024,264,288) 99  (1024,64,288) 99  (1024,128,144) 97  (384,128,288) 101
#                 numpy 129
# All within the noise: the first is kept.  NC_MIN (4th value): split column blocks down to
# one panel before splitting rows (each row split re-reads the B panels from L2): 128x768x768
# prepacked, one thread, CPU time, medians of 15: (mc, nc) panels (16,3) 1.11 ms,
# (16,1) 1.12, (8,3) 1.20 (what NC_MIN 4 gave for 2 threads), (4,16) 1.31.
# Column blocks of the 8x48 tile widened from 6 to 24 panels (1152 columns): a task's row
# block of A stays in L2 across more B panels.  MiniLM's linears (M = 16 x 198 = 3168),
# 2 threads, interleaved medians (2026-11-26, Sapphire Rapids), GFLOP/s for 6 / 24 panels
# (PyTorch in the same runs): 3168x384x1152 310-312 / 318-319 (336-344), 3168x384x384
# 282-287 / 303-307 (322-336), 3168x384x1536 302-306 / 333-337 (340-357), 3168x1536x384
# 286-300 / 318-334 (328-370); 1024^3, 128x768x768, 128x768x3072 and 512x768x2304 the
# same within 1-2% (TASKS_MIN splits their columns again).
BLOCKING = {"8x48": (1024, 33, 24, 1), "12x32": (1024, 22, 8, 1)}


# Shape rule.  Measured on this machine (2 cores, shared with other jobs: CPU time, one
# thread, min of repetitions; float32; "ours" through dispatch with the implementation
# forced; numpy = OpenBLAS):
#   M < 8 (decode):  linear 4x768x768: gemv 0.15 ms, gemm 0.25, numpy 0.13;
#                    linear 2x768x3072+gelu_tanh: gemv 0.34, gemm 2.07, blas 2.17 (B packing
#                    and 6-row tiles are wasted on 2 rows); the gemv kernel alone matches
#                    OpenBLAS sgemv (768x768 36-38 us vs 32-37; 4096^2 2.8-3.0 ms both).
#   small products:  64^3: blas 0.019 ms, gemm 0.033 (packing, a parallel region);
#                    32x256x256: blas 0.068, gemm 0.094; 256^3: blas 0.349, gemm 0.377;
#                    the gap closes near M*N*K = 2^22.
#   larger, one thread (current kernel):
#                    128x768x768: gemm 1.82 ms, blas 1.51, numpy 1.56;
#                    1024^3: gemm 22.9, blas 24.4, numpy 23.6;
#                    linear 128x768x3072 + bias + gelu_tanh: gemm 7.29 (epilogue fused),
#                    blas 7.74 (OpenBLAS + our epilogue pass), numpy + numpy gelu 31.2.
#   two threads (wall clock, interleaved, minimum of 7 rounds; the load average was 5-20
#   from other jobs, so medians were meaningless): 128x768x768 gemm 1.04 ms, numpy 0.83,
#   ort 1.44; linear 128x768x3072 + gelu_tanh gemm 15.0, blas 43.9, ort 9.2.
# So: with an epilogue (bias or activation) gemm goes first: it saves the second pass and
# the hand-over from OpenBLAS's threads to numba's; a plain product goes to OpenBLAS, which
# is at least as fast without an epilogue in every measurement here (gemm is within 3% at
# 1024^3 and about 0.85x at M = 128).
#   (`python -m bench tune` can override the rule per key.)
# Decode shapes (M < 8): one row of a plain product goes to OpenBLAS, which read b faster in
# the one-row cases measured then: linear 1x768x768 blas 0.021 ms vs gemv 0.027; matmul
# 1x4096x4096 (a (K, N) b, 64 MiB) numpy 1.81 ms vs gemv 7.75 (python -m bench, quiet run;
# since then: a large linear weight, and 2-7 rows, see GEMV_ROWS below).  With bias +
# relu, OpenBLAS + the epilogue pass against our gemv, 2 threads, medians of 7 x 10 calls
# (Xeon with AVX-512, 2026-12-03), ms, blas / gemv:
#   M = 1: linear 4096x4096 1.44 / 2.69, 768x3072 0.25 / 0.41, 768x768 0.05 / 0.12;
#          matmul (K, N) b 4096x4096 1.35 / 1.65, 768x3072 0.32 / 0.40;
#   M = 2: linear 4096x4096 6.52 / 3.65, 768x3072 0.89 / 0.58, 768x768 0.27 / 0.19;
#          matmul 4096x4096 5.83 / 2.26, 768x3072 0.74 / 0.57 (OpenBLAS's sgemm from 2 rows);
#   M = 4: linear 4096x4096 6.94 / 4.92, matmul 5.80 / 3.43.
# So one row goes to OpenBLAS + the epilogue (below 64 MiB of linear weight), 2-7 rows to our gemv.
# Prepacked weights (dispatch.prepack; interleaved, 11 rounds, 0.2 s pauses, quiet AMD Zen 3
# host): linear 128x768x3072 + bias + gelu_tanh: cpu-gemm prepacked 5.72 ms, unpacked 7.14,
# onnxruntime (constant weight) 5.81; matmul 128x768x768 with no epilogue: cpu-gemm
# prepacked 1.93 ms, OpenBLAS on the source 1.36.  So a prepacked weight moves cpu-gemm
# first only with an epilogue; a plain product keeps the rule below (OpenBLAS first).
GEMV_ROWS = 8          # bucket(M) < 8: gemv
# 2-7 rows with no epilogue went to OpenBLAS too, which runs its sgemm on them: plain
# products, a process per implementation, medians of 9 batches after 10 ms pauses (Zen 4,
# 2 threads, 2026-12-05), us, blas / cpu-gemv: linear M = 2 768x768 210 / 48, 768x3072 759 /
# 141, 4096x4096 7924 / 1439; matmul M = 2 110 / 56, 650 / 163, 5165 / 1916; M = 4 linear
# 217 / 51, 787 / 148, 7567 / 1565, matmul 107 / 81, 662 / 282, 5316 / 2668.
# One row against a linear (N, K) weight read from memory, not cache: cpu-gemv from 64 MiB
# of weight (dot_row's 16-lane one-row tile).  Same method, three runs each, us, blas /
# cpu-gemv: 768x768 28-29 / 40-41, 768x3072 82-94 / 106-110, 1024x4096 131-142 / 169-180,
# 2048x4096 321-434 / 394-464, 4096x4096 1275-1417 / 1152-1161, 4096x11008 4180-4391 /
# 3587-5057 (3587-3614 in two).  Timed interleaved in one process ours loses more (768x3072
# 79 / 105-152): after each OpenBLAS call its threads spin for ~0.1 s on the core our
# second thread needs; in a decode loop of our ops nothing calls OpenBLAS from this size.
GEMV_OWN_BYTES = 1 << 26
SMALL_PRODUCT = 1 << 22  # bucket(M) * bucket(N) * bucket(K) < 2^22: blas
# Where numpy's OpenBLAS runs kernels narrower than the host's vectors (0.3.31 knows no
# Zen 5 and runs its Haswell AVX2 kernels there), our AVX-512 GEMM beats it on a plain
# product too.  Zen 5, 2 threads, unpacked, medians of 9 interleaved (2026-11-26), blas ->
# cpu-gemm: 2048^3 67.0 -> 43.2 ms, 1024^3 8.42 -> 6.08, 4096x768x768 19.3 -> 12.6, 512^3
# 1.08 -> 0.94, 128x768x3072 2.48 -> 2.32, 128x768x768 0.633 -> 0.595; it loses at 256^3
# (0.163 -> 0.194), 64x256x256 (0.059 -> 0.088) and with N = 64 (3136x576x64: 0.98 -> 1.26:
# 64 columns are 1.3 tiles of 48).  So on such a host: cpu-gemm first from M*N*K buckets of
# 2^25 with an N bucket of at least 128.
WIDE_GEMM_PRODUCT = 1 << 25
WIDE_GEMM_MIN_N = 128
# A prepacked weight moves that crossover down: our GEMM then skips packing B, OpenBLAS
# gains nothing from it.  Zen 5, 2 threads, plain matmul with a prepacked b, each impl in a
# process of its own (OpenBLAS's spinning threads slow the next library's kernels), us per
# call (a) back to back / (e) batches of 10 after 10 ms pauses, blas -> cpu-gemm
# (2026-11-27): 8x384x384 34/37 -> 40/65, 32x384x384 75/78 -> 60/81, 64x256x256 60/62 ->
# 62/81, 128x256x256 97/104 -> 93/102, 256^3 194/198 -> 147/160, 128x384x384 202/214 ->
# 137/150, 128x768x768 724/733 -> 374/393, 512x384x384 620/624 -> 417/421, 128x384x1536
# 695/690 -> 375/398; with N = 64 blas keeps it (3136x576x64 975/1014 -> 1016/1051).
# Where OpenBLAS has AVX-512 kernels too (SkylakeX on a Xeon with AVX-512, same method, two
# runs each, 2026-12-03), blas -> cpu-gemm: 8x768x768 135-227/172-263 -> 77-87/108-130,
# 16x768x768 195-244/231-233 -> 110/143, 32x768x768 269-288/299-471 -> 170/206, 64x768x768
# 391-618/401-415 -> 287/324, 32x3072x768 1158-1391/1154-1157 -> 617/661, 32x512x512
# 121-124/137-141 -> 102-104/130-142, 16x1024x256 84-85/97-106 -> 66-70/89-103; ties and
# small losses below 2^23 with short rows: 64x256x256 58-66/77-82 -> 63-68/88-91,
# 128x256x256 98-106/109-112 -> 104-110/118-133, 128x384x384 172-182/187-193 ->
# 171-198/187-213, 8x384x384 43/59-73 -> 45-55/69-89, 32x256x256 40-49/64-87 -> 51-53/81-89.
# So on any host with the 16-lane tile a prepacked weight goes to cpu-gemm from M*N*K
# buckets of 2^22 (N bucket >= 128): the wins there are 1.3-2x, the losses up to 10%.
PREPACKED_GEMM_PRODUCT = 1 << 22
# A plain product on our GEMM where OpenBLAS has AVX-512 kernels too (the rule's last
# 16-lane case): alone they are close, and OpenBLAS's threads keep spinning after its call
# (~0.1 s), taking the second core from the next parallel kernel. Our 1024^3 GEMM in a
# process that never called OpenBLAS: 267-281 GFLOP/s on 2 threads (numpy alone 263); the
# same GEMM called right after numpy's: 163-174 (Sapphire Rapids-class Xeon, medians of 5,
# 2026-12-03). Same host kind, OpenBLAS SkylakeX kernels, 2 threads, medians of 9 x 5 calls
# after 0.25 s pauses (2026-12-02), ms, blas / cpu-gemm: alone 128x768x768 1.01-1.21 /
# 1.12-1.17, 512x768x768 2.43-2.62 / 2.60-2.64, 128x3072x768 2.95-3.13 / 3.47-3.54,
# 128x768x3072 3.10 / 3.23, 1024^3 7.66 / 7.72, 3168x384x384 3.83 / 3.66; followed by our
# layer_norm and linear 768 -> 3072 + gelu: 128x768x768 5.89 / 4.68, 512x768x768 15.28 /
# 12.04, 128x3072x768 7.98 / 7.38. A plain matmul's cold first call then compiles the GEMM
# (0.02 -> 2.0 s, under issue #8's 3 s), and linear_cross_entropy keeps its plain products
# on OpenBLAS for its own cold first call (see its _plain_products_on_blas). (linalg_grad's
# plain backward products moved first: see its rule.)  A user's sequence, matmul 128x768x768
# -> layer_norm -> attention 1x12x128x64 -> linear 768 -> 3072 + bias + gelu, one process
# per rule, medians of 25 (2026-12-03): back to back 6.5-7.5 ms with the matmul on OpenBLAS,
# 4.6-5.1 on ours (attention 714-750 -> 420-456 us, the linear 4.6-5.5 -> 3.1-3.5 ms); each
# sequence after 0.2 s idle 10.7-10.8 -> 7.0-7.1 ms, although the matmul alone then takes
# 1.35-1.39 ms on OpenBLAS and 1.70 on ours.
# A plain float32 product whose (K, N) b our GEMM reads in place (kernels_cpu.gemm.B_IN_PLACE:
# one row block, rows of at most B_IN_PLACE_ROW_BYTES and, on Intel hosts, not a multiple
# of B_IN_PLACE_BAD_STRIDE (b_rows_conflict, the key's rows_2k), so an N bucket n qualifies
# whole when 2n values fit a row: n = 512 for float32, but not N = 512 itself on Intel hosts;
# M bucket <= 128 is one row block; matmul, one
# batch: linear's (N, K) weight is not read so): no copy of b is made,
# where OpenBLAS packs it on every call.  Zen 4, 2 threads,
# interleaved medians of 9 rounds with the round quartiles, us, cpu-gemm / blas (2026-12-06):
# K bucket >= 512: 8x768x768 80 / 136 (0.56-0.60), 16x768x768 130 / 196, 32x768x768 225 /
# 271, 64x768x768 432 / 469, 16x512x512 89 / 115, 64x512x512 233 / 299 and 218 / 224 (0.94-1.02),
# 128x384x768 405 / 440, 32x1024x768 269 / 394, 16x3072x768 461 / 842, 48x512x768 210 / 307;
# K bucket 256 ties (64x256x512 123 / 121, 96x256x640 195 / 190, 128x256x512 216 / 214,
# 100x300x600 239 / 231 and 242 / 222), and N bucket 256 loses (128x256x256 138 / 109).
# The key's half-octave buckets (registry.bucket_half) then tell N and K of 384 from 256.
# Same method, medians of 3 alternating pairs (Zen 4, 2026-12-06), us, cpu-gemm / blas, as
# M x K x N.  N = 384 (whole 48-column panels) wins at every M up to 250 and K from 256:
# 16 / 64 / 128 / 200 / 250 x 384x384 41.9 / 56.3, 111 / 156, 198 / 213, 299 / 437, 511 /
# 516; 16 / 64 / 128 x 512x384 59 / 66, 139 / 196, 264 / 283; 64 / 200 / 250 x 768x384
# 194 / 268, 552 / 783, 977 / 1007; 16 / 128 x 400x384 44 / 58, 200 / 221 (100: 198 / 197);
# 64 / 128 x 256x384 81 / 99, 134 / 150.  K = 384 with N in the 512 and 768 buckets too:
# 16 / 64 / 128 x 384x512 65 / 76, 162 / 197, 285 / 289; 16 / 64 / 128 / 200 / 250 x
# 384x768 68 / 101, 198 / 263, 361 / 400, 657 / 805, 895 / 947.  Other N of the 384 bucket
# end in a partial panel and lose from M = 100 (100 / 128 x 384x400 213 / 185, 252 / 232;
# 100 / 128 / 250 x 384x448 221 / 198, 249 / 243, 749 / 594; 100 / 128 x 500x500 318 /
# 297, 371 / 352), while winning at M = 16 (0.87-0.97), and so does N = 512 with K = 384
# from M = 128 (128 / 250 x 384x512 287 / 282, 566 / 522): so N or K in the 384 buckets only
# with N a multiple of 48 (the key's n48).  N = 256 and 320 (partial panels, not in this
# rule) lose 1.2-2.8x.
IN_PLACE_MIN_N = 512
IN_PLACE_MIN_K = 512
IN_PLACE_WHOLE_MIN = 384
IN_PLACE_MAX_M = 128
# OpenBLAS core names (openblas_get_corename) whose sgemm kernels use AVX-512
_BLAS_AVX512_CORES = ("skylakex", "cooperlake", "sapphirerapids")


@functools.cache
def blas_core() -> str | None:
    """The core name numpy's OpenBLAS chose for this host ("Haswell", "SkylakeX", ...), or
    None when numpy's BLAS is not an OpenBLAS this can ask (its openblas_get_corename)."""
    import ctypes
    import glob
    import os
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs, "*openblas*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                    "openblas_get_corename"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                name = fn()
                return name.decode().strip() if name else None
    return None


def blas_narrower_than_host() -> bool:
    """Whether our GEMM runs AVX-512 (the 8x48 tile's 16 lanes) where numpy's OpenBLAS
    runs a core without AVX-512 kernels."""
    core = blas_core()
    return (core is not None and K.active_tile().lanes32 >= 16
            and core.lower() not in _BLAS_AVX512_CORES)


def _order(key):
    if key.weight_format != WEIGHT_DENSE:
        from .weight_only import order  # it imports this module
        return order(key)
    if key.op == "matmul" and V.is_bfloat16(key.dtype):
        from .bf16_matmul import order  # it imports this module
        return order(key, *_order_widened(key))
    return _order_widened(key)


def _bf16_panels(key) -> bool:
    """Whether a prepacked key's b holds run_kn's bfloat16 panels (bf16_matmul.prepack_bf16),
    not float32 ones: the widened kernels then widen b as unpacked."""
    if key.op != "matmul" or not V.is_bfloat16(key.dtype) or key.k_odd:
        return False
    from .bf16_matmul import packed_form   # (it imports this module)
    return packed_form() is not None


def _order_widened(key):
    """The order of the dense float kernels (16-bit operands widened to float32 first, or
    b widened by cpu-gemm's tasks: b16_tasks)."""
    m, n, k = key.m, key.n, key.k
    # A prepacked 16-bit b (float32 panels of its widened values): the GEMM from GEMV_ROWS, as
    # for float32.  float16, forced, medians of 5 x 10 calls alternating (Zen 4, 2 threads,
    # 2026-12-08, /tmp/w/mpt.py), ms, cpu-gemv / cpu-gemm unpacked / prepacked: 768 x 768 M 1
    # 0.066 / 0.143 / 0.095, 4 0.097 / 0.143 / 0.098, 8 0.149 / 0.128 / 0.080, 16 0.393 / 0.198 /
    # 0.132; 4096 x 4096 M 1 1.68 / 6.69 / 2.22, 4 3.02 / 7.55 / 2.74, 8 3.28 / 5.58 / 2.21.
    if key.prepacked and key.dtype.itemsize == 2 and not _bf16_panels(key):
        if m < GEMV_ROWS:
            return ("cpu-gemv", "cpu-gemm", "blas"), (
                f"16-bit b (prepacked), M bucket {m} < {GEMV_ROWS}: matrix-vector form reading the 16-bit b once, half "
                "the bytes of the float32 panels")
        return ("cpu-gemm", "cpu-gemv", "blas"), (
            f"16-bit b (prepacked), M bucket {m} >= {GEMV_ROWS}: our GEMM on the float32 panels of its widened values")
    if key.b16_tasks:
        work = key.batch * m * n * k
        if work >= GEMM16_MIN_WORK and m < GEMV_ROWS:
            return ("cpu-gemv", "cpu-gemm", "blas"), (
                f"16-bit b, M bucket {m} < {GEMV_ROWS}, batch x M x N x K bucket {work} >= 2^19: matrix-vector form "
                "reading b as it is (widened in L1), once; no float32 copy or panels of it")
        if work >= GEMM16_MIN_WORK:
            return ("cpu-gemm", "blas", "cpu-gemv"), (
                f"16-bit b widened by our GEMM's tasks into their own panels, batch x M x N x K bucket {work} >= "
                f"2^19: no float32 copy of b (OpenBLAS takes one)")
        return ("blas", "cpu-gemm", "cpu-gemv"), (
            f"16-bit, batch x M x N x K bucket {work} < 2^19: one widened copy and OpenBLAS cost less than our "
            "GEMM's plan and launch")
    # the product thresholds below were measured on power-of-two buckets: the half-octave
    # ones of the key, floored to them (bucket(bucket_half(n)) == bucket(n))
    mnk = m * bucket(n) * bucket(k)
    epilogue = key.act != ACT_NONE or key.has_bias
    if key.prepacked and m >= GEMV_ROWS and epilogue:
        return ("cpu-gemm", "blas", "cpu-gemv"), "weight prepacked, with bias/activation: the own GEMM skips packing it and fuses the epilogue"
    if m == 1 and key.op == "linear" and bucket(n) * bucket(k) * key.dtype.itemsize >= GEMV_OWN_BYTES:
        return ("cpu-gemv", "blas", "cpu-gemm"), (f"one row, a weight of {GEMV_OWN_BYTES >> 20} MiB or more (read from "
                                                  "memory, not cache): our gemv streams it faster than OpenBLAS's, "
                                                  "and no OpenBLAS threads are left spinning")
    if m == 1:
        return ("blas", "cpu-gemv", "cpu-gemm"), ("one row: OpenBLAS's gemv reads b faster than ours (any epilogue is "
                                                  "a pass over one row)")
    if m < GEMV_ROWS:
        return ("cpu-gemv", "cpu-gemm", "blas"), (f"M bucket {m} < {GEMV_ROWS}: matrix-vector form (epilogue fused), "
                                                  "bound by reading b once; OpenBLAS runs its sgemm from 2 rows")
    if (key.prepacked and mnk >= PREPACKED_GEMM_PRODUCT and n >= WIDE_GEMM_MIN_N
            and K.active_tile().lanes32 >= 16):
        return ("cpu-gemm", "blas", "cpu-gemv"), (f"weight prepacked, M*N*K bucket >= 2^22, N bucket >= {WIDE_GEMM_MIN_N}: "
                                                  f"our {K.active_tile().name} GEMM skips packing the weight, numpy's "
                                                  f"OpenBLAS ({blas_core()} kernels) packs it on every call")
    if (key.op == "matmul" and key.batch == 1 and not epilogue and not key.prepacked and key.dtype == np.float32
            and K.active_tile().lanes32 >= 16 and m <= IN_PLACE_MAX_M and not key.rows_2k
            and (bucket_half_end(n) - 1) * key.dtype.itemsize <= K.B_IN_PLACE_ROW_BYTES
            and ((n >= IN_PLACE_MIN_N and k >= IN_PLACE_MIN_K)
                 or (key.n48 and n >= IN_PLACE_WHOLE_MIN and k >= IN_PLACE_WHOLE_MIN))):
        if n >= IN_PLACE_MIN_N and k >= IN_PLACE_MIN_K:
            sizes = f"N bucket {n}, K bucket >= {IN_PLACE_MIN_K}"
        else:
            sizes = f"N bucket {n} (a multiple of 48: whole column panels), K bucket >= {IN_PLACE_WHOLE_MIN}"
        return ("cpu-gemm", "blas", "cpu-gemv"), (f"plain product, {sizes}, M bucket <= {IN_PLACE_MAX_M}: our "
                                                  f"{K.active_tile().name} GEMM reads b in place (no copy), "
                                                  "OpenBLAS packs it on every call")
    if mnk < SMALL_PRODUCT:
        return ("blas", "cpu-gemm", "cpu-gemv"), f"M*N*K bucket {mnk} < 2^22: one BLAS call costs less than packing + a parallel region"
    if epilogue:
        return ("cpu-gemm", "blas", "cpu-gemv"), "M >= 8 with bias/activation: cache-blocked GEMM with the epilogue fused (no second pass)"
    if mnk >= WIDE_GEMM_PRODUCT and n >= WIDE_GEMM_MIN_N and K.active_tile().lanes32 >= 16:
        why = (f"numpy's OpenBLAS runs its {blas_core()} kernels on this AVX-512 host, our {K.active_tile().name} "
               "GEMM is faster" if blas_narrower_than_host() else
               f"{K.active_tile().name} tile: as fast as OpenBLAS alone, and no OpenBLAS threads left spinning to "
               "take a core from the next parallel kernel")
        return ("cpu-gemm", "blas", "cpu-gemv"), f"M*N*K bucket >= 2^25, N bucket >= {WIDE_GEMM_MIN_N}: {why}"
    return ("blas", "cpu-gemm", "cpu-gemv"), "M >= 8, no epilogue: OpenBLAS is as fast or faster for a plain product"


_NOTES_GEMM = ("own cache-blocked GEMM: A and B packed into panels of the register tile the host runs "
               "(6x16 AVX2, 8x48 AVX-512: the vectors line), tasks over batch x row x column blocks, "
               "bias + activation fused into the tile store; transposed views read without a copy, "
               "other non-contiguous inputs copied; a float32 linear with at most "
               f"{ROWS_M_MAX} rows and a weight of {rows_min_bytes() >> 20} MiB or more (3/4 of the L3 here, at least "
               f"{ROWS_MIN_BYTES >> 20}; N >= K, 8x48 tile) reads the "
               "weight in place instead of packing it (kernels_cpu.gemm.gemm_rows); a (K, N) b with rows of at most "
               f"{K.B_IN_PLACE_ROW_BYTES} bytes (on Intel hosts not a multiple of {K.B_IN_PLACE_BAD_STRIDE}) and at least one "
               "tile's columns is read in place when M is one row block, a partial last panel packed "
               "(kernels_cpu.gemm.B_IN_PLACE)")
_NOTES_GEMV = ("matrix-vector form for few rows, on the thread team: against linear's (N, K) weight, "
               f"tasks of {K.GEMV_NK_ROWS} weight rows, each group of {K.TB} dotted with every row of a "
               "(weight rows streamed once, the next group prefetched); a (K, N) b in slabs of whole rows, "
               f"{K.GEMV_KN_ROWS} rows per pass over partial sums of every output, then a pass adding them; "
               "bias + activation fused")
_NOTES_BLAS = ("numpy.matmul (OpenBLAS) then a parallel bias + activation kernel: the epilogue is "
               "a second pass over the output (skipped without bias and activation)")


_RULE = Rule(("cpu-gemm", "cpu-gemv", "blas"), _order)
# linear also takes low-precision weights (dispatch/ops/weight_only.py registers these)
_RULE_LINEAR = Rule(_RULE.names + ("cpu-wo-gemv", "cpu-wo-gemm", "cpu-wo-amx", "cpu-bf16-dot",
                                    "cpu-bf16-amx"), _order)
# and matmul bfloat16 operands on AMX tiles or vdpbf16ps (dispatch/ops/bf16_matmul.py registers them)
_RULE_MATMUL = Rule(_RULE.names + ("cpu-bf16-amx", "cpu-bf16-dot"), _order)


def dense_weight(key) -> list:
    """supports() of the dense implementations: a low-precision weight goes to the weight-only ones."""
    fmt = getattr(key, "weight_format", WEIGHT_DENSE)
    if fmt == WEIGHT_DENSE:
        return []
    return [f"weight is {WEIGHT_FORMAT_NAMES[fmt]}: the dense kernels read weights of x's dtype "
            "(the weight-only implementations *-wo-* take it)"]


def _synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: standard-normal operands; a linear weight scaled by 1/sqrt(K) so
    activations see values of order one."""
    fmt = params.get("weight_format")  # a low-precision weight case (bench/cases/weight_only.py)
    out = {n: draw_normal(rng, s, dtype) for n, s in shapes.items()}
    if "weight" in out and shape_only(rng):  # zeros (registry.draw_normal): nothing to scale or read
        if fmt:
            from .weight_only import zero_weight
            out["weight"] = zero_weight(shapes["weight"], fmt)
    elif "weight" in out:
        out["weight"] *= dtype(1.0 / math.sqrt(out["weight"].shape[-1]))
        if fmt:
            from .weight_only import low_precision_weight
            out["weight"] = low_precision_weight(out["weight"], fmt)
    act = params.get("activations")
    if act in ("bfloat16", "float16"):  # linear's x and bias too (its weight: weight_format), matmul's all
        from .weight_only import low_precision_weight
        for name in (("x", "bias") if "x" in out else tuple(out)):
            if name in out:
                out[name] = low_precision_weight(out[name], act)
    return out


def _sig_matmul(i):
    return (i["a"], i["b"]), {"bias": i.get("bias"), "activation": i.get("activation")}


def _sig_linear(i):
    return (i["x"], i["weight"], i.get("bias")), {"activation": i.get("activation")}


def _epilogue_variants(bias_at):
    """Op.variants for warmup: the GEMM's epilogue is compiled per activation (none, bias
    only, bias + each activation), so each is a kernel of its own to compile ahead.
    bias_at: where the bias goes, ("args", 2) for linear, ("kwargs", "bias") for matmul."""
    def variant(activation, with_bias):
        def make(args, kwargs):
            args, kwargs = list(args), dict(kwargs, activation=activation)
            n = args[1].shape[0] if bias_at[0] == "args" else args[1].shape[-1]
            bias = np.zeros(n, args[0].dtype) if with_bias else None
            if bias_at[0] == "args":
                args[bias_at[1]] = bias
            else:
                kwargs[bias_at[1]] = bias
            return tuple(args), kwargs
        return make

    def a_form(rows):
        def make(args, kwargs):
            dt = args[0].dtype
            a = np.zeros((rows, 16), dt)
            if bias_at[0] == "args":
                return (a, np.zeros((50, 16), dt), None), dict(kwargs, activation=None)
            return (a, np.zeros((16, 50), dt)), dict(kwargs, bias=None, activation=None)
        return make

    out = {"no epilogue": variant(None, False), "bias": variant(None, True)}
    out.update({act: variant(act, True) for act in ACTIVATION_CODES if act is not None})
    # the GEMM worker is compiled per A form (kernels_cpu.gemm.A_IN_PLACE_OK): 24 rows (a
    # whole number of every tile's rows) read a in place, 25 pack it; 50 columns keep b in
    # packed panels
    out["a read in place"] = a_form(24)
    out["a packed"] = a_form(25)
    # linear: a weight large enough to be read in place (gemm_rows), where that is not more
    # than ROWS_EXAMPLE_MAX_BYTES (a host with a large L3 meets that path rarely)
    if bias_at[0] == "args" and rows_min_bytes() <= ROWS_EXAMPLE_MAX_BYTES:
        def in_place(args, kwargs):
            dt = args[0].dtype
            k = 1024
            n = -(-rows_min_bytes() // (k * dt.itemsize))
            return (np.zeros((8, k), dt), np.zeros((n, k), dt), np.zeros(n, dt)), dict(kwargs, activation=None)
        out["weight read in place"] = in_place
    if bias_at[0] == "args":
        out.update(_weight_format_variants())
    return out


def _weight_format_variants():
    """linear's low-precision weights (the weight-only kernels, dispatch/ops/weight_only.py,
    take nothing else): the example's weight stored as each format, bfloat16 where ml_dtypes
    is installed, with x as float32 (what those kernels take with any of these weights)."""
    import importlib.util

    def variant(fmt):
        def make(args, kwargs):
            from .weight_only import low_precision_weight
            x, w = (np.asarray(a, np.float32) for a in args[:2])
            return (x, low_precision_weight(w, fmt), None), dict(kwargs, activation=None)
        return make

    fmts = ("float16", "int8") + (("bfloat16",) if importlib.util.find_spec("ml_dtypes") else ())
    return {f"weight {fmt}": variant(fmt) for fmt in fmts}


def _half(run32, gemm16=None):
    """run32 for bfloat16 / float16 a, b and bias as well (PyTorch's 16-bit matmul on the
    CPU): widened to float32 copies (O(MK + KN) beside the O(MNK) work), the float32 kernel,
    the result rounded once to a's dtype.  gemm16 (cpu-gemm's _gemm16, cpu-gemv's _gemv16):
    the float32 product of the 16-bit operands computed without a float32 copy of b, or
    None where it does not apply."""
    def run(params, a, b, bias, out, code, b_is_nk, packed=None):
        if a.dtype.itemsize != 2:
            return run32(params, a, b, bias, out, code, b_is_nk, packed)
        if packed is not None and packed.dtype == np.float32 and run32 is _run_gemm:   # prepack's float32 panels
            # of the widened b (b's 16-bit patterns only give the plan its shape: the kernel reads the panels)
            res32 = run32(params, widened(a), b.view(np.uint16), None if bias is None else widened(bias), None, code,
                          b_is_nk, packed)
        else:
            res32 = None if gemm16 is None else gemm16(a, b, bias, code)
        if res32 is None:
            res32 = run32(params, widened(a), widened(b), None if bias is None else widened(bias), None, code,
                          b_is_nk)
        res = result_buffer(out, res32.shape, a.dtype)   # C-contiguous: out itself, or copied into it
        KH.round_into(res32.reshape(-1), half_bits(res.reshape(-1)))
        return deliver(res, out)

    return run


GEMM16_MIN_B = 1 << 14


def b16_in_tasks(a_shape, b_shape) -> bool:
    """Whether a 16-bit matmul's b is widened by the GEMM's tasks (_gemm16): b of at least
    GEMM16_MIN_B elements, not broadcast along a batch dim (a 2-D b: a's batch dims are
    folded into its rows).  describe's key (GemmKey.b16_tasks) and _gemm16 both ask here."""
    if math.prod(b_shape) < GEMM16_MIN_B:
        return False
    return len(b_shape) == 2 or tuple(b_shape[:-2]) == np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))


# A 16-bit matmul whose b the tasks widen (b16_in_tasks) runs on cpu-gemm from a batch x M x N
# x K bucket of 2^19: below it one widened copy and OpenBLAS cost less than our plan and
# launch.  float16, 2 threads, ms, cpu-gemm / blas (widened copies) / cpu-gemv, forced,
# minimum of two medians (Xeon with AMX, 2026-12-07, /tmp/w/h16.py): M=1 768x768 0.162 /
# 0.209 / 0.228, 4096x4096 3.84 / 8.12 / 7.91, 1x1024x1024 0.210 / 0.348; 4x512x512 0.065 /
# 0.131 / 0.083; 8x768x768 0.099 / 0.329; 32x768x768 0.196 / 0.482; (4, 32, 768) @ 768x768
# 0.564 / 1.266; 64x768x768 0.311 / 0.588; 8x384x384 0.056 / 0.078; 16x256x512 0.064 /
# 0.071; below 2^19: 1x512x512 0.079 / 0.048, 2x384x384 0.055 / 0.029 / 0.045, 2x128x128
# 0.030 / 0.013 / 0.023; at 2^21 a tie (32x256x256 0.060 / 0.058, 128^3 0.055 / 0.055).
# (bfloat16 on hosts without AMX takes the same path: 8x768x768 0.166 / 0.339, 16x4096x4096 4.54 / 10.42.)
# Below GEMV_ROWS rows cpu-gemv reads b itself (_gemv16), once, where cpu-gemm writes all of
# it as float32 panels: cpu-gemv / cpu-gemm / blas, same runs: M=1 4096x4096 0.918 / 3.98 /
# 7.64, 11008x4096 2.78 / 14.3 / 27.7, 768x768 0.072 / 0.156 / 0.208, 3072x768 0.310 /
# 0.439 / 0.828; M=4 4096x4096 1.88 / 4.00, 768x3072 0.494 / 0.552, 768x768 0.133 / 0.162;
# M=6 768x768 0.158 / 0.160; at 8 rows mixed (4096x4096 2.95 / 3.96, 768x3072 0.774 /
# 0.487, 768x768 0.194 / 0.163).
GEMM16_MIN_WORK = 1 << 19


def _gemm16(a, b, bias, code):
    """The float32 act(a @ b + bias) of a 16-bit matmul on the cache-blocked GEMM, or None
    where b is broadcast along a batch dim (then the caller widens copies).  a (a 2-D b: its
    batch dims folded into the rows) and bias are widened to float32 copies; b is widened
    by the GEMM's tasks straight into their own B panels (kernels_cpu.weight_only.pack_b16),
    each right before its micro-kernels read it: a float32 copy of b written by the calling
    thread cost the GEMM more than the copy itself (its lines then came from the other
    core's cache).  float16 on cpu-gemm, 2 threads, medians of 5 x 30 calls alternating in
    one process (Xeon with AMX, 2026-12-07), ms, widened copies -> this: 128x768 @ 768x768
    0.924 -> 0.575 (b a transposed view 1.549 -> 0.613), 128x768x3072 3.15 -> 2.34,
    128x3072x768 3.05 -> 2.48, 128x4096x4096 24.3 -> 17.8, 512x768x768 2.42 -> 2.24, 1024^3
    7.34 -> 7.05, 128x512x512 0.441 -> 0.325, 128x256x256 0.148 -> 0.129, (4, 32, 768) @
    768x768 1.145 -> 0.564; batched b: 12 x 128x64 @ 64x128 0.227 -> 0.195, 12 x 128^3
    0.392 -> 0.329, 16 x 198x32 @ 32x198 0.620 -> 0.529.  Below GEMM16_MIN_B elements of
    b the plan's Python costs more than the copy: 5x7 @ 7x9 14.4 -> 17.3 us, 16x24 @ 24x40
    17.7 -> 18.6, 40x50 @ 50x70 batched 31.8-43.6 -> 33.6-45.2 (float16 and bfloat16 alike)."""
    prep = _prepare16(a, b, bias)
    if prep is None:
        return None
    a3, b3, ai, bi, ta, tb, bias_v, out3, res, shape = prep
    widening_gemm_launch(a3, b3, ai, bi, ta, tb, WEIGHT_F16 if b.dtype == np.float16 else WEIGHT_BF16, bias_v,
                         bias is not None or code != ACT_NONE, code, out3)
    return res.reshape(shape)


def _prepare16(a, b, bias):
    """The kernel arguments of a 16-bit matmul whose b the kernels widen themselves
    (b16_in_tasks): _prepare's, on a float32 copy of a (a 2-D b: its batch dims folded into
    the rows) and bias, b3 as its bit patterns (uint16); the result's shape last.  None:
    b16_in_tasks says no, or nothing to compute (K = 0, an empty result)."""
    if not b16_in_tasks(a.shape, b.shape):
        return None
    k = a.shape[-1]
    a32 = widened(a)
    if b.ndim == 2:
        a32 = a32.reshape(-1, k)
    a3, b3, ai, bi, ta, tb, bias_v, out3, res, _ = _prepare(a32, b, None if bias is None else widened(bias), None,
                                                            False)
    if b3.shape[0] != out3.shape[0] or k == 0 or not out3.size:
        return None
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], out3.shape[2])
    return a3, b3.view(np.uint16), ai, bi, ta, tb, bias_v, out3, res, shape


def _gemv16(a, b, bias, code):
    """The float32 act(a @ b + bias) of a 16-bit matmul in matrix-vector form, b read as it
    is (kernels_cpu.weight_only.gemv_kn16 for b stored (K, N), the weight-only GEMV's
    workers for a 2-D b stored (N, K)), or None where _prepare16 says no (then the caller
    widens copies).  Float16 decode, 1x4096 @ 4096x4096, 2 threads: 0.92 ms where the
    widened copies took 7.6-7.9 and cpu-gemm 3.98 (the rule's measurements: GEMM16_MIN_WORK)."""
    prep = _prepare16(a, b, bias)
    if prep is None:
        return None
    a3, b3, ai, bi, ta, tb, bias_v, out3, res, shape = prep
    fmt = WEIGHT_F16 if b.dtype == np.float16 else WEIGHT_BF16
    if not tb:
        KW.gemv_kn16(a3, b3, ai, bi, ta, fmt, bias_v, bias is not None or code != ACT_NONE, code, out3, num_threads())
    elif b3.shape[0] == 1:  # one (N, K) b: a linear weight's rows
        KW.run_gemv(np.ascontiguousarray(a3[0].T if ta else a3[0]), b3[0], fmt, None, None, bias_v, code,
                    KW.active_lanes() == 16, out3[0])
    else:
        return None
    return res.reshape(shape)


def widening_gemm_launch(a3, b3, ai, bi, ta, tb, fmt, bias_v, has_epilogue, code, out3, extra=()):
    """out3 = act(a3[ai] @ widen(b3[bi]) + bias) on the cache-blocked GEMM (float32 a3,
    bias_v and out3 as gemm_parallel takes them), b3 a low-precision B whose panels the
    GEMM's tasks widen themselves right before reading them: fmt WEIGHT_F16 / WEIGHT_BF16,
    the bit patterns (uint16), (K, N) or stored (N, K) (tb), one B per output batch
    (kernels_cpu.weight_only.pack_b16); or WEIGHT_INT8, one int8 weight stored (N, K)
    dequantized with its per-row scale and zero point, whose addresses are `extra`
    (kernels_cpu.weight_only.pack_bq8).  _gemm16's and the weight-only linear's product."""
    nbatch, m, n = out3.shape
    k = a3.shape[1] if ta else a3.shape[2]
    args, sa, sb = _plan16(a3.shape[0], nbatch, m, n, k, ta, tb, fmt, has_epilogue, code, num_threads(),
                           K.active_index())
    ap, bp = _panel_buffers(sa, sb, np.float32)
    K.gemm_launch(args, a3, ap, b3, bp, out3, ai, bi, bias_v, extra)


@functools.lru_cache(maxsize=PLANS_MAX)
def _plan16(na, nbatch, m, n, k, ta, tb, fmt, has_epilogue, code, threads, ti):
    """(K.plan_args, packed A's shape, packed B's shape) of widening_gemm_launch's GEMM: its
    decisions made once per signature, as _run_gemm's (_PLANS)."""
    f32 = np.dtype(np.float32)
    tile = K.TILES[ti]
    mc, nc, kc = _gemm_blocks(m, n, k, nbatch, tile.nr(f32), tile, f32.itemsize)
    # the packer compiled beside the worker (two processes, parallel.worker_addresses): a
    # cold first call of 128x768 @ 768x768 float16 (empty cache, fresh processes) took
    # 2.60-2.73 s with the packer compiled first and alone, 2.19-2.25 s so (1.62-1.65 with
    # the widened copies)
    a_in_place = K.A_IN_PLACE_OK and not ta and m % tile.mr == 0
    packer = (KW.pack_bq8, (ti,)) if fmt == WEIGHT_INT8 else (KW.pack_b16, (fmt, ti, bool(tb)))
    pack_b = worker_addresses([K.worker_kernel(f32, ti, a_in_place), packer])[1]
    args = K.plan_args(na, nbatch, nbatch, m, n, k, ta, tb, f32, tile, False, mc, nc, kc, has_epilogue, code, threads,
                       pack_b=pack_b, nextra=KW.PACK_BQ8_EXTRA if fmt == WEIGHT_INT8 else 0)
    return args, *K.pack_shapes(na, nbatch, m, n, k, f32, tile)


_HALF_NOTE = ("; bfloat16 / float16 (matmul): a, b, bias widened to float32 copies, the result rounded once to a's "
              "dtype")
_HALF_NOTE_GEMV = ("; bfloat16 / float16 (matmul): a and bias widened to float32 copies, b read as it is and "
                   f"widened in L1 by the workers (b of {GEMM16_MIN_B}+ elements not broadcast along a batch dim; "
                   "else a float32 copy), the result rounded once to a's dtype")
_HALF_NOTE_GEMM = ("; bfloat16 / float16 (matmul): a and bias widened to float32 copies, b widened by the GEMM's tasks "
                   f"into their own panels (b of {GEMM16_MIN_B}+ elements not broadcast along a batch dim; else a "
                   "float32 copy), the result rounded once to a's dtype")


def _register(name, describe, signature, bias_at, half):
    op = register_op(Op(name, describe, memo=True, family="linalg", bound="compute", signature=signature, flops=_flops,
                        bytes=_bytes, rules={"cpu": _RULE_LINEAR if name == "linear" else _RULE_MATMUL}, synthesize=_synthesize,
                        variants=_epilogue_variants(bias_at)))
    wrap, dtypes, note = (_half, FLOAT_DTYPES + V.HALF_DTYPES, _HALF_NOTE) if half else (lambda r: r, FLOAT_DTYPES, "")
    register(Implementation(name, "cpu-gemm", "cpu", _half(_run_gemm, _gemm16) if half else _run_gemm,
                            notes=_NOTES_GEMM + (_HALF_NOTE_GEMM if half else ""), kernel_modules=_KERNELS,
                            supports=dense_weight, dtypes=dtypes))
    register(Implementation(name, "cpu-gemv", "cpu", _half(_run_gemv, _gemv16) if half else _run_gemv,
                            notes=_NOTES_GEMV + (_HALF_NOTE_GEMV if half else ""), kernel_modules=_KERNELS,
                            supports=dense_weight, dtypes=dtypes))
    register(Implementation(name, "blas", "cpu", wrap(_run_blas), notes=_NOTES_BLAS + note, kernel_modules=_KERNELS,
                            supports=dense_weight, dtypes=dtypes))
    return op


_matmul = _register("matmul", describe_matmul, _sig_matmul, ("kwargs", "bias"), half=True)
_linear = _register("linear", describe_linear, _sig_linear, ("args", 2), half=False)   # 16-bit: weight_only.py


@_matmul.expose
def matmul(a, b, *, bias=None, activation=None, out=None):
    """act(a @ b + bias): a (..., M, K), b (..., K, N) with numpy batch broadcasting, bias
    (N,) or None, activation None / "relu" / "gelu" / "gelu_tanh" / "silu" (fused into the
    kernel's epilogue).  Returns (..., M, N), written into out= when given."""
    return _matmul(a, b, bias=bias, activation=activation, out=out)


@_linear.expose
def linear(x, weight, bias=None, *, activation=None, out=None):
    """act(x @ weight.T + bias) as torch.nn.functional.linear (+ activation): x (..., K),
    weight (N, K), bias (N,) or None.  Returns (..., N), written into out= when given.
    weight may be stored in low precision (float16, ml_dtypes.bfloat16, an int8
    QuantizedArray with axis=0 or None) with float32 x (float32 / float16 on CUDA): it is
    widened inside the kernel, the sum kept in float32 (float64 x is refused).  On the CPU,
    bfloat16 x with a bfloat16 weight (and bias) is PyTorch's bfloat16 linear: float32
    sums of the exact products, bias and activation in float32, a bfloat16 result."""
    return _linear(x, weight, bias, activation=activation, out=out)
