"""Warp- and block-level reductions built on warp shuffles.

All are device functions inlined into the kernels.  A warp reduction is five
``shfl_xor_sync`` butterfly steps (every lane ends with the result); a block reduction
reduces each warp, passes one value per warp through a 32-slot shared scratch array and
reduces those in every warp (every thread ends with the result, no second barrier
needed to broadcast).  The block size must be a multiple of 32 and every lane must call
them (full shuffle mask).

The CUDA simulator has no warp shuffles; tests/cuda/simwarp.py emulates them lane by lane
so these functions run unchanged there.
"""
import math

import numpy as np

from numba import cuda, int64

from ._jit import FULL_MASK, device


@device
def warp_sum(v):
    v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
    return v


@device
def warp_max(v):
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 16))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 8))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 4))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 2))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 1))
    return v


@device
def _merge_ms(m, s, m2, s2):
    """Merge two online-softmax states (running max m, sum of exp(x - m) s)."""
    mn = max(m, m2)
    if mn == -math.inf:
        return mn, s + s2
    return mn, s * math.exp(m - mn) + s2 * math.exp(m2 - mn)


@device
def warp_max_sumexp(m, s):
    """Warp reduction of online-softmax states: (max, sum of exp(x - max))."""
    for off in (16, 8, 4, 2, 1):
        m2 = cuda.shfl_xor_sync(FULL_MASK, m, off)
        s2 = cuda.shfl_xor_sync(FULL_MASK, s, off)
        m, s = _merge_ms(m, s, m2, s2)
    return m, s


@device
def warp_sum2(a, b):
    """Two warp sums at once (mean and mean of squares for layer_norm)."""
    for off in (16, 8, 4, 2, 1):
        a += cuda.shfl_xor_sync(FULL_MASK, a, off)
        b += cuda.shfl_xor_sync(FULL_MASK, b, off)
    return a, b


@device
def row_owner(warp, rows):
    """(row, start, step, row_step) of this thread in a row kernel of `rows` rows: with warp
    (a constant) one row per warp of the block, lanes start = 0..31 with step 32 and a row
    loop that runs once (row_step = rows; a warp past the last row gets row = rows: its loop
    does not run); else one row per block, threads start with step blockDim, grid-striding
    over the rows."""
    if warp:
        row = int64(cuda.blockIdx.x * (cuda.blockDim.x >> 5) + (cuda.threadIdx.x >> 5))
        return min(row, rows), int64(cuda.threadIdx.x & 31), int64(32), rows
    return int64(cuda.blockIdx.x), int64(cuda.threadIdx.x), int64(cuda.blockDim.x), int64(cuda.gridDim.x)


@device
def block_sum(v, scratch, zero):
    """Sum of v over the block; scratch: shared array of >= 32 acc-typed slots."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    nwarps = (cuda.blockDim.x + 31) >> 5
    v = warp_sum(v)
    cuda.syncthreads()  # scratch may still be read by a previous reduction
    if lane == 0:
        scratch[warp] = v
    cuda.syncthreads()
    w = scratch[lane] if lane < nwarps else zero
    return warp_sum(w)


@device
def block_max(v, scratch, lowest):
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    nwarps = (cuda.blockDim.x + 31) >> 5
    v = warp_max(v)
    cuda.syncthreads()
    if lane == 0:
        scratch[warp] = v
    cuda.syncthreads()
    w = scratch[lane] if lane < nwarps else lowest
    return warp_max(w)


@device
def block_sum2(a, b, scratch_a, scratch_b, zero):
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    nwarps = (cuda.blockDim.x + 31) >> 5
    a, b = warp_sum2(a, b)
    cuda.syncthreads()
    if lane == 0:
        scratch_a[warp] = a
        scratch_b[warp] = b
    cuda.syncthreads()
    wa = scratch_a[lane] if lane < nwarps else zero
    wb = scratch_b[lane] if lane < nwarps else zero
    return warp_sum2(wa, wb)


@device
def block_max_sumexp(m, s, scratch_m, scratch_s, lowest, zero):
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    nwarps = (cuda.blockDim.x + 31) >> 5
    m, s = warp_max_sumexp(m, s)
    cuda.syncthreads()
    if lane == 0:
        scratch_m[warp] = m
        scratch_s[warp] = s
    cuda.syncthreads()
    wm = scratch_m[lane] if lane < nwarps else lowest
    ws = scratch_s[lane] if lane < nwarps else zero
    return warp_max_sumexp(wm, ws)


# ---- 16-byte vector loads and stores -----------------------------------------------------------
# Row kernels that hold their row in registers read and write it 16 bytes per instruction
# (ld.v4.u32 / ld.v8.f16 in PTX, LDG.E.128 in SASS), so that each thread has its whole share of
# the row in flight at once and pays one address per 8 (float16) or 4 (float32) elements, where
# a scalar load per element left the H200 issue- and latency-bound at 0.3-0.8 TB/s of 4.8
# (bench/gpu_results/2026-11-27-h200).  The caller guarantees 16-byte alignment of the element
# addressed (the dispatcher checks the base pointers and that the row length is a multiple of
# the vector); an unaligned address would fault.  Under the simulator the twins below copy
# element by element.
from kernels_common.cuda_tiles import VEC_BYTES, vec_width  # noqa: E402,F401


def _vec_io_gpu(n):
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.api_util import normalize_indices
    from numba.cuda.extending import intrinsic

    I32 = ir.IntType(32)
    WORDS = ir.VectorType(I32, 4)  # VEC_BYTES
    LD4 = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([I32] * 4), [I32.as_pointer()]),
                       "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")  # kernels never read back what they store
    ST4 = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [I32.as_pointer()] + [I32] * 4),
                       "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", side_effect=True)

    def elem_ptr(context, builder, aryty, ary, idxty, idx):
        idxty, idx = normalize_indices(context, builder, idxty, idx, aryty, aryty.dtype)
        return cgutils.get_item_pointer(context, builder, aryty, context.make_array(aryty)(context, builder, value=ary),
                                        idx, wraparound=False)

    def local_ptr(context, builder, regty, reg, off, k):
        i = builder.add(context.cast(builder, off[0], off[1], types.intp), context.get_constant(types.intp, k))
        return cgutils.get_item_pointer(context, builder, regty, context.make_array(regty)(context, builder, value=reg),
                                        [i], wraparound=False)

    def valid(a, idx, reg, off):
        ok_idx = (isinstance(idx, types.Integer) and a.ndim == 1) or (
            isinstance(idx, types.BaseTuple) and len(idx) == a.ndim and all(isinstance(t, types.Integer) for t in idx))
        return (isinstance(a, types.Array) and isinstance(a.dtype, types.Float) and ok_idx
                and isinstance(reg, types.Array) and reg.ndim == 1 and isinstance(off, types.Integer))

    @intrinsic
    def load_vec(typingctx, a, idx, reg, off):
        """reg[off + i] = a[idx + i] for i < n (the last index advances), one 16-byte load."""
        if not valid(a, idx, reg, off):
            return None

        def codegen(context, builder, sig, args):
            aty, ity, rty, oty = sig.args
            ptr = elem_ptr(context, builder, aty, args[0], ity, args[1])
            vty = ir.VectorType(context.get_value_type(aty.dtype), n)
            if n == 4:  # float32: LLVM's own vector load (ld.global.v4.f32)
                v = builder.load(builder.bitcast(ptr, vty.as_pointer()), align=VEC_BYTES)
            else:
                # halves: four 32-bit words by inline PTX; a plain LLVM vector load of halves,
                # however bitcast, comes out as narrower loads (ld.global.v4.u16, sm_90)
                words = builder.call(LD4, [builder.bitcast(ptr, I32.as_pointer())])
                v = ir.Constant(WORDS, ir.Undefined)
                for k in range(4):
                    v = builder.insert_element(v, builder.extract_value(words, k), ir.Constant(I32, k))
                v = builder.bitcast(v, vty)
            for k in range(n):
                x = context.cast(builder, builder.extract_element(v, ir.Constant(ir.IntType(32), k)), aty.dtype, rty.dtype)
                builder.store(x, local_ptr(context, builder, rty, args[2], (args[3], oty), k))
            return context.get_dummy_value()

        return types.none(a, idx, reg, off), codegen

    @intrinsic
    def store_vec(typingctx, a, idx, reg, off):
        """a[idx + i] = reg[off + i] for i < n, one 16-byte store; reg[off + i] then holds the
        value stored (rounded to a's dtype)."""
        if not valid(a, idx, reg, off):
            return None

        def codegen(context, builder, sig, args):
            aty, ity, rty, oty = sig.args
            ptr = elem_ptr(context, builder, aty, args[0], ity, args[1])
            vty = ir.VectorType(context.get_value_type(aty.dtype), n)
            v = ir.Constant(vty, ir.Undefined)
            for k in range(n):
                rp = local_ptr(context, builder, rty, args[2], (args[3], oty), k)
                x = context.cast(builder, builder.load(rp), rty.dtype, aty.dtype)
                v = builder.insert_element(v, x, ir.Constant(ir.IntType(32), k))
                builder.store(context.cast(builder, x, aty.dtype, rty.dtype), rp)
            if n == 4:
                builder.store(v, builder.bitcast(ptr, vty.as_pointer()), align=VEC_BYTES)
            else:
                w4 = builder.bitcast(v, WORDS)
                builder.call(ST4, [builder.bitcast(ptr, I32.as_pointer())]
                             + [builder.extract_element(w4, ir.Constant(I32, k)) for k in range(4)])
            return context.get_dummy_value()

        return types.none(a, idx, reg, off), codegen

    return load_vec, store_vec


def _vec_io_sim(n):
    def at(a, idx, k):
        return tuple(idx[:-1]) + (idx[-1] + k,) if isinstance(idx, tuple) else idx + k

    def load_vec(a, idx, reg, off):
        for k in range(n):
            reg[off + k] = a[at(a, idx, k)]

    def store_vec(a, idx, reg, off):
        for k in range(n):
            a[at(a, idx, k)] = reg[off + k]
            reg[off + k] = a[at(a, idx, k)]

    return load_vec, store_vec


_VEC_IO: dict = {}


def vec_io(n: int):
    """(load_vec, store_vec) for vectors of n elements (n * itemsize == VEC_BYTES):
    load_vec(a, idx, reg, off) sets reg[off:off + n] from a[idx:idx + n] (idx an int for a
    1-D a, a (row, col) tuple for a 2-D one, the column advancing), converted to reg's dtype;
    store_vec(a, idx, reg, off) writes them back converted to a's dtype and leaves the stored
    (rounded) values in reg.  reg is a local array indexed at constants once the caller's
    loops unroll, so it stays in registers."""
    io = _VEC_IO.get(n)
    if io is None:
        from ._jit import SIM

        io = _VEC_IO.setdefault(n, (_vec_io_sim if SIM else _vec_io_gpu)(n))
    return io


# ---- 16 bytes as raw 32-bit words ----------------------------------------------------------------
# A kernel that keeps several vectors in flight holds them as the words loaded (float16: 4
# registers a vector, where converted values take 8) and widens an element where it uses it.

def _word_io_gpu():
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.api_util import normalize_indices
    from numba.cuda.extending import intrinsic

    I32 = ir.IntType(32)
    LD4 = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([I32] * 4), [I32.as_pointer()]),
                       "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")

    @intrinsic
    def load_words(typingctx, a, idx, reg, off):
        """reg[off:off + 4] = the 16 bytes at a[idx] as uint32 words (one 16-byte load)."""
        ok_idx = (isinstance(idx, types.Integer) and a.ndim == 1) or (
            isinstance(idx, types.BaseTuple) and len(idx) == a.ndim and all(isinstance(t, types.Integer) for t in idx))
        if not (isinstance(a, types.Array) and ok_idx and isinstance(reg, types.Array) and reg.dtype == types.uint32
                and isinstance(off, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            aty, ity, rty, oty = sig.args
            ity2, ix = normalize_indices(context, builder, ity, args[1], aty, aty.dtype)
            ptr = cgutils.get_item_pointer(context, builder, aty, context.make_array(aty)(context, builder, value=args[0]),
                                           ix, wraparound=False)
            words = builder.call(LD4, [builder.bitcast(ptr, I32.as_pointer())])
            regs = context.make_array(rty)(context, builder, value=args[2])
            base = context.cast(builder, args[3], oty, types.intp)
            for k in range(4):
                i = builder.add(base, context.get_constant(types.intp, k))
                builder.store(builder.extract_value(words, k),
                              cgutils.get_item_pointer(context, builder, rty, regs, [i], wraparound=False))
            return context.get_dummy_value()

        return types.none(a, idx, reg, off), codegen

    @intrinsic
    def half_of(typingctx, w, hi):
        """The float16 in half `hi` (0: low) of the 32-bit word w, as a float32."""
        if not (isinstance(w, types.Integer) and isinstance(hi, types.IntegerLiteral)):
            return None
        k = hi.literal_value

        def codegen(context, builder, sig, args):
            x = builder.trunc(context.cast(builder, args[0], sig.args[0], types.uint32), I32)
            h = builder.extract_element(builder.bitcast(x, ir.VectorType(ir.HalfType(), 2)), ir.Constant(I32, k))
            return builder.fpext(h, ir.FloatType())

        return types.float32(w, hi), codegen

    @intrinsic
    def float_of(typingctx, w):
        """The float32 whose bits are the 32-bit word w."""
        if not isinstance(w, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            x = builder.trunc(context.cast(builder, args[0], sig.args[0], types.uint32), I32)
            return builder.bitcast(x, ir.FloatType())

        return types.float32(w), codegen

    return load_words, half_of, float_of


def _word_io_sim():
    def load_words(a, idx, reg, off):
        flat = a.reshape(-1) if not isinstance(idx, tuple) else a[idx[:-1]]
        i = idx if not isinstance(idx, tuple) else idx[-1]
        per = 4 // a.dtype.itemsize
        for k in range(4):
            bits = 0
            for e in range(per):
                x = np.array(flat[i + k * per + e], dtype=a.dtype).view(np.uint16 if per == 2 else np.uint32)
                bits |= int(x) << (16 * e)
            reg[off + k] = bits

    def half_of(w, hi):
        return np.float32(np.array((int(w) >> (16 * hi)) & 0xFFFF, np.uint16).view(np.float16))

    def float_of(w):
        return np.array(int(w) & 0xFFFFFFFF, np.uint32).view(np.float32)[()]

    return load_words, half_of, float_of


_WORD_IO: list = []


def word_io():
    """(load_words, half_of, float_of): load_words(a, idx, reg, off) puts the 16 bytes at
    a[idx] (float16 or float32 elements, 16-byte aligned) into the uint32 array reg at off as
    four words; half_of(w, hi) is the float16 in half hi (a constant 0 or 1, 0 = low: element
    2k + hi of a vector is half_of(word k, hi)) widened to float32; float_of(w) the float32 of
    w's bits."""
    if not _WORD_IO:
        from ._jit import SIM

        _WORD_IO.append((_word_io_sim if SIM else _word_io_gpu)())
    return _WORD_IO[0]
