"""The two 16-bit float formats, bfloat16 and IEEE float16, as the CPU kernels read them.

A 16-bit array reaches the kernels as its bit patterns, and the integer type of those
patterns names the format: uint16 for bfloat16 (the upper half of a float32), int16 for
float16 (binary16).  A kernel written with `widen` / `round_to` therefore compiles once per
format, with the conversion chosen at compile time and no branch in its loops.

Widening is exact in both formats.  Rounding is to nearest even, a NaN stays a (quiet) NaN
of its sign, and overflow goes to infinity, as ml_dtypes, numpy and PyTorch round.
bfloat16 converts by integer operations on the bits, float16 by LLVM's fpext / fptrunc of
`half`, which are the F16C instructions vcvtph2ps / vcvtps2ph on every x86-64 host this
suite meets (Zen 3 / Zen 4 / Ice Lake) and fcvt on aarch64; LLVM vectorizes all of them.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .approx import OVERLOAD, float_to_bits, wide_loops


@intrinsic
def bits_float(typingctx, u):
    """The float32 whose bits are the low 32 bits of the integer u (numba widens uint32
    shifts to 64 bits; approx.bits_to_float takes int32 / int64 only)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width != 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(u), codegen


@njit(inline="always")
def to_bf16(v):
    """The bfloat16 bits (uint16) of float32 v rounded to nearest even; a NaN stays a (quiet)
    NaN of its sign.  The NaN case is a select of the 32-bit value before the one shift and
    narrowing (a return of its own narrowed both: relu of 128 x 11008 bfloat16, one thread,
    Zen 4, 2026-12-06: 201 -> 170 us; silu(gate) * up 714 -> 653)."""
    u = np.uint32(float_to_bits(v))
    r = np.uint32(u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        r = np.uint32(u | np.uint32(0x400000))
    return np.uint16(r >> np.uint32(16))


@njit(inline="always")
def from_bf16(b):
    """The float32 value of the bfloat16 bits b (uint16): exact."""
    return bits_float(np.uint32(b) << np.uint32(16))


@intrinsic
def from_f16(typingctx, b):
    """The float32 value of the float16 bits b (int16, or uint16 as the weight-only GEMV
    reads a float16 weight): exact (fpext of half: vcvtph2ps)."""
    if b not in (types.int16, types.uint16):
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(b), codegen


@intrinsic
def to_f16(typingctx, v):
    """The float16 bits (int16) of float32 v rounded to nearest even (fptrunc to half;
    overflow to infinity, subnormals kept, a NaN quiet)."""
    if v != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.int16(v), codegen


def widen(b):
    """b as float32: the 16-bit pattern b in its format (uint16 bfloat16, int16 float16)
    widened exactly; a float32 / float64 as it is (for kernels whose tables, parameters or
    K / V come in either a 16-bit format or the computing dtype)."""
    return b


@overload(widen, inline="always", **OVERLOAD)
def _widen_overload(b):
    if b == types.uint16:
        return lambda b: from_bf16(b)
    if b == types.int16:
        return lambda b: from_f16(b)
    if b == types.float32 or b == types.float64:
        return lambda b: b
    return None


def round_to(v, like):
    """The 16-bit pattern of float32 v in the format of `like` (an array of, or a value of,
    uint16 for bfloat16 or int16 for float16), rounded to nearest even."""
    return v


@overload(round_to, inline="always", **OVERLOAD)
def _round_to_overload(v, like):
    t = like.dtype if isinstance(like, types.Array) else like
    if t == types.uint16:
        return lambda v, like: to_bf16(v)
    if t == types.int16:
        return lambda v, like: to_f16(v)
    return None


@njit(cache=True, nogil=True)
def widen_into(src, dst):
    """dst[i] = the float32 value of the 16-bit src[i] (uint16 bfloat16 / int16 float16): exact."""
    wide_loops()
    for i in range(src.size):
        dst[i] = widen(src[i])


@njit(cache=True, nogil=True)
def round_into(src, dst):
    """dst[i] = float32 src[i] rounded to nearest even in dst's 16-bit format (round_to)."""
    wide_loops()
    for i in range(src.size):
        dst[i] = round_to(src[i], dst)
