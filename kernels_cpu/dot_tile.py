"""dot_tile: a tile of dot products of rows with rows, the micro-kernel of products whose two
operands are both contiguous along K ("X (n, K) times W (N, K) transposed": a Linear weight
used as it is stored).  The MoE FFN's expert products (kernels_cpu/moe.py) and the GEMV of
a few rows against a Linear weight (kernels_cpu/gemm.py, gemv_nk) run it; gemv_nk runs
dot_row, its one-row form at the target's full vector width, for a single row.

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

from . import target
from .llvm_ir import arg_readers, hsum, prefetch

TA = 4   # rows (tokens) per dot tile
TB = 3   # weight rows per dot tile: 12 vector accumulators + 3 weight vectors + 1 row vector = 16 ymm


def _float_rows(a, b, t):
    """Whether a, b and t are arrays of one float dtype (the tiles' operands)."""
    return (isinstance(a, types.Array) and a.dtype in (types.float32, types.float64)
            and isinstance(b, types.Array) and b.dtype == a.dtype and isinstance(t, types.Array)
            and t.dtype == a.dtype)


def _tile_codegen(nrows, width, is32):
    """The codegen of a tile of nrows rows of a against TB rows of b, for the arguments
    (kl, a, a's nrows row offsets, b, b's TB row offsets, TB prefetch offsets, t)."""
    def codegen(context, builder, sig, args):
        fty = context.get_value_type(sig.args[1].dtype)
        vty = ir.VectorType(fty, width)
        align = 4 if is32 else 8
        i64_of, data = arg_readers(context, builder, sig, args)
        ib = 2 + nrows  # b's argument
        arows = [builder.gep(data(1), [i64_of(2 + i)]) for i in range(nrows)]
        brows = [builder.gep(data(ib), [i64_of(ib + 1 + j)]) for j in range(TB)]
        qrows = [builder.gep(data(ib), [i64_of(ib + 1 + TB + j)]) for j in range(TB)]
        emit_tile(builder, arows, brows, qrows, i64_of(0), width, fty, align, data(ib + 1 + 2 * TB),
                  lambda ptr: builder.load(builder.bitcast(ptr, vty.as_pointer()), align=align),
                  lambda ptr: builder.load(ptr))
        return context.get_dummy_value()

    return codegen


@intrinsic
def dot_tile(typingctx, kl, a, a0, a1, a2, a3, b, b0, b1, b2, q0, q1, q2, t):
    """t[i*TB + j] = sum over k < kl of a[a_i + k] * b[b_j + k] for the TA rows of a at
    offsets a0..a3 and the TB rows of b at offsets b0..b2 (a, b, t flat arrays of one
    float dtype), prefetching the rows of b at offsets q0..q2 into L2 on the way (the next
    weight group: pass a row being read for none).  Emits TA x TB vector accumulators
    (allocas that mem2reg makes registers), a loop of kl // W vector steps (TB prefetches,
    TB loads of b, TA loads of a, TA * TB llvm.fma), a horizontal sum per accumulator, a
    scalar loop over the kl % W last k, and TA * TB scalar stores."""
    if not _float_rows(a, b, t):
        return None
    is32 = a.dtype == types.float32
    sig = types.none(kl, a, a0, a1, a2, a3, b, b0, b1, b2, q0, q1, q2, t)
    return sig, _tile_codegen(TA, 8 if is32 else 4, is32)


@intrinsic
def dot_row(typingctx, kl, a, a0, b, b0, b1, b2, q0, q1, q2, t):
    """t[j] = sum over k < kl of a[a0 + k] * b[b_j + k] for the TB rows of b at offsets
    b0..b2: dot_tile for one row of a (a GEMV step), prefetching the rows of b at q0..q2.
    With one row the tile holds TB accumulators, not TA x TB, so it runs the target's
    widest vectors (16 float32 lanes with AVX-512, decided when it is compiled, as numba's
    cache is keyed on the target's features) and no row's FMAs are repeated: dot_tile with
    its TA row offsets all on the one row did TA times the FMAs at half the width."""
    if not _float_rows(a, b, t):
        return None
    is32 = a.dtype == types.float32
    width = (16 if is32 else 8) if target.has("avx512f") else (8 if is32 else 4)
    sig = types.none(kl, a, a0, b, b0, b1, b2, q0, q1, q2, t)
    return sig, _tile_codegen(1, width, is32)


def emit_tile(builder, arows, brows, qrows, kl64, width, fty, bsize, t_ptr, b_vector, b_scalar):
    """The IR of a tile of len(arows) x len(brows) dot products over kl64 values, shared by
    dot_tile and weight_only's wo_tile: vector accumulators (allocas that mem2reg makes
    registers), a loop of kl // width steps (a prefetch of each qrows row into L2 at the
    step's byte offset, the b vectors, then each a row's vector and its FMAs), a horizontal
    sum per accumulator, a scalar loop over the last kl % width values, and the sums stored
    to t_ptr[i * len(brows) + j].  arows: pointers to float rows (fty, read in vectors of
    width); brows / qrows: pointers to b's rows and to the rows to prefetch (bsize bytes per
    element); b_vector(ptr) / b_scalar(ptr): the fty vector / value of b at ptr (a load, or
    a load widened from 16 or 8 bits)."""
    i64 = ir.IntType(64)
    vty = ir.VectorType(fty, width)
    suffix = "f32" if isinstance(fty, ir.FloatType) else "f64"
    vfma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3), f"llvm.fma.v{width}{suffix}")
    sfma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(fty, [fty] * 3), f"llvm.fma.{suffix}")
    asize = 4 if suffix == "f32" else 8
    na, nb = len(arows), len(brows)
    nvec = builder.udiv(kl64, ir.Constant(i64, width))
    zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * width)
    accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(nb)] for _ in range(na)]
    with cgutils.for_range(builder, nvec) as loop:
        k = builder.mul(loop.index, ir.Constant(i64, width))
        kb = builder.mul(k, ir.Constant(i64, bsize))
        for j in range(nb):
            prefetch(builder, qrows[j], 2, kb)
        bv = [b_vector(builder.gep(brows[j], [k])) for j in range(nb)]
        for i in range(na):
            av = builder.load(builder.bitcast(builder.gep(arows[i], [k]), vty.as_pointer()), align=asize)
            for j in range(nb):
                builder.store(builder.call(vfma, [av, bv[j], builder.load(accs[i][j])]), accs[i][j])
    sums = [[cgutils.alloca_once_value(builder, hsum(builder, builder.load(accs[i][j]), width)) for j in range(nb)]
            for i in range(na)]
    kv = builder.mul(nvec, ir.Constant(i64, width))
    with cgutils.for_range(builder, builder.sub(kl64, kv)) as loop:
        k = builder.add(kv, loop.index)
        bs = [b_scalar(builder.gep(brows[j], [k])) for j in range(nb)]
        for i in range(na):
            a_s = builder.load(builder.gep(arows[i], [k]))
            for j in range(nb):
                builder.store(builder.call(sfma, [a_s, bs[j], builder.load(sums[i][j])]), sums[i][j])
    for i in range(na):
        for j in range(nb):
            builder.store(builder.load(sums[i][j]), builder.gep(t_ptr, [ir.Constant(i64, i * nb + j)]))
