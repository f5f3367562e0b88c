"""Backward of matmul / linear with the fused epilogue: the GEMM packers that form the
activation's gradient g' = grad_out * act'(pre) while they pack it (the backward GEMMs'
prologue), and the column sums of g' (dbias) from the same panels.

The backward of y = act(A @ B + bias), pre = A @ B + bias, is two GEMMs with g' as an
operand:  dA = g' @ B^T  and  dB = A^T @ g'  (linear: dx = g' @ W, dW = g'^T @ x), and
dbias = the column sums of g'.  kernels_cpu/gemm.py's gemm_parallel runs them; it packs its
operands into register-tile panels before the micro-kernels read them, and the packers here
take the plain copy's place for the operand that is g' (gemm_parallel's pack_a / pack_b):
they read grad_out and pre, compute g' (kernels_cpu/activation_grad.grad_input, the same
scalar formulas as the elementwise backward ops) and write it into the packing workspace
that every GEMM writes anyway, in the GEMM's own parallel region: no elementwise pass and
no g' array of the caller's, and the derivative formed once per call (the first GEMM's
workspace, its rows, serves the second).

One packer per side and layout of g' (an (M, N) row-major array, M the rows of the
forward's output), a panel being R rows of the operand:
  by rows (A not transposed: dA = g' @ B^T, dx = g' @ W): pack_grad_rows forms each of the
    panel's R rows of g' by one contiguous derivative loop straight into the GEMM's
    packing buffer laid out as rows (gemm's a_rows: an (M rounded up to R, N) array), which
    the micro-kernel reads as it reads an A in place; afterwards that buffer holds g', and
    the caller's second GEMM (dW, dB) reads it with no derivative of its own (only dbias
    summed by its packer).  Until 2026-12-07 the rows went through gemm's register
    transposes into panels and the second GEMM formed g' again from grad_out and pre.
    linear_backward +gelu +bias, 2 threads, alternating processes, three rounds (Xeon with
    AMX, 2026-12-07, /tmp/w/lb4.py), us, MxKxN, before -> now: 3168x384x1536 (MiniLM's FFN
    at batch 16) 40492 / 38562 / 41238 -> 35246 / 35521 / 36701, one thread 81376 -> 68943;
    512x768x3072 21195 / 20195 / 21315 -> 19367 / 20483 / 19943; at M = 128 (128x768x3072,
    128x3072x768, 128x768x768) within the noise of +-5% either way.  In one process against
    a separate derivative pass (dispatch.gelu_backward, then the GEMMs on its array) it is
    as fast or faster: 128x768x3072 5549 / 5699, 512x768x3072 20052 / 20748, 3168x384x1536
    36386 / 36480, 37x768x3072 2546 / 2466 (us, fused / separate).
  by columns (A transposed: dW = g'^T @ x; B not transposed: dB = A^T @ g'): per block of
    GRAD_CHUNK rows the R values of each row are gathered into two L1 buffers (grad_out,
    pre), and g' is computed by one flat vector loop straight into the panel (the panel's
    k-major layout is the buffers' layout).  The panel's R column sums over all M rows are
    dbias for those columns (deterministic: each panel is summed by one worker, in row
    order; a panel packed twice by two workers, see gemm_worker, writes the same sums
    twice), accumulated in float64.  With g' formed already (the rows packer's buffer) it
    runs with no activation: the gather and the sums.
The derivative loop is a function of its own, grad_chunk, compiled per (dtype, activation:
a literal, so its branches fold away and the loop is branch-free; wide_loops() gives it 16
float32 lanes on AVX-512 targets) and called by address by every packer: the packers
compile per (dtype, tile, side) only.  Inlined into each packer, the same loop made
linear_backward +gelu's first call (bert-base ffn-up, empty cache, Zen 4 VM, 2026-12-01)
4.1 s, the rows packer alone 1.3 s of it.  With the rows packer writing rows (no
transposes) and the dW packer compiled beside dx's (grad_prologue's `ahead`), that first
call took 2.57-2.73 s against 2.66-3.05 before (Xeon with AMX, 2026-12-07, python -m
bench.compile_time, empty cache).

Argument block: gemm_parallel's P_* slots, then (its `extra`) X_PRE: the address of pre
(laid out as grad_out; with no activation any valid address, it is not read), X_DBIAS: the
address of the dbias output ((operand batches, columns)) or 0, X_GRAD: the address of
grad_chunk for the call's dtype and activation (all set by grad_prologue).
"""
import numpy as np
from numba import njit

from .activation_grad import grad_input
from .approx import JIT_BY_ADDRESS, wide_loops
from .gemm import (P_A, P_AP, P_B, P_BP, P_COUNT, P_M, P_N, P_NA, P_NB, _U, _panel, _tmr, _tnr,
                   worker_kernel)
from .parallel import c_array_at, call_address, like_dtype, prefetch, worker_addresses

X_PRE, X_DBIAS, X_GRAD = P_COUNT, P_COUNT + 1, P_COUNT + 2
X_COUNT = P_COUNT + 3

# Columns (by rows) or rows (by columns) of g' formed per block into the L1 buffers: R x
# 256 float32 is 8 KiB for the 8x48 tile's 8 rows (48 x 256 x 2 buffers of the B side: 96
# KiB, in L2).  Not tuned: the buffers must only stay in L1/L2 between the derivative loop
# and the packing.
GRAD_CHUNK = 256
# Rows ahead that the columns layout prefetches (as gemm.PACK_PF_ROWS: each row of a panel
# is a new line / page at the row stride N).
PF_ROWS = 16


@njit(**JIT_BY_ADDRESS)
def grad_chunk(g, pre, dst, n, is64, code):
    """dst[j] = g[j] * act'(pre[j]) for j < n, g, pre and dst the addresses of n elements:
    one contiguous vector loop (called by address: see the module docstring)."""
    wide_loops()
    z = like_dtype(is64)
    gv, pv, dv = c_array_at(g, z, (n,)), c_array_at(pre, z, (n,)), c_array_at(dst, z, (n,))
    for j in range(n):
        dv[_U(j)] = grad_input(gv[_U(j)], pv[_U(j)], code)


@njit(inline="always")
def _grad_panel(i, params, z, R, src_slot, dst_slot, rows_slot, count_slot):
    p = c_array_at(params, np.int64(0), (X_COUNT,))
    src, dst, rows, K, base, r0 = _panel(i, params, z, R, src_slot, dst_slot, rows_slot, count_slot)
    count = p[count_slot]
    pre = c_array_at(p[X_PRE], z, (count * rows * K,))
    nrows = min(R, rows - r0)
    isz = dst.itemsize
    gt = np.empty(R * GRAD_CHUNK, dst.dtype)
    pt = np.empty(R * GRAD_CHUNK, dst.dtype)
    gt_p = gt.ctypes.data
    sums = p[X_DBIAS] != 0
    acc = np.empty(R, np.float64)  # dbias: float64 sums of M float32 terms (M may be 10^4-10^5 tokens)
    for r in range(R):  # not np.zeros: one more compiled function, 0.1 s of a cold first call
        acc[r] = 0.0
    zero = dst.dtype.type(0)
    d0 = i * K * R
    kp = max(K - PF_ROWS, 0)
    for c0 in range(0, K, GRAD_CHUNK):
        cl = min(GRAD_CHUNK, K - c0)
        d = d0 + c0 * R
        for k in range(cl):
            s = base + (c0 + k) * rows + r0
            if c0 + k < kp:
                prefetch(src, _U(s + PF_ROWS * rows))
                prefetch(pre, _U(s + PF_ROWS * rows))
            for r in range(nrows):
                gt[_U(k * R + r)] = src[_U(s + r)]
                pt[_U(k * R + r)] = pre[_U(s + r)]
            for r in range(nrows, R):  # the panel's zero padding: g' = 0 * act'(0) = 0
                gt[_U(k * R + r)] = zero
                pt[_U(k * R + r)] = zero
        call_address(p[X_GRAD], (gt_p, pt.ctypes.data, p[dst_slot] + d * isz, cl * R))
        if sums:
            for k in range(cl):
                for r in range(R):
                    acc[r] += np.float64(dst[_U(d + k * R + r)])
    if sums:
        db = c_array_at(p[X_DBIAS], z, (count * rows,))
        bi = base // (rows * K) if rows * K else 0
        for r in range(nrows):
            db[bi * rows + r0 + r] = acc[r]


@njit(**JIT_BY_ADDRESS)
def pack_grad_a(i, params, is64, ti):
    """A panel i of g' for A stored (K, M) (g' read by columns, i.e. A = g'^T: gemm's
    _pack_a_t with the prologue), and dbias of the panel's columns."""
    wide_loops()
    _grad_panel(i, params, like_dtype(is64), _tmr(ti), P_A, P_AP, P_M, P_NA)


@njit(**JIT_BY_ADDRESS)
def pack_grad_rows(i, params, is64, ti):
    """Panel i of g' for A stored (M, K), packed by rows (gemm's P_A_ROWS): its MR rows of
    g' written as plain rows of the (na, mp * MR, K) array at P_AP, one contiguous
    derivative loop a row; rows past M zeroed (the micro-kernel reads MR rows)."""
    R = _tmr(ti)  # noqa: N806 - the tile's rows
    p = c_array_at(params, np.int64(0), (X_COUNT,))
    _, dst, M, K, base, r0 = _panel(i, params, like_dtype(is64), R, P_A, P_AP, P_M, P_NA)
    nrows = min(R, M - r0)
    isz = dst.itemsize
    for r in range(nrows):  # source row (base / K + r0 + r), packed row i * R + r
        off = (base + (r0 + r) * K) * isz
        call_address(p[X_GRAD], (p[P_A] + off, p[X_PRE] + off, p[P_AP] + (i * R + r) * K * isz, K))
    zero = dst.dtype.type(0)
    for e in range((i * R + nrows) * K, (i + 1) * R * K):
        dst[_U(e)] = zero


@njit(**JIT_BY_ADDRESS)
def pack_grad_cols_b(j, params, is64, ti):
    """B panel j of g' for B stored (K, N) (gemm's _pack_b_n with the prologue); dbias of the
    panel's columns."""
    wide_loops()
    z = like_dtype(is64)
    _grad_panel(j, params, z, _tnr(z, ti), P_B, P_BP, P_N, P_NB)


_PACKERS = {"rows": pack_grad_rows, "cols_a": pack_grad_a, "cols_b": pack_grad_cols_b}


def prologue_kernels(kind, dtype, code, ti):
    """The by-address kernels (worker_addresses requests) that a GEMM packing g' with the
    prologue packer `kind` runs besides its worker: the packer and the grad_chunk for the
    activation `code`."""
    is64 = bool(np.dtype(dtype) == np.float64)
    return [(_PACKERS[kind], (is64, int(ti))), (grad_chunk, (is64, int(code)), 4)]


def grad_prologue(kind, pre, dbias, dtype, code, ti, both_a_forms, ahead=()):
    """(the address of the prologue packer, gemm_parallel's `extra`: the X_* slots) for packer
    `kind` ("rows": A not transposed, packed by rows: plan_args' a_rows; "cols_a": A
    transposed; "cols_b": B not transposed) and (dtype, tile index).  The slots hold the
    addresses of pre and of dbias (0: none) and the grad_chunk for (dtype, activation code).

    A cold first call compiles these with the GEMM worker that gemm_parallel will run (A
    read by rows for "rows", packed for the others; both_a_forms as gemm_parallel's) in two
    processes (parallel.worker_addresses): the worker (0.86 s) here, the packer and
    grad_chunk in a helper, and with them `ahead` (requests of the caller's next GEMM:
    linear_backward's dW packer, compiled here after dx's call, took its cold first call
    from 2.8-3.1 s to 3.1 s)."""
    kernels = [worker_kernel(dtype, ti, kind == "rows", both_a_forms)] + prologue_kernels(kind, dtype, code, ti)
    addr = worker_addresses(kernels + list(ahead))
    x = [0] * (X_COUNT - P_COUNT)
    x[X_PRE - P_COUNT] = pre.ctypes.data
    x[X_DBIAS - P_COUNT] = 0 if dbias is None else dbias.ctypes.data
    x[X_GRAD - P_COUNT] = addr[2]
    return addr[1], tuple(x)
