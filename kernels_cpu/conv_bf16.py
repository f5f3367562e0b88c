"""bfloat16 conv2d on AMX tiles, in two forms: the im2col matrix formed straight in the AMX
GEMM's B panels (any stride), and at stride 1 the direct form (below, run_direct), which
forms no im2col matrix at all.

    out[n, co, p] = bf16(act(sum_k Wb[co, k] * col_n[k, p]))    p = oy * OW + ox

x (N, C, H, W) and the weight hold bfloat16 bit patterns (uint16).  Per image n, col_n (K,
P = OH * OW) is the im2col matrix: row k = (ci, ky, kx) of the first Kc = C * KH * KW holds
x[n, ci, oy * sh - ph + ky * dh, ox * sw - pw + kx * dw] (zero outside the image); with a
bias one more row of ones (K = Kc + 1), which multiplies the bias column appended to the
weight's rows: the bias is one more exact product in the float32 sum.  Wb (Cout, K) is the
weight reshaped (plus that column).  The product runs on kernels_cpu.bf16_gemm.run_amx as
a matmul with (K, N) b's (tiles of the output's rows = channels, so the result lands in
NCHW order), whose packing tasks call im2col_pairs (its P_BPACK) for b: each forms its
KN_PAIRS pairs of col's rows in a row buffer and interleaves them into the B panels, so
the im2col matrix is written once, in the tiles' layout, and never as a (K, P) matrix.
Every product of two bfloat16 values is exact in float32 and the sums are float32 (as
PyTorch's bfloat16 convolution on the CPU), the result rounded once to bfloat16.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from kernels_common.memory import ALIGN

from . import amx, bf16_gemm as KB
from .approx import ACT_NONE, JIT_BY_ADDRESS, OVERLOAD
from .gemm import _U, _transpose_block, epilogue_address, epilogue_kernel
from .half import to_bf16
from .llvm_ir import arg_readers, splat
from .parallel import (c_array_at, call_address, fetch_add, num_threads, only_if, run_at, worker_address,
                       worker_addresses)

# im2col_pairs' arguments after bf16_gemm's P_COUNT slots (run_amx's b_packer extra)
(E_C, E_H, E_W, E_KH, E_KW, E_SH, E_SW, E_PH, E_PW, E_DH, E_DW, E_OH, E_OW, E_KC, E_COUNT) = range(15)
BF16_ONE = 0x3F80


def geometry(c, h, w, kh, kw, stride, pad, dilation, out_hw, kc) -> tuple:
    """im2col_pairs' extra arguments (E_* order)."""
    return (c, h, w, kh, kw, stride[0], stride[1], pad[0], pad[1], dilation[0], dilation[1], out_hw[0], out_hw[1], kc)


@intrinsic
def _span(typingctx, rows, o, x16, s, lo, hi, n):
    """rows[o + j] = x16[s + j] for lo <= j < hi, 0 for the other j < n (uint16 arrays): 32
    lanes at a time by masked loads (x16 read only at lo <= j < hi) and masked stores."""
    if not (isinstance(rows, types.Array) and rows.dtype == types.uint16 and isinstance(x16, types.Array)
            and x16.dtype == types.uint16):
        return None

    def codegen(context, builder, sig, args):
        i64_of, data = arg_readers(context, builder, sig, args)
        i1, i16, i32, i64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        vty = ir.VectorType(i16, SPAN)
        mty = ir.VectorType(i1, SPAN)
        pty = vty.as_pointer()
        ld = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [pty, i32, mty, vty]),
                                            f"llvm.masked.load.v{SPAN}i16.p0")
        st = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [vty, pty, i32, mty]),
                                            f"llvm.masked.store.v{SPAN}i16.p0")
        align = ir.Constant(i32, 2)
        zero = ir.Constant(vty, [ir.Constant(i16, 0)] * SPAN)
        lanes = ir.Constant(ir.VectorType(i64, SPAN), list(range(SPAN)))
        dst = builder.gep(data(0), [i64_of(1)])
        src = builder.gep(data(2), [i64_of(3)])
        lo, hi, n = (splat(builder, i64_of(i), SPAN) for i in (4, 5, 6))
        nchunks = builder.udiv(builder.add(i64_of(6), ir.Constant(i64, SPAN - 1)), ir.Constant(i64, SPAN))
        with cgutils.for_range(builder, nchunks) as loop:
            j0 = builder.mul(loop.index, ir.Constant(i64, SPAN))
            j = builder.add(splat(builder, j0, SPAN), lanes)
            take = builder.and_(builder.icmp_signed(">=", j, lo), builder.icmp_signed("<", j, hi))
            put = builder.icmp_signed("<", j, n)
            v = builder.call(ld, [builder.bitcast(builder.gep(src, [j0]), pty), align, take, zero])
            builder.call(st, [v, builder.bitcast(builder.gep(dst, [j0]), pty), align, put])
        return context.get_dummy_value()

    return types.none(rows, o, x16, s, lo, hi, n), codegen


SPAN = 32   # uint16 lanes of _span's vectors (one zmm; LLVM splits them where vectors are narrower)


@njit(inline="always")
def _col_row(x16, xoff, k, e, rows, r0):
    """rows[r0 + p] = col[k, p] for p < OH * OW (x16[xoff:] the image; e the geometry)."""
    H, W, KH, KW = e[E_H], e[E_W], e[E_KH], e[E_KW]
    sh, sw, ph, pw, dh, dw, OH, OW, Kc = e[E_SH], e[E_SW], e[E_PH], e[E_PW], e[E_DH], e[E_DW], e[E_OH], e[E_OW], e[E_KC]
    if k >= Kc:   # the bias's row of ones (k == Kc, K = Kc + 1)
        for j in range(_U(OH * OW)):
            rows[_U(r0) + j] = np.uint16(BF16_ONE)
        return
    ci = k // (KH * KW)
    ky = (k - ci * KH * KW) // KW
    kx = k - ci * KH * KW - ky * KW
    ix0 = kx * dw - pw
    # output columns whose input column ox * sw + ix0 lies in [0, W)
    lo = min(max((-ix0 + sw - 1) // sw, 0), OW)
    hi = max(min((W - ix0 + sw - 1) // sw, OW), lo)
    for oy in range(OH):
        o = r0 + oy * OW
        iy = oy * sh - ph + ky * dh
        if iy < 0 or iy >= H:
            _span(rows, o, x16, 0, 0, 0, OW)
        elif sw == 1:
            _span(rows, o, x16, xoff + (ci * H + iy) * W + ix0, lo, hi, OW)
        else:
            s = xoff + (ci * H + iy) * W + ix0
            for j in range(OW):
                rows[_U(o + j)] = x16[_U(s + j * sw)] if lo <= j < hi else np.uint16(0)


def pack_tasks(k, dot=False) -> int:
    """im2col_pairs' tasks per image (run_amx's or, dot, run_kn's b_packer) for K = k rows of
    col (dot: k even)."""
    pairs = k // 2 if dot else -(-k // KB.AMX_K) * (KB.AMX_K // 2)
    return -(-pairs // KB.KN_PAIRS)


@njit(**JIT_BY_ADDRESS)
def im2col_pairs(i, params, dot):
    """Packing task i of run_amx's b (bf16_gemm.P_BPACK): image i // bt, pairs q of col's
    rows (2q, 2q + 1) from KN_PAIRS * (i % bt) on (bt = pack_tasks(K)), each pair formed
    in a row buffer (the two rows a whole number of panels apart, zeros past the last pixel)
    and interleaved into the image's B panels at P_W (uint32 [image][panel of AMX_NR
    pixels][P_K2P pairs][AMX_NR]: the pair's two values one word).  Whole rows of col at a
    time: a task of a band of pixels instead (all pairs, 128 pixels) ran 12-55% slower.
    dot (a literal True): run_kn's b instead, pixels its P_M, panels of NR pixels at P_X,
    P_K2 pairs."""
    p = c_array_at(params, np.int64(0), (KB.P_COUNT + E_COUNT,))
    e = p[KB.P_COUNT:]
    if dot is None:
        K, N, K2p, nb, width, at = p[KB.P_K], p[KB.P_N], p[KB.P_K2P], p[KB.P_NB], KB.AMX_NR, p[KB.P_W]
    else:
        K, N, K2p, nb, width, at = p[KB.P_K], p[KB.P_M], p[KB.P_K2], p[KB.P_NB], KB.NR, p[KB.P_X]
    bt = (K2p + KB.KN_PAIRS - 1) // KB.KN_PAIRS
    bi = i // bt
    q0 = (i - bi * bt) * KB.KN_PAIRS
    npan = (N + width - 1) // width
    Np = npan * width
    img = e[E_C] * e[E_H] * e[E_W]
    x16 = c_array_at(p[KB.P_BSRC], np.uint16(0), (nb * img,))
    dst = c_array_at(at, np.uint32(0), (nb * npan * K2p * width,))
    rows = np.zeros(2 * Np, np.uint16)   # zeros past the last pixel stay zeros
    for q in range(q0, min(q0 + KB.KN_PAIRS, K2p)):
        for h in range(2):
            k = 2 * q + h
            if k < K:
                _col_row(x16, bi * img, k, e, rows, h * Np)
            else:   # past K (the last chunk's padding): zeros
                for j in range(_U(N)):
                    rows[_U(h * Np) + j] = np.uint16(0)
        if dot is None:
            KB._interleave_pair(dst, (bi * npan * K2p + q) * width, K2p * width, rows, 0, Np, npan)
        else:
            KB._interleave_pair_dot(dst, (bi * npan * K2p + q) * width, K2p * width, rows, 0, Np, npan)


# ---- stride 1: the direct form ------------------------------------------------------------
# With stride 1 no im2col matrix is formed.  x is copied once per call into xq, the image
# zero-padded, channels last and padded to whole AMX chunks (Cp: a multiple of AMX_K):
# xq[n, r, c] with r = yy * Wq + xx the pixel of the padded image (Wq its width).  Output
# pixels are numbered in the same pitch, o = oy * Wq + ox (ox < OW; the others are computed
# and dropped), so the A tile of 16 output pixels for tap (ky, kx) and 32 channels is 16
# rows of xq Cp values apart from row o + ky * dh * Wq + kx * dw: read in place, and with
# dw = 1 the taps of one kernel row are consecutive chunks (pixel o + kx's channels follow
# pixel o + kx - 1's), so one amx_tile call runs a whole kernel row.  The weight is packed
# into B panels of 32 output channels, K ordered (ky, kx, c < Cp) in pairs (wq).  The C
# tiles are pixels x channels: a task's block is transposed (8 x 8 register transposes)
# into the output's channel rows, bias + activation before, rounded on the way out.
(D_X, D_XQ, D_W, D_WQ, D_BIAS, D_OUT, D_N, D_C, D_H, D_WID, D_CO, D_KH, D_KW, D_DH, D_DW, D_PT, D_PL, D_OH, D_OW,
 D_HP, D_PITCH, D_CP, D_ROWS, D_PB, D_CG, D_EPI, D_HAS_BIAS, D_PNEXT, D_PDONE, D_NEXT, D_PACK, D_WREADY,
 D_COUNT) = range(33)
# Pitched output pixels per task (a multiple of the tiles' 32 rows), and at least this many
# tasks (the output channels split into groups of 32-channel panels until there are).
# Each task reads all of its channels' weight panels: SD U-Net 3x3 320ch 64x64 + relu (1.8
# MB of panels), 2 threads, medians of 7 x 10 calls (Xeon with AMX, 2026-12-07), PB 128 /
# 256 / 512: 4.90 / 4.48 / 4.66 ms (PyTorch 3.8-4.0); ResNet-50 3x3 64ch 56x56 0.36 / 0.34 /
# 0.35.  Without the split ResNet-50's 3x3 256ch 14x14 was one task (0.72 ms, one thread;
# split 0.41).
DIRECT_PB = 256
DIRECT_MIN_TASKS = 8
# The vdpbf16ps form (dot, hosts without AMX): tiles of bf16_gemm.MR pixels x NR channels, so
# a task's pixels are a multiple of MR (its groups of pixels stay in the block) and of 8 (the
# transposes).
DIRECT_PB_DOT = 240


def direct_shapes(n, c, h, w, cout, kh, kw, pad, dilation, out_hw, dot=False):
    """(xq elements (uint16), wq words (uint32), Cp, Wq, Hp, rows) of the direct form's
    buffers (dot: the vdpbf16ps form's, channels padded to pairs, panels of NR channels)."""
    oh, ow = out_hw
    cp = max(-(-c // 2) * 2, 2) if dot else max(-(-c // KB.AMX_K) * KB.AMX_K, KB.AMX_K)
    width = KB.NR if dot else KB.AMX_NR
    wq_ = ow + (kw - 1) * dilation[1]          # the padded width (stride 1)
    hp = oh + (kh - 1) * dilation[0]
    # rows read: every task's pixel groups (whole 32s) at the last tap
    npq = oh * wq_
    last = -(-npq // DIRECT_PB) * DIRECT_PB
    rows = max(hp * wq_, last + (kh - 1) * dilation[0] * wq_ + (kw - 1) * dilation[1])
    return n * rows * cp, -(-cout // width) * (kh * kw * cp // 2) * width, cp, wq_, hp, rows


@njit(inline="always")
def _fill_row(p, e, yy, x16, xq, tmp):
    """xq's padded row yy of image e (and, for the last row, the slack rows after it): each
    8 channel pairs' words formed in tmp (8 x W uint32: x[c] | x[c + 1] << 16), then moved
    into the pixels' rows by 8 x 8 register transposes (the words as float32 bits)."""
    C, H, W, Cp, Wq = p[D_C], p[D_H], p[D_WID], p[D_CP], p[D_PITCH]
    pt, pl, ROWS, Hp = p[D_PT], p[D_PL], p[D_ROWS], p[D_HP]
    base = (e * ROWS + yy * Wq) * Cp
    end = base + Wq * Cp if yy < Hp - 1 else (e + 1) * ROWS * Cp
    iy = yy - pt
    zero = np.uint16(0)
    for i in range(_U(base), _U(end)):
        xq[i] = zero
    if iy < 0 or iy >= H:
        return
    xq32 = xq.view(np.float32)
    tmpf = tmp.view(np.float32)
    C2 = (C + 1) // 2
    W8 = W - W % 8
    for cp0 in range(0, C2, 8):
        npair = min(8, C2 - cp0)
        for r in range(8):
            cp = cp0 + r
            t0 = _U(r * W)
            lo = ((e * C + 2 * cp) * H + iy) * W
            if cp >= C2:
                for ix in range(_U(W)):
                    tmp[t0 + ix] = np.uint32(0)
            elif 2 * cp + 1 < C:
                hi = lo + H * W
                for ix in range(_U(W)):
                    tmp[t0 + ix] = np.uint32(x16[_U(lo) + ix]) | (np.uint32(x16[_U(hi) + ix]) << np.uint32(16))
            else:
                for ix in range(_U(W)):
                    tmp[t0 + ix] = np.uint32(x16[_U(lo) + ix])
        d0 = base // 2 + pl * (Cp // 2) + cp0
        if npair == 8:
            for ix in range(0, W8, 8):
                _transpose_block(tmpf, ix, W, xq32, d0 + ix * (Cp // 2), Cp // 2)
        for ix in range(W8 if npair == 8 else 0, W):
            for r in range(npair):
                xq32[_U(d0 + ix * (Cp // 2) + r)] = tmpf[_U(r * W + ix)]


@njit(inline="always")
def _pack_wq(p, j, w16, wq, width, rows):
    """wq's panel j: output channels width * j.. in pairs of K = (ky, kx, c < Cp), zero past
    C / Cout.  The panel's weight rows (consecutive channels: one block of the weight) are
    first transposed whole into rows (uint16, (C x taps) x width: 8 x 8 register transposes),
    whose rows c and c + 1 of a tap then interleave into that K pair's words, width channels
    at a time (vector loads and stores).  Forming each channel's pair words first and
    transposing those took 2.5-4x as long (ResNet-50's 3x3 512 x 512 weight, 8 panels: 1012
    us on one thread, 551 on two; Zen 4, 2026-12-08), gathering each word straight from the
    weight 317 us for 3x3 256 x 256 (one thread, 2026-12-07)."""
    C, CO, KH, KW, Cp = p[D_C], p[D_CO], p[D_KH], p[D_KW], p[D_CP]
    T = KH * KW
    K2p = T * Cp // 2
    C2 = Cp // 2
    L = C * T
    nco = min(width, CO - j * width)
    st = rows.view(np.uint16)   # st[l * width + r] = w16[(j * width + r) * L + l]
    src = j * width * L
    r8 = nco - nco % 8
    l8 = L - L % 8
    for r0 in range(0, r8, 8):
        for l0 in range(0, l8, 8):
            _transpose_block(w16, src + r0 * L + l0, L, st, l0 * width + r0, width)
        for r in range(r0, r0 + 8):
            for l in range(l8, L):
                st[_U(l * width + r)] = w16[_U(src + r * L + l)]
    for r in range(r8, nco):
        for l in range(L):
            st[_U(l * width + r)] = w16[_U(src + r * L + l)]
    zero = np.uint32(0)
    for tap in range(T):
        for c2 in range(C2):
            d = _U((j * K2p + tap * C2 + c2) * width)
            lo = _U((2 * c2 * T + tap) * width)
            hi = lo + _U(T * width)
            if 2 * c2 + 1 < C:
                for r in range(_U(nco)):
                    wq[d + r] = np.uint32(st[lo + r]) | (np.uint32(st[hi + r]) << np.uint32(16))
            elif 2 * c2 < C:
                for r in range(_U(nco)):
                    wq[d + r] = np.uint32(st[lo + r])
            else:
                for r in range(_U(nco)):
                    wq[d + r] = zero
            for r in range(_U(nco), _U(width)):
                wq[d + r] = zero


def _panel_width(dot):
    return 0


@overload(_panel_width, **OVERLOAD)
def _panel_width_overload(dot):
    """Output channels per weight panel: AMX_NR for the AMX form (dot None), NR for vdpbf16ps."""
    width = KB.AMX_NR if isinstance(dot, types.NoneType) else KB.NR
    return lambda dot: width


@njit(**JIT_BY_ADDRESS)
def direct_pack(t, params, scratch, nscratch, dot):
    """Packing task t of run_direct (its D_PACK, called by address from direct_worker): t <
    N * Hp fills xq's padded row t of its image (_fill_row), the others the weight's panel
    t - N * Hp (_pack_wq); scratch: a uint32 buffer of nscratch words, the worker's.  A
    function of its own, compiled beside direct_worker (compile_kernels): together they took
    3.8 s cold, the packing alone 2.6 (Zen 4, 2026-12-07)."""
    p = c_array_at(params, np.int64(0), (D_COUNT,))
    N, C, H, W, CO = p[D_N], p[D_C], p[D_H], p[D_WID], p[D_CO]
    Hp, Cp, ROWS = p[D_HP], p[D_CP], p[D_ROWS]
    PW = _panel_width(dot)
    K2p = p[D_KH] * p[D_KW] * Cp // 2
    ncop = (CO + PW - 1) // PW
    buf = c_array_at(scratch, np.uint32(0), (nscratch,))
    if t < N * Hp:
        x16 = c_array_at(p[D_X], np.uint16(0), (N * C * H * W,))
        xq = c_array_at(p[D_XQ], np.uint16(0), (N * ROWS * Cp,))
        _fill_row(p, t // Hp, t - (t // Hp) * Hp, x16, xq, buf)
    else:
        w16 = c_array_at(p[D_W], np.uint16(0), (CO * C * p[D_KH] * p[D_KW],))
        wq = c_array_at(p[D_WQ], np.uint32(0), (ncop * K2p * PW,))
        _pack_wq(p, t - N * Hp, w16, wq, PW, buf)


@njit(**JIT_BY_ADDRESS)
def direct_worker(wk, params, dot):
    """A worker of run_direct: the copy of x into xq (a task per padded row) and the weight's
    panels (a task per panel of output channels), all workers taking those first and waiting
    until all are done; then tasks of D_PB pitched pixels of one image x D_CG panels.  dot
    None: AMX tiles, panels of 32 channels; a literal True: vdpbf16ps (bf16_gemm.dot_tile),
    tiles of MR pixels (broadcast words of xq's rows, read in place) x NR channels."""
    p = c_array_at(params, np.int64(0), (D_COUNT,))
    N, W, CO = p[D_N], p[D_WID], p[D_CO]
    KH, KW, dh, dw, OH, OW = p[D_KH], p[D_KW], p[D_DH], p[D_DW], p[D_OH], p[D_OW]
    Hp, Wq, Cp, ROWS, PB, CG = p[D_HP], p[D_PITCH], p[D_CP], p[D_ROWS], p[D_PB], p[D_CG]
    PW = _panel_width(dot)
    ncop = (CO + PW - 1) // PW
    ncg = (ncop + CG - 1) // CG
    K2p = KH * KW * Cp // 2
    LDT = CG * PW
    xq = c_array_at(p[D_XQ], np.uint16(0), (N * ROWS * Cp,))
    wq = c_array_at(p[D_WQ], np.uint32(0), (ncop * K2p * PW,))
    bias = c_array_at(p[D_BIAS], np.float32(0), (CO,))
    out = c_array_at(p[D_OUT], np.uint16(0), (N * CO * OH * OW,))
    npack = N * Hp + (0 if p[D_WREADY] != 0 else ncop)   # wq packed before the call (pack_direct_weight)
    t = fetch_add(p, D_PNEXT, 1)
    scratch = np.empty(max(8 * W, PW * K2p), np.uint32)   # direct_pack's
    while t < npack:
        call_address(p[D_PACK], (t, params, scratch.ctypes.data, scratch.size))
        fetch_add(p, D_PDONE, 1)
        t = fetch_add(p, D_PNEXT, 1)
    while fetch_add(p, D_PDONE, 0) < npack:
        KB._pause()
    accf = KB._lined(PB * LDT)    # the task's C tiles: pixels x channels
    acct = np.empty(LDT * PB, np.float32)   # transposed: channels x pixels
    # the tasks' pixel numbering: AMX tiles read 16 consecutive rows of xq, so their pixels
    # are pitched (o = oy * Wq + ox, the ox >= OW computed and dropped); vdpbf16ps tiles
    # address each pixel's row apart (wo), so only the output's own pixels are computed
    # (o = oy * OW + ox; ResNet-50's 7 x 7 maps: 49 where pitched 63)
    Wo = OW if dot is not None else Wq
    npq = OH * Wo
    nblk = (npq + PB - 1) // PB
    ntask = N * nblk * ncg
    chunks = KW * Cp // KB.AMX_K if dw == 1 else Cp // KB.AMX_K
    xq32 = c_array_at(p[D_XQ], np.uint32(0), (N * ROWS * Cp // 2,))
    wo = np.empty(KB.MR, np.int64)
    if dot is None:
        KB.amx_on(True)
    task = fetch_add(p, D_NEXT, 1)
    while task < ntask:
        e = task // (nblk * ncg)
        blk = (task - e * nblk * ncg) // ncg
        g = task - e * nblk * ncg - blk * ncg
        j0 = g * CG
        j1 = min(j0 + CG, ncop)
        c1 = min(j1 * PW, CO)
        p0 = blk * PB
        p1 = min(p0 + PB, npq)
        ng = (p1 - p0 + KB.AMX_ROWS - 1) // KB.AMX_ROWS
        # K in blocks of AMX_KCH chunks (a kernel row's, or with dw > 1 a tap's, chunks),
        # each over every tile of the block: a B panel's block is read from L1 by each
        # group of pixels, the C tiles stored and loaded again between blocks
        first = 0
        if dot is not None:
            # a kernel row's taps (with dw = 1) or one tap at a time, each over every group of
            # MR pixels of the block: the weight panel's slice stays in L1, the tiles are
            # stored and loaded again between slices (a group's last pixels repeat the
            # block's last: never past xq's rows)
            kq = KW * Cp // 2 if dw == 1 else Cp // 2
            for j in range(j0, j1):
                for ky in range(KH):
                    for kx in range(KW if dw != 1 else 1):
                        tap = ky * KW + kx
                        for a in range(0, p1 - p0, KB.MR):
                            for i in range(KB.MR):
                                pix = min(p0 + a + i, p1 - 1)
                                oy = pix // OW
                                wo[i] = (e * ROWS + oy * Wq + pix - oy * OW + ky * dh * Wq + kx * dw) * (Cp // 2)
                            KB.dot_tile(kq, xq32, wo, wq, (j * K2p + tap * Cp // 2) * PW, accf,
                                        a * LDT + (j - j0) * PW, LDT, first)
                        first = 1
                first = 0
        else:
            for ky in range(KH):
                for kx in range(KW if dw != 1 else 1):
                    tap = ky * KW + kx
                    for kb in range(0, chunks, KB.AMX_KCH):
                        nkb = min(KB.AMX_KCH, chunks - kb)
                        for j in range(j0, j1):
                            for a in range(ng):
                                r0 = e * ROWS + p0 + a * KB.AMX_ROWS + ky * dh * Wq + kx * dw
                                KB.amx_tile(nkb, xq, r0 * Cp + kb * KB.AMX_K, Cp, KB.AMX_K, wq,
                                            (j * K2p + tap * Cp // 2) * KB.AMX_NR + kb * (KB.AMX_K // 2) * KB.AMX_NR, accf,
                                            a * KB.AMX_ROWS * LDT + (j - j0) * KB.AMX_NR, LDT, first)
                        first = 1
        rows = ng * KB.AMX_ROWS if dot is None else (p1 - p0 + 7) // 8 * 8
        if p[D_EPI] != 0:   # bias + activation on the channels (the columns)
            call_address(p[D_EPI], (accf.ctypes.data, LDT, rows, c1 - j0 * PW, p[D_BIAS] + j0 * PW * 4))
        for r in range(0, rows, 8):
            for c0 in range(0, (j1 - j0) * PW, 8):
                _transpose_block(accf, r * LDT + c0, LDT, acct, c0 * PB + r, PB)
        add_bias = p[D_HAS_BIAS] != 0 and p[D_EPI] == 0
        for oy in range(p0 // Wo, min((p1 - 1) // Wo + 1, OH)):
            a0 = max(p0 - oy * Wo, 0)
            b0 = min(p1 - oy * Wo, OW)
            if a0 >= b0:
                continue
            for co in range(j0 * PW, c1):
                src = _U((co - j0 * PW) * PB + oy * Wo - p0)
                dst = _U(((e * CO + co) * OH + oy) * OW)
                if add_bias:
                    bv = bias[co]
                    for ox in range(_U(a0), _U(b0)):
                        out[dst + ox] = to_bf16(acct[src + ox] + bv)
                else:
                    for ox in range(_U(a0), _U(b0)):
                        out[dst + ox] = to_bf16(acct[src + ox])
        task = fetch_add(p, D_NEXT, 1)
    if dot is None:
        KB.amx_off(True)


def run_direct(x4, w4, bias32, has_bias, code, pad, dilation, out_hw, out3, xq, wq, dot=False, wq_ready=False):
    """out3 (N, Cout, OH*OW) uint16 = bf16(act(conv2d(x4, w4) + bias)) at stride 1: x4 (N, C,
    H, W) and w4 (Cout, C, KH, KW) uint16 bfloat16 bits, bias32 (Cout,) float32 (added when
    has_bias), code an ACT_*, pad (top, left), all C-contiguous; xq (uint16) and wq
    (uint32) buffers of direct_shapes' sizes (with the same dot) on cache lines.  wq_ready:
    wq already holds w4's panels (pack_direct_weight, same dot), which the call then does
    not pack.  Needs bf16_gemm.amx_refusal() None, or with dot (vdpbf16ps)
    bf16_gemm.host_refusal() None."""
    n, c, h, w = x4.shape
    cout, _, kh, kw = w4.shape
    nxq, nwq, cp, wq_, hp, rows = direct_shapes(n, c, h, w, cout, kh, kw, pad, dilation, out_hw, dot)
    if xq.size < nxq:
        raise ValueError("run_direct: xq needs direct_shapes' size on a cache line")
    p = _direct_params(x4.ctypes.data, w4, wq, nwq, dot)
    p[D_XQ], p[D_BIAS], p[D_OUT] = xq.ctypes.data, bias32.ctypes.data, out3.ctypes.data
    p[D_N], p[D_H], p[D_WID] = n, h, w
    p[D_DH], p[D_DW], p[D_PT], p[D_PL] = dilation[0], dilation[1], pad[0], pad[1]
    p[D_OH], p[D_OW] = out_hw
    pb = DIRECT_PB_DOT if dot else DIRECT_PB
    ncop = -(-cout // (KB.NR if dot else KB.AMX_NR))
    nblk = -(-out_hw[0] * (out_hw[1] if dot else wq_) // pb)   # (direct_worker's pixel numbering)
    cg = ncop
    while n * nblk * -(-ncop // cg) < DIRECT_MIN_TASKS and cg > 1:
        cg = -(-cg // 2)
    p[D_HP], p[D_PITCH], p[D_ROWS], p[D_PB], p[D_CG] = hp, wq_, rows, pb, cg
    p[D_EPI] = epilogue_address(np.float32, code) if code != ACT_NONE else 0
    p[D_HAS_BIAS], p[D_WREADY] = has_bias, wq_ready
    ntask = n * nblk * -(-ncop // cg)
    run_at(worker_address(direct_worker, (only_if(dot),)), p.ctypes.data, max(1, min(num_threads(), ntask)))


def _direct_params(x_address, w4, wq, nwq, dot):
    """run_direct's parameters that the weight decides (the packing tasks' part)."""
    why = KB.host_refusal() if dot else amx.permission()
    if why is not None:
        raise RuntimeError(f"the {'vdpbf16ps' if dot else 'AMX'} path cannot run here: {why}")
    if wq.size < nwq or wq.ctypes.data % ALIGN:
        raise ValueError("run_direct: wq needs direct_shapes' size on a cache line")
    cout, c, kh, kw = w4.shape
    p = np.zeros(D_COUNT, np.int64)
    p[D_X], p[D_W], p[D_WQ] = x_address, w4.ctypes.data, wq.ctypes.data
    p[D_C], p[D_CO], p[D_KH], p[D_KW] = c, cout, kh, kw
    p[D_CP] = direct_shapes(0, c, 1, 1, cout, kh, kw, (0, 0), (1, 1), (1, 1), dot)[2]
    p[D_PACK] = worker_address(direct_pack, (only_if(dot),), 4)
    return p


def direct_weight_words(w_shape, dot=False) -> int:
    """The uint32 words of the direct form's packed weight (wq) for a (Cout, C, KH, KW) weight."""
    cout, c, kh, kw = w_shape
    return direct_shapes(0, c, 1, 1, cout, kh, kw, (0, 0), (1, 1), (1, 1), dot)[1]


def pack_direct_weight(w4, wq, dot=False):
    """wq = w4's panels as run_direct packs them per call (its wq_ready=True then skips that):
    w4 (Cout, C, KH, KW) uint16 bfloat16 bits, C-contiguous; wq uint32 of
    direct_weight_words(w4.shape, dot) words on a cache line.  Runs direct_worker with no
    image: its packing tasks are the weight's panels only, on the pool's threads."""
    p = _direct_params(0, w4, wq, direct_weight_words(w4.shape, dot), dot)
    p[D_PB], p[D_CG] = DIRECT_PB_DOT if dot else DIRECT_PB, 1
    ncop = -(-w4.shape[0] // (KB.NR if dot else KB.AMX_NR))
    run_at(worker_address(direct_worker, (only_if(dot),)), p.ctypes.data, max(1, min(num_threads(), ncop)))


def compile_kernels(direct, code, dot=False):
    """Compile (or load) the by-address kernels of a call of the direct form or of the
    im2col one with activation `code`, the cold ones in two processes at once
    (parallel.worker_addresses): a cold first call of the im2col form took 3.09 s compiling
    them one after another (ResNet-50's stem, Xeon with AMX, 2026-12-07).  Cached after the
    first call.  dot: the vdpbf16ps variants (both forms)."""
    if direct:
        reqs = [(direct_worker, (only_if(dot),)), (direct_pack, (only_if(dot),), 4)]
    else:
        reqs = [(KB.bf16_worker, (None if dot else True, True, None)), (im2col_pairs, (only_if(dot),))]
    if code != ACT_NONE:
        reqs.append(epilogue_kernel(np.float32, code))
    worker_addresses(reqs)
