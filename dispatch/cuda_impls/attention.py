"""CUDA implementations of attention: "cuda-flash" (Q tiles against streamed K/V tiles,
one pass) and "cuda-splitkv" (the same kernel with the KV length split over grid z, then
a combine pass): see kernels_cuda/attention.py.  cuda-flash runs float16 without a mask at
head dim 64 or 128 on tensor cores (flash_tc_kernel: (1, 32, 4096, 128) causal in 1.2 ms on
the H200, the scalar kernel 73 ms, PyTorch 0.29 ms; bench/gpu_results/2026-11-27-h200); where
switched on (cuda_tiles.TC_ATTN_ASYNC_ENABLED or params["tc_async"]), on sm_80+ with 16-byte
aligned q, k, v, by flash_tc_async_kernel instead (cp.async K/V pipeline, ldmatrix fragments;
64-row blocks: the causal bar in 592 us, 0.44x PyTorch, bench/gpu_results/2026-11-27b-h200);
the launch's "path" says which kernel runs and why.  Split-KV calls with few rows per kv
head (decode) run decode_kernel (16-byte K/V loads): llama-7b decode against 4096 keys 35 us
against the flash kernel's 206 (PyTorch 24).

Shape rule (CUDA keys): split-KV for decode-like shapes (Sq bucket <= SPLITKV_MAX_SQ),
where the (query tiles x batch x kv heads) blocks cannot fill the GPU; flash otherwise.
splits = enough to give every SM two blocks, at most one per KV tile.  Not measured on a
GPU (none has been lent to this project yet): 16 is one query tile of BQ rows.
Head dims up to 128 (48 KB of static shared memory holds a Q tile and one K and V tile of D columns),
in float64 up to 64 (8-byte tiles of 128 columns would need 86 KB: refused, see _supports).
"""
from __future__ import annotations

import numpy as np

from kernels_common.attention import MASK_ADD, MASK_BOOL, MASK_NONE
from kernels_common import cuda_tiles
from kernels_common.cuda_tiles import (TC_ATTN_ASYNC_BK, TC_ATTN_ASYNC_STAGES, WGMMA_ATTN_BUILDS, WGMMA_CC,
                                       tc_attn_async_kernel, tc_attn_async_shared_bytes, wgmma_attention_kernel_name,
                                       wgmma_attention_shared_bytes)
from kernels_common.cuda_tiles import (ATTN_BK as BK, ATTN_TILES, ATTN_WARPS as NW, DECODE_BLOCKS_PER_SM,
                                       DECODE_HEAD_DIMS, DECODE_MAX_ROW_GROUPS, DECODE_MAX_ROWS, DECODE_MIN_KEYS,
                                       DECODE_WARPS, STATIC_SMEM, TC_ATTN_BK, TC_ATTN_BQ, TC_ATTN_WARPS,
                                       attn_shared_bytes, attn_tile_for)

from ..registry import Rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, cp_async_refusal, deliver, device_empty,
                      kernels, output, pow2_at_least, props, register_cuda, vec_width, vector_width, word_aligned,
                      words)

SPLITKV_MAX_SQ = 16
# blocks_per_sm: split-KV aims at two resident blocks per SM (not measured on a GPU yet).
FLASH = {"splits": "one", "blocks_per_sm": 2}
SPLITKV = {"splits": "fill", "blocks_per_sm": 2}


_DMAX = max(ATTN_TILES)


def _supports(key):
    d = key.head_dim  # rounded up to the tile width: d <= 128 exactly when the head dim is
    if d > _DMAX:
        return [f"head dim > {_DMAX}: the Q, K and V tiles would not fit in 48 KB of static shared memory"]
    dmax, bq = attn_tile_for(d)
    need = attn_shared_bytes(dmax, bq, np.dtype(acc_dtype(key.dtype)).itemsize)
    if need > STATIC_SMEM:
        return [f"{np.dtype(key.dtype).name} with head dim > {dmax // 2}: the {dmax}-wide tiles need {need} B of "
                f"shared memory, more than the {STATIC_SMEM} B a kernel may declare statically"]
    return []


def _tensor_cores(params, q, k, v, mask, d):
    """Whether the one-pass float16 call runs on tensor cores: no mask, a head dim the
    kernel is built for, inputs that read as 32-bit words."""
    return (params["splits"] == "one" and np.dtype(q.dtype) == np.float16 and mask is None and d in TC_ATTN_BK
            and word_aligned(q) and word_aligned(k) and word_aligned(v))


def _async_refusal(params, p, q, k, v):
    """None where a tensor-core call may run flash_tc_async_kernel, else why not: the shared
    cp.async refusals (_common.cp_async_refusal, switch cuda_tiles.TC_ATTN_ASYNC_ENABLED);
    its copies are 16-byte chunks of rows of 64 or 128 halves."""
    return cp_async_refusal(params, p, "TC_ATTN_ASYNC_ENABLED", q, k, v)


def _wgmma_build(params, p, d):
    """(build, None) where a cp.async-eligible call runs the wgmma kernel
    (kernels_cuda.attention_wgmma, build cuda_tiles.TC_ATTN_WGMMA_BUILD), else (None, why
    not): switched off (params["wgmma"]; None: cuda_tiles.TC_ATTN_WGMMA_ENABLED, off until a
    GPU has timed it), not compute capability 9.0, or more shared memory than a block may opt
    in to."""
    on = params.get("wgmma")
    if on is None:
        on = cuda_tiles.TC_ATTN_WGMMA_ENABLED
    if not on:
        return None, "it is switched off (params['wgmma'] / cuda_tiles.TC_ATTN_WGMMA_ENABLED: not yet timed on a GPU)"
    if tuple(p.cc[:2]) != WGMMA_CC:
        return None, f"compute capability {p.cc[0]}.{p.cc[1]} is not 9.0 (wgmma is Hopper's)"
    build = cuda_tiles.TC_ATTN_WGMMA_BUILD
    need = wgmma_attention_shared_bytes(d, *WGMMA_ATTN_BUILDS[build])
    if need > p.smem_per_block_optin:
        return None, f"its {need} B of shared memory exceed the device's {p.smem_per_block_optin} B a block"
    return build, None


def _decode_refusal(params, q, k, v, mask, d, hq, hkv, sq):
    """None where the split-KV call runs on the decode kernel (kernels_cuda.attention.
    decode_kernel), else why not."""
    if params["splits"] != "fill":
        return "it is the one-pass implementation"
    if mask is not None:
        return "it takes no mask"
    if d not in DECODE_HEAD_DIMS:
        return f"head dim {d} is not one of {DECODE_HEAD_DIMS}"
    if (hq // hkv) * sq > DECODE_MAX_ROWS * DECODE_MAX_ROW_GROUPS:
        return (f"{(hq // hkv) * sq} rows per kv head (GQA group x Sq) > {DECODE_MAX_ROW_GROUPS} groups of "
                f"{DECODE_MAX_ROWS}")
    vec, why = vector_width(q.dtype, q, k, v)
    return None if vec else why


def launch(params, q, k, v, mask, causal, scale, out, return_lse=False):
    nb, hq, sq, d = (int(s) for s in q.shape)
    hkv, skv = int(k.shape[1]), int(k.shape[2])
    p = props()
    if _tensor_cores(params, q, k, v, mask, d):
        why_not = _async_refusal(params, p, q, k, v)
        if why_not is None:
            build, why_wg = _wgmma_build(params, p, d)
            if build is not None:
                bk, stages, nwg = WGMMA_ATTN_BUILDS[build]
                bq = 64 * nwg
                return {"kernel": wgmma_attention_kernel_name(d, build), "build": build, "tile": "tensor cores, wgmma",
                        "path": f"wgmma (Hopper): S = Q K^T from shared memory, O += P V with P from registers, "
                                f"{bk}-key tiles in a {stages}-stage cp.async pipeline, {bq}-row blocks",
                        "grid": (max(1, cdiv(sq, bq)) * nb * hq, 1, 1), "block": 128 * nwg, "rows_per_block": bq,
                        "kv_tile": bk, "shared_bytes": wgmma_attention_shared_bytes(d, bk, stages, nwg),
                        "device": p.name}
            w = cuda_tiles.TC_ATTN_ASYNC_WARPS  # read per call (a test builds 128-row blocks)
            bq = 16 * w
            return {"kernel": tc_attn_async_kernel(d, w), "tile": "tensor cores, cp.async",
                    "path": f"flash_tc_async_kernel: {TC_ATTN_ASYNC_STAGES}-stage cp.async K/V pipeline + ldmatrix "
                            f"(head dim {d}, 16-byte aligned q, k, v, sm_80+), {bq}-row blocks; not wgmma: {why_wg}",
                    "grid": (max(1, cdiv(sq, bq)) * nb * hq, 1, 1), "block": 32 * w, "rows_per_block": bq,
                    "kv_tile": TC_ATTN_ASYNC_BK[d], "shared_bytes": tc_attn_async_shared_bytes(d), "device": p.name}
        bk = TC_ATTN_BK[d]
        grid = (max(1, cdiv(sq, TC_ATTN_BQ)) * nb * hq, 1, 1)  # (query block, batch x head) on x
        return {"kernel": f"attention.tc_d{d}", "tile": "tensor cores",
                "path": f"flash_tc_kernel (32-bit K/V loads through registers): not the cp.async kernel because {why_not}",
                "grid": grid, "block": 32 * TC_ATTN_WARPS,
                "rows_per_block": TC_ATTN_BQ, "kv_tile": bk, "shared_bytes": 4 * (bk * (d // 2 + 4) + d * (bk // 2 + 4)),
                "device": p.name}
    why_not = _decode_refusal(params, q, k, v, mask, d, hq, hkv, sq)
    if why_not is None:  # few rows per kv head: the vector decode kernel, KV split over grid x
        rows = (hq // hkv) * sq
        rgroups = cdiv(rows, DECODE_MAX_ROWS)
        per = pow2_at_least(min(rows, DECODE_MAX_ROWS))
        splits = max(1, min(cdiv(skv, DECODE_MIN_KEYS), cdiv(p.sm_count * DECODE_BLOCKS_PER_SM, nb * hkv * rgroups)))
        cfg = {"kernel": f"attention.decode_d{d}",
               "path": f"16-byte K/V loads, {rows} row(s) per kv head, {per} a block in registers",
               "grid": (nb * hkv * splits * rgroups, 1, 1), "block": 32 * DECODE_WARPS, "rows": per,
               "row_groups": rgroups, "splits": splits, "device": p.name}
        if splits > 1:
            cfg["reduce"] = {"kernel": "attention.combine", "block": 256}
        return cfg
    dmax, bq = attn_tile_for(d)
    rows = (hq // hkv) * sq
    base = cdiv(rows, bq) * nb * hkv
    ntiles = max(1, cdiv(skv, BK))
    splits = 1
    if params["splits"] == "fill":
        splits = max(2, cdiv(p.sm_count * params["blocks_per_sm"], max(base, 1)))
        splits = min(splits, ntiles)
    smem = attn_shared_bytes(dmax, bq)
    cfg = {"kernel": f"attention.flash_d{dmax}", "grid": (max(1, cdiv(rows, bq)) * nb * hkv, 1, splits),
           "block": 32 * NW, "rows_per_block": bq, "kv_tile": BK, "shared_bytes": smem, "device": p.name}
    if params["splits"] == "fill":
        cfg["path"] = f"the flash kernel's split-KV: not the decode kernel because {why_not}"
    if splits > 1:
        cfg["reduce"] = {"kernel": "attention.combine", "block": 256}
    return cfg


def _run(params, q, k, v, mask, causal, scale, out, return_lse=False):
    K = kernels("attention")
    dt = np.dtype(q.dtype)
    nb, hq, sq, d = (int(s) for s in q.shape)
    res, od = output(out, q.shape, dt)
    lse = device_empty((nb, hq, sq), dt) if return_lse else _dummy_lse(dt)
    if nb * hq * sq * d == 0:
        return _result(deliver(res, od, out), lse, return_lse)
    acc = acc_dtype(dt)
    qd, kd, vd = as_input(q), as_input(k), as_input(v)
    if mask is None:
        md, mkind = _dummy_mask(), MASK_NONE
    else:
        md = as_input(mask)
        md = c_view(md, *((1,) * (4 - len(md.shape)) + tuple(md.shape)))
        mkind = MASK_BOOL if np.dtype(mask.dtype) == np.bool_ else MASK_ADD
    cfg = launch(params, q, k, v, mask, causal, scale, out)
    if cfg["kernel"].startswith("attention.wgmma_"):
        hkv, skv = int(k.shape[1]), int(k.shape[2])
        kernels("_jit").launch_dynamic(
            kernels("attention_wgmma").flash_wgmma_kernel(d, *WGMMA_ATTN_BUILDS[cfg["build"]]), cfg["grid"],
            cfg["block"], cfg["shared_bytes"], words(qd), words(kd), words(vd), nb, hq, sq, hkv, skv, bool(causal),
            float(scale), c_view(res, nb * hq * sq * d), c_view(lse, nb * hq * sq if return_lse else 1),
            bool(return_lse))
        return _result(deliver(res, od, out), lse, return_lse)
    if cfg["kernel"].startswith("attention.tc_async_"):
        hkv, skv = int(k.shape[1]), int(k.shape[2])
        K.flash_tc_async_kernel(d, cfg["block"] // 32)[cfg["grid"], cfg["block"]](
            words(qd), words(kd), words(vd), nb, hq, sq, hkv, skv, bool(causal), float(scale),
            c_view(res, nb * hq * sq * d), c_view(lse, nb * hq * sq if return_lse else 1), bool(return_lse))
        return _result(deliver(res, od, out), lse, return_lse)
    if cfg["kernel"].startswith("attention.tc_"):
        hkv, skv = int(k.shape[1]), int(k.shape[2])
        K.flash_tc_kernel(d)[cfg["grid"], cfg["block"]](
            words(qd), words(kd), words(vd), nb, hq, sq, hkv, skv, bool(causal), float(scale),
            c_view(res, nb * hq * sq * d), c_view(lse, nb * hq * sq if return_lse else 1), bool(return_lse))
        return _result(deliver(res, od, out), lse, return_lse)
    if cfg["kernel"].startswith("attention.decode_"):
        splits = cfg["splits"]
        if splits == 1:
            po, pml = _dummy_parts(acc)
        else:
            po = device_empty((splits, nb, hq, sq, d), acc)
            pml = device_empty((splits, nb, hq, sq, 2), acc)
        K.decode_kernel(acc, vec_width(dt.itemsize), d, cfg["rows"])[cfg["grid"], cfg["block"]](
            qd, kd, vd, bool(causal), float(scale), splits, cfg["row_groups"], res, po, pml, lse, bool(return_lse))
        if splits > 1:
            total = nb * hq * sq * d
            K.combine_kernel(acc)[max(1, min(cdiv(total, 256), 1024)), 256](po, pml, res, lse, bool(return_lse))
        return _result(deliver(res, od, out), lse, return_lse)
    dmax = attn_tile_for(d)[0]
    splits = cfg["grid"][2]
    if int(k.shape[2]) == 0:  # no keys at all: every query sees none -> zeros
        splits = 1
    if splits == 1:
        po, pml = _dummy_parts(acc)
    else:
        po = device_empty((splits, nb, hq, sq, d), acc)
        pml = device_empty((splits, nb, hq, sq, 2), acc)
    grid = (cfg["grid"][0], cfg["grid"][1], splits)
    want = bool(return_lse)
    K.flash_kernel(acc, dmax)[grid, cfg["block"]](qd, kd, vd, md, mkind, bool(causal), float(scale), res, po, pml,
                                                  lse, want)
    if splits > 1:
        total = nb * hq * sq * d
        K.combine_kernel(acc)[max(1, min(cdiv(total, 256), 1024)), 256](po, pml, res, lse, want)
    return _result(deliver(res, od, out), lse, return_lse)


def _result(res, lse, return_lse):
    return (res, lse) if return_lse else res


def _dummy_lse(dt):
    key = ("lse", np.dtype(dt))
    if key not in _dummies:
        from numba import cuda

        _dummies[key] = cuda.to_device(np.zeros((1, 1, 1), dt))
    return _dummies[key]


_dummies: dict = {}


def _dummy_mask():
    if "mask" not in _dummies:
        from numba import cuda

        _dummies["mask"] = cuda.to_device(np.ones((1, 1, 1, 1), np.bool_))
    return _dummies["mask"]


def _dummy_parts(acc):
    key = ("parts", acc)
    if key not in _dummies:
        from numba import cuda

        _dummies[key] = (cuda.to_device(np.zeros((1, 1, 1, 1, 1), acc)), cuda.to_device(np.zeros((1, 1, 1, 1, 2), acc)))
    return _dummies[key]


def _order(key):
    sq = key.sq
    if sq <= SPLITKV_MAX_SQ:
        return ("cuda-splitkv", "cuda-flash"), f"Sq bucket {sq} <= {SPLITKV_MAX_SQ}: decode shape, KV length split over the grid"
    return ("cuda-flash", "cuda-splitkv"), f"Sq bucket {sq} > {SPLITKV_MAX_SQ}: query tiles fill the GPU"


NOTE = ("Q tile x streamed K/V tiles in shared memory, online softmax by warp shuffles, causal tiles "
        "skipped, K/V tiles shared by the query heads of a GQA group, bool/additive masks; float16 without a "
        "mask at head dim 64 or 128 on tensor cores (mma.sync QK^T and PV, P kept in registers); ")
register_cuda("attention", "cuda-flash", _run, launch, kernels=("attention",), params=FLASH, supports=_supports,
              notes=NOTE + DEVICE_COPY_NOTE)
register_cuda("attention", "cuda-splitkv", _run, launch, kernels=("attention",), params=SPLITKV, supports=_supports,
              notes=NOTE + "KV length split over grid z, second pass merges the splits; " + DEVICE_COPY_NOTE)
set_rule("attention", "cuda", Rule(("cuda-splitkv", "cuda-flash"), _order))
