"""CUDA implementations of matmul and linear: "cuda-gemm", the tiled register-blocked
GEMM of kernels_cuda.gemm with the bias + activation epilogue fused, batched over the
broadcast batch dims (folded into grid x with the row and column blocks), linear's (N, K) weight read in place (trans_b).

float16 runs on tensor cores: kernels_cuda.gemm.gemm_tc_wide_kernel's 128 x 128 x 32 tile
where the inputs read as 32-bit pairs of halves (even K, a (K, N) b's N even, aligned data),
else gemm_tc_kernel's 64 x 64 x 16 tile.  Where the wide tile runs, gemm_tc_async_kernel (128 x
128 tiles with a cp.async pipeline and ldmatrix) replaces it when switched on
(cuda_tiles.TC_ASYNC_ENABLED or PARAMS["tc_async"]) and the rows are whole 16-byte chunks
(K % 8 == 0, a (K, N) b's N % 8 == 0) of 16-byte aligned inputs, in the first build of
cuda_tiles.TC_ASYNC_RUN whose 2 blocks per SM fit the device's shared memory (K tiles of 64
in 2 x 96 KB on an H100, else of 32 in 2 x 48 KB).  On compute capability 9.0 those inputs take
kernels_cuda.gemm_wgmma instead (wgmma from swizzled shared memory, the first build of
cuda_tiles.WGMMA_RUN that fits; switch: cuda_tiles.WGMMA_ENABLED or PARAMS["wgmma"]).  The
launch's "path" says which ran and why.  Tile
rule for float32 / float64: the largest tile of kernels_common.cuda_tiles.GEMM_TILES whose grid still gives
at least one block per SM (128x64 > 64x64 > 32x32), so big products get the most reuse per
loaded element and small or skinny ones (decode-like M) still spread over the SMs; tiles of
more threads than the device allows per block are skipped.  Not measured on a GPU yet.

"cuda-gemv" (kernels_cuda.gemm.gemv_kernel) for M <= GEMV_MAX_M (decode): dot products
per output column, no tiles (decode linear 1 x 4096 -> 11008 on a 64-row tile would spend
63 of 64 FMAs on zero rows).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from kernels_common.cuda_tiles import GEMM_VEC_KERNEL, GEMM_VEC_TILE
from kernels_common.cuda_tiles import (GEMM_TILES, GEMV_KN_WARPS, GEMV_MAX_M, GEMV_WARPS, TC_ASYNC_DEFAULT,
                                       TC_ASYNC_PREFIX, TC_ASYNC_RUN, TC_ASYNC_TILES, TC_ASYNC_WARPS, TC_KERNEL,
                                       TC_TILE, TC_WARPS, TC_WIDE_KERNEL, TC_WIDE_TILE, TC_WIDE_WARPS,
                                       gemm_shared_bytes, gemm_threads, gemm_tile_dtypes, gemv_kn_columns,
                                       gemv_unroll, tc_async_fits, tc_async_kernel_name)
from kernels_common.cuda_tiles import WGMMA_CC, WGMMA_PREFIX, WGMMA_RUN, WGMMA_TILES, wgmma_fits, wgmma_kernel_name

from kernels_common.quant import WEIGHT_DENSE, WEIGHT_FORMAT_NAMES

from ..ops.linalg import dense_weight
from ..registry import Rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, cp_async_refusal, deliver, dummy, kernels,
                      occupancy_blocks, output, props, register_cuda, vector_width, word_aligned, words)

# (name, BM, BN, threads, shared bytes float32), largest tile first
TILES = [(name, t[0], t[1], gemm_threads(name), gemm_shared_bytes(name)) for name, t in GEMM_TILES.items()]
# wide_min_waves: the wide tensor-core tile runs where its grid has at least this many blocks
# per SM.  0: wherever its inputs allow.  On the H200 (2026-11-26, bench/gpu_results/
# 2026-11-26c-h200/probe_tc2.log, GPU time) it beat the 64 x 64 tile at every shape tried,
# grids far below one wave included: 16x4096x4096 183 against 388 us, 128x768x768 50
# against 103, 1024^3 62 against 143, 512x4096x4096 227 against 1638.
# tc_async: whether the wide tile's inputs that allow it (K % 8 == 0, a (K, N) b's N % 8 == 0,
# 16-byte aligned) take the cp.async + ldmatrix kernel of the same tile; None: follow
# kernels_common.cuda_tiles.TC_ASYNC_ENABLED (on: 2.6-3.7x the wide tile's speed on the H200).
# wgmma: whether those inputs on a compute capability 9.0 part take the wgmma kernel
# (kernels_cuda.gemm_wgmma) instead; None: follow kernels_common.cuda_tiles.WGMMA_ENABLED (on:
# 1.11-1.21x the fastest cp.async build on the H200, bench/gpu_results/2026-11-27d-h200/call2).
PARAMS = {"min_blocks_per_sm": 1, "wide_min_waves": 0.0, "tc_async": None, "wgmma": None}


def _dims(a, b, b_is_nk):
    if b_is_nk:
        k = a.shape[-1]
        n = b.shape[0]
        m = math.prod(a.shape[:-1])
        return 1, m, n, k
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    batch = math.prod(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    return batch, m, n, k


def choose_tile(p, batch, m, n, min_blocks_per_sm=1, dtype="float32"):
    fits = [t for t in TILES if t[3] <= p.max_threads_per_block and t[4] <= p.smem_per_block
            and np.dtype(dtype).name in gemm_tile_dtypes(t[0])]
    for name, bm, bn, thr, smem in fits:
        if batch * cdiv(m, bm) * cdiv(n, bn) >= p.sm_count * min_blocks_per_sm:
            return name, bm, bn, thr, smem
    return fits[-1]


def launch(params, a, b, bias, out, code, b_is_nk, packed=None):
    batch, m, n, k = _dims(a, b, b_is_nk)
    p = props()
    if np.dtype(a.dtype) == np.float16:  # tensor cores (mma.m16n8k16, float32 accumulation)
        wm, wn, wk = TC_WIDE_TILE
        wide_blocks = cdiv(n, wn) * cdiv(m, wm) * batch
        # the wide tile where the inputs read as 32-bit pairs of halves (even K, a (K, N) b's
        # N even too, 4-byte aligned data) and its grid is large enough (PARAMS)
        if (wide_blocks >= params["wide_min_waves"] * p.sm_count and 32 * TC_WIDE_WARPS <= p.max_threads_per_block
                and k % 2 == 0 and (b_is_nk or n % 2 == 0) and word_aligned(a) and word_aligned(b)):
            why_not = _async_refusal(params, p, k, n, b_is_nk, a, b)
            if why_not is None:
                rows = " (K % 8 == 0" + ("" if b_is_nk else ", N % 8 == 0") + ", 16-byte aligned inputs)"
                build, why_wg = _wgmma_build(params, p)
                if build is not None:
                    t = WGMMA_TILES[build]
                    return {"kernel": wgmma_kernel_name(build, b_is_nk), "build": build, "tile": "tensor cores, wgmma",
                            "path": f"wgmma from shared memory (Hopper), {t.bm} x {t.bn} x {t.bk} tiles, "
                                    f"{t.stages}-stage cp.async pipeline, {t.min_blocks} blocks per SM" + rows,
                            "grid": (cdiv(n, t.bn) * cdiv(m, t.bm) * batch, 1, 1), "block": t.threads,
                            "shared_bytes": t.shared_bytes, "device": p.name}
                build, why_build = _async_build(p)
                t = TC_ASYNC_TILES[build]
                return {"kernel": tc_async_kernel_name(build, b_is_nk), "build": build, "tile": "tensor cores, cp.async",
                        "path": f"{t.bm} x {t.bn} x {t.bk} tiles, {t.stages}-stage cp.async pipeline + ldmatrix, "
                                f"{t.min_blocks} blocks per SM{why_build}" + rows + f"; not wgmma: {why_wg}",
                        "grid": (cdiv(n, t.bn) * cdiv(m, t.bm) * batch, 1, 1), "block": t.threads,
                        "shared_bytes": t.shared_bytes, "device": p.name}
            return {"kernel": TC_WIDE_KERNEL + (".nk" if b_is_nk else ""), "tile": "tensor cores, wide",
                    "path": f"register-prefetched 32-bit loads: not the cp.async tile because {why_not}",
                    "grid": (wide_blocks, 1, 1), "block": 32 * TC_WIDE_WARPS,
                    "shared_bytes": (wm + wn) * (wk // 2 + 4) * 4, "device": p.name}
        bm, bn, _ = TC_TILE
        return {"kernel": TC_KERNEL, "tile": "tensor cores", "grid": (cdiv(n, bn) * cdiv(m, bm) * batch, 1, 1),
                "block": 32 * TC_WARPS, "shared_bytes": 2 * (bm + bn) * (TC_TILE[2] // 2 + 4), "device": p.name}
    vbm, vbn, vbk = GEMM_VEC_TILE
    vec_blocks = cdiv(n, vbn) * cdiv(m, vbm) * batch
    why_not = _vec_refusal(params, p, a, b, out, k, n, vec_blocks)
    if why_not is None:
        return {"kernel": GEMM_VEC_KERNEL + (".nk" if b_is_nk else ""), "tile": "128x128x8/8x8, 16-byte vectors",
                "grid": (vec_blocks, 1, 1), "block": 256, "shared_bytes": 2 * (vbm + vbn) * vbk * 4, "device": p.name}
    name, bm, bn, thr, smem = choose_tile(p, batch, m, n, params["min_blocks_per_sm"], a.dtype)
    return {"kernel": f"gemm.{name}", "tile": name, "grid": (cdiv(n, bn) * cdiv(m, bm) * batch, 1, 1), "block": thr,
            "shared_bytes": smem, "path": f"scalar shared reads: not the vector tile because {why_not}",
            "device": p.name}


def _vec_refusal(params, p, a, b, out, k, n, blocks):
    """None where the float32 vector tile (kernels_cuda.gemm.gemm_vec_kernel) runs, else why
    not: float32 only, K % 4 == 0 and N % 4 == 0 (whole 16-byte rows), 16-byte aligned a, b
    and out, and a grid that fills the SMs (min_blocks_per_sm blocks each; smaller products
    take the smaller register tiles of choose_tile)."""
    if np.dtype(a.dtype) != np.float32:
        return f"it is float32 only ({np.dtype(a.dtype).name})"
    if k % 4 or n % 4:
        return f"K = {k} or N = {n} is not a multiple of 4"
    vec, why = vector_width(a.dtype, a, b, out)
    if not vec:
        return why
    if blocks < p.sm_count * params["min_blocks_per_sm"]:
        return f"its {blocks} blocks of 128 x 128 would not fill the {p.sm_count} SMs"
    return None


def _async_build(p):
    """(build, why) of the cp.async tile for device p: the first of cuda_tiles.TC_ASYNC_RUN
    whose blocks per SM fit its shared memory (cuda_tiles.tc_async_fits), and why the faster
    ones do not ("" where the first runs)."""
    why = ""
    for build in TC_ASYNC_RUN:
        t = TC_ASYNC_TILES[build]
        if tc_async_fits(build, p.smem_per_block_optin, p.smem_per_sm):
            return build, why
        why += (f" (not {t.bm} x {t.bn} x {t.bk}: {t.min_blocks} blocks of {t.shared_bytes // 1024} KB exceed the"
                f" device's {p.smem_per_sm // 1024} KB of shared memory per SM)")
    return TC_ASYNC_DEFAULT, why


def _wgmma_build(params, p):
    """(build, None) of the wgmma GEMM for device p (the first of cuda_tiles.WGMMA_RUN whose
    blocks fit its shared memory), or (None, why not): switched off (params["wgmma"]; None:
    cuda_tiles.WGMMA_ENABLED), not compute capability 9.0 (wgmma is sm_90a's), blocks over
    the device's thread limit, or shared memory that holds none of the builds."""
    from kernels_common import cuda_tiles

    on = params.get("wgmma")
    if on is None:
        on = cuda_tiles.WGMMA_ENABLED
    if not on:
        return None, "it is switched off (params['wgmma'] / cuda_tiles.WGMMA_ENABLED)"
    if tuple(p.cc[:2]) != WGMMA_CC:
        return None, f"compute capability {p.cc[0]}.{p.cc[1]} is not 9.0 (wgmma is Hopper's)"
    why = []
    for build in WGMMA_RUN:
        t = WGMMA_TILES[build]
        if t.threads > p.max_threads_per_block:
            why.append(f"{build}: {t.threads}-thread blocks exceed the device's limit")
        elif not wgmma_fits(build, p.smem_per_block_optin, p.smem_per_sm):
            why.append(f"{build}: {t.min_blocks} blocks of {t.shared_bytes // 1024} KB exceed the device's "
                       f"{p.smem_per_sm // 1024} KB of shared memory per SM")
        else:
            return build, None
    return None, "; ".join(why)


def _async_refusal(params, p, k, n, b_is_nk, a, b):
    """None where the cp.async tile (kernels_cuda.gemm.gemm_tc_async_kernel) may run, else
    why not: the shared cp.async refusals (_common.cp_async_refusal, switch
    cuda_tiles.TC_ASYNC_ENABLED), a block over the device's limit, or rows that are not
    whole 16-byte chunks (K % 8, a (K, N) b's N % 8)."""
    why = cp_async_refusal(params, p, "TC_ASYNC_ENABLED", a, b)
    if why:
        return why
    if 32 * TC_ASYNC_WARPS > p.max_threads_per_block:
        return f"{32 * TC_ASYNC_WARPS}-thread blocks exceed the device's limit"
    if k % 8:
        return f"K = {k} is not a multiple of 8 (rows of 16-byte chunks)"
    if not b_is_nk and n % 8:
        return f"N = {n} of a (K, N) b is not a multiple of 8 (rows of 16-byte chunks)"
    return None


@functools.lru_cache(maxsize=128)
def _batch_index_host(a_batch, b_batch):
    full = np.broadcast_shapes(a_batch, b_batch)
    ai = np.broadcast_to(np.arange(math.prod(a_batch), dtype=np.int64).reshape(a_batch), full).ravel()
    bi = np.broadcast_to(np.arange(math.prod(b_batch), dtype=np.int64).reshape(b_batch), full).ravel()
    return np.ascontiguousarray(ai), np.ascontiguousarray(bi)


_idx_cache: dict = {}


def _batch_index(a_batch, b_batch):
    key = (a_batch, b_batch)
    hit = _idx_cache.get(key)
    if hit is None:
        from numba import cuda

        ai, bi = _batch_index_host(a_batch, b_batch)
        hit = _idx_cache.setdefault(key, (cuda.to_device(ai), cuda.to_device(bi)))  # racing threads: first wins
    return hit


def _run(params, a, b, bias, out, code, b_is_nk, packed=None, gemv=False):
    K = kernels("gemm")
    dt = np.dtype(a.dtype)
    batch, m, n, k = _dims(a, b, b_is_nk)
    if b_is_nk:
        out_shape = tuple(a.shape[:-1]) + (n,)
        a_batch = b_batch = ()
    else:
        a_batch, b_batch = tuple(a.shape[:-2]), tuple(b.shape[:-2])
        out_shape = tuple(np.broadcast_shapes(a_batch, b_batch)) + (m, n)
    res, od = output(out, out_shape, dt)
    if batch and m and n:
        ad, bd = as_input(a), as_input(b)
        a3 = c_view(ad, max(1, math.prod(a_batch)), m, k)
        b3 = c_view(bd, 1, n, k) if b_is_nk else c_view(bd, max(1, math.prod(b_batch)), k, n)
        ai, bi = _batch_index(a_batch, b_batch)
        bias_d = as_input(bias) if bias is not None else dummy(dt)
        cfg = (gemv_launch if gemv else launch)(params, a, b, bias, out, code, b_is_nk)
        acc = acc_dtype(dt)
        if gemv:
            k_gemv = (K.gemv_kernel(acc, True, 8, cfg["rows_per_pass"]) if b_is_nk else
                      K.gemv_kernel(acc, False, cfg["columns_per_block"], cfg["rows_per_pass"], cfg["warps"]))
            k_gemv[cfg["grid"], cfg["block"]](
                a3, b3, ai, bi, bias_d, c_view(res, batch, m, n), code, bias is not None, b_is_nk)
        elif cfg["kernel"].startswith(WGMMA_PREFIX):  # flat 32-bit words, as the cp.async kernel's
            kernels("_jit").launch_dynamic(kernels("gemm_wgmma").gemm_wgmma_kernel(b_is_nk, cfg["build"]), cfg["grid"],
                                           cfg["block"], WGMMA_TILES[cfg["build"]].shared_bytes,
                                           words(ad), words(bd), ai, bi, bias_d, c_view(res, batch, m, n), k // 2, k,
                                           n // 2, code, bias is not None)
        elif cfg["kernel"].startswith(TC_ASYNC_PREFIX):  # flat 32-bit words, copied 16 bytes at a time
            tile = TC_ASYNC_TILES[cfg["build"]]
            kernels("_jit").launch_dynamic(K.gemm_tc_async_kernel(b_is_nk, cfg["build"]), cfg["grid"], cfg["block"],
                                           tile.shared_bytes if tile.dynamic else 0,
                                           words(ad), words(bd), ai, bi, bias_d, c_view(res, batch, m, n), k // 2, k,
                                           n // 2, code, bias is not None)
        elif cfg["kernel"].startswith(TC_WIDE_KERNEL):  # flat 32-bit words: pairs of halves
            K.gemm_tc_wide_kernel(b_is_nk)[cfg["grid"], cfg["block"]](
                words(ad), words(bd), ai, bi, bias_d, c_view(res, batch, m, n), k // 2, k, n // 2, code,
                bias is not None)
        elif cfg["kernel"] == TC_KERNEL:  # the inputs as uint16: the kernel packs pairs of halves
            K.gemm_tc_kernel()[cfg["grid"], cfg["block"]](
                a3.view(np.uint16), b3.view(np.uint16), ai, bi, bias_d, c_view(res, batch, m, n), code,
                bias is not None, b_is_nk)
        elif cfg["kernel"].startswith(GEMM_VEC_KERNEL):
            K.gemm_vec_kernel(b_is_nk)[cfg["grid"], cfg["block"]](
                a3, b3, ai, bi, bias_d, c_view(res, batch, m, n), code, bias is not None)
        else:
            K.gemm_kernel(acc, cfg["tile"])[cfg["grid"], cfg["block"]](
                a3, b3, ai, bi, bias_d, c_view(res, batch, m, n), code, bias is not None, b_is_nk)
    return deliver(res, od, out)


def gemv_launch(params, a, b, bias, out, code, b_is_nk, packed=None):
    batch, m, n, k = _dims(a, b, b_is_nk)
    p = props()
    if b_is_nk:  # a warp per column
        block, items, per_block, smem = 32 * GEMV_WARPS, batch * n, GEMV_WARPS, 0
        how = {"column_per": "warp"}
    else:  # a block per sector-wide group of columns
        cols = gemv_kn_columns(np.dtype(a.dtype).itemsize)
        # GEMV_KN_WARPS, or as many as the device takes in a block (the simulator's nominal
        # part: 4, so that its tests do not simulate 512 threads a block)
        warps = min(GEMV_KN_WARPS, p.max_threads_per_block // 32)
        block, items, per_block = 32 * warps, batch * cdiv(n, cols), 1
        smem = warps * GEMV_MAX_M * cols * np.dtype(acc_dtype(a.dtype)).itemsize
        how = {"columns_per_block": cols, "column_per": f"{32 // cols} lanes of each of {warps} warps", "warps": warps}
    # one row (decode) has its own build: no predicated loads and FMAs for absent rows
    rows = 1 if m == 1 else GEMV_MAX_M
    how["unroll"] = gemv_unroll(rows)
    if not b_is_nk:
        smem = smem // GEMV_MAX_M * rows
    cap = p.sm_count * occupancy_blocks(p, block, smem) * params["waves"]
    name = ("gemm.gemv_nk" if b_is_nk else "gemm.gemv_kn") + (".m1" if rows == 1 else "")
    return {"kernel": name, "grid": max(1, min(cdiv(items, per_block), cap)), "block": block, "rows_per_pass": rows,
            **how, "device": p.name}


def _run_gemv(params, a, b, bias, out, code, b_is_nk, packed=None):
    return _run(params, a, b, bias, out, code, b_is_nk, packed, gemv=True)


GEMV_PARAMS = {"waves": 1}  # grid capped at one wave of resident blocks, as the elementwise kernels


def _order(key):
    if getattr(key, "weight_format", WEIGHT_DENSE) != WEIGHT_DENSE:
        return (("cuda-wo-gemv",), f"{WEIGHT_FORMAT_NAMES[key.weight_format]} weight: the weight-only GEMV "
                "(dispatch/cuda_impls/weight_only.py), widened in registers; the only CUDA kernel for it")
    if key.m <= GEMV_MAX_M:
        return (("cuda-gemv", "cuda-gemm"),
                f"M bucket {key.m} <= {GEMV_MAX_M}: decode-like rows, dot products without tiles (a 64-row tile "
                "would spend most of its FMAs on zero rows)")
    return ("cuda-gemm", "cuda-gemv"), f"M bucket {key.m} > {GEMV_MAX_M}: the tiled GEMM (tile chosen per launch)"


NOTES = ("float16 on tensor cores (mma.sync m16n8k16, float32 accumulation; 128 x 128 x 32 block tiles read as "
         "32-bit pairs with the next K tile in flight where they fill the SMs, else 64 x 64 x 16); float32/64: "
         "shared-memory tiles + per-thread register tile (TM x TN FMAs per TM + TN shared reads), "
         "bias + activation fused in the epilogue, batch folded into the grid; transposed device views are copied "
         "(linear's (N, K) weight is read in place); " + DEVICE_COPY_NOTE)

NOTES_GEMV = ("for few rows (decode): one warp per output column over the (N, K) weight (coalesced, warp sum), "
              "over a (K, N) b a block per 32-byte group of columns with K split over its lanes and warps "
              "(shuffle and shared-memory sums); 8 independent weight loads in flight per warp; "
              "up to 8 rows per weight read; bias + activation fused; "
              + DEVICE_COPY_NOTE)

for _op in ("matmul", "linear"):
    register_cuda(_op, "cuda-gemm", _run, launch, kernels=("gemm", "activation", "mma"), notes=NOTES, params=PARAMS,
                  supports=dense_weight)
    register_cuda(_op, "cuda-gemv", _run_gemv, gemv_launch, kernels=("gemm", "activation"), notes=NOTES_GEMV,
                  params=GEMV_PARAMS, supports=dense_weight)
    wo = ("cuda-wo-gemv",) if _op == "linear" else ()  # low-precision weights (cuda_impls/weight_only.py)
    set_rule(_op, "cuda", Rule(("cuda-gemv", "cuda-gemm") + wo, _order))
