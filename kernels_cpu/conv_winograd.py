"""3x3 stride-1 convolution (NCHW) by Winograd's F(2x2, 3x3), bias and activation fused.

x (N, C, H, W), weight (K, C, 3, 3), out (N, K, OH, OW), C-contiguous; top / left padding
(pt, pl), OH = H + pt + pb - 2 (the bottom / right padding implied by OH, OW).  Output
tile (ty, tx), 2x2 pixels at rows 2ty.., columns 2tx.., reads the 4x4 input patch d at
padded rows 2ty.., columns 2tx.. (zero outside the image), and
    Y = A^T [ sum over c of (G g G^T) (.) (B^T d B) ] A
with g the 3x3 filter and (.) the elementwise product (Lavin and Gray, "Fast Algorithms
for Convolutional Neural Networks", 2016), B^T = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]],
G = [[1,0,0],[1/2,1/2,1/2],[1/2,-1/2,1/2],[0,0,1]], A^T = [[1,1,1,0],[0,1,-1,-1]].
So the 16 positions e of the 4x4 transformed tiles are 16 independent GEMMs
M_e (K x tiles) = U_e (K x C) @ V_e (C x tiles), 4*4*K*C*tiles multiply-adds where the
direct form does 9*4*K*C*tiles: 2.25x fewer, on the GEMM's micro-kernel (gemm.py; U_e
packed into its MR-row panels once, pack_winograd / dispatch.prepack).  The transforms
only add and subtract (the halves of G are exact), and the error measured against float64
stays at the direct form's (64 channels 56x56: 9.8e-8 against 8.1e-8 normwise relative;
320 channels 64x64: 9.6e-8 against 4.1e-8).

A task is a run of blocks of NR tiles (tiles numbered ty*TW + tx) of one image.  It copies
the padded input rows it reads into its worker's buffer split into even and odd columns
(conv._task_rows with column phase 2), so that a row of patches is read with unit stride;
per block: the input transform (wino_in: vectors of patches along a tile row) into V
(V_e as C rows of NR, V_e's start ES = C*NR + one cache line apart: with V_e exactly C*NR
apart the transform's 16 store streams sat 12 KB apart on one cache set, 2.7 ms against
0.09 ms for 64 channels 56x56), then per weight panel the 16 GEMMs (gemm.micro_tile) into
M (16 x MR x NR) and the output transform with bias + activation into out (wino_store:
each output row's two columns of the tiles interleaved in registers).

Measured (Sapphire Rapids, float32, 2026-12-02): 64 channels 56x56 pad 1 + bias + ReLU,
prepacked, one thread, 1.0-1.07 ms (GEMMs about 0.7, input transform 0.09-0.14, output
transform and its stores 0.1, copies and set-up the rest) against 1.39 ms direct; 320
channels 64x64 25.1 ms against 42.5 ms (a prototype of this code).  The GEMMs run at 147
GF/s there, the micro-kernel alone at 176-183: with C = 64 each call is 64 steps long.
"""
import contextlib
import functools

import numpy as np
from llvmlite import ir
from numba import literal_unroll, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels_common.memory import aligned_empty

from .approx import JIT_BY_ADDRESS, activate
from .conv import _task_rows
from .gemm import _tile_index, _tmr, _tnr, micro_tile, tile_m, tile_n
from .llvm_ir import lane_mask, masked_ops
from .parallel import c_array_at, fetch_add, like_dtype, run_workers, worker_address
from .planes import arg_access, vector_type

_U = np.uint64

# The worker's int64 argument block.
(W_SYNC, W_X, W_UP, W_OUT, W_BIAS, W_NIMG, W_C, W_H, W_W, W_K, W_OH, W_OW, W_PT, W_PL, W_BPT, W_HQ,
 W_XB, W_VB, W_MB, W_YB, W_COUNT) = range(21)


def pack_winograd(weight, tile=None):
    """U = G g G^T of every filter of weight (K, C, 3, 3) (C-contiguous), as the
    micro-kernel's A panels per position e = 4*row + col: (16, mp, C, mr), mp = ceil(K /
    mr), rows past K zero.  Computed in float64, rounded once to the weight's dtype."""
    mr = tile_m(tile)
    k, c = weight.shape[:2]
    out = aligned_empty((16, -(-k // mr), c, mr), weight.dtype)
    _transform_filters(weight, out)
    return out


# Channels per block of _transform_filters: a panel's mr x 16 filters' 16 values (8 KiB
# in float32) stay in L1 while they are written out plane by plane.
_FILTER_BLOCK = 16


@njit(cache=True, nogil=True)
def _transform_filters(w, out):
    """out[e, pa, c, i] = (G g G^T)[e // 4, e % 4] of g = w[pa*mr + i, c] (0 past K's rows).
    Per panel and block of channels, the filters' 16 values go to a small buffer, then to
    the 16 planes.  Written straight into the planes (16 streams a multiple of 4 KiB
    apart), 64x64 filters took 214 us, through a whole (K, C, 16) buffer 83 us and 4.8 ms
    for 320x320 (its reads a row of K apart); numpy 0.46 and 22 ms: a call without prepack
    paid that every time."""
    K, C = w.shape[0], w.shape[1]
    mp, mr = out.shape[1], out.shape[3]
    cb = _FILTER_BLOCK
    t = np.empty((mr, cb, 16), out.dtype)
    z = out.dtype.type(0)
    for pa in range(mp):
        for c0 in range(0, C, cb):
            cn = min(cb, C - c0)
            for i in range(mr):
                k = pa * mr + i
                for cc in range(cn):
                    if k >= K:
                        for e in range(16):
                            t[i, cc, e] = z
                        continue
                    c = c0 + cc
                    # G g: rows (a, j) of the 4x3 product, as scalars (no array per filter)
                    g00, g01, g02 = np.float64(w[k, c, 0, 0]), np.float64(w[k, c, 0, 1]), np.float64(w[k, c, 0, 2])
                    g10, g11, g12 = np.float64(w[k, c, 1, 0]), np.float64(w[k, c, 1, 1]), np.float64(w[k, c, 1, 2])
                    g20, g21, g22 = np.float64(w[k, c, 2, 0]), np.float64(w[k, c, 2, 1]), np.float64(w[k, c, 2, 2])
                    rows = ((g00, g01, g02),
                            ((g00 + g10 + g20) * 0.5, (g01 + g11 + g21) * 0.5, (g02 + g12 + g22) * 0.5),
                            ((g00 - g10 + g20) * 0.5, (g01 - g11 + g21) * 0.5, (g02 - g12 + g22) * 0.5),
                            (g20, g21, g22))
                    for a in literal_unroll((0, 1, 2, 3)):  # (G g) G^T: the columns
                        r0, r1, r2 = rows[a]
                        t[i, cc, 4 * a] = r0
                        t[i, cc, 4 * a + 1] = (r0 + r1 + r2) * 0.5
                        t[i, cc, 4 * a + 2] = (r0 - r1 + r2) * 0.5
                        t[i, cc, 4 * a + 3] = r2
            for e in range(16):
                for cc in range(cn):
                    for i in range(mr):
                        out[e, pa, c0 + cc, i] = t[i, cc, e]


def _float_arrays(a, b):
    """Whether the numba types a and b are arrays of one float type (float32 / float64)."""
    return (isinstance(a, types.Array) and isinstance(b, types.Array) and a.dtype == b.dtype
            and a.dtype in (types.float32, types.float64))


def _vector_access(context, builder, sig, args):
    """(lanes, masked load, masked store, i64_of, at) for an intrinsic whose first argument is
    a float array (planes.vector_type, llvm_ir.masked_ops, planes.arg_access)."""
    width, _, vty = vector_type(context, sig.args[0].dtype)
    load, store = masked_ops(builder, vty)
    return (width, load, store) + arg_access(context, builder, sig, args)


@contextlib.contextmanager
def _vector_steps(builder, n, width):
    """Loop i = 0, width, 2*width, ... < n (an i64): yields (i, the mask of the lanes below
    n - i), so the last step is masked and nothing is touched past n."""
    i64, i32 = ir.IntType(64), ir.IntType(32)
    with cgutils.for_range_slice(builder, ir.Constant(i64, 0), n, ir.Constant(i64, width)) as (i, _):
        yield i, lane_mask(builder, ir.Constant(i32, 0), builder.trunc(builder.sub(n, i), i32), width)


@intrinsic
def wino_in(typingctx, xb, e0, o0, wh, n, vb, ob, es):
    """The input transform of n patches along a tile row: patch t's rows r < 4 have their
    even padded columns 2t, 2t+2 at xb[e0 + r*wh + t (+1)] and their odd ones 2t+1, 2t+3
    at xb[o0 + r*wh + t (+1)]; V = B^T d B goes to vb[ob + e*es + t], e = 4*row + col.
    Vectors of the patches, the last one masked (nothing read or written past n)."""
    if not _float_arrays(xb, vb):
        return None

    def codegen(context, builder, sig, args):
        width, load, store, i64_of, at = _vector_access(context, builder, sig, args)
        e0, o0, wh, n, ob, es = (i64_of(k) for k in (1, 2, 3, 4, 6, 7))
        i64 = ir.IntType(64)
        one = ir.Constant(i64, 1)
        sub, add = builder.fsub, builder.fadd
        with _vector_steps(builder, n, width) as (i, mask):
            rows = []  # per row: padded columns 2t, 2t+1, 2t+2, 2t+3 of the patches
            for r in range(4):
                pe = builder.add(builder.add(e0, builder.mul(wh, ir.Constant(i64, r))), i)
                po = builder.add(builder.add(o0, builder.mul(wh, ir.Constant(i64, r))), i)
                rows.append([load(at(0, pe), mask), load(at(0, po), mask), load(at(0, builder.add(pe, one)), mask),
                             load(at(0, builder.add(po, one)), mask)])
            bt = [[sub(rows[0][j], rows[2][j]) for j in range(4)], [add(rows[1][j], rows[2][j]) for j in range(4)],
                  [sub(rows[2][j], rows[1][j]) for j in range(4)], [sub(rows[1][j], rows[3][j]) for j in range(4)]]
            for a in range(4):
                p = bt[a]
                for b, v in enumerate((sub(p[0], p[2]), add(p[1], p[2]), sub(p[2], p[1]), sub(p[1], p[3]))):
                    off = builder.add(builder.add(ob, builder.mul(es, ir.Constant(i64, 4 * a + b))), i)
                    store(v, at(5, off), mask)
        return context.get_dummy_value()

    return types.none(xb, e0, o0, wh, n, vb, ob, es), codegen


@intrinsic
def wino_store(typingctx, yb, ya, yc, n, of, row, cnt):
    """of[row + 2t] = yb[ya + t], of[row + 2t + 1] = yb[yc + t] for t < n, the first cnt
    of those 2n values only (an odd output width drops the last tile's second column):
    one output row of a run of tiles, interleaved in registers (masked vector stores)."""
    if not _float_arrays(yb, of):
        return None

    def codegen(context, builder, sig, args):
        width, load, store, i64_of, at = _vector_access(context, builder, sig, args)
        ya, yc, n, row, cnt = (i64_of(k) for k in (1, 2, 3, 5, 6))
        i64, i32 = ir.IntType(64), ir.IntType(32)
        half = width // 2
        lo_idx = ir.Constant(ir.VectorType(i32, width), [k // 2 + (width if k % 2 else 0) for k in range(width)])
        hi_idx = ir.Constant(ir.VectorType(i32, width),
                             [half + k // 2 + (width if k % 2 else 0) for k in range(width)])
        zero32 = ir.Constant(i32, 0)
        with _vector_steps(builder, n, width) as (i, m):
            y0 = load(at(0, builder.add(ya, i)), m)
            y1 = load(at(0, builder.add(yc, i)), m)
            left = builder.sub(cnt, builder.mul(i, ir.Constant(i64, 2)))  # values left to store
            dst = builder.add(row, builder.mul(i, ir.Constant(i64, 2)))
            store(builder.shuffle_vector(y0, y1, lo_idx), at(4, dst),
                  lane_mask(builder, zero32, builder.trunc(left, i32), width))
            store(builder.shuffle_vector(y0, y1, hi_idx), at(4, builder.add(dst, ir.Constant(i64, width))),
                  lane_mask(builder, zero32, builder.trunc(builder.sub(left, ir.Constant(i64, width)), i32), width))
        return context.get_dummy_value()

    return types.none(yb, ya, yc, n, of, row, cnt), codegen


@njit(inline="always")
def _wino_out(mb, i, nr, mr, bk, code, yb):
    """Y = act(A^T M A + bias) of output channel row i of the panel's 16 M_e
    (mb[(e*mr + i)*nr + j]) for the block's nr tiles j: yb[q*nr + j], q = 2*row + col;
    act the activation code (a literal: approx.activate folds to its one branch)."""
    s = _U(mr * nr)
    o = _U(i * nr)
    for j in range(_U(nr)):
        m0, m1, m2, m3 = mb[o + j], mb[o + s + j], mb[o + 2 * s + j], mb[o + 3 * s + j]
        m4, m5, m6, m7 = mb[o + 4 * s + j], mb[o + 5 * s + j], mb[o + 6 * s + j], mb[o + 7 * s + j]
        m8, m9, m10, m11 = mb[o + 8 * s + j], mb[o + 9 * s + j], mb[o + 10 * s + j], mb[o + 11 * s + j]
        m12, m13, m14, m15 = mb[o + 12 * s + j], mb[o + 13 * s + j], mb[o + 14 * s + j], mb[o + 15 * s + j]
        p0, p1, p2, p3 = m0 + m4 + m8, m1 + m5 + m9, m2 + m6 + m10, m3 + m7 + m11
        q0, q1, q2, q3 = m4 - m8 - m12, m5 - m9 - m13, m6 - m10 - m14, m7 - m11 - m15
        yb[j] = activate(p0 + p1 + p2 + bk, code)
        yb[_U(nr) + j] = activate(p1 - p2 - p3 + bk, code)
        yb[_U(2 * nr) + j] = activate(q0 + q1 + q2 + bk, code)
        yb[_U(3 * nr) + j] = activate(q1 - q2 - q3 + bk, code)


@njit(**JIT_BY_ADDRESS)
def winograd_worker(w, params, is64, ti, code):
    """Worker w of a conv_winograd call (the W_* slots of the int64 block at params; is64,
    ti, the register tile, and code, the activation, literals): tasks of W_BPT blocks of
    NR tiles of one image from the counter at W_SYNC (the module docstring)."""
    p = c_array_at(params, np.int64(0), (W_COUNT,))
    z = like_dtype(is64)
    isz = 8 if is64 else 4
    nr = _tnr(z, ti)
    MR = _tmr(ti)  # noqa: N806 - the tile's rows
    nimg, C, H, W, K, OH, OW = p[W_NIMG], p[W_C], p[W_H], p[W_W], p[W_K], p[W_OH], p[W_OW]
    pt, pl, bpt, Hq = p[W_PT], p[W_PL], p[W_BPT], p[W_HQ]
    TH, TW = (OH + 1) // 2, (OW + 1) // 2
    T = TH * TW
    nblk = (T + nr - 1) // nr
    tpi = (nblk + bpt - 1) // bpt  # tasks per image
    mp = (K + MR - 1) // MR
    Wh = TW + 1  # columns of each phase of a padded row
    sync = c_array_at(p[W_SYNC], np.int64(0), (1,))
    xf = c_array_at(p[W_X], z, (nimg * C * H * W,))
    of = c_array_at(p[W_OUT], z, (nimg * K * OH * OW,))
    up = c_array_at(p[W_UP], z, (16 * mp * C * MR,))
    bias = c_array_at(p[W_BIAS], z, (K,))
    xbn = 2 * C * Hq * Wh
    xb = c_array_at(p[W_XB] + w * xbn * isz, z, (xbn,))
    es = C * nr + 64 // isz  # V_e's start, a line past a multiple of 4 KiB apart
    vbn = 16 * es
    vb = c_array_at(p[W_VB] + w * vbn * isz, z, (vbn,))
    mb = c_array_at(p[W_MB] + w * 16 * MR * nr * isz, z, (16 * MR * nr,))
    yb = c_array_at(p[W_YB] + w * 4 * nr * isz, z, (4 * nr,))
    while True:
        task = fetch_add(sync, 0, 1)
        if task >= nimg * tpi:
            break
        img = task // tpi
        b0 = (task - img * tpi) * bpt
        b1 = min(b0 + bpt, nblk)
        tty0 = b0 * nr // TW  # the task's first and last tile rows
        tty1 = (min(b1 * nr, T) - 1) // TW
        rows = 2 * (tty1 - tty0) + 4  # the copy's rows per channel and phase
        _task_rows(xf, img * C * H * W, H, W, C, 1, 2, pt, pl, 2 * tty0, rows, Wh, xb, z)
        for blk in range(b0, b1):
            t0 = blk * nr
            nt = min(nr, T - t0)
            ty0 = t0 // TW
            ty1 = (t0 + nt - 1) // TW
            for c in range(C):
                ob = c * nr
                for ty in range(ty0, ty1 + 1):
                    txa = max(0, t0 - ty * TW)
                    txb = min(TW, t0 + nt - ty * TW)
                    e0 = (2 * c * rows + 2 * (ty - tty0)) * Wh  # even columns, the patch's first row
                    wino_in(xb, e0 + txa, e0 + rows * Wh + txa, Wh, txb - txa, vb, ob + ty * TW - t0 + txa, es)
                for e in range(16):  # the block's missing tiles: zeros (their results are dropped)
                    for j in range(nt, nr):
                        vb[ob + e * es + j] = z
            for pa in range(mp):
                for e in range(16):
                    micro_tile(ti, C, up, (e * mp + pa) * C * MR, vb, e * es, nr, mb, e * MR * nr, nr, False)
                for i in range(min(MR, K - pa * MR)):
                    k = pa * MR + i
                    _wino_out(mb, i, nr, MR, bias[k], code, yb)
                    obase = (img * K + k) * OH * OW
                    for ty in range(ty0, ty1 + 1):
                        txa = max(0, t0 - ty * TW)
                        txb = min(TW, t0 + nt - ty * TW)
                        jb = ty * TW - t0 + txa
                        cnt = min(2 * (txb - txa), OW - 2 * txa)  # an odd width: the last tile's column 0 only
                        for r in range(min(2, OH - 2 * ty)):
                            wino_store(yb, 2 * r * nr + jb, (2 * r + 1) * nr + jb, txb - txa, of,
                                       obase + (2 * ty + r) * OW + 2 * txa, cnt)


@njit(cache=True)
def _addresses(p, sync, x, up, out, bias, xb, vb, mb, yb):
    p[W_SYNC] = sync.ctypes.data
    p[W_X] = x.ctypes.data
    p[W_UP] = up.ctypes.data
    p[W_OUT] = out.ctypes.data
    p[W_BIAS] = bias.ctypes.data
    p[W_XB] = xb.ctypes.data
    p[W_VB] = vb.ctypes.data
    p[W_MB] = mb.ctypes.data
    p[W_YB] = yb.ctypes.data


def conv_winograd(x, up, bias, out, pad, code, nworkers):
    """out = act(conv2d(x, weight, padding) + bias) for a 3x3 weight, stride and dilation 1
    (the module docstring), act the activation code (kernels_common.activation.ACT_*).
    up: pack_winograd(weight) for the active tile; bias (K,) (zeros when the call has
    none); pad: (top, left); out (N, K, OH, OW); nworkers: numba's thread count (a call
    with few tasks runs on fewer)."""
    nimg, C, H, W = x.shape
    _, K, OH, OW = out.shape
    dt = out.dtype
    ti = _tile_index(None)
    if up.shape[3] != tile_m(ti):
        raise ValueError(f"conv_winograd: panels of {up.shape[3]} rows, the active tile needs {tile_m(ti)}")
    for arr in (x, up, bias, out):
        if not (arr.flags.c_contiguous and arr.dtype == dt):
            raise ValueError(f"conv_winograd: arrays must be C-contiguous {dt}, got {arr.dtype}")
    if nimg == 0 or K == 0 or OH * OW == 0:
        return
    p0, nw, each = _plan(x.shape, out.shape, dt.str, ti, tuple(pad), nworkers)
    p = p0.copy()
    sync = np.zeros(1, np.int64)
    bufs = [aligned_empty(nw * n, dt) for n in each]
    _addresses(p, sync, x, up, out, bias, *bufs)
    run_workers(worker_address(winograd_worker, (bool(dt == np.float64), ti, int(code)), nargs=2), p, nw)


@functools.lru_cache(maxsize=256)
def _plan(xshape, oshape, dtype, ti, pad, nworkers):
    """(the argument block without its addresses (read-only), the workers, each one's
    buffer sizes in elements (input rows, V, M, Y)), from the shapes alone."""
    nimg, C, H, W = xshape
    _, K, OH, OW = oshape
    nr = tile_n(np.dtype(dtype), ti)
    TH, TW = (OH + 1) // 2, (OW + 1) // 2
    nblk = -(-TH * TW // nr)
    # tasks: about 2 per thread (as conv_direct's), each a run of bpt blocks of one image
    per_image = min(nblk, max(1, -(-2 * nworkers // nimg)))
    bpt = -(-nblk // per_image)
    nw = min(nworkers, nimg * -(-nblk // bpt))
    # a task's tile rows: bpt*nr tiles touch at most this many, plus one (a run starting
    # mid-row); 2 padded rows each plus the 3x3's 2
    hq = 2 * min(TH, (bpt * nr - 1) // TW + 2) + 2
    p = np.zeros(W_COUNT, np.int64)
    p[W_NIMG], p[W_C], p[W_H], p[W_W], p[W_K], p[W_OH], p[W_OW] = nimg, C, H, W, K, OH, OW
    p[W_PT], p[W_PL], p[W_BPT], p[W_HQ] = pad[0], pad[1], bpt, hq
    p.flags.writeable = False
    mr = tile_m(ti)
    es = C * nr + 64 // np.dtype(dtype).itemsize  # as the worker's
    return p, nw, (2 * C * hq * (TW + 1), 16 * es, 16 * mr * nr, 4 * nr)
