"""Hopper's warpgroup tensor-core primitives (sm_90a): ``wgmma.mma_async`` with both operands
in shared memory, its fences and groups, and the shared-memory matrix descriptors it reads
through.  Each has a Python twin for the simulator (tests/cuda/test_wgmma.py holds the twin
of wgmma_f16 to numpy, and on a GPU the instruction to the same layout).

Why: mma.sync issues at most about 636 TFLOP/s on an H200 (bench/gpu_probe_mma.py, 8
independent chains per warp: 6.73 clocks per HMMA per SM partition,
bench/gpu_results/2026-11-27d-h200/call1) and the pipelined mma.sync GEMM reached 335, where
cuBLAS runs 766 with wgmma (same run).  wgmma reads A and B from shared memory itself: no
ldmatrix, no fragment registers, and one instruction per 64 x N x 16 product per warpgroup.

numba-cuda 0.30 compiles for sm_90a on a compute capability 9.0 device (its codegen appends
the "a"), so these assemble there; bench.ptx builds them with compile_ptx(cc=(9, 0, "a")).

  wgmma_f16(acc, desc_a, desc_b, n, trans_b): D[64 x n] += A[64 x 16] @ B[16 x n] of the
      warpgroup (4 consecutive warps, all 128 threads call it), float16 in, float32
      accumulators in acc (a float32 local array of n / 2 values, indexed by constants only
      so that they live in registers), A and B from shared memory by their descriptors
      (smem_desc).  n a compile-time 8..256 (multiple of 8 here: 64, 128, 256); trans_b a
      compile-time 0 (B stored K-major: (N, K) rows, as linear's weight) or 1 (B stored
      N-major: (K, N) rows).  Asynchronous: issue wgmma_fence() before the first of a batch
      (after the accumulators or the operands in shared memory were written), wgmma_commit()
      after the batch, and wgmma_wait(n) before touching acc or overwriting the operands.
  wgmma_f16_rs(acc, a0, a1, a2, a3, s, desc_b, n, trans_b): the same with A from registers:
      a0..a3 this lane's part of its warp's 16 rows of A, in mma.sync's m16n8k16 A fragment
      (kernels_cuda/mma.py), so flash attention's P goes from its score registers straight in.
  fence_proxy_async(): fence.proxy.async.shared::cta: this thread's writes to shared memory
      (stores, cp.async once waited for) visible to the async proxy wgmma reads through;
      then a barrier makes everyone's visible.
  shared_address(s, i): the shared-window byte address of s[i] (s a shared array).
  smem_desc(s, i, lbo, sbo): the 64-bit matrix descriptor of the operand starting at s[i],
      with the 128-byte swizzle (PTX ISA "Matrix Descriptor Format"): start address >> 4 in
      bits 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, layout
      1 (128B swizzle) in 62-63.  The swizzle is of absolute shared addresses: byte address
      a holds what the unswizzled layout puts at a ^ (((a >> 7) & 7) << 4) (16-byte chunk c
      of a 128-byte row r of a 1024-byte atom at chunk c ^ (r & 7)), so tiles start on
      1024-byte boundaries.
Layouts with the 128-byte swizzle (in the unswizzled byte offsets from the start address):
  K-major (A; B with trans_b = 0): element (row, k) at (row // 8) * sbo + (row % 8) * 128
      + 2 k: rows of 64 halves of K, 8-row atoms sbo apart (1024 when packed); lbo unused.
      The next K step of 16: start + 32 bytes.
  N-major (B with trans_b = 1): element (k, n) at (n // 64) * lbo + (k // 8) * sbo
      + (k % 8) * 128 + 2 (n % 64): panels of 64 columns lbo apart, in each 8-row atoms of K
      sbo apart.  The next K step of 16: start + 2 sbo.
Accumulator fragment (PTX ISA "Register Fragments and Shared Memory Matrix Layouts" of
wgmma .m64nNk16, f32): thread t of the warpgroup, warp w = t // 32, lane l, g = l // 4,
q = l % 4: acc[4 j + 2 h + e] = D[16 w + g + 8 h, 8 j + 2 q + e] (j < n / 8), the
m16n8 fragment of mma.sync repeated along N, so the mma.sync epilogues apply.
"""
import numpy as np
from llvmlite import ir
from numba import cuda, types, uint64

from ._jit import SIM, device

SWIZZLE_128B = 1  # the descriptor's layout type (bits 62-63)

if not SIM:
    from numba.cuda.extending import intrinsic

    from .mma import _byte_ptr

    def _asm(text):
        def emit(typingctx):
            sig = types.void()

            def codegen(context, builder, sig, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()

            return sig, codegen

        return emit

    wgmma_fence = intrinsic(_asm("wgmma.fence.sync.aligned;"))
    wgmma_commit = intrinsic(_asm("wgmma.commit_group.sync.aligned;"))
    fence_proxy_async = intrinsic(_asm("fence.proxy.async.shared::cta;"))

    @intrinsic  # a non-literal n is refused, so numba retries with the literal type
    def wgmma_wait(typingctx, n):
        """wgmma.wait_group n: until at most n of the warpgroup's committed groups are pending."""
        if not isinstance(n, types.IntegerLiteral):
            return None
        pending = int(n.literal_value)
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), f"wgmma.wait_group.sync.aligned {pending};",
                                      "~{memory}", side_effect=True), [])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def shared_address(typingctx, s, i):
        """The shared-window byte address of s[i] (flat element index)."""
        if not (isinstance(s, types.Array) and isinstance(i, types.Integer)):
            return None
        sig = types.uint32(s, i)

        def codegen(context, builder, sig, args):
            return builder.ptrtoint(_byte_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], 3),
                                    ir.IntType(32))

        return sig, codegen

    @intrinsic
    def wgmma_f16(typingctx, acc, s, desc_a, desc_b, n, trans_b):
        """D += A @ B of the warpgroup (see the module docstring); s, the shared array the
        descriptors point into, is for the simulator's twin (the instruction reads through
        the descriptors)."""
        if not (isinstance(acc, types.Array) and acc.dtype == types.float32 and acc.layout == "C"
                and isinstance(desc_a, types.Integer) and isinstance(desc_b, types.Integer)):
            return None
        if not (isinstance(n, types.IntegerLiteral) and isinstance(trans_b, (types.IntegerLiteral,
                                                                            types.BooleanLiteral))):
            return None
        N, TB = int(n.literal_value), int(trans_b.literal_value)
        assert N % 8 == 0 and 8 <= N <= 256, N
        R = N // 2
        sig = types.void(acc, s, desc_a, desc_b, n, trans_b)

        def codegen(context, builder, sig, args):
            f, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            ptrs = [builder.gep(ary.data, [ir.Constant(i64, k)]) for k in range(R)]
            vals = [builder.load(p) for p in ptrs]
            da = context.cast(builder, args[2], sig.args[2], types.uint64)
            db = context.cast(builder, args[3], sig.args[3], types.uint64)
            regs = ", ".join(f"${k}" for k in range(R))
            text = ("{ .reg .pred p; setp.ne.b32 p, $" + str(R + 2) + ", 0; "
                    f"wgmma.mma_async.sync.aligned.m64n{N}k16.f32.f16.f16 "
                    "{" + regs + "}, $" + str(R) + ", $" + str(R + 1) + f", p, 1, 1, 0, {TB}; }}")
            # accumulators: outputs tied to the inputs of the same number ("+f" in CUDA C)
            cons = ",".join(["=f"] * R + ["l", "l", "r"] + [str(k) for k in range(R)] + ["~{memory}"])
            fnty = ir.FunctionType(ir.LiteralStructType([f] * R), [i64, i64, i32] + [f] * R)
            res = builder.call(ir.InlineAsm(fnty, text, cons, side_effect=True),
                               [da, db, ir.Constant(i32, 1)] + vals)
            for k in range(R):
                builder.store(builder.extract_value(res, k), ptrs[k])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def wgmma_f16_rs(typingctx, acc, a0, a1, a2, a3, s, desc_b, n, trans_b):
        """D += A @ B of the warpgroup with A from registers: a0..a3 this lane's part of its
        warp's 16 rows of A (64 x 16), mma.sync's m16n8k16 A fragment (mma.py's docstring);
        B from shared memory by its descriptor (see wgmma_f16)."""
        regs = (a0, a1, a2, a3)
        if not (isinstance(acc, types.Array) and acc.dtype == types.float32 and acc.layout == "C"
                and all(isinstance(r, types.Integer) for r in regs) and isinstance(desc_b, types.Integer)):
            return None
        if not (isinstance(n, types.IntegerLiteral) and isinstance(trans_b, (types.IntegerLiteral,
                                                                            types.BooleanLiteral))):
            return None
        N, TB = int(n.literal_value), int(trans_b.literal_value)
        assert N % 8 == 0 and 8 <= N <= 256, N
        R = N // 2
        sig = types.void(acc, a0, a1, a2, a3, s, desc_b, n, trans_b)

        def codegen(context, builder, sig, args):
            f, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            ptrs = [builder.gep(ary.data, [ir.Constant(i64, k)]) for k in range(R)]
            vals = [builder.load(p) for p in ptrs]
            av = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[1:5], sig.args[1:5])]
            db = context.cast(builder, args[6], sig.args[6], types.uint64)
            regs_ = ", ".join(f"${k}" for k in range(R))
            text = ("{ .reg .pred p; setp.ne.b32 p, $" + str(R + 5) + ", 0; "
                    f"wgmma.mma_async.sync.aligned.m64n{N}k16.f32.f16.f16 "
                    "{" + regs_ + "}, {$" + str(R) + ", $" + str(R + 1) + ", $" + str(R + 2) + ", $" + str(R + 3)
                    + "}, $" + str(R + 4) + f", p, 1, 1, {TB}; }}")
            cons = ",".join(["=f"] * R + ["r", "r", "r", "r", "l", "r"] + [str(k) for k in range(R)] + ["~{memory}"])
            fnty = ir.FunctionType(ir.LiteralStructType([f] * R), [i32] * 4 + [i64, i32] + [f] * R)
            res = builder.call(ir.InlineAsm(fnty, text, cons, side_effect=True), av + [db, ir.Constant(i32, 1)] + vals)
            for k in range(R):
                builder.store(builder.extract_value(res, k), ptrs[k])
            return context.get_dummy_value()

        return sig, codegen

else:
    def wgmma_fence():
        """Simulator twin: nothing to do (the twin of wgmma_f16 completes when called)."""

    def wgmma_commit():
        """Simulator twin: nothing to do."""

    def wgmma_wait(n):
        """Simulator twin: nothing to do."""

    def fence_proxy_async():
        """Simulator twin: nothing to do."""

    def shared_address(s, i):
        """Simulator twin: the byte offset of s[i] in s, as if s began at shared address 0
        (1024-byte aligned, as the kernels place their tiles on a GPU)."""
        return np.uint32(int(i) * np.asarray(s).dtype.itemsize)

    @device
    def wgmma_f16(acc, s, desc_a, desc_b, n, trans_b):
        """Simulator twin: this thread's accumulators from the operands where the descriptors
        lay them out in s."""
        t = cuda.threadIdx.x
        wgmma_reference(acc, s, desc_a, desc_b, int(n), int(trans_b), (t & 127) >> 5, t & 31)

    @device
    def wgmma_f16_rs(acc, a0, a1, a2, a3, s, desc_b, n, trans_b):
        """Simulator twin: the warp's A fragments meet in a per-warp table (as mma_16816's
        twin), then this lane's accumulators as wgmma_reference's with A's rows given."""
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        table = cuda.shared.array((32, 32, 4), np.uint32)  # [warp][lane][a0..a3]
        mine = table[warp, lane]
        mine[0], mine[1], mine[2], mine[3] = a0, a1, a2, a3
        cuda.syncwarp()
        a = _a_rows_of(table[warp], lane >> 2)
        cuda.syncwarp()
        wgmma_rs_reference(acc, a, s, desc_b, int(n), int(trans_b), lane)


@device
def smem_desc(s, i, lbo, sbo):
    """The 128-byte-swizzle matrix descriptor of the operand at s[i] (module docstring);
    lbo and sbo in bytes (multiples of 16)."""
    a = uint64(shared_address(s, i))
    return (((a & uint64(0x3FFFF)) >> uint64(4)) | (uint64(lbo >> 4) << uint64(16))
            | (uint64(sbo >> 4) << uint64(32)) | (uint64(SWIZZLE_128B) << uint64(62)))


def _swizzled(a):
    """The byte address the 128-byte swizzle stores unswizzled address a at."""
    return a ^ (((a >> 7) & 7) << 4)


def _field(desc, lo):
    return ((int(desc) >> lo) & 0x3FFF) << 4


def _halves_of(s):
    return np.asarray(s).reshape(-1).view(np.float16)


def _a_rows_of(regs, g):
    """Rows g and g + 8 (2 x 16, float32) of a warp's 16 x 16 A from its lanes' fragment
    registers regs[lane][0..3] (mma.sync's A layout: lane 4 g + t holds A[g, 2t:2t+2],
    A[g+8, 2t:2t+2], A[g, 2t+8:2t+10], A[g+8, 2t+8:2t+10])."""
    a = np.zeros((2, 16), np.float32)
    for t in range(4):
        r = regs[4 * g + t]
        for h in range(2):
            lo = np.array([int(r[h]) & 0xFFFFFFFF, int(r[h + 2]) & 0xFFFFFFFF], np.uint32).view(np.float16)
            a[h, 2 * t:2 * t + 2] = lo[0:2]
            a[h, 2 * t + 8:2 * t + 10] = lo[2:4]
    return a


def _b_cols(halves, desc_b, n, trans_b, q):
    """This lane's n / 4 columns of B (16 x n) through its descriptor (module docstring)."""
    k = np.arange(16)
    cols = (8 * np.arange(n // 8)[:, None] + 2 * q + np.arange(2)).reshape(-1)
    sb, lbb, sbb = _field(desc_b, 0), _field(desc_b, 16), _field(desc_b, 32)
    if trans_b:  # (K, N) panels of 64 columns
        at = sb + (cols[None, :] // 64) * lbb + (k[:, None] // 8) * sbb + (k[:, None] % 8) * 128 + 2 * (cols[None, :] % 64)
    else:        # (N, K) rows
        at = sb + (cols[None, :] // 8) * sbb + (cols[None, :] % 8) * 128 + 2 * k[:, None]
    return halves[_swizzled(at) // 2].astype(np.float32)   # (16, n / 4)


def _accumulate(acc, a, b, n):
    d = a @ b                                              # (2, n / 4): float32 sums of exact products
    flat = np.asarray(acc).reshape(-1)
    # acc[4 j + 2 h + e] = D[row h, column 8 j + 2 q + e] = d[h, 2 j + e]
    flat[:n // 2] += d.reshape(2, n // 8, 2).transpose(1, 0, 2).reshape(-1).astype(np.float32)


def wgmma_reference(acc, s, desc_a, desc_b, n, trans_b, w, lane):
    """acc += this lane's part of A @ B, read from s (its bytes, addresses as shared_address
    gives them) through the descriptors, for lane `lane` of warp `w` of the warpgroup: the
    simulator's twin of wgmma_f16, and the reference its test holds the GPU to."""
    assert int(desc_a) >> 62 == SWIZZLE_128B and int(desc_b) >> 62 == SWIZZLE_128B
    halves = _halves_of(s)
    g, q = lane >> 2, lane & 3
    k = np.arange(16)
    rows = 16 * w + g + 8 * np.arange(2)                                     # this lane's 2 rows of D
    sa, sba = _field(desc_a, 0), _field(desc_a, 32)
    a_at = sa + (rows[:, None] // 8) * sba + (rows[:, None] % 8) * 128 + 2 * k[None, :]
    a = halves[_swizzled(a_at) // 2].astype(np.float32)   # (2, 16)
    _accumulate(acc, a, _b_cols(halves, desc_b, n, trans_b, q), n)


def wgmma_rs_reference(acc, a, s, desc_b, n, trans_b, lane):
    """acc += this lane's part of A @ B with its rows of A given (a: 2 x 16 float32), B read
    through its descriptor: the twin of wgmma_f16_rs."""
    assert int(desc_b) >> 62 == SWIZZLE_128B
    _accumulate(acc, a, _b_cols(_halves_of(s), desc_b, n, trans_b, lane & 3), n)
