"""Backward of matmul / linear with the fused epilogue: the GEMM packers that form the
activation's gradient g' = grad_out * act'(pre) while they pack it (the backward GEMMs'
prologue), and the column sums of g' (dbias) from the same panels.

The backward of y = act(A @ B + bias), pre = A @ B + bias, is two GEMMs with g' as an
operand:  dA = g' @ B^T  and  dB = A^T @ g'  (linear: dx = g' @ W, dW = g'^T @ x), and
dbias = the column sums of g'.  kernels_cpu/gemm.py's gemm_parallel runs them; it packs its
operands into register-tile panels before the micro-kernels read them, and the packers here
take the plain copy's place for the operand that is g' (gemm_parallel's pack_a / pack_b):
they read grad_out and pre, compute g' (kernels_cpu/activation_grad.grad_input, the same
scalar formulas as the elementwise backward ops) and write it into the panel.  So g' exists
only in the packed panels (the packing workspace every GEMM writes anyway): no (M, N) g'
array and no elementwise pass over memory before the GEMMs.

Two layouts of g' (an (M, N) row-major array, M the rows of the forward's output):
  pack_grad_rows (A operand, not transposed: dA = g' @ B^T, dx = g' @ W): a panel is R rows
    of g' over all N; per block of GRAD_CHUNK columns each row's g' is computed by one
    contiguous vector loop into an L1 buffer (R x GRAD_CHUNK), which the forward's
    _pack_strided register-transposes into the panel.
  pack_grad_cols (A transposed: dW = g'^T @ x; or B not transposed: dB = A^T @ g'): a panel
    is R columns of g' over all M rows; per block of GRAD_CHUNK rows the R values of each row
    are gathered into two L1 buffers (grad_out, pre), and g' is computed by one flat vector
    loop straight into the panel (the panel's k-major layout is the buffers' layout).  The
    panel's R column sums over all M rows are dbias for those columns (deterministic: each
    panel is summed by one worker, in row order; a panel packed twice by two workers, see
    gemm_worker, writes the same sums twice), accumulated in float64.
The derivative loop is a function of its own, grad_chunk, compiled per (dtype, activation:
a literal, so its branches fold away and the loop is branch-free; wide_loops() gives it 16
float32 lanes on AVX-512 targets) and called by address by every packer, once per row or
block of GRAD_CHUNK: the packers compile per (dtype, tile, operand) only.  Inlined into
each packer, the same loop made linear_backward +gelu's first call (bert-base ffn-up,
empty cache, Zen 4 VM, 2026-12-01) 4.1 s, pack_grad_rows alone 1.3 s of it.

Argument block: gemm_parallel's P_* slots, then (its `extra`) X_PRE: the address of pre
(laid out as grad_out; with no activation any valid address, it is not read), X_DBIAS: the
address of the dbias output ((operand batches, columns), written by pack_grad_cols) or 0,
X_GRAD: the address of grad_chunk for the call's dtype and activation (grad_function).
"""
import numpy as np
from numba import njit

from .activation_grad import grad_input
from .approx import JIT_BY_ADDRESS, wide_loops
from .gemm import (P_A, P_AP, P_B, P_BP, P_COUNT, P_M, P_N, P_NA, P_NB, _U, _pack_strided, _panel, _prefetch, _tmr,
                   _tnr)
from .parallel import c_array_at, call_address, like_dtype, worker_address

X_PRE, X_DBIAS, X_GRAD = P_COUNT, P_COUNT + 1, P_COUNT + 2
X_COUNT = P_COUNT + 3

# Columns (pack_grad_rows) or rows (pack_grad_cols) of g' formed per step into the L1
# buffers: R x 256 float32 is 8 KiB for the 8x48 tile's 8 rows (48 x 256 x 2 buffers of the
# B side: 96 KiB, in L2).  Not tuned: the buffers must only stay in L1/L2 between the
# derivative loop and the transpose.
GRAD_CHUNK = 256
# Rows ahead that pack_grad_cols prefetches (as gemm.PACK_PF_ROWS: each row of a panel is a
# new line / page at the row stride N).
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
def _rows_body(i, params, z, R):
    p = c_array_at(params, np.int64(0), (X_COUNT,))
    src, dst, rows, K, base, r0 = _panel(i, params, z, R, P_A, P_AP, P_M, P_NA)
    fn, isz = p[X_GRAD], dst.itemsize
    nrows = min(R, rows - r0)
    tmp = np.empty(R * GRAD_CHUNK, dst.dtype)
    t0 = tmp.ctypes.data
    for c0 in range(0, K, GRAD_CHUNK):
        cl = min(GRAD_CHUNK, K - c0)
        for r in range(nrows):
            off = (base + (r0 + r) * K + c0) * isz  # pre is laid out as grad_out
            call_address(fn, (p[P_A] + off, p[X_PRE] + off, t0 + r * GRAD_CHUNK * isz, cl))
        _pack_strided(tmp, 0, GRAD_CHUNK, nrows, cl, dst, i * K * R + c0 * R, R)


@njit(**JIT_BY_ADDRESS)
def pack_grad_rows(i, params, is64, ti):
    """A panel i of g' for A stored (M, K) (gemm's _pack_a_n with the prologue)."""
    wide_loops()
    _rows_body(i, params, like_dtype(is64), _tmr(ti))


@njit(inline="always")
def _cols_body(i, params, z, R, src_slot, dst_slot, rows_slot, count_slot):
    p = c_array_at(params, np.int64(0), (X_COUNT,))
    src, dst, rows, K, base, r0 = _panel(i, params, z, R, src_slot, dst_slot, rows_slot, count_slot)
    count = p[count_slot]
    pre = c_array_at(p[X_PRE], z, (count * rows * K,))
    nrows = min(R, rows - r0)
    gt = np.empty(R * GRAD_CHUNK, dst.dtype)
    pt = np.empty(R * GRAD_CHUNK, dst.dtype)
    acc = np.empty(R, np.float64)  # dbias: float64 sums of M float32 terms (M may be 10^4-10^5 tokens)
    for r in range(R):  # not np.zeros: one more compiled function, 0.1 s of a cold first call
        acc[r] = 0.0
    zero = dst.dtype.type(0)
    d0 = i * K * R
    kp = max(K - PF_ROWS, 0)
    for c0 in range(0, K, GRAD_CHUNK):
        cl = min(GRAD_CHUNK, K - c0)
        for k in range(cl):
            s = base + (c0 + k) * rows + r0
            if c0 + k < kp:
                _prefetch(src, _U(s + PF_ROWS * rows))
                _prefetch(pre, _U(s + PF_ROWS * rows))
            for r in range(nrows):
                gt[_U(k * R + r)] = src[_U(s + r)]
                pt[_U(k * R + r)] = pre[_U(s + r)]
            for r in range(nrows, R):  # the panel's zero padding: g' = 0 * act'(0) = 0
                gt[_U(k * R + r)] = zero
                pt[_U(k * R + r)] = zero
        d = d0 + c0 * R
        call_address(p[X_GRAD], (gt.ctypes.data, pt.ctypes.data, p[dst_slot] + d * dst.itemsize, cl * R))
        for k in range(cl):
            for r in range(R):
                acc[r] += np.float64(dst[_U(d + k * R + r)])
    if p[X_DBIAS] != 0:
        db = c_array_at(p[X_DBIAS], z, (count * rows,))
        bi = base // (rows * K) if rows * K else 0
        for r in range(nrows):
            db[bi * rows + r0 + r] = acc[r]


@njit(**JIT_BY_ADDRESS)
def pack_grad_cols_a(i, params, is64, ti):
    """A panel i of g'^T for A stored (K, M), i.e. g' (K, M) read by columns (gemm's
    _pack_a_t with the prologue); dbias of the panel's columns."""
    wide_loops()
    _cols_body(i, params, like_dtype(is64), _tmr(ti), P_A, P_AP, P_M, P_NA)


@njit(**JIT_BY_ADDRESS)
def pack_grad_cols_b(j, params, is64, ti):
    """B panel j of g' for B stored (K, N) (gemm's _pack_b_n with the prologue); dbias of the
    panel's columns."""
    wide_loops()
    z = like_dtype(is64)
    _cols_body(j, params, z, _tnr(z, ti), P_B, P_BP, P_N, P_NB)


_PACKERS = {"rows": pack_grad_rows, "cols_a": pack_grad_cols_a, "cols_b": pack_grad_cols_b}


def grad_packer(kind, dtype, ti):
    """The address of the prologue packer `kind` ("rows": A not transposed; "cols_a": A
    transposed; "cols_b": B not transposed) for (dtype, tile index); the activation is the
    block's X_GRAD (grad_function)."""
    return worker_address(_PACKERS[kind], (bool(np.dtype(dtype) == np.float64), int(ti)))


def grad_function(dtype, code):
    """The address of grad_chunk for (dtype, activation code): the block's X_GRAD slot."""
    return worker_address(grad_chunk, (bool(np.dtype(dtype) == np.float64), int(code)), nargs=4)
