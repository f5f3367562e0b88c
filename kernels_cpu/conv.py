"""2-D convolution (NCHW), with the per-channel bias and the activation fused.

x (N, C, H, W), weight (Cout, C / groups, KH, KW), out (N, Cout, OH, OW), all C-contiguous.
Geometry: stride (sh, sw), dilation (dh, dw), and the top / left padding (ph, pw) (the
bottom / right padding is implied by OH, OW, which the caller computes: padding="same"
may pad one more on the far side).  Output (oy, ox) of channel co reads input rows
oy*sh - ph + ky*dh and columns ox*sw - pw + kx*dw, zero outside the image.

Dense and grouped convolutions (conv_direct) run on the GEMM's register-tiled micro-kernel
(gemm.py), on its active tile (gemm.active_tile: 8x48 of 16-lane vectors on AVX-512 hosts,
6x16 of 8-lane ones elsewhere): per image n and group g, out[n, g] (Cout_g, P = OH*OW) =
W_g (Cout_g, Kc) @ col (Kc, P), Kc = Cin_g*KH*KW, the weight packed into the tile's MR-row
panels (pack_weight, numpy; once for good with dispatch.prepack, which records the tile).
The im2col matrix col is never formed.  Output pixels are numbered in a row pitch
Wq = OW + the taps' reach, o = oy*Wq + ox, and in that pitch row k of col for NR
consecutive pixels (a tile, running on across rows) is NR consecutive values of the
zero-padded, stride-phase-split image at a per-k offset (tab): the micro-kernel reads B
straight from there (micro_tile_indexed), no packing.  A task, a run of tiles of one
image's pixels, copies the input rows it reads into that layout in its worker's buffer
(_task_rows; an unpadded stride-1 1x1 packs each tile's B rows from x's channel planes
instead, nr values of each, a K block at a time), accumulates its tiles over the K blocks
in the worker's accumulator block, CHUNK_TILES tiles at a time, and writes each chunk's
part of the output rows once, bias + activation on the way (conv_compact).  Extra memory
per thread: a task's input rows (the unpadded 1x1: one packed tile) and a chunk's output
(SD U-Net 3x3 320ch 64x64, float32: 0.8 MiB + 240 KiB).

Measurements (2 threads, prepacked + bias + ReLU, interleaved medians).  Before the direct
form, a packed im2col block per task cost 35-45% of a 3x3 convolution's time (ResNet-50 3x3
64ch 56x56: 5.85 ms packed, 3.28 ms direct; 7x7/2 stem: 4.24 -> 3.28 ms).  The 6x16 tile
with tiles inside one row -> the 8x48 tile with pitched tiles (Sapphire Rapids, 2026-11-26):
3x3 64ch 1.75-1.81 -> 1.25-1.34 ms, stem 1.73-1.79 -> 1.30-1.37, SD U-Net 3x3 320ch 64x64
42.5-46.9 -> 28.8-30.2.  Then (Zen 5, 2026-11-26, 1 / 2 threads, medians of 9):
- tiles accumulated in the worker's block instead of each tile copied (added, after the
  first K block) from a tile buffer into out: 3x3 64ch 1.05-1.07 / 0.60 -> 0.99 / 0.58 ms,
  stem 1.14-1.19 / 0.64 -> 1.09 / 0.60, SD U-Net 32.0-32.5 / 16.3 -> 30.6 / 15.6 ms;
- each task copying its own rows instead of one serial padded copy of x before the
  workers (30 / 65 / 179 us for the three): stem 0.60 -> 0.55-0.56 ms on 2 threads;
- tasks as runs of tiles, 2 per thread (4 per thread: 3x3 64ch 0.56 ms, 3: 0.56, 2: 0.53,
  1: 0.53; the stem and SD U-Net within noise), where whole output rows per task rounded
  every task up to whole tiles;
- the unpadded 1x1 read in place instead of packed per task (conv_gemm, now gone):
  1x1 256->64 56x56 0.57 / 0.31 -> 0.52 / 0.285 ms, 1024->256 14x14 0.65 / 0.42 ->
  0.59 / 0.38, 2048->512 7x7 0.51 ms either way;
- then (Sapphire Rapids, 2026-12-02, 1 / 2 threads, prepacked + bias + relu, medians of 7
  x 20 calls, old / new trees alternating twice): each tile's B packed (KC rows of nr, from
  the 1x1's channel planes, zero past the image) instead of read in place: 1x1 256->64
  56x56 1193-1203 / 705-758 -> 944-1017 / 625-628 us, 1024->256 14x14 1018-1057 / 712-726
  -> 942-960 / 663-668, 2048->512 7x7 1481-1524 / 908-946 -> 1408-1414 / 849-853, 128->512
  28x28 960-1015 / 622-628 -> 901-923 / 609-614, 64->256 4x56x56 4668-4788 / 2382-2464 ->
  3961-3972 / 2109-2144.  In place, each B row of a tile lies in another channel plane (12.5
  KB apart at 56x56): the micro-kernel alone ran 105-110 GF/s on such rows against 180 on
  packed ones (one thread), and the old path also copied the last task's whole input (its
  last tile's junk lanes would read past x);  packing a tile costs one strided read instead
  of one per weight panel.  Packing runs of 2-8 tiles at once (longer reads of each plane):
  no better (1005-1054 / 633-674 us);
- tile loop inside the panel loop (B tile in L1, A panels from L2) or outside it, KC 256 /
  640 / 1024: within noise.

Tasks come from an atomic counter (dynamic: a thread that loses its core to another
process does not hold the others up).

depthwise: groups == C, Cout = C * multiplier: each output plane is a weighted sum of
KH*KW shifted copies of one input plane.  Column stride 1 (depthwise_direct_worker): blocks
of DW_ROWS output rows x one vector of columns in registers, read from the input plane with
masked vector loads (the padding is the masked-off lanes, rows outside the plane read a row
of zeros), bias + relu applied before the store; 3x3 and 5x5 with row stride 1 unrolled,
each input row loaded once per tap column.  1x384x14x14 3x3 + bias + relu, one thread,
Sapphire Rapids (2026-11-26): 85 us with a padded copy of each plane and a vector loop over
it per tap, 22-24 us now.  Larger column strides (depthwise_phase_worker): the plane is
split into its stride phases (planes.py) and the taps run as long vector loops over them.
All run as workers called by address (parallel.run_workers / run_serial).
"""
import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels_common.activation import ACT_NONE, ACT_RELU
from kernels_common.memory import aligned_empty

from .approx import JIT_BY_ADDRESS, wide_loops
from .gemm import TILES, _tile_index, _tmr, _tnr, act_store_lit, micro_tile_indexed, tile_m, tile_n
from .llvm_ir import bits_mask, lane_mask, masked_ops, splat
from .planes import (ROUND, column_masks, phase_shape, plane_row, rows_out, split_plane, tap_offset, vector_lanes,
                     vector_type)
from .parallel import (TASKS_PER_THREAD, c_array_at, call_address, fetch_add, like_dtype, run_at, run_workers,
                       worker_address)

# K block (rows of col per step; conv_direct splits Kc into even blocks of at most KC): the
# weight panel (MR x KC, 8 KiB) stays in L1 while it sweeps a task's tiles.  Sapphire Rapids,
# 2 threads, 2026-11-26, 8x48: KC 640 (one block for the 3x3 64ch's Kc = 576) measured within
# noise of 256 split evenly (288 + 288; 1.62-1.67 ms against 1.67-1.72, SD U-Net 25.5-26.2
# against 25.8-26.5), uneven 256 + 256 + 64 1.76 ms; Zen 5: 256 / 640 / 1024 within noise.
KC = 256

# Tiles a task finishes (every K block) and writes out before the next ones, so that their
# part of the accumulator block is still in cache when conv_compact reads it.  Sapphire
# Rapids, 2026-12-02, 1 / 2 threads, prepacked + bias + relu, medians of 7 x 20 calls, two
# alternating pairs, a task's whole run of tiles before (us): 7x7/2 stem 1965-1994 / 971-1036
# -> 4 tiles 1800-1926 / 927-1019 (8: 1765-1900 / 966-1002); 3x3 64ch 56x56 and 1x1 256->64
# within noise (1591-1722 / 873-944 against 1695-1715 / 885-940); SD U-Net 3x3 320ch 64x64,
# 2 threads, 23.5-23.6 against 23.7-24.4 ms.  The accumulator block per thread shrinks from
# a task's tiles (5.3 MB for the SD U-Net's on 2 threads) to 4 tiles (240 KB).
# Tried and not kept (Zen 4, 2026-12-06, prepacked + bias + ReLU, old / new alternating
# three times, medians of 5 x 60-100 calls): the last K block's tiles stored by the
# micro-kernel straight into out, bias and ReLU on the way, each vector wholly on one side
# of a row end in one plain store and the others in two masked ones (no conv_compact pass):
# stem 1T 2301-2311 -> 2243-2257 us, 2T 1165-1172 -> 1131-1146, 1x1 256->64 and 3x3 64ch
# 1-2%, but conv_direct_worker's compile 1.67 -> 1.96-2.03 s (the stem's cold first call
# 2.43-2.52 -> 2.67-2.89 s, against the 3 s bar).
CHUNK_TILES = 4

_U = np.uint64  # unsigned indices: numba drops the negative-index fix-up

# The int64 argument block of the workers (C_AP: the packed weight for conv_direct, the plain
# weight for depthwise; C_MC: depthwise's planes per task).
(C_SYNC, C_X, C_AP, C_OUT, C_BIAS, C_WS, C_NIMG, C_CIN, C_H, C_W, C_GROUPS, C_COUT, C_KH, C_KW, C_SH, C_SW,
 C_PH, C_PW, C_DH, C_DW, C_OH, C_OW, C_KC, C_NC, C_MC, C_EPILOGUE, C_ACC, C_XB, C_HQ, C_WQ, C_XDIRECT, C_CH,
 C_COUNT) = range(33)


def pack_weight(weight, groups, tile=None):
    """The weight (Cout, Cin_g, KH, KW) as the micro-kernel's A panels for a register tile
    (default: the active one, gemm.active_tile): (groups, mp, Kc, mr) with
    mp = ceil(Cout_g / mr), rows past Cout_g zero."""
    mr = tile_m(tile)
    cout, cin_g, kh, kw = weight.shape
    cout_g = cout // groups
    kc = cin_g * kh * kw
    mp = -(-cout_g // mr)
    w = np.zeros((groups, mp * mr, kc), weight.dtype)
    w[:, :cout_g] = weight.reshape(groups, cout_g, kc)
    return np.ascontiguousarray(w.reshape(groups, mp, mr, kc).transpose(0, 1, 3, 2))


@njit(inline="always")
def _task_rows(xf, xbase, H, W, cin_g, sh, sw, ph, pw, oy0, Hq, Wq, xb, zero):
    """The input a conv_direct task reads, zero-padded and split into stride phases:
    xb[((ci*sh + py)*sw + px)*Hq*Wq + r*Wq + q] = x[ci, (oy0 + r)*sh + py - ph, q*sw + px - pw]
    (zero outside the image) for the cin_g channels of x from xf[xbase:], r < Hq, q < Wq.
    A task's output row oy0 + r, tap (ky, kx), reads phase ((ky*dh) % sh, (kx*dw) % sw) at
    row r + (ky*dh) // sh, columns from (kx*dw) // sw on.  Column stride 2 fills both column
    phases of a row in one loop over it (_two_phase_row)."""
    for ci in range(cin_g):
        for py in range(sh):
            if sw == 2:
                pl = Hq * Wq
                row0 = (ci * sh + py) * 2 * pl
                for r in range(Hq):
                    iy = (oy0 + r) * sh + py - ph
                    if iy < 0 or iy >= H:
                        for q in range(Wq):
                            xb[_U(row0 + r * Wq + q)] = zero
                            xb[_U(row0 + pl + r * Wq + q)] = zero
                    else:
                        _two_phase_row(xf, xbase + (ci * H + iy) * W, W, pw, Wq, xb, row0 + r * Wq, pl, zero)
                continue
            for px in range(sw):
                base = ((ci * sh + py) * sw + px) * Hq * Wq
                qa = min(Wq, max(0, (pw - px + sw - 1) // sw))  # the first column inside the image
                qb = max(qa, min(Wq, (W + pw - px + sw - 1) // sw))  # one past the last
                for r in range(Hq):
                    iy = (oy0 + r) * sh + py - ph
                    d = base + r * Wq
                    if iy < 0 or iy >= H:
                        for q in range(Wq):
                            xb[_U(d + q)] = zero
                        continue
                    src = xbase + (ci * H + iy) * W + px - pw
                    for q in range(qa):
                        xb[_U(d + q)] = zero
                    if sw == 1:
                        for q in range(qa, qb):
                            xb[_U(d + q)] = xf[_U(src + q)]
                    else:
                        for q in range(qa, qb):
                            xb[_U(d + q)] = xf[_U(src + q * sw)]
                    for q in range(qb, Wq):
                        xb[_U(d + q)] = zero


@njit(inline="always")
def _two_phase_row(xf, src, W, pw, Wq, xb, d, pl, zero):
    """xb[d + q] = x[2q - pw] and xb[d + pl + q] = x[2q + 1 - pw] for q < Wq (x: the row
    of W values at xf[src:], zero outside it).  The middle, where both columns are inside
    the row, is one loop reading the row once, which LLVM vectorizes as an interleaved
    pair (vpermt2ps); a loop per phase read every other value (gathers).  The stem's copies
    (ResNet-50 7x7/2, 3 x 224 x 224), one thread, Zen 4 (2026-12-06): 48.1 -> 23.3 us for
    the whole image, 11.9-13.3 -> 5.4-6.4 us for a task's 33 rows."""
    qa = min(Wq, max(0, (pw + 1) // 2))  # from here 2q - pw >= 0
    qb = max(qa, min(Wq, (W + pw - 1) // 2))  # up to here 2q + 1 - pw < W
    for q in range(qa):
        c = 2 * q - pw
        xb[_U(d + q)] = xf[_U(src + c)] if 0 <= c < W else zero
        xb[_U(d + pl + q)] = xf[_U(src + c + 1)] if 0 <= c + 1 < W else zero
    s = src - pw
    for q in range(qa, qb):
        xb[_U(d + q)] = xf[_U(s + 2 * q)]
        xb[_U(d + pl + q)] = xf[_U(s + 2 * q + 1)]
    for q in range(qb, Wq):  # the first loop's body again: an inline helper for both edges
        c = 2 * q - pw       # made the stem's whole-image copy 23 -> 52 us (2026-12-06)
        xb[_U(d + q)] = xf[_U(src + c)] if 0 <= c < W else zero
        xb[_U(d + pl + q)] = xf[_U(src + c + 1)] if 0 <= c + 1 < W else zero


@njit(**JIT_BY_ADDRESS)
def conv_direct_worker(w, params, is64, ti):
    """Worker w of a conv_direct call (the C_* slots of the int64 block at params; is64 and
    ti, the register tile, literals).  A task is a run of C_NC tiles of one (image, group)'s
    output pixels in the pitch Wq = C_WQ (o = oy*Wq + ox; a tile covers NR consecutive o
    whatever the rows, and the Wq - OW columns past each row's end are computed and dropped:
    2 of 58 for a 3x3 at 56 wide, where tiles inside one row would round every row up to
    whole tiles).  It copies the C_HQ input rows it reads into the worker's buffer at C_XB
    (_task_rows; C_XDIRECT: packs each tile's K block from x's channel planes instead).
    Then per chunk of C_CH tiles, per K block of at most C_KC, every tile sweeps the weight
    panels, B row k of the tile at o read at tab[k] + o (C_WS; micro_tile_indexed), the
    micro-kernel storing (first K block) or adding (the rest) straight into the worker's
    accumulator block (C_ACC: C_CH tiles per channel row); last, the chunk's part of each
    output row goes to out with bias + activation (conv_compact, by address at
    C_EPILOGUE)."""
    p = c_array_at(params, np.int64(0), (C_COUNT,))
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    nr = _tnr(z, ti)
    MR = _tmr(ti)  # noqa: N806 - the tile's rows
    nimg, cin, H, W, G, cout = p[C_NIMG], p[C_CIN], p[C_H], p[C_W], p[C_GROUPS], p[C_COUT]
    KH, KW, sh, sw, ph, pw = p[C_KH], p[C_KW], p[C_SH], p[C_SW], p[C_PH], p[C_PW]
    OH, OW, kc, tpt, Hq, Wq = p[C_OH], p[C_OW], p[C_KC], p[C_NC], p[C_HQ], p[C_WQ]
    compact = p[C_EPILOGUE]
    cin_g = cin // G
    cout_g = cout // G
    Kc = cin_g * KH * KW
    P = OH * OW
    mp = (cout_g + MR - 1) // MR
    L = (OH - 1) * Wq + OW  # output pixels of an image in the copy's pitch
    T = (L + nr - 1) // nr  # their tiles
    nbr = (T + tpt - 1) // tpt
    ntasks = nimg * G * nbr
    nkb = (Kc + kc - 1) // kc
    kce = (Kc + nkb - 1) // nkb  # K blocks of even length
    nch = min(tpt, p[C_CH])
    seg = nch * nr  # values per channel row of the accumulator block
    sync = c_array_at(p[C_SYNC], np.int64(0), (1,))
    xf = c_array_at(p[C_X], z, (nimg * cin * H * W,))
    xdirect = p[C_XDIRECT] != 0
    xbn = min(kc, cin_g) * nr if xdirect else cin_g * sh * sw * Hq * Wq  # conv_direct's xb per worker
    xb = c_array_at(p[C_XB] + w * (xbn + nr) * isz, z, (xbn + nr,))  # + the slack the last tiles read
    for i in range(xbn, xbn + nr):
        xb[i] = z
    tab = c_array_at(p[C_WS], np.int64(0), (2 * Kc,))
    apf = c_array_at(p[C_AP], z, (G * mp * Kc * MR,))
    acc_addr = p[C_ACC] + w * mp * MR * seg * isz
    acc = c_array_at(acc_addr, z, (mp * MR * seg,))
    while True:
        task = fetch_add(sync, 0, 1)
        if task >= ntasks:
            break
        img_g = task // nbr
        rb = task - img_g * nbr
        img = img_g // G
        g = img_g - img * G
        t0 = rb * tpt
        ntl = min(tpt, T - t0)
        o0 = t0 * nr  # the task's pixels: o0 up to oe (in the copy's pitch)
        oe = min(o0 + ntl * nr, L)
        oy0 = o0 // Wq
        b0 = o0 - oy0 * Wq  # the first tile's offset in the task's input (from row oy0)
        xbase = (img * cin + g * cin_g) * H * W
        obase = (img * cout + g * cout_g) * P
        if not xdirect:
            _task_rows(xf, xbase, H, W, cin_g, sh, sw, ph, pw, oy0, Hq, Wq, xb, z)
        # chunks of nch tiles: each finished (all K blocks) and written out while its part of
        # the accumulator block is still in cache
        for c0 in range(0, ntl, nch):
            nc = min(nch, ntl - c0)
            for k0 in range(0, Kc, kce):
                kl = min(kce, Kc - k0)
                for tl in range(nc):
                    if xdirect:
                        # the tile's K block of B packed from x's channel planes (pixel o of
                        # channel k at xbase + k*H*W + o) into xb as kl rows of nr, zero past
                        # the image's L pixels
                        ob = o0 + (c0 + tl) * nr
                        nv = min(nr, L - ob)
                        for k in range(kl):
                            s = xbase + (k0 + k) * H * W + ob
                            d = k * nr
                            for j in range(nv):
                                xb[_U(d + j)] = xf[_U(s + j)]
                            for j in range(nv, nr):
                                xb[_U(d + j)] = z
                        bb, toff = 0, 0
                    else:
                        bb, toff = b0 + (c0 + tl) * nr, Kc + k0
                    for pa in range(mp):
                        micro_tile_indexed(ti, kl, apf, ((g * mp + pa) * Kc + k0) * MR, xb, bb, tab, toff, acc,
                                           pa * MR * seg + tl * nr, seg, k0 > 0)
            # the chunk's part of each output row it touches, all channels of the group:
            # out (pitch OW) from acc
            co0 = o0 + c0 * nr
            coe = min(co0 + nc * nr, oe)
            for oy in range(co0 // Wq, (coe - 1) // Wq + 1):
                a = max(oy * Wq, co0)
                n = min(oy * Wq + OW, coe) - a
                if n > 0:
                    dst = p[C_OUT] + (obase + a - oy * (Wq - OW)) * isz
                    call_address(compact, (acc_addr + (a - co0) * isz, seg, dst, P, cout_g, n,
                                           p[C_BIAS] + g * cout_g * isz))


@njit(**JIT_BY_ADDRESS)
def conv_compact(src, lds, dst, ldd, rows, n, bias, is64, code):
    """dst[i, 0:n] = act(src[i, 0:n] + bias[i]) for i < rows (src, dst at those addresses,
    row strides lds, ldd elements; bias: one value per row, at address bias); is64 and code
    literals: conv_direct_worker's store of one output row of every channel."""
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    bs = c_array_at(bias, z, (rows,))
    for i in range(rows):
        act_store_lit(c_array_at(src + i * lds * isz, z, (n,)), bs[i], c_array_at(dst + i * ldd * isz, z, (n,)),
                      n, code)


@njit(**JIT_BY_ADDRESS)
def conv_epilogue(c, ldc, rows, n, bias, is64, code):
    """C[i, 0:n] = act(C[i, 0:n] + bias[i]) for i < rows (C at address c, row stride ldc
    elements; bias: one value per output channel, at address bias); is64 and code are
    literals: one small function per (dtype, activation)."""
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    bs = c_array_at(bias, z, (rows,))
    for i in range(rows):
        cs = c_array_at(c + i * ldc * isz, z, (n,))
        act_store_lit(cs, bs[i], cs, n, code)


@njit(cache=True)
def _addresses(p, sync, x, ap, out, bias, ws):
    p[C_SYNC] = sync.ctypes.data
    p[C_X] = x.ctypes.data
    p[C_AP] = ap.ctypes.data
    p[C_OUT] = out.ctypes.data
    p[C_BIAS] = bias.ctypes.data
    p[C_WS] = ws.ctypes.data


@njit(cache=True)
def _direct_addresses(p, sync, x, ap, out, bias, tab, xb, acc):
    _addresses(p, sync, x, ap, out, bias, tab)
    p[C_XB] = xb.ctypes.data
    p[C_ACC] = acc.ctypes.data


def _check_panels(ap, ti, who):
    """ap (pack_weight's panels) must have the rows of the tile TILES[ti] the call runs."""
    if ap.shape[3] != tile_m(ti):
        raise ValueError(f"{who}: weight panels of {ap.shape[3]} rows, the {TILES[ti].name} tile needs {tile_m(ti)}")


def conv_direct(x, ap, bias, out, groups, kh, kw, stride, pad, dilation, epilogue, code, nworkers):
    """out = act(conv2d(x, weight) + bias) (the module docstring's direct form).  Phase split
    (stride s): padded row y = r*s + py is phase py's row r, so that output row oy's tap ky
    reads phase (ky*dh) % s at row oy + (ky*dh) // s and consecutive output pixels read
    consecutive values (stride 1: one phase, the padded image).  ap: the weight packed by
    pack_weight for the active tile; bias: (Cout,) (zeros when the call has none);
    epilogue: apply bias + activation code (False: the plain convolution); out: (N, Cout,
    OH, OW); nworkers: numba's thread count (a call with few tasks runs on fewer)."""
    nimg, cin, H, W = x.shape
    _, cout, OH, OW = out.shape
    dt = out.dtype
    ti = _tile_index(None)
    mp = ap.shape[1]
    _check_panels(ap, ti, "conv_direct")
    for arr in (x, ap, bias, out):
        if not (arr.flags.c_contiguous and arr.dtype == dt):
            raise ValueError(f"conv_direct: arrays must be C-contiguous {dt}, got {arr.dtype}")
    if nimg * groups == 0 or mp == 0 or OH * OW == 0:
        return
    plan = _direct_plan(x.shape, out.shape, dt.str, ti, mp, groups, kh, kw, tuple(stride), tuple(pad), tuple(dilation),
                        nworkers)
    tab, p0, nw, xb_each, acc_each = plan
    p = p0.copy()
    sync = np.zeros(1, np.int64)
    xb = aligned_empty(nw * xb_each, dt)
    acc = aligned_empty(nw * acc_each, dt)
    _direct_addresses(p, sync, x, ap, out, bias, tab, xb, acc)
    is64 = bool(dt == np.float64)
    p[C_EPILOGUE] = worker_address(conv_compact, (is64, int(code) if epilogue else ACT_NONE), nargs=7)
    run_workers(worker_address(conv_direct_worker, (is64, ti)), p, nw)


@functools.lru_cache(maxsize=256)
def _direct_plan(xshape, oshape, dtype, ti, mp, groups, kh, kw, stride, pad, dilation, nworkers):
    """What a conv_direct call computes from its shapes alone (cached: 20-25 us of numpy a
    call): (tab, the int64 argument block without its addresses, the workers, each one's
    input buffer and accumulator block in elements); tab and the block read-only."""
    nimg, cin, H, W = xshape
    _, cout, OH, OW = oshape
    dt = np.dtype(dtype)
    nr = tile_n(dt, ti)
    (sh, sw), (dh, dw) = stride, dilation
    cin_g = cin // groups
    k = np.arange(cin_g * kh * kw, dtype=np.int64)
    ci, r = np.divmod(k, kh * kw)
    ky, kx = np.divmod(r, kw)
    (qy, py), (qx, px) = np.divmod(ky * dh, sh), np.divmod(kx * dw, sw)
    # tasks: about 2 per thread, each a run of tpt tiles of an image's output pixels in the
    # pitch Wq (the tiles split evenly, whatever the rows: whole rows per task rounded each
    # task up to whole tiles, 7 rows of the 3x3 64ch at 56 wide 432 pixels for 392)
    Wq = OW + (kw - 1) * dw // sw
    ntiles = -(-((OH - 1) * Wq + OW) // nr)
    per_image = min(ntiles, max(1, -(-2 * nworkers // (nimg * groups))))
    tpt = -(-ntiles // per_image)
    ntasks = nimg * groups * -(-ntiles // tpt)
    nw = min(nworkers, ntasks)
    # a task's input (_task_rows): the most output rows a run of tpt tiles touches, plus the
    # taps' reach, per phase
    Hq = min(OH, 1 + (tpt * nr - 1 + Wq - 1) // Wq) + (kh - 1) * dh // sh
    # the k -> offset table of a packed tile (row k at k*nr; C_XDIRECT: an unpadded
    # stride-1 1x1 packs its tiles from x's channel planes), then the one of the task's copy
    xdirect = kh == 1 and kw == 1 and stride == (1, 1) and pad == (0, 0)
    tab = np.concatenate((k * nr, ((ci * sh + py) * sw + px) * Hq * Wq + qy * Wq + qx))
    xbn = min(KC, cin_g) * nr if xdirect else cin_g * sh * sw * Hq * Wq
    # a worker's accumulator block: a chunk's tiles for every panel row of the group
    nch = min(tpt, CHUNK_TILES)
    p = np.zeros(C_COUNT, np.int64)
    p[C_NIMG], p[C_CIN], p[C_H], p[C_W], p[C_GROUPS], p[C_COUT] = nimg, cin, H, W, groups, cout
    p[C_KH], p[C_KW], p[C_SH], p[C_SW], p[C_PH], p[C_PW] = kh, kw, sh, sw, pad[0], pad[1]
    p[C_DH], p[C_DW], p[C_OH], p[C_OW] = dh, dw, OH, OW
    p[C_KC], p[C_NC], p[C_CH] = KC, tpt, nch
    p[C_HQ], p[C_WQ], p[C_XDIRECT] = Hq, Wq, xdirect
    tab.flags.writeable = p.flags.writeable = False
    return tab, p, nw, xbn + nr, mp * tile_m(ti) * nch * nr


# ---- depthwise ---------------------------------------------------------------------------------

# Output rows per call of _dw_tile: 7 divides the planes of ResNet / MobileNet (112, 56, 28,
# 14, 7), and 7 accumulators keep both FMA ports busy (4-cycle latency).
DW_ROWS = 7


@intrinsic
def _dw_tile(typingctx, xf, xb, H, W, sh, wf, wb, KH, KW, dh, dw, iy0, c0, of, o0, OW, nrows, ncols, zrow, masks,
             mb, bias, k, relu):
    """One block of a depthwise output plane with unit column stride, read straight from
    the input plane (no padded copy): for r < DW_ROWS, l < L (L = planes.lanes):
        out[o0 + r*OW + l] = act(bias + sum over ky < KH, kx < KW of
                                 wf[wb + ky*KW + kx] * X(iy0 + r*sh + ky*dh, c0 + l + kx*dw))
    with X(i, j) = xf[xb + i*W + j] inside the H x W plane and 0 outside; stored for
    r < nrows, l < ncols.  Outside the plane nothing is read: a row above or below it is
    read from zrow (zeros, at least W long) instead, and the columns outside are the
    masked-off lanes of the loads, masks[mb + kx] the lane bits of tap column kx (lanes l
    with 0 <= c0 + l + kx*dw < W).  Per ky the DW_ROWS row addresses, per kx one weight
    broadcast, one mask and DW_ROWS masked loads and FMAs.  k: a literal int; k > 0 says
    KH = KW = k, sh = dh = dw = 1 (every loop unrolled, and each input row loaded once per tap
    column for the k output rows that read it: DW_ROWS + k - 1 loads where DW_ROWS * k).
    relu: a literal bool, act = relu (NaN kept) if true, else none."""
    if not (isinstance(k, types.IntegerLiteral) and isinstance(relu, types.BooleanLiteral)):
        return None
    if not (isinstance(xf, types.Array) and isinstance(wf, types.Array) and isinstance(of, types.Array)
            and isinstance(zrow, types.Array) and xf.dtype == wf.dtype == of.dtype == zrow.dtype
            and xf.dtype in (types.float32, types.float64) and isinstance(masks, types.Array)
            and masks.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        width, fty, vty = vector_type(context, sig.args[0].dtype)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        (a_xf, a_xb, a_h, a_w, a_sh, a_wf, a_wb, a_kh, a_kw, a_dh, a_dw, a_iy0, a_c0, a_of, a_o0, a_ow, a_nrows,
         a_ncols, a_zrow, a_masks, a_mb, a_bias, _, _) = range(24)
        k_lit = sig.args[-2].literal_value
        relu = sig.args[-1].literal_value

        def val(k):
            return context.cast(builder, args[k], sig.args[k], types.int64)

        def data(k):
            return context.make_array(sig.args[k])(context, builder, args[k]).data

        xd, wd, od, zd, md = data(a_xf), data(a_wf), data(a_of), data(a_zrow), data(a_masks)
        xb, H, W, sh, wb, KW = val(a_xb), val(a_h), val(a_w), val(a_sh), val(a_wb), val(a_kw)
        dh, dw, iy0, c0, mb = val(a_dh), val(a_dw), val(a_iy0), val(a_c0), val(a_mb)
        load, store = masked_ops(builder, vty)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty, vty, vty]),
                                             "llvm.fma.v%d%s" % (width, "f32" if fty == ir.FloatType() else "f64"))
        zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * width)
        nomask = ir.Constant(ir.VectorType(ir.IntType(1), width), [0] * width)

        def broadcast(x):
            return splat(builder, x, width)

        bias = broadcast(context.cast(builder, args[a_bias], sig.args[a_bias], sig.args[0].dtype))
        accs = [cgutils.alloca_once(builder, vty) for _ in range(DW_ROWS)]
        for acc in accs:  # the bias first
            builder.store(bias, acc)

        def mask_of(kx):  # the lane bits of tap column kx
            return bits_mask(builder, builder.load(builder.gep(md, [builder.add(mb, kx)])), width)

        def taps(rows, wrow, kx, m):  # one tap column for the DW_ROWS rows
            cx = builder.add(c0, builder.mul(kx, dw))
            wv = broadcast(builder.load(builder.gep(wd, [builder.add(wrow, kx)])))
            for r in range(DW_ROWS):
                v = load(builder.gep(rows[r], [cx]), m)
                builder.store(builder.call(fma, [wv, v, builder.load(accs[r])]), accs[r])

        if k_lit:  # KH = KW = k_lit, sh = dh = 1: input row j serves outputs r = j - ky, loaded once per kx
            wvs = [[broadcast(builder.load(builder.gep(wd, [builder.add(wb, ir.Constant(i64, ky * k_lit + kx))])))
                    for kx in range(k_lit)] for ky in range(k_lit)]
            masks_kx = [mask_of(ir.Constant(i64, kx)) for kx in range(k_lit)]
            for j in range(DW_ROWS + k_lit - 1):  # input row by input row: few live vectors
                row = plane_row(builder, xd, xb, builder.add(iy0, ir.Constant(i64, j)), H, W, zd)
                for kx in range(k_lit):
                    v = load(builder.gep(row, [builder.add(c0, ir.Constant(i64, kx))]), masks_kx[kx])  # dw = 1
                    for ky in range(k_lit):
                        r = j - ky
                        if 0 <= r < DW_ROWS:
                            builder.store(builder.call(fma, [wvs[ky][kx], v, builder.load(accs[r])]), accs[r])
        else:
            with cgutils.for_range(builder, val(a_kh)) as kyl:
                iy = builder.add(iy0, builder.mul(kyl.index, dh))
                rows = []  # the DW_ROWS row starts (column 0) for this ky: the image row or zrow
                for r in range(DW_ROWS):
                    rows.append(plane_row(builder, xd, xb, builder.add(iy, builder.mul(sh, ir.Constant(i64, r))), H, W, zd))
                wrow = builder.add(wb, builder.mul(kyl.index, KW))
                with cgutils.for_range(builder, KW) as kxl:
                    taps(rows, wrow, kxl.index, mask_of(kxl.index))
        smask = lane_mask(builder, ir.Constant(i32, 0), builder.trunc(val(a_ncols), i32), width)
        o0, OW, nrows = val(a_o0), val(a_ow), val(a_nrows)
        for r in range(DW_ROWS):
            m = builder.select(builder.icmp_signed("<", ir.Constant(i64, r), nrows), smask, nomask)
            acc = builder.load(accs[r])
            if relu:  # x < 0 ? 0 : x keeps NaN
                acc = builder.select(builder.fcmp_ordered("<", acc, zero), zero, acc)
            store(acc, builder.gep(od, [builder.add(o0, builder.mul(OW, ir.Constant(i64, r)))]), m)
        return context.get_dummy_value()

    return types.none(xf, xb, H, W, sh, wf, wb, KH, KW, dh, dw, iy0, c0, of, o0, OW, nrows, ncols, zrow, masks,
                      mb, bias, k, relu), codegen


@njit(inline="always")
def _dw_setup(params, is64):
    """The slots a depthwise worker reads: (p, sync, xf, wf, of) as flat arrays."""
    p = c_array_at(params, np.int64(0), (C_COUNT,))
    z = like_dtype(is64)
    nimg, C, H, W, cout = p[C_NIMG], p[C_CIN], p[C_H], p[C_W], p[C_COUT]
    sync = c_array_at(p[C_SYNC], np.int64(0), (1,))
    xf = c_array_at(p[C_X], z, (nimg * C * H * W,))
    wf = c_array_at(p[C_AP], z, (cout * p[C_KH] * p[C_KW],))
    of = c_array_at(p[C_OUT], z, (nimg * cout * p[C_OH] * p[C_OW],))
    return p, sync, xf, wf, of


@njit(inline="always")
def _dw_epilogue(p, first, end, isz):
    """Bias + activation on output planes [first, end) (conv_epilogue by address), one call
    per run of planes of one image (consecutive channels)."""
    epilogue, cout, plane = p[C_EPILOGUE], p[C_COUT], p[C_OH] * p[C_OW]
    if epilogue == 0:
        return
    pl = first
    while pl < end:
        n = pl // cout
        co = pl - n * cout
        run = min(end, (n + 1) * cout) - pl
        call_address(epilogue, (p[C_OUT] + pl * plane * isz, plane, run, plane, p[C_BIAS] + co * isz))
        pl += run


@njit(**JIT_BY_ADDRESS)
def depthwise_direct_worker(w, params, is64, k, relu):
    """Worker w of a depthwise call with column stride 1 (the C_* slots; C_AP is the plain
    weight (Cout, 1, KH, KW)): takes blocks of output planes (n, co) from the counter.
    out[n, co] = act(bias[co] + sum over taps of weight[co, 0, ky, kx] * x[n, co //
    multiplier] shifted by the tap), in blocks of DW_ROWS rows x one vector of columns held
    in registers (_dw_tile), read from the input plane itself with masked loads (the
    padding is the masked-off lanes: no padded copy).  k: a literal, k > 0 for a k x k
    kernel with row stride 1 and no dilation (_dw_tile's unrolled form), else 0.  The bias is
    added in the tile when no epilogue is given (C_EPILOGUE 0; the caller then passes zeros
    for no bias), and relu (a literal) applied.  One compiled worker per (dtype, k, relu),
    serial (run_serial) and parallel alike."""
    p, sync, xf, wf, of = _dw_setup(params, is64)
    C, H, W, cout = p[C_CIN], p[C_H], p[C_W], p[C_COUT]
    KH, KW, sh, ph, pw, dh, dw = p[C_KH], p[C_KW], p[C_SH], p[C_PH], p[C_PW], p[C_DH], p[C_DW]
    OH, OW, per_task = p[C_OH], p[C_OW], p[C_MC]
    nplanes = p[C_NIMG] * cout
    mult = cout // C
    L = vector_lanes(of)
    bias = c_array_at(p[C_BIAS], like_dtype(is64), (cout,))
    in_tile = p[C_EPILOGUE] == 0
    zrow = np.zeros(W, of.dtype)  # read for the rows above and below the plane
    nvec = (OW + L - 1) // L
    masks = np.empty(nvec * KW, np.int64)  # per vector of output columns and tap column
    column_masks(masks, nvec, L, 1, KW, dw, pw, W)
    while True:
        task = fetch_add(sync, 0, per_task)
        if task >= nplanes:
            break
        end = min(task + per_task, nplanes)
        n = task // cout
        co = task - n * cout
        for pl in range(task, end):
            xb = (n * C + (co if mult == 1 else co // mult)) * H * W
            ob = pl * OH * OW
            bv = bias[co] if in_tile else of.dtype.type(0)
            for v in range(nvec):  # rows inner: LLVM hoisted a tile's row addresses out of a column loop, and spilled them
                for oy in range(0, OH, DW_ROWS):
                    _dw_tile(xf, xb, H, W, sh, wf, co * KH * KW, KH, KW, dh, dw, oy * sh - ph, v * L - pw, of,
                             ob + oy * OW + v * L, OW, min(DW_ROWS, OH - oy), min(L, OW - v * L), zrow, masks, v * KW,
                             bv, k, relu)
            co += 1
            if co == cout:
                co = 0
                n += 1
        _dw_epilogue(p, task, end, 8 if is64 else 4)


@njit(**JIT_BY_ADDRESS)
def depthwise_phase_worker(w, params, is64):
    """Worker w of a depthwise call with column stride > 1 (as depthwise_direct_worker):
    per plane (planes.py) the input plane is split into its stride phases with the zero
    padding (xq), then the taps run three at a time as long vector loops over the whole
    plane in the phases' row pitch (tq = w0*xq[s0+o] + w1*xq[s1+o] + w2*xq[s2+o], the first
    pass assigning 1, 2 or 3 taps), and the rows are copied out.  One compiled worker per
    dtype."""
    wide_loops()
    p, sync, xf, wf, of = _dw_setup(params, is64)
    C, H, W, cout = p[C_CIN], p[C_H], p[C_W], p[C_COUT]
    KH, KW, sh, sw, ph, pw, dh, dw = p[C_KH], p[C_KW], p[C_SH], p[C_SW], p[C_PH], p[C_PW], p[C_DH], p[C_DW]
    OH, OW, per_task = p[C_OH], p[C_OW], p[C_MC]
    nplanes = p[C_NIMG] * cout
    mult = cout // C
    ntap = KH * KW
    hq, wq = phase_shape(OH, OW, KH, KW, sh, sw, dh, dw)
    ntc = ((OH - 1) * wq + OW + ROUND - 1) // ROUND * ROUND
    toff = np.empty(ntap, np.int64)
    for ky in range(KH):
        for kx in range(KW):
            toff[ky * KW + kx] = tap_offset(ky, kx, sh, sw, dh, dw, hq, wq)
    # zero padding written once: split_plane writes only the image positions
    xq = np.zeros(max(sh * sw * hq * wq, toff.max() + ntc), of.dtype)
    trow = np.zeros(wq * sw, of.dtype)
    tq = np.empty(ntc, of.dtype)
    first = ntap % 3 if ntap % 3 != 0 else 3  # taps of the assigning pass
    last_xb = -1
    while True:
        task = fetch_add(sync, 0, per_task)
        if task >= nplanes:
            break
        end = min(task + per_task, nplanes)
        for pl in range(task, end):
            n = pl // cout
            co = pl - n * cout
            xb = (n * C + co // mult) * H * W
            wb = co * ntap
            if xb != last_xb:  # a channel multiplier > 1 reuses the split plane
                split_plane(xf, xb, H, W, sh, sw, ph, pw, hq, wq, xq, trow)
                last_xb = xb
            w0, s0 = wf[_U(wb)], toff[0]
            if first == 1:
                for o in range(ntc):
                    tq[_U(o)] = w0 * xq[_U(s0 + o)]
            else:
                w1, s1 = wf[_U(wb + 1)], toff[1]
                if first == 2:
                    for o in range(ntc):
                        tq[_U(o)] = w0 * xq[_U(s0 + o)] + w1 * xq[_U(s1 + o)]
                else:
                    w2, s2 = wf[_U(wb + 2)], toff[2]
                    for o in range(ntc):
                        tq[_U(o)] = w0 * xq[_U(s0 + o)] + w1 * xq[_U(s1 + o)] + w2 * xq[_U(s2 + o)]
            for t in range(first, ntap, 3):
                w0, w1, w2 = wf[_U(wb + t)], wf[_U(wb + t + 1)], wf[_U(wb + t + 2)]
                s0, s1, s2 = toff[t], toff[t + 1], toff[t + 2]
                for o in range(ntc):
                    tq[_U(o)] += w0 * xq[_U(s0 + o)] + w1 * xq[_U(s1 + o)] + w2 * xq[_U(s2 + o)]
            rows_out(of, pl * OH * OW, tq, OH, OW, wq)
        _dw_epilogue(p, task, end, 8 if is64 else 4)


# k x k kernels (row stride 1, no dilation) the direct depthwise worker unrolls (one compiled
# worker each; the others loop).
DW_UNROLLED = (3, 5)


def depthwise(x, weight, bias, out, stride, pad, dilation, epilogue, code, nworkers):
    """Depthwise convolution (groups == C): x (N, C, H, W), weight (Cout, 1, KH, KW) with
    Cout a multiple of C, bias (Cout,) (zeros for none), out (N, Cout, OH, OW); epilogue:
    apply bias + activation `code` (False: the plain convolution); pad the
    (top, left) padding; nworkers 1 runs on the calling thread, more hand blocks of
    output planes to numba's threads (dynamic: TASKS_PER_THREAD blocks per thread)."""
    for arr in (x, weight, bias, out):
        if not (arr.flags.c_contiguous and arr.dtype == out.dtype):
            raise ValueError(f"depthwise: arrays must be C-contiguous {out.dtype}, got {arr.dtype}")
    if out.size == 0:
        return
    p0, fn, nw = _dw_plan(x.shape, weight.shape, out.shape, out.dtype.str, tuple(stride), tuple(pad),
                          tuple(dilation), bool(epilogue), int(code), nworkers)
    p = p0.copy()
    sync = np.zeros(1, np.int64)
    run_at(fn, _dw_addresses(p, sync, x, weight, out, bias), nw)


@functools.lru_cache(maxsize=256)
def _dw_plan(xshape, wshape, oshape, dtype, stride, pad, dilation, epilogue, code, nworkers):
    """What a depthwise call needs from its shapes and options alone (cached: 4-5 us of
    Python a call, a fifth of a 1x384x14x14 3x3 call's 19 us kernel, Sapphire Rapids-class
    Xeon, 2026-12-03): (the int64 argument block without its addresses, read-only; the
    worker's address; the workers)."""
    nimg, cin, H, W = xshape
    _, _, kh, kw = wshape
    _, cout, OH, OW = oshape
    nplanes = nimg * cout
    is64 = dtype == np.dtype(np.float64).str
    p = np.zeros(C_COUNT, np.int64)
    p[C_NIMG], p[C_CIN], p[C_H], p[C_W], p[C_GROUPS], p[C_COUT] = nimg, cin, H, W, cin, cout
    p[C_KH], p[C_KW], p[C_SH], p[C_SW], p[C_PH], p[C_PW] = kh, kw, stride[0], stride[1], pad[0], pad[1]
    p[C_DH], p[C_DW], p[C_OH], p[C_OW] = dilation[0], dilation[1], OH, OW
    # bias + activation by address (conv_epilogue, one small function per activation): in
    # the worker itself every activation's loop compiled in (3.8 s cold first call)
    direct = stride[1] == 1
    # the direct form adds the bias and applies relu in its tiles (no second pass)
    in_tile = direct and code in (ACT_NONE, ACT_RELU)
    p[C_EPILOGUE] = worker_address(conv_epilogue, (is64, code), nargs=5) if epilogue and not in_tile else 0
    if direct:
        k = kh if kh == kw and kh in DW_UNROLLED and stride[0] == 1 and dilation[0] == dilation[1] == 1 else 0
        fn = worker_address(depthwise_direct_worker, (is64, k, bool(in_tile and code == ACT_RELU)))
    else:
        fn = worker_address(depthwise_phase_worker, (is64,))
    p[C_MC] = nplanes if nworkers <= 1 else max(1, nplanes // (nworkers * TASKS_PER_THREAD))
    p.flags.writeable = False
    return p, fn, 1 if nworkers <= 1 else min(nworkers, nplanes)


@njit(cache=True)
def _dw_addresses(p, sync, x, w, out, bias):
    """The addresses into p; returns p's own (taken here: ctypes.data costs ~1 us in Python)."""
    _addresses(p, sync, x, w, out, bias, bias)
    return p.ctypes.data
