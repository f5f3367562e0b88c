"""Mixture-of-experts FFN: the tokens grouped by expert, each expert's weights read once.

out[t] = sum over slots j of weights[t, j] * w_down[e] @ (act(w_gate[e] @ x[t]) * (w_up[e] @ x[t])),
e = indices[t, j]; x (T, H), weights / indices (T, k), w_gate / w_up (E, F, H), w_down
(E, H, F) (PyTorch Linear layout), out (T, H), all C-contiguous.

moe_ffn:
  0. (the caller: dispatch/ops/moe.route, numpy, O(T*k)) a stable counting sort of the T*k
     (token, slot) pairs by expert: the rows of expert e are the positions offs[e] ..
     offs[e+1] of `tok` (their tokens) and `scale` (their routing weights);
  1. gate/up (moe_worker, phase 0): tasks (active expert, block of FB rows of F) from an
     atomic counter.  A task computes G = X_e @ w_gate[e, f0:f1].T and U = X_e @ w_up[e, f0:f1].T
     for the expert's rows X_e (read straight from x through `tok`: no gather copy) and
     writes act(G) * U (gated_epilogue, by address: one small function per activation)
     into its columns f0:f1 of the hidden buffer hid (T*k, F), one row per (token, slot)
     in sorted order;
  2. down (moe_worker, phase 1, after phase 0's parallel region has ended): tasks (block
     of HB rows of H) from the counter.  A task zeroes its
     columns h0:h1 of out and, expert by expert, adds scale * hid[rows of e] @ w_down[e,
     h0:h1].T into them.  A task owns its output columns for every token, so the k slots of
     a token (different experts) never race, and the sum over slots runs in expert order
     whatever the threads do: results are bitwise reproducible.
Every weight row is read once per call (each F / H block of each active expert belongs to
one task), and both threads share every expert (its blocks are separate tasks): at T = 1
only k experts are active, and the call is a stream over their weights.

Both products are "rows times rows": X (n, K) times W (N, K) transposed, both operands
contiguous along K (w_gate / w_up rows along H, w_down rows along F, hid rows along F).
dot_tile (kernels_cpu/dot_tile.py), an LLVM-IR intrinsic like the GEMM's micro-kernel,
computes a TA x TB tile of such dot products with TA * TB vector accumulators along K:
per K step of one vector, TB weight loads, TA row loads and TA * TB FMAs (4 x 3: 7 loads
per 12 FMAs, as the 6 x 16 outer-product kernel's 8 per 12), and no packing of either
operand: a weight row is used straight from memory, streamed once.  K is
split into blocks of KC (measured: long blocks win, beside KC); partial sums add into the
task's small accumulator (n x 2 FB or n x HB); an expert with at most TA rows (decode)
takes K in one block.  Edge tiles (fewer than TA rows or TB weight rows) repeat their last
row, and only the valid sums are kept.  While a group of TB weight rows is used by the
expert's row groups, their tiles prefetch the next group's rows (the first tile of a group
streams it from memory; measured beside the worker's loop).
"""
import numpy as np
from numba import njit, types
from numba.extending import overload

from .approx import OVERLOAD, ACT_GELU, ACT_GELU_TANH, ACT_SILU, JIT_BY_ADDRESS, gelu, gelu_tanh, silu
from .dot_tile import TA, TB, dot_tile
from .parallel import c_array_at, call_address, fetch_add, like_dtype, run_serial, run_workers, worker_address


# Blocking: rows of F per gate/up task, rows of H per down task, K block.  Measured
# 2026-11-23 (AMD znver3, one thread, CPU time, medians of 5 interleaved rounds; E 8, k 2
# unless given): FB = HB in {24, 48, 96} within 3% at every shape (small MoE T 64: 47.0 /
# 46.2 / 45.7 ms; T 1: 4.19 / 4.31 / 4.28 ms); KC 256 / 512 / 1024 / 2048 at small MoE T 64
# (H 1024, F 2816): 63.3 / 55.0 / 46.2 / 45.8 ms; KC 1024 / 2048 / 4096 / no blocking at
# one expert H 4096, F 2048, T 16: 15.0 / 14.5 / 13.7 / 13.9 ms, T 64: 52.5 / 52.7 / 52.0
# / 52.3 ms; H 512, F 14336, T 16: 16.9 / 16.4 / 16.3 / 16.8 ms.  Short K blocks cost more
# in restarting the tile's row streams than L1 reuse gives back; 48 rows make 2 x 48 / 3 = 32
# weight groups per gate/up task and 14336 / 48 = 299 tasks per Mixtral expert.
FB = 48
HB = 48
KC = 4096

_U = np.uint64  # unsigned indices: numba drops the negative-index fix-up, loops vectorize


def gated_lit(src, up, dst, n, code):
    """dst[c] = act(src[c]) * src[up + c] for c < n, for a literal activation code: only
    that activation's loop is compiled."""


@overload(gated_lit, inline="always", **OVERLOAD)
def _gated_lit_overload(src, up, dst, n, code):
    if not isinstance(code, types.Literal):
        return None
    act = {ACT_SILU: silu, ACT_GELU: gelu, ACT_GELU_TANH: gelu_tanh}[code.literal_value]

    def gated(src, up, dst, n, code):
        for c in range(n):
            dst[c] = act(src[c]) * src[_U(up + c)]
    return gated


@njit(**JIT_BY_ADDRESS)
def gated_epilogue(src, dst, n, up, is64, code):
    """dst[0:n] = act(src[0:n]) * src[up:up + n] (arrays at addresses src, dst); is64 and
    code literals: one small function per (dtype, activation), called by address from
    moe_worker, which is compiled per dtype only."""
    z = like_dtype(is64)
    gated_lit(c_array_at(src, z, (up + n,)), up, c_array_at(dst, z, (n,)), n, code)


# moe_worker's int64 argument block: addresses, then sizes, blocking and the phase.
(Q_SYNC, Q_X, Q_WG, Q_WU, Q_WD, Q_HID, Q_OUT, Q_OFFS, Q_ACTIVE, Q_TOK, Q_SCALE, Q_EPILOGUE,
 Q_T, Q_H, Q_F, Q_E, Q_ROWS, Q_NACTIVE, Q_NMAX, Q_FB, Q_HB, Q_KC, Q_PHASE, Q_COUNT) = range(24)


@njit(inline="always")
def _a_row(gating, tok, r):
    """The row of A holding sorted row r: its token's row of x (phase 0) or row r of hid."""
    return tok[r] if gating else r


@njit(**JIT_BY_ADDRESS)
def moe_worker(w, params, is64):
    """Worker w of phase Q_PHASE (module docstring; 0: gate/up, 1: down), tasks from
    sync[phase]; is64 a literal: one compiled worker per dtype, the activation called by
    address (gated_epilogue).  Both phases run one loop nest (one inlined dot_tile): for
    each of the task's experts, K block, weight-row segment (gate and up, or down), group
    of TB weight rows and group of TA rows, a tile added into the task's accumulator acc
    (the expert's rows x the task's columns), then the phase's epilogue."""
    p = c_array_at(params, np.int64(0), (Q_COUNT,))
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    T, H, F, E, R = p[Q_T], p[Q_H], p[Q_F], p[Q_E], p[Q_ROWS]
    nact, nmax, fb, hb, kc, phase = p[Q_NACTIVE], p[Q_NMAX], p[Q_FB], p[Q_HB], p[Q_KC], p[Q_PHASE]
    sync = c_array_at(p[Q_SYNC], np.int64(0), (2,))
    xf = c_array_at(p[Q_X], z, (T * H,))
    wgf = c_array_at(p[Q_WG], z, (E * F * H,))
    wuf = c_array_at(p[Q_WU], z, (E * F * H,))
    wdf = c_array_at(p[Q_WD], z, (E * H * F,))
    hid = c_array_at(p[Q_HID], z, (R * F,))
    of = c_array_at(p[Q_OUT], z, (T * H,))
    offs = c_array_at(p[Q_OFFS], np.int64(0), (E + 1,))
    active = c_array_at(p[Q_ACTIVE], np.int64(0), (max(nact, 1),))
    tok = c_array_at(p[Q_TOK], np.int64(0), (R,))
    scale = c_array_at(p[Q_SCALE], z, (R,))
    gating = phase == 0
    # phase 0: A = x rows (through tok), K = H, weight rows of F (gate, then up);
    # phase 1: A = hid rows, K = F, weight rows of H (down)
    a = xf if gating else hid
    K = H if gating else F
    N = F if gating else H
    nb = fb if gating else hb
    nblk = (N + nb - 1) // nb
    ntasks = nact * nblk if gating else nblk
    ld = 2 * nb if gating else nb
    acc = np.empty(nmax * ld, xf.dtype)
    t = np.empty(TA * TB, xf.dtype)
    zero = xf.dtype.type(0)
    while True:
        task = fetch_add(sync, phase, 1)
        if task >= ntasks:
            break
        ai0 = task // nblk if gating else 0
        c0 = (task - ai0 * nblk) * nb
        cl = min(nb, N - c0)
        if not gating:  # the task owns out[:, c0:c0 + cl]
            for tt in range(T):
                for c in range(cl):
                    of[_U(tt * H + c0 + c)] = zero
        for ai in range(ai0, ai0 + 1 if gating else nact):
            e = active[ai]
            r0 = offs[e]
            n = offs[e + 1] - r0
            kce = K if n <= TA else kc
            for k0 in range(0, K, kce):
                kl = min(kce, K - k0)
                for seg in range(2 if gating else 1):
                    ws = wdf if not gating else (wgf if seg == 0 else wuf)
                    for j0 in range(0, cl, TB):
                        nj = min(TB, cl - j0)
                        b0 = (e * N + c0 + j0) * K + k0
                        b1 = b0 + min(1, nj - 1) * K
                        b2 = b0 + min(2, nj - 1) * K
                        # The first tile of a weight group streams it from memory, the
                        # others reuse it from cache: the group's tiles prefetch the next
                        # group's rows (tile g row r, r % tiles == g), so that stream starts
                        # early.  Measured 2026-11-23 (one thread, CPU time, small MoE E 8
                        # k 2): T 1 4.25 / 4.40 -> 3.60 / 2.92 ms, T 64 42.3 / 43.6 -> 38.9 /
                        # 40.1 ms, one expert T 16: 4.97 -> 4.54 ms; two groups ahead: no
                        # further gain.
                        ng = (n + TA - 1) // TA
                        nn = min(TB, cl - j0 - TB)   # rows of the next weight group
                        for i0 in range(0, n, TA):
                            g = i0 // TA
                            q0 = b0 + TB * K if nn > 0 and g == 0 else b0
                            q1 = b0 + (TB + 1) * K if nn > 1 and g == 1 % ng else b0
                            q2 = b0 + (TB + 2) * K if nn > 2 and g == 2 % ng else b0
                            ni = min(TA, n - i0)
                            r = r0 + i0
                            a0 = _a_row(gating, tok, r) * K + k0
                            a1 = _a_row(gating, tok, r + min(1, ni - 1)) * K + k0
                            a2 = _a_row(gating, tok, r + min(2, ni - 1)) * K + k0
                            a3 = _a_row(gating, tok, r + min(3, ni - 1)) * K + k0
                            dot_tile(kl, a, a0, a1, a2, a3, ws, b0, b1, b2, q0, q1, q2, t)
                            for ii in range(ni):
                                o = (i0 + ii) * ld + seg * nb + j0
                                for jj in range(nj):
                                    if k0 == 0:
                                        acc[o + jj] = t[ii * TB + jj]
                                    else:
                                        acc[o + jj] += t[ii * TB + jj]
            if gating:  # hid[rows of e, c0:c0 + cl] = act(gate) * up
                for i in range(n):
                    call_address(p[Q_EPILOGUE], (acc.ctypes.data + i * ld * isz, p[Q_HID] + ((r0 + i) * F + c0) * isz,
                                                 cl, nb))
            else:  # out[token, c0:c0 + cl] += routing weight * down
                for i in range(n):
                    s = scale[r0 + i]
                    o = tok[r0 + i] * H + c0
                    for c in range(cl):
                        of[_U(o + c)] += s * acc[_U(i * ld + c)]


def moe_ffn(x, w_gate, w_up, w_down, offs, active, tok, scale, code, out, nworkers):
    """out (T, H) = the module docstring's sum, for C-contiguous x, w_gate, w_up, w_down,
    out of one float dtype and the routing (dispatch/ops/moe.route): offs (E + 1,) the
    sorted rows of each expert, active the experts with rows, tok (R,) the token of each
    sorted row, scale (R,) its routing weight (int64 tables, scale of out's dtype); code:
    the activation (ACT_SILU, ACT_GELU, ACT_GELU_TANH); nworkers: numba's thread count, or
    1 to run on the calling thread.  Extra memory: the hidden buffer (R, F) and per worker
    a (rows of the busiest expert) x 2 FB accumulator."""
    T, H = x.shape
    E, F, _ = w_gate.shape
    dt = out.dtype
    for arr in (x, w_gate, w_up, w_down, scale, out):
        if not (arr.flags.c_contiguous and arr.dtype == dt):
            raise ValueError(f"moe_ffn: arrays must be C-contiguous {dt}, got {arr.dtype}")
    for arr in (offs, active, tok):
        if not (arr.flags.c_contiguous and arr.dtype == np.int64):
            raise ValueError(f"moe_ffn: routing tables must be C-contiguous int64, got {arr.dtype}")
    if out.size == 0:
        return
    if tok.shape[0] == 0 or F == 0:
        out[...] = 0
        return
    rows = tok.shape[0]
    hid = np.empty(rows * F, dt)
    sync = np.zeros(2, np.int64)
    p = np.zeros(Q_COUNT, np.int64)
    # addresses through ctypes (about 1 us each): a numba helper filling them would add its
    # compile to the cold first call, for a saving of microseconds on calls of milliseconds
    for slot, arr in ((Q_SYNC, sync), (Q_X, x), (Q_WG, w_gate), (Q_WU, w_up), (Q_WD, w_down), (Q_HID, hid),
                      (Q_OUT, out), (Q_OFFS, offs), (Q_ACTIVE, active), (Q_TOK, tok), (Q_SCALE, scale)):
        p[slot] = arr.ctypes.data
    is64 = bool(dt == np.float64)
    p[Q_EPILOGUE] = worker_address(gated_epilogue, (is64, int(code)), nargs=4)
    p[Q_T], p[Q_H], p[Q_F], p[Q_E], p[Q_ROWS] = T, H, F, E, rows
    p[Q_NACTIVE], p[Q_NMAX] = active.shape[0], int(np.max(offs[1:] - offs[:-1]))
    p[Q_FB], p[Q_HB], p[Q_KC] = FB, HB, KC
    fn = worker_address(moe_worker, (is64,))
    for phase, ntasks in ((0, active.shape[0] * -(-F // FB)), (1, -(-H // HB))):
        p[Q_PHASE] = phase
        if nworkers <= 1:
            run_serial(fn, p)
        else:
            run_workers(fn, p, min(nworkers, ntasks))
