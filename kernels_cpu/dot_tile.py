"""dot_tile: a tile of dot products of rows with rows, the micro-kernel of products whose two
operands are both contiguous along K ("X (n, K) times W (N, K) transposed": a Linear weight
used as it is stored).  The MoE FFN's expert products (kernels_cpu/moe.py) and the GEMV of
a few rows against a Linear weight (kernels_cpu/gemm.py, gemv_nk) run it.

An LLVM-IR intrinsic like the GEMM's micro-kernel (numba leaves LLVM's SLP vectorizer off):
TA x TB vector accumulators along K, per K step of one vector TB weight loads, TA row loads
and TA * TB FMAs (4 x 3: 7 loads per 12 FMAs), no packing of either operand: a weight row is
read straight from memory, streamed once, while the tile prefetches the rows its caller
names (the next weight group) into L2.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvm_ir import hsum

TA = 4   # rows (tokens) per dot tile
TB = 3   # weight rows per dot tile: 12 vector accumulators + 3 weight vectors + 1 row vector = 16 ymm


@intrinsic
def dot_tile(typingctx, kl, a, a0, a1, a2, a3, b, b0, b1, b2, q0, q1, q2, t):
    """t[i*TB + j] = sum over k < kl of a[a_i + k] * b[b_j + k] for the TA rows of a at
    offsets a0..a3 and the TB rows of b at offsets b0..b2 (a, b, t flat arrays of one
    float dtype), prefetching the rows of b at offsets q0..q2 into L2 on the way (the next
    weight group: pass a row being read for none).  Emits TA x TB vector accumulators
    (allocas that mem2reg makes registers), a loop of kl // W vector steps (TB prefetches,
    TB loads of b, TA loads of a, TA * TB llvm.fma), a horizontal sum per accumulator, a
    scalar loop over the kl % W last k, and TA * TB scalar stores."""
    if not (isinstance(a, types.Array) and a.dtype in (types.float32, types.float64)
            and isinstance(b, types.Array) and b.dtype == a.dtype and isinstance(t, types.Array)
            and t.dtype == a.dtype):
        return None
    is32 = a.dtype == types.float32
    width = 8 if is32 else 4
    sig = types.none(kl, a, a0, a1, a2, a3, b, b0, b1, b2, q0, q1, q2, t)

    def codegen(context, builder, sig, args):
        fty = context.get_value_type(sig.args[1].dtype)
        vty = ir.VectorType(fty, width)
        i64, i32 = ir.IntType(64), ir.IntType(32)
        align = 4 if is32 else 8

        def i64_of(pos):
            return context.cast(builder, args[pos], sig.args[pos], types.int64)

        def data(pos):
            return context.make_array(sig.args[pos])(context, builder, args[pos]).data

        arows = [builder.gep(data(1), [i64_of(2 + i)]) for i in range(TA)]
        brows = [builder.gep(data(6), [i64_of(7 + j)]) for j in range(TB)]
        i8p = ir.IntType(8).as_pointer()
        qrows = [builder.bitcast(builder.gep(data(6), [i64_of(10 + j)]), i8p) for j in range(TB)]
        pfn = builder.module.declare_intrinsic("llvm.prefetch", [i8p],
                                               ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
        kl64 = i64_of(0)
        nvec = builder.udiv(kl64, ir.Constant(i64, width))
        suffix = "f32" if is32 else "f64"
        vfma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3),
                                              f"llvm.fma.v{width}{suffix}")
        sfma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(fty, [fty] * 3), f"llvm.fma.{suffix}")
        zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * width)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(TB)] for _ in range(TA)]

        def vload(row, k):
            return builder.load(builder.bitcast(builder.gep(row, [k]), vty.as_pointer()), align=align)

        with cgutils.for_range(builder, nvec) as loop:
            k = builder.mul(loop.index, ir.Constant(i64, width))
            kb = builder.mul(k, ir.Constant(i64, 4 if is32 else 8))
            for j in range(TB):
                builder.call(pfn, [builder.gep(qrows[j], [kb]), ir.Constant(i32, 0), ir.Constant(i32, 2),
                                   ir.Constant(i32, 1)])
            bv = [vload(brows[j], k) for j in range(TB)]
            for i in range(TA):
                av = vload(arows[i], k)
                for j in range(TB):
                    builder.store(builder.call(vfma, [av, bv[j], builder.load(accs[i][j])]), accs[i][j])

        sums = [[cgutils.alloca_once_value(builder, hsum(builder, builder.load(accs[i][j]), width))
                 for j in range(TB)]
                for i in range(TA)]
        kv = builder.mul(nvec, ir.Constant(i64, width))
        with cgutils.for_range(builder, builder.sub(kl64, kv)) as loop:
            k = builder.add(kv, loop.index)
            bs = [builder.load(builder.gep(brows[j], [k])) for j in range(TB)]
            for i in range(TA):
                a_s = builder.load(builder.gep(arows[i], [k]))
                for j in range(TB):
                    builder.store(builder.call(sfma, [a_s, bs[j], builder.load(sums[i][j])]), sums[i][j])
        tp = data(13)
        for i in range(TA):
            for j in range(TB):
                builder.store(builder.load(sums[i][j]), builder.gep(tp, [ir.Constant(i64, i * TB + j)]))
        return context.get_dummy_value()

    return sig, codegen
