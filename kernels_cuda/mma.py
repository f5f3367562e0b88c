"""Tensor-core primitives: the warp-wide ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``,
and helpers of the kernels built on it: ``pack_f16x2`` (two float32 values rounded into
one operand register of float16 halves, cvt.rn.f16x2.f32) and ``ex2_approx`` (2^x on the
special-function unit, ex2.approx.f32; ``ex2_approx_ftz`` without the subnormal results), and
``max_skip_nan`` (max.f32), each with a Python twin for the simulator
(tests/cuda/test_mma.py holds them to numpy).

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

Asynchronous copies and matrix loads (sm_80+), the pipelined GEMM's (gemm_tc_async_kernel):
  cp_async16(dst, di, src, si, nbytes): cp.async.cg.shared.global, 16 bytes from &src[si]
      (global) to &dst[di] (shared), of which only the first nbytes (0 or 16 here) are read,
      the rest zero-filled (nbytes = 0: out-of-range data reads as zero without a branch).
      Both addresses 16-byte aligned.  Completes asynchronously: the copies a thread issued
      since its last cp_async_commit() form one group; cp_async_wait(n) (n a compile-time
      constant) waits until at most n of the thread's groups are pending.  Other threads see
      the data only after a barrier (__syncthreads) that follows the wait.
      cp_async16_at(dst, di, gaddr, nbytes): the same from gaddr = global_address(src, si)
      (+ a byte offset), a uint64 a kernel keeps and advances instead of an index.
  ldmatrix_x4(s, i) / ldmatrix_x4_trans(s, i): ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16,
      four 8 x 8 matrices of 16-bit values from shared memory.  s is a shared uint32 array,
      i a word index: lane 8m + r gives the address of row r of matrix m (16 bytes, 16-byte
      aligned).  Register m of lane l (g = l >> 2, t = l & 3) receives from matrix m:
        plain:  the word at row g, columns 2t, 2t + 1 (low half = column 2t);
        .trans: rows 2t and 2t + 1 of column g (low half = row 2t), i.e. the word at row g,
                columns 2t, 2t + 1 of the transposed matrix.
      So with matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
      (rows 8-15, k 8-15) of a row-major A, plain gives mma's a0..a3; from a B stored one
      row per column n (N, K), plain gives b0, b1 (k 0-7, k 8-15) of two n8 tiles; from a B
      stored (K, N), .trans does.  Every lane of the warp must call it together.
Hopper's own instructions (wgmma, setmaxnreg) need sm_90a code: numba-cuda 0.30 builds it on
a compute capability 9.0 device already (numba.cuda.codegen's _ensure_cc appends the "a"), and
compile_ptx(..., cc=(9, 0, "a")) gives .target sm_90a, which ptxas -arch=sm_90a assembles with
a wgmma.fence through inline assembly (checked 2026-11-27); bench.ptx builds sm_90, and sm_90a for
the kernels declared arch_specific (kernels_cuda/wgmma.py's, in gemm_wgmma.py).
The simulator twins: cp_async16 copies at once (commit and wait do nothing); the ldmatrix
twins exchange the row addresses through a per-warp table between warp barriers as the
hardware does (tests/cuda/test_mma.py holds both to this layout, on a GPU the instructions).
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

    @intrinsic
    def ex2_approx_ftz(typingctx, x):
        """2^x as ex2_approx, results below 2^-126 flushed to +0 (ex2.approx.ftz.f32): the
        bare MUFU.EX2, where ex2.approx.f32 adds a compare, two multiplies and a select to
        reach the subnormals (ptxas, sm_80/90).  For softmax weights p <= 1 against a row sum
        >= 1, where a weight below 2^-126 changes nothing."""
        if not isinstance(x, types.Float):
            return None
        sig = types.float32(x)

        def codegen(context, builder, sig, args):
            f = ir.FloatType()
            val = context.cast(builder, args[0], sig.args[0], types.float32)
            return builder.call(ir.InlineAsm(ir.FunctionType(f, [f]), "ex2.approx.ftz.f32 $0, $1;", "=f,f"), [val])

        return sig, codegen

    @intrinsic
    def max_skip_nan(typingctx, a, b):
        """max.f32: the larger of a and b, a NaN operand ignored (NaN only when both are): one
        FMNMX, where `if b > a: a = b` is a compare and a select."""
        if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
            return None
        sig = types.float32(a, b)

        def codegen(context, builder, sig, args):
            f = ir.FloatType()
            vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args)]
            return builder.call(ir.InlineAsm(ir.FunctionType(f, [f, f]), "max.f32 $0, $1, $2;", "=f,f,f"), vals)

        return sig, codegen

    _I8 = ir.IntType(8)

    def _byte_ptr(context, builder, aryty, ary, idxty, idx, addrspace):
        """&ary[idx] (flat element index, no bounds check) as an i8 pointer in addrspace."""
        a = context.make_array(aryty)(context, builder, value=ary)
        i = context.cast(builder, idx, idxty, types.intp)
        p = builder.bitcast(builder.gep(a.data, [i]), _I8.as_pointer())
        return builder.addrspacecast(p, _I8.as_pointer(addrspace))

    @intrinsic
    def cp_async16(typingctx, dst, di, src, si, nbytes):
        """cp.async.cg.shared.global [&dst[di]], [&src[si]], 16, nbytes: dst a shared array,
        src a global one (flat element indices); nbytes of the 16 are read, the rest zeroed."""
        if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
                and all(isinstance(t, types.Integer) for t in (di, si, nbytes))):
            return None
        sig = types.void(dst, di, src, si, nbytes)

        def codegen(context, builder, sig, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            s = builder.ptrtoint(_byte_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], 3), i32)
            g = builder.ptrtoint(_byte_ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3], 1), i64)
            n = context.cast(builder, args[4], sig.args[4], types.uint32)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]),
                               "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [s, g, n])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def cp_async_commit(typingctx):
        """cp.async.commit_group: the thread's copies issued since the last commit, one group."""
        sig = types.void()

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;", "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic  # a non-literal n is refused, so numba retries with the literal type
    def cp_async_wait(typingctx, n):
        """cp.async.wait_group n: until at most n of the thread's committed groups are pending
        (n a compile-time integer constant)."""
        if not isinstance(n, types.IntegerLiteral):
            return None
        pending = int(n.literal_value)
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), f"cp.async.wait_group {pending};", "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def global_address(typingctx, src, si):
        """The address of src[si] (flat element index) as a uint64, for cp_async16_at: copies
        that advance a fixed address instead of recomputing an index per copy."""
        if not (isinstance(src, types.Array) and isinstance(si, types.Integer)):
            return None
        sig = types.uint64(src, si)

        def codegen(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, value=args[0])
            i = context.cast(builder, args[1], sig.args[1], types.intp)
            return builder.ptrtoint(builder.gep(a.data, [i]), ir.IntType(64))

        return sig, codegen

    @intrinsic
    def cp_async16_at(typingctx, dst, di, gaddr, nbytes):
        """cp_async16 from a global_address (plus a byte offset): cp.async.cg.shared.global
        [&dst[di]], [gaddr], 16, nbytes (generic addresses of global memory are its global
        addresses, as CUDA C's cp.async wrappers pass them)."""
        if not (isinstance(dst, types.Array) and all(isinstance(t, types.Integer) for t in (di, gaddr, nbytes))):
            return None
        sig = types.void(dst, di, gaddr, nbytes)

        def codegen(context, builder, sig, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            s = builder.ptrtoint(_byte_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], 3), i32)
            g = context.cast(builder, args[2], sig.args[2], types.uint64)
            n = context.cast(builder, args[3], sig.args[3], types.uint32)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]),
                               "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [s, g, n])
            return context.get_dummy_value()

        return sig, codegen

    def _fresh_sreg(reg):
        def read(typingctx):
            sig = types.uint32()

            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), []), f"mov.u32 $0, %{reg};", "=r", side_effect=True)
                return builder.call(asm, [])

            return sig, codegen

        read.__name__ = f"{reg.replace('.', '_')}_fresh"
        return intrinsic(read)

    # %ctaid.x / %tid.x read by a volatile mov: never merged with an earlier read, so a value
    # derived from them is recomputed where it is read again instead of held in registers
    # through a loop (the pipelined GEMM's epilogue: its block and warp places after the K loop)
    ctaid_x_fresh = _fresh_sreg("ctaid.x")
    tid_x_fresh = _fresh_sreg("tid.x")

    def _ldmatrix(trans):
        suffix = ".trans" if trans else ""

        def ldm(typingctx, s, i):
            if not (isinstance(s, types.Array) and s.dtype == types.uint32 and isinstance(i, types.Integer)):
                return None
            sig = types.UniTuple(types.uint32, 4)(s, i)

            def codegen(context, builder, sig, args):
                i32 = ir.IntType(32)
                addr = builder.ptrtoint(_byte_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], 3), i32)
                ret = ir.LiteralStructType([i32] * 4)
                # a memory clobber: not moved across the barriers and cp.async waits around it
                asm = ir.InlineAsm(ir.FunctionType(ret, [i32]),
                                   f"ldmatrix.sync.aligned.m8n8.x4{suffix}.shared.b16 {{$0, $1, $2, $3}}, [$4];",
                                   "=r,=r,=r,=r,r,~{memory}", side_effect=True)
                res = builder.call(asm, [addr])
                return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, k) for k in range(4)])

            return sig, codegen

        return ldm

    ldmatrix_x4 = intrinsic(_ldmatrix(False))
    ldmatrix_x4.__doc__ = """(r0, r1, r2, r3): ldmatrix .x4 of the warp, lane 8m + r giving &s[i] for row r
        of matrix m (see the module docstring)."""
    ldmatrix_x4_trans = intrinsic(_ldmatrix(True))
    ldmatrix_x4_trans.__doc__ = """(r0, r1, r2, r3): ldmatrix .x4.trans of the warp (the module docstring)."""

else:
    def ex2_approx(x):
        """Simulator twin: 2^x in float32."""
        return np.float32(np.exp2(np.float32(x)))

    def ex2_approx_ftz(x):
        """Simulator twin: 2^x in float32, below 2^-126 flushed to +0."""
        r = np.float32(np.exp2(np.float32(x)))
        return np.float32(0.0) if r < np.float32(2.0 ** -126) else r

    def max_skip_nan(a, b):
        """Simulator twin: np.fmax in float32 (a NaN operand ignored)."""
        return np.float32(np.fmax(np.float32(a), np.float32(b)))

    @device
    def ctaid_x_fresh():
        """Simulator twin: cuda.blockIdx.x."""
        return cuda.blockIdx.x

    @device
    def tid_x_fresh():
        """Simulator twin: cuda.threadIdx.x."""
        return cuda.threadIdx.x

    def pack_f16x2(lo, hi):
        """Simulator twin: the same bits as cvt.rn.f16x2.f32 (round to nearest even)."""
        return np.uint32(int(np.float16(lo).view(np.uint16)) | (int(np.float16(hi).view(np.uint16)) << 16))

    _A_HALVES = np.array([[[0, 1], [4, 5]], [[2, 3], [6, 7]]])  # [row g / g + 8][a0 a2 / a1 a3][half]
    _B_HALVES = np.array([[8, 9], [10, 11]])                     # [b0 / b1][half]

    # A device function, so that the simulator runs it with its own `cuda` module (thread
    # indices, the emulated warp barrier), as it does the kernels.
    @device
    def mma_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """Simulator twin: the warp's fragments meet in a per-warp scratch table (one
        warp barrier to publish, one before the next call may overwrite: the simulator
        pays per barrier, so not a shuffle per value); each lane takes its two rows of A
        and two columns of B from the table as numpy views and multiplies them in float32
        (float16 products are exact there; the sums' order is numpy's, as the tensor
        core's is its own).  1-D blocks of whole warps.  Vectorized (2026-11-28): the
        per-element version held 60% of test_tensor_core_paths' simulator time."""
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        g, t = lane >> 2, lane & 3
        table = cuda.shared.array((32, 32, 6), np.uint32)  # [warp][lane][a0..a3, b0, b1]
        mine = table[warp, lane]
        mine[0], mine[1], mine[2], mine[3], mine[4], mine[5] = a0, a1, a2, a3, b0, b1
        cuda.syncwarp()
        h = table[warp].view(np.float16)  # (32, 12): lane L's a0..a3, b0, b1 as half pairs
        # A rows g, g + 8 (2 x 16): lane 4 g + j holds A[g, 2j:2j+2] (a0), A[g + 8, 2j:2j+2]
        # (a1), A[g, 2j+8:2j+10] (a2), A[g + 8, 2j+8:2j+10] (a3); index [j, row, half, e]
        a = h[4 * g:4 * g + 4][:, _A_HALVES].transpose(1, 2, 0, 3).reshape(2, 16)
        # B columns 2t, 2t + 1 (2 x 16): lane 4 n + j holds B[2j:2j+2, n] (b0) and
        # B[2j+8:2j+10, n] (b1); index [column, j, half, e]
        b = h[8 * t:8 * t + 8].reshape(2, 4, 12)[:, :, _B_HALVES].transpose(0, 2, 1, 3).reshape(2, 16)
        d = a.astype(np.float32) @ b.T.astype(np.float32)  # float16 products are exact in float32
        cuda.syncwarp()
        f = np.float32
        d0 = f(c0) + d[0, 0]
        d1 = f(c1) + d[0, 1]
        d2 = f(c2) + d[1, 0]
        d3 = f(c3) + d[1, 1]
        return d0, d1, d2, d3


    def cp_async16(dst, di, src, si, nbytes):
        """Simulator twin: the 16 bytes copied at once (the first nbytes read, the rest zero)."""
        size = dst.dtype.itemsize
        n, di, si, keep = 16 // size, int(di), int(si), int(nbytes) // size
        for e in range(n):
            dst[di + e] = src[si + e] if e < keep else 0

    import threading as _threading

    _SIM_GLOBAL: dict = {}  # base address -> the flat array there (global_address's twin)
    _SIM_LOCK = _threading.Lock()

    def _flat(src):
        ary = np.asarray(getattr(src, "_ary", src))
        return ary.reshape(-1)

    def global_address(src, si):
        """Simulator twin: the real address of src[si] (an integer, as on a GPU, so kernels
        may keep it in uint64 arrays), its array remembered for cp_async16_at."""
        ary = _flat(src)
        base = ary.__array_interface__["data"][0]
        with _SIM_LOCK:
            _SIM_GLOBAL.pop(base, None)
            _SIM_GLOBAL[base] = ary  # newest last; the oldest dropped: a kernel names a few arrays
            while len(_SIM_GLOBAL) > 64:
                del _SIM_GLOBAL[next(iter(_SIM_GLOBAL))]
        return base + int(si) * ary.dtype.itemsize

    def cp_async16_at(dst, di, gaddr, nbytes):
        """Simulator twin: cp_async16 from a global_address (plus a byte offset)."""
        gaddr = int(gaddr)
        with _SIM_LOCK:
            for base, ary in _SIM_GLOBAL.items():
                if base <= gaddr < base + ary.nbytes:
                    break
            else:
                raise AssertionError(f"address {gaddr:#x} is in no array a global_address named")
        off = gaddr - base
        assert off % ary.dtype.itemsize == 0
        cp_async16(dst, di, ary, off // ary.dtype.itemsize, nbytes)

    def cp_async_commit():
        """Simulator twin: nothing to do (the copies completed when issued)."""

    def cp_async_wait(n):
        """Simulator twin: nothing to do (the copies completed when issued)."""

    @device
    def ldmatrix_x4(s, i):
        """Simulator twin: each lane publishes its row's word index in a per-warp table, then
        reads from matrix m the word at row g, column pair t (see the module docstring)."""
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        table = cuda.shared.array((32, 32), np.int64)
        table[warp, lane] = i
        cuda.syncwarp()
        g, t = lane >> 2, lane & 3
        rows = table[warp]
        r0 = np.uint32(s[rows[g] + t])
        r1 = np.uint32(s[rows[8 + g] + t])
        r2 = np.uint32(s[rows[16 + g] + t])
        r3 = np.uint32(s[rows[24 + g] + t])
        cuda.syncwarp()
        return r0, r1, r2, r3

    def _column_pair(s, rows, m, g, t):
        """Rows 2t, 2t + 1 of column g of matrix m, as one word (low half = row 2t)."""
        w, h = g >> 1, 16 * (g & 1)
        lo = (int(s[rows[8 * m + 2 * t] + w]) >> h) & 0xFFFF
        hi = (int(s[rows[8 * m + 2 * t + 1] + w]) >> h) & 0xFFFF
        return np.uint32(lo | (hi << 16))

    @device
    def ldmatrix_x4_trans(s, i):
        """Simulator twin of the .trans form: lane l gets rows 2t, 2t + 1 of column g."""
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        table = cuda.shared.array((32, 32), np.int64)
        table[warp, lane] = i
        cuda.syncwarp()
        g, t = lane >> 2, lane & 3
        rows = table[warp]
        r0 = _column_pair(s, rows, 0, g, t)
        r1 = _column_pair(s, rows, 1, g, t)
        r2 = _column_pair(s, rows, 2, g, t)
        r3 = _column_pair(s, rows, 3, g, t)
        cuda.syncwarp()
        return r0, r1, r2, r3
