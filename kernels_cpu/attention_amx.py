"""Flash attention of bfloat16 q / k / v on AMX tiles (`tdpbf16ps`, Sapphire Rapids and
later): PyTorch's bfloat16 scaled_dot_product_attention on the CPU, without a mask (causal
or none) and without the log-sum-exp.

    out[b, h, i] = sum_j p_ij v[b, g, j] / sum_j p_ij,   p_ij = exp(s_ij - max_j s_ij),
    s_ij = scale * q[b, h, i] . k[b, g, j]   (g = h // (Hq // Hkv); j <= i + Skv - Sq if causal)

Numerics: the scores are float32 sums of exact bfloat16 products (the tiles), scaled in
float32; the online softmax is the float32 flash kernel's (kernels_cpu/attention.py's
_row_softmax_update: NaN in gives NaN out, a row that sees no key gives zeros); the
probabilities are rounded to bfloat16 for the P V product (as PyTorch's CPU flash kernel
does), the output accumulated in float32 and rounded once to bfloat16.

Work: one launch.  First the packing tasks, one per (batch, kv head) and operand: K as
B panels of 32 keys (the pair (k[j, 2t], k[j, 2t+1]) one 32-bit word: pack_panel's
transpose), V as B panels of 32 of its columns (two key rows interleaved:
bf16_gemm._interleave_pair), keys padded with zeros to whole blocks of BKA; then the
items, (batch, query head, block of 32 queries), each: q's rows into A chunks, then per
block of BKA keys S = Q K^T (amx_tile into a float32 block), the scaled online softmax
row by row, P into bfloat16 A chunks, O += P V (amx_tile on O's float32 rows, loaded and
stored: the softmax rescales them between blocks); causal blocks past the last row's
diagonal are skipped.  A block's S tiles, then its softmax, then its P V: where the time
goes is in BKA's note.
"""
import numpy as np
from numba import njit

from . import amx
from .approx import JIT_BY_ADDRESS, bits_to_float
from .attention import _row_softmax_update
from .bf16_gemm import (AMX_K, AMX_NR, AMX_ROWS, _copy_chunks, _interleave_pair, _lined, _pause, amx_off, amx_on,
                        amx_tile)
from .gemm import _U, _pack_strided
from .half import to_bf16
from .parallel import c_array_at, fetch_add, num_threads, run_at, worker_address

# Keys per block (BKA / 32 B panels of S, A chunks of P).  Llama-7B prefill 1 x 32 x 512 x
# 128, ms causal / full, 2 threads (SPR VM, 2026-12-06; PyTorch's SDPA 5.4-6.0 beside them):
# 64 7.44 / 10.6, 128 6.45 / 9.0, 256 6.48 / 7.6.  Of the full 7.1 ms: the softmax rows
# 4.0 (its three passes over a 1 KiB row from L2: 0.5 ns a score from L1 alone; one fused
# pass that rounds P as it goes was slower, 0.70), q K^T 1.7, P V 0.8, packing and the
# rest 0.9.
BKA = 256

# The worker's int64 argument block: addresses, sizes, the packed K / V panels, counters
# (packing tasks, their completions, items), then for each of q, k, v, out its element
# strides (batch, head, row) and extent (elements from the first to past the last).
(A_Q, A_K, A_V, A_OUT, A_KP, A_VP, A_B, A_HQ, A_HKV, A_SQ, A_SKV, A_D, A_SCALE, A_CAUSAL,
 A_PNEXT, A_PDONE, A_NEXT, A_STRIDES) = range(18)
A_COUNT = A_STRIDES + 16


def refusal():
    """None when the host can run it (AMX-BF16, granted by Linux), else why not."""
    from . import target
    off_x86 = target.x86_only_refusal(__name__, "flash_amx_worker")
    if off_x86 is not None:
        return off_x86
    return amx.refusal("amx-bf16")


def sizes(Skv, D):
    """(keys padded to whole blocks, K panel words, V panel words) per (batch, kv head)."""
    skp = -(-max(Skv, 1) // BKA) * BKA
    dp = -(-D // AMX_K) * AMX_K
    return skp, skp * dp // 2, skp // 2 * dp


@njit(inline="always")
def _pack_k(k16, k32, s0, lds, Skv, D, kp, d0, dp):
    """K rows (Skv, D) of one kv head at k16[s0:] (row stride lds values) as B panels of
    AMX_NR keys at kp[d0:] (uint32 [panel][dp/2 pairs][AMX_NR]), zeros past Skv and D.
    Even D and stride: the float32 GEMM's transposing packer on the 32-bit words (pairs
    past D zero); else pair by pair."""
    npan = -(-max(Skv, 1) // BKA) * BKA // AMX_NR
    if D % 2 == 0 and lds % 2 == 0 and s0 % 2 == 0:
        kf = kp.view(np.float32)
        for pn in range(npan):
            j0 = pn * AMX_NR
            d = d0 + pn * (dp // 2) * AMX_NR
            _pack_strided(k32, (s0 + j0 * lds) // 2, lds // 2, max(0, min(AMX_NR, Skv - j0)), D // 2, kf, d, AMX_NR)
            for i in range(D // 2 * AMX_NR, dp // 2 * AMX_NR):   # pairs past D
                kf[_U(d + i)] = 0
    else:
        for pn in range(npan):
            for t in range(dp // 2):
                for j in range(AMX_NR):
                    key = pn * AMX_NR + j
                    lo = np.uint32(k16[_U(s0 + key * lds + 2 * t)]) if key < Skv and 2 * t < D else np.uint32(0)
                    hi = np.uint32(k16[_U(s0 + key * lds + 2 * t + 1)]) if key < Skv and 2 * t + 1 < D else np.uint32(0)
                    kp[_U(d0 + (pn * (dp // 2) + t) * AMX_NR + j)] = lo | (hi << np.uint32(16))


@njit(inline="always")
def _pack_v(v16, s0, lds, Skv, D, skp, vp, d0):
    """V rows (Skv, D) of one kv head at v16[s0:] (row stride lds) as B panels of AMX_NR of
    its columns at vp[d0:] (uint32 [panel][skp/2 pairs of keys][AMX_NR]), zeros past Skv
    and D."""
    npd = -(-D // AMX_NR)
    full = D // AMX_NR
    pstride = skp // 2 * AMX_NR
    for t in range(skp // 2):
        k0 = 2 * t
        row = s0 + k0 * lds
        dt = d0 + t * AMX_NR
        if k0 + 1 < Skv:
            _interleave_pair(vp, dt, pstride, v16, row, lds, full)
        for pn in range(full if k0 + 1 < Skv else 0, npd):
            for j in range(AMX_NR):
                c = pn * AMX_NR + j
                lo = np.uint32(v16[_U(row + c)]) if k0 < Skv and c < D else np.uint32(0)
                hi = np.uint32(v16[_U(row + lds + c)]) if k0 + 1 < Skv and c < D else np.uint32(0)
                vp[_U(dt + pn * pstride + j)] = lo | (hi << np.uint32(16))


@njit(**JIT_BY_ADDRESS)
def flash_amx_worker(w, params):
    """A worker of flash_amx (parallel.run_at): the packing tasks, a wait until all are
    done, then the items from the A_NEXT counter (see the module docstring)."""
    p = c_array_at(params, np.int64(0), (A_COUNT,))
    B, Hq, Hkv, Sq, Skv, D = p[A_B], p[A_HQ], p[A_HKV], p[A_SQ], p[A_SKV], p[A_D]
    qs, ks, vs, os_ = A_STRIDES, A_STRIDES + 4, A_STRIDES + 8, A_STRIDES + 12
    scale = np.float32(bits_to_float(p[A_SCALE]))
    causal = p[A_CAUSAL] != 0
    skp = -(-max(Skv, 1) // BKA) * BKA
    dp = -(-D // AMX_K) * AMX_K
    nch = dp // AMX_K
    npd = dp // AMX_NR
    kwords, vwords = skp * dp // 2, skp // 2 * dp
    q16 = c_array_at(p[A_Q], np.uint16(0), (p[qs + 3],))
    k16 = c_array_at(p[A_K], np.uint16(0), (p[ks + 3],))
    k32 = c_array_at(p[A_K], np.float32(0), (p[ks + 3] // 2,))
    v16 = c_array_at(p[A_V], np.uint16(0), (p[vs + 3],))
    o16 = c_array_at(p[A_OUT], np.uint16(0), (p[os_ + 3],))
    kp = c_array_at(p[A_KP], np.uint32(0), (B * Hkv * kwords,))
    vp = c_array_at(p[A_VP], np.uint32(0), (B * Hkv * vwords,))
    # packing: (batch, kv head) x (K, V)
    npack = 2 * B * Hkv
    t = fetch_add(p, A_PNEXT, 1)
    while t < npack:
        bh = t // 2
        b, h = bh // Hkv, bh % Hkv
        if t % 2 == 0:
            _pack_k(k16, k32, b * p[ks] + h * p[ks + 1], p[ks + 2], Skv, D, kp, bh * kwords, dp)
        else:
            _pack_v(v16, b * p[vs] + h * p[vs + 1], p[vs + 2], Skv, D, skp, vp, bh * vwords)
        fetch_add(p, A_PDONE, 1)
        t = fetch_add(p, A_PNEXT, 1)
    while fetch_add(p, A_PDONE, 0) < npack:
        _pause()
    # the items' scratch, on cache lines (tile rows)
    qa = _lined(nch * AMX_ROWS * AMX_K // 2).view(np.uint16)       # q's rows as A chunks
    pa = _lined(BKA // AMX_K * AMX_ROWS * AMX_K // 2).view(np.uint16)   # P as A chunks
    st = _lined(AMX_ROWS * BKA)                                    # S, a block of scores
    acc = _lined(AMX_ROWS * dp)                                    # O, float32
    mv = np.empty(AMX_ROWS, np.float32)
    lv = np.empty(AMX_ROWS, np.float32)
    mb = np.zeros(BKA, np.float32)   # (no mask: _row_softmax_update does not read it)
    for i in range(pa.size):
        pa[i] = 0
    G = Hq // Hkv
    nqb = (Sq + AMX_ROWS - 1) // AMX_ROWS
    nitems = B * Hq * nqb
    off = Skv - Sq
    amx_on(True)
    item = fetch_add(p, A_NEXT, 1)
    while item < nitems:
        bh = item // nqb
        qb = nqb - 1 - item % nqb   # the last (longest, under causal) blocks first
        b, hq = bh // Hq, bh % Hq
        hk = hq // G
        r0 = qb * AMX_ROWS
        nq = min(AMX_ROWS, Sq - r0)
        qrow0 = b * p[qs] + hq * p[qs + 1]
        for i in range(AMX_ROWS):
            if i < nq:
                src = qrow0 + (r0 + i) * p[qs + 2]
                _copy_chunks(qa, i * AMX_K, q16, src, D // AMX_K)
                if D % AMX_K:   # the last chunk: the row's rest, zeros after
                    base = _U((D // AMX_K) * AMX_ROWS * AMX_K + i * AMX_K)
                    for t2 in range(AMX_K):
                        qa[base + t2] = q16[_U(src + D // AMX_K * AMX_K + t2)] if D // AMX_K * AMX_K + t2 < D else 0
            else:
                for c in range(nch):
                    base = _U(c * AMX_ROWS * AMX_K + i * AMX_K)
                    for t2 in range(AMX_K):
                        qa[base + t2] = 0
            mv[i] = -np.inf
            lv[i] = 0
        kv_end = Skv
        if causal:
            kv_end = max(0, min(Skv, r0 + nq - 1 + off + 1))
        kb0 = (b * Hkv + hk) * kwords
        vb0 = (b * Hkv + hk) * vwords
        for j0 in range(0, kv_end, BKA):
            jn = min(BKA, kv_end - j0)
            for pn in range(BKA // AMX_NR):
                amx_tile(nch, qa, 0, AMX_K, AMX_ROWS * AMX_K, kp, kb0 + (j0 // AMX_NR + pn) * (dp // 2) * AMX_NR,
                         st, pn * AMX_NR, BKA, 0)
            for r in range(nq):
                srow = st[r * BKA:(r + 1) * BKA]
                for j in range(BKA):
                    srow[j] *= scale
                lim = jn
                if causal:
                    lim = min(jn, r0 + r + off + 1 - j0)
                mn, ln, alpha = _row_softmax_update(srow, BKA, lim, mb, None, mv[r], lv[r])
                mv[r] = mn
                lv[r] = ln
                if alpha != np.float32(1) and j0 > 0:
                    for d in range(dp):
                        acc[r * dp + d] *= alpha
                for c in range(BKA // AMX_K):
                    base = _U(c * AMX_ROWS * AMX_K + r * AMX_K)
                    for t2 in range(AMX_K):
                        pa[base + t2] = to_bf16(srow[c * AMX_K + t2])
            for pn in range(npd):
                amx_tile(BKA // AMX_K, pa, 0, AMX_K, AMX_ROWS * AMX_K, vp, vb0 + pn * (skp // 2) * AMX_NR + j0 // 2 * AMX_NR,
                         acc, pn * AMX_NR, dp, j0)
        orow0 = b * p[os_] + hq * p[os_ + 1]
        for r in range(nq):
            dst = orow0 + (r0 + r) * p[os_ + 2]
            el = lv[r]
            if kv_end == 0 or el == np.float32(0):   # saw no key: zeros
                for d in range(D):
                    o16[_U(dst + d)] = 0
            else:   # l > 0, or NaN: NaN in, NaN out
                inv = np.float32(1) / el
                for d in range(D):
                    o16[_U(dst + d)] = to_bf16(acc[r * dp + d] * inv)
        item = fetch_add(p, A_NEXT, 1)
    amx_off(True)


def flash_amx(q, k, v, causal, scale, out, kp, vp):
    """out = attention(q, k, v) (bfloat16 bits as uint16: q, out (B, Hq, Sq, D), k, v (B,
    Hkv, Skv, D), rows of unit stride, non-negative strides; causal: the diagonal aligned to
    the bottom right) on numba's threads; kp / vp: uint32 scratch of B * Hkv * sizes(Skv,
    D)[1] / [2] words on cache lines.  Needs refusal() None."""
    why = amx.permission()
    if why is not None:
        raise RuntimeError(f"the AMX attention cannot run here: {why}")
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    for a in (q, k, v, out):
        if a.strides[-1] != 2 or min(a.strides) < 0:
            raise ValueError("flash_amx: rows must have unit stride and strides be non-negative")
    p = np.zeros(A_COUNT, np.int64)
    p[A_Q], p[A_K], p[A_V], p[A_OUT] = q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data
    p[A_KP], p[A_VP] = kp.ctypes.data, vp.ctypes.data
    p[A_B], p[A_HQ], p[A_HKV], p[A_SQ], p[A_SKV], p[A_D] = B, Hq, Hkv, Sq, Skv, D
    p[A_SCALE] = np.float64(scale).view(np.int64)
    p[A_CAUSAL] = bool(causal)
    for i, a in enumerate((q, k, v, out)):
        p[A_STRIDES + 4 * i:A_STRIDES + 4 * i + 3] = [s // 2 for s in a.strides[:3]]
        p[A_STRIDES + 4 * i + 3] = sum((n - 1) * s // 2 for n, s in zip(a.shape, a.strides)) + 1 if a.size else 0
    nitems = B * Hq * -(-Sq // AMX_ROWS)
    run_at(worker_address(flash_amx_worker, ()), p.ctypes.data, min(num_threads(), max(nitems, 2 * B * Hkv)))
