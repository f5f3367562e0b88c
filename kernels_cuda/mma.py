"""Tensor-core primitives: the warp-wide ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``,
and two helpers of the kernels built on it: ``pack_f16x2`` (two float32 values rounded into
one operand register of float16 halves, cvt.rn.f16x2.f32) and ``ex2_approx`` (2^x on the
special-function unit, ex2.approx.f32), each with a Python twin for the simulator
(tests/cuda/test_mma.py holds both to numpy).

Its A and B operands are 32-bit registers of two float16 values (low half = lower
column / row); kernels build them from uint16 views of float16 arrays (``lo | hi << 16``),
integer work that needs no float16 support from numba.

numba-cuda has no WMMA/mma API; ``mma_16816`` is an intrinsic that emits the PTX
instruction through inline assembly (ptxas turns it into ``HMMA.16816.F32`` on sm_80 and
later).  The simulator cannot run inline assembly, so under it ``mma_16816`` is a Python
twin with the same fragment layout (the lanes exchange their registers through a per-warp
table between two warp barriers, which tests/cuda/simwarp.py emulates); tests/cuda/test_mma.py checks the layout below against numpy on whichever
of the two runs (the twin under the simulator, HMMA on a GPU).

Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .f16 A/B, .f32 C/D),
for lane l of the warp, g = l >> 2 (its group), t = l & 3 (its place in the group):
  A, 16 x 16 row-major, four 32-bit registers of two halves (low half = lower column):
      a0 = A[g, 2t:2t+2]    a1 = A[g+8, 2t:2t+2]    a2 = A[g, 2t+8:2t+10]    a3 = A[g+8, 2t+8:2t+10]
  B, 16 x 8 ("col": column n = g holds a thread's values), two registers:
      b0 = B[2t:2t+2, g]    b1 = B[2t+8:2t+10, g]
  C and D, 16 x 8 float32, four registers:
      c0, c1 = C[g, 2t], C[g, 2t+1]          c2, c3 = C[g+8, 2t], C[g+8, 2t+1]
D = A @ B + C.  Every lane of the warp must call it together (it is warp-synchronous).
"""
import numpy as np
from llvmlite import ir
from numba import cuda, types

from ._jit import SIM, device

if not SIM:
    from numba.cuda.extending import intrinsic

    @intrinsic
    def mma_16816(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """(d0, d1, d2, d3): one m16n8k16 tensor-core product of the warp (see the module
        docstring for which elements each argument and result holds)."""
        f32, u32 = types.float32, types.uint32
        regs, accs = (a0, a1, a2, a3, b0, b1), (c0, c1, c2, c3)
        if not all(isinstance(t, types.Integer) for t in regs) or not all(isinstance(t, types.Float) for t in accs):
            return None
        sig = types.UniTuple(f32, 4)(*regs, *accs)  # integers are taken modulo 2^32 (numba widens shifts to 64 bits)

        def codegen(context, builder, sig, args):
            f, i = ir.FloatType(), ir.IntType(32)
            vals = [context.cast(builder, v, t, u32) for v, t in zip(args[:6], sig.args[:6])]
            vals += [context.cast(builder, v, t, f32) for v, t in zip(args[6:], sig.args[6:])]
            fnty = ir.FunctionType(ir.LiteralStructType([f, f, f, f]), [i] * 6 + [f] * 4)
            asm = ir.InlineAsm(fnty, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                                     "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            res = builder.call(asm, vals)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, k) for k in range(4)])

        return sig, codegen

    @intrinsic
    def pack_f16x2(typingctx, lo, hi):
        """The 32-bit word of two float16 values rounded from lo and hi (low half = lo): an
        mma A or B operand register, from float32 values (cvt.rn.f16x2.f32)."""
        if not (isinstance(lo, types.Float) and isinstance(hi, types.Float)):
            return None
        sig = types.uint32(lo, hi)

        def codegen(context, builder, sig, args):
            f, i = ir.FloatType(), ir.IntType(32)
            vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args)]
            # d = {a -> upper half, b -> lower half}
            asm = ir.InlineAsm(ir.FunctionType(i, [f, f]), "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f")
            return builder.call(asm, [vals[1], vals[0]])

        return sig, codegen

    @intrinsic
    def ex2_approx(typingctx, x):
        """2^x by the special-function unit (ex2.approx.f32: about 2 ulp; -inf gives +0, NaN
        NaN): one instruction, where math.exp's accurate expansion is dozens and held
        registers across the flash-attention tile's 64 exponentials."""
        if not isinstance(x, types.Float):
            return None
        sig = types.float32(x)

        def codegen(context, builder, sig, args):
            f = ir.FloatType()
            val = context.cast(builder, args[0], sig.args[0], types.float32)
            return builder.call(ir.InlineAsm(ir.FunctionType(f, [f]), "ex2.approx.f32 $0, $1;", "=f,f"), [val])

        return sig, codegen

else:
    def ex2_approx(x):
        """Simulator twin: 2^x in float32."""
        return np.float32(np.exp2(np.float32(x)))

    def _halves(u):
        u = int(u) & 0xFFFFFFFF
        return (float(np.uint16(u & 0xFFFF).view(np.float16)), float(np.uint16(u >> 16).view(np.float16)))

    def pack_f16x2(lo, hi):
        """Simulator twin: the same bits as cvt.rn.f16x2.f32 (round to nearest even)."""
        return np.uint32(int(np.float16(lo).view(np.uint16)) | (int(np.float16(hi).view(np.uint16)) << 16))

    # A device function, so that the simulator runs it with its own `cuda` module (thread
    # indices, the emulated warp barrier), as it does the kernels.
    @device
    def mma_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """Simulator twin: the warp's fragments meet in a per-warp scratch table (one
        warp barrier to publish, one before the next call may overwrite: the simulator
        pays per barrier, so not a shuffle per value), products in float32 as the tensor
        core accumulates.  1-D blocks of whole warps."""
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        g, t = lane >> 2, lane & 3
        table = cuda.shared.array((32, 32, 6), np.uint32)  # [warp][lane][a0..a3, b0, b1]
        mine = table[warp, lane]
        mine[0], mine[1], mine[2], mine[3], mine[4], mine[5] = a0, a1, a2, a3, b0, b1
        cuda.syncwarp()
        regs = table[warp]
        row_lo = [0.0] * 16  # A[g, :]: lane 4g + j holds A[g, 2j:2j+2] (a0) and A[g, 2j+8:2j+10] (a2)
        row_hi = [0.0] * 16  # A[g + 8, :]: the same lanes' a1 and a3
        col0 = [0.0] * 16    # B[:, 2t]: lane 4n + j holds B[2j:2j+2, n] (b0) and B[2j+8:2j+10, n] (b1)
        col1 = [0.0] * 16    # B[:, 2t + 1]
        for j in range(4):
            ra, rb0, rb1 = regs[4 * g + j], regs[4 * (2 * t) + j], regs[4 * (2 * t + 1) + j]
            row_lo[2 * j], row_lo[2 * j + 1] = _halves(ra[0])
            row_hi[2 * j], row_hi[2 * j + 1] = _halves(ra[1])
            row_lo[2 * j + 8], row_lo[2 * j + 9] = _halves(ra[2])
            row_hi[2 * j + 8], row_hi[2 * j + 9] = _halves(ra[3])
            col0[2 * j], col0[2 * j + 1] = _halves(rb0[4])
            col0[2 * j + 8], col0[2 * j + 9] = _halves(rb0[5])
            col1[2 * j], col1[2 * j + 1] = _halves(rb1[4])
            col1[2 * j + 8], col1[2 * j + 9] = _halves(rb1[5])
        cuda.syncwarp()
        f = np.float32
        d0 = f(c0) + f(sum(f(row_lo[k]) * f(col0[k]) for k in range(16)))
        d1 = f(c1) + f(sum(f(row_lo[k]) * f(col1[k]) for k in range(16)))
        d2 = f(c2) + f(sum(f(row_hi[k]) * f(col0[k]) for k in range(16)))
        d3 = f(c3) + f(sum(f(row_hi[k]) * f(col1[k]) for k in range(16)))
        return d0, d1, d2, d3
