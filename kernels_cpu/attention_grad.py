"""Backward of scaled dot-product attention on the CPU: FlashAttention-2's backward.

Given grad_out dO, the forward's inputs q, k, v (layouts of kernels_cpu/attention.py: views
with unit-stride rows, positive strides, query head h reads kv head h // G), its output O
and each row's log-sum-exp lse (attention(return_lse=True)), the probabilities are
recomputed tile by tile, P = exp(scale q k^T + mask - lse), and never stored whole:

    D_i = rowsum(dO * O)                       per query row
    dV += P^T dO        dP = dO V^T            per (query tile, key tile)
    dS  = P * (dP - D)
    dK += scale dS^T Q  dQ += scale dS K

Work item = (batch, kv head, chunk of keys).  Its rows are all (query head of the GQA
group, query) pairs, as the forward's, so dK and dV of a key are summed over the group's
query heads inside one item and written once (no atomics, no reduction pass).  Per item:
K and V of the chunk are packed into 16-key K^T / V^T panels (zero padded) for
S = (scale Q) K^T and dP = dO V^T, K also into rows padded to Dp = D rounded up to 16 for
dQ += dS K; dK and dV of the chunk accumulate in the item's (chunk, Dp) buffers.  Query
tiles of BQ rows go outer (their Q, dO, D_i and lse gathered once), the chunk's key tiles
of BK inner; all five products run on the forward's register-blocked micro-kernel
(kernels_cpu.attention.micro: MR x 16 blocks of C, broadcast A x 16-wide rows of B; the
transposed products P^T dO and dS^T Q read A with strides (1, BK)), the padding to Dp
columns makes every product a whole number of 16-column blocks (D = 24: 32).
dQ of a query tile accumulates over the chunk's key tiles in a (BQ, Dp) buffer: with one
chunk per head it is complete and stored (times scale) into dq; with several chunks
(too few batch x kv heads to feed the threads) each chunk stores its part into dq_parts
(nchunk, B, Hq, Sq, D) and a second pass sums the parts in chunk order.  The chunk count
depends on the shape only (dispatch/ops/attention_grad.py), so the result is the same
bits on every run, at every thread count and from the serial implementation.

Causal (bottom-right, query i sees keys j <= i + Skv - Sq): key tiles past a query tile's
last visible key are skipped, the others masked per row.  A row that saw no key (lse =
-inf: its output was zeros) contributes nothing.  NaN: P and dS are computed only for the
keys a row sees (others are exactly 0), so a NaN score, lse, dO or O makes the row's dq and
the seen keys' dk / dv NaN (as the float64 reference, tests/reference/attention_grad.py);
NaN in V or dO also reaches other keys' dv through 0 * NaN in the P^T dO product,
depending on the tiling, as in the forward.
"""
import numpy as np
from numba import njit, types
from numba.extending import overload

from .approx import JIT, JIT_BY_ADDRESS, OVERLOAD, bits_to_float, like
from .attention import BK, BQ, MR, NC, _exp_nan, _mask_row, _variant, micro, unit_row
from .parallel import (borrow, c_array_at, call_address, fetch_add, keep_alive, like_dtype, run_serial, run_workers,
                       view_at, worker_addresses)


# The worker's argument block (int64): addresses, sizes, byte strides (numpy's), the item
# counter, the phase, backward_item's address, the mask kind and causal (read at run time:
# attention._variant).
(P_NEXT, P_Q, P_K, P_V, P_MASK, P_GO, P_O, P_LSE, P_DQ, P_DK, P_DV, P_DQP,
 P_B, P_HQ, P_HKV, P_SQ, P_SKV, P_D, P_SCALE, P_NCHUNK, P_CHUNK, P_PHASE, P_ITEM, P_MKIND, P_CAUSAL) = range(25)
P_STRIDES = 25               # then 4 byte strides each of q, k, v, mask, grad_out, out
P_COUNT = P_STRIDES + 24


def params(q, k, v, mask, grad_out, out, lse, scale, dq, dk, dv, dq_parts, nchunk, chunk):
    """The int64 block the worker reads its arguments from.  q, k, v, grad_out, out: views
    with unit-stride rows and non-negative strides; mask: the 4-D (B, Hq, Sq, Skv) broadcast
    view (a dummy for MASK_NONE); lse (B, Hq, Sq), dq, dk, dv and dq_parts (nchunk, B, Hq,
    Sq, D; unused, may be None, when nchunk is 1): C-contiguous, q's dtype."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    p = np.zeros(P_COUNT, np.int64)
    for slot, arr in ((P_Q, q), (P_K, k), (P_V, v), (P_MASK, mask), (P_GO, grad_out), (P_O, out)):
        if arr.size and (min(arr.strides) < 0 or (arr is not mask and arr.strides[-1] != arr.itemsize)):
            raise ValueError("attention_grad kernels: strides must be non-negative, and rows unit-stride")
        p[slot] = arr.ctypes.data
        base = P_STRIDES + 4 * (slot - P_Q)
        p[base:base + 4] = arr.strides
    for slot, arr, shape in ((P_LSE, lse, (B, Hq, Sq)), (P_DQ, dq, q.shape), (P_DK, dk, k.shape),
                             (P_DV, dv, k.shape), (P_DQP, dq_parts, (nchunk, B, Hq, Sq, D))):
        if arr is None and slot == P_DQP and nchunk == 1:
            continue
        if not (arr.flags.c_contiguous and arr.dtype == q.dtype and arr.shape == tuple(shape)):
            raise ValueError("attention_grad kernels: lse, dq, dk, dv, dq_parts must be C-contiguous, q's dtype")
        p[slot] = arr.ctypes.data
    p[P_B], p[P_HQ], p[P_HKV], p[P_SQ], p[P_SKV], p[P_D] = B, Hq, Hkv, Sq, Skv, D
    p[P_SCALE] = np.float64(scale).view(np.int64)
    p[P_NCHUNK], p[P_CHUNK] = nchunk, chunk
    return p


def backward(q, k, v, mask, mkind, causal, scale, grad_out, out, lse, dq, dk, dv, nchunk, chunk, nworkers):
    """dq, dk, dv (C-contiguous, q's dtype, written whole) of attention(q, k, v) for the
    incoming gradient grad_out, from the forward's out and lse, on nworkers workers (1: the
    calling thread).  Keys in nchunk chunks of `chunk` keys (a multiple of BK) per kv head."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    parts = np.empty((nchunk, B, Hq, Sq, D), q.dtype) if nchunk > 1 else None
    p = params(q, k, v, mask, grad_out, out, lse, scale, dq, dk, dv, parts, nchunk, chunk)
    p[P_MKIND], p[P_CAUSAL] = int(mkind), int(bool(causal))
    variant = _variant(q, mkind)
    # the item first: the larger compile (cold: 2.45 of 3.32 s), done here while a helper
    # process compiles the worker (parallel.worker_addresses)
    p[P_ITEM], fn = worker_addresses([(backward_item, variant), (backward_worker, variant)])
    phases = ((0, B * Hkv * nchunk), (1, -(-B * Hq * Sq // BQ))) if nchunk > 1 else ((0, B * Hkv),)
    for phase, nitems in phases:
        p[P_PHASE], p[P_NEXT] = phase, 0
        if nworkers <= 1:
            run_serial(fn, p)
        else:
            run_workers(fn, p, max(1, min(nworkers, nitems)))


@njit(inline="always")
def _views(p, z):
    """(q, k, v, masks, grad_out, out) from the block p; masks as attention._views'."""
    B, Hq, Hkv, Sq, Skv, D = p[P_B], p[P_HQ], p[P_HKV], p[P_SQ], p[P_SKV], p[P_D]
    s = P_STRIDES
    q = _as4(p, P_Q, z, (B, Hq, Sq, D), s)
    k = _as4(p, P_K, z, (B, Hkv, Skv, D), s + 4)
    v = _as4(p, P_V, z, (B, Hkv, Skv, D), s + 8)
    masks = (_as4(p, P_MASK, False, (B, Hq, Sq, Skv), s + 12), _as4(p, P_MASK, z, (B, Hq, Sq, Skv), s + 12))
    go = _as4(p, P_GO, z, (B, Hq, Sq, D), s + 16)
    o = _as4(p, P_O, z, (B, Hq, Sq, D), s + 20)
    return q, k, v, masks, go, o


@njit(inline="always")
def _as4(p, slot, z, shape, s):
    return view_at(p[slot], z, shape, (p[s], p[s + 1], p[s + 2], p[s + 3]))


@njit(**JIT_BY_ADDRESS)
def backward_worker(w, params, is64, masked):
    """Worker w of one backward() pass: phase 0 takes (batch x kv head, chunk) items from the
    block's counter and runs each through backward_item (at p[P_ITEM]) with its own scratch;
    phase 1 sums the dq parts of blocks of BQ query rows."""
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    z = like_dtype(is64)
    B, Hq, Hkv, Sq, D = p[P_B], p[P_HQ], p[P_HKV], p[P_SQ], p[P_D]
    nchunk = p[P_NCHUNK]
    dq = c_array_at(p[P_DQ], z, (B * Hq * Sq, D))
    if p[P_PHASE] == 1:
        parts = c_array_at(p[P_DQP], z, (nchunk, B * Hq * Sq, D))
        nrows = B * Hq * Sq
        while True:
            t = fetch_add(p, P_NEXT, 1)
            if t * BQ >= nrows:
                break
            for r in range(t * BQ, min(nrows, t * BQ + BQ)):
                drow = dq[r]
                for d in range(D):
                    drow[d] = parts[0, r, d]
                for c in range(1, nchunk):
                    prow = parts[c, r]
                    for d in range(D):
                        drow[d] += prow[d]
        return
    clen, Dp = _scratch_dims(p)
    dt = dq.dtype
    owned = (np.empty((2, clen // NC, Dp, NC), dt), np.empty((3, clen, Dp), dt), np.empty((3, BQ, Dp), dt),
             np.empty((2, BQ, BK), dt), np.empty((3, max(BQ, BK)), dt), np.empty((2, BQ), np.int64),
             np.empty(I_COUNT, np.int64))
    ip = borrow(owned[6])
    ip[I_PARAMS] = params
    ip[I_SCRATCH], ip[I_SCRATCH + 1], ip[I_SCRATCH + 2] = (owned[0].ctypes.data, owned[1].ctypes.data,
                                                          owned[2].ctypes.data)
    ip[I_SCRATCH + 3], ip[I_SCRATCH + 4], ip[I_SCRATCH + 5] = (owned[3].ctypes.data, owned[4].ctypes.data,
                                                              owned[5].ctypes.data)
    item, block = p[P_ITEM], ip.ctypes.data
    while True:
        t = fetch_add(p, P_NEXT, 1)
        if t >= B * Hkv * nchunk:
            break
        ip[I_T] = t
        call_address(item, (w, block))
    keep_alive(owned)


# A backward worker's block for one item (int64), read by backward_item: the call's block
# (params), the item's number and the addresses of the worker's six scratch arrays.
I_PARAMS, I_T, I_SCRATCH = 0, 1, 2
I_COUNT = I_SCRATCH + 6


@njit(inline="always")
def _scratch_dims(p):
    """(keys a worker's scratch holds: the chunk, at most Skv rounded up to BK; D rounded up
    to 16) for the call's block p."""
    return min(p[P_CHUNK], (p[P_SKV] + BK - 1) // BK * BK), (p[P_D] + NC - 1) // NC * NC


@njit(**JIT)
def _pack(src, c0, c1, ph, pad):
    """Rows c0..c1-1 of src (S, D), unit-stride rows: into 16-key panels ph[c, d, t] =
    src[c0 + 16c + t, d] and, when pad is not empty, rows pad[j, d]; zeros past D and
    past c1 (the panels' and rows' padding)."""
    D = src.shape[1]
    n = ph.shape[0] * NC
    Dp = ph.shape[1]
    zero = ph.dtype.type(0)
    for j in range(n):
        panel = ph[j // NC]
        col = j % NC
        if c0 + j < c1:
            row = unit_row(src[c0 + j])
            for d in range(D):
                panel[d, col] = row[d]
            if pad.size:
                prow = pad[j]
                for d in range(D):
                    prow[d] = row[d]
                for d in range(D, Dp):
                    prow[d] = zero
        else:
            for d in range(D):
                panel[d, col] = zero
        for d in range(D, Dp):
            panel[d, col] = zero


def _add_mask_rows(masked, masks, b, rh, ri, nq, j0, jn, mkind, mb, st):
    """st[r, :jn] += the additive form of mask row (b, rh[r], ri[r]) at keys j0.. for the
    tile's rows r < nq (attention._mask_row, into mb; rows that share a mask row, as a
    broadcast padding mask's do, convert it once).  For a literal False masked nothing,
    typed and compiled as nothing: the unmasked variant holds no mask code (backward_item's
    compile, GPT-2 512 causal: 2.43-2.60 -> 2.24-2.32 s, Zen 4, 2026-12-05).  One call per
    tile, not per row: called per row, passing the mask views cost 4-6% of 16x12x198x32
    with a padding mask."""


@overload(_add_mask_rows, **OVERLOAD)
def _add_mask_rows_overload(masked, masks, b, rh, ri, nq, j0, jn, mkind, mb, st):
    if not isinstance(masked, types.Literal):
        return None
    if not masked.literal_value:
        return lambda masked, masks, b, rh, ri, nq, j0, jn, mkind, mb, st: None

    def add(masked, masks, b, rh, ri, nq, j0, jn, mkind, mb, st):
        mprev = -1
        for r in range(nq):
            h, i = rh[r], ri[r]
            mp = masks[0][b, h, i].ctypes.data
            if mp != mprev:
                _mask_row(masks, b, h, i, j0, jn, mkind, mb)
                mprev = mp
            srow = st[r]
            for j in range(jn):
                srow[j] = srow[j] + mb[j]

    return add


@njit(**JIT_BY_ADDRESS)
def backward_item(w, block, is64, masked):
    """One phase-0 item, called by address from backward_worker (compiled once, alone:
    linked into the worker its code was optimized and turned into machine code twice,
    1.0 s of the cold first call on Zen 5, 2026-11-27).  block: the item block (I_*).

    Item t: keys c*chunk .. of kv head hk in batch b against every query row of its group
    (rows rr -> query head hk*G + rr // Sq, query rr % Sq, as the forward): dk, dv of
    those keys, and dq (nchunk == 1) or this chunk's part of it (parts[c])."""
    ip = c_array_at(block, np.int64(0), (I_COUNT,))
    p = c_array_at(ip[I_PARAMS], np.int64(0), (P_COUNT,))
    z = like_dtype(is64)
    q, k, v, masks, go, o = _views(p, z)
    mkind, causal = p[P_MKIND], p[P_CAUSAL] != 0
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    nchunk, chunk = p[P_NCHUNK], p[P_CHUNK]
    scale = like(z, bits_to_float(p[P_SCALE]))
    lse = c_array_at(p[P_LSE], z, (B, Hq, Sq))
    dk = c_array_at(p[P_DK], z, (B, Hkv, Skv, D))
    dv = c_array_at(p[P_DV], z, (B, Hkv, Skv, D))
    parts = c_array_at(p[P_DQP] if nchunk > 1 else p[P_DQ], z, (nchunk if nchunk > 1 else 1, B, Hq, Sq, D))
    clen, Dp = _scratch_dims(p)
    # the worker's scratch as views without an owner (c_array_at): the row views the loops
    # below take would otherwise lock-increment and -decrement its reference count (12% of
    # the samples at 16x12x198x32, 2026-11-26)
    s0 = c_array_at(ip[I_SCRATCH], z, (2, clen // NC, Dp, NC))
    s1 = c_array_at(ip[I_SCRATCH + 1], z, (3, clen, Dp))
    s2 = c_array_at(ip[I_SCRATCH + 2], z, (3, BQ, Dp))
    s3 = c_array_at(ip[I_SCRATCH + 3], z, (2, BQ, BK))
    s4 = c_array_at(ip[I_SCRATCH + 4], z, (3, max(BQ, BK)))
    s5 = c_array_at(ip[I_SCRATCH + 5], np.int64(0), (2, BQ))
    kph, vph = s0[0], s0[1]
    kpad, dka, dva = s1[0], s1[1], s1[2]
    qs, gs, dqa = s2[0], s2[1], s2[2]
    st, dp = s3[0], s3[1]
    lr, di, mb = s4[0, :BQ], s4[1, :BQ], s4[2, :BK]
    ri, rh = s5[0], s5[1]
    t = ip[I_T]
    bh = t // nchunk
    c = t - bh * nchunk
    b, hk = bh // Hkv, bh % Hkv
    G = Hq // Hkv
    R = G * Sq
    dt = q.dtype.type
    zero, ninf, pinf = dt(0), dt(-np.inf), dt(np.inf)
    isz = q.itemsize
    Dp = qs.shape[1]
    off = Skv - Sq
    c0 = c * chunk
    c1 = min(Skv, c0 + chunk)
    n = c1 - c0
    npan = (n + NC - 1) // NC
    _pack(k[b, hk], c0, c1, kph[:npan], kpad)
    _pack(v[b, hk], c0, c1, vph[:npan], kpad[:0])
    nr = (n + BK - 1) // BK * BK
    for j in range(nr):
        a, e = dka[j], dva[j]
        for d in range(Dp):
            a[d] = zero
            e[d] = zero
    qs_p, gs_p, st_p, dp_p, dqa_p = qs.ctypes.data, gs.ctypes.data, st.ctypes.data, dp.ctypes.data, dqa.ctypes.data
    kph_p, vph_p, kpad_p = kph.ctypes.data, vph.ctypes.data, kpad.ctypes.data
    dka_p, dva_p = dka.ctypes.data, dva.ctypes.data
    for qt in range((R + BQ - 1) // BQ):
        r0 = qt * BQ
        nq = min(BQ, R - r0)
        nqr = (nq + MR - 1) // MR * MR
        last = 0
        for r in range(nq):
            rr = r0 + r
            ri[r] = rr % Sq
            rh[r] = hk * G + rr // Sq
            last = max(last, ri[r])
        kv_end = min(c1, last + off + 1) if causal else c1
        for r in range(nqr):
            qrow, grow, arow = qs[r], gs[r], dqa[r]
            if r < nq:
                h, i = rh[r], ri[r]
                src = unit_row(q[b, h, i])
                gsrc = unit_row(go[b, h, i])
                osrc = unit_row(o[b, h, i])
                s = zero
                for d in range(D):  # no store here: tests/ir_checks.py
                    s += gsrc[d] * osrc[d]
                di[r] = s
                for d in range(D):
                    qrow[d] = src[d] * scale
                    grow[d] = gsrc[d]
                li = lse[b, h, i]
                lr[r] = pinf if li == ninf else li  # saw no key: exp(s - inf) = 0 for every key
                for d in range(D, Dp):
                    qrow[d] = zero
                    grow[d] = zero
            else:
                for d in range(Dp):
                    qrow[d] = zero
                    grow[d] = zero
            for d in range(Dp):
                arow[d] = zero
        for j0 in range(c0, kv_end, BK):
            jl = j0 - c0
            jn = min(BK, c1 - j0)
            ncb = (jn + NC - 1) // NC
            # S = (scale Q) K^T and dP = dO V^T, MR x 16 blocks
            for cb in range(ncb):
                pofs = (jl // NC + cb) * Dp * NC * isz
                for rb in range(0, nqr, MR):
                    micro(zero, qs_p + rb * Dp * isz, Dp, 1, kph_p + pofs, NC, st_p + (rb * BK + cb * NC) * isz, BK,
                          Dp, 0)
                    micro(zero, gs_p + rb * Dp * isz, Dp, 1, vph_p + pofs, NC, dp_p + (rb * BK + cb * NC) * isz, BK,
                          Dp, 0)
            # P = exp(S + mask - lse), dS = P (dP - D): both 0 at keys the row does not see
            _add_mask_rows(masked, masks, b, rh, ri, nq, j0, jn, mkind, mb, st)
            for r in range(nq):
                i = ri[r]
                lim = jn
                if causal:
                    lim = min(jn, i + off + 1 - j0)
                srow, prow = st[r], dp[r]
                for j in range(max(lim, 0), jn):
                    srow[j] = ninf
                L = lr[r]
                Di = di[r]
                for j in range(jn):
                    s = srow[j]
                    pj = _exp_nan(s - L)
                    ds = pj * (prow[j] - Di)
                    seen = s != ninf
                    srow[j] = pj if seen else zero
                    prow[j] = ds if seen else zero
            # dV += P^T dO, dK += dS^T (scale Q): C rows are keys, A read transposed
            for d0 in range(0, Dp, NC):
                for rb in range(0, jn, MR):
                    cofs = ((jl + rb) * Dp + d0) * isz
                    micro(zero, st_p + rb * isz, 1, BK, gs_p + d0 * isz, Dp, dva_p + cofs, Dp, nq, 1)
                    micro(zero, dp_p + rb * isz, 1, BK, qs_p + d0 * isz, Dp, dka_p + cofs, Dp, nq, 1)
            # dQ += dS K (times scale when stored)
            for d0 in range(0, Dp, NC):
                for rb in range(0, nqr, MR):
                    micro(zero, dp_p + rb * BK * isz, BK, 1, kpad_p + (jl * Dp + d0) * isz, Dp,
                          dqa_p + (rb * Dp + d0) * isz, Dp, jn, 1)
        dst = parts[c if nchunk > 1 else 0]  # parts is dq itself when nchunk is 1
        for r in range(nq):
            arow = dqa[r]
            drow = dst[b, rh[r], ri[r]]
            for d in range(D):
                drow[d] = arow[d] * scale
    for j in range(n):
        krow, vrow = dk[b, hk, c0 + j], dv[b, hk, c0 + j]
        a, e = dka[j], dva[j]
        for d in range(D):
            krow[d] = a[d]
            vrow[d] = e[d]
