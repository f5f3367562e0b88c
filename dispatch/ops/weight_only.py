"""Weight-only low precision for `linear` (issue #12): the weight is stored in 16 or 8 bits,
x and the accumulation stay float32.

    linear(x, weight, bias=None, *, activation=None, out=None)
        weight (N, K) given as one of
          numpy float16                       (format "float16")
          ml_dtypes.bfloat16                  (format "bfloat16"; plain uint16 bits are
                                               refused: pass bits.view(ml_dtypes.bfloat16))
          QuantizedArray of int8 values, per-channel along axis 0 (one scale / zero point per
                                               output row) or per-tensor (format "int8
                                               per-channel": a per-tensor scale is the same
                                               scale for every row)
        x (..., K) float32 (CPU; float32 or float16 on CUDA), bias (N,) of x's dtype.
        Result: act(x @ dequant(weight).T + bias), (..., N) in x's dtype, where dequant is
        the exact float32 value of each weight (int8: (q - zero_point) * scale).
    float64 x with a low-precision weight is refused (TypeError): the kernels accumulate in
    float32, and a float64 call would silently lose the precision the caller asked for;
    cast x to float32.

The conversion happens inside the kernels, in registers: no float32 copy of the whole
weight is made (the GEMM path for many rows widens one block of rows at a time into a
per-call buffer).  The weight is read in place when it is C-contiguous; a non-contiguous
weight is copied to C order in its own storage type (a QuantizedArray's values once per
object, cached on it).

This module registers implementations of the existing op "linear" (dispatch/ops/linalg.py
builds the key: GemmKey.weight_format, a kernels_common.quant.WEIGHT_* code; the dense
implementations refuse a low-precision key and these refuse a dense one):
  cpu-wo-gemv   kernels_cpu.weight_only.run_gemv: dot products over weight rows widened in
                registers, each weight byte read once for up to 4 rows of x (decode);
  cpu-wo-gemm   the dense GEMM (dispatch/ops/linalg's cpu-gemm machinery) whose tasks widen
                their own panels of the weight: 16-bit patterns, or int8 values dequantized
                with the per-row scale and zero point (linalg.widening_gemm_launch);
  cpu-wo-amx    a bfloat16 weight on AMX hosts: x split into three bfloat16 parts that add up
                to it exactly, one AMX-BF16 product of the 3M rows, the parts' sums added
                (as exact as the float32 GEMM; _run_wo_amx);
  cuda-wo-gemv  (dispatch/cuda_impls/weight_only.py) warp-per-row GEMV.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from kernels_common.activation import ACT_NONE
from kernels_common.quant import WEIGHT_BF16, WEIGHT_DENSE, WEIGHT_F16, WEIGHT_FORMAT_NAMES, WEIGHT_INT8
from kernels_cpu import half as KH
from kernels_cpu import bf16_gemm as KB
from kernels_cpu import weight_only as KW

from .. import validate as V
from ..validate import BF16, is_bfloat16
from ..quantized import QuantizedArray
from ..registry import Call, Implementation, register
from . import _arena
from . import linalg as L
from ._common import deliver, half_bits, kernel_input, result_buffer, supports_of, thread_buffer

_KERNELS = ("kernels_cpu.weight_only", "kernels_cpu.gemm", "kernels_cpu.approx", "kernels_cpu.parallel")
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)


def weight_format(x_dtype, weight) -> int:
    """The WEIGHT_* format of linear's weight for an x of x_dtype: WEIGHT_DENSE for a weight
    of x's float dtype (the dense path validates it), else the low-precision format; a
    weight that is neither is a TypeError saying how to pass it."""
    if isinstance(weight, QuantizedArray):
        if weight.dtype != np.int8:
            raise TypeError(f"weight: a QuantizedArray weight must hold int8 values, got {weight.dtype} "
                            "(quantize to symmetric int8, kernels_common.quant)")
        return WEIGHT_INT8
    dt = getattr(weight, "dtype", None)
    if dt is None:
        return WEIGHT_DENSE
    if is_bfloat16(dt):
        return WEIGHT_BF16
    try:
        dt = V.dtype_of(weight)
    except Exception:  # noqa: BLE001 - not an array: the dense path's validation names it
        return WEIGHT_DENSE
    if dt == _F16 and (np.dtype(x_dtype) != _F16 or type(weight) is np.ndarray):
        return WEIGHT_F16   # (float16 x and weight: CUDA's dense float16 GEMM; on the CPU widened x, below)
    if dt == np.uint16:
        raise TypeError("weight has dtype uint16: bfloat16 weights are passed as ml_dtypes.bfloat16 arrays "
                        "(bits.view(ml_dtypes.bfloat16) for their 16-bit patterns), float16 ones as float16")
    if dt in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise TypeError(f"weight has dtype {dt}: an integer weight needs its scale, pass it as a "
                        "dispatch.QuantizedArray(values, scale, zero_point, axis=0) (per output row) or axis=None")
    return WEIGHT_DENSE


def _same_half(xdt, fmt) -> bool:
    """x is bfloat16 with a bfloat16 weight, or float16 with a float16 one (PyTorch's 16-bit
    linear): the CPU widens x to float32 and rounds the float32 result back (_prepare)."""
    return (fmt == WEIGHT_BF16 and is_bfloat16(xdt)) or (fmt == WEIGHT_F16 and xdt == _F16)


def describe_low_precision(x, weight, bias=None, *, activation=None, out=None):
    """linear's describe for a low-precision weight (None when the weight is dense: the
    caller goes on with the dense description).  Key: linalg.GemmKey with weight_format;
    args: linalg.GemmArgs with b = the weight as given (array or QuantizedArray; a
    PackedWeight's 16-bit source, its float32 panels as packed)."""
    V.required(x=x, weight=weight)
    packed = None
    if isinstance(weight, L.PackedWeight):   # a 16-bit weight's (prepack): its source, its panels
        weight, packed = L._unpack("weight", weight, "linear")
    fmt = weight_format(V.dtype_of(x), weight)
    if fmt == WEIGHT_DENSE:
        return None
    values = weight.values if isinstance(weight, QuantizedArray) else weight
    dev = V.device_of(x=x, weight=values, bias=bias, out=out)
    xdt = V.dtype_of(x)
    allowed = (_F32,) if dev == "cpu" else (_F32, _F16)
    if xdt not in allowed and not (dev == "cpu" and _same_half(xdt, fmt)):
        names = " or ".join(d.name for d in allowed)
        also = " (bfloat16 / float16 too with a weight of that dtype)" if dev == "cpu" else ""
        raise TypeError(f"x must be {names}{also} with a {WEIGHT_FORMAT_NAMES[fmt]} weight (the kernels accumulate "
                        f"in float32), got {xdt}" + ("; cast x to float32" if xdt == np.float64 else ""))
    if bias is not None:
        V.same_dtype("bias", bias, "x", xdt)
    V.choice("activation", activation, list(L.ACTIVATION_CODES))
    code = L.ACTIVATION_CODES[activation]
    V.rank("x", x, (1, 64), " (..., K)")
    V.rank("weight", values, 2, " (N, K)")
    if isinstance(weight, QuantizedArray) and weight.axis not in (None, 0):
        raise ValueError(f"weight: a QuantizedArray linear weight (N, K) is quantized per output row (axis=0) "
                         f"or per tensor (axis=None), got axis={weight.axis}")
    k = x.shape[-1]
    n, kw = values.shape
    if kw != k:
        raise ValueError(f"weight must have K={k} columns to match x (..., {k}), got shape {tuple(values.shape)}")
    L._check_bias(bias, n, f"weight ({n}, {k})")
    out_shape = tuple(x.shape[:-1]) + (n,)
    V.out(out, out_shape, xdt, x=x, weight=values, bias=bias)
    m = math.prod(x.shape[:-1])
    key = L.gemm_key("linear", dev, xdt, 1, m, n, k, code, bias, packed, weight_format=fmt)
    return Call(key, L.GemmArgs(x, weight, bias, out, code, True, packed))


def refuse_dense(key) -> list:
    """supports() of the weight-only implementations: they take low-precision weights only."""
    if getattr(key, "weight_format", WEIGHT_DENSE) == WEIGHT_DENSE:
        return ["weight is dense (float32/float64): the weight-only kernels read float16, bfloat16 or int8 "
                "QuantizedArray weights"]
    return []


# ---- host preparation ----------------------------------------------------------------------

def _scales(q: QuantizedArray, n: int):
    """(scale, zero point) as float32 (N,) vectors, made once per QuantizedArray."""
    def make():
        sc = np.ascontiguousarray(np.broadcast_to(q.scale, (n,)), np.float32)
        zp = np.ascontiguousarray(np.broadcast_to(q.zero_point, (n,)), np.float32)
        sc.flags.writeable = zp.flags.writeable = False
        return sc, zp
    return q.cached(("wo-scales", n), make)


_UNIT = {}
_UNIT_LOCK = threading.Lock()


def _unit(n):
    """Unused scale / zero point vectors of the float formats (one read-only pair per N)."""
    hit = _UNIT.get(n)
    if hit is None:
        with _UNIT_LOCK:
            hit = _UNIT.setdefault(n, (np.ones(n, np.float32), np.zeros(n, np.float32)))
            for a in hit:
                a.flags.writeable = False
    return hit


def host_weight(weight):
    """(w2, fmt, scale, zp): the weight as a C-contiguous (N, K) uint16 (float16 / bfloat16
    bits) or int8 array for the kernels, its format and the float32 (N,) scale / zero point
    vectors (ones / zeros for the float formats), all typed writeable (kernel_input)."""
    if isinstance(weight, QuantizedArray):
        w2 = weight.cached("cpu-contiguous", lambda: np.ascontiguousarray(weight.values))
        sc, zp = _scales(weight, w2.shape[0])
        return kernel_input(w2), WEIGHT_INT8, kernel_input(sc), kernel_input(zp)
    fmt = WEIGHT_BF16 if is_bfloat16(weight.dtype) else WEIGHT_F16
    w2 = kernel_input(np.ascontiguousarray(weight).view(np.uint16))
    sc, zp = _unit(w2.shape[0])
    return w2, fmt, kernel_input(sc), kernel_input(zp)


def _prepare(x, weight, bias, out):
    """The kernels' float32 arguments.  bfloat16 / float16 x (with a weight of its dtype) is
    widened to float32 (exact) and the result made in float32, for _finish to round into x's
    dtype."""
    k = x.shape[-1]
    m = math.prod(x.shape[:-1])
    w2, fmt, sc, zp = host_weight(weight)
    n = w2.shape[0]
    shape = tuple(x.shape[:-1]) + (n,)
    if x.dtype.itemsize == 2:   # bfloat16 / float16 (_same_half)
        x2 = np.empty((m, k), _F32)
        KH.widen_into(kernel_input(half_bits(np.ascontiguousarray(x).reshape(-1))), x2.reshape(-1))
        res = np.empty(shape, _F32)
        bias_v = L._zeros(n, _F32) if bias is None else np.asarray(bias, _F32)
    else:
        x2 = kernel_input(np.ascontiguousarray(x).reshape(m, k))
        res = result_buffer(out, shape, _F32)
        bias_v = L._zeros(n, _F32) if bias is None else kernel_input(bias)
    return x2, w2, fmt, sc, zp, bias_v, res, m, n, k


def _prepare_product(x, weight, bias, out, code):
    """(result, None) for a call with nothing to multiply (an empty result; K = 0: act(bias),
    an empty sum), else (None, _prepare's arguments)."""
    args = _prepare(x, weight, bias, out)
    res, m, n, k = args[6:]
    if res.size and k == 0:
        L._degenerate(res.reshape(1, m, n), args[5], code)
    if not res.size or k == 0:
        return _finish(res, x, out), None
    return None, args


def _finish(res, x, out):
    """The public result of a weight-only call: res, or for bfloat16 / float16 x, res
    (float32) rounded to x's dtype (nearest even)."""
    if x.dtype.itemsize != 2:
        return deliver(res, out)
    final = result_buffer(out, res.shape, x.dtype)
    KH.round_into(res.reshape(-1), half_bits(final.reshape(-1)))
    return deliver(final, out)


def _run_gemv(params, x, weight, bias, out, code, b_is_nk, packed=None):
    x2, w2, fmt, sc, zp, bias_v, res, m, n, k = _prepare(x, weight, bias, out)
    if res.size:
        out2 = res.reshape(m, n)
        if k == 0:
            L._degenerate(out2.reshape(1, m, n), bias_v, code)
        else:
            KW.run_gemv(x2, w2, fmt, sc, zp, bias_v, code, KW.active_lanes() == 16, out2)
    return _finish(res, x, out)


_WORKSPACE = threading.local()


def _run_gemm(params, x, weight, bias, out, code, b_is_nk, packed=None):
    """One GEMM whose tasks widen their own B panels from the weight's rows right before
    reading them (linalg.widening_gemm_launch): a 16-bit weight's patterns (pack_b16), an
    int8 weight's values dequantized with its per-row scale and zero point (pack_bq8).
    16-bit, against the int8 weight's former path (blocks of rows widened into a buffer,
    one GEMM each), 2 threads, medians of 5 rounds alternating in one process, bits the same
    (Xeon with AMX, 2026-12-07), ms, + bias + gelu: float16 x and weight 128x768x3072 3.20 ->
    2.49, 128x3072x768 3.00 -> 2.26; float32 x: float16 weight 128x768x3072 2.93 -> 2.32,
    512x768x768 2.29 -> 2.05, 300x100x1000 0.504 -> 0.322; bfloat16 weight 128x4096x4096
    19.7 -> 15.6, 128x4096x11008 53.9 -> 41.6.  int8 per-channel weight, the same way
    (medians of 3 alternating rounds, same host and day, /tmp/w/q8.py): 128x768x3072 2.59 ->
    2.26, 128x3072x768 2.47 -> 2.05, 512x768x768 2.15 -> 2.03, 128x4096x4096 17.3 -> 15.3,
    128x4096x11008 49.1 -> 40.7, 64x768x768 0.435 -> 0.319, 300x100x1000 0.474 -> 0.326, bits
    the same."""
    done, args = _prepare_product(x, weight, bias, out, code)
    if args is None:
        return done
    x2, w2, fmt, sc, zp, bias_v, res, m, n, k = args
    if packed is not None:   # prepack's float32 panels of the widened weight: the dense GEMM on them
        # (the source's 16-bit patterns only give the plan its shape: the kernel reads the panels)
        L._run_gemm(params, x2, w2.view(np.uint16), bias_v if bias is not None else None, res.reshape(m, n), code,
                    True, packed)
        return _finish(res, x, out)
    epilogue = bias is not None or code != ACT_NONE
    if fmt == WEIGHT_INT8:
        b3, extra = w2.reshape(1, n, k), (sc.ctypes.data, zp.ctypes.data)   # pack_bq8's two extra slots
    else:
        b3, extra = w2.view(np.uint16).reshape(1, n, k), ()
    L.widening_gemm_launch(x2.reshape(1, m, k), b3, L._ZERO_IDX, L._ZERO_IDX, False, True, fmt, bias_v, epilogue, code,
                           res.reshape(1, m, n), extra)
    return _finish(res, x, out)


_BF16_KERNELS = ("kernels_cpu.bf16_gemm", "kernels_cpu.half", "kernels_cpu.gemm", "kernels_cpu.approx",
                 "kernels_cpu.parallel")


def _x_panels(m, k, use_amx=False, count=1):
    """The calling thread's uint32 buffer for x's packed form (KB.panels_shape; count x
    matrices on the AMX path), on a cache line (the AMX tiles' rows), kept up to linalg's
    WORKSPACE_KEEP bytes."""
    shape = KB.panels_shape(m, k, use_amx, count)
    return thread_buffer(_WORKSPACE, "xp", math.prod(shape), np.uint32, L.WORKSPACE_KEEP // 4).reshape(shape)


def _run_bf16_dot(params, x, weight, bias, out, code, b_is_nk, packed=None, use_amx=False):
    """bfloat16 x (..., K) times a bfloat16 weight (N, K) by kernels_cpu.bf16_gemm (vdpbf16ps,
    or AMX tiles when use_amx), the result in bfloat16."""
    k = x.shape[-1]
    m = math.prod(x.shape[:-1])
    w2 = kernel_input(np.ascontiguousarray(weight).view(np.uint16))
    n = w2.shape[0]
    res = result_buffer(out, tuple(x.shape[:-1]) + (n,), x.dtype)
    if res.size:
        x2 = kernel_input(np.ascontiguousarray(x).reshape(m, k).view(np.uint16))
        bias_v = L._zeros(n, _F32) if bias is None else np.asarray(bias, _F32)
        KB.run(x2, w2, bias_v, code, res.reshape(m, n).view(np.uint16), _x_panels(m, k, use_amx), bias is not None,
               use_amx)
    return deliver(res, out)


def _run_bf16_amx(params, x, weight, bias, out, code, b_is_nk, packed=None):
    return _run_bf16_dot(params, x, weight, bias, out, code, b_is_nk, packed, use_amx=True)


def _run_wo_amx(params, x, weight, bias, out, code, b_is_nk, packed=None):
    """float32 x (..., K) times a bfloat16 weight (N, K) on AMX tiles, as exact as the
    float32 GEMM: x split into three bfloat16 parts that add up to it exactly
    (KB.split3_into: hi, mid, lo), the parts stacked as 3M rows of one bfloat16 product
    (KB.run_amx, the weight packed once for all of them, float32 sums out), the three
    row blocks added smallest first (KB.sum3_into), then bias + activation (the float32
    GEMM's epilogue).  Each product of a part and a weight value is exact in float32 and
    the sums are float32, as in the float32 GEMM; only the order of the additions differs."""
    done, args = _prepare_product(x, weight, bias, out, code)
    if args is None:
        return done
    x2, w2, fmt, sc, zp, bias_v, res, m, n, k = args
    out2 = res.reshape(m, n)
    parts = _arena.empty((1, 3 * m, k), np.uint16)
    KB.split3_into(x2.reshape(-1), parts.reshape(-1))
    sums = _arena.empty((1, 3 * m, n), _F32)
    KB.run_amx(parts, w2.view(np.uint16)[None], False, bias_v, ACT_NONE, sums, _x_panels(3 * m, k, True), False)
    KB.sum3_into(sums.reshape(-1), out2.reshape(-1))
    if bias is not None or code != ACT_NONE:
        L.K.epilogue(out2, bias_v, code, L.num_threads())
    return _finish(res, x, out)


# ---- selection -----------------------------------------------------------------------------

# Rows of x below which the GEMV path wins, by the host's float32 lanes (KW.host_lanes()):
# the GEMV reads each weight byte from memory once for up to 4 rows (16 lanes; 2 with 8)
# and again from L1/L2 for each further group of rows; the GEMM path widens the weight into
# the GEMM's packed panels (then in blocks, one GEMM each; since 2026-12-07 in its tasks).
# bfloat16 weight 11008 x 4096, both forced, interleaved medians of 5 rounds (gemv / gemm),
# Zen 4 (AVX-512), 2 threads, 2026-12-05, after the GEMM path stopped packing its widened
# rows a second time:
#   16 lanes: M 16 7.3 / 20.4 ms, 32 14.1 / 27.4, 64 29.7 / 44.4, 128 64.5-64.7 / 72.6-78.4,
#             256 125.8 / 136.3, 512 251.7 / 241.3;
#   8 lanes (the AVX2 GEMV, forced on the same host beside the 16-lane GEMM; Zen 3's FMA
#             rate per cycle is Zen 4's): M 64 44.1 / 42.0, 128 96.7 / 72.1, 256 190.3 / 133.9.
# (2026-11-25, Xeon, before the GEMV's later changes: 16 lanes M 128 337.1 / 250.0.)
# Where the 512-bit FMAs run at full width (Intel; Zen 4 splits them in two 256-bit halves)
# the GEMM path wins from 128 rows: same weight and method, Xeon with AVX-512 / AMX
# (LLVM "rocketlake"), 2026-12-07, /tmp/w/wo3.py, ms: M 16 10.7 / 27.0, 32 20.1 / 33.1,
# 64 40.5 / 43.4, 96 49.4 / 52.5, 128 88.9 / 61.4, 256 189 / 96; float16 x and weight,
# 128x768x3072 + bias + gelu: 4.48 / 4.33.
# Since the GEMM path's tasks widen their own panels (pack_b16), from 64 rows: the same
# host, float16 weight 11008 x 4096, float32 x, medians of 5 x 3 calls alternating
# (2026-12-07, /tmp/w/wo3.py), ms: M 8 4.8 / 9.8, 16 8.8 / 12.1, 24 10.9 / 14.5, 32 17.3 /
# 16.7, 64 33.3 / 25.2; bfloat16 weight M 32 18.8 / 17.0, 48 22.8 / 21.3, 64 36.4 / 25.4,
# 96 58.7 / 34.6, 128 86.0 / 43.2 (on AMX hosts cpu-wo-amx runs those).  The 8-lane 64 was
# measured before that change.  Zen 4 again after it (2 threads, 2026-12-08, /tmp/w/wo3.py,
# medians of 5 x 3 calls alternating, ms): bfloat16 weight 11008 x 4096, M 32 20.4 / 28.8,
# 64 43.1 / 43.3, 96 65.1 / 59.0, 128 83.3 / 71.2, 192 123.7 / 96.7; float16 M 64 39.6 /
# 41.3, 128 83.2 / 71.7; float16 768 x 3072 + bias + gelu (x float32, medians of 5 x 10
# calls, us): M 16 795 / 1247, 32 1274 / 2045, 64 2826 / 3202, 128 5737 / 4868, 256 10544 /
# 8357, 512 18955 / 14286 -- the same 64 as elsewhere (it had been 512 on Zen 4 before).
WO_GEMV_ROWS = {16: 64, 8: 64}
# The CPUs (kernels_cpu.target.cpu_name()) measured otherwise (none now: Zen 4, above, agrees)
WO_GEMV_ROWS_BY_CPU = {}


# With a PackedWeight (prepack of a 16-bit weight: float32 panels of its widened values) the
# GEMM widens nothing, but its panels are twice the 16-bit weight's bytes: rows of x below
# which the GEMV on the 16-bit source wins.  float16 weight, float32 x, forced, medians of 5
# rounds alternating (Zen 4, 2 threads, 2026-12-08, /tmp/w/lpt.py), ms, gemv / gemm
# unpacked / gemm prepacked: 3072 x 768 (panels 9.4 MB, in L3) M 8 0.357 / 0.777 / 0.270, 16
# 0.640 / 1.124 / 0.524, 32 1.138 / 1.832 / 0.998, 64 2.43 / 2.67 / 1.89, 128 4.47 / 4.11 /
# 3.48; 11008 x 4096 (panels 180 MB, from DRAM) M 8 4.81 / 16.5 / 6.06, 16 9.38 / 19.4 /
# 11.0, 32 20.2 / 28.6 / 18.2, 64 39.4 / 41.3 / 31.2.  (8-lane hosts: not measured apart.)
WO_GEMV_ROWS_PACKED = 32


def _gemv_rows():
    from kernels_cpu import target
    return WO_GEMV_ROWS_BY_CPU.get(target.cpu_name(), WO_GEMV_ROWS).get(KW.host_lanes(), 64)


# bfloat16 x with a bfloat16 weight: rows of x from which cpu-bf16-dot (vdpbf16ps) runs
# first.  Its tile computes 64 rows of x at a time (fewer rows: the rest are zeros), so below
# this the weight-only GEMV on x widened to float32, which reads the weight once at the
# memory's speed, wins.  Forced, medians of 7 rotating calls after 50 ms pauses (Zen 4, 2
# threads, 2026-12-06, /tmp/w/bf/xo.py), ms, bf16-dot / wo-gemv / wo-gemm at M =
#   N x K 11008 x 4096: 8 13.9 / 4.3 / 17.5, 16 13.8 / 7.6 / 22.5, 32 13.9 / 14.8 / 28.1,
#                       64 14.4 / 31.5 / 42.9, 128 27.7 / 66.8 / 71.8;
#   3072 x 768: 8 1.17 / 0.67 / 1.77, 16 1.15 / 0.90 / 2.01, 32 1.42 / 1.38 / 2.36,
#               64 1.31 / 2.31 / 3.29, 128 3.42 / 4.25 / 4.96.
BF16_DOT_MIN_ROWS = 32

# bfloat16 x with a bfloat16 weight on an AMX host: rows of x from which cpu-bf16-amx runs
# first.  Below it the GEMV on x widened to float32 is as fast (both read the weight once in
# place: the AMX kernel's few-rows form, kernels_cpu.bf16_gemm.AMX_FEW_MAX).  Forced,
# medians of 11 rotating calls after 50 ms pauses (Sapphire Rapids VM, 2 threads,
# 2026-12-06, /tmp/w/xo.py), ms, bf16-amx / wo-gemv at M =
#   N x K 11008 x 4096: 1 4.45 / 4.28, 2 4.33 / 4.45, 4 4.40 / 4.56, 8 4.42 / 7.09;
#   3072 x 768: 1 0.453 / 0.414, 2 0.418 / 0.454, 4 0.461 / 0.533, 8 0.448 / 0.594.
# (Before the few-rows form, which packed the weight at every M: 11008 x 4096 M 1 5.17 /
# 3.50, 8 5.12 / 6.26, 16 5.12 / 10.7.)
BF16_AMX_MIN_ROWS = 2


def _bf16_refusal(instruction, host_refusal):
    """The refusal of a bfloat16 x bfloat16 kernel built on `instruction`: why it cannot take
    a key (None: it can), the host's part asked of host_refusal()."""
    def refusal(key):
        if key.weight_format != WEIGHT_BF16:
            return f"weight is {WEIGHT_FORMAT_NAMES[key.weight_format]}: {instruction} multiplies bfloat16 by bfloat16"
        if key.k_odd:
            return f"K is odd: {instruction} multiplies pairs of K (the widening kernels take odd K)"
        return host_refusal()

    return refusal


_bf16_dot_refusal = _bf16_refusal("vdpbf16ps", KB.host_refusal)
_bf16_amx_refusal = _bf16_refusal("tdpbf16ps", KB.amx_refusal)
_wo_amx_refusal = _bf16_refusal("tdpbf16ps on x split into bfloat16 parts", KB.amx_refusal)

# float32 x with a bfloat16 weight on an AMX host: rows of x from which cpu-wo-amx (x split
# into three bfloat16 parts, 3M rows on the tiles) runs first.  Forced, medians of 5 calls
# after 50 ms pauses (Xeon with AMX, 2 threads, 2026-12-07, /tmp/w/woamx.py), ms, wo-amx /
# wo-gemv / wo-gemm at M =
#   N x K 11008 x 4096: 1 3.70 / 3.12 / 25.2, 4 3.59 / 3.37 / 25.6, 8 4.00 / 6.00 / 25.7,
#                       16 6.16 / 9.49 / 28.4, 32 8.28 / 16.5 / 32.0, 64 15.0 / 40.6 / 43.0,
#                       128 26.3 / 91.3 / 61.2 (the float32 weight: about 41 unpacked);
#   3072 x 768: 1 0.54 / 0.36 / 2.01, 8 0.55 / 0.48 / 2.02, 16 0.80 / 0.85 / 2.32, 32 1.02 /
#               1.06 / 2.25, 64 1.55 / 1.92 / 2.88, 128 2.30 / 4.32 / 4.26.
WO_AMX_MIN_ROWS = 16


def order(key):
    """The CPU candidates for a low-precision key, best first, and why."""
    if is_bfloat16(key.dtype):
        why = _bf16_amx_refusal(key)
        if why is None and key.m >= BF16_AMX_MIN_ROWS:
            return (("cpu-bf16-amx", "cpu-bf16-dot", "cpu-wo-gemm", "cpu-wo-gemv"),
                    f"bfloat16 x and weight, M bucket {key.m} >= {BF16_AMX_MIN_ROWS}: AMX-BF16 tiles (tdpbf16ps, 16 "
                    "times the float32 FMA's products per instruction); measured beside BF16_AMX_MIN_ROWS")
        why = _bf16_dot_refusal(key)
        if why is None and key.m >= BF16_DOT_MIN_ROWS:
            return (("cpu-bf16-dot", "cpu-wo-gemm", "cpu-wo-gemv"),
                    f"bfloat16 x and weight, M bucket {key.m} >= {BF16_DOT_MIN_ROWS}: vdpbf16ps (twice the float32 "
                    "FMA's products per instruction), the weight read in place")
        names, reason = _widened_order(key)
        why = why or f"M bucket {key.m} < {BF16_DOT_MIN_ROWS} (vdpbf16ps computes 64 rows of x per tile)"
        return names + ("cpu-bf16-dot",), f"bfloat16 x widened to float32 ({why}); {reason}"
    return _widened_order(key)


def _widened_order(key):
    name = WEIGHT_FORMAT_NAMES[key.weight_format]
    if key.dtype == _F32 and key.m >= WO_AMX_MIN_ROWS and _wo_amx_refusal(key) is None:
        return (("cpu-wo-amx", "cpu-wo-gemm", "cpu-wo-gemv"),
                f"{name} weight, float32 x, M bucket {key.m} >= {WO_AMX_MIN_ROWS}: AMX-BF16 tiles on x split into "
                "three bfloat16 parts that add up to it (exact products, float32 sums); measured beside "
                "WO_AMX_MIN_ROWS")
    if key.prepacked:
        if key.m < WO_GEMV_ROWS_PACKED:
            return (("cpu-wo-gemv", "cpu-wo-gemm"),
                    f"{name} weight (prepacked), M bucket {key.m} < {WO_GEMV_ROWS_PACKED}: the GEMV on the {name} "
                    "source, half the bytes of the float32 panels; measured beside WO_GEMV_ROWS_PACKED")
        return (("cpu-wo-gemm", "cpu-wo-gemv"),
                f"{name} weight (prepacked), M bucket {key.m} >= {WO_GEMV_ROWS_PACKED}: the dense GEMM on the "
                "float32 panels of its widened values; measured beside WO_GEMV_ROWS_PACKED")
    rows = _gemv_rows()
    if key.m < rows:
        return (("cpu-wo-gemv", "cpu-wo-gemm"),
                f"{name} weight, M bucket {key.m} < {rows} ({KW.host_lanes()} float32 lanes): weights widened in "
                "registers, each byte read from memory once (from cache again per further 4 rows of x); measured "
                "beside WO_GEMV_ROWS")
    return (("cpu-wo-gemm", "cpu-wo-gemv"),
            f"{name} weight, M bucket {key.m} >= {rows} ({KW.host_lanes()} float32 lanes): the dense GEMM, the weight "
            "widened into its packed panels (compute bound; measured beside WO_GEMV_ROWS)")


_NOTES_HALF_X = ("; bfloat16 / float16 x (with a weight of its dtype): widened to float32 (exact) first, the float32 "
                 "result rounded to x's dtype")
_NOTES_BF16_DOT = ("bfloat16 x and weight: AVX-512 BF16 vdpbf16ps (pairs of bfloat16 products summed in float32), "
                   "6 weight rows (read in place, broadcast words) x 64 rows of x (packed once per call) per "
                   "register tile; tasks of 48 weight rows x 128 rows of x; bias + activation on the float32 sums, "
                   "one rounding to bfloat16")
_NOTES_BF16_AMX = ("bfloat16 x and weight: AMX-BF16 tdpbf16ps on 2 x 2 tiles of 16 x 16 float32 (32 rows of x x 32 "
                   "output columns per 32 values of K); x's rows packed once per call into tile-ordered chunks, each "
                   "task's 64 weight rows packed as pairs (the B tiles' layout) on the thread that multiplies them, "
                   "both on cache lines; bias + activation on the float32 sums, one rounding to bfloat16")
_NOTES_WO_AMX = ("bfloat16 weight, float32 x, AMX hosts: x split into three bfloat16 parts (8 + 8 + 8 significant "
                 "bits: hi + mid + lo == x exactly), stacked as 3M rows of one AMX-BF16 product with the weight (its "
                 "rows packed once per task, as cpu-bf16-amx's), float32 sums kept, the three row blocks added "
                 "smallest first, bias + activation after; as exact as the float32 GEMM (each product exact, "
                 "float32 sums); extra memory 12 M (K + N) bytes (the parts, their tile-ordered copy, the float32 "
                 "sums)")
_NOTES_GEMV = ("weight-only low precision (float16 / bfloat16 / int8 per-channel), few rows: dot products over "
               "weight rows loaded 16 (8 without AVX-512) at a time and widened in registers (vcvtph2ps / shift / "
               "sign-extend), float32 FMA, 4 weight rows x up to 4 rows of x per tile, next rows prefetched, prange "
               "over blocks of 64 outputs; int8 scale and zero point applied once per output; bias + activation fused")
_NOTES_GEMM = ("weight-only low precision, many rows: the own GEMM (cpu-gemm) with bias + activation fused, its tasks "
               "widening the weight's rows straight into their own packed panels (16-bit patterns; int8 values "
               "dequantized with the per-row scale and zero point): no float32 copy of the weight; a 16-bit weight "
               "given prepacked (dispatch.prepack): the float32 panels of its widened values, read as they are")

register(Implementation("linear", "cpu-wo-gemv", "cpu", _run_gemv, dtypes=(_F32, BF16, _F16), supports=refuse_dense,
                        notes=_NOTES_GEMV + _NOTES_HALF_X, kernel_modules=_KERNELS + ("kernels_cpu.half",)))
register(Implementation("linear", "cpu-wo-gemm", "cpu", _run_gemm, dtypes=(_F32, BF16, _F16), supports=refuse_dense,
                        notes=_NOTES_GEMM + _NOTES_HALF_X, kernel_modules=_KERNELS + ("kernels_cpu.half",)))
register(Implementation("linear", "cpu-wo-amx", "cpu", _run_wo_amx, dtypes=(_F32,), supports=supports_of(_wo_amx_refusal),
                        notes=_NOTES_WO_AMX, kernel_modules=_BF16_KERNELS + ("kernels_cpu.amx",), host=KB.amx_refusal))
register(Implementation("linear", "cpu-bf16-dot", "cpu", _run_bf16_dot, dtypes=(BF16,), supports=supports_of(_bf16_dot_refusal),
                        notes=_NOTES_BF16_DOT, kernel_modules=_BF16_KERNELS, host=KB.host_refusal))
register(Implementation("linear", "cpu-bf16-amx", "cpu", _run_bf16_amx, dtypes=(BF16,), supports=supports_of(_bf16_amx_refusal),
                        notes=_NOTES_BF16_AMX, kernel_modules=_BF16_KERNELS + ("kernels_cpu.amx",), host=KB.amx_refusal))


def zero_weight(shape, fmt):
    """What low_precision_weight gives for a zero float32 weight of `shape`, without making
    the float32 array or reading it (the CUDA model's shape-only inputs)."""
    if fmt in ("int8", "int8-tensor"):
        return QuantizedArray(np.zeros(shape, np.int8), np.ones(shape[0], np.float32) if fmt == "int8"
                              else np.float32(1), axis=0 if fmt == "int8" else None)
    if fmt == "bfloat16":
        import ml_dtypes

        return np.zeros(shape, ml_dtypes.bfloat16)
    if fmt == "float16":
        return np.zeros(shape, np.float16)
    return low_precision_weight(np.zeros((0, 0), np.float32), fmt)  # its error for an unknown format


def low_precision_weight(w, fmt):
    """A float32 (N, K) weight stored as fmt: "float16", "bfloat16" (ml_dtypes, imported
    here on first use), "int8" (symmetric per output row: scale max|row| / 127) or
    "int8-tensor" (one symmetric scale).  For benchmarks and examples (bench/cases)."""
    w = np.asarray(w, np.float32)
    if fmt == "float16":
        return w.astype(np.float16)
    if fmt == "bfloat16":
        import ml_dtypes

        return w.astype(ml_dtypes.bfloat16)
    if fmt in ("int8", "int8-tensor"):
        amax = np.abs(w).max(axis=1) if fmt == "int8" else np.abs(w).max()
        sc = np.where(amax > 0, amax / 127, 1).astype(np.float32)
        q = np.round(w / (sc[:, None] if fmt == "int8" else sc)).astype(np.int8)
        return QuantizedArray(q, sc, axis=0 if fmt == "int8" else None)
    raise ValueError(f"weight format must be 'float16', 'bfloat16', 'int8' or 'int8-tensor', got {fmt!r}")
