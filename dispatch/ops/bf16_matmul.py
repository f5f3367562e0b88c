"""matmul of bfloat16 operands on AMX tiles (issue #12): a (..., M, K) @ b (..., K, N), numpy
batch broadcasting, the result in bfloat16 from float32 sums of the exact products, bias
and activation on the float32 sums, one rounding -- PyTorch's bfloat16 matmul on the CPU.

This module registers the implementation "cpu-bf16-amx" of the existing op "matmul"
(dispatch/ops/linalg.py describes it and asks `order` for bfloat16 keys):
  cpu-bf16-amx  kernels_cpu.bf16_gemm.run_amx with b as (K, N) matrices: each distinct a
                packed once into the tiles' row chunks, each distinct b's rows interleaved
                in pairs (the B tiles' layout) by a first parallel pass that reads b's rows
                from start to end, then a task per (batch, block of a's rows, 64 columns);
                any K (an odd K's last pair is completed with a zero).
Without AMX (every AMD host, Intel before Sapphire Rapids) bfloat16 matmul runs linalg's
float32 kernels on widened copies (linalg._half).
"""
from __future__ import annotations

import functools
import math
import threading

import numpy as np


from kernels_cpu import bf16_gemm as KB

from ..registry import Implementation, register
from ..validate import BF16
from . import linalg as L
from ._common import deliver, kernel_input, result_buffer, supports_of, thread_buffer
from .weight_only import _x_panels

_F32 = np.dtype(np.float32)


def _run_amx(params, a, b, bias, out, code, b_is_nk, packed=None):
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    res = result_buffer(out, batch + (m, n), a.dtype)
    if res.size:
        a3 = kernel_input(np.ascontiguousarray(a).reshape(-1, m, k).view(np.uint16))
        b3 = kernel_input(np.ascontiguousarray(b).reshape(-1, k, n).view(np.uint16))
        bias_v = _zeros(n) if bias is None else np.asarray(bias, _F32)
        xp = _x_panels(m, k, True, a3.shape[0])
        KB.run_amx(a3, b3, True, bias_v, code, res.reshape(-1, m, n).view(np.uint16), xp, bias is not None,
                   _matrix_of(tuple(a.shape[:-2]), batch), _matrix_of(tuple(b.shape[:-2]), batch),
                   _b_panels(KB.kn_panels_size(b3.shape[0], k, n)))
    return deliver(res, out)


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
    """Why cpu-bf16-amx cannot take this matmul key (None: it can)."""
    if key.prepacked:
        return "b is a PackedWeight (float32 / float64 panels)"
    return KB.amx_refusal()


def order(key, widened_names, widened_reason):
    """The CPU candidates for a bfloat16 matmul key, best first, and why: AMX tiles where the
    host has them, else linalg's float32 kernels on widened copies (their own order)."""
    why = refusal(key)
    if why is None and widened_names[0] == "cpu-gemv" and key.b16_tasks:
        # few rows: the GEMV reads b once as it is (linalg._gemv16), where AMX's first pass
        # interleaves all of b's rows.  2 threads, ms, cpu-gemv / cpu-bf16-amx, forced,
        # minimum of two medians (Xeon with AMX, 2026-12-07, /tmp/w/h16b.py): M=1 4096x4096
        # 0.906 / 2.44, 11008x4096 2.47 / 17.95, 3072x768 0.144 / 0.437, 768x768 0.050 /
        # 0.088; M=4 4096x4096 1.49 / 2.70, 768x768 0.081 / 0.086; from 8 rows AMX (768x768
        # 0.102 / 0.088, 16x4096x4096 4.82 / 2.65)
        return (("cpu-gemv", "cpu-bf16-amx") + tuple(n for n in widened_names if n != "cpu-gemv"),
                f"bfloat16 on an AMX host, but {widened_reason} (AMX would first interleave all of b)")
    if why is None:
        return (("cpu-bf16-amx",) + tuple(widened_names),
                "bfloat16 a and b on an AMX host: AMX-BF16 tiles (tdpbf16ps, 16 times the float32 FMA's products "
                "per instruction), no float32 copies")
    return tuple(widened_names) + ("cpu-bf16-amx",), f"bfloat16 widened to float32 ({why}); {widened_reason}"


_NOTES = ("bfloat16 a and b on AMX-BF16 tiles (tdpbf16ps on 2 x 2 tiles of 16 x 16 float32: 32 rows of a x 32 "
          "columns of b per 32 values of K); each distinct a packed once into tile-ordered row chunks, each distinct "
          "b's rows interleaved in pairs by a parallel first pass (both on cache lines); "
          "numpy batch broadcasting without copies of the broadcast operand; bias + activation on the float32 "
          "sums, one rounding to bfloat16")

register(Implementation("matmul", "cpu-bf16-amx", "cpu", _run_amx, dtypes=(BF16,), supports=supports_of(refusal), notes=_NOTES,
                        kernel_modules=("kernels_cpu.bf16_gemm", "kernels_cpu.amx", "kernels_cpu.half",
                                        "kernels_cpu.gemm", "kernels_cpu.approx", "kernels_cpu.parallel")))
