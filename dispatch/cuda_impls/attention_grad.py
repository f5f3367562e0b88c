"""CUDA implementation of attention_backward ("cuda-flash"): two kernels, dK/dV over key
tiles and dQ over row tiles, each recomputing P and dS from the forward's lse in shared
memory (kernels_cuda/attention_grad.py).  Head dims up to 128 (float64 up to 64: a 128-wide
float64 tile set would need 86 KB of shared memory; refused with the reason)."""
from __future__ import annotations

import numpy as np

from kernels_common.attention import MASK_ADD, MASK_BOOL, MASK_NONE
from kernels_common.cuda_tiles import ATTN_BK as BK, STATIC_SMEM

from ..registry import fixed_rule, set_rule
from ._common import DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, device_empty, kernels, props, register_cuda

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_ROWS, _TILES = 8, (64, 128)  # kernels_cuda.attention_grad.BQ, TILES (that module loads numba.cuda)


def _tile(d):
    return next((t for t in _TILES if d <= t), None)


def _shared(dmax, itemsize):
    return itemsize * (2 * _ROWS * dmax + 2 * BK * (dmax + 1) + 2 * _ROWS * BK + 2 * _ROWS) + 8 * _ROWS


def _supports(key):
    dmax = _tile(key.head_dim)
    if dmax is None:
        return [f"head dim > {_TILES[-1]}: the Q, dO, K and V tiles would not fit in 48 KB of static shared memory"]
    need = _shared(dmax, np.dtype(key.dtype).itemsize)
    if need > STATIC_SMEM:
        return [f"{np.dtype(key.dtype).name} with head dim > {dmax // 2}: the {dmax}-wide tiles need {need} B of "
                f"shared memory, more than the {STATIC_SMEM} B a kernel may declare statically"]
    return []


def launch(params, grad_out, q, k, v, output, lse, mask, causal, scale):
    nb, hq, sq, d = (int(s) for s in q.shape)
    hkv, skv = int(k.shape[1]), int(k.shape[2])
    dmax = _tile(d)
    p = props()
    rows = (hq // hkv) * sq
    return {"kernel": f"attention_grad.dkdv_d{dmax}", "grid": max(1, cdiv(skv, BK)) * nb * hkv, "block": 128,
            "shared_bytes": _shared(dmax, np.dtype(q.dtype).itemsize), "device": p.name,
            # the follow-up pass, under the key bench.ptx / bench.cuda_model read follow-ups from
            "reduce": {"kernel": f"attention_grad.dq_d{dmax}", "grid": max(1, cdiv(rows, _ROWS)) * nb * hkv,
                       "block": 128}}


def _run(params, grad_out, q, k, v, output, lse, mask, causal, scale):
    K = kernels("attention_grad")
    dt = np.dtype(q.dtype)
    nb, hq, sq, d = (int(s) for s in q.shape)
    skv = int(k.shape[2])
    dq = device_empty(q.shape, dt)
    dk = device_empty(k.shape, dt)
    dv = device_empty(k.shape, dt)
    if nb * hq * sq * d == 0 or skv == 0:
        for a in (dq, dk, dv):
            if a.size:
                a.copy_to_device(np.zeros(a.shape, dt))
        return dq, dk, dv
    if mask is None:
        md, mkind = _dummy_mask(), MASK_NONE
    else:
        md = as_input(mask)
        md = c_view(md, *((1,) * (4 - len(md.shape)) + tuple(md.shape)))
        mkind = MASK_BOOL if np.dtype(mask.dtype) == np.bool_ else MASK_ADD
    ins = tuple(as_input(a) for a in (q, k, v, grad_out, output, lse))
    cfg = launch(params, grad_out, q, k, v, output, lse, mask, causal, scale)
    acc = acc_dtype(dt)
    dmax = _tile(d)
    K.dkdv_kernel(acc, dmax)[cfg["grid"], cfg["block"]](*ins, md, mkind, bool(causal), float(scale), dk, dv)
    K.dq_kernel(acc, dmax)[cfg["reduce"]["grid"], cfg["block"]](*ins, md, mkind, bool(causal), float(scale), dq)
    return dq, dk, dv


_dummies: dict = {}


def _dummy_mask():
    if "mask" not in _dummies:
        from numba import cuda

        _dummies["mask"] = cuda.to_device(np.ones((1, 1, 1, 1), np.bool_))
    return _dummies["mask"]


register_cuda("attention_backward", "cuda-flash", _run, launch, kernels=("attention_grad",), dtypes=_FLOATS,
              supports=_supports,
              notes="dK/dV kernel over 32-key tiles (rows of the GQA group streamed through shared memory), dQ "
                    "kernel over 8-row tiles (key tiles streamed); P and dS recomputed from lse in shared memory, "
                    "no atomics; " + DEVICE_COPY_NOTE)
set_rule("attention_backward", "cuda", fixed_rule(("cuda-flash",), "the one CUDA backward kernel pair"))
