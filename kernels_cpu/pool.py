"""2-D pooling over the planes of C-contiguous (P, H*W) arrays (P = N*C planes, each plane
a flat row-major H x W image), writing (P, OH*OW).

Window sizes, strides, paddings and dilations are runtime integers: one compiled kernel per
dtype.  adaptive pooling splits its work into output rows: row r of the P*OH rows is output
row r % OH of plane r // OH (plane and row counters stepped, window bounds from per-axis
tables: no division per output).

- max_pool / avg_pool with column stride 1 or 2 (pool_direct_worker, called by address:
  one compiled worker per (dtype, max / avg, stride 1 / 2), serial and parallel): per
  plane, blocks of POOL_ROWS output rows x one vector of columns pooled in registers
  straight from the input plane (_pool_tile: masked vector loads whose masked-off lanes
  are the padding; stride 2 loads two vectors and keeps their even lanes).  ResNet-50's
  stem pool (1x64x112x112, 3x3/2) and DenseNet's 2x2/2 avg pool (1x256x56x56), kernel
  alone, Sapphire Rapids, 2026-11-26, phase split -> registers: max 455-466 -> 359-387 us
  on one thread, 262-274 -> 217-238 on two (18 GB/s: the memory, not the arithmetic);
  avg 360-365 -> 241-272 on one, 209-216 -> 92-159 on two.  The windows of POOL_SEPARABLE
  (3x3/2, 2x2/2, 3x3/1) pool each of the tile's input rows over its taps once, then the
  rows per output row (a 3x3/2 tile: 15 rows x 3 taps where 7 x 9), the taps of a row built
  from shared loads by moving lanes (_pool_tile's taps).
- Column strides above 2 (window_worker): the padded plane split into stride phases
  (planes.split_plane), then each window tap one long vector loop over the whole output
  plane (see window_worker).  Work is handed out in blocks of planes.
- max keeps NaN (PyTorch's rule; the fastmath flags exclude nnan, so NaN tests stay): in
  registers m = v if v > m else m (one vmaxps) with the NaN lanes tracked apart (by the
  separable windows only in a tile that loaded a NaN); in
  window_worker's loops m = v if (v > m or v != v) else m, a select the loop vectorizes.
- adaptive_avg_pool: per output element, the window [floor(i*n/o), ceil((i+1)*n/o)) on
  each axis; a window spanning whole rows (every output of width 1: global pooling,
  ResNet's 7x7 head) is one contiguous run of the flat plane, summed by one vectorized loop.
  Windows that tile the plane (n divisible by o on both axes, more than one output per
  row: VGG's 14 -> 7) run as an avg_pool with window = stride = n / o.

Inner-loop indexes are cast to uintp (they are >= 0 by construction): numba wraps negative
signed indexes around (idx < 0 -> idx + n), a select per element that LLVM cannot drop
for an index that does not count up from 0, and that kept these loops scalar.

Sums accumulate in the input's dtype (windows are small; the global pool of a 7x7 plane
adds 49 terms).  The parallel kernels let their threads claim ranges of output rows (parallel.claim).
"""
import math

import numpy as np

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy import uintp

from .approx import JIT, JIT_INNER, JIT_BY_ADDRESS, like
from .llvm_ir import arg_readers, bits_mask, hsums, lane_mask, masked_ops, splat
from .planes import (column_masks, phase_shape, plane_row, rows_out, split_plane, tap_offset, vector_lanes,
                     vector_type)
from .parallel import (RW_D, RW_I, RW_I2, RW_I3, RW_N, TASKS_PER_THREAD, addresses, c_array_at, fetch_add, launch,
                       like_dtype, num_threads, row_args, row_block, row_claim, row_run, run_serial, run_workers,
                       worker_address)


@intrinsic
def _plane_means(typingctx, xf, x0, n, of, o0):
    """of[o0 + j] = mean(xf[x0 + j*n : x0 + (j+1)*n]) for j < L (L = planes.lanes): L
    contiguous planes of n >= 1 values each.  One accumulator vector per plane, L values of
    each added at a time (the last n % L through a masked load), then the L sums made one
    vector (llvm_ir.hsums) and divided by n at once."""
    if not (isinstance(xf, types.Array) and xf.dtype in (types.float32, types.float64)
            and isinstance(of, types.Array) and of.dtype == xf.dtype):
        return None

    def codegen(context, builder, sig, args):
        width, fty, vty = vector_type(context, sig.args[0].dtype)
        i64 = ir.IntType(64)
        i64_of, data = arg_readers(context, builder, sig, args)
        xd, od = data(0), data(3)
        x0, n, o0 = i64_of(1), i64_of(2), i64_of(4)
        load, _ = masked_ops(builder, vty)
        pty = vty.as_pointer()
        zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * width)
        lanes = ir.Constant(i64, width)
        full = builder.udiv(n, lanes)
        rows = [builder.add(x0, builder.mul(n, ir.Constant(i64, j))) for j in range(width)]
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(width)]
        with cgutils.for_range(builder, full) as loop:
            off = builder.mul(loop.index, lanes)
            for row, acc in zip(rows, accs):
                ptr = builder.bitcast(builder.gep(xd, [builder.add(row, off)]), pty)
                builder.store(builder.fadd(builder.load(acc), builder.load(ptr, align=1)), acc)
        off = builder.mul(full, lanes)
        mask = lane_mask(builder, ir.Constant(ir.IntType(32), 0), builder.trunc(builder.sub(n, off), ir.IntType(32)),
                         width)
        sums = [builder.fadd(builder.load(acc), load(builder.gep(xd, [builder.add(row, off)]), mask))
                for row, acc in zip(rows, accs)]
        means = builder.fdiv(hsums(builder, sums, width), splat(builder, builder.uitofp(n, fty), width))
        builder.store(means, builder.bitcast(builder.gep(od, [o0]), pty), align=1)
        return context.get_dummy_value()

    return types.void(xf, x0, n, of, o0), codegen


@njit(**JIT_INNER)
def adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, lo, hi):
    """Output rows lo..hi of the P*OH rows.  The window bounds come from per-axis tables made
    once per call and the plane / row counters are stepped, not divided: 64-bit divisions
    per output (five of them) made ResNet-50's global pool of 1x2048x7x7 35 us on one
    thread, 13-14 us with the tables (Sapphire Rapids, 2026-11-26).  Global pooling (one
    output per plane) sums a vector of planes at a time (_plane_means): 1x2048x7x7 in a
    compiled loop 7.4 -> 4.0 us (400 KB from L2 at ~100 GB/s), the public call 15.6-15.9
    -> 12.1-12.7 us (Zen 4, 2026-12-06, old / new processes alternating three times)."""
    xf = x.ravel()
    of = out.ravel()
    zero = like(xf[0], 0.0)
    hw = h * w
    ys = np.empty(oh_n, np.int64)
    ye = np.empty(oh_n, np.int64)
    xs = np.empty(ow_n, np.int64)
    xe = np.empty(ow_n, np.int64)
    for i in range(oh_n):
        ys[i] = (i * h) // oh_n
        ye[i] = ((i + 1) * h + oh_n - 1) // oh_n
    for i in range(ow_n):
        xs[i] = (i * w) // ow_n
        xe[i] = ((i + 1) * w + ow_n - 1) // ow_n
    whole = ow_n == 1  # each window spans whole rows: one contiguous run of the flat plane
    if whole and oh_n == 1:
        # global pooling: row r is plane r; L planes at a time, the rest below
        L = vector_lanes(xf)
        while hi - lo >= L:
            _plane_means(xf, lo * hw, hw, of, lo)
            lo += L
    p = lo // oh_n
    oy = lo - p * oh_n
    for r in range(lo, hi):
        xb = p * hw
        ob = r * ow_n
        y0, y1 = ys[oy], ye[oy]
        if whole:
            s = zero
            for k in range(xb + y0 * w, xb + y1 * w):
                s += xf[uintp(k)]
            of[uintp(ob)] = s / like(zero, (y1 - y0) * w)
        else:
            for q in range(ow_n):
                x0, x1 = xs[q], xe[q]
                s = zero
                for iy in range(y0, y1):
                    rb = xb + iy * w
                    for k in range(rb + x0, rb + x1):
                        s += xf[uintp(k)]
                of[uintp(ob + q)] = s / like(zero, (y1 - y0) * (x1 - x0))
        oy += 1
        if oy == oh_n:
            oy = 0
            p += 1


# ---- serial and parallel entry points (rows = P * OH output rows) ---------------------------

# The int64 argument block of pool_direct_worker and window_worker.
(S_SYNC, S_X, S_OUT, S_PLANES, S_H, S_W, S_OH, S_OW, S_KH, S_KW, S_SH, S_SW, S_PH, S_PW, S_DH, S_DW, S_AVG,
 S_CIP, S_DIV, S_PER, S_COUNT) = range(21)


@njit(inline="always")
def _divisor_tables(avg, nrf, ncf, dtype, h, w, oh, ow, kh, kw, sh, sw, ph, pw, cip, divisor):
    """(rf, cf): avg pooling's divisor of output (oy, ox) as rf[oy] * cf[ox] (_divisor_factors),
    nrf and ncf entries long (padded with 1); empty for max pooling."""
    rf = np.empty(nrf if avg else 0, dtype)
    cf = np.empty(ncf if avg else 0, dtype)
    if avg:
        _divisor_factors(rf, cf, h, w, oh, ow, kh, kw, sh, sw, ph, pw, cip, divisor)
    return rf, cf


@njit(inline="always")
def _divisor_factors(rf, cf, h, w, oh, ow, kh, kw, sh, sw, ph, pw, cip, divisor):
    """avg pooling's divisor of output (oy, ox) as rf[oy] * cf[ox]: PyTorch's window size
    clipped to the padded input (count_include_pad) or to the image, or divisor_override
    (divisor > 0) in rf with cf 1.  Entries past oh / ow are set to 1."""
    for i in range(rf.size):
        rf[i] = 1.0
    for i in range(cf.size):
        cf[i] = 1.0
    for oy in range(oh):
        if divisor > 0:
            rf[oy] = divisor
            continue
        y0 = oy * sh - ph
        y1 = min(y0 + kh, h + ph)
        rf[oy] = (y1 - y0) if cip else (min(y1, h) - max(y0, 0))
    if divisor > 0:
        return
    for ox in range(ow):
        x0 = ox * sw - pw
        x1 = min(x0 + kw, w + pw)
        cf[ox] = (x1 - x0) if cip else (min(x1, w) - max(x0, 0))


@njit(**JIT_BY_ADDRESS)
def window_worker(wk, params, is64):
    """Worker wk of a max / avg pooling call with column stride > 2 (the S_* slots; strides
    1 and 2 run pool_direct_worker): takes blocks of planes from the counter.  Per plane:
      1. the plane is split into sh x sw phases (planes.split_plane) with its padding (-inf
         for max, 0 for avg; also past the bottom / right for ceil_mode), so every window
         tap (ky, kx) reads one phase at a fixed offset and consecutive outputs read
         consecutive values;
      2. each tap is then one long vector loop over the whole output plane (row pitch
         wq): max into the other of two buffers (in place, LLVM turns the NaN-keeping
         select into a vmaskmovps masked store), sums in place;
      3. the rows are copied out (avg: divided by PyTorch's divisor, the product of a row
         and a column factor, or divisor_override).
    Per output row and tap, as before, the loops were short (56 outputs) and strided: 0.75
    ms on one thread for ResNet-50's stem pool against onnxruntime's 0.27 ms on two."""
    p = c_array_at(params, np.int64(0), (S_COUNT,))
    z = like_dtype(is64)
    P, h, w, oh, ow = p[S_PLANES], p[S_H], p[S_W], p[S_OH], p[S_OW]
    kh, kw, sh, sw, ph, pw, dh, dw = p[S_KH], p[S_KW], p[S_SH], p[S_SW], p[S_PH], p[S_PW], p[S_DH], p[S_DW]
    avg, cip, divisor, per = p[S_AVG] != 0, p[S_CIP] != 0, p[S_DIV], p[S_PER]
    sync = c_array_at(p[S_SYNC], np.int64(0), (1,))
    xf = c_array_at(p[S_X], z, (P * h * w,))
    of = c_array_at(p[S_OUT], z, (P * oh * ow,))
    hq, wq = phase_shape(oh, ow, kh, kw, sh, sw, dh, dw)
    fill = like(z, 0.0) if avg else like(z, -math.inf)
    # the padding written once: split_plane writes only the image positions
    xq = np.full(sh * sw * hq * wq, fill)
    trow = np.full(wq * sw, fill)
    a = np.empty(oh * wq, of.dtype)
    b = np.empty(oh * wq, of.dtype)
    nt = (oh - 1) * wq + ow
    rf, cf = _divisor_tables(avg, oh, ow, of.dtype, h, w, oh, ow, kh, kw, sh, sw, ph, pw, cip, divisor)
    while True:
        first = fetch_add(sync, 0, per)
        if first >= P:
            break
        for pl in range(first, min(first + per, P)):
            split_plane(xf, pl * h * w, h, w, sh, sw, ph, pw, hq, wq, xq, trow)
            cur = a
            nxt = b
            first_tap = True
            for ky in range(kh):
                for kx in range(kw):
                    off = tap_offset(ky, kx, sh, sw, dh, dw, hq, wq)
                    if first_tap:
                        for o in range(nt):
                            cur[uintp(o)] = xq[uintp(off + o)]
                        first_tap = False
                    elif avg:
                        for o in range(nt):
                            cur[uintp(o)] += xq[uintp(off + o)]
                    else:
                        for o in range(nt):
                            v = xq[uintp(off + o)]
                            m = cur[uintp(o)]
                            nxt[uintp(o)] = v if (v > m or v != v) else m
                        cur, nxt = nxt, cur
            ob = pl * oh * ow
            if not avg:
                rows_out(of, ob, cur, oh, ow, wq)
                continue
            for oy in range(oh):
                o0 = ob + oy * ow
                t0 = oy * wq
                r = rf[oy]
                for ox in range(ow):
                    of[uintp(o0 + ox)] = cur[uintp(t0 + ox)] / (r * cf[ox])


# Output rows per call of _pool_tile (ResNet's stem pool: 56 = 8 x 7).
POOL_ROWS = 7
# (KH, KW, row stride) windows pooled separably (no dilation): ResNet's 3x3/2 max pool, the
# 2x2/2 pools of DenseNet / VGG / U-Nets, 3x3/1 (Inception's).  Each compiles a worker of
# its own.  Zen 5, medians of 9, 1 / 2 threads, loops over the taps -> separable (two
# alternating process pairs): max 3x3/2 1x64x112x112 164-176 / 108-114 -> 129-134 / 92-101
# us (two threads: 4 MB at about 40 GB/s, the memory); avg 2x2/2 1x256x56x56 110-124 /
# 84-90 -> 100-113 / 78-86; max 3x3/1 1x64x56x56 103-113 / 74-81 -> 51-52 / 46.
POOL_SEPARABLE = ((3, 3, 2), (2, 2, 2), (3, 3, 1))


def _window_code(kh, kw, sh, dh, dw):
    """_pool_tile's literal `win` for a window: (KH, KW, sh) as one int, or 0 (runtime loops)."""
    if (kh, kw, sh) in POOL_SEPARABLE and dh == dw == 1:
        return kh * 100 + kw * 10 + sh
    return 0


def _window_of(code):
    """(KH, KW, sh) of a _window_code."""
    return code // 100, code // 10 % 10, code % 10


@intrinsic
def _pool_tile(typingctx, xf, xb, H, W, sh, KH, KW, dh, dw, iy0, s0, of, o0, OW, nrows, ncols, frow, masks, mb, rf,
               ry, cf, cx0, avg, sw2, win):
    """One block of a pooled output plane, read straight from the input plane: for
    r < POOL_ROWS, l < L (L = planes.lanes), output (r, l) at of[o0 + r*OW + l] pools
    X(iy0 + r*sh + ky*dh, s0 + l*sw + kx*dw) over ky < KH, kx < KW, sw = 2 if sw2 else 1,
    X = xf[xb + i*W + j] inside the H x W plane, the fill (-inf for max, 0 for avg)
    outside; stored for r < nrows, l < ncols.  Outside the plane nothing is read: rows
    above / below read frow (W fill values), columns outside are masked-off lanes
    (masks[mb + kx]: bit i set when input column s0 + kx*dw + i lies inside, i < L*sw).
    Column stride 2: two masked loads of L values and their even lanes (one shuffle).
    max keeps NaN (m = v if v > m else m, and NaN where any v was NaN); avg divides by rf[ry + r] *
    cf[cx0 + l] (PyTorch's divisor; cf is read as one whole vector).  avg, sw2: literal
    bools.  win: a literal _window_code: (KH, KW, sh) of a window pooled separably (no
    dilation): each of the tile's input rows pooled over its KW taps once, into a buffer,
    then KH of those per output row; or 0: loops over the runtime KH x KW taps."""
    if not (isinstance(avg, types.BooleanLiteral) and isinstance(sw2, types.BooleanLiteral)
            and isinstance(win, types.IntegerLiteral)):
        return None
    if not (isinstance(xf, types.Array) and xf.dtype in (types.float32, types.float64)
            and all(isinstance(a, types.Array) and a.dtype == xf.dtype for a in (of, frow, rf, cf))
            and isinstance(masks, types.Array) and masks.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        width, fty, vty = vector_type(context, sig.args[0].dtype)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        (a_xf, a_xb, a_h, a_w, a_sh, a_kh, a_kw, a_dh, a_dw, a_iy0, a_s0, a_of, a_o0, a_ow, a_nrows, a_ncols, a_frow,
         a_masks, a_mb, a_rf, a_ry, a_cf, a_cx0, _, _, _) = range(26)
        is_avg, two, code = sig.args[-3].literal_value, sig.args[-2].literal_value, sig.args[-1].literal_value

        def val(k):
            return context.cast(builder, args[k], sig.args[k], types.int64)

        def data(k):
            return context.make_array(sig.args[k])(context, builder, args[k]).data

        xd, od, fd, md = data(a_xf), data(a_of), data(a_frow), data(a_masks)
        xb, H, W, sh, KW, dh, dw = val(a_xb), val(a_h), val(a_w), val(a_sh), val(a_kw), val(a_dh), val(a_dw)
        iy0, s0, mb = val(a_iy0), val(a_s0), val(a_mb)
        load, store = masked_ops(builder, vty)
        mty = ir.VectorType(ir.IntType(1), width)
        fill = ir.Constant(vty, [ir.Constant(fty, 0.0 if is_avg else -math.inf)] * width)
        accs = [cgutils.alloca_once_value(builder, fill) for _ in range(POOL_ROWS)]
        # max: the lanes that saw a NaN, kept apart (m = v > m ? v : m is one vmaxps; the NaN
        # test of every v folded into the select cost a compare and an or per tap), as the
        # largest |v| bit pattern per lane (an unsigned max of the bits less the sign): NaN
        # where it exceeds inf's.  That stays in vector registers, where the 7 rows' NaN lane
        # masks took AVX-512 mask registers (8, two of them the load masks) and spilled every
        # tap: 3x3/2 of 1x64x112x112, Zen 5, one thread 180 -> 163-166 us.
        nbits = 32 if fty == ir.FloatType() else 64
        ity = ir.VectorType(ir.IntType(nbits), width)
        absmask = ir.Constant(ity, [(1 << (nbits - 1)) - 1] * width)
        infbits = ir.Constant(ity, [0x7F800000 if nbits == 32 else 0x7FF0000000000000] * width)
        nans = [cgutils.alloca_once_value(builder, ir.Constant(ity, [0] * width))
                for _ in range(0 if is_avg or code else POOL_ROWS)]
        nanv = ir.Constant(vty, [ir.Constant(fty, math.nan)] * width)

        def absbits_max(m, v):
            b = builder.and_(builder.bitcast(v, ity), absmask)
            return builder.select(builder.icmp_unsigned(">", b, m), b, m)
        evens = ir.Constant(ir.VectorType(i32, width), list(range(0, 2 * width, 2)))
        odds = ir.Constant(ir.VectorType(i32, width), list(range(1, 2 * width, 2)))

        def pool(acc, v):
            return builder.fadd(acc, v) if is_avg else builder.select(builder.fcmp_ordered(">", v, acc), v, acc)

        if code:
            kh_s, kw_s, sh_s = _window_of(code)
            nin = (POOL_ROWS - 1) * sh_s + kh_s  # the tile's input rows
            hbuf = cgutils.alloca_once(builder, vty, size=nin)
            nbuf = None if is_avg else cgutils.alloca_once(builder, ity, size=nin)
            col = []  # per tap column: its offset and lane masks
            for kx in range(kw_s):
                bits = builder.load(builder.gep(md, [builder.add(mb, ir.Constant(i64, kx))]))
                col.append((builder.add(s0, ir.Constant(i64, kx)), bits_mask(builder, bits, width),
                            bits_mask(builder, bits, width, shift=width) if two else None))
            # a lane shift: lanes 1.. of a, then lane `last` of b
            shift_in = [ir.Constant(i32, i) for i in range(1, width)]

            def taps(row):
                """(the KW tap vectors of one input row, the vectors loaded).  Three 3-wide
                windows share their loads: at column stride 2, taps 0 and 1 are the even and
                odd lanes of the same two vectors, tap 2 the even lanes moved by one and one
                more value (3 loads where 6); at stride 1, tap 1 is tap 0 moved by one lane
                with one value of tap 2 (2 loads where 3).  Zen 4, 2026-12-04, kernels alone,
                medians of 9, one / two threads, alternating processes: max 3x3/2
                1x64x112x112 159-164 / 87-104 -> 129-132 / 73-102 us; avg 2x2/2 1x256x56x56
                117-143 / 72-80 -> 78-88 / 48-62; 3x3/1 unchanged (57-59 / 35)."""
                def at(kx, hi=False):
                    start, m_lo, m_hi = col[kx]
                    if hi:
                        return load(builder.gep(row, [builder.add(start, ir.Constant(i64, width))]), m_hi, fill)
                    return load(builder.gep(row, [start]), m_lo, fill)

                def moved(a, b, last):
                    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, width),
                                                                     shift_in + [ir.Constant(i32, width + last)]))
                if two and kw_s in (2, 3):
                    lo, hi = at(0), at(0, hi=True)
                    ev = builder.shuffle_vector(lo, hi, evens)
                    out = [ev, builder.shuffle_vector(lo, hi, odds)]
                    if kw_s == 3:  # column s0 + 2L: lane L - 2 of tap 2's upper load
                        h2 = at(2, hi=True)
                        return out + [moved(ev, h2, width - 2)], [lo, hi, h2]
                    return out, [lo, hi]
                if not two and kw_s == 3:
                    t0, t2 = at(0), at(2)
                    return [t0, moved(t0, t2, width - 2), t2], [t0, t2]
                out, raw = [], []
                for kx in range(kw_s):
                    v = at(kx)
                    raw.append(v)
                    if two:
                        raw.append(at(kx, hi=True))
                        v = builder.shuffle_vector(v, raw[-1], evens)
                    out.append(v)
                return out, raw

            def separable(track):
                """Pool the tile into accs; max pooling with track also keeps each lane's
                NaN (into accs).  Without track, max returns an i1: whether any value
                loaded was NaN (then the caller runs it again with track)."""
                seen = None if is_avg or track else cgutils.alloca_once_value(builder, ir.Constant(mty, [0] * width))
                with cgutils.for_range(builder, ir.Constant(i64, nin)) as tl:
                    row = plane_row(builder, xd, xb, builder.add(iy0, tl.index), H, W, fd)
                    hv = hn = None
                    vs, raw = taps(row)
                    for v in vs:
                        hv = v if hv is None else pool(hv, v)
                        if track:
                            hn = absbits_max(ir.Constant(ity, [0] * width) if hn is None else hn, v)
                    builder.store(hv, builder.gep(hbuf, [tl.index]))
                    if track:
                        builder.store(hn, builder.gep(nbuf, [tl.index]))
                    if seen is not None:  # fcmp uno a, b: a lane where either is NaN
                        u = builder.load(seen)
                        for k in range(0, len(raw), 2):
                            u = builder.or_(u, builder.fcmp_unordered("uno", raw[k], raw[min(k + 1, len(raw) - 1)]))
                        builder.store(u, seen)
                for r in range(POOL_ROWS):
                    acc = builder.load(builder.gep(hbuf, [ir.Constant(i64, r * sh_s)]))
                    if track:
                        nan = builder.load(builder.gep(nbuf, [ir.Constant(i64, r * sh_s)]))
                    for t in range(r * sh_s + 1, r * sh_s + kh_s):
                        acc = pool(acc, builder.load(builder.gep(hbuf, [ir.Constant(i64, t)])))
                        if track:
                            nv = builder.load(builder.gep(nbuf, [ir.Constant(i64, t)]))
                            nan = builder.select(builder.icmp_unsigned(">", nv, nan), nv, nan)
                    if track:
                        acc = builder.select(builder.icmp_unsigned(">", nan, infbits), nanv, acc)
                    builder.store(acc, accs[r])
                if seen is not None:
                    return builder.icmp_unsigned("!=", builder.bitcast(builder.load(seen), ir.IntType(width)),
                                                 ir.Constant(ir.IntType(width), 0))

            # max: the tile without the NaN bookkeeping (an unordered compare per two loads),
            # and again with it in the rare tile that loaded a NaN.  3x3/2 of 1x64x112x112,
            # Zen 4, one / two threads: 129-132 / 73-102 -> 124 / 70 us.
            if is_avg:
                separable(False)
            else:
                with builder.if_then(separable(False), likely=False):
                    separable(True)

        else:
            with cgutils.for_range(builder, val(a_kh)) as kyl:
                iy = builder.add(iy0, builder.mul(kyl.index, dh))
                rows = []  # the tile rows' starts (column 0) for this ky: the image row or frow
                for r in range(POOL_ROWS):
                    rows.append(plane_row(builder, xd, xb, builder.add(iy, builder.mul(sh, ir.Constant(i64, r))), H, W, fd))
                with cgutils.for_range(builder, KW) as kxl:
                    start = builder.add(s0, builder.mul(kxl.index, dw))
                    bits = builder.load(builder.gep(md, [builder.add(mb, kxl.index)]))
                    m_lo = bits_mask(builder, bits, width)
                    if two:
                        m_hi = bits_mask(builder, bits, width, shift=width)
                    for r in range(POOL_ROWS):
                        v = load(builder.gep(rows[r], [start]), m_lo, fill)
                        if two:
                            hi = load(builder.gep(rows[r], [builder.add(start, ir.Constant(i64, width))]), m_hi, fill)
                            v = builder.shuffle_vector(v, hi, evens)
                        builder.store(pool(builder.load(accs[r]), v), accs[r])
                        if not is_avg:
                            builder.store(absbits_max(builder.load(nans[r]), v), nans[r])
        smask = lane_mask(builder, ir.Constant(i32, 0), builder.trunc(val(a_ncols), i32), width)
        nomask = ir.Constant(mty, [0] * width)
        o0, OW, nrows = val(a_o0), val(a_ow), val(a_nrows)
        if is_avg:
            cfv = builder.load(builder.bitcast(builder.gep(data(a_cf), [val(a_cx0)]), vty.as_pointer()),
                               align=4 if fty == ir.FloatType() else 8)  # an element's alignment, not the vector's
            rfd, ry = data(a_rf), val(a_ry)
        for r in range(POOL_ROWS):
            acc = builder.load(accs[r])
            if is_avg:
                rv = splat(builder, builder.load(builder.gep(rfd, [builder.add(ry, ir.Constant(i64, r))])), width)
                acc = builder.fdiv(acc, builder.fmul(rv, cfv))
            elif not code:  # (separable() marks the NaN lanes itself)
                acc = builder.select(builder.icmp_unsigned(">", builder.load(nans[r]), infbits), nanv, acc)
            m = builder.select(builder.icmp_signed("<", ir.Constant(i64, r), nrows), smask, nomask)
            store(acc, builder.gep(od, [builder.add(o0, builder.mul(OW, ir.Constant(i64, r)))]), m)
        return context.get_dummy_value()

    return types.none(xf, xb, H, W, sh, KH, KW, dh, dw, iy0, s0, of, o0, OW, nrows, ncols, frow, masks, mb, rf, ry,
                      cf, cx0, avg, sw2, win), codegen


@njit(**JIT_BY_ADDRESS)
def pool_direct_worker(wk, params, is64, avg, sw2, win):
    """Worker wk of a max / avg pooling call with column stride 1 or 2 (sw2; the S_* slots):
    takes blocks of planes from the counter; per plane, blocks of POOL_ROWS output rows x
    one vector of columns pooled in registers straight from the input plane (_pool_tile:
    masked loads, no padded copy, no phase split).  One compiled worker per (dtype, avg,
    sw2)."""
    p = c_array_at(params, np.int64(0), (S_COUNT,))
    z = like_dtype(is64)
    P, h, w, oh, ow = p[S_PLANES], p[S_H], p[S_W], p[S_OH], p[S_OW]
    kh, kw, sh, ph, pw, dh, dw = p[S_KH], p[S_KW], p[S_SH], p[S_PH], p[S_PW], p[S_DH], p[S_DW]
    cip, divisor, per = p[S_CIP] != 0, p[S_DIV], p[S_PER]
    sw = 2 if sw2 else 1
    sync = c_array_at(p[S_SYNC], np.int64(0), (1,))
    xf = c_array_at(p[S_X], z, (P * h * w,))
    of = c_array_at(p[S_OUT], z, (P * oh * ow,))
    L = vector_lanes(of)
    nvec = (ow + L - 1) // L
    frow = np.full(w, like(z, 0.0) if avg else like(z, -math.inf))  # the rows above / below
    masks = np.empty(nvec * kw, np.int64)  # per vector of output columns and tap column
    column_masks(masks, nvec, L, sw, kw, dw, pw, w)
    # whole row blocks and vectors: the tile reads rf for POOL_ROWS rows and cf as one vector
    rf, cf = _divisor_tables(avg, (oh + POOL_ROWS - 1) // POOL_ROWS * POOL_ROWS, nvec * L, of.dtype, h, w, oh, ow,
                             kh, kw, sh, sw, ph, pw, cip, divisor)
    while True:
        first = fetch_add(sync, 0, per)
        if first >= P:
            break
        for pl in range(first, min(first + per, P)):
            xb = pl * h * w
            ob = pl * oh * ow
            for v in range(nvec):  # rows inner (LLVM hoists a tile's row addresses out of a column loop)
                for oy in range(0, oh, POOL_ROWS):
                    _pool_tile(xf, xb, h, w, sh, kh, kw, dh, dw, oy * sh - ph, v * L * sw - pw, of, ob + oy * ow + v * L,
                               ow, min(POOL_ROWS, oh - oy), min(L, ow - v * L), frow, masks, v * kw, rf, oy, cf, v * L,
                               avg, sw2, win)


def _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, avg, cip, divisor, nworkers):
    """Run pool_direct_worker (column stride 1 or 2) or window_worker over the planes of x (P,
    h*w) into out (P, oh_n*ow_n)."""
    P = x.shape[0]
    if P == 0 or oh_n * ow_n == 0:
        return
    for arr in (x, out):
        if not (arr.flags.c_contiguous and arr.dtype == out.dtype):
            raise ValueError(f"pooling: arrays must be C-contiguous {out.dtype}")
    sync = np.zeros(1, np.int64)
    p = np.zeros(S_COUNT, np.int64)
    addresses(p, (sync, x, out))  # S_SYNC, S_X, S_OUT (ctypes.data costs ~1 us an array)
    p[S_PLANES], p[S_H], p[S_W], p[S_OH], p[S_OW] = P, h, w, oh_n, ow_n
    p[S_KH], p[S_KW], p[S_SH], p[S_SW], p[S_PH], p[S_PW], p[S_DH], p[S_DW] = kh, kw, sh, sw, ph, pw, dh, dw
    p[S_AVG], p[S_CIP], p[S_DIV] = avg, cip, divisor
    is64 = bool(out.dtype == np.float64)
    if sw <= 2:  # registers, straight from the plane
        fn = worker_address(pool_direct_worker, (is64, bool(avg), sw == 2, _window_code(kh, kw, sh, dh, dw)))
    else:
        fn = worker_address(window_worker, (is64,))
    if nworkers <= 1:
        p[S_PER] = P
        run_serial(fn, p)
    else:
        p[S_PER] = max(1, P // (nworkers * TASKS_PER_THREAD))
        run_workers(fn, p, min(nworkers, P))


def max_pool_serial(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw):
    """x: (P, h*w) planes, out: (P, oh_n*ow_n); on the calling thread."""
    _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, 0, 0, 0, 1)


def max_pool_parallel(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw):
    """max_pool_serial's result, blocks of planes over numba's threads (dynamic hand-out)."""
    _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, dh, dw, 0, 0, 0, num_threads())


def avg_pool_serial(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor):
    """As max_pool_serial; PyTorch's divisor (count_include_pad, divisor_override > 0)."""
    _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, 1, 1, 1, bool(count_include_pad), divisor, 1)


def avg_pool_parallel(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, count_include_pad, divisor):
    """avg_pool_serial's result, blocks of planes over numba's threads."""
    _window(x, out, h, w, oh_n, ow_n, kh, kw, sh, sw, ph, pw, 1, 1, 1, bool(count_include_pad), divisor,
            num_threads())


@njit(**JIT)
def _adaptive_avg_pool_serial(x, out, h, w, oh_n, ow_n):
    adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, 0, x.shape[0] * oh_n)


@njit(**JIT_BY_ADDRESS)
def adaptive_worker(me, params, is64):
    """(plane, output row) rows claimed from the block (parallel.row_block: n rows, d = h,
    i = w, i2 = oh_n, i3 = ow_n; arrays x (P, h*w), out (P, oh_n*ow_n))."""
    p, _ = row_args(params)
    z = like_dtype(is64)
    h, w, oh_n, ow_n = p[RW_D], p[RW_I], p[RW_I2], p[RW_I3]
    planes = p[RW_N] // oh_n
    x = c_array_at(p[0], z, (planes, h * w))
    out = c_array_at(p[1], z, (planes, oh_n * ow_n))
    lo, hi = row_claim(p, me)
    while lo < hi:
        adaptive_avg_pool_rows(x, out, h, w, oh_n, ow_n, lo, hi)
        lo, hi = row_claim(p, me)


@njit(**JIT)
def _adaptive_launch(x, out, h, w, oh_n, ow_n, worker, nw, fn, buf, team_run, team_state):
    workers = row_block(buf, x.shape[0] * oh_n, h, 0.0, w, oh_n, ow_n, 1, nw, fn)
    buf[0], buf[1] = x.ctypes.data, out.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def _tiles(h, w, oh_n, ow_n):
    """Whether adaptive pooling from (h, w) to (oh_n, ow_n) is an avg_pool of window =
    stride = (h / oh_n, w / ow_n) (the windows tile the plane), with more than one output
    per row: then the avg_pool kernel runs it (VGG's 14 -> 7 head, 512
    planes: 200 us by rows on one thread, 107 us as an avg_pool, Sapphire Rapids
    2026-11-26).  Global pooling (one output per row) keeps the contiguous runs of
    adaptive_avg_pool_rows."""
    return h % oh_n == 0 and w % ow_n == 0 and ow_n > 1


def _adaptive(x, out, h, w, oh_n, ow_n, nworkers):
    if _tiles(h, w, oh_n, ow_n):
        kh, kw = h // oh_n, w // ow_n
        _window(x, out, h, w, oh_n, ow_n, kh, kw, kh, kw, 0, 0, 1, 1, 1, 1, 0, nworkers)
    elif nworkers <= 1:
        _adaptive_avg_pool_serial(x, out, h, w, oh_n, ow_n)
    else:
        row_run(_adaptive_launch, worker_address(adaptive_worker, (bool(x.dtype == np.float64),)),
                x, out, h, w, oh_n, ow_n)


def adaptive_avg_pool_serial(x, out, h, w, oh_n, ow_n):
    """x: (P, h*w) planes, out: (P, oh_n*ow_n): PyTorch's adaptive windows
    [floor(i*n/o), ceil((i+1)*n/o)) per axis; on the calling thread."""
    _adaptive(x, out, h, w, oh_n, ow_n, 1)


def adaptive_avg_pool_parallel(x, out, h, w, oh_n, ow_n):
    """adaptive_avg_pool_serial's result, over numba's threads: blocks of planes (tiling
    windows) or of output rows."""
    _adaptive(x, out, h, w, oh_n, ow_n, num_threads())
