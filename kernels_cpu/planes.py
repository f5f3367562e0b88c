"""Building blocks of the sliding-window kernels (depthwise convolution, max / avg pooling).

Two forms share them:

Register tiles (column stride 1 or 2: conv.depthwise_direct_worker, pool.pool_direct_worker).
A block of output rows x one vector of output columns is held in registers and computed
straight from the input plane: masked loads (llvm_ir.masked_ops) whose masked-off lanes are
the padding (not read, so no fault and no padded copy), `column_masks` the lane bits per
vector and tap column, `plane_row` a row of fill values for the rows above and below the
plane.  The vector is 512 bits on AVX-512 targets, 256
elsewhere (`lanes`).

Stride phases (larger column strides: conv.depthwise_phase_worker, pool.window_worker),
each output plane computed as a few long vector loops over one flat buffer instead of many
short, strided row loops.  The layout (window geometry kh x kw, stride sh x sw, dilation
dh x dw, top / left padding ph / pw, output oh x ow):
  * The padded input plane is split into sh * sw phases: padded row r*sh + py and column
    c*sw + px go to phase (py, px), row r, column c.  Each phase holds hq x wq values,
    hq = oh + (kh-1)*dh // sh, wq = ow + (kw-1)*dw // sw (row pitch wq), so output (oy, ox)
    numbered o = oy*wq + ox reads, for tap (ky, kx), xq[tap_offset + o]: the same offset
    for every output, consecutive outputs at consecutive addresses (unit stride for any
    stride and dilation).
  * A tap is then one vector loop over o < nt = (oh-1)*wq + ow (the columns ow..wq of
    each row are computed and dropped); nt is rounded up to whole blocks of ROUND values
    so that the vectorized loops have no scalar remainder.
  * Rows are moved between the planes and the phase buffer with masked vector copies
    (copy_run): a 14-wide row (MobileNet's 14x14 planes) is one masked load and store,
    where LLVM's vectorized loop ran it through its scalar remainder.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .approx import _target_has_avx512
from .llvm_ir import arg_readers, lane_mask, masked_ops

_U = np.uint64  # unsigned indices: numba drops the negative-index fix-up

# The tap loops' trip count is rounded up to a multiple of ROUND values: LLVM vectorizes
# them 16 (AVX-512 float32) x up to 4 (its interleave) values per iteration, and a count
# that is a multiple of that leaves its scalar remainder loop empty.
ROUND = 64


def lanes(dtype) -> int:
    """Values of `dtype` (a numba float type) in one vector of the target's masked vector
    code: a 512-bit vector on AVX-512 targets, 256-bit elsewhere (LLVM lowers it on any
    target)."""
    return (512 if _target_has_avx512() else 256) // (32 if dtype == types.float32 else 64)


@intrinsic
def vector_lanes(typingctx, arr):
    """lanes(arr.dtype), a compile-time constant."""
    if not (isinstance(arr, types.Array) and arr.dtype in (types.float32, types.float64)):
        return None

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(64), lanes(sig.args[0].dtype))

    return types.int64(arr), codegen


def plane_row(builder, data, base, iy, h, w, outside):
    """The address of row iy (column 0) of the h x w plane at data + base, or `outside` (a
    row of fill values) when iy is not in [0, h): the register-tiled window kernels read
    rows above and below the plane from there (i64 values)."""
    image = builder.gep(data, [builder.add(base, builder.mul(iy, w))])
    return builder.select(builder.icmp_unsigned("<", iy, h), image, outside)


@intrinsic
def _copy_chunk(typingctx, dst, d, src, s, n):
    """dst[d : d+k] = src[s : s+k], k = min(n, L), with one masked vector load and store
    (L = lanes(dtype)).  Returns L."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype
            and dst.dtype in (types.float32, types.float64)):
        return None

    def codegen(context, builder, sig, args):
        width, _, vty = vector_type(context, sig.args[0].dtype)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        i64_of, at = arg_access(context, builder, sig, args)
        dp, sp = at(0, i64_of(1)), at(2, i64_of(3))
        n = i64_of(4)
        k = builder.trunc(builder.select(builder.icmp_signed("<", n, ir.Constant(i64, width)), n,
                                         ir.Constant(i64, width)), i32)
        mask = lane_mask(builder, ir.Constant(i32, 0), k, width)
        load, store = masked_ops(builder, vty)
        store(load(sp, mask), dp, mask)
        return ir.Constant(i64, width)

    return types.int64(dst, d, src, s, n), codegen


@njit(inline="always")
def column_masks(masks, nvec, L, sw, kw, dw, pw, w):
    """masks[v*kw + kx] = the lane bits of the input columns that vector v of output columns
    reads for tap column kx in the register-tiled window kernels: bit i set when column
    v*L*sw - pw + kx*dw + i lies inside the plane (0 <= . < w), i < L*sw (at column stride
    sw the vector's L outputs read L*sw consecutive columns)."""
    for v in range(nvec):
        for kx in range(kw):
            start = v * L * sw - pw + kx * dw
            bits = 0
            for i in range(L * sw):
                if 0 <= start + i < w:
                    bits |= 1 << i
            masks[v * kw + kx] = bits


def arg_access(context, builder, sig, args):
    """(i64_of, at) for an intrinsic's codegen: i64_of(k) = argument k as an i64, at(k, off) =
    the address of element off of array argument k (llvm_ir.arg_readers)."""
    i64_of, data = arg_readers(context, builder, sig, args)

    def at(k, off):
        return builder.gep(data(k), [off])

    return i64_of, at


def vector_type(context, dtype):
    """(L, the LLVM float type, <L x float type>) for numba float type dtype (lanes)."""
    width = lanes(dtype)
    fty = context.get_value_type(dtype)
    return width, fty, ir.VectorType(fty, width)


@njit(inline="always")
def copy_run(dst, d, src, s, n):
    """dst[d : d+n] = src[s : s+n] (flat arrays of one float type, n >= 0) in masked vector
    chunks: no scalar tail."""
    while n > 0:
        k = _copy_chunk(dst, d, src, s, n)
        d += k
        s += k
        n -= k


@njit(inline="always")
def phase_shape(oh, ow, kh, kw, sh, sw, dh, dw):
    """(hq, wq): the rows and the row pitch of one phase."""
    return oh + (kh - 1) * dh // sh, ow + (kw - 1) * dw // sw


@njit(inline="always")
def tap_offset(ky, kx, sh, sw, dh, dw, hq, wq):
    """Where tap (ky, kx) reads output 0's value: phase ((ky*dh) % sh, (kx*dw) % sw), row
    (ky*dh) // sh, column (kx*dw) // sw."""
    ty, tx = ky * dh, kx * dw
    return (((ty % sh) * sw + tx % sw) * hq + ty // sh) * wq + tx // sw


@njit(inline="always")
def split_plane(xf, xb, h, w, sh, sw, ph, pw, hq, wq, xq, trow):
    """The image part of plane xf[xb : xb + h*w] into the phases in xq (see the module
    docstring); the padding positions of xq and trow (one padded input row, wq*sw values)
    are left as they are: the caller fills them once, as they are the same for every
    plane."""
    pq = hq * wq
    lo = min(pw, wq * sw)                 # padded columns [lo, hi) hold the image
    hi = max(lo, min(pw + w, wq * sw))
    for py in range(sh):
        for qy in range(hq):
            iy = qy * sh + py - ph
            if iy < 0 or iy >= h:
                continue
            d0 = (py * sw * hq + qy) * wq  # phase (py, 0), row qy
            src = xb + iy * w
            if sw == 1:
                copy_run(xq, d0 + lo, xf, src + lo - pw, hi - lo)
                continue
            copy_run(trow, lo, xf, src + lo - pw, hi - lo)
            if sw == 2:  # both phases in one loop: an interleaved pair LLVM vectorizes with shuffles
                for qx in range(wq):
                    xq[_U(d0 + qx)] = trow[_U(2 * qx)]
                    xq[_U(d0 + pq + qx)] = trow[_U(2 * qx + 1)]
            else:
                for px in range(sw):
                    for qx in range(wq):
                        xq[_U(d0 + px * pq + qx)] = trow[_U(qx * sw + px)]


@njit(inline="always")
def rows_out(of, ob, tq, oh, ow, wq):
    """of[ob + oy*ow + ox] = tq[oy*wq + ox]: the output rows out of the pitched buffer."""
    if wq == ow:
        copy_run(of, ob, tq, 0, oh * ow)
    else:
        for oy in range(oh):
            copy_run(of, ob + oy * ow, tq, oy * wq, ow)
