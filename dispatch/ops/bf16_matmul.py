"""matmul of bfloat16 operands on AMX tiles or AVX-512 BF16 (issue #12): a (..., M, K) @
b (..., K, N), numpy batch broadcasting, the result in bfloat16 from float32 sums of the
exact products, bias and activation on the float32 sums, one rounding -- PyTorch's
bfloat16 matmul on the CPU.

This module registers two implementations of the existing op "matmul"
(dispatch/ops/linalg.py describes it and asks `order` for bfloat16 keys):
  cpu-bf16-amx  kernels_cpu.bf16_gemm.run_amx with b as (K, N) matrices: each distinct a
                packed once into the tiles' row chunks, each distinct b's rows interleaved
                in pairs (the B tiles' layout) by a first parallel pass that reads b's rows
                from start to end, then a task per (batch, block of a's rows, 64 columns);
                any K (an odd K's last pair is completed with a zero).
  cpu-bf16-dot  kernels_cpu.bf16_gemm.run_kn (vdpbf16ps: hosts with AVX-512 BF16 but no
                AMX, Zen 4 and Cooper Lake): each distinct b's rows interleaved in pairs
                into panels of 64 columns by a first parallel pass, a's rows read in place
                as the broadcast operand, tasks of (batch, 48 rows of a, 128 columns); K
                even (odd K: the widening kernels).
Elsewhere (Zen 3, Intel before Cooper Lake) and for the keys these refuse, bfloat16 matmul
runs linalg's float32 kernels on widened copies (linalg._half).
"""
from __future__ import annotations

import functools
import math
import threading

import numpy as np


from kernels_common.memory import aligned_empty
from kernels_cpu import bf16_gemm as KB

from ..registry import Implementation, register
from ..validate import BF16
from . import linalg as L
from ._common import deliver, kernel_input, result_buffer, supports_of, thread_buffer
from .weight_only import _x_panels

_F32 = np.dtype(np.float32)


def _run(a, b, bias, out, code, use_amx, packed=None):
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    res = result_buffer(out, batch + (m, n), a.dtype)
    if res.size:
        a3 = kernel_input(np.ascontiguousarray(a).reshape(-1, m, k).view(np.uint16))
        b3 = kernel_input(np.ascontiguousarray(b).reshape(-1, k, n).view(np.uint16))
        bias_v = _zeros(n) if bias is None else np.asarray(bias, _F32)
        out3 = res.reshape(-1, m, n).view(np.uint16)
        a_of, b_of = _matrix_of(tuple(a.shape[:-2]), batch), _matrix_of(tuple(b.shape[:-2]), batch)
        if use_amx:
            KB.run_amx(a3, b3, True, bias_v, code, out3, _x_panels(m, k, True, a3.shape[0]), bias is not None,
                       a_of, b_of, _b_panels(KB.kn_panels_size(b3.shape[0], k, n)))
        elif packed is not None and packed.dtype == np.uint32:   # prepack_bf16's panels of the 2-D b
            KB.run_kn(a3, b3, bias_v, code, out3, packed, bias is not None, a_of, b_of, b_ready=True)
        else:
            KB.run_kn(a3, b3, bias_v, code, out3, _b_panels(KB.kn_dot_panels_size(b3.shape[0], k, n)),
                      bias is not None, a_of, b_of)
    return deliver(res, out)


def _run_amx(params, a, b, bias, out, code, b_is_nk, packed=None):
    return _run(a, b, bias, out, code, True)


def _run_dot(params, a, b, bias, out, code, b_is_nk, packed=None):
    return _run(a, b, bias, out, code, False, packed)


def packed_form():
    """PackedWeight.tile of the panels prepack gives a bfloat16 (K, N) b here: "bf16-dot"
    (run_kn's panels) where cpu-bf16-dot runs (AVX-512 BF16, no AMX), else None (the float32
    panels of the widened values; cpu-bf16-amx reads the source)."""
    return "bf16-dot" if KB.amx_refusal() is not None and KB.host_refusal() is None else None


def prepack_bf16(src):
    """prepack(b, op="matmul") of a bfloat16 (K, N) b on a host of packed_form(): run_kn's
    panels, packed by its own packing tasks (KB.pack_kn_dot), which calls then skip (M x N x
    K 128 x 768 x 768 743 -> 693 us, 128 x 768 x 3072 2927 -> 2425, kernel alone, 2 threads,
    Zen 4, 2026-12-08, /tmp/w/kn.py); None elsewhere or for an odd K (the widening kernels)."""
    k, n = src.shape
    if packed_form() is None or k % 2:
        return None
    bp = aligned_empty(KB.kn_dot_panels_size(1, k, n), np.uint32)
    if k and n:
        KB.pack_kn_dot(kernel_input(np.ascontiguousarray(src).view(np.uint16).reshape(1, k, n)), bp)
    return L.PackedWeight("matmul", src, bp, KB.NR, tile=packed_form())


@functools.lru_cache(maxsize=256)
def _matrix_of(dims, batch):
    """Which of an operand's matrices (its batch dims `dims`, C order) each product of the
    broadcast `batch` takes: int64 (prod(batch),), shared by every call of these shapes (the
    kernel only reads it; np.broadcast_to + ravel cost 10 us a call)."""
    return np.broadcast_to(np.arange(math.prod(dims), dtype=np.int64).reshape(dims), batch).ravel().copy()


@functools.lru_cache(maxsize=64)
def _zeros(n):
    """A float32 zero bias of n (shared; the kernel only reads it)."""
    return np.zeros(n, _F32)


_WORKSPACE = threading.local()


def _b_panels(size):
    """The calling thread's uint32 buffer for b's panels (on a cache line; kept up to
    linalg's WORKSPACE_KEEP words)."""
    return thread_buffer(_WORKSPACE, "bp", size, np.uint32, L.WORKSPACE_KEEP)


def refusal(key):
    """Why cpu-bf16-amx cannot take this matmul key (None: it can).  A bfloat16 PackedWeight b
    is read from its source (its panels are the widening GEMM's)."""
    return KB.amx_refusal()


# cpu-bf16-dot runs first from a batch x M x N x K bucket of linalg.GEMM16_MIN_WORK (2^19) and,
# like cpu-bf16-amx, not under linalg.GEMV_ROWS rows where the GEMV reads b in place.  Forced
# implementations, loop medians (Zen 4, 2 threads, 2026-12-07, /tmp/w/xo.py), us,
# blas (widened copies) / cpu-bf16-dot: 64x64x64 25.9 / 27.4, 32x128x128 29.6 / 30.1,
# 128x64x128 47.0 / 37.5, 16x32x32 13.0 / 25.8; cpu-gemv / cpu-bf16-dot with 2 ms pauses:
# 768x768 M 1 149 / 269, 4 333 / 331, 8 369 / 337, 16 492 / 228; 4096x4096 M 1 2164 / 3269,
# 8 4538 / 5635, 16 6532 / 5930; 768x3072 M 8 809 / 993, 16 1513 / 1085.
def dot_refusal(key):
    """Why cpu-bf16-dot cannot take this matmul key (None: it can; a PackedWeight b: as refusal)."""
    if key.k_odd:
        return "K is odd: vdpbf16ps multiplies pairs of K (the widening kernels take odd K)"
    return KB.host_refusal()


def order(key, widened_names, widened_reason):
    """The CPU candidates for a bfloat16 matmul key, best first, and why: AMX tiles where the
    host has them, else vdpbf16ps where it has AVX-512 BF16, else linalg's float32 kernels on
    widened copies (their own order).  Under linalg.GEMV_ROWS rows the GEMV that reads b in
    place leads either bfloat16 kernel (both first interleave all of b's rows)."""
    amx_why, dot_why = refusal(key), dot_refusal(key)
    work = key.batch * key.m * key.n * key.k
    if amx_why is not None and dot_why is None and work < L.GEMM16_MIN_WORK:
        dot_why = f"batch x M x N x K bucket {work} < 2^19: a widened copy costs no more than b's interleaving"
    if amx_why is not None and dot_why is not None:
        return (tuple(widened_names) + ("cpu-bf16-amx", "cpu-bf16-dot"),
                f"bfloat16 widened to float32 ({amx_why}; {dot_why}); {widened_reason}")
    if amx_why is None:
        fast, other, host, what = "cpu-bf16-amx", "cpu-bf16-dot", "an AMX host", "AMX"
        lead = ("bfloat16 a and b on an AMX host: AMX-BF16 tiles (tdpbf16ps, 16 times the float32 FMA's products "
                "per instruction), no float32 copies")
    else:
        fast, other, host, what = "cpu-bf16-dot", "cpu-bf16-amx", "an AVX-512 BF16 host", "vdpbf16ps"
        lead = (f"bfloat16 a and b, no AMX ({amx_why}): AVX-512 BF16 vdpbf16ps (twice the float32 FMA's products per "
                "instruction), no float32 copies")
    if widened_names[0] == "cpu-gemv" and key.b16_tasks:
        # few rows: the GEMV reads b once as it is (linalg._gemv16), where AMX's first pass
        # interleaves all of b's rows.  2 threads, ms, cpu-gemv / cpu-bf16-amx, forced,
        # minimum of two medians (Xeon with AMX, 2026-12-07, /tmp/w/h16b.py): M=1 4096x4096
        # 0.906 / 2.44, 11008x4096 2.47 / 17.95, 3072x768 0.144 / 0.437, 768x768 0.050 /
        # 0.088; M=4 4096x4096 1.49 / 2.70, 768x768 0.081 / 0.086; from 8 rows AMX (768x768
        # 0.102 / 0.088, 16x4096x4096 4.82 / 2.65).  vdpbf16ps: the measurements beside
        # dot_refusal.
        return (("cpu-gemv", fast) + tuple(n for n in widened_names if n != "cpu-gemv") + (other,),
                f"bfloat16 on {host}, but {widened_reason} ({what} would first interleave all of b)")
    return (fast,) + tuple(widened_names) + (other,), lead


_NOTES = ("bfloat16 a and b on AMX-BF16 tiles (tdpbf16ps on 2 x 2 tiles of 16 x 16 float32: 32 rows of a x 32 "
          "columns of b per 32 values of K); each distinct a packed once into tile-ordered row chunks, each distinct "
          "b's rows interleaved in pairs by a parallel first pass (both on cache lines); "
          "numpy batch broadcasting without copies of the broadcast operand; bias + activation on the float32 "
          "sums, one rounding to bfloat16")

_KERNELS = ("kernels_cpu.bf16_gemm", "kernels_cpu.amx", "kernels_cpu.half", "kernels_cpu.gemm", "kernels_cpu.approx",
            "kernels_cpu.parallel")
register(Implementation("matmul", "cpu-bf16-amx", "cpu", _run_amx, dtypes=(BF16,), supports=supports_of(refusal), notes=_NOTES,
                        kernel_modules=_KERNELS, host=KB.amx_refusal))
_NOTES_DOT = ("bfloat16 a and b on AVX-512 BF16 (vdpbf16ps: pairs of bfloat16 products summed in float32): 6 rows of a "
              "(read in place, broadcast words) x 64 columns of b per register tile; each distinct b's rows interleaved "
              "in pairs into panels of 64 columns by a parallel first pass (once by dispatch.prepack); tasks of 48 rows of a x 128 columns; numpy "
              "batch broadcasting without copies of the broadcast operand; bias + activation on the float32 sums, "
              "one rounding to bfloat16; K even")
register(Implementation("matmul", "cpu-bf16-dot", "cpu", _run_dot, dtypes=(BF16,), supports=supports_of(dot_refusal),
                        notes=_NOTES_DOT, kernel_modules=_KERNELS, host=KB.host_refusal))
