"""bfloat16 conv2d on AMX tiles: the im2col matrix formed straight in the AMX GEMM's B panels.

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
from numba.extending import intrinsic

from . import bf16_gemm as KB
from .approx import JIT_BY_ADDRESS
from .gemm import _U
from .llvm_ir import arg_readers, splat
from .parallel import c_array_at

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


def pack_tasks(k) -> int:
    """im2col_pairs' tasks per image (run_amx's b_packer) for K = k rows of col."""
    return -(-(-(-k // KB.AMX_K) * (KB.AMX_K // 2)) // KB.KN_PAIRS)


@njit(**JIT_BY_ADDRESS)
def im2col_pairs(i, params):
    """Packing task i of run_amx's b (bf16_gemm.P_BPACK): image i // bt, pairs q of col's
    rows (2q, 2q + 1) from KN_PAIRS * (i % bt) on (bt = pack_tasks(K)), each pair formed
    in a row buffer (the two rows a whole number of panels apart, zeros past the last pixel)
    and interleaved into the image's B panels at P_W (uint32 [image][panel of AMX_NR
    pixels][P_K2P pairs][AMX_NR]: the pair's two values one word).  Whole rows of col at a
    time: a task of a band of pixels instead (all pairs, 128 pixels) ran 12-55% slower."""
    p = c_array_at(params, np.int64(0), (KB.P_COUNT + E_COUNT,))
    e = p[KB.P_COUNT:]
    K, N, K2p, nb = p[KB.P_K], p[KB.P_N], p[KB.P_K2P], p[KB.P_NB]
    bt = (K2p + KB.KN_PAIRS - 1) // KB.KN_PAIRS
    bi = i // bt
    q0 = (i - bi * bt) * KB.KN_PAIRS
    npan = (N + KB.AMX_NR - 1) // KB.AMX_NR
    Np = npan * KB.AMX_NR
    img = e[E_C] * e[E_H] * e[E_W]
    x16 = c_array_at(p[KB.P_BSRC], np.uint16(0), (nb * img,))
    dst = c_array_at(p[KB.P_W], np.uint32(0), (nb * npan * K2p * KB.AMX_NR,))
    rows = np.zeros(2 * Np, np.uint16)   # zeros past the last pixel stay zeros
    for q in range(q0, min(q0 + KB.KN_PAIRS, K2p)):
        for h in range(2):
            k = 2 * q + h
            if k < K:
                _col_row(x16, bi * img, k, e, rows, h * Np)
            else:   # past K (the last chunk's padding): zeros
                for j in range(_U(N)):
                    rows[_U(h * Np) + j] = np.uint16(0)
        KB._interleave_pair(dst, (bi * npan * K2p + q) * KB.AMX_NR, K2p * KB.AMX_NR, rows, 0, Np, npan)
