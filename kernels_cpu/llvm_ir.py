"""Pieces of LLVM IR that several kernels' intrinsics emit (plain llvmlite builders; numba's
lowering context only to read an intrinsic's arguments), so each is written once."""
from llvmlite import ir
from numba import types
from numba.core import cgutils

_I32 = ir.IntType(32)


def arg_readers(context, builder, sig, args):
    """(i64_of, data) for an intrinsic's codegen: i64_of(pos) is argument pos cast to i64,
    data(pos) the data pointer of array argument pos."""
    def i64_of(pos):
        return context.cast(builder, args[pos], sig.args[pos], types.int64)

    def data(pos):
        return context.make_array(sig.args[pos])(context, builder, args[pos]).data

    return i64_of, data


def prefetch(builder, ptr, locality, byte_off=None):
    """llvm.prefetch (a read) of the cache line holding ptr, plus byte_off bytes (an i64
    value or a Python int) when given; locality 3 keeps the line in L1, 2 in L2."""
    i8p = ir.IntType(8).as_pointer()
    pfn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], ir.FunctionType(ir.VoidType(), [i8p] + [_I32] * 3))
    addr = builder.bitcast(ptr, i8p)
    if byte_off is not None:
        off = ir.Constant(ir.IntType(64), byte_off) if isinstance(byte_off, int) else byte_off
        addr = builder.gep(addr, [off])
    builder.call(pfn, [addr, ir.Constant(_I32, 0), ir.Constant(_I32, locality), ir.Constant(_I32, 1)])


def hsum(builder, v, width: int):
    """The sum of the `width` float lanes of vector v, by halving: the upper half added to
    the lower half until one lane is left (log2(width) shuffles and adds, no loop)."""
    n = width
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def hsums(builder, vs, width: int):
    """The vector whose lane j is the sum of the lanes of vs[j] (len(vs) == width, a power of
    two), by halving pairs: each level adds, for two vectors holding R rows of s partial sums
    each, their rows' first s/2 lanes to their last s/2, giving one vector of 2R rows of
    s/2 (log2(width) levels, width - 1 adds in all, where an hsum per vector takes
    width * log2(width))."""
    s = width
    while s > 1:
        h = s // 2
        lo = [r * s + i for r in range(2 * width // s) for i in range(h)]
        hi = [i + h for i in lo]
        vs = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, width), lo)),
                           builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, width), hi)))
              for a, b in zip(vs[0::2], vs[1::2])]
        s = h
    return vs[0]


def splat(builder, x, width):
    """The <width x T> vector of scalar x in every lane."""
    i32 = ir.IntType(32)
    vt = ir.VectorType(x.type, width)
    undef = ir.Constant(vt, ir.Undefined)
    return builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(i32, 0)), undef,
                                  ir.Constant(ir.VectorType(i32, width), [0] * width))


def bits_mask(builder, bits, width, shift=0):
    """The <width x i1> mask of bits shift .. shift+width-1 of the i64 value bits."""
    if shift:
        bits = builder.lshr(bits, ir.Constant(ir.IntType(64), shift))
    return builder.bitcast(builder.trunc(bits, ir.IntType(width)), ir.VectorType(ir.IntType(1), width))


def lane_mask(builder, lo, hi, width):
    """The <width x i1> mask of lanes l with lo <= l < hi (i32 values)."""
    lane = ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width)))
    return builder.and_(builder.icmp_signed(">=", lane, splat(builder, lo, width)),
                        builder.icmp_signed("<", lane, splat(builder, hi, width)))


def masked_ops(builder, vty):
    """(load, store): llvm.masked.load / llvm.masked.store for vector type vty:
    load(ptr, mask, passthru=zeros) -> vty with passthru's values in the masked-off lanes
    (which are not read: no fault); store(value, ptr, mask)."""
    i32 = ir.IntType(32)
    width = vty.count
    is32 = vty.element == ir.FloatType()
    mty = ir.VectorType(ir.IntType(1), width)
    pty = vty.as_pointer()
    suffix = "v%d%s.p0" % (width, "f32" if is32 else "f64")
    ld = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [pty, i32, mty, vty]),
                                        "llvm.masked.load." + suffix)
    st = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [vty, pty, i32, mty]),
                                        "llvm.masked.store." + suffix)
    align = ir.Constant(i32, 4 if is32 else 8)
    zero = ir.Constant(vty, [ir.Constant(vty.element, 0.0)] * width)

    def load(ptr, mask, passthru=zero):
        return builder.call(ld, [builder.bitcast(ptr, pty), align, mask, passthru])

    def store(value, ptr, mask):
        builder.call(st, [value, builder.bitcast(ptr, pty), align, mask])

    return load, store
