"""CUDA implementations of matmul_int8 and dynamic_quant_linear: "cuda-dp4a" (kernels_cuda/
int8_gemm.py): the rows packed into dp4a words (int8 / uint8 a) or quantized per row (x, the
CPU's formulas), then a 64 x 64-tile dp4a GEMM, or for M <= GEMV_MAX_ROWS a thread per
column streaming the packed weight once; the dequantize + bias + activation epilogue fused.

The weight is packed once per QuantizedArray into (K/4, N) words (4 consecutive K values of
a column, signed bytes) with its column sums, scales and zero points, on the host, and kept
on the device (q.cached).  Not measured on a GPU (none lent in this session).
"""
from __future__ import annotations

import math

import numpy as np

from ..ops.int8_linalg import F32
from ..registry import fixed_rule, set_rule
from ._common import as_input, c_view, cdiv, device_empty, device_zeros, kernels, output, register_cuda
from ._common import deliver as _deliver


def _tiles():
    return kernels("int8_gemm")


def _dims(a, w, transposed):
    rows = math.prod(a.shape[:-1])
    n = w.shape[0] if transposed else w.shape[1]
    return rows, n, a.shape[-1]


def launch(params, a, w, bias, out, code, transposed):
    rows, n, k = _dims(a, w, transposed)
    K = _kernel_consts()
    if rows <= K["GEMV_MAX_ROWS"]:
        return {"kernel": "int8_gemm.dp4a_gemv", "grid": (max(1, cdiv(n, K["GEMV_THREADS"])),),
                "block": K["GEMV_THREADS"]}
    return {"kernel": "int8_gemm.dp4a_tile", "grid": (max(1, cdiv(n, K["BN"])), max(1, cdiv(rows, K["BM"]))),
            "block": (K["TX"], K["TY"])}


def _kernel_consts():
    # the tile constants without importing numba.cuda (launch runs in the CUDA model / PTX
    # report without a GPU): kept equal to kernels_cuda/int8_gemm.py's (tests check it)
    return {"GEMV_MAX_ROWS": 8, "GEMV_THREADS": 128, "BM": 64, "BN": 64, "TX": 16, "TY": 16, "ROW_THREADS": 128}


def _device_weight(w, transposed):
    """(b4 (KW, N) int32 words, sb, colsum, zb float64 (N,)) on the device, once per
    QuantizedArray."""
    def make():
        from numba import cuda

        vals = w.values.copy_to_host() if hasattr(w.values, "copy_to_host") else np.asarray(w.values)
        bk = np.ascontiguousarray(vals.T if transposed else vals)   # (K, N) int8, on the host
        k, n = bk.shape
        kw = -(-k // 4)
        pad = np.zeros((kw * 4, n), np.int8)
        pad[:k] = bk
        words = np.ascontiguousarray(pad.reshape(kw, 4, n).transpose(0, 2, 1)).view(np.int32).reshape(kw, n)  # host
        colsum = bk.astype(np.int64).sum(axis=0).astype(np.float64)
        sb = np.broadcast_to(w.scale.astype(np.float64), (n,)).copy()
        zb = np.broadcast_to(w.zero_point.astype(np.float64), (n,)).copy()
        return tuple(cuda.to_device(x) for x in (words, sb, colsum, zb))

    return w.cached(("int8_gemm_cuda", transposed), make)


def _row_params(a, rows):
    """(sa, za) float64 per flattened row on the device, once per QuantizedArray."""
    def make():
        from numba import cuda

        m = a.shape[-2]
        sa = np.broadcast_to(a.scale.astype(np.float64).reshape(-1), (m,)) if a.axis is not None else \
            np.full(m, float(a.scale))
        za = np.broadcast_to(a.zero_point.astype(np.float64).reshape(-1), (m,)) if a.axis is not None else \
            np.full(m, float(a.zero_point))
        reps = rows // m
        return cuda.to_device(np.tile(sa, reps)), cuda.to_device(np.tile(za, reps))

    return a.cached(("int8_rows_cuda", rows), make)


def _run(params, a, w, bias, out, code, transposed):
    K = _tiles()
    pack_rows, quant_rows, tile, gemv = K.kernels()
    rows, n, k = _dims(a, w, transposed)
    out_shape = tuple(a.shape[:-1]) + (n,)
    res, out_dev = output(out, out_shape, F32)
    if rows == 0 or n == 0:
        return _deliver(res, out_dev, out)
    b4, sb, colsum, zb = _device_weight(w, transposed)
    kw = -(-k // 4)
    a4 = device_empty((rows, kw), np.int32)
    c = device_empty(rows, np.float64)
    rs = device_empty(rows, np.float64)
    rgrid = cdiv(rows, K.ROW_THREADS)
    if transposed:
        x2 = c_view(as_input(a), rows, k)
        sa = device_empty(rows, np.float64)
        quant_rows[rgrid, K.ROW_THREADS](x2, a4, sa, c, rs)
        if not np.all(np.isfinite(sa.copy_to_host())):
            raise ValueError("x must be finite: a row holding NaN or inf has no quantization scale")
    else:
        vals = c_view(as_input(a.values), rows, k)
        sa, za = _row_params(a, rows)
        pack_rows[rgrid, K.ROW_THREADS](vals, 128 if a.dtype == np.int8 else 0, za, a4, c, rs)
    bias_d = device_zeros(n, np.float32) if bias is None else as_input(bias)
    cfg = launch(params, a, w, bias, out, code, transposed)
    kern = gemv if cfg["kernel"].endswith("gemv") else tile
    kern[cfg["grid"], cfg["block"]](a4, b4, sa, c, rs, sb, colsum, zb, bias_d, code, c_view(res, rows, n))
    return _deliver(res, out_dev, out)


_NOTES = ("dp4a (IDP.4A u8 x s8): rows packed into words (int8 a + 128) or quantized per row to uint8, "
          "64x64 shared-memory tiles of 16x16 threads with 4x4 int32 accumulators each, or a thread per column "
          "for M <= 8 (the packed weight streamed once); weight packed once per QuantizedArray and kept on the "
          "device; zero-point corrections, scales, bias and activation fused")
for _op in ("matmul_int8", "dynamic_quant_linear"):
    register_cuda(_op, "cuda-dp4a", _run, launch, kernels=("int8_gemm", "activation"), notes=_NOTES, dtypes=(F32,))
    set_rule(_op, "cuda", fixed_rule(("cuda-dp4a",), "dp4a int8 GEMM (a tile kernel, or a column-per-thread GEMV "
                                                       "for M <= 8)"))
