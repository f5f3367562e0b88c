"""int8 GEMM ops (issue #12): int32 accumulation, dequantize + bias + activation fused.

    matmul_int8(a_q, b_q, *, bias=None, activation=None, out_dtype=np.float32, out=None)
        a_q: QuantizedArray (..., M, K), int8 or uint8, per-tensor or per-row (axis = its
            -2 axis, one scale / zero point per row, shared by the batch);
        b_q: QuantizedArray (K, N), int8, per-tensor or per-column (axis = 1);
        result (..., M, N) float32:
            act(scale_a[m] * scale_b[n] * sum_k (a[m, k] - za[m]) * (b[k, n] - zb[n]) + bias[n])

    dynamic_quant_linear(x, w_q, bias=None, *, activation=None, out=None)
        x: float32 (..., K); w_q: QuantizedArray (N, K) int8 (PyTorch Linear layout), per-
        tensor or per-output-channel (axis 0); result (..., N) float32:
            act(dequantize(quantize_rows(x)) @ dequantize(w_q).T + bias)
        quantize_rows: each row of x quantized to uint8 with its own scale and zero point by
        ONNX DynamicQuantizeLinear's formulas (float32: scale = (max(0, max x) - min(0, min
        x)) / 255, zp = saturate(round(-min(0, min x) / scale)), q = saturate(round(x /
        scale) + zp), rounding half to even; a row of zeros gets scale 1, zp 0).  Asymmetric
        uint8 because it is what the u8 x s8 dot product (vpdpbusd) takes without a shift,
        and it uses all 256 levels for one-sided rows (after a ReLU / GELU).  Per row rather
        than per tensor (ONNX's op) so one outlier token does not coarsen the others.
        x holding NaN or inf: ValueError (a quantization scale would not be finite).

Exactness.  The integer sum is exact in int32 on every path for K <= MAX_K = 65793 (K *
255 * 128 < 2^31: the kernels multiply a + 128 (int8 a) or a (uint8 a) with the signed
int8 b and remove the zero-point terms afterwards); larger K is a ValueError.  The
epilogue evaluates the zero-point corrections and scale_a * scale_b * sum in float64
(exact integers below 2^53, an exact scale product, one rounding), adds the bias, and
rounds once to float32 before the activation: the result equals the float64
dequantize(a) @ dequantize(b) + bias up to that final rounding (a few float64 roundings
below it).  A per-channel scale along K (a's axis -1, b's axis 0, w_q's axis 1) cannot
be factored out of the sum: a ValueError naming the argument.

The weight is packed once per QuantizedArray (q.cached) into the chosen micro-kernel's
layout with its column sums, and reused by every later call (`explain` shows whether it
already is: key field ``prepacked`` and a "prepared" line).  Implementations (chosen from
the host's CPU features, kernels_cpu/int8_gemm.host_paths, widest first): cpu-amx (AMX-INT8
tdpbusd tiles), cpu-vnni512 (AVX-512 VNNI vpdpbusd), cpu-avx2 (exact int16 vpmaddwd),
cpu-portable (int32 loops); on CUDA cuda-dp4a (dispatch/cuda_impls/int8_linalg.py).
"""
from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACTIVATION_CODES, FLOPS_PER_ELEMENT
from kernels_common.memory import aligned_empty
from kernels_cpu import int8_gemm as K
from kernels_cpu import target, team
from kernels_cpu.parallel import num_threads

from .. import validate as V
from ..quantized import QuantizedArray
from ..registry import Call, Implementation, Op, Rule, bucket, register, register_op
from ._common import deliver, kernel_input, result_buffer

_KERNELS = ("kernels_cpu.int8_gemm", "kernels_cpu.approx", "kernels_cpu.parallel")
MAX_K = K.MAX_K
F32 = np.dtype(np.float32)

EXAMPLE_SHAPES = {
    "matmul_int8": {"small": {"a_q": (2, 5, 24), "b_q": (24, 19), "bias": (19,)},
                    "large": {"a_q": (64, 256), "b_q": (256, 256), "bias": (256,)},
                    "decode": {"a_q": (1, 96), "b_q": (96, 200), "bias": (200,)}},
    "dynamic_quant_linear": {"small": {"x": (5, 24), "w_q": (19, 24), "bias": (19,)},
                             "large": {"x": (64, 256), "w_q": (256, 256), "bias": (256,)},
                             "decode": {"x": (3, 96), "w_q": (200, 96), "bias": (200,)}},
}


class Int8Key(NamedTuple):
    op: str
    device: str
    dtype: np.dtype      # the output dtype (float32)
    m: int               # bucket of the rows (batch x M)
    n: int               # bucket of N
    k: int               # bucket of K
    a_type: str          # "int8" / "uint8" (matmul_int8), "float32" (dynamic_quant_linear)
    act: int             # kernels_common.activation.ACT_*
    has_bias: bool
    prepacked: bool      # the weight already holds a packed layout (an earlier call made it)


class Int8Args(NamedTuple):
    a: object            # QuantizedArray (matmul_int8) or float32 x (dynamic_quant_linear)
    w: object            # QuantizedArray b (K, N) or w (N, K)
    bias: object
    out: object
    act: int
    transposed: bool     # w is (N, K) (dynamic_quant_linear)


# ---- validation -------------------------------------------------------------------------------

def _quantized(name, q, what):
    if not isinstance(q, QuantizedArray):
        kind = type(q).__name__ if not isinstance(q, np.ndarray) else f"a {q.dtype} numpy array"
        raise TypeError(f"{name} must be a QuantizedArray {what}, got {kind}: build one with "
                        f"QuantizedArray(values, scale, zero_point, axis) (or dispatch.quantize)")
    return q


def _check_k(k):
    if k > MAX_K:
        raise ValueError(f"K = {k} is too large for exact int32 accumulation: K * 255 * 128 must fit int32, "
                         f"so K <= {MAX_K}; split the product along K")


def _common(bias, out, activation, n, out_shape, dev, **inputs):
    if bias is not None:
        V.device_of(bias=bias)
        if V.dtype_of(bias) != F32:
            raise TypeError(f"bias must have dtype float32, got {V.dtype_of(bias)}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    V.choice("activation", activation, list(ACTIVATION_CODES))
    odev = V.device_of(bias=bias, out=out)
    if (bias is not None or out is not None) and odev != dev:
        raise ValueError(f"bias / out are {odev} arrays but the quantized inputs are on {dev}: "
                         "all inputs and out= must be on the same device")
    V.out(out, out_shape, F32, bias=bias, **inputs)
    return ACTIVATION_CODES[activation]


def _device(q):
    """q.device without the array-protocol probe for numpy values (the common case)."""
    return "cpu" if isinstance(q.values, np.ndarray) else q.device


def _packed_paths(w):
    """The K.PATH_* layouts of the weight w cached so far (sorted)."""
    return sorted(k[1] for k in w.cached_keys() if isinstance(k, tuple) and k and k[0] == "int8_gemm")


def _prepacked(w):
    return bool(_packed_paths(w))


def describe_matmul_int8(a_q, b_q, *, bias=None, activation=None, out_dtype=np.float32, out=None):
    """Validate a matmul_int8 call: Call.args = Int8Args, key Int8Key."""
    _quantized("a_q", a_q, "(..., M, K) of int8 or uint8")
    _quantized("b_q", b_q, "(K, N) of int8")
    if np.dtype(out_dtype) != F32:
        raise ValueError(f"out_dtype must be float32, got {np.dtype(out_dtype)}")
    if a_q.ndim < 2:
        raise ValueError(f"a_q must have at least 2 dimensions (..., M, K), got shape {a_q.shape}")
    if b_q.ndim != 2:
        raise ValueError(f"b_q must have 2 dimensions (K, N), got shape {b_q.shape}")
    if b_q.dtype != np.int8:
        raise TypeError(f"b_q must hold int8 values (the signed operand of the u8 x s8 product), got {b_q.dtype}")
    if a_q.axis is not None and a_q.axis != a_q.ndim - 2:
        if a_q.axis == a_q.ndim - 1:
            raise ValueError("a_q has a per-channel scale along K (axis -1): it cannot be factored out of the "
                             "sum over K; quantize a per tensor or per row (axis -2)")
        raise ValueError(f"a_q must be quantized per tensor or per row (axis {a_q.ndim - 2}), got axis {a_q.axis}")
    if b_q.axis == 0:
        raise ValueError("b_q has a per-channel scale along K (axis 0): it cannot be factored out of the sum "
                         "over K; quantize b per tensor or per column (axis 1)")
    dev = _device(a_q)
    if dev != _device(b_q):
        raise ValueError(f"a_q is a {dev} array but b_q is a {_device(b_q)} array: "
                         "all inputs must be on the same device")
    shape = a_q.shape
    m, k = shape[-2:]
    kb, n = b_q.shape
    if kb != k:
        raise ValueError(f"b_q must have K={k} rows to match a_q (..., {m}, {k}), got shape {b_q.shape}")
    _check_k(k)
    out_shape = shape[:-1] + (n,)
    code = _common(bias, out, activation, n, out_shape, dev, a=a_q.values, b=b_q.values)
    rows = math.prod(shape[:-1])
    done = _packed_paths(b_q)
    key = Int8Key("matmul_int8", dev, F32, bucket(rows), bucket(n), bucket(k), "int8" if a_q.dtype == np.int8 else "uint8", code,
                  bias is not None, bool(done))
    # the note made now, a constant (a remembered call's notes must be; dispatch/memo.py)
    return Call(key, Int8Args(a_q, b_q, bias, out, code, False), _prep_notes(b_q, "b_q", done))


def describe_dynamic_quant_linear(x, w_q, bias=None, *, activation=None, out=None):
    """Validate a dynamic_quant_linear call: Call.args = Int8Args, key Int8Key."""
    V.required(x=x)
    _quantized("w_q", w_q, "(N, K) of int8")
    dev = V.device_of(x=x)
    if V.dtype_of(x) != F32:
        raise TypeError(f"x must have dtype float32, got {V.dtype_of(x)}")
    V.rank("x", x, (1, 64), " (..., K)")
    if w_q.ndim != 2:
        raise ValueError(f"w_q must have 2 dimensions (N, K), got shape {w_q.shape}")
    if w_q.dtype != np.int8:
        raise TypeError(f"w_q must hold int8 values (the signed operand of the u8 x s8 product), got {w_q.dtype}")
    if w_q.axis == 1:
        raise ValueError("w_q has a per-channel scale along K (axis 1): it cannot be factored out of the sum "
                         "over K; quantize the weight per tensor or per output channel (axis 0)")
    if _device(w_q) != dev:
        raise ValueError(f"x is a {dev} array but w_q is a {_device(w_q)} array: all inputs must be on the same device")
    k = x.shape[-1]
    n, kw = w_q.shape
    if kw != k:
        raise ValueError(f"w_q must have K={k} columns to match x (..., {k}), got shape {w_q.shape}")
    _check_k(k)
    out_shape = tuple(x.shape[:-1]) + (n,)
    code = _common(bias, out, activation, n, out_shape, dev, x=x, w=w_q.values)
    rows = math.prod(x.shape[:-1])
    done = _packed_paths(w_q)
    key = Int8Key("dynamic_quant_linear", dev, F32, bucket(rows), bucket(n), bucket(k), "float32", code,
                  bias is not None, bool(done))
    # the note made now, a constant (a remembered call's notes must be; dispatch/memo.py)
    return Call(key, Int8Args(x, w_q, bias, out, code, True), _prep_notes(w_q, "w_q", done))


def _prep_notes(w, name, done=None):
    """Call.prep_notes of the int8 ops: one line, saying whether w is prepacked (made by
    describe, which dispatch.memo runs once per signature); done: _packed_paths(w) when the
    caller has it."""
    done = _packed_paths(w) if done is None else done
    if done:
        paths = ", ".join(K.PATH_NAMES[p] for p in done)
        return (f"{name} prepacked (cached on the QuantizedArray, packed once, reused): {paths}",)
    return (f"{name} is packed on this call and cached on the QuantizedArray: later calls reuse it",)


# ---- host preparation ------------------------------------------------------------------------------

class _PackedW(NamedTuple):
    bp: np.ndarray       # int32 words: micro-kernel panels (packed paths) / (K, N) int8 (portable)
    colsum: np.ndarray   # float64 (N,)
    sb: np.ndarray       # float64 (N,) column scales
    zb: np.ndarray       # float64 (N,) column zero points
    addrs: np.ndarray    # int64: the addresses of bp, sb, colsum, zb (K.rebind's weight)


def _column_params(w, n):
    sb = np.broadcast_to(w.scale.astype(np.float64), (n,)).copy()
    zb = np.broadcast_to(w.zero_point.astype(np.float64), (n,)).copy()
    return sb, zb


def _packed_weight(w, transposed, path):
    """The weight's layout for `path`, made once per QuantizedArray (thread-safe: q.cached)."""
    def make():
        vals = np.asarray(w.values)
        n = vals.shape[0] if transposed else vals.shape[1]
        sb, zb = _column_params(w, n)
        if path == K.PATH_PORTABLE:
            bp = np.ascontiguousarray(vals.T if transposed else vals)
            colsum = bp.astype(np.int64).sum(axis=0).astype(np.float64)
        else:
            bp, colsum = K.pack_b(vals, transposed, path)
        packed = (bp, colsum, sb, zb)
        for arr in packed:
            arr.flags.writeable = False
        # kept as the kernels' writeable-typed aliases (kernel_input): made once here, not
        # per call (about 2 us each, four per call)
        bp, colsum, sb, zb = (kernel_input(arr) for arr in packed)
        addrs = K.weight_addresses(bp, sb, colsum, zb) if path != K.PATH_PORTABLE else np.zeros(4, np.int64)
        return _PackedW(bp, colsum, sb, zb, addrs)

    return w.cached(("int8_gemm", path, transposed), make)


def _row_params(a, rows, m, sa, za):
    """sa, za (rows,) float64 filled with the per-row scale and zero point of a QuantizedArray
    a (per tensor, or per row: a batch's rows repeat a's m), and returned.  Filled on every
    call, not cached on a: an activation is a new QuantizedArray each decode step, and
    building cached arrays for it (np.full / np.tile, read-only aliases) cost 20 us of a
    46 us matmul_int8 1x768x768 (Zen 4, 2026-12-06)."""
    if a.axis is None:
        sa.fill(a.scale.item())
        za.fill(a.zero_point.item())
    else:
        sa.reshape(rows // m, m)[...] = a.scale
        za.reshape(rows // m, m)[...] = a.zero_point
    return sa, za


@functools.lru_cache(maxsize=64)
def _zeros(n):
    """The bias of a call without one: shared, so read-only (passed as a writeable-typed alias)."""
    z = np.zeros(n, np.float32)
    z.flags.writeable = False
    return kernel_input(z)


# Task blocking of the packed GEMM: whole row panels per task (up to 16: the A panels of a
# task stay in L2 while its B panels stream), the columns split in at least one part per
# thread and parts of at most TASK_COLS columns.  Each task row ends in an epilogue call,
# so wide tasks pay fewer of them: 8 tasks of 96 columns (TASKS_MIN = 8, the rule before)
# against 2 of 384, AMX path, 2 threads, medians of 21 x 20 calls of K.gemm alone in three
# processes (Sapphire Rapids-class Xeon, 2026-12-03), us: 32x768x768 30.3-33.3 -> 25.7-27.1,
# 128x768x768 77.3-86.0 -> 68.5-72.0, 512x768x768 264-311 -> 238-263; 128x768x3072 the
# same either way (253-279 / 252-288 with 2 tasks of 1536 columns).
TASK_COLS = 384
ROW_PANELS_MAX = 16
# On the VNNI (zmm) path the rows are split instead, when there is a row panel per thread:
# a task is a range of row panels across up to ROWS_TASK_COLS columns, so a thread reads
# only its rows of A (packed by the calling thread just before) and the whole weight,
# instead of all of A and part of the weight.  (Giving each thread the same column part on
# every call, as gemm.py's gemm_worker does, made no difference: 206.8 / 206.7 us.)  K.gemm
# with A packed first, 2 threads, medians / p25 of 15 x 100 calls (Zen 4, 2026-12-04), us,
# column parts -> row halves: 128x768x768 215.9 / 215.1 -> 201.4 / 200.5, 32x768x768 72.9
# / 64.7 -> 69.0 / 62.1, 512x768x768 836 / 789 -> 801 / 763 (quarters 779 / 755),
# 128x768x3072 847 / 803 -> 823 / 765, 128x3072x768 910 / 762 -> 785 / 745.  The AVX2 path
# on the same host was mixed (128x768x3072 1799 / 1753 -> 1963 / 1746, 512x768x768 2370 /
# 2182 -> 2856 / 2333) and the AMX one was measured only against column parts: both keep
# them.
ROWS_SPLIT_PATHS = (K.PATH_VNNI512,)
ROWS_TASK_COLS = 3072


def _blocks(mp, npn, nr, threads, path):
    """(row panels, column panels, tasks) per task for mp x npn panels of nr columns on
    the path (a K.PATH_*: the micro-kernel's)."""
    if path in ROWS_SPLIT_PATHS and mp >= threads > 1:
        mc = -(-mp // max(threads, -(-mp // ROW_PANELS_MAX)))
        nc = min(npn, max(1, ROWS_TASK_COLS // nr))
    else:
        mc = min(mp, ROW_PANELS_MAX)
        parts = max(threads, -(-npn * nr // TASK_COLS))
        nc = -(-npn // parts)
    return mc, nc, -(-mp // mc) * -(-npn // nc)


# One row (a decode step): the AMX implementation runs K.PATH_AMX_ROWS (vpdpbusd over the
# same packed weight) instead of 32-row AMX tiles that compute 31 wasted rows, and the VNNI
# one K.PATH_VNNI_ROWS instead of the 8-row tile (K.ROWS_OF), on the calling
# thread for a weight of at most ROWS_SERIAL_MAX values.  More rows would re-read the weight
# once per row (the row kernel has no row blocking).  Through dispatch, Sapphire Rapids, 2
# threads, timeit medians (2026-11-26), AMX tiles -> rows: matmul_int8 1x768x768 81 -> 48
# us, 1x768x3072 203 -> 115; dynamic_quant_linear 1x768x768 82 -> 41, 1x4096x4096 (on the
# workers) 738 -> 512 (onnxruntime 471 in the report).  Two rows: tiles 90 us, one row
# at a time would read the weight twice.  Calling thread / workers (matmul_int8, same
# setting): 768x768 43-44 / 52-54 us, 1024x1024 (2^20) 51-52 / 55-56, 768x3072 138-141 /
# 82-88, 2048x2048 228-240 / 142-143.  VNNI rows on Zen 5 (medians of 9, same order):
# 768x768 21.7 / 22.2, 1024x1024 27.9 / 24.5, 768x3072 43.3 / 33.0, 4096x4096 193.5 / 118.1.
ONE_ROW_PATH_MAX = 1
ROWS_SERIAL_MAX = 1 << 20
# Per CPU (target.cpu_name()) where the workers win from a smaller weight.  Zen 4, 2
# threads, calling thread / workers, medians of 9 x 3000 calls, two runs each (2026-12-06,
# /tmp/w/i8dec.py), us, matmul_int8 and dynamic_quant_linear: 1x256x256 17.7-17.8 /
# 19.6-19.7 and 15.9-16.2 / 17.6-17.8, 1x384x384 18.4-18.7 / 20.1-20.4 and 16.6-17.0 /
# 18.3-18.7, 1x512x512 (2^18) 21.1-21.4 / 20.5-21.0 and 19.1-19.8 / 18.9-20.6, 1x768x768
# 26.0-26.2 / 22.6-23.1 and 24.0-25.0 / 21.1-21.7, 1x1024x1024 34.5-35.4 / 28.0-30.5 and
# 32.7-34.1 / 26.1-27.9.
ROWS_SERIAL_MAX_BY_CPU = {"znver4": 1 << 18}


@functools.cache
def rows_serial_max() -> int:
    """The largest weight (K x N values) whose one-row product runs on the calling thread on
    this host: ROWS_SERIAL_MAX, or its CPU's entry of ROWS_SERIAL_MAX_BY_CPU."""
    return ROWS_SERIAL_MAX_BY_CPU.get(target.cpu_name(), ROWS_SERIAL_MAX)
# A is packed on the calling thread up to this many elements (rows x K), on the workers
# above: waking a sleeping worker for a few microseconds of packing cost more than it
# saved (the GEMM wakes the workers anyway).  Time with A packed on the calling thread /
# on the workers, matmul_int8 (int8 A: pack_int_rows) and dynamic_quant_linear (float32 A,
# quantized while packed: more work per element), 2 threads, AMX host (Sapphire
# Rapids-class Xeon), paired medians of 11 x 20 calls (2026-12-02): 32x64x32 0.51 / 0.50,
# 8x768x768 0.85 / 0.89, 32x768x768 0.89 / 0.90, 64x768x768 0.93 / 1.04, 64x1024x1024
# 1.02 / 1.08, 128x768x768 0.99 / 1.09, 32x4096x1024 0.91 / 1.03, 128x3072x768 0.99 /
# 1.23, 512x768x768 1.02 / 1.18.
PACK_INT_SERIAL_MAX = 1 << 17
PACK_QUANT_SERIAL_MAX = 1 << 15


# Packed A and its row vectors (c, rs, and sa for a float x) come from a per-thread cache
# for calls whose packed A is at most WORKSPACE_CACHE_BYTES: the calling thread owns them
# for the call's duration, and nothing of them reaches the result.  A decode step's
# allocations (a line-aligned A, its int32 view and three row vectors) took 3.4 us of a
# 36 us dynamic_quant_linear 1x768x768 (Zen 4, 2026-12-04).  Up to 1 MiB (a BERT layer's
# 128 rows of K = 768 or 3072 take 96 or 384 KiB) the cache pays at prefill sizes too: 64
# KiB -> 1 MiB, 128x768x768, a process each, alternating six times, medians of 15 x 40
# calls (Zen 4, 2 threads, 2026-12-05), us: matmul_int8 226.9-260.1 -> 222.0-245.4 (faster
# in 5 of 6 pairs), dynamic_quant_linear with bias 228.8-246.8 -> 222.9-241.6 (6 of 6).
# Larger calls allocate per call (their time is in the GEMM, and a cache would pin more).
WORKSPACE_CACHE_BYTES = 1 << 20
WORKSPACE_CACHE_ENTRIES = 8
_WORKSPACE = threading.local()


def _a_workspace(rows_padded, kpad, et, rows):
    """(packed A (rows_padded, kpad) of et on cache lines, its int32 words, c, rs, sa, za
    (rows,) float64): the packed paths' per-call scratch (see WORKSPACE_CACHE_BYTES)."""
    key = (rows_padded, kpad, et, rows)
    cache = getattr(_WORKSPACE, "bufs", None)
    if cache is None:
        cache = _WORKSPACE.bufs = {}
    got = cache.get(key)
    if got is None:
        abuf = aligned_empty((rows_padded, kpad), et)  # rows on cache lines: AMX tile / zmm rows
        got = (abuf, abuf.reshape(-1).view(np.int32), np.empty(rows), np.empty(rows), np.empty(rows), np.empty(rows))
        if abuf.nbytes <= WORKSPACE_CACHE_BYTES:
            if len(cache) >= WORKSPACE_CACHE_ENTRIES:
                cache.clear()
            cache[key] = got
    return got


_NOT_FINITE = "x must be finite: a row holding NaN or inf has no quantization scale"


def _require_finite_rows(sa):
    """ValueError unless every row of x got a finite quantization scale (the packers give a
    row holding NaN or inf the scale NaN)."""
    if not K.all_finite(sa):
        raise ValueError(_NOT_FINITE)


class _Plan(NamedTuple):
    """A packed-path call's shape-only decisions and argument blocks (see _plan)."""
    kpath: int           # the micro-kernel's path (K.ROWS_OF's for a row)
    threads: int
    ntasks: int
    fused: bool          # the GEMM's tasks pack their own rows of A
    pack_threads: int    # (not fused) threads packing A first
    ws: tuple            # _a_workspace's (abuf, awords, c, rs, sa, za)
    pa: np.ndarray       # the A packers' block (K.a_params)
    ga: np.ndarray       # the GEMM's block (K.gemm_block)
    zeros: np.ndarray    # the bias of a call without one (kept alive: ga may point at it)
    block: object        # K.plan_block for K.run_planned, or None (A packed on several threads first)


# A call's plan is kept per thread, keyed by everything it depends on, while its workspace
# is cached (WORKSPACE_CACHE_BYTES): a further call of those shapes rebinds only the source
# rows, the weight, the bias and the output in the two argument blocks (K.rebind), where
# building them took 5-6 us of Python (blocking, a_params, gemm's block: 1x768x768
# dynamic_quant_linear on the workers, Zen 4, 2026-12-06).  Tests that change the blocking
# constants call clear_plans().
PLAN_CACHE_ENTRIES = 32
_PLANS = threading.local()


def clear_plans():
    """Forget the calling thread's kept plans (after changing a blocking constant)."""
    _PLANS.plans = {}


def _plan(path, et, transposed, rows, kdim, n, code, has_out, src, pw, res2):
    """The calling thread's _Plan for a packed-path call of these shapes (made with this
    call's arrays, which the caller rebinds anyway)."""
    threads_now = num_threads()
    key = (path, transposed, rows, kdim, n, code, has_out, src.dtype, threads_now)
    plans = getattr(_PLANS, "plans", None)
    if plans is None:
        plans = _PLANS.plans = {}
    plan = plans.get(key)
    if plan is not None:
        return plan
    few = path in K.ROWS_OF and rows <= ONE_ROW_PATH_MAX
    kpath = K.ROWS_OF[path] if few else path  # the micro-kernel's path; the weight stays packed for `path`
    mr, nr, kg = K.TILES[kpath]
    kq = K.k_words(kdim, path)
    mp = -(-rows // mr)
    ws = _a_workspace(mp * mr, kq * kg, et, rows)
    abuf, awords, c, rs, sa, za = ws
    threads = 1 if few and kdim * n <= rows_serial_max() else threads_now
    npn = -(-n // nr)
    mc, nc, ntasks = _blocks(mp, npn, nr, threads, kpath)
    pa = K.a_params(src, abuf, c, rs, za=None if transposed else za, sa=sa if transposed else None)
    # the GEMM's tasks pack their own rows when each row panel is one task's (one column
    # block); not float32 rows into out=: a NaN row raises only after the GEMM
    fused = nc >= npn and not (transposed and has_out)
    pack_threads = 1 if rows * kdim <= (PACK_QUANT_SERIAL_MAX if transposed else PACK_INT_SERIAL_MAX) else threads
    zeros = _zeros(n)
    # the cached weight and row parameters are writeable-typed aliases already (made once),
    # so the argument-block helper compiles one specialization
    ga = K.gemm_block(kpath, code, awords, pw.bp, sa, c, rs, pw.sb, pw.colsum, pw.zb, zeros, res2, mc, nc, ntasks,
                      kq, pack=pa if fused else None)
    block = None
    if fused or pack_threads == 1:
        check = K.CHECK_NONE if not transposed else (K.CHECK_AFTER if fused else K.CHECK_BEFORE)
        block = K.plan_block(kpath, not fused, min(threads, ntasks), check)
    plan = _Plan(kpath, threads, ntasks, fused, pack_threads, ws, pa, ga, zeros, block)
    if abuf.nbytes <= WORKSPACE_CACHE_BYTES:
        if len(plans) >= PLAN_CACHE_ENTRIES:
            plans.clear()
        plans[key] = plan
    return plan


def _run_packed(path):
    et = np.int16 if path == K.PATH_AVX2 else np.uint8

    def run(params, a, w, bias, out, code, transposed):
        pw = _packed_weight(w, transposed, path)
        lead = tuple(a.shape[:-1])
        kdim = a.shape[-1]
        n = w.shape[0] if transposed else w.shape[1]
        rows = math.prod(lead)
        res = result_buffer(out, lead + (n,), F32)
        if res.size == 0:
            return deliver(res, out)
        if transposed:
            src = kernel_input(np.ascontiguousarray(a, dtype=F32).reshape(rows, kdim))
        else:
            src = kernel_input(np.asarray(a.values).reshape(rows, kdim))
        res2 = res.reshape(rows, n)
        plan = _plan(path, et, transposed, rows, kdim, n, code, out is not None, src, pw, res2)
        abuf, _, _, _, sa, za = plan.ws
        bias_v = plan.zeros if bias is None else kernel_input(bias)
        if plan.block is not None:
            sa0 = za0 = -1.0
            if not transposed:
                if a.axis is None:   # filled by run_planned
                    sa0, za0 = a.scale.item(), a.zero_point.item()
                else:
                    _row_params(a, rows, a.shape[-2], sa, za)
            rest = K.run_planned(plan.block, plan.pa, plan.ga, src, pw.addrs, bias_v, res2, sa0, za0, *team.entry())
            if rest < 0:
                raise ValueError(_NOT_FINITE)
            if rest > 0:
                K.run_gemm_rest(plan.block, plan.ga, rest)
                if plan.fused and transposed:
                    _require_finite_rows(sa)
            return deliver(res, out)
        if not transposed:
            _row_params(a, rows, a.shape[-2], sa, za)
        K.rebind(plan.pa, plan.ga, src, pw.addrs, bias_v, res2)
        if not plan.fused:
            K.run_pack_a(plan.pa, abuf, plan.pack_threads)
            if transposed:
                _require_finite_rows(sa)
        K.run_gemm(plan.kpath, plan.ga, plan.ntasks, plan.threads)
        if plan.fused and transposed:
            _require_finite_rows(sa)
        return deliver(res, out)

    return run


def _run_portable(params, a, w, bias, out, code, transposed):
    pw = _packed_weight(w, transposed, K.PATH_PORTABLE)
    kdim = a.shape[-1]
    rows = math.prod(a.shape[:-1])
    n = pw.bp.shape[1]
    out_shape = tuple(a.shape[:-1]) + (n,)
    res = result_buffer(out, out_shape, F32)
    if res.size == 0:
        return deliver(res, out)
    if transposed:
        x2 = kernel_input(np.ascontiguousarray(a).reshape(rows, kdim))
        q = np.empty((rows, kdim), np.uint8)
        sa = np.empty(rows)
        zp = np.empty(rows)
        K.quant_rows(x2, q, sa, zp)
        if not np.all(np.isfinite(sa)):
            raise ValueError(_NOT_FINITE)
        a2, shift, za = q, 0, zp
    else:
        a2 = kernel_input(np.asarray(a.values).reshape(rows, kdim))
        shift = 128 if a.dtype == np.int8 else 0
        sa, za = _row_params(a, rows, a.shape[-2], np.empty(rows), np.empty(rows))
    c = shift + za
    rs = a2.astype(np.int64).sum(axis=1).astype(np.float64) + kdim * (shift - c)
    bias_v = _zeros(n) if bias is None else kernel_input(bias)
    ntasks = rows * -(-n // K.PORTABLE_NB)
    K.run_portable(a2, shift, pw.bp, rows, n, kdim, sa, c, rs, pw.sb, pw.colsum, pw.zb, bias_v, code,
                    res.reshape(rows, n), ntasks)
    return deliver(res, out)


# ---- work model ------------------------------------------------------------------------------

def _dims(call):
    a, w = call.args.a, call.args.w
    rows = math.prod(a.shape[:-1])
    n = w.shape[0] if call.args.transposed else w.shape[1]
    return rows, n, a.shape[-1]


def _flops(call):
    """2 integer ops per multiply-add, plus the epilogue (dequantize, bias, activation) per
    output; dynamic_quant_linear adds ~5 per x element (range, divide, round, clamp)."""
    rows, n, k = _dims(call)
    per_out = 2 * k + 4 + (call.args.bias is not None) + FLOPS_PER_ELEMENT[call.args.act]
    extra = 5 * rows * k if call.args.transposed else 0
    return rows * n * per_out + extra


def _bytes(call):
    """a (1 byte, or 4 for float32 x) and the int8 weight read once, float32 result written."""
    rows, n, k = _dims(call)
    a_bytes = rows * k * (4 if call.args.transposed else 1)
    return a_bytes + n * k + 4 * rows * n + (4 * n if call.args.bias is not None else 0)


# ---- selection -------------------------------------------------------------------------------

_HOST = K.host_paths()
_IMPL_PATH = {"cpu-amx": K.PATH_AMX, "cpu-vnni512": K.PATH_VNNI512, "cpu-avx2": K.PATH_AVX2,
              "cpu-portable": K.PATH_PORTABLE}
_WIDEST_FIRST = ("cpu-amx", "cpu-vnni512", "cpu-avx2")


def _order(key):
    """The widest integer dot product the host has: AMX tiles, then AVX-512 VNNI, then AVX2,
    then loops."""
    names = [n for n in _WIDEST_FIRST if _HOST[_IMPL_PATH[n]] is None] + ["cpu-portable"]
    rest = [n for n in _WIDEST_FIRST if n not in names]
    first = names[0]
    why = {"cpu-amx": "host has AMX-INT8 (permission granted): tdpbusd, 16 x 16 x 64 u8 x s8 products per instruction",
           "cpu-vnni512": "host has AVX-512 VNNI (no usable AMX): vpdpbusd, 64 u8 x s8 products per instruction",
           "cpu-avx2": "host has AVX2 but no AVX-512 VNNI: exact int16 vpmaddwd, 16 products per instruction",
           "cpu-portable": "host has neither AVX-512 VNNI nor AVX2: plain int32 loops"}[first]
    return tuple(names + rest), why


_RULE = Rule(("cpu-amx", "cpu-vnni512", "cpu-avx2", "cpu-portable"), _order)


def _supports(path):
    def supports(key):
        why = _HOST[path]
        return [] if why is None else [why]
    return supports


def _int_values(rng, shape, lo, hi, dtype):
    return rng.integers(lo, hi + 1, size=shape, dtype=dtype)


def _synthesize(shapes, params, rng, dtype):
    """Benchmark / example inputs as an exported quantized model has them: a_q uint8 per
    tensor with a zero point (onnxruntime's u8s8 MatMulInteger takes a scalar a zero point),
    b_q / w_q full-range int8 per output column, symmetric; bias and x standard normal
    float32 (the ops are float32 whatever `dtype` asks)."""
    out = {}
    for name, s in shapes.items():
        if name == "a_q":
            vals = _int_values(rng, s, 0, 255, np.uint8)
            scale = np.float32(0.02 * (1.0 + abs(float(np.asarray(rng.standard_normal(1))[0]))))
            out[name] = QuantizedArray(vals, scale, np.uint8(120 + int(np.asarray(rng.integers(0, 16, size=1))[0])))
        elif name in ("b_q", "w_q"):
            axis = 1 if name == "b_q" else 0
            vals = _int_values(rng, s, -128, 127, np.int8)
            scale = (0.02 / math.sqrt(s[1 - axis]) * (1.0 + np.abs(rng.standard_normal(s[axis])))).astype(np.float32)
            out[name] = QuantizedArray(vals, scale, None, axis=axis)
        else:
            out[name] = np.asarray(rng.standard_normal(s)).astype(np.float32)
    return out


def _sig_matmul(i):
    return (i["a_q"], i["b_q"]), {"bias": i.get("bias"), "activation": i.get("activation")}


def _sig_dql(i):
    return (i["x"], i["w_q"], i.get("bias")), {"activation": i.get("activation")}


def _variants(bias_at):
    def variant(activation, with_bias):
        def make(args, kwargs):
            args, kwargs = list(args), dict(kwargs, activation=activation)
            n = args[1].shape[0] if bias_at[0] == "args" else args[1].shape[-1]
            bias = np.zeros(n, np.float32) if with_bias else None
            if bias_at[0] == "args":
                args[bias_at[1]] = bias
            else:
                kwargs[bias_at[1]] = bias
            return tuple(args), kwargs
        return make

    out = {"no epilogue": variant(None, False), "bias": variant(None, True)}
    out.update({act: variant(act, True) for act in ACTIVATION_CODES if act is not None})
    return out


_NOTES = {
    "cpu-amx": ("AMX-INT8: tdpbusd on 2 x 2 tiles of 16 x 16 int32 (a 32 x 32 block per 64-byte K chunk); A rows read "
                "in place as tiles (int8 a + 128 / uint8 a, or x quantized per row straight into them), weight packed "
                "once per QuantizedArray into 32-column panels of 4-byte groups with its column sums; workers take "
                "row x column blocks from a counter; zero-point corrections, scales, bias and activation "
                "fused per tile; a one-row call (decode) runs vpdpbusd over the same panels instead"),
    "cpu-vnni512": ("AVX-512 VNNI: vpdpbusd (u8 x s8 -> s32) 8x48 register tile on zmm; A rows read in place "
                    "(int8 a + 128 / uint8 a, or x quantized per row straight into them), weight packed once per "
                    "QuantizedArray into 48-column panels of 4-byte groups with its column sums; workers take "
                    "row x column blocks from a counter, each packing the A rows it multiplies when no other "
                    "block shares them (else A is packed first); zero-point corrections, scales, bias and "
                    "activation fused per tile; a one-row call (decode) runs a one-row tile over the same panels"),
    "cpu-avx2": ("AVX2: vpmaddwd on int16 operands (exact; vpmaddubsw's int16 saturation avoided), 6x16 tile on "
                 "ymm; weight packed once per QuantizedArray as int16 pairs; same fused epilogue"),
    "cpu-portable": "plain int32 numba loops over the unpacked weight (any host); same fused epilogue",
}


def _register(name, describe, signature, bias_at, memo):
    op = register_op(Op(name, describe, memo=memo, family="int8_linalg", bound="compute", signature=signature,
                        flops=_flops, bytes=_bytes, rules={"cpu": _RULE}, synthesize=_synthesize,
                        variants=_variants(bias_at)))
    for impl, path in _IMPL_PATH.items():
        run = _run_portable if path == K.PATH_PORTABLE else _run_packed(path)
        register(Implementation(name, impl, "cpu", run, dtypes=(F32,), supports=_supports(path),
                                notes=_NOTES[impl], kernel_modules=_KERNELS, host=lambda path=path: _HOST[path]))
    return op


# Both describes are remembered (dispatch/memo.py; a QuantizedArray's part of the signature
# is structural -- shape, dtype, axis, cached layouts -- so matmul_int8's a_q, a new
# QuantizedArray on every decode step, finds the same entry).  1x768x768 (decode), 2
# threads, medians of 9-11 x 2000 calls, old / new processes alternating (Zen 4):
# dynamic_quant_linear 27.3-27.8 -> 23.3-25.9 us (2026-12-05; 128x768x768: the same);
# matmul_int8 with a new a_q per call 27.5-28.1 -> 26.0-27.1, quantize + matmul_int8
# 56.8-57.3 -> 54.1-55.1 (three pairs, 2026-12-06).
_matmul_int8 = _register("matmul_int8", describe_matmul_int8, _sig_matmul, ("kwargs", "bias"), memo=True)
_dql = _register("dynamic_quant_linear", describe_dynamic_quant_linear, _sig_dql, ("args", 2), memo=True)


@_matmul_int8.expose
def matmul_int8(a_q, b_q, *, bias=None, activation=None, out_dtype=np.float32, out=None):
    """act(dequantize(a_q) @ dequantize(b_q) + bias) with int32 accumulation.

    a_q: QuantizedArray (..., M, K) int8 or uint8, per tensor or per row (axis -2);
    b_q: QuantizedArray (K, N) int8, per tensor or per column (axis 1); bias (N,) float32
    or None; activation None / "relu" / "gelu" / "gelu_tanh" / "silu" (fused).  Returns
    (..., M, N) float32 (out_dtype must be float32), written into out= when given.  Exact
    up to the final rounding to float32 for K <= 65793 (larger K: ValueError)."""
    return _matmul_int8(a_q, b_q, bias=bias, activation=activation, out_dtype=out_dtype, out=out)


@_dql.expose
def dynamic_quant_linear(x, w_q, bias=None, *, activation=None, out=None):
    """act(x @ dequantize(w_q).T + bias) with x quantized per row to uint8 on the fly
    (ONNX DynamicQuantizeLinear's formulas per row) and an int8 GEMM.

    x: float32 (..., K), finite; w_q: QuantizedArray (N, K) int8 (PyTorch Linear layout),
    per tensor or per output channel (axis 0); bias (N,) float32 or None.  Returns (..., N)
    float32, written into out= when given.  The result is exactly (up to the final
    float32 rounding) the float64 product of the dequantized quantized x and w_q."""
    return _dql(x, w_q, bias, activation=activation, out=out)
