"""Pieces of LLVM IR that several kernels' intrinsics emit (no numba typing here: plain
llvmlite builders), so each is written once."""
from llvmlite import ir

_I32 = ir.IntType(32)


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
