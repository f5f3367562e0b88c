"""Vectorizable math for the CPU kernels: exp, and the activations built on it.

Numba on this machine has no SVML, so ``math.exp`` / ``math.tanh`` / ``math.erf`` in a loop
become one scalar libm call per element and the loop does not vectorize.  For float32 we
use our own exp (Cody-Waite range reduction, a degree-6 polynomial, and 2**n built by a bit
cast), which LLVM turns into 8-wide AVX2 code; relative error about 2e-7.  float64 keeps
libm, whose accuracy the 1e-12 tolerance needs.

Each helper is an overload per dtype: call ``fexp(x)`` with a float32 or float64 scalar
and the right version is compiled in.  They are plain calls, not numba's
``inline="always"``: LLVM inlines them into the caller's loop anyway, which then
vectorizes the same (gelu 4.87M float32: 7.08 ms before, 7.16 after, one thread), while
numba's IR inlining re-types the body at every call site - the cold first call of a
relu/gelu/swiglu/softmax/log_softmax/cross_entropy op took 3.2-4.0 s with it and
2.0-3.1 s without.  (The GEMM's act_store stays inlined: as a call, its loops did not
vectorize and the gelu epilogue went from 26 to 58 ms.)  The activation formulas avoid cancellation so the relative error stays
small in the tails:  gelu_tanh(x) = x * sigmoid(2u) instead of 0.5x(1 + tanh u), and
exact gelu uses Phi's tail for negative x (cdf_and_gauss).
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

# fastmath flags for our kernels: reassociation (vectorized reductions) and contraction
# (FMA), but never nnan/ninf: masked attention and softmax rely on -inf behaving.
FASTMATH = {"reassoc", "contract", "arcp", "nsz"}
# Options for every CPU kernel: cached compilation, the fastmath flags above, numpy's
# error model (a float division by zero gives inf instead of a Python exception check in
# the loop, which would stop vectorization), and the GIL released while the kernel runs
# (users call ops from several Python threads: holding it, a Python loop beside a thread
# calling the serial softmax 4096x1024 ran at 0.35-0.38 of its speed; released, at full
# speed, 2026-11-25), and no C entry point (the cfunc wrapper, which only a call by
# address uses).  Use as @njit(**JIT) or @njit(parallel=True, **JIT).
#
# Wrappers are compile time: numba builds both a CPython wrapper (argument boxing) and a
# C wrapper for every function it compiles, each optimized and turned into machine code.
# Cold compile of the exact gelu derivative chain (grad_input -> derivative -> ... ->
# _cdf_gauss_f32, empty cache, this Sapphire Rapids host, 2026-11-26): 1.05-1.07 s with
# both wrappers, 0.92 s without the C one, 0.71 s without either.
JIT = dict(cache=True, fastmath=FASTMATH, error_model="numpy", nogil=True, no_cfunc_wrapper=True)
# Functions only ever called by address (parallel.worker_address: workers, packers, the
# GEMM epilogue): the C entry point and no CPython wrapper (boxing code that would be
# compiled and never run).
JIT_BY_ADDRESS = dict(JIT, no_cpython_wrapper=True, no_cfunc_wrapper=False)
# A kernel's parts only ever called from other kernels (row loops, tile items): cached, no
# CPython wrapper.
JIT_INNER = dict(JIT, no_cpython_wrapper=True)
# Scalar helpers and other functions only ever called from compiled code: neither wrapper.
# Use as @njit(**HELPER) (uncached: their code is compiled into their callers' cached
# libraries).
HELPER = dict(no_cpython_wrapper=True, no_cfunc_wrapper=True)
# Our @overload implementations, as @overload(fn, **OVERLOAD): numba compiles each with a C
# wrapper unless told not to (5-12 ms each of a cold first call; attention built seven).
OVERLOAD = dict(jit_options=HELPER)

# Activation codes passed to the kernels (the fused GEMM epilogue and the elementwise
# kernels) and the formulas' constants: one table for both sides (kernels_common).
from kernels_common.activation import (ACT_GELU, ACT_GELU_TANH, ACT_NONE, ACT_RELU, ACT_SILU,  # noqa: F401,E402
                                       GELU_TANH_C, INV_SQRT2, SQRT_2_OVER_PI)

from . import target  # noqa: E402


def _target_has_avx512():
    """Whether numba compiles for a target with AVX-512 F (kernels_cpu/target.py): decided
    when a kernel is compiled, so a numba cache (keyed on the CPU name and features) never
    carries the choice to another host."""
    return target.has("avx512f")


@intrinsic
def wide_loops(typingctx):
    """Call once in a kernel whose loops LLVM vectorizes: on an AVX-512 target, marks the
    function "prefer-vector-width"="512", so the loop vectorizer uses 16 float32 lanes (zmm)
    instead of the 8 that LLVM's Skylake-and-later tuning prefers; elsewhere a no-op (AVX2
    and other targets keep LLVM's choice).  Exact gelu, 4M float32, one thread, Sapphire
    Rapids (2026-11-25): 5.15 ms with 8 lanes, 3.25 ms with 16."""
    def codegen(context, builder, sig, args):
        if _target_has_avx512():
            # a string attribute, which llvmlite's FunctionAttributes does not list
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    return types.none(), codegen


def like(x, value):
    """value (a Python float) as a constant of x's float type (float32 code stays float32)."""
    return value


@overload(like, **OVERLOAD)
def _like_overload(x, value):
    if x == types.float32:
        return lambda x, value: np.float32(value)
    return lambda x, value: np.float64(value)


@intrinsic
def fence(typingctx, x):
    """x behind llvm.arithmetic.fence: fastmath reassociation cannot move operations
    across it (so (x - m) - c is not rewritten as x - (m + c), which loses the low bits
    when |m| is large).  For scalar code only: a loop using it does not vectorize."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.arithmetic.fence", [ty], ir.FunctionType(ty, [ty]))
        return builder.call(fn, args)

    return x(x), codegen


@intrinsic
def bits_to_float(typingctx, i):
    """Reinterpret int32 / int64 bits as float32 / float64 (a register move)."""
    if i == types.int32:
        ret, lty = types.float32, ir.FloatType()
    elif i == types.int64:
        ret, lty = types.float64, ir.DoubleType()
    else:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], lty)

    return ret(i), codegen


@intrinsic
def float_to_bits(typingctx, x):
    """Reinterpret float32 / float64 bits as int32 / int64."""
    if x == types.float32:
        ret, lty = types.int32, ir.IntType(32)
    elif x == types.float64:
        ret, lty = types.int64, ir.IntType(64)
    else:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], lty)

    return ret(x), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c with one rounding (llvm.fma: vectorizes, and fastmath cannot split it)."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [ty], ir.FunctionType(ty, [ty, ty, ty]))
        return builder.call(fn, args)

    return a(a, b, c), codegen


# float64 exp: libm's exp is a scalar call
# (19 ns/element here), this one vectorizes (0.8 ns/element).  Cody-Waite reduction with
# fdlibm's split ln2 done by FMAs (fastmath reassociation cannot merge them), degree-13
# Taylor polynomial on |r| <= ln2/2 (truncation < 2e-16), 2^n built from the bits of
# n + 1023 + 1.5 * 2^52 (no float->int64 conversion, which AVX2 lacks).  Max relative error
# measured against libm on 3M arguments in [-708, 709]: < 1e-15.  Below -708.39 it returns
# 0 (libm: subnormals), above 709 inf (libm: finite up to 709.78); NaN gives 0, like fexp.
_E64_LO, _E64_HI = -708.39, 709.0
_E64_LOG2E = 1.4426950408889634
_E64_LN2_HI, _E64_LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_E64_BIAS = 1023.0 + 6755399441055744.0  # 1023 + 2^52 + 2^51
_E64_C = tuple(1.0 / math.factorial(k) for k in range(14))
_K2, _K3, _K4, _K5, _K6, _K7, _K8, _K9, _K10, _K11, _K12, _K13 = _E64_C[2:]


@njit(**HELPER)
def exp64(x):
    xc = min(max(x, _E64_LO), _E64_HI)
    n = np.floor(xc * _E64_LOG2E + 0.5)
    r = fma(-n, _E64_LN2_HI, xc)
    r = fma(-n, _E64_LN2_LO, r)
    p = _K13 * r + _K12
    p = p * r + _K11
    p = p * r + _K10
    p = p * r + _K9
    p = p * r + _K8
    p = p * r + _K7
    p = p * r + _K6
    p = p * r + _K5
    p = p * r + _K4
    p = p * r + _K3
    p = p * r + _K2
    p = p * r * r + r + 1.0
    scale = bits_to_float(float_to_bits(n + _E64_BIAS) << np.int64(52))
    y = p * scale if x <= _E64_HI else np.inf
    return y if x >= _E64_LO else 0.0



_F = np.float32
_EXP_LO, _EXP_HI = _F(-87.33), _F(88.37)  # 2**n stays a normal float32 in this range
_LOG2E, _HALF, _ZERO, _ONE = _F(1.4426950408889634), _F(0.5), _F(0.0), _F(1.0)
_INF = _F(np.inf)
_LN2_HI, _LN2_LO = _F(0.693359375), _F(-2.12194440e-4)
# exp(r) = 1 + r + r^2 q(r) on |r| <= ln2 / 2, q of degree 4 fitted minimax in exp's relative
# error (Lawson-weighted least squares, 4001 Chebyshev nodes: 3.1e-9 in float64).  It
# replaced Cephes' expf polynomial (q of degree 5): one FMA fewer, and the same float32
# error, since the rounding of r dominates (max 1.18e-7, mean 3.0e-8 relative over 3M
# points in [-87.3, 88.3], float32 emulation; degree 3 would give 2.1e-7 / 6.0e-8).
_Q0, _Q1, _Q2 = _F(0.4999999403953552), _F(0.1666652113199234), _F(0.04166838899254799)
_Q3, _Q4 = _F(0.00836874544620514), _F(0.0013814539415761828)
# t = x * log2(e) + 1.5 * 2^23 + 127 (one FMA, |x * log2(e)| < 2^22) rounds x * log2(e) to the
# nearest integer n (t's ulp is 1), and t's low mantissa bits then hold n + 127 (n in [-126,
# 127]): shifted left by 23 they are 2^n's exponent field.
_EXP_MAGIC = _F(12582912.0 + 127.0)


@njit(**HELPER)
def _exp_f32(x):
    y = _exp_in_range_f32(min(max(x, _EXP_LO), _EXP_HI))
    y = y if x <= _EXP_HI else _INF  # overflow to inf, as libm does
    return y if x >= _EXP_LO else _ZERO


@njit(**HELPER)
def _exp_in_range_f32(xc):
    """exp(xc) for xc in [_EXP_LO, _EXP_HI] (no range checks)."""
    # n and 2^n from one FMA (_EXP_MAGIC).  It replaced n = floor(xc * log2(e) + 0.5)
    # (vrndscaleps, 2 uops on Intel) and n + _EXP_MAGIC: the same error (max 1.18e-7, mean
    # 2.98e-8 relative over 3M points in [-87.3, 88.3]); in L1, 16 lanes, one thread (Xeon
    # with AVX-512, 2026-12-07), ns an element: exp 0.202-0.216 -> 0.184-0.193, silu
    # 0.284-0.303 -> 0.272-0.280, gelu_tanh 0.348-0.350 -> 0.331-0.338.  t - _EXP_MAGIC is
    # exact, and fastmath cannot fold it into xc * log2(e): t comes out of llvm.fma.
    t = fma(xc, _LOG2E, _EXP_MAGIC)
    n = t - _EXP_MAGIC
    r = fma(-n, _LN2_HI, xc)  # FMAs keep the two-part ln2 apart under fastmath reassociation
    r = fma(-n, _LN2_LO, r)
    p = (((_Q4 * r + _Q3) * r + _Q2) * r + _Q1) * r + _Q0
    p = p * r * r + r + _ONE
    # numba widens the shift to int64; the int32 cast keeps the low 32 bits (the exponent field)
    scale = bits_to_float(np.int32(float_to_bits(t) << np.int32(23)))
    return p * scale


def _exp_by_dtype(stub, f32):
    """Register stub's numba overload: f32 for a float32 argument, exp64 otherwise."""
    @overload(stub, **OVERLOAD)
    def _impl(x):
        if x == types.float32:
            return lambda x: f32(x)
        return lambda x: exp64(x)


def fexp(x):
    """exp(x), vectorizable: float32 rel. error < 1.2e-7, float64 < 1e-15 (exp64)."""
    return math.exp(x)


@njit(**HELPER)
def _exp_nonpos_f32(x):
    y = _exp_in_range_f32(max(x, _EXP_LO))
    return y if x >= _EXP_LO else _ZERO


def fexp_nonpos(x):
    """fexp(x) for x <= 0 (or -inf, or NaN: 0, like fexp): the shifted scores x - max of a
    softmax.  float32 skips fexp's overflow clamp and test, two of its vector operations."""
    return math.exp(x)


_exp_by_dtype(fexp, _exp_f32)
_exp_by_dtype(fexp_nonpos, _exp_nonpos_f32)


@intrinsic
def inline_into_callers(typingctx):
    """Call first in a scalar helper: marks the function LLVM "alwaysinline".  LLVM's own
    inliner left the exact gelu derivative (an erfc and an exp) as a call in the kernel's
    loop, which then did not vectorize: 125 ms for 4M float32 elements against 7.4 for silu's
    (one thread, 2026-11-25); inlined, the loop vectorizes.  (numba's inline="always" would
    do it at the IR level, re-typing the body at every call site: slower cold compiles, see
    the module doc.)"""
    def codegen(context, builder, sig, args):
        builder.function.attributes.add("alwaysinline")
        return context.get_dummy_value()

    return types.none(), codegen


# The normal CDF Phi(x) = erfc(-x / sqrt2) / 2, which exact gelu and its derivative need, with
# the Gaussian E = exp(-x^2 / 2) that the derivative needs too.  float32 writes the tail
# Phi(-|x|) = E R(z), z = |x| / sqrt2, R(z) = erfcx(z) / 2 = exp(z^2) erfc(z) / 2, and fits R
# by a rational P4(z) / Q5(z) on [0, 10] (deg Q = deg P + 1 gives erfcx's 1 / (z sqrt pi)
# tail): minimax in relative error by Lawson-weighted linearized least squares (the
# Sanathanan-Koerner iteration) on 4000 Chebyshev nodes against math.erfc(z) * exp(z^2):
# 5.6e-9 relative in float64.  The kernel's float32 gelu = x Phi(x) is within 4.1e-7
# relative of float64 on 4M points of x in [-16, 16] wherever |gelu| > 1e-30.
# Speed: E, P and Q depend on x alone and the division comes last; Numerical Recipes' erfcc
# (t exp(P9(t) - z^2), t = 1 / (1 + z / 2)), which this replaced, and the derivative's
# t P10(t) E cost more multiplies, and the loops are bound by the FMA ports (unrolling them
# two or four ways gained nothing).  One thread, 196608 float32 elements in cache, Zen 5,
# 2026-11-26: gelu 0.49 -> 0.27 ns/element, geglu 0.50 -> 0.28, gelu_backward 0.37 -> 0.31
# (PyTorch's gelu: 0.23, its erf accurate to 1.5e-7 absolute, not relative).
# E's argument carries x^2 / 2's rounding error l (an FMA) to first order, so the tail keeps
# its relative accuracy where x^2 / 2 is large.  x is clamped to +-14 for E, P and Q (beyond
# it E underflows to 0 and Phi is 0 or 1), so +-inf give Phi = 0 / 1 and E = 0.
_FIT_P = (1.00000001, 1.23759149, 0.73074651, 0.22881003, 0.03271072)   # 2 R = P / Q in z
_FIT_Q = (1.0, 2.36597122, 2.40044995, 1.32376763, 0.40558203, 0.05797753)
# evaluated in w = |x| and h = x^2 / 2 = z^2 (which E needs anyway): the odd terms take
# z = w / sqrt2 into their coefficients, and P takes R's 1/2
_RP0, _RP1, _RP2, _RP3, _RP4 = (np.float32(0.5 * c * INV_SQRT2 ** (k % 2)) for k, c in enumerate(_FIT_P))
_RQ0, _RQ1, _RQ2, _RQ3, _RQ4, _RQ5 = (np.float32(c * INV_SQRT2 ** (k % 2)) for k, c in enumerate(_FIT_Q))
_CDF_X_MAX = _F(14.0)


@njit(**HELPER)
def _cdf_gauss_f32(x):
    inline_into_callers()
    xc = min(max(x, -_CDF_X_MAX), _CDF_X_MAX)
    hx = _HALF * xc
    h = hx * xc
    l = fma(hx, xc, -h)          # x^2 / 2 = h + l exactly
    e0 = _exp_in_range_f32(max(-h, _EXP_LO))
    e0 = e0 if -h >= _EXP_LO else _ZERO
    e = fma(-l, e0, e0)          # exp(-h - l) to first order in l
    w = abs(xc)
    p = (_RP0 + _RP1 * w) + h * ((_RP2 + _RP3 * w) + h * _RP4)
    q = (_RQ0 + _RQ1 * w) + h * ((_RQ2 + _RQ3 * w) + h * (_RQ4 + _RQ5 * w))
    tail = e * (p / q)           # Phi(-|x|); the division runs beside the exp
    return (_ONE - tail if x >= _ZERO else tail), e


def cdf_and_gauss(x):
    """(Phi(x), exp(-x^2 / 2)): the normal CDF and the unnormalized Gaussian.  float32:
    vectorizable (above); float64: libm's erfc (the 1e-12 tolerance) and exp64."""
    return 0.5 * math.erfc(-x * INV_SQRT2), math.exp(-0.5 * x * x)


@overload(cdf_and_gauss, **OVERLOAD)
def _cdf_and_gauss_overload(x):
    if x == types.float32:
        return lambda x: _cdf_gauss_f32(x)
    return lambda x: (normal_cdf(x), exp64(-0.5 * x * x))


def normal_cdf(x):
    """Phi(x) alone (exact gelu's factor); float32 as cdf_and_gauss, float64 libm's erfc."""
    return 0.5 * math.erfc(-x * INV_SQRT2)


@overload(normal_cdf, **OVERLOAD)
def _normal_cdf_overload(x):
    if x == types.float32:
        return lambda x: _cdf_gauss_f32(x)[0]
    return lambda x: 0.5 * math.erfc(-x * INV_SQRT2)


@njit(**HELPER)
def relu(x):
    return max(x, like(x, 0.0))


def _one(x):
    return 1.0


@overload(_one, **OVERLOAD)
def _one_overload(x):
    if x == types.float32:
        return lambda x: _ONE
    return lambda x: 1.0


@njit(**HELPER)
def sigmoid(x):
    return _one(x) / (_one(x) + fexp(-x))


@njit(**HELPER)
def silu(x):
    return x / (_one(x) + fexp(-x))


@njit(**HELPER)
def gelu(x):
    """x Phi(x): exact GELU, Phi from the tail for negative x (no cancellation)."""
    return x * normal_cdf(x)


@njit(**HELPER)
def gelu_tanh(x):
    """0.5 x (1 + tanh u) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    u = like(x, 2.0 * SQRT_2_OVER_PI) * (x + like(x, GELU_TANH_C) * x * x * x)
    return x / (_one(x) + fexp(-u))


@njit(**HELPER)
def activate(x, code):
    """The activation `code` (ACT_*) applied to one scalar."""
    if code == ACT_RELU:
        return relu(x)
    if code == ACT_GELU:
        return gelu(x)
    if code == ACT_GELU_TANH:
        return gelu_tanh(x)
    if code == ACT_SILU:
        return silu(x)
    return x


# The scalar function of each activation code (ACT_NONE: none): the literal-code overloads
# (activate_lit here, the GEMM epilogues' act_store_lit) look them up here.
ACTIVATIONS = {ACT_RELU: relu, ACT_GELU: gelu, ACT_GELU_TANH: gelu_tanh, ACT_SILU: silu}


def activate_lit(x, code):
    """activate(x, code) for a literal code: only that activation is typed and compiled
    (numba types every branch of activate's `if code == ...`, whatever the literal's
    value: the comparisons are with globals, which its dead-branch pruning does not
    resolve).  ACT_NONE, or any other code: x."""
    return x


@overload(activate_lit, inline="always", **OVERLOAD)
def _activate_lit_overload(x, code):
    if not isinstance(code, types.IntegerLiteral):
        return None
    act = ACTIVATIONS.get(code.literal_value)
    if act is None:
        return lambda x, code: x
    return lambda x, code: act(x)
