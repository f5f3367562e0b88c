"""Tile and block shapes of the CUDA kernels: the kernels are compiled for them (as launch
bounds and shared-array shapes) and the dispatcher launches with them, so both read this
one table.  None of these was tuned on a GPU (none has been measured in this project yet);
the sources of each choice are given beside it."""
from typing import NamedTuple

# CUDA's limits on every chip: static __shared__ arrays (more needs the dynamic opt-in), and
# grid dimensions (x up to 2^31 - 1 blocks, y and z up to 65,535: launches put what can
# grow with the data, rows and batches, on x).
STATIC_SMEM = 48 * 1024
GRID_X_MAX = 2**31 - 1
GRID_YZ_MAX = 65535

# Largest blocks launched per kernel kind, given to the compiler as launch bounds so a kernel
# never needs more registers than a block of that size can get.  256 threads (8 warps) for
# elementwise kernels and 4 warps for warp-per-row kernels are the common choices of
# hand-written CUDA kernels (not measured here); 1024 is the hardware limit per block.
ELEMENTWISE_THREADS = 256
# 16-byte vectors a thread of the vector elementwise kernels has in flight per input.  H200
# GPU time (2026-11-27b call 2 against 2026-11-26c's scalar kernels): relu 128 x 3072 2.5
# against 2.7 us, swiglu 128 x 11008 5.0 against 6.0 (float16).
ELEMENTWISE_VEC_STEPS = 2
WARP_ROWS_THREADS = 128
BLOCK_ROWS_MAX_THREADS = 1024
# Row kernels that hold their row in registers (kernels_cuda/norm.make_vec, softmax.vec_rows):
# at most VEC_ROW_ELEMENTS elements a thread (32 float32 registers; the streamed kernels run
# best at 32 elements a thread too, bench/gpu_results/2026-11-27-h200), read as 16-byte
# vectors, blocks of at most VEC_ROWS_MAX_THREADS threads (a launch bound that leaves each
# thread 128 registers: its row share, the weight and bias vectors and the addresses), so
# rows up to 16384 elements; longer ones stream.  GPU time on the H200 (2026-11-27,
# bench/gpu_results/2026-11-27b-h200/call1), (4096, 4096) streamed -> vector rows:
# float16 softmax 70.8 -> 36.6 us, layer_norm 79.5 -> 25.4, rms_norm 64.6 -> 21.4 (1.17-1.54x
# PyTorch); float32 66.6 -> 47.4, 85.5 -> 41.3, 69.0 -> 39.0 (1.19-1.27x).
VEC_ROW_ELEMENTS = 32
VEC_ROWS_MAX_THREADS = 512
VEC_ROW_DTYPES = ("float32", "float16")  # float64's 32 values would take 64 registers: it streams
VEC_BYTES = 16  # the widest load and store of one thread (LDG.E.128 / STG.E.128)


def vec_width(itemsize: int) -> int:
    """Elements of one VEC_BYTES vector of this item size."""
    return VEC_BYTES // int(itemsize)

# GEMM tiles: name -> (BM, BN, BK, TM, TN).  A block computes BM x BN of C with
# (BM/TM) x (BN/TN) threads holding TM x TN accumulators; per BK step it stages an A and a
# B tile in shared memory (rows padded by one word against bank conflicts).  Listed largest
# first: the dispatcher takes the largest tile whose grid still fills every SM once.
GEMM_TILES = {
    "128x64x8/8x4": (128, 64, 8, 8, 4),   # 256 threads, 6.2 KB shared: large M and N
    "64x64x16/4x4": (64, 64, 16, 4, 4),   # 256 threads, 8.3 KB shared
    "32x32x16/4x2": (32, 32, 16, 4, 2),   # 128 threads, 4.2 KB shared: small M or N
}


# The float32 GEMM in 16-byte vectors (kernels_cuda.gemm.gemm_vec_kernel): a 128 x 128 tile
# of C per 256-thread block, 8 x 8 a thread, K tiles of 8 (two stage buffers of 8 KB), as
# the common hand-written SGEMMs (e.g. the CUDA samples' and cuBLAS-like 128 x 128 x 8
# designs): 4 LDS.128 for 64 FFMA per k.  The register-tiled GEMM_TILES read every shared
# operand as a scalar: 4096^3 float32 took 11.7 ms on the H200, this tile 4.10 ms, PyTorch
# 2.7 (0.23x -> 0.65x; bench/gpu_results/2026-11-27b-h200 calls 1 and 2).  Used where K % 4
# == 0, N % 4 == 0, the inputs and output start on 16-byte boundaries and its grid fills the
# SMs (bert-base's 128 x 768 x 768 does not: 80 us on the small register tiles, 0.15x).
GEMM_VEC_TILE = (128, 128, 8)
GEMM_VEC_KERNEL = "gemm.vec_128x128x8"

# Tiles that float64 runs on: with 8-byte accumulators the 8x4 and 4x4 register tiles spill
# under their launch bounds (ptxas, sm_80/87/90: 280-304 and 120-152 bytes of spill stores
# at 128 registers), the 4x2 tile does not (134-139 registers, no spill).
GEMM_FLOAT64_TILES = ("32x32x16/4x2",)


def gemm_tile_dtypes(tile: str) -> tuple:
    """The input dtypes a GEMM tile is built and launched for."""
    return ("float32", "float16", "float64") if tile in GEMM_FLOAT64_TILES else ("float32", "float16")


# The float16 GEMM on tensor cores (kernels_cuda.gemm.gemm_tc_kernel): (BM, BN, BK) of a
# block of TC_WARPS warps, each warp 32 x 32 of C as 2 x 4 mma.m16n8k16 per K step of 16.
# The usual first tensor-core tiling; now only for odd K or N and misaligned data (the wide
# tile below beats it everywhere measured); shared memory 2 x 64 rows x 12 words = 6 KB.
TC_TILE = (64, 64, 16)
TC_WARPS = 4
TC_KERNEL = "gemm.tc_64x64x16"
# The wide tensor-core tile (kernels_cuda.gemm.gemm_tc_wide_kernel): 128 x 128 x 32 by 8
# warps, each 64 x 32 of C (4 x 4 mma per K step of 16), inputs read as 32-bit pairs of
# halves (even K; a (K, N) b also even N), the next K step's tile loaded into registers
# while the tensor cores work on the current one.  The 64 x 64 x 16 tile ran 4096^3 at
# 15.5 TFLOP/s on the H200 (2026-11-26): 16 scalar 16-bit loads and 8 mma per thread and
# step, no loads in flight during the mma; this tile ran it at 79 TFLOP/s (1734 us; PyTorch
# 178 us) and beat the 64 x 64 tile at every shape tried (bench/gpu_results/
# 2026-11-26c-h200).  Shared memory: 2 x 128 rows x 20 words.
TC_WIDE_TILE = (128, 128, 32)
TC_WIDE_WARPS = 8
TC_WIDE_KERNEL = "gemm.tc_128x128x32"
# The pipelined tensor-core tile (kernels_cuda.gemm.gemm_tc_async_kernel): the wide tile's
# 128 x 128 x 32 block and 64 x 32 warp tiles, its A and B tiles copied global -> shared by
# cp.async (16 bytes a copy: K % 8 == 0, a (K, N) b's N % 8 == 0, 16-byte aligned data) into
# its stages of buffers, all but one K tile in flight while the tensor cores work,
# one barrier per K tile; fragments by ldmatrix from rows whose 16-byte chunks are
# XOR-swizzled instead of padded.  A stage: 128 rows x 64 bytes of A + as much of B = 16 KB,
# so 3 stages fill the 48 KB of static shared memory exactly (the common Ampere choice, e.g.
# CUTLASS's sm80 128 x 128 x 32 f16 GEMM uses 3-5).  On the H200 (2026-11-27,
# bench/gpu_results/2026-11-27-gemm-async-h200) it ran 4096^3 in 603-635 us against the wide
# tile's 1602-1787 (torch 178), and beat it at every shape tried.  So the dispatcher runs it
# wherever its inputs allow (TC_ASYNC_ENABLED; PARAMS["tc_async"] in
# dispatch/cuda_impls/linalg.py overrides it per implementation), in the build
# TC_ASYNC_RUN names (2 blocks per SM since 2026-11-27c, see TC_ASYNC_TILES).


class TcAsyncTile(NamedTuple):
    """One build of the pipelined tensor-core GEMM (kernels_cuda.gemm.gemm_tc_async_kernel):
    a bm x bn block tile over K tiles of bk, warps_m x warps_n warps (a warp tile of
    bm / warps_m x bn / warps_n), `stages` shared buffers, launch bounds of `min_blocks`
    blocks per SM, and `group_m` row blocks swept together column by column (the blocks
    running at once then share their B panels in L2; 1: row-major block order)."""
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    min_blocks: int = 1
    group_m: int = 1

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def shared_bytes(self) -> int:
        """Every stage's A and B tiles of halves; above STATIC_SMEM the kernel declares its
        buffers dynamic and the launch opts in (kernels_cuda._jit.launch_dynamic)."""
        return self.stages * (self.bm + self.bn) * self.bk * 2

    @property
    def dynamic(self) -> bool:
        return self.shared_bytes > STATIC_SMEM


# Builds bench/gpu_probe_gemm.py compares on a GPU (name -> tile); TC_ASYNC_RUN are run.
# H200 GPU time (2026-11-27c call 1, bench/gpu_results/2026-11-27c-h200/call1/probe.log, us,
# 4096^3 (K, N) b / (N, K) / 4096 x 11008 x 4096 (N, K) / 512 x 11008 x 4096 (N, K); torch
# 184 / 184 / 509 / 66): one block of 8 warps per SM ("b1") 606 / 632 / 1737 / 254; two
# (launch bounds of 2 blocks: 128 registers, then still spilling) 478 / 494 / 1300 / 213;
# with 4 stages 478 / 492 / 1297 / 210; grouped order 611 / 628 / 1644 / 240; 128 x 256
# tiles (8 warps of 64 x 64, 3 or 4 stages) 500-551 / 541-552 / 1459-1467 / 271-273;
# 256 x 128 530 / 539 / 1440 / 269; 128 x 256 x 64 505 / 501 / 1363 / 252.  So neither L2
# traffic (bigger tiles, grouping) nor copy latency (stages) held it back, but warps to
# switch between: 2 blocks of 128 x 128 won everywhere but the 1000^3 tie.  The default
# holds 2 blocks per SM since its registers fit 128 without spilling (the partial last K
# tile's addresses computed after the main loop, copy places one register per operand):
# 459 / 454 / 1236 / 198 us in call 2.  Call 3: 16-warp blocks of 128 x 256 or 256 x 128
# (the warps of two blocks, half the L2 traffic) 497-506 / 530-533 / 1426-1430 / 264: two
# independent blocks, each waiting only on its own barrier, beat them.  Call 4: K tiles of
# 64 at 2 blocks per SM (half the barriers per product) 409 / 412 / 1100 / 173, the fastest,
# but it spills 24-184 bytes outside the main loop (bench.ptx's bar), so not yet the default.
TC_ASYNC_TILES = {
    "128x128x32": TcAsyncTile(128, 128, 32, 2, 4, 3, min_blocks=2),
    "128x128x32.b1": TcAsyncTile(128, 128, 32, 2, 4, 3),
    "128x128x32.s4b2": TcAsyncTile(128, 128, 32, 2, 4, 4, min_blocks=2),
    "128x128x32.g8": TcAsyncTile(128, 128, 32, 2, 4, 3, min_blocks=2, group_m=8),
    "128x256x32.s3": TcAsyncTile(128, 256, 32, 2, 4, 3),
    "128x256x32.s4g8": TcAsyncTile(128, 256, 32, 2, 4, 4, group_m=8),
    "256x128x32.s4g8": TcAsyncTile(256, 128, 32, 4, 2, 4, group_m=8),
    "128x256x64.s3g8": TcAsyncTile(128, 256, 64, 2, 4, 3, group_m=8),
    # 16 warps of 64 x 32 in one block: the warps of 2 blocks, half the L2 traffic per product
    "128x256x32.w16": TcAsyncTile(128, 256, 32, 2, 8, 3),
    "256x128x32.w16": TcAsyncTile(256, 128, 32, 4, 4, 3),
    # K tiles of 64: half the barriers per product, 2 blocks per SM in 2 x 96 KB (dynamic)
    "128x128x64": TcAsyncTile(128, 128, 64, 2, 4, 3, min_blocks=2),
}
# The builds the dispatcher runs, fastest first: the first whose blocks fit the device's
# shared memory (tc_async_fits) runs.  128 x 128 x 64 ran the H200's bars 11% faster than
# 128 x 128 x 32 (call 4 above: 409 / 412 / 1100 / 173 against 459 / 456 / 1226 / 198 us) but
# needs 2 x 96 KB a SM (an H100's 228 KB; an A100's or Orin's 164 KB hold one block, which
# would lose the second block's warps): those take 128 x 128 x 32 (2 x 48 KB).
TC_ASYNC_RUN = ("128x128x64", "128x128x32")
TC_ASYNC_DEFAULT = "128x128x32"  # static shared memory: fits every sm_80+ part
_TCA = TC_ASYNC_TILES[TC_ASYNC_DEFAULT]
TC_ASYNC_TILE = (_TCA.bm, _TCA.bn, _TCA.bk)
TC_ASYNC_WARPS = _TCA.warps_m * _TCA.warps_n
TC_ASYNC_PREFIX = "gemm.tc_async_"
TC_ASYNC_KERNEL = TC_ASYNC_PREFIX + TC_ASYNC_DEFAULT
TC_ASYNC_ENABLED = True
# shared memory the CUDA runtime keeps per resident block on compute capability 8.x / 9.0
# (CUDA C++ Programming Guide, "Shared Memory" of those compute capabilities: 1 KB)
SMEM_RESERVED_PER_BLOCK = 1024


class WgmmaTile(NamedTuple):
    """One build of the Hopper GEMM (kernels_cuda.gemm_wgmma.gemm_wgmma_kernel): a bm x bn
    block tile over K tiles of 64 (one 128-byte swizzle row of halves), bm / 64 warpgroups
    of 64 x bn each (one wgmma.m64n{bn}k16 per K step of 16), `stages` shared buffers filled
    by cp.async, launch bounds of `min_blocks` blocks per SM, and `pending` wgmma groups
    left in flight past a K tile (0: each tile's products complete before the next tile's
    barrier; 1: they overlap the next tile's wait and barrier, the copies then reuse the
    buffer of two tiles back)."""
    bm: int
    bn: int
    stages: int
    min_blocks: int = 1
    pending: int = 0
    bk: int = 64

    @property
    def threads(self) -> int:
        return 128 * (self.bm // 64)

    @property
    def shared_bytes(self) -> int:
        """Every stage's A and B tiles of halves, and 1 KB to start them on a 1024-byte
        boundary (the swizzle is of absolute shared addresses); always dynamic."""
        return self.stages * (self.bm + self.bn) * self.bk * 2 + 1024


# Builds of the Hopper GEMM, compared on a GPU by bench/gpu_probe_gemm.py; WGMMA_RUN are run
# where the device is compute capability 9.0 and the blocks fit (wgmma_fits).
WGMMA_TILES = {
    "wg128x128": WgmmaTile(128, 128, 4),
    "wg128x128.b2": WgmmaTile(128, 128, 3, min_blocks=2),
    "wg128x128.p1": WgmmaTile(128, 128, 4, pending=1),
    "wg128x256": WgmmaTile(128, 256, 4),
    "wg128x256.p1": WgmmaTile(128, 256, 4, pending=1),
    # 4 warpgroups: 85 FLOP per byte of tile copied (128 x 128: 64), 16 warps a SM at 1 block
    "wg256x128": WgmmaTile(256, 128, 4),
    "wg256x128.s3": WgmmaTile(256, 128, 3),
    "wg256x128.p1": WgmmaTile(256, 128, 4, pending=1),
}
WGMMA_RUN = ("wg128x128.b2",)
WGMMA_ENABLED = True
WGMMA_PREFIX = "gemm.wgmma_"
WGMMA_CC = (9, 0)  # wgmma is sm_90a's: Hopper only (not 8.x, not 10.x)


# Builds of the wgmma flash attention (kernels_cuda.attention_wgmma), name -> (keys per K/V
# tile, stages, warpgroups of 64 query rows): one warpgroup (2 blocks per SM at d = 128 with 2
# stages), 128-key tiles, or 2 warpgroups sharing each K/V tile (FlashAttention-3's choice).
# Prepared 2026-11-27d and checked under the simulator and ptxas only: bench/gpu_probe_attention.py
# times them (variants of these names) on a Hopper GPU.  Off in the dispatcher until then
# (TC_ATTN_WGMMA_ENABLED, or params["wgmma"] per call); TC_ATTN_WGMMA_BUILD is what it runs.
WGMMA_ATTN_BUILDS = {"wg64": (64, 3, 1), "wg64s2": (64, 2, 1), "wg128k": (128, 2, 1), "wg64x2": (64, 2, 2)}
TC_ATTN_WGMMA_ENABLED = False
TC_ATTN_WGMMA_BUILD = "wg64s2"


def wgmma_attention_kernel_name(d: int, build: str) -> str:
    return f"attention.wgmma_d{d}_{build}"


def wgmma_attention_shared_bytes(d: int, bk: int, stages: int, nwg: int) -> int:
    """Dynamic shared memory of kernels_cuda.attention_wgmma's kernel: the block's Q tile (64
    rows a warpgroup), `stages` K and V tiles of bk keys, and 1 KB to align them to 1024."""
    return (64 * nwg + stages * 2 * bk) * d * 2 + 1024


def wgmma_kernel_name(build: str, trans_b: bool = False) -> str:
    return WGMMA_PREFIX + build + (".nk" if trans_b else "")


def wgmma_fits(build: str, smem_per_block_optin: int, smem_per_sm: int) -> bool:
    t = WGMMA_TILES[build]
    return (t.shared_bytes <= smem_per_block_optin
            and t.min_blocks * (t.shared_bytes + SMEM_RESERVED_PER_BLOCK) <= smem_per_sm)


def tc_async_kernel_name(build: str, trans_b: bool = False) -> str:
    """The kernel name of a TC_ASYNC_TILES build, as launches and bench.ptx give it."""
    return TC_ASYNC_PREFIX + build + (".nk" if trans_b else "")


def tc_async_fits(build: str, smem_per_block_optin: int, smem_per_sm: int) -> bool:
    """Whether a device holds the build's min_blocks blocks per SM in shared memory (and
    allows one block that much: the dynamic opt-in above 48 KB)."""
    t = TC_ASYNC_TILES[build]
    return (t.shared_bytes <= smem_per_block_optin
            and t.min_blocks * (t.shared_bytes + SMEM_RESERVED_PER_BLOCK) <= smem_per_sm)


# The GEMV kernel for few rows (decode: M <= GEMV_MAX_M by the dispatcher's rule): each
# output column is one warp's dot products over K (the (N, K) weight) or one thread's
# (a (K, N) b), for up to GEMV_MAX_M rows of A at once (accumulators in registers).
GEMV_MAX_M = 8
GEMV_WARPS = 4
# A decode GEMV is bound by the loads in flight, not by bandwidth alone: on the H200
# (2026-11-26, bench/gpu_results/2026-11-26b-h200) the GEMV with one dependent 64-byte warp
# load at a time ran 1x4096 @ 4096x4096 float16 in 323 us (0.10 TB/s).  Each warp now issues
# GEMV_UNROLL independent loads per step, and a (K, N) b is read by GEMV_KN_WARPS warps
# per block (Little's law: ~40 KB in flight per SM for the H200's 4.8 TB/s at ~1 us latency).
GEMV_UNROLL = 8
GEMV_KN_WARPS = 16


def gemv_unroll(rows: int) -> int:
    """Weight loads per warp step of the GEMV build for `rows` rows per pass: GEMV_UNROLL for
    one row, half for GEMV_MAX_M (8 x U values of A besides U weights: at U = 8 its (K, N)
    kernel spilled 100-184 bytes at 128 registers, ptxas sm_90)."""
    return GEMV_UNROLL if rows == 1 else GEMV_UNROLL // 2


def gemv_kn_columns(itemsize: int) -> int:
    """Columns of a (K, N) b per block of the GEMV: one 32-byte sector of a row (float16 16,
    float32 8, float64 4), its 32 // columns lanes on as many consecutive rows of K."""
    return max(1, min(32, 32 // itemsize))


def gemm_threads(tile: str) -> int:
    bm, bn, bk, tm, tn = GEMM_TILES[tile]
    return (bm // tm) * (bn // tn)


def gemm_shared_bytes(tile: str, itemsize: int = 4) -> int:
    bm, bn, bk, tm, tn = GEMM_TILES[tile]
    return bk * ((bm + 1) + (bn + 1)) * itemsize


# Flash attention: head-dim bucket DMAX -> (DMAX, BQ query rows per block); key tiles of
# ATTN_BK keys, ATTN_WARPS warps per block.  D > 128 would need more than 48 KB of static
# shared memory.
ATTN_BK = 32
ATTN_WARPS = 4
ATTN_TILES = {64: (64, 16), 128: (128, 16)}
# float16 attention on tensor cores (kernels_cuda.attention.flash_tc_kernel): blocks of
# TC_ATTN_WARPS warps own TC_ATTN_BQ query rows (16 per warp: one mma row tile) against K/V
# tiles of TC_ATTN_BK[d] keys, for head dims exactly d in TC_ATTN_BK.  The
# FlashAttention-2 forward's usual shape (4 warps, 64-row tiles); 32-key tiles at d = 128,
# where 64 spilled 160-376 bytes on sm_80/87 at 255 registers (ptxas).  On the H200
# (2026-11-27, bench/gpu_results/2026-11-27-h200) causal (1, 32, 4096, 128) ran 2.58 ms, then
# 1.18 ms with the K/V loads' index arithmetic cut and V's loads overlapping QK^T (PyTorch
# 0.29 ms); the loads at constant offsets from one address came after that run (ptxas, d =
# 128: 1163 instead of 1412 instructions per tile, 233 registers instead of 255 and no
# spill on sm_80/87), not yet timed.  Shared memory: K BK x (d/2 + 4) words + V^T d x (BK/2 + 4) words: 18 KB at
# d = 64 and at d = 128.
TC_ATTN_BQ = 64
TC_ATTN_BK = {64: 64, 128: 32}
TC_ATTN_WARPS = 4
# The pipelined tensor-core attention (kernels_cuda.attention.flash_tc_async_kernel): K and V
# tiles copied global -> shared by cp.async into TC_ATTN_ASYNC_STAGES buffers (tiles j + 1 ..
# j + STAGES - 1 in flight while tile j is computed, one barrier per tile), rows of 16-byte
# chunks XOR-swizzled instead of padded, fragments by ldmatrix (.trans for V); the same
# mma layout per warp (16 query rows, Q in registers) as flash_tc_kernel.  A stage is a K and
# a V tile of BK x d halves: 16 KB for BK = 64 at d = 64 and BK = 32 at d = 128 (64 at d = 128
# would be 32 KB a stage: two stages exceed the 48 KB of static shared memory), so 3 stages
# fill 48 KB, as the GEMM's pipeline (TcAsyncTile.stages; CUTLASS's sm80 f16 kernels use 3-5).
# Warps per block: a block's K/V tiles serve its BQ = 16 x warps rows, so 8 warps (128 rows,
# FlashAttention-2's forward block) read half the K/V bytes per query row of 4 (causal
# (1, 32, 4096, 128): 1.1 GB instead of 2.2 GB from L2), but 4 warps won at every shape
# measured on the H200 (2026-11-27, bench/gpu_results/2026-11-27b-h200/call2/attn_probe.log,
# GPU time, 4 / 8 warps / flash_tc_kernel / PyTorch SDPA): causal (1, 32, 4096, 128) 592 /
# 667 / 1219 / 263 us, (1, 12, 512, 64) 12.6 / 16.9 / 19.2 / 11.1, causal (1, 32, 512, 128)
# 24.9 / 26.8 / 43.0 / 14.7, causal (1, 12, 2048, 64) 50.9 / 59.6 / 99.3 / 33.8,
# (4, 16, 1024, 128) 160.9 / 177.5 / 298.6 / 61.6; 2 stages instead of 3 changed nothing
# (664 against 667 us at 8 warps).  TC_ATTN_ASYNC_PROBED_WARPS: the block sizes bench.ptx
# builds (the probe compares them).
TC_ATTN_ASYNC_BK = {64: 64, 128: 32}
TC_ATTN_ASYNC_STAGES = 3
TC_ATTN_ASYNC_WARPS = 4          # 64 query rows a block
TC_ATTN_ASYNC_PROBED_WARPS = (4, 8)
TC_ATTN_ASYNC_ENABLED = True


def tc_attn_async_kernel(d: int, warps: int) -> str:
    """The launch name of the pipelined attention kernel for head dim d and blocks of warps."""
    return f"attention.tc_async_d{d}_bq{16 * warps}"


def tc_attn_async_shared_bytes(d: int, bk: int = 0, stages: int = 0) -> int:
    """Static shared memory of the pipelined attention kernel: per stage a K and a V tile of
    bk x d halves (bk, stages: the TC_ATTN_ASYNC_* defaults when 0)."""
    return (stages or TC_ATTN_ASYNC_STAGES) * 2 * (bk or TC_ATTN_ASYNC_BK[d]) * d * 2


# The decode kernel (kernels_cuda.attention.decode_kernel): few query rows per (batch, kv head),
# the KV length split over the grid.  A key's row of D elements is read by D / vec lanes in
# 16-byte vectors (float16 D = 128: 16 lanes, so a warp takes 2 keys a step), each lane its
# vec dims of q, K, V and the output; DECODE_UNROLL steps of keys a warp has in flight (two
# 16-byte loads each: 64 bytes a lane).  Up to DECODE_MAX_ROWS rows (GQA group x Sq): each
# lane holds rows x vec values of q and of the output in registers (float32), and its keys'
# K and V vectors as loaded (4 words each: 4 steps spilled on sm_80 at 1 row; 2 do not, ptxas
# 2026-11-27).  DECODE_BLOCKS_PER_SM
# blocks per SM is what the split count aims at, and each split takes at least
# DECODE_MIN_KEYS keys (a few of a block's unrolled steps: 4 warps x 2 keys x 2 for float16
# D = 128).
# The scalar flash kernel's split-KV decode read K and V 2 bytes a load: llama-7b decode
# (1, 32, 1, 128) against 4096 keys took 206 us on the H200, this kernel 34.7 (float32 49.0
# against 206.7), PyTorch 24 (float32 399) (bench/gpu_results/2026-11-27b-h200 calls 1, 2).
DECODE_WARPS = 4
DECODE_UNROLL = 2
DECODE_MAX_ROWS = 4
# More rows (GQA groups of 7-8: Llama-3-70B, Qwen2; or Sq > 1 for speculative decoding) take
# several blocks of up to DECODE_MAX_ROWS rows a (batch, kv head), each reading the same K/V
# (the later ones from L2): up to this many groups.  Not timed on a GPU (2026-11-27b).
DECODE_MAX_ROW_GROUPS = 4
DECODE_BLOCKS_PER_SM = 4
DECODE_MIN_KEYS = 32
DECODE_HEAD_DIMS = (64, 128)


def attn_tile_for(d: int):
    """(DMAX, BQ) of the smallest tile that holds head dim d, or None."""
    for dmax in sorted(ATTN_TILES):
        if d <= dmax:
            return ATTN_TILES[dmax]
    return None


def attn_shared_bytes(dmax: int, bq: int, itemsize: int = 4) -> int:
    """Q tile, K^T tile (padded), V tile and the score tile."""
    return itemsize * (bq * dmax + ATTN_BK * (dmax + 1) + ATTN_BK * dmax + bq * ATTN_BK)
