"""Weight-only low precision linear: out = act(x @ dequant(W).T + bias), x float32 (M, K),
W (N, K) stored as float16, bfloat16 (its 16-bit patterns, uint16) or int8 with a float32
scale (and zero point) per output row; float32 accumulation.  The weight is widened in
registers inside the loop: no float32 copy of it is ever made (run_gemv; the GEMM path for
many rows widens each packed panel in the task that reads it: pack_b16, pack_bq8).

run_gemv (decode, M = 1..~8): workers take blocks of NB output rows (longer runs of the
weight when M = 1: row_task_rows).  A task walks its rows in groups of TB = 4 weight rows;
for each group and each group of up to TA rows of x, the `wo_tile` intrinsic computes the
TA x TB dot products over K with TA * TB vector accumulators: per step, TB loads of W
vectors of 16-bit / 8-bit weights, widened in registers (bfloat16: zero-extend to 32 bits
and shift left 16; float16: fpext <W x half>, which LLVM lowers to vcvtph2ps; int8:
sign-extend and sitofp), TA loads of x and TA * TB FMAs; while a group streams, the next
group's rows are prefetched (llvm.prefetch), so each group is read from L2 after the
first.  A weight byte is read from memory once per call when M <= TA (all x rows of the
call in one group).  int8: the dot product is taken with the raw integers q; the zero point
enters through the row sum of x and the per-row scale once after the dot product:
out[m, n] = scale[n] * (sum_k x[m, k] q[n, k] - zp[n] sum_k x[m, k]).

Vector width: 16 float32 lanes (zmm) where the target has avx512f, else 8 (ymm: AVX2 +
F16C + FMA, every x86-64 host with AVX2 has F16C), chosen by run_gemv's `wide` argument, so
tests run the 8-lane path on an AVX-512 host too.  fmt and wide are numba literals of the
worker (wo_worker): a call compiles only its format's and width's tiles.  The bias and
activation run after each task's rows are stored, in place, by the GEMM's epilogue
(gemm.gemm_epilogue, one small function per activation, called by address): with the
activation a literal of the worker too, each activation compiled a whole worker again
(a float16 decode GEMV with none, relu, gelu, gelu_tanh and silu in turn: 1.2-1.8 s of
first call for each after the first, Zen 4 VM, 2026-12-01).
TA x TB: 16 lanes: TA up to 4 (16 zmm accumulators + 4 weight vectors + 1 x vector of 32
registers); 8 lanes: TA up to 2 (8 + 4 + 1 of 16 ymm).

pack_b16 / pack_bq8 (many rows: dispatch/ops/weight_only.py's WO_GEMV_ROWS; pack_b16 also
a 16-bit matmul b): the GEMM's own B packers for 16-bit patterns and for int8 values with
their row's scale and zero point, each task widening the panels it reads
(dispatch/ops/linalg.py widening_gemm_launch).
gemv_kn16 (a 16-bit matmul b stored (K, N), few rows): gemm.gemv_kn's slabs on the
patterns, widened in L1.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from kernels_common.quant import WEIGHT_BF16, WEIGHT_F16, WEIGHT_INT8

from . import target
from .approx import OVERLOAD, JIT_BY_ADDRESS, wide_loops
from .half import from_bf16, from_f16
from . import gemm as G
from .gemm import P_B, P_BP, P_COUNT, P_K, P_N, P_NB, PACK_PF_ROWS, _a4, _pack_strided, _tnr, epilogue_address
from .parallel import c_array_at, call_address, fetch_add, num_threads, prefetch, run_at, worker_address
from .dot_tile import emit_tile
from .llvm_ir import arg_readers

TB = 4        # weight rows per tile
TA_WIDE = 4   # x rows per tile with 16 lanes (16 + 4 + 1 of 32 zmm)
TA_NARROW = 2  # with 8 lanes (8 + 4 + 1 of 16 ymm)
# Output rows per gemv task with 2+ rows of x: 64 rows = 172 tasks at N = 11008, enough for
# dynamic balance on 2 threads; a task's buffers (TA_WIDE x NB float32) stay in L1.  Not
# tuned separately.
NB = 64
# With one row of x (decode) a task is a longer run of the weight: about ROW_TASK_BYTES, but
# at least ROW_TASKS_PER_THREAD tasks a thread and never under NB rows (row_task_rows).
# 1x4096x11008, 4 weights cycled past the L3, one process, medians of 5 x 8 calls, 64-row
# tasks / row_task_rows' (Zen 4 VM, 2 threads, 2026-12-06, /tmp/w/woab.py), ms:
#   fast-memory phases (a prange sum of the bytes 1.57-1.74 ms; int8 0.82):
#     float16 2.122 / 2.055, 2.142 / 2.068; bfloat16 2.211 / 2.222; int8 0.955 / 0.910
#   slow phases (read 2.71-2.86; int8 1.28-1.37): bfloat16 2.991 / 2.869, 2.893 / 2.823,
#     2.912 / 2.901, 2.915 / 2.896; int8 1.375 / 1.284, 1.428 / 1.374, 1.384 / 1.315,
#     1.449 / 1.365, 1.441 / 1.344; float16 3.072 / 2.985, 2.789 / 2.782
# (3% on the median): each thread's share of the weight in fewer, longer sequential runs.
# Streaming one weight row at a time instead of the 4-row groups (no software prefetch)
# won in some fast phases (bfloat16 1.89-1.95 against 2.04-2.18 ms) and lost in others
# (2.34-2.47 against 2.21; int8 1.05-1.17 against 0.95-0.99): not kept.
ROW_TASK_BYTES = 4 << 20
ROW_TASKS_PER_THREAD = 4


def row_task_rows(n, k, itemsize, threads):
    """Rows of W per task when x has one row: ROW_TASK_BYTES of the weight, or fewer so that
    each of `threads` threads gets ROW_TASKS_PER_THREAD tasks, never fewer than NB."""
    by_bytes = -(-ROW_TASK_BYTES // max(1, k * itemsize))
    return max(NB, min(by_bytes, n // (ROW_TASKS_PER_THREAD * max(1, threads))))


def host_has_avx512() -> bool:
    """Whether numba compiles for a target with AVX-512 F (kernels_cpu/target.py)."""
    return target.has("avx512f")


def host_lanes() -> int:
    """float32 lanes of the vectors run_gemv uses on this host by default."""
    return 16 if host_has_avx512() else 8


@intrinsic
def wo_tile(typingctx, fmt, lanes, ta, kl, x, x0, x1, x2, x3, w, w0, w1, w2, w3, q0, q1, q2, q3, t):
    """t[i*TB + j] = sum over k < kl of x[x_i + k] * widen(w[w_j + k]) for the ta (literal,
    1..4) rows of x at offsets x0..x3 and the TB rows of w at offsets w0..w3 (flat arrays;
    x float32, w uint16 holding float16 / bfloat16 bits or int8, per the literal fmt),
    prefetching the w rows at offsets q0..q3 on the way (the next group).  lanes (literal 8
    or 16): float32 lanes per vector.  int8 is widened to its integer value (the caller
    applies zero point and scale).  The IR is dot_tile's (emit_tile) with the weight loads
    widened."""
    for lit in (fmt, lanes, ta):
        if not isinstance(lit, types.IntegerLiteral):
            return None
    f, width, nta = fmt.literal_value, lanes.literal_value, ta.literal_value
    if not (isinstance(x, types.Array) and x.dtype == types.float32 and isinstance(w, types.Array)
            and isinstance(t, types.Array) and t.dtype == types.float32 and 1 <= nta <= 4 and width in (8, 16)):
        return None
    want = types.int8 if f == WEIGHT_INT8 else types.uint16
    if w.dtype != want or f not in (WEIGHT_F16, WEIGHT_BF16, WEIGHT_INT8):
        return None
    sig = types.none(fmt, lanes, ta, kl, x, x0, x1, x2, x3, w, w0, w1, w2, w3, q0, q1, q2, q3, t)

    def codegen(context, builder, sig, args):
        fty = ir.FloatType()
        vty = ir.VectorType(fty, width)
        i32 = ir.IntType(32)
        wbits = 8 if f == WEIGHT_INT8 else 16
        wint = ir.IntType(wbits)
        wvty = ir.VectorType(wint, width)
        wsize = wbits // 8

        i64_of, data = arg_readers(context, builder, sig, args)
        xrows = [builder.gep(data(4), [i64_of(5 + i)]) for i in range(nta)]
        wrows = [builder.gep(data(9), [i64_of(10 + j)]) for j in range(TB)]
        qrows = [builder.gep(data(9), [i64_of(14 + j)]) for j in range(TB)]

        def widen(v, vec):
            """float32 (vector or scalar) of 16/8-bit weights v."""
            ity = ir.VectorType(i32, width) if vec else i32
            if f == WEIGHT_INT8:
                return builder.sitofp(builder.sext(v, ity), vty if vec else fty)
            if f == WEIGHT_BF16:
                sh = ir.Constant(ity, [16] * width) if vec else ir.Constant(i32, 16)
                return builder.bitcast(builder.shl(builder.zext(v, ity), sh), vty if vec else fty)
            hty = ir.VectorType(ir.HalfType(), width) if vec else ir.HalfType()
            return builder.fpext(builder.bitcast(v, hty), vty if vec else fty)

        emit_tile(builder, xrows, wrows, qrows, i64_of(3), width, fty, wsize, data(18),
                  lambda ptr: widen(builder.load(builder.bitcast(ptr, wvty.as_pointer()), align=wsize), True),
                  lambda ptr: widen(builder.load(ptr), False))
        return context.get_dummy_value()

    return sig, codegen


def _tile(fmt, wide, ta, kl, x, xo, w, wo, q, t):
    """wo_tile for the literal fmt / wide of the call and a runtime ta (1, 2 or 4 rows of
    x): one inlined copy per ta, so a kernel holds only its format's and width's tiles."""


@overload(_tile, inline="always", **OVERLOAD)
def _tile_overload(fmt, wide, ta, kl, x, xo, w, wo, q, t):
    if not (isinstance(w, types.Array) and isinstance(fmt, types.IntegerLiteral)
            and isinstance(wide, types.BooleanLiteral)):
        return None
    if wide.literal_value:
        def tile_wide(fmt, wide, ta, kl, x, xo, w, wo, q, t):
            if ta == 1:
                wo_tile(fmt, 16, 1, kl, x, xo[0], xo[1], xo[2], xo[3], w, wo[0], wo[1], wo[2], wo[3],
                        q[0], q[1], q[2], q[3], t)
            elif ta == 2:
                wo_tile(fmt, 16, 2, kl, x, xo[0], xo[1], xo[2], xo[3], w, wo[0], wo[1], wo[2], wo[3],
                        q[0], q[1], q[2], q[3], t)
            else:
                wo_tile(fmt, 16, 4, kl, x, xo[0], xo[1], xo[2], xo[3], w, wo[0], wo[1], wo[2], wo[3],
                        q[0], q[1], q[2], q[3], t)
        return tile_wide

    def tile_narrow(fmt, wide, ta, kl, x, xo, w, wo, q, t):
        if ta == 1:
            wo_tile(fmt, 8, 1, kl, x, xo[0], xo[1], xo[2], xo[3], w, wo[0], wo[1], wo[2], wo[3],
                    q[0], q[1], q[2], q[3], t)
        else:
            wo_tile(fmt, 8, 2, kl, x, xo[0], xo[1], xo[2], xo[3], w, wo[0], wo[1], wo[2], wo[3],
                    q[0], q[1], q[2], q[3], t)
    return tile_narrow


# The int64 argument block of wo_worker: addresses, sizes, the task counter.
(W_X, W_W, W_SCALE, W_ZP, W_BIAS, W_OUT, W_XSUM, W_M, W_N, W_K, W_NEXT, W_EPI, W_ROWS, W_COUNT) = range(14)


def _weight_zero(fmt):
    return np.uint16(0)


@overload(_weight_zero, **OVERLOAD)
def _weight_zero_overload(fmt):
    """A zero of the weight's element type for the literal fmt (int8, else 16-bit patterns)."""
    if not isinstance(fmt, types.IntegerLiteral):
        return None
    if fmt.literal_value == WEIGHT_INT8:
        return lambda fmt: np.int8(0)
    return lambda fmt: np.uint16(0)


@njit(**JIT_BY_ADDRESS)
def wo_worker(wk, params, fmt, wide):
    """A worker (parallel.run_workers) of run_gemv: tasks of W_ROWS output rows taken from
    the W_NEXT counter.  fmt and wide are literals: a worker holds one format's and width's
    tiles (one kernel holding every variant took 11.8 s to compile; as a prange kernel with
    literal flags 4.6 s, parfor lowering 1.9 s of it); bias + activation by the W_EPI
    epilogue (gemm_epilogue's address) on the task's block of out, in place."""
    p = c_array_at(params, np.int64(0), (W_COUNT,))
    M, N, K = p[W_M], p[W_N], p[W_K]
    xf = c_array_at(p[W_X], np.float32(0), (M * K,))
    wf = c_array_at(p[W_W], _weight_zero(fmt), (N * K,))
    scale = c_array_at(p[W_SCALE], np.float32(0), (N,))
    zp = c_array_at(p[W_ZP], np.float32(0), (N,))
    out2 = c_array_at(p[W_OUT], np.float32(0), (M, N))
    xsum = c_array_at(p[W_XSUM], np.float64(0), (M,))
    tamax = TA_WIDE if wide else TA_NARROW
    rows = p[W_ROWS]
    ntask = (N + rows - 1) // rows
    acc = np.empty((M, rows), np.float32)
    t = np.empty(4 * TB, np.float32)
    xo = np.zeros(4, np.int64)
    wo = np.zeros(TB, np.int64)
    q = np.zeros(TB, np.int64)
    task = fetch_add(p, W_NEXT, 1)
    while task < ntask:
        n0 = task * rows
        nl = min(rows, N - n0)
        for g in range(0, nl, TB):
            for j in range(TB):
                wo[j] = (n0 + min(g + j, nl - 1)) * K       # an edge group repeats its last row
                q[j] = (n0 + min(g + TB + j, nl - 1)) * K   # the next group (the last: itself)
            for m0 in range(0, M, tamax):
                ta = min(tamax, M - m0)
                if ta == 3:
                    ta = 4
                for i in range(4):
                    xo[i] = min(m0 + i, M - 1) * K
                _tile(fmt, wide, ta, K, xf, xo, wf, wo, q, t)
                for i in range(min(tamax, M - m0)):
                    for j in range(min(TB, nl - g)):
                        acc[m0 + i, g + j] = t[i * TB + j]
        if fmt == WEIGHT_INT8:
            for m in range(M):
                for j in range(nl):
                    n = n0 + j
                    acc[m, j] = np.float32(scale[n] * (np.float64(acc[m, j]) - np.float64(zp[n]) * xsum[m]))
        for m in range(M):
            for j in range(nl):
                out2[m, n0 + j] = acc[m, j]
        call_address(p[W_EPI], (p[W_OUT] + n0 * 4, N, M, nl, p[W_BIAS] + n0 * 4))
        task = fetch_add(p, W_NEXT, 1)


@njit(cache=True, nogil=True)
def _gemv_params(p, x2, w2, scale, zp, bias, out2, xsum):
    """Fill wo_worker's argument block p; its address back.  In numba an array's address costs nothing, in
    Python 1.6-1.9 us (ctypes), which made a 1x768x768 GEMV 8 us slower than the prange
    kernel it replaced.  No calls and no allocation here: a launcher that also ran the
    workers added 0.6-1.0 s to the cold first call."""
    p[W_X], p[W_W], p[W_SCALE], p[W_ZP] = x2.ctypes.data, w2.ctypes.data, scale.ctypes.data, zp.ctypes.data
    p[W_BIAS], p[W_OUT], p[W_XSUM] = bias.ctypes.data, out2.ctypes.data, xsum.ctypes.data
    p[W_M], p[W_N], p[W_K], p[W_NEXT] = x2.shape[0], w2.shape[0], x2.shape[1], 0
    return p.ctypes.data


# scale, zero point and row sums of the 16-bit formats: never read (writeable, as every
# caller's arrays are: a read-only one would type, and compile, _gemv_params again)
_NO_ROWS = np.zeros(1, np.float32)


def run_gemv(x2, w2, fmt, scale, zp, bias, code, wide, out2):
    """out2 = act(x2 @ dequant(w2).T + bias): x2 (M, K) float32, w2 (N, K) uint16 (fmt
    WEIGHT_F16 / WEIGHT_BF16 bits) or int8 (fmt WEIGHT_INT8, scale / zp (N,) float32 per
    output row, unused otherwise), bias (N,) float32, code an ACT_*, out2 (M, N) float32;
    all C-contiguous.  wide: 16-lane vectors (AVX-512 targets only), else 8.  On numba's
    threads (wo_worker), the calling thread alone when there is one task."""
    if fmt == WEIGHT_INT8:
        # the zero point enters through the row sums of x (module docstring)
        xsum = x2.sum(axis=1, dtype=np.float64)
    else:
        scale = zp = xsum = _NO_ROWS
    p = np.empty(W_COUNT, np.int64)  # alive until the workers are done
    addr = _gemv_params(p, x2, w2, scale, zp, bias, out2, xsum)
    p[W_EPI] = epilogue_address(np.float32, code)
    n, threads = w2.shape[0], num_threads()
    p[W_ROWS] = row_task_rows(n, x2.shape[1], w2.itemsize, threads) if x2.shape[0] == 1 else NB
    run_at(worker_address(wo_worker, (int(fmt), bool(wide))), addr, min(threads, -(-n // p[W_ROWS])))


# K elements per step of _widen_panel: each step widens NR rows x WIDEN_KB into a row-major
# scratch (48 x 256 float32 = 48 KiB at the 8x48 tile: L2), then transposes it into the
# panel with the GEMM's own register-transposing packer.
WIDEN_KB = 256


@njit(inline="always")
def _widen_panel(w2, row0, rows, K, nr, fmt, scale, zp, flat, d0, tmp):
    """flat[d0:] = the packed B panel (gemm's layout for B stored (N, K), nr wide, zeros past
    `rows`) of w2's rows row0.. dequantized (int8: scale and zero point per row) or widened
    (16-bit): WIDEN_KB of each row into the row-major tmp (nr x WIDEN_KB), then transposed
    into the panel by the GEMM's own register-transposing packer (gemm._pack_strided)."""
    for k0 in range(0, K, WIDEN_KB):
        kb = min(WIDEN_KB, K - k0)
        for r in range(rows):
            n = row0 + r
            src = w2[n, k0:k0 + kb]
            d = tmp[r * kb:(r + 1) * kb]
            if fmt == WEIGHT_INT8:
                s = scale[n]
                z = zp[n]
                for k in range(kb):
                    d[k] = (np.float32(src[k]) - z) * s
            else:
                _widen16(src, d, kb, fmt)
        _pack_strided(tmp, 0, kb, rows, kb, flat, d0 + k0 * nr, nr)


@njit(**JIT_BY_ADDRESS)
def pack_b16(j, params, fmt, ti, transposed):
    """gemm_parallel's pack_b for a 16-bit B (its bit patterns as uint16, fmt WEIGHT_F16 or
    WEIGHT_BF16): B panel j widened to float32 into gemm's panel layout (its _pack_b_n /
    _pack_b_t), B (K, N) or, transposed, stored (N, K).  Called by the GEMM's tasks right
    before their micro-kernels read the panel (a 16-bit matmul's b or linear's weight: no
    float32 copy of it, and the panel is in the task's own L2; dispatch/ops/linalg.py
    widening_gemm_launch)."""
    z = np.float32(0)
    nr = _tnr(z, ti)
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    N, K, nb = p[P_N], p[P_K], p[P_NB]
    npan = (N + nr - 1) // nr
    bi = j // npan
    j0 = (j - bi * npan) * nr
    nrows = min(nr, N - j0)
    src = c_array_at(p[P_B], np.uint16(0), (nb * N * K,))
    dst = c_array_at(p[P_BP], z, ((j + 1) * K * nr,))
    base = bi * N * K
    d0 = j * K * nr
    if transposed:  # nr rows of K, as pack_bq8 packs an int8 weight's rows
        tmp = np.empty(nr * WIDEN_KB, np.float32)
        _widen_panel(src.reshape((nb * N, K)), bi * N + j0, nrows, K, nr, fmt, tmp, tmp, dst, d0, tmp)
        return
    for k in range(K):  # a row's nr values are contiguous: widened straight into the panel
        s = base + k * N + j0
        if k + PACK_PF_ROWS < K:
            prefetch(src, s + PACK_PF_ROWS * N)
        d = d0 + k * nr
        _widen16(src[s:s + nrows], dst[d:d + nrows], nrows, fmt)
        for r in range(nrows, nr):
            dst[d + r] = z


# gemv_kn16: columns of B widened per step, GEMV_KN_ROWS rows of them at a time into an L1
# scratch (8 x 512 float32: 16 KiB)
GEMV16_COLS = 512


def gemv_kn16(a3, b3, a_idx, b_idx, transa, fmt, bias, epilogue, code, out3, nworkers):
    """gemm.gemv_kn for a 16-bit B: b3 (Bb, K, N) the bit patterns (uint16) of a float16 /
    bfloat16 (fmt) B stored (K, N), read from memory once, with no float32 copy of it: the
    slab workers (gemv_kn16_worker) widen GEMV_KN_ROWS rows x GEMV16_COLS columns at a time
    into an L1 scratch and sum them into the partials as gemv_kn's own workers do (the same
    products in the same order: the float32 gemv's bits on the widened B); gemv_kn's second
    pass adds the partials with the epilogue.  a3, bias, out3 float32."""
    G.gemv_kn(a3, b3, a_idx, b_idx, transa, bias, epilogue, code, out3, nworkers,
              slabs=worker_address(gemv_kn16_worker, (int(fmt),)))


@njit(**JIT_BY_ADDRESS)
def gemv_kn16_worker(w, params, fmt):
    """gemv_kn's first pass (slabs of K into partial sums) on a 16-bit B (gemv_kn16)."""
    wide_loops()
    p = c_array_at(params, np.int64(0), (G.V_COUNT,))
    z = np.float32(0)
    nbatch, M, N, K, ns = p[G.V_NBATCH], p[G.V_M], p[G.V_N], p[G.V_K], p[G.V_NS]
    transa = p[G.V_TRANSA] != 0
    a_idx = c_array_at(p[G.V_AIDX], np.int64(0), (nbatch,))
    b_idx = c_array_at(p[G.V_BIDX], np.int64(0), (nbatch,))
    part = c_array_at(p[G.V_PART], z, (nbatch, ns, M, N))
    R = G.GEMV_KN_ROWS
    C = GEMV16_COLS
    tmp = np.empty(R * C, np.float32)
    while True:
        t = fetch_add(p, G.V_NEXT, 1)
        if t >= nbatch * ns:
            break
        bi, k0, k1, acc = G.gemv_kn_slab(part, t, ns, K)
        a = c_array_at(p[G.V_A] + a_idx[bi] * M * K * 4, z, (K, M) if transa else (M, K))
        b = c_array_at(p[G.V_B] + b_idx[bi] * K * N * 2, np.uint16(0), (K, N))
        k = k0
        while k < k1:
            kr = min(R, k1 - k)
            for j0 in range(0, N, C):
                jn = min(C, N - j0)
                if kr == R:
                    # gemv_kn_worker's expression on B widened as it is read (its sums, bit for
                    # bit): widening 8 rows into an L1 scratch first and summing from there
                    # took 2.92 ms for 1 x 4096 @ 4096 x 4096 float16 from DRAM, 11.5 GB/s,
                    # where the float32 GEMV streams its 64 MB at 33 (Zen 4, 2 threads, 2026-12-08)
                    b0, b1, b2, b3 = b[k, j0:j0 + jn], b[k + 1, j0:j0 + jn], b[k + 2, j0:j0 + jn], b[k + 3, j0:j0 + jn]
                    b4, b5, b6, b7 = (b[k + 4, j0:j0 + jn], b[k + 5, j0:j0 + jn], b[k + 6, j0:j0 + jn],
                                      b[k + 7, j0:j0 + jn])
                    for m in range(M):
                        arow = acc[m, j0:j0 + jn]
                        x0, x1, x2, x3 = _a4(a, transa, m, k)
                        x4, x5, x6, x7 = _a4(a, transa, m, k + 4)
                        if fmt == WEIGHT_BF16:
                            for j in range(jn):
                                arow[j] += (((x0 * from_bf16(b0[j]) + x1 * from_bf16(b1[j]))
                                             + (x2 * from_bf16(b2[j]) + x3 * from_bf16(b3[j])))
                                            + ((x4 * from_bf16(b4[j]) + x5 * from_bf16(b5[j]))
                                               + (x6 * from_bf16(b6[j]) + x7 * from_bf16(b7[j]))))
                        else:
                            for j in range(jn):
                                arow[j] += (((x0 * from_f16(b0[j]) + x1 * from_f16(b1[j]))
                                             + (x2 * from_f16(b2[j]) + x3 * from_f16(b3[j])))
                                            + ((x4 * from_f16(b4[j]) + x5 * from_f16(b5[j]))
                                               + (x6 * from_f16(b6[j]) + x7 * from_f16(b7[j]))))
                else:
                    for r in range(kr):
                        _widen16(b[k + r, j0:j0 + jn], tmp[r * C:r * C + jn], jn, fmt)
                    for m in range(M):
                        arow = acc[m, j0:j0 + jn]
                        for r in range(kr):
                            xk = a[k + r, m] if transa else a[m, k + r]
                            tr = tmp[r * C:r * C + jn]
                            for j in range(jn):
                                arow[j] += xk * tr[j]
            k += kr


# pack_bq8's extra slots in the GEMM's argument block (gemm.plan_args nextra): the addresses
# of the weight's per-row scale and zero point
PACK_BQ8_EXTRA = 2


@njit(**JIT_BY_ADDRESS)
def pack_bq8(j, params, ti):
    """gemm_parallel's pack_b for an int8 weight stored (N, K), one B: panel j dequantized
    ((q - zero point) * scale, per row, float32 (N,) arrays at slots P_COUNT and P_COUNT +
    1: PACK_BQ8_EXTRA) into gemm's panel layout for B stored (N, K) (_widen_panel); called
    by the GEMM's tasks right before their micro-kernels read the panel, as pack_b16 for a
    16-bit weight (dispatch/ops/linalg.py widening_gemm_launch)."""
    z = np.float32(0)
    nr = _tnr(z, ti)
    p = c_array_at(params, np.int64(0), (P_COUNT + PACK_BQ8_EXTRA,))
    N, K = p[P_N], p[P_K]
    j0 = j * nr
    src = c_array_at(p[P_B], np.int8(0), (N, K))
    scale = c_array_at(p[P_COUNT], z, (N,))
    zp = c_array_at(p[P_COUNT + 1], z, (N,))
    dst = c_array_at(p[P_BP], z, ((j + 1) * K * nr,))
    tmp = np.empty(nr * WIDEN_KB, np.float32)
    _widen_panel(src, j0, min(nr, N - j0), K, nr, WEIGHT_INT8, scale, zp, dst, j * K * nr, tmp)


def _widen16(src, d, K, fmt):
    """d[k] = the float32 of the 16-bit pattern src[k] (float16 or bfloat16 per fmt)."""


@overload(_widen16, inline="always", **OVERLOAD)
def _widen16_overload(src, d, K, fmt):
    if not (isinstance(src, types.Array) and src.dtype == types.uint16):
        return lambda src, d, K, fmt: None

    def impl(src, d, K, fmt):
        if fmt == WEIGHT_BF16:
            dv = d.view(np.uint32)
            for k in range(K):
                dv[k] = np.uint32(src[k]) << np.uint32(16)
        else:
            for k in range(K):
                d[k] = from_f16(src[k])
    return impl


_LANES = [host_lanes()]


def active_lanes() -> int:
    """The float32 lanes run_gemv runs with now (16: zmm, 8: ymm)."""
    return _LANES[0]


def use_lanes(lanes) -> int:
    """Run the GEMV path (run_gemv) with 8- or 16-lane vectors ("auto": the host's) from now on in this
    process and return the previous setting: the tests run the AVX2 path on an AVX-512 host
    with it.  16 lanes on a host without avx512f is refused (LLVM would split every vector
    in two: correct but never what a caller wants).  Not thread-safe against concurrent
    calls switching it."""
    if lanes == "auto":
        lanes = host_lanes()
    if lanes not in (8, 16):
        raise ValueError(f"use_lanes: expected 8, 16 or 'auto', got {lanes!r}")
    if lanes == 16 and not host_has_avx512():
        raise ValueError("use_lanes(16): this host has no avx512f")
    prev = _LANES[0]
    _LANES[0] = lanes
    return prev
