"""CUDA implementations of moe_ffn (kernels_cuda.moe): "cuda-grouped", the tiled grouped GEMM
over (row tile of one expert, column tile) blocks, and "cuda-gemv" for decode (a warp per
(active expert, weight row)), each followed by the per-slot combine.

The host copies the (T, k) indices to itself (a few bytes: the range check raises before
anything is launched), sorts the slots by expert (dispatch/ops/moe.route) and uploads the
int32 tables in one copy.  The grids are sized from shapes (the launch configuration the
CUDA model and the PTX report read): the tiled kernel's row tiles are at most
ceil(T*k / BM) + min(E, T*k) - 1 (each active expert adds at most one partial tile), and
blocks past the call's real tile count return at once.

Tile rule (choose_tile below): the GEMM's tiles (kernels_common.cuda_tiles.GEMM_TILES), the
largest whose padded rows (row tiles x BM) exceed the T*k real rows by at most
PADDING_MAX, else the one with the fewest padded rows: an expert's rows rarely fill a
tile (Mixtral at T = 64: about 16 rows per expert), and a 128-row tile would spend 7/8 of
its FMAs and A loads on padding.  Decode (T <= GEMV_MAX_M) goes to the GEMV kernels, which
read every active expert's weights once with all SMs busy.  Not measured on a GPU.
"""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, GEMM_TILES, GEMV_MAX_M, GEMV_WARPS, gemm_tile_dtypes

from .. import validate as V
from ..ops.moe import check_index_range, route
from ..registry import Rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, deliver, device_copy, device_empty,
                      kernels, occupancy_blocks, output, pow2_at_least, props, register_cuda)
from .linalg import TILES

GEMV_PARAMS = {"waves": 1}  # grid capped at one wave of resident blocks, as linalg's GEMV


def _dims(x, indices, w_gate):
    t, h = (int(s) for s in x.shape)
    e, f = (int(s) for s in w_gate.shape[:2])
    return t, h, f, e, int(indices.shape[1])


def _combine(p, t, h):
    # at most ELEMENTWISE_THREADS per block, fewer for a small output (a decode step's
    # few hundred elements; the simulator runs each thread in Python)
    block = min(ELEMENTWISE_THREADS, max(32, pow2_at_least(t * h)))
    return {"kernel": "moe.combine", "grid": max(1, cdiv(t * h, block)), "block": block, "device": p.name}


def gemv_launch(params, x, weights, indices, w_gate, w_up, w_down, act, out):
    t, h, f, e, k = _dims(x, indices, w_gate)
    p = props()
    block = 32 * GEMV_WARPS
    cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
    experts = min(e, t * k)

    def phase(name, n, then):
        return {"kernel": f"moe.gemv_{name}", "grid": max(1, min(cdiv(experts * n, GEMV_WARPS), cap)), "block": block,
                "device": p.name, "reduce": then}

    return phase("gate_up", f, phase("down", h, _combine(p, t, h)))


# Largest row padding (padded rows / real rows) accepted for a larger tile's reuse: a
# guess, not measured (no GPU here).
PADDING_MAX = 1.25


def _row_tile_bound(rows, experts, bm):
    """Row tiles of a call at most: each active expert adds at most one partial tile."""
    return cdiv(rows, bm) + min(experts, rows) - 1 if rows else 0


def choose_tile(p, rows, experts, dtype):
    """(name, BM, BN, threads, shared bytes) of the tile for rows = T*k over `experts`."""
    fits = [t for t in TILES if t[3] <= p.max_threads_per_block and t[4] <= p.smem_per_block
            and np.dtype(dtype).name in gemm_tile_dtypes(t[0])]
    padded = {t[0]: _row_tile_bound(rows, experts, t[1]) * t[1] for t in fits}
    ok = [t for t in fits if padded[t[0]] <= PADDING_MAX * max(rows, 1)]
    return ok[0] if ok else min(fits, key=lambda t: padded[t[0]])


def grouped_launch(params, x, weights, indices, w_gate, w_up, w_down, act, out):
    t, h, f, e, k = _dims(x, indices, w_gate)
    p = props()
    rows = t * k
    name, bm, bn, thr, smem = choose_tile(p, rows, e, V.dtype_of(x))
    row_tiles = _row_tile_bound(rows, e, bm)

    def phase(cols, then):
        return {"kernel": f"moe.grouped_{name}", "tile": name, "grid": max(1, row_tiles * cdiv(cols, bn)),
                "block": thr, "shared_bytes": smem, "device": p.name, "reduce": then}

    return phase(2 * f, phase(h, _combine(p, t, h)))


def _row_tiles(offs, active, bm):
    """(ntiles, 3): (expert, first sorted row, rows) of each tile of at most bm rows of one expert."""
    counts = offs[active + 1] - offs[active]
    per = -(-counts // bm)
    ex = np.repeat(active, per)
    first = np.repeat(np.cumsum(per) - per, per)
    r0 = offs[ex] + (np.arange(ex.size) - first) * bm
    return np.stack([ex, r0, np.minimum(bm, offs[ex + 1] - r0)], axis=1)


def _run(tiled):
    def run(params, x, weights, indices, w_gate, w_up, w_down, act, out):
        from numba import cuda

        t, h, f, e, k = _dims(x, indices, w_gate)
        dt = V.dtype_of(x)
        res, od = output(out, (t, h), dt)
        if t * h == 0:
            return deliver(res, od, out)
        acc = acc_dtype(dt)
        idx = as_input(indices).copy_to_host()
        check_index_range(idx, e)   # before anything is launched or written
        offs, active, order = route(idx, e)
        inv = np.empty_like(order)
        inv[order] = np.arange(order.size)
        cfg = (grouped_launch if tiled else gemv_launch)(params, x, weights, indices, w_gate, w_up, w_down, act, out)
        tables = [offs, active, order // max(k, 1), inv]
        if tiled:
            tables.append(_row_tiles(offs, active, GEMM_TILES[cfg["tile"]][0]).reshape(-1))
        dev = device_copy(np.concatenate(tables).astype(np.int32))  # one upload
        cut = np.cumsum([0] + [a.size for a in tables])
        offs_d, active_d, tok_d, inv_d = (dev[cut[i]:cut[i + 1]] for i in range(4))
        rows = order.size
        hid = device_empty((rows, f), acc)
        ybuf = device_empty((rows, h), acc) if f else cuda.to_device(np.zeros((rows, h), acc))
        xd, wg, wu, wd = (as_input(a) for a in (x, w_gate, w_up, w_down))
        K = kernels("moe")
        if rows and f:
            down = cfg["reduce"]
            if tiled:
                tiles_d = c_view(dev[cut[4]:cut[5]], (cut[5] - cut[4]) // 3, 3)
                kern = K.grouped_kernel(acc, cfg["tile"])
                kern[cfg["grid"], cfg["block"]](xd, hid, wg, wu, tiles_d, tok_d, hid, act, True)
                kern[down["grid"], down["block"]](xd, hid, wd, wd, tiles_d, tok_d, ybuf, act, False)
            else:
                K.gemv_kernel(acc, True)[cfg["grid"], cfg["block"]](xd, hid, wg, wu, offs_d, active_d, tok_d, hid, act)
                K.gemv_kernel(acc, False)[down["grid"], down["block"]](xd, hid, wd, wd, offs_d, active_d, tok_d, ybuf,
                                                                       act)
        comb = cfg["reduce"]["reduce"]
        K.combine_kernel(acc)[comb["grid"], comb["block"]](ybuf, as_input(weights), inv_d, res)
        return deliver(res, od, out)

    return run


def _order(key):
    if key.tokens <= GEMV_MAX_M:
        return (("cuda-gemv", "cuda-grouped"),
                f"T bucket {key.tokens} <= {GEMV_MAX_M}: decode-like, a few rows per expert: dot products per weight "
                "row, every active expert's weights read once")
    return ("cuda-grouped", "cuda-gemv"), f"T bucket {key.tokens} > {GEMV_MAX_M}: the tiled grouped GEMM"


_NOTES = ("the slots sorted by expert on the host (indices copied to it: a synchronization), int32 tables uploaded "
          "in one copy; per-slot float32 workspaces (float64 for float64 inputs) and a combine kernel that sums "
          "the k slots in order (no atomics: reproducible); " + DEVICE_COPY_NOTE)
register_cuda("moe_ffn", "cuda-grouped", _run(True), grouped_launch, kernels=("moe", "activation"),
              notes="grouped GEMM: blocks over (row tile of one expert, column tile), shared-memory tiles and the "
                    "GEMM's register tile; gate and up in one block (their columns in one thread's registers), "
                    "act(g) * u fused; " + _NOTES)
register_cuda("moe_ffn", "cuda-gemv", _run(False), gemv_launch, kernels=("moe", "activation"), params=GEMV_PARAMS,
              notes="for few tokens (decode): a warp per (active expert, weight row), coalesced along K, up to "
                    f"{GEMV_MAX_M} of the expert's rows per read of the row, act(g) * u fused; " + _NOTES)
set_rule("moe_ffn", "cuda", Rule(("cuda-gemv", "cuda-grouped"), _order))
