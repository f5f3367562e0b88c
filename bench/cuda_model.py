"""Performance model of the CUDA kernels: the larger of a memory bound and an issue bound.

For each benchmark case (bench/cases), dtype and GPU, the kernel the dispatcher launches
(its CUDA rule and launch configuration evaluated with that chip's properties) is timed as

    predicted = max(memory bound, issue bound, LAUNCH_S per kernel launch)

(back-to-back calls: the host launches the next kernel while the GPU runs this one, so a call
takes the longer of the two)

- memory bound: the op's fewest bytes (``Op.bytes``, the CPU roofline's number) over the
  bandwidth the launch can draw: the chip's DRAM bandwidth, or less when too few bytes are in
  flight (Little's law: achievable = active SMs x resident warps per SM x 32 lanes x bytes
  each thread has in flight / DRAM latency; bytes in flight per thread = the global-load
  bytes of one iteration of the kernel's streaming loop, or of its tile-staging loop, read
  from its SASS, all assumed independent; resident warps from the kernel's registers and
  shared memory (ptxas) and the blocks the grid actually gives each SM);
- issue bound: the machine code of the kernel's loops, read from the SASS (bench/sass.py, per
  iteration: all instructions, FFMA, HMMA, MUFU, shared-memory bytes...), times how often
  they run (below), divided over the SMs as the grid's blocks are (the busiest SM: ceil(blocks
  / SMs) blocks), each SM retiring at most ISSUE_PER_SM_CLK warp instructions per clock
  (fewer when it holds fewer warps) and each pipe at its own rate: FFMA at the FP32 peak, HMMA
  at the rate mma.sync reaches (the tensor-core peak on Ampere; on Hopper the rate the
  kernels here sustain, a measured 36% of it), HGMMA (wgmma, Hopper) at the share of the peak
  the wgmma kernels sustain (42%, SPECS; both fitted, not first principles), DFMA/DADD/DMUL at the FP64 peak, MUFU at MUFU_PER_SM_CLK, shared
  loads at SHARED_BYTES_PER_SM_CLK.  The slowest of these is the bound (``issue_pipe``).

How often the loops run (``WORK``, one table keyed by kernel name; kernels_cuda does not
declare it, see below):
- "fma" kernels (GEMMs, GEMV, implicit-GEMM and depthwise convolution, flash attention): the
  FMAs the kernel executes, tile padding included, computed from the launch configuration and
  the shapes (e.g. GEMM: blocks x BM x BN x K rounded up to BK).  The loops doing them are the
  kernel's innermost hot loops with FFMA/DFMA/HMMA (attention: the QK and the PV loops); their
  instructions per FMA (summed over those loops) times the FMAs gives the instruction count,
  plus, where the table says how many FMAs one iteration of the enclosing loop does, that
  loop's own instructions (register-tiled GEMM and convolution: the tile staging per k-step;
  attention: the online softmax per row and key tile).
- "stream" kernels (elementwise, row reductions, copies): elements x passes over the data;
  each pass costs the instructions per element of the kernel's full-width streaming loops
  (elements per iteration = bytes stored / element size, or bytes loaded for a loop that only
  reads), averaged over those loops, because which variant runs (residual or not, log or
  not) is a run-time choice the SASS cannot tell.
Kernels not in the table: "fma" with the op's FLOPs / 2 when the op is compute-bound and its
hot loop has FMAs, else "stream" over the largest input, one pass.

What it leaves out, so read it as the best this machine code can do: instructions outside
the counted loops (epilogues, prologues, per-row reductions of the stream kernels; the tile
staging of the tensor-core GEMM, which is inside its hot loop, is counted), bank conflicts,
dependency stalls beyond the warps' count (the tensor-core kernels' barrier per K tile: a
406-clock bubble a tile with one block per SM on the H200, see SPECS), L2 effects and clocks
below boost.  A
loop body counts both sides of every branch in it (bench/sass.py), so a loop holding every
activation behind a run-time switch (activation.*) is charged for all of them.  Calibrated
against the H200 (bench/gpu_results/*-h200/README.md give measured / predicted per bar;
bench/gpu.py prints it for every case it times).

``predictions(cases, ptx_rows, dtype)`` returns rows {op, case, gpu, dtype, seconds,
predicted_us, bound ("memory" / "issue" / "launch"), memory_s, issue_s, issue_pipe, inner_loop
(the hot loop's counts), work, ...} for the performance report, bench.ptx and bench.gpu.
``python -m bench.cuda_model [--dtype float16] [--bars]``: the table; --bars the shapes of
issue #9's static bars (H100, float16) with the instruction counts behind each number.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass

import numpy as np

from kernels_common.cuda_tiles import TC_ASYNC_RUN, WGMMA_RUN, tc_async_kernel_name, wgmma_kernel_name


@dataclass(frozen=True)
class Chip:
    """Datasheet peaks of one GPU (SM count and per-SM limits: dispatch.devices.CHIPS[arch])."""

    arch: str
    clock_hz: float       # boost clock
    dram_bps: float       # DRAM bandwidth
    fp32_flops: float     # non-tensor FP32 (an FFMA = 2 FLOPs)
    fp16_tc_flops: float  # dense FP16 tensor core, FP32 accumulation (mma.sync HMMA)
    fp64_flops: float     # non-tensor FP64
    mma_sync_flops: float = 0.0  # what mma.sync (HMMA.16816) issues at: the tensor pipe here; 0: fp16_tc_flops
    wgmma_share: float = 0.0     # the share of fp16_tc_flops the wgmma kernels sustain (Hopper)

    @property
    def hmma_flops(self) -> float:
        return self.mma_sync_flops or self.fp16_tc_flops

    @property
    def hgmma_flops(self) -> float:
        return self.fp16_tc_flops * (self.wgmma_share or 1.0)


# mma.sync on Hopper: 11.9 SM clocks per HMMA.16816 per SM partition, measured on the H200
# (2026-11-27c, bench/gpu_results/2026-11-27c-h200), four per SM at 1.98 GHz: 132 x 4 / 11.9 x
# 4096 FLOP x 1.98e9 = 360 TFLOP/s, 36% of the dense FP16 peak (reached with wgmma).  Fitted to
# the float16 GEMM builds that ran 4096^3 with one block per SM: 8 warps of 128 x 128 x 32
# tiles (64 HMMA per partition per K tile, 1170 clocks a tile) and of 128 x 256 x 32 (128 HMMA,
# 1934 clocks): 11.9 clocks per HMMA plus a 406-clock barrier bubble per K tile.  No build ran
# faster than 12.4 clocks per HMMA (K tiles of 64, two blocks per SM: 409 us), nor any
# mma.sync kernel here.  The pipe itself issues faster: bench/gpu_probe_mma.py (independent
# HMMA chains, no memory; 2026-11-27d call 1) measured 6.73 clocks per HMMA per partition with
# 8 chains in each of >= 8 warps (636 TFLOP/s, 64% of the dense peak), 7.1 with 4 warps, 9-10
# with 4 chains.  So 11.9 is what these kernels sustain (ldmatrix-to-HMMA dependencies and a
# barrier per K tile), not the pipe's limit: a fitted rate, kept because it predicts them.
HOPPER_MMA_SYNC_CLK_PER_HMMA = 11.9
_HOPPER_MMA_SYNC = 132 * 4 / HOPPER_MMA_SYNC_CLK_PER_HMMA * 2 * 16 * 8 * 16 * 1.98e9
# wgmma (HGMMA) as kernels_cuda.gemm_wgmma runs it: 128 x 128 x 64 tiles at 2 blocks per SM
# ran 4096^3 in 327 (N, K) / 347 (K, N) us on the H200 (2026-11-27d call 3, GPU time), 396-420
# TFLOP/s = 40-42% of the dense peak, where its SASS bound is 97% of it (4 HGMMA.64x128x16 in
# 162 instructions per K tile).  The gap is the kernel's synchronous structure: each warpgroup
# waits for its K tile's products before the next tile's barrier, and 256 x 128 tiles (85 FLOPs
# per byte copied from L2 against 64) ran no faster (334-350 us), so it is not L2 traffic.
# Fitted like the mma.sync rate: the tensor pipe runs HGMMA at this share of the dense peak in
# these kernels.  Replace it when a kernel keeps products in flight across its barriers.
HOPPER_WGMMA_SHARE = 0.42

SPECS = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): FP32 67 TFLOPS, FP64 34 TFLOPS, FP16 Tensor Core
    # 1,979 TFLOPS with sparsity = 989.4 dense, HBM3 3.35 TB/s; 132 SMs; 67e12 / (132 SMs x 128
    # lanes x 2) = 1.98 GHz boost.  The dense tensor peak corresponds to 1.83 GHz (132 x 1024 FMA/clk
    # x 2 x 1.83e9): with it the HMMA pipe below runs at 0.92 of an HMMA.16816 per SM clock.
    # Hopper reaches that peak with wgmma; mma.sync (HMMA) stays far below it (Luo et al.,
    # "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture", 2024; measured here:
    # HOPPER_MMA_SYNC_CLK_PER_HMMA), and the kernels' tensor pipe is that rate.
    "H100 SXM": Chip("sm_90", 1.98e9, 3.35e12, 67e12, 989.4e12, 34e12, _HOPPER_MMA_SYNC, HOPPER_WGMMA_SHARE),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): the H100's SM array and clocks (FP32 67, FP64
    # 34, FP16 Tensor Core 1,979 TFLOPS with sparsity) with 141 GB of HBM3e at 4.8 TB/s.
    "H200 SXM": Chip("sm_90", 1.98e9, 4.8e12, 67e12, 989.4e12, 34e12, _HOPPER_MMA_SYNC, HOPPER_WGMMA_SHARE),
    # NVIDIA A100 datasheet (80GB SXM): FP32 19.5, FP64 9.7, FP16 Tensor Core 312 TFLOPS (dense),
    # 2,039 GB/s; 108 SMs at 1.41 GHz boost (A100 whitepaper).
    "A100 80GB SXM": Chip("sm_80", 1.41e9, 2.039e12, 19.5e12, 312e12, 9.7e12),
    # Jetson AGX Orin Series Technical Brief (64GB): 2048 CUDA cores (16 SMs) at 1.3 GHz, 5.3 FP32
    # TFLOPS, 64 tensor cores with 170 sparse INT8 TOPS = 85 dense = 42.5 dense FP16 TFLOPS (Ampere
    # runs FP16 at half its INT8 rate), LPDDR5 204.8 GB/s.  FP64: not in the brief; GA10x SMs run
    # it at 1/64 of FP32 (NVIDIA GA102 whitepaper), assumed here.
    "Jetson AGX Orin": Chip("sm_87", 1.3e9, 204.8e9, 5.3e12, 42.5e12, 5.3e12 / 64),
}
# (arch, bytes/s, FP32 FLOP/s) per GPU: what bench/gpu.py reads its peaks from
GPUS = {name: (c.arch, c.dram_bps, c.fp32_flops) for name, c in SPECS.items()}

# An SM is four partitions, each with one warp scheduler dispatching one warp instruction
# per clock (NVIDIA A100 and H100 whitepapers, "SM architecture").
ISSUE_PER_SM_CLK = 4
# MUFU (ex2, lg2, rcp, rsqrt, sin, cos): 16 results per clock per SM on compute capability
# 8.x and 9.0 (CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table).
MUFU_PER_SM_CLK = 16 / 32
# Shared memory: 32 banks x 4 bytes per clock per SM (CUDA C++ Programming Guide, "Shared
# Memory" of compute capability 8.x / 9.0); bank conflicts are not modeled.
SHARED_BYTES_PER_SM_CLK = 128
# DRAM latency seen by a load under load, for Little's law: an assumption (the previous model's
# figure).  Pointer-chasing microbenchmarks put unloaded latency at several hundred ns on
# V100 / A100 / H100 (Jia et al. 2018; Chips and Cheese 2023) and it rises with load.
# Calibrate it when a GPU is lent.  2026-11-27d: it is not what holds the row kernels' ratios at
# 1.4-1.8 (layer_norm float16 (4096, 4096) 25.3 us on the H200 against 14.0 predicted at 4.8
# TB/s): sweeping it from 0.6 to 1.5 us left every bar row's bandwidth at the datasheet's (their
# rows sit in registers, much in flight).  bench/gpu_probe_stream.py measures what streaming
# reaches, to tell the chip's shortfall from the kernels'.
DRAM_LATENCY_S = 600e-9
# Host time of one kernel launch from Python: numba-cuda 0.30.4's kernel[grid, block](...)
# with its arguments already on the device, 29.4 us per call back to back on the lent H200
# machine (python -m bench.gpu_overhead, relu 128x3072 float32, 2026-11-26; PyTorch's relu:
# 7.9 us).  The dispatcher's own floor is higher (160-170 us per call with out=, 250-490 us
# allocating the result: six driver calls and a cuMemAlloc per call, same run); that is a
# defect to remove, not a property of the kernels, so the model leaves it out.
LAUNCH_S = 29.4e-6
DEFAULT_OCCUPANCY = 0.5  # when no ptxas numbers are available (e.g. under the simulator)
MIN_INFLIGHT = 4  # bytes per thread in flight when no counted loop loads: one 32-bit load
PTX_CACHE = os.path.join("bench_out", "ptx.json")

# FMAs per thread of one instruction, for the "fma" work (every HMMA taken as HMMA.16816,
# 16 x 8 x 16 per warp: the only shape these kernels emit)
_FMA_PER_THREAD = {"ffma": 1, "dfma": 1, "hmma": 16 * 8 * 16 // 32, "hgmma_fma": 1}
_MIX = ("total", "ffma", "hmma", "hgmma_fma", "fp64", "mufu", "ld_shared_bytes", "st_shared", "ld_global", "st_global")


# ---- work: how often the loops run, per kernel ---------------------------------------------

def _gemm_dims(call):
    from dispatch.cuda_impls.linalg import _dims

    a = call.args
    return _dims(a.a, a.b, a.b_is_nk)  # batch, m, n, k


def _up(x, m):
    return -(-int(x) // m) * m


def _blocks(cfg):
    g = cfg["grid"]
    return g if isinstance(g, int) else math.prod(g)


def _tiled(cfg, k):
    """FMAs of a register-tiled launch: blocks x BM x BN x K rounded up to BK."""
    from kernels_common.cuda_tiles import GEMM_TILES

    bm, bn, bk, _, _ = GEMM_TILES[cfg["tile"]]
    return _blocks(cfg) * bm * bn * _up(k, bk)


def _gemm_tiled(cfg, call):
    return _tiled(cfg, _gemm_dims(call)[3])


def _gemm_vec(cfg, call):
    """FMAs of the float32 vector tile: blocks x 128 x 128 x K rounded up to 8."""
    from kernels_common.cuda_tiles import GEMM_VEC_TILE

    bm, bn, bk = GEMM_VEC_TILE
    return _blocks(cfg) * bm * bn * _up(_gemm_dims(call)[3], bk)


def _vec_step(cfg, call):
    """FMAs per thread per K tile of the vector tile (its staging is the enclosing loop's):
    8 x 8 x BK."""
    from kernels_common.cuda_tiles import GEMM_VEC_TILE

    return 64 * GEMM_VEC_TILE[2]


def _tc_tile(cfg):
    """(BM, BN, BK) of the tensor-core GEMM kernel a launch names."""
    from kernels_common.cuda_tiles import (TC_ASYNC_PREFIX, TC_ASYNC_TILES, TC_TILE, TC_WIDE_KERNEL, TC_WIDE_TILE,
                                           WGMMA_PREFIX, WGMMA_TILES)

    if cfg["kernel"].startswith(WGMMA_PREFIX):
        t = WGMMA_TILES[cfg["build"]]
        return t.bm, t.bn, t.bk
    if cfg["kernel"].startswith(TC_ASYNC_PREFIX):
        t = TC_ASYNC_TILES[cfg["build"]]
        return t.bm, t.bn, t.bk
    return TC_WIDE_TILE if cfg["kernel"].startswith(TC_WIDE_KERNEL) else TC_TILE


def _gemm_tc(cfg, call):
    bm, bn, bk = _tc_tile(cfg)
    return _blocks(cfg) * bm * bn * _up(_gemm_dims(call)[3], bk)


def _tc_step(cfg, call):
    """FMAs per thread per K tile of a tensor-core GEMM block (its tile staging and loads are
    the enclosing loop's instructions): BM x BN x BK over the block's threads."""
    bm, bn, bk = _tc_tile(cfg)
    return bm * bn * bk // cfg["block"]


def _gemv(cfg, call):
    """Every lane runs the build's rows_per_pass rows' FMAs (predicated off past M); (N, K): a
    warp per column, lanes over K; (K, N): a block of `warps` warps per
    columns_per_block columns, 32 // columns lanes per column in each warp."""
    from kernels_common.cuda_tiles import GEMV_MAX_M

    batch, m, n, k = _gemm_dims(call)
    rows = cfg.get("rows_per_pass", GEMV_MAX_M)
    if call.args.b_is_nk:
        return batch * n * _up(m, rows) * _up(k, 32)
    cols = cfg["columns_per_block"]
    return batch * _up(n, cols) * _up(m, rows) * _up(k, 32 // cols * cfg["warps"])


def _wo_gemv(cfg, call):
    """Weight-only GEMV (kernels_cuda/weight_only.py): a warp per output row, each lane's
    word of `per` weights (2 halves, 4 int8; 1 for the unaligned *_odd kernels) times the
    build's R rows per pass (launch's rows_per_pass; rows past M repeat the last row).
    Memory-bound: op.bytes counts the weight in its own storage (2 or 1 bytes per weight)."""
    from kernels_common.cuda_tiles import GEMV_MAX_M

    x, w = call.args.a, call.args.b
    m, (n, k) = math.prod(x.shape[:-1]), w.shape
    name = cfg["kernel"]
    per = 1 if "_odd" in name else (4 if "_i8" in name else 2)
    return n * _up(m, cfg.get("rows_per_pass", GEMV_MAX_M)) * _up(-(-k // per), 32) * per


def _int8_tile(cfg, call):
    """dp4a instructions of kernels_cuda/int8_gemm.dp4a_tile: every block's 64 x 64 outputs
    over K/4 words rounded up to the 8-word staging step (edges computed on zeros)."""
    a = call.args.a
    return _blocks(cfg) * 64 * 64 * _up(-(-int(a.shape[-1]) // 4), 8)


def _int8_gemv(cfg, call):
    """dp4a_gemv: each column's thread runs GEMV_MAX_ROWS (8) row slots (those past M
    predicated off) over K/4 words."""
    a = call.args.a
    threads = cfg["block"] if isinstance(cfg["block"], int) else math.prod(cfg["block"])
    return _blocks(cfg) * threads * 8 * -(-int(a.shape[-1]) // 4)


def _conv_igemm(cfg, call):
    return _tiled(cfg, math.prod(call.args.weight.shape[1:]))  # K = C / groups x KH x KW


def _conv_depthwise(cfg, call):
    x, w = call.args.x, call.args.weight
    n = x.shape[0] if len(x.shape) == 4 else 1
    return n * w.shape[0] * call.args.out_hw[0] * call.args.out_hw[1] * w.shape[2] * w.shape[3]


def _attention(cfg, call):
    """QK and PV FMAs: each real row (padding rows are skipped) against every key of the
    tiles its row block stages (the kernel's causal tile skipping: up to the last key the
    block's last query sees; masked keys inside a tile still cost the warp), head dim d."""
    from kernels_common.cuda_tiles import ATTN_BK as BK

    q, k = call.args.q, call.args.k
    nb, hq, sq, d = (int(s) for s in q.shape)
    hkv, skv = int(k.shape[1]), int(k.shape[2])
    bq = cfg["rows_per_block"]
    rows = (hq // hkv) * sq
    row_keys = 0
    for r0 in range(0, rows, bq):
        r_end = min(rows, r0 + bq)
        kv_end = skv
        if call.args.causal:
            first, last = r0 % sq, (r_end - 1) % sq
            last = sq - 1 if r_end - r0 >= sq or last < first else last
            kv_end = min(skv, max(0, last + skv - sq + 1))
        row_keys += (r_end - r0) * _up(kv_end, BK)
    return 2 * nb * hkv * row_keys * d


def _tile_step(cfg, call):
    """FMAs per thread per k-step of a register tile: TM x TN x BK."""
    from kernels_common.cuda_tiles import GEMM_TILES

    _, _, bk, tm, tn = GEMM_TILES[cfg["tile"]]
    return tm * tn * bk


def _attention_row(cfg, call):
    """FMAs per lane per (row, key tile): d for QK (one key per lane) + d for PV (d / 32
    columns x 32 keys)."""
    return 2 * int(call.args.q.shape[3])


def _attention_tc(cfg, call):
    """QK and PV FMAs of the tensor-core kernel: every block's rows_per_block rows (padding
    rows included: an mma computes 16 rows) against the key tiles it loads, up to the causal
    limit of its last row; per (batch, query head)."""
    q, k = call.args.q, call.args.k
    nb, hq, sq, d = (int(s) for s in q.shape)
    skv = int(k.shape[2])
    bq, bk = cfg["rows_per_block"], cfg["kv_tile"]
    row_keys = 0
    for r0 in range(0, sq, bq):
        kv_end = min(skv, max(0, min(sq, r0 + bq) + skv - sq)) if call.args.causal else skv
        row_keys += bq * _up(kv_end, bk)
    return 2 * nb * hq * row_keys * d


def _attention_tc_tile(cfg, call):
    """FMAs per thread per key tile: a warp's 16 rows x kv_tile keys x d, twice (QK, PV)."""
    return 2 * 16 * cfg["kv_tile"] * int(call.args.q.shape[3]) // 32


def _elements(call):
    """Elements of the largest array argument."""
    return max((a.size for a in call.args if hasattr(a, "size") and hasattr(a, "dtype")), default=0)


def _resample_out(cfg, call):
    return math.prod(cfg["output"])


# kernel name (or the prefix before its first ".") -> ("fma", FMAs(cfg, call)[, FMAs per
# thread per iteration of the loop enclosing the hot one (cfg, call): its own instructions,
# sass.py's "outer", are then charged per FMA too]) or ("stream", elements(cfg, call), passes
# over them).  Derived from each kernel's source (kernels_cuda/<family>.py docstrings); these
# kernels should declare it in their launch() configuration later ("loop_trips") so that this
# table goes away.
WORK = {
    "gemm.tc_64x64x16": ("fma", _gemm_tc, _tc_step),
    "gemm.tc_128x128x32": ("fma", _gemm_tc, _tc_step),
    "gemm.tc_128x128x32.nk": ("fma", _gemm_tc, _tc_step),
    "gemm.vec_128x128x8": ("fma", _gemm_vec, _vec_step),
    "gemm.vec_128x128x8.nk": ("fma", _gemm_vec, _vec_step),
    "gemm.gemv_nk": ("fma", _gemv),
    "gemm.gemv_kn": ("fma", _gemv),
    "gemm.gemv_nk.m1": ("fma", _gemv),
    "gemm.gemv_kn.m1": ("fma", _gemv),
    "gemm": ("fma", _gemm_tiled, _tile_step),     # the register-tiled gemm.<tile>: staging per k-step
    "weight_only": ("fma", _wo_gemv),             # weight_only.gemv_{f16,bf16,i8}[_odd]_r<R>
    "int8_gemm.dp4a_tile": ("fma", _int8_tile),  # units: dp4a (4 multiply-adds each; IDP.4A is not
    "int8_gemm.dp4a_gemv": ("fma", _int8_gemv),  # counted as an FMA by sass.py: no issue bound yet)
    "conv.depthwise": ("fma", _conv_depthwise),
    "conv": ("fma", _conv_igemm, _tile_step),     # conv.igemm_<tile>
    "attention.combine": ("stream", lambda cfg, call: _elements(call), 1),
    "attention.tc_d64": ("fma", _attention_tc, _attention_tc_tile),
    "attention.tc_d128": ("fma", _attention_tc, _attention_tc_tile),
    # the pipelined kernel (flash_tc_async_kernel): the same mma per warp, 64- or 128-row blocks
    "attention.tc_async_d64_bq128": ("fma", _attention_tc, _attention_tc_tile),
    "attention.tc_async_d64_bq64": ("fma", _attention_tc, _attention_tc_tile),
    "attention.tc_async_d128_bq128": ("fma", _attention_tc, _attention_tc_tile),
    "attention.tc_async_d128_bq64": ("fma", _attention_tc, _attention_tc_tile),
    # the decode kernel streams K and V once (16-byte loads; q and the output are small)
    "attention.decode_d64": ("stream", lambda cfg, call: 2 * call.args.k.size, 1),
    "attention.decode_d128": ("stream", lambda cfg, call: 2 * call.args.k.size, 1),
    "attention": ("fma", _attention, _attention_row),  # attention.flash_d<DMAX>: softmax per row and tile
    # the vector-row kernels read each element once (their rows held in registers)
    "softmax.warp_vec_rows": ("stream", lambda cfg, call: _elements(call), 1),
    "softmax.block_vec_rows": ("stream", lambda cfg, call: _elements(call), 1),
    "layer_norm.warp_vec_rows": ("stream", lambda cfg, call: _elements(call), 1),
    "layer_norm.block_vec_rows": ("stream", lambda cfg, call: _elements(call), 1),
    "rms_norm.warp_vec_rows": ("stream", lambda cfg, call: _elements(call), 1),
    "rms_norm.block_vec_rows": ("stream", lambda cfg, call: _elements(call), 1),
    "softmax": ("stream", lambda cfg, call: _elements(call), 2),        # online (max, sum), then write
    "cross_entropy": ("stream", lambda cfg, call: _elements(call), 1),  # online logsumexp
    "layer_norm": ("stream", lambda cfg, call: _elements(call), 3),     # mean, centered variance, write
    "rms_norm": ("stream", lambda cfg, call: _elements(call), 2),       # sum of squares, write
    "group_norm": ("stream", lambda cfg, call: _elements(call), 3),
    "resample": ("stream", _resample_out, 1),
    # quant.range then quant.quantize (its "reduce" follow-up) when scales are computed: two
    # passes, both charged the range loop's instructions per element; dequantize: one
    "quant": ("stream", lambda cfg, call: _elements(call) * (2 if cfg.get("reduce") else 1), 1),
}
WORK.update({tc_async_kernel_name(build, nk): ("fma", _gemm_tc, _tc_step)
             for build in TC_ASYNC_RUN for nk in (False, True)})
WORK.update({wgmma_kernel_name(build, nk): ("fma", _gemm_tc, _tc_step)
             for build in WGMMA_RUN for nk in (False, True)})


def _work_entry(kernel):
    return WORK.get(kernel) or WORK.get(kernel.split(".")[0])


def _fma_loops(loop):
    """The innermost loops doing the FMAs: those with FFMA/DFMA/HMMA nested in another loop
    (a tiled kernel's inner loops), else those with a data-dependent trip count (bench/sass.py's
    hot-loop candidates; an epilogue after the tile loop is neither)."""
    fma = [lp for lp in loop.get("loops", []) if any(lp.get(k) for k in _FMA_PER_THREAD)]
    # a tensor-core kernel's products are its HMMA loops: an epilogue loop of FFMA (bias and
    # activation, left rolled) would otherwise count as its FMAs (gemm.tc_async: 1312 FFMA
    # beside the K loop's 32 HMMA, predicted 5x too slow)
    fma = [lp for lp in fma if lp.get("hmma") or lp.get("hgmma")] or fma
    ls = [lp for lp in fma if lp.get("nested")] or [lp for lp in fma if not lp.get("fixed_trips")]
    return ls or ([loop] if any(loop.get(k) for k in _FMA_PER_THREAD) else [])


def _enclosing_fma_loop(loop):
    """The enclosing loop as the FMA loop, when the FMAs are its own and the innermost loops
    only stage data (flash_tc_kernel: the mma of a key tile sit in the tile loop, its K/V
    staging loops nested in it): its instructions plus one pass of each nested loop (their
    trip counts are not known: a lower bound)."""
    outer = loop.get("outer") or {}
    if not any(outer.get(k) for k in _FMA_PER_THREAD):
        return None
    total = dict(outer)
    for lp in loop.get("loops", []) or [loop]:
        for k in _MIX:
            total[k] = total.get(k, 0) + (lp.get(k) or 0)
    return total


def _stream_loops(loop, itemsize):
    """(loop, elements per iteration) of the full-width streaming loops: the innermost loops
    moving global memory with the most elements per iteration (unrolled bodies, not their
    remainder loops)."""
    out = []
    for lp in loop.get("loops", []) or [loop]:
        e = (lp.get("st_global_bytes") or lp.get("ld_global_bytes") or 0) / itemsize
        if e > 0:
            out.append((lp, e))
    top = max((e for _, e in out), default=0)
    return [(lp, e) for lp, e in out if e == top]


def work(kernel, cfg, call, op, loop, itemsize):
    """How a kernel's counted loops run: {"kind": "fma" | "stream", "units": FMAs or elements,
    "per_unit": thread instructions per unit {total, ffma, hmma, ...} (None when the SASS
    counts do not cover it), "inflight": global-load bytes per thread one iteration has in
    flight (the streaming loops'; for "fma", the most of any loop's, the enclosing loop's
    included: the tile staging of a GEMM or of attention), "note"}."""
    entry = _work_entry(kernel)
    if entry is None:
        hot_fma = any(loop.get(k) for k in _FMA_PER_THREAD)
        if op.bound == "compute" and hot_fma:
            entry = ("fma", lambda cfg, call: op.flops(call) / 2)
        else:
            entry = ("stream", lambda cfg, call: _elements(call), 1)
        note = "not in WORK: " + ("the op's FLOPs / 2 as FMAs" if entry[0] == "fma" else "largest input, one pass")
    else:
        note = ""
    if entry[0] == "fma":
        units = float(entry[1](cfg, call))
        loops = _fma_loops(loop)
        enclosing = None if loops else _enclosing_fma_loop(loop)
        if enclosing is not None:
            loops = [enclosing]
        fmas = sum(sum((lp.get(k) or 0) * f for k, f in _FMA_PER_THREAD.items()) for lp in loops)
        mix = {k: sum(lp.get(k) or 0 for lp in loops) / fmas for k in _MIX} if fmas else None
        note = note or (f"{len(loops)} FMA loop(s)" if enclosing is None else
                        "the enclosing loop's FMAs, with one pass of each nested loop")
        outer = loop.get("outer", {}) if enclosing is None else {}
        if mix and len(entry) > 2 and outer:
            per = entry[2](cfg, call)
            mix = {k: v + outer.get(k, 0) / per for k, v in mix.items()}
            note += f" + the enclosing loop's own instructions per {per} FMAs"
        inflight = max(lp.get("ld_global_bytes", 0) for lp in loop.get("loops", []) + [loop, outer])
    else:
        units = float(entry[1](cfg, call)) * entry[2]
        loops = _stream_loops(loop, itemsize)
        mix = {k: sum(lp.get(k, 0) / e for lp, e in loops) / len(loops) for k in _MIX} if loops else None
        note = note or f"{entry[2]} pass(es), {len(loops)} streaming loop(s)"
        inflight = max((lp.get("ld_global_bytes", 0) for lp, _ in loops), default=0)
    return {"kind": entry[0], "units": units, "per_unit": mix, "inflight": inflight or MIN_INFLIGHT, "note": note}


# ---- the bounds ------------------------------------------------------------------------------

def bounds(chip: Chip, props, cfg, occupancy, nbytes, mix, units, inflight_bytes):
    """{memory_s, issue_s, issue_pipe, bandwidth, warps_per_sm, warp_instructions} of one launch
    (see the module docstring).  mix: thread instructions per unit of work (None: no issue
    bound); units: FMAs or elements."""
    threads = cfg["block"] if isinstance(cfg["block"], int) else math.prod(cfg["block"])
    warps_per_block = -(-threads // 32)
    blocks = _blocks(cfg)
    sms = props.sm_count
    per_sm = -(-blocks // sms)  # blocks of the busiest SM
    resident_blocks = max(1, round(occupancy * props.max_threads_per_sm / (32 * warps_per_block)))
    warps = min(per_sm, resident_blocks) * warps_per_block
    active = min(blocks, sms)
    bw = min(chip.dram_bps, active * warps * 32 * max(inflight_bytes, 1) / DRAM_LATENCY_S)
    out = {"memory_s": nbytes / bw, "bandwidth": bw, "warps_per_sm": warps, "blocks": blocks}
    if mix is None:
        out.update(issue_s=None, issue_pipe=None, warp_instructions=None)
        return out
    share = per_sm / blocks  # the busiest SM's part of the work
    warp_instr = {k: v * units / 32 for k, v in mix.items()}
    sm = {k: v * share for k, v in warp_instr.items()}
    clock = chip.clock_hz
    pipes = {
        "issue": sm["total"] / (min(ISSUE_PER_SM_CLK, warps) * clock),
        "fp32": sm["ffma"] * 64 / (chip.fp32_flops / sms),
        # mma.sync and wgmma (HGMMA) each at the rate these kernels sustain (SPECS)
        "tensor": (sm["hmma"] * 2 * 16 * 8 * 16 / (chip.hmma_flops / sms)
                   + sm["hgmma_fma"] * 64 / (chip.hgmma_flops / sms)),
        "fp64": sm["fp64"] * 64 / (chip.fp64_flops / sms),
        "mufu": sm["mufu"] / (MUFU_PER_SM_CLK * clock),
        "shared": (sm["ld_shared_bytes"] + 4 * sm["st_shared"]) * 32 / (SHARED_BYTES_PER_SM_CLK * clock),
    }
    pipe = max(pipes, key=pipes.get)
    out.update(issue_s=pipes[pipe], issue_pipe=pipe, pipes_s=pipes,
               warp_instructions={k: round(v) for k, v in warp_instr.items()})
    return out


def combine(b, launches=1):
    """(seconds, bound) from bounds(): the largest of the memory bound, the issue bound and the
    host's LAUNCH_S per launch (which overlaps the previous call's GPU work); bound "launch"
    when the launches take longest."""
    busy = max(b["memory_s"], b["issue_s"] or 0.0)
    bound = ("launch" if LAUNCH_S * launches > busy else
             "memory" if b["issue_s"] is None or b["memory_s"] >= b["issue_s"] else "issue")
    return max(busy, LAUNCH_S * launches), bound


# ---- predictions -----------------------------------------------------------------------------

def describe(case, dtype=np.float32):
    """The validated call of a benchmark case with inputs of `dtype` (zeros drawn without a
    generator: only shapes and dtypes matter here), as the dispatcher sees it for device
    arrays.  A float16 call is described with float32 host zeros, then its float32 arrays and
    its key are given float16 (the CPU's float16 ops validate differently).  A case with
    activations= (its inputs' dtype fixed) is described in that dtype only: TypeError
    otherwise, as for an op that does not take the dtype."""
    from dispatch import registry

    dt = np.dtype(dtype)
    act = case.params.get("activations")   # a case whose inputs have a dtype of their own
    if act is not None and act != dt.name:
        raise TypeError(f"the case's inputs are {act} (activations={act!r}), not {dt.name}")
    if act == "float16" and case.params.get("weight_format") == "float16":
        # host float16 x and weight are the CPU's widened weight-only linear; device ones
        # are CUDA's dense float16 GEMM, which the same case without activations= shows
        raise TypeError("float16 x and weight: on CUDA the dense float16 GEMM (the float16 run of the case's "
                        "float32 twin), not describable from host arrays")
    args, kw = case.call_args(case.inputs(None, np.float32 if dt == np.float16 else dt.type, shape_only=True))
    call = registry.OPS[case.op].describe(*args, **kw)
    if dt != np.float16:
        return call

    def retype(v):
        return np.broadcast_to(np.zeros((), dt), v.shape) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v

    return call._replace(key=call.key._replace(dtype=dt),
                         args=call.args._replace(**{f: retype(v) for f, v in call.args._asdict().items()}))


def _ptx_rows(kernel_names, archs, dtype):
    """ptxas + SASS results: from bench_out/ptx.json when present, else compiled now."""
    if os.path.exists(PTX_CACHE):
        with open(PTX_CACHE) as f:
            return json.load(f)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return []
    try:
        from bench import ptx

        return ptx.run(archs, (np.dtype(dtype).name,), only=sorted(kernel_names), verbose=False)
    except Exception:  # noqa: BLE001 - no numba-cuda / nvcc: fall back to the default
        return []


def predictions(cases=None, ptx_rows=None, dtype=np.float32):
    """[{op, case, gpu, dtype, seconds, predicted_us, bound, memory_s, issue_s, issue_pipe,
    inner_loop, work, kernel, impl, threads, blocks, occupancy, roofline_s, flops, bytes, ...}]
    for every benchmark case (cases: bench.cases.Case list; default all) on every GPU of SPECS,
    inputs of `dtype`."""
    import dispatch  # noqa: F401  (registers the ops and the CUDA implementations)
    from dispatch import devices, registry, select

    from bench import cases as bc

    dtype = np.dtype(dtype)
    plans = []
    for c in bc.CASES if cases is None else cases:
        try:
            call = describe(c, dtype)
        except (TypeError, ValueError) as exc:  # the op does not take this dtype
            plans.append((c.op, c.name, None, None, f"not for {dtype.name}: {exc}"))
            continue
        # what the dispatcher would run for the same call on a GPU (its CUDA rule, no
        # overrides or tuning): asked, not re-derived
        impl = select.rule_choice(call.key._replace(device="cuda"))
        plans.append((c.op, c.name, call, impl, None if impl else "no CUDA implementation"))

    launches, needed = {}, set()
    for gname, chip in SPECS.items():
        with devices.assume(devices.CHIPS[chip.arch]):
            for i, (_, _, call, impl, _) in enumerate(plans):
                if impl is not None:
                    cfg = launches[(i, gname)] = impl.launch_config(call)
                    needed.add(cfg.get("kernel", ""))
    if ptx_rows is None:
        ptx_rows = _ptx_rows(needed, tuple(c.arch for c in SPECS.values()), dtype)
    built = {(r["kernel"], r["arch"]): r for r in ptx_rows
             if r.get("dtype", "float32") == dtype.name and "regs" in r}

    from bench import ptx as ptxmod

    out = []
    for i, (op_name, case_name, call, impl, err) in enumerate(plans):
        for gname, chip in SPECS.items():
            row = {"op": op_name, "case": case_name, "gpu": gname, "dtype": dtype.name}
            if impl is None:
                row.update(seconds=None, predicted_us=None, bound=err)
                out.append(row)
                continue
            op = registry.OPS[op_name]
            props = devices.CHIPS[chip.arch]
            flops, nbytes = float(op.flops(call)), float(op.bytes(call))
            cfg = launches[(i, gname)]
            kname = cfg.get("kernel", "")
            threads = cfg["block"] if isinstance(cfg["block"], int) else math.prod(cfg["block"])
            r = built.get((kname, chip.arch))
            if r is not None:
                occupancy, occ_src = ptxmod.occupancy(chip.arch, threads, r["regs"], r.get("shared_bytes", r["smem"])), "ptxas"
            else:
                occupancy, occ_src = DEFAULT_OCCUPANCY, "assumed"
            loop = (r or {}).get("inner_loop") or {"error": "no bench.ptx row with SASS counts"}
            w = {"kind": None, "units": None, "per_unit": None, "inflight": MIN_INFLIGHT, "note": loop.get("error")}
            if w["note"] is None:
                try:
                    w = work(kname, cfg, call, op, loop, dtype.itemsize)
                except Exception as exc:  # noqa: BLE001 - a kernel the table misreads: no issue bound, said why
                    w["note"] = f"work not derived ({type(exc).__name__}: {exc})"
            b = bounds(chip, props, cfg, occupancy, nbytes, w["per_unit"], w["units"], w["inflight"])
            seconds, bound = combine(b, 2 if cfg.get("reduce") else 1)
            roof = max(nbytes / chip.dram_bps, flops / chip.fp32_flops)
            row.update(seconds=seconds, predicted_us=seconds * 1e6, bound=bound, memory_s=b["memory_s"],
                       issue_s=b["issue_s"], issue_pipe=b["issue_pipe"], pipes_s=b.get("pipes_s"),
                       bandwidth=b["bandwidth"], warps_per_sm=b["warps_per_sm"],
                       inner_loop={k: loop.get(k) for k in ("scope", "ffma", "dfma", "hmma", "hgmma", "mufu", "ld_shared",
                                                            "ld_global", "st", "total", "outer", "error")
                                   if k in loop},  # "error": no issue bound, and why
                       work=dict(w, warp_instructions=b["warp_instructions"]),
                       roofline_s=roof, flops=flops, bytes=nbytes, impl=impl.name, kernel=kname, threads=threads,
                       blocks=b["blocks"], occupancy=occupancy, occupancy_source=occ_src, efficiency=roof / seconds)
            out.append(row)
    return out


def annotate(ptx_rows, dtypes):
    """Predict every benchmark case in each dtype from these bench.ptx rows and give each row
    ``predicted_us``: {case id: microseconds on the row's chip} for the cases that launch the
    row's kernel in the row's dtype.  Returns {dtype: prediction rows}."""
    arch = {name: c.arch for name, c in SPECS.items()}
    preds, by = {}, {}
    for dt in dtypes:
        preds[dt] = predictions(None, ptx_rows=ptx_rows, dtype=dt)
        for p in preds[dt]:
            if p.get("seconds") is not None:
                by.setdefault((p["kernel"], arch[p["gpu"]], dt), {})[f"{p['op']}:{p['case']}"] = round(p["predicted_us"], 2)
    for r in ptx_rows:
        if "regs" in r:
            r["predicted_us"] = by.get((r["kernel"], r["arch"], r["dtype"]), {})
    return preds


def _us(s):
    return "-" if s is None else f"{s * 1e6:9.1f}us"


def print_table(rows):
    print(f"{'op':14s} {'case':30s} {'gpu':16s} {'dtype':8s} {'kernel':24s} {'occ':>4s} {'memory':>11s} "
          f"{'issue':>11s} {'pipe':>6s} {'predicted':>11s} {'bound':7s} {'instr/unit':>10s}")
    for r in rows:
        if r.get("seconds") is None:
            print(f"{r['op']:14s} {r['case'][:30]:30s} {r['gpu']:16s} {r['dtype']:8s} {r['bound']}")
            continue
        mix = (r["work"] or {}).get("per_unit")
        per = f"{mix['total']:.2f}/{'FMA' if r['work']['kind'] == 'fma' else 'elt'}" if mix else "-"
        print(f"{r['op']:14s} {r['case'][:30]:30s} {r['gpu']:16s} {r['dtype']:8s} {r['kernel'][:24]:24s} "
              f"{r['occupancy']:4.0%} {_us(r['memory_s']):>11s} {_us(r['issue_s']):>11s} {r['issue_pipe'] or '-':>6s} "
              f"{_us(r['seconds']):>11s} {r['bound']:7s} {per:>10s}")


def bar_cases():
    """The shapes of issue #9's static bars (GEMM 4096^3; causal flash attention (1, 32, 4096,
    128); softmax, layer_norm, rms_norm (4096, 4096)) as benchmark cases."""
    from bench.cases import case

    return [
        case("matmul", "bar gemm 4096^3", "issue #9", {"a": (4096, 4096), "b": (4096, 4096)}),
        case("attention", "bar causal 1x32x4096x128", "issue #9",
             {"q": (1, 32, 4096, 128), "k": (1, 32, 4096, 128), "v": (1, 32, 4096, 128)}, causal=True),
        case("softmax", "bar 4096x4096", "issue #9", {"x": (4096, 4096)}),
        case("layer_norm", "bar 4096x4096", "issue #9", {"x": (4096, 4096), "weight": (4096,), "bias": (4096,)}),
        case("rms_norm", "bar 4096x4096", "issue #9", {"x": (4096, 4096), "weight": (4096,)}),
    ]


def print_bars(rows):
    """The bar rows: % of the tensor-core peak (GEMM, attention) or of DRAM bandwidth (the rest)
    beside the counts that justify them."""
    from dispatch import registry

    for r in rows:
        if r.get("seconds") is None:
            print(f"{r['op']} {r['case']} {r['gpu']}: {r['bound']}")
            continue
        chip = SPECS[r["gpu"]]
        if registry.OPS[r["op"]].bound == "compute":
            frac, what = r["flops"] / r["seconds"] / chip.fp16_tc_flops, "of the FP16 tensor-core peak"
        else:
            frac, what = r["bytes"] / r["seconds"] / chip.dram_bps, "of DRAM bandwidth"
        w = r["work"]
        print(f"{r['op']} {r['case']} ({r['gpu']}, {r['dtype']}): {r['predicted_us']:.1f} us = {frac:.1%} {what}; "
              f"bound {r['bound']} ({r['issue_pipe'] or '-'}); memory {_us(r['memory_s']).strip()}, "
              f"issue {_us(r['issue_s']).strip()}; kernel {r['kernel']}, occupancy {r['occupancy']:.0%}, "
              f"{r['blocks']} blocks")
        print(f"    hot loop per iteration: {r['inner_loop']}")
        if w and w.get("per_unit"):
            per = {k: round(v, 3) for k, v in w["per_unit"].items() if v}
            print(f"    {w['kind']} work {w['units']:.3g} {'FMAs' if w['kind'] == 'fma' else 'elements'} ({w['note']}); "
                  f"thread instructions per unit {per}")


def main(argv=None):
    import sys

    ap = argparse.ArgumentParser(prog="python -m bench.cuda_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "float64"])
    ap.add_argument("--bars", action="store_true", help="issue #9's bar shapes on the H100 (float16)")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    if a.bars:
        print_bars([r for r in predictions(bar_cases(), dtype=np.float16) if r["gpu"] == "H100 SXM"])
    else:
        print_table(predictions(dtype=a.dtype))


if __name__ == "__main__":
    main()
