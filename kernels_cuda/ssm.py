"""selective_scan (Mamba's S6 recurrence) and its decode step on the GPU (the recurrence:
kernels_cpu/ssm.py).  float16 / float32 inputs compute and keep the state in float32,
float64 in float64.

ssm.chunked_scan: one block per (batch, channel) row, its threads splitting the sequence:
in passes of blockDim * items steps, thread t owns the items consecutive steps from
pass + t * items (dt with bias and softplus, and dt * u, in registers; items = ITEMS, 4
for float64, which spills at 8).  Per state n, the
recurrence h -> a h + b is composed over each thread's steps into one pair (a, b) = (prod
a_l, the thread's state from 0), the pairs are scanned over the block with the associative
(a1, b1) o (a2, b2) = (a1 a2, a2 b1 + b2) (warp shuffles, then the warp totals through
shared memory), and each thread re-runs its steps from its carry-in state, adding h_l C_l
to its y accumulators (registers, over all n).  The state entering a pass is the previous
pass's final state, kept in hs (batch * dim, N) (the last_state output, or scratch) by the
block's last thread and folded into thread 0's pair; the first pass starts from
initial_state or 0.  After the last n: y = (acc + D u) * silu(z).  Steps past L are the
identity pair (1, 0), so the last thread always ends on the state after step L - 1.  This
is mamba-ssm's structure (a block scan per state index over a chunk of the sequence held
in registers, a running prefix between chunks), with a plain pair scan instead of cub's.
exp(dt A) is exp2(dt * A log2(e)) as in mamba-ssm: one MUFU.EX2 (plus its range fix-up)
for float32.  Steps past L are masked by selects (dt = 0, A and B read as 0), not
branches, and B, C are read at an index clamped to the row.  ptxas, float32, sm_80 / 90:
117-128 registers, no spill; per n the loop body is 500-530 instructions for 34 FFMAs
and 8 MUFU.EX2 (the rest mostly numba's 64-bit index arithmetic: strides are run-time
values; staging B and C in shared memory, tried, gave 660-740 instructions and 176
registers).

ssm.state_update: S lanes per (batch, channel) row (S the power of two >= N, at most 32,
so a warp holds 32 / S rows): lane j updates states j, j + S, ... in place (consecutive
lanes, consecutive addresses) and the S partial sums of h C are reduced by shuffles.
"""
import math
from functools import lru_cache

import numpy as np
from numba import cuda, types

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, WARP_ROWS_THREADS

from ._jit import FULL_MASK, PtxBuild, acc_np, acc_of, arr, kernel

# Steps per thread per pass of the scan (float32 / float16): a pass of a 128-thread block
# covers 1024 steps (Mamba prefill lengths in one pass); dt, dt * u, y and the pair (a, b)
# in 5 x ITEMS registers.
ITEMS = 8

LOG2E = 1.4426950408889634
_U = np.uint64

# Flags (bits of the kernels' `flags` argument)
SOFTPLUS, HAS_D, HAS_Z, HAS_BIAS, HAS_INIT = 1, 2, 4, 8, 16


@lru_cache(maxsize=None)
def scan_kernel(acc_np_):
    """kernel(u, delta, A, B, C, D, z, bias, init, hs, y, dim, G, flags): u, delta, z, y
    (batch * dim, L); A (dim, N); B, C (batch * G, N, L); D, bias (dim,) and init (batch *
    dim, N): 1-element dummies when absent (flags); hs (batch * dim, N) accumulation
    dtype, written.  Grid: batch * dim blocks of a multiple of 32 threads (at most
    WARP_ROWS_THREADS)."""
    acc, _ = acc_of(acc_np_)
    zero, one, twenty, log2e = acc_np_(0.0), acc_np_(1.0), acc_np_(20.0), acc_np_(LOG2E)
    items = ITEMS if acc_np_ is np.float32 else ITEMS // 2  # float64: half, or it spills

    @kernel(launch_bounds=(WARP_ROWS_THREADS, 1))
    def chunked_scan(u, delta, A, B, C, D, z, bias, init, hs, y, dim, G, flags):
        L = u.shape[1]
        N = A.shape[1]
        tid = cuda.threadIdx.x
        nthr = cuda.blockDim.x
        lane = tid & 31
        warp = tid >> 5
        wa_s = cuda.shared.array(32, acc)
        wb_s = cuda.shared.array(32, acc)
        dd = cuda.local.array(items, acc)   # dt
        du = cuda.local.array(items, acc)   # dt * u
        yy = cuda.local.array(items, acc)
        aa = cuda.local.array(items, acc)   # exp(dt * A[d, n]) of the current n
        bb = cuda.local.array(items, acc)   # dt * u * B[n]
        row = cuda.blockIdx.x
        b = row // dim
        d = row - b * dim
        bg = b * G + d // (dim // G)
        dbias = acc(bias[d]) if flags & HAS_BIAS else zero
        urow = u[row]
        for p0 in range(0, L, nthr * items):
            cuda.syncthreads()  # hs: the last thread's writes of the previous pass
            base = p0 + tid * items
            # the thread's steps base.. as unsigned indices clamped to the row (numba adds no
            # negative-index fix-up for unsigned ones); a step past L gets dt = 0 and its
            # (a, b) pair is forced to (1, 0) by masking A and B (selects, not branches)
            for k in range(items):
                lk = _U(min(base + k, L - 1))
                v = acc(delta[row, lk]) + dbias
                if flags & SOFTPLUS and v <= twenty:
                    v = math.log1p(math.exp(v))
                v = v if base + k < L else zero
                dd[k] = v
                du[k] = v * acc(urow[lk])
                yy[k] = zero
            for n in range(N):
                an = acc(A[d, n]) * log2e  # exp(dt A) = 2^(dt A log2(e)): one MUFU.EX2 for float32
                brow = B[bg, n]
                crow = C[bg, n]
                pa = one
                pb = zero
                for k in range(items):
                    inside = base + k < L
                    lk = _U(min(base + k, L - 1))
                    a = math.exp2(dd[k] * (an if inside else zero))
                    bk = du[k] * (acc(brow[lk]) if inside else zero)
                    aa[k] = a
                    bb[k] = bk
                    pa *= a
                    pb = a * pb + bk
                carry = zero
                if tid == 0:
                    if p0 > 0:
                        carry = hs[row, n]
                    elif flags & HAS_INIT:
                        carry = acc(init[row, n])
                    pb += pa * carry
                # inclusive scan of the pairs over the warp, then over the warps
                for off in (1, 2, 4, 8, 16):
                    a2 = cuda.shfl_up_sync(FULL_MASK, pa, off)
                    b2 = cuda.shfl_up_sync(FULL_MASK, pb, off)
                    if lane >= off:
                        pb = pa * b2 + pb
                        pa = a2 * pa
                cuda.syncthreads()  # every thread has read the previous n's warp totals
                if lane == 31:
                    wa_s[warp] = pa
                    wb_s[warp] = pb
                cuda.syncthreads()
                hw = zero  # the state after the earlier warps' steps
                for w in range(WARP_ROWS_THREADS // 32 - 1):  # a fixed trip count: unrolled
                    if w < warp:
                        hw = wa_s[w] * hw + wb_s[w]
                ea = cuda.shfl_up_sync(FULL_MASK, pa, 1)
                eb = cuda.shfl_up_sync(FULL_MASK, pb, 1)
                h = ea * hw + eb if lane > 0 else hw
                if tid == 0:
                    h = carry
                for k in range(items):
                    h = aa[k] * h + bb[k]
                    yy[k] += h * acc(crow[_U(min(base + k, L - 1))])
                if tid == nthr - 1:
                    hs[row, n] = h
            dval = acc(D[d]) if flags & HAS_D else zero
            for k in range(items):
                l = base + k
                if l < L:
                    v = yy[k]
                    if flags & HAS_D:
                        v += dval * acc(urow[l])
                    if flags & HAS_Z:
                        zv = acc(z[row, l])
                        v *= zv / (one + math.exp(-zv))
                    y[row, l] = v

    return chunked_scan


@lru_cache(maxsize=None)
def update_kernel(acc_np_):
    """kernel(state, x, dt, A, B, C, D, z, bias, y, dim, G, S, flags): state (batch * dim,
    N) accumulation dtype, updated in place; x, dt, z, y (batch * dim,); A (dim, N); B, C
    (batch * G, N); D, bias (dim,) (dummies when absent: flags); S lanes per row (a power
    of two <= 32).  Grid: ceil(rows * S / block) blocks of a multiple of 32 threads."""
    acc, _ = acc_of(acc_np_)
    zero, one, twenty, log2e = acc_np_(0.0), acc_np_(1.0), acc_np_(20.0), acc_np_(LOG2E)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 1))
    def state_update(state, x, dt, A, B, C, D, z, bias, y, dim, G, S, flags):
        rows, N = state.shape
        t = cuda.grid(1)
        r = t // S
        j = t - r * S
        part = zero
        if r < rows:
            b = r // dim
            d = r - b * dim
            bg = b * G + d // (dim // G)
            v = acc(dt[r])
            if flags & HAS_BIAS:
                v += acc(bias[d])
            if flags & SOFTPLUS and v <= twenty:
                v = math.log1p(math.exp(v))
            du = v * acc(x[r])
            n = j
            while n < N:
                h = math.exp2(v * (acc(A[d, n]) * log2e)) * state[r, n] + du * acc(B[bg, n])
                state[r, n] = h
                part += h * acc(C[bg, n])
                n += S
        off = S >> 1
        while off > 0:  # every lane of the warp takes part (rows past the end add 0)
            part += cuda.shfl_xor_sync(FULL_MASK, part, off)
            off >>= 1
        if r < rows and j == 0:
            if flags & HAS_D:
                part += acc(D[d]) * acc(x[r])
            if flags & HAS_Z:
                zv = acc(z[r])
                part *= zv / (one + math.exp(-zv))
            y[r] = part

    return state_update


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
_I = types.int64


def _scan_args(dt):
    a = acc_of(acc_np(dt))[0]
    return (arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 3), arr(dt, 3), arr(dt, 1), arr(dt, 2), arr(dt, 1),
            arr(a, 2), arr(a, 2), arr(dt, 2), _I, _I, _I)


def _update_args(dt):
    a = acc_of(acc_np(dt))[0]
    return (arr(a, 2), arr(dt, 1), arr(dt, 1), arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 1), arr(dt, 1),
            arr(dt, 1), arr(dt, 1), _I, _I, _I, _I)


PTX = [
    PtxBuild("ssm.chunked_scan", "ssm", lambda dt: scan_kernel(acc_np(dt)), _scan_args, threads=WARP_ROWS_THREADS),
    PtxBuild("ssm.state_update", "ssm", lambda dt: update_kernel(acc_np(dt)), _update_args,
             threads=ELEMENTWISE_THREADS),
]
