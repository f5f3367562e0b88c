"""CUDA implementation of linear_cross_entropy(_with_grad) ("cuda-chunked"): the same
chunked sweep as the CPU (dispatch/ops/linear_cross_entropy.py), its buffers on the device:
each chunk's logits by the CUDA linear GEMM, its loss and gradient by the CUDA
cross_entropy_with_grad kernel, dx / dW / dbias by the CUDA GEMMs, and the accumulations by
two elementwise kernels (kernels_cuda/linear_cross_entropy.py)."""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS

from .. import devices
from ..ops import linear_cross_entropy as L
from ..registry import fixed_rule, set_rule
from ._common import (as_input, c_view, cdiv, device_empty, device_zeros, kernels, occupancy_blocks, props,
                      register_cuda, size, t_view)


class DeviceArrays:
    """L.HostArrays' device twin."""

    @staticmethod
    def _cuda():
        return devices.cuda_module()

    @classmethod
    def empty(cls, shape, dtype):
        return device_empty(shape, dtype)

    @classmethod
    def zeros(cls, shape, dtype):
        return device_zeros(shape, dtype)

    @classmethod
    def scratch(cls, shape, dtype):
        return cls.empty(shape, dtype)

    @classmethod
    def add_gt_x(cls, d, dw, g, xc, scratch):
        """dw += g.T @ xc through the scratch, a block of the vocabulary at a time."""
        v = dw.shape[0]
        for v0 in range(0, v, L.BLOCK_V):
            v1 = min(v, v0 + L.BLOCK_V)
            part = scratch[: v1 - v0]
            d.matmul(t_view(g[:, v0:v1]), xc, out=part)
            cls.add(dw[v0:v1], part)

    @classmethod
    def ones(cls, shape, dtype):
        return cls._cuda().to_device(np.ones(shape, dtype))

    @staticmethod
    def _grid(n):
        p = props()
        return max(1, min(cdiv(n, ELEMENTWISE_THREADS), p.sm_count * occupancy_blocks(p, ELEMENTWISE_THREADS)))

    @classmethod
    def add(cls, dst, src):
        n = size(dst.shape)
        if n:
            kernels("linear_cross_entropy").add_kernel()[cls._grid(n), ELEMENTWISE_THREADS](
                c_view(dst, n), c_view(as_input(src), n))

    @classmethod
    def scale(cls, dst, s):
        n = size(dst.shape)
        if n:
            kernels("linear_cross_entropy").scale_kernel()[cls._grid(n), ELEMENTWISE_THREADS](
                c_view(dst, n), np.dtype(dst.dtype).type(s))

    @staticmethod
    def copy(dst, src):
        dst.copy_to_device(src)

    @staticmethod
    def scalar(a) -> float:
        return float(np.asarray(a.copy_to_host()))

    @staticmethod
    def to_host(a):
        return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def _run(params, x, weight, targets, bias, reduction, ignore_index, with_grad):
    x, weight, targets, bias = (devices.as_device(a) for a in (x, weight, targets, bias))
    res = L.run_chunks(params, x, weight, targets, bias, reduction, ignore_index, with_grad, mem=DeviceArrays)
    if reduction == "none":
        return res
    # the loss comes back as a 0-d device array, as the CUDA cross_entropy's does
    if with_grad:
        return (devices.cuda_module().to_device(res[0]), *res[1:])
    return devices.cuda_module().to_device(res)


def launch(params, x, weight, targets, bias, reduction, ignore_index, with_grad):
    """The launch of one chunk's logits GEMM (the sweep's dominant kernel; the model scales
    by the op's FLOPs), as the CUDA linear rule would choose it."""
    from .. import registry, select
    rows = L.rows_per_chunk(params, weight, x.dtype, x.shape[0])
    chunk = np.broadcast_to(np.zeros((), x.dtype), (rows, x.shape[1]))
    w = np.broadcast_to(np.zeros((), x.dtype), tuple(weight.shape))
    call = registry.OPS["linear"].describe(chunk, w)
    impl = select.rule_choice(call.key._replace(device="cuda"))
    cfg = dict(impl.launch_config(call._replace(key=call.key._replace(device="cuda"))))
    cfg["chunks"] = cdiv(x.shape[0], rows)
    return cfg


for _op in ("linear_cross_entropy", "linear_cross_entropy_with_grad"):
    register_cuda(_op, "cuda-chunked", _run, launch, kernels=("linear_cross_entropy", "gemm", "softmax_grad"),
                  params={"chunk_bytes": L.CHUNK_BYTES}, dtypes=(np.dtype(np.float32), np.dtype(np.float64)),
                  notes="chunks of rows through the CUDA linear GEMM and cross_entropy_with_grad; "
                        "dW / dbias accumulated by an elementwise kernel")
    set_rule(_op, "cuda", fixed_rule(("cuda-chunked",), L.WHY))
