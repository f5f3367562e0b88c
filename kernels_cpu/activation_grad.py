"""Backward of the elementwise activations and gated linear units on flat contiguous arrays.

The scalar derivative formulas come first (``*_derivative(x)``, ``*_value_and_derivative(x)``
and ``derivative(x, code)`` / ``grad_input(g, x, code)`` dispatching on the ACT_* code), so
that other kernels (a linear-backward GEMM prologue multiplying the incoming gradient by
act'(pre-activation)) can call the same code; kernels_cuda/activation_grad.py has their
device-function twins.  They build on kernels_cpu.approx (the vectorizable exp the forwards
use; float64 keeps libm's erfc, as the forward does).

Formulas (PyTorch's, rewritten where its form cancels or overflows):
  relu       threshold_backward: g where x > 0, 0 where x <= 0 (even for a NaN or inf g),
             NaN where x is NaN (PyTorch passes g there: its test is x <= 0).
  silu       s (1 + x (1 - s)), s = sigmoid(x).  s and 1 - s both from e = exp(-|x|) in (0, 1]:
             r = 1 / (1 + e) is the one near 1, e r the other, so 1 - s never cancels
             (1 - s for s near 1 loses its bits: x = 12 in float32) and nothing overflows.
  gelu       Phi(x) + x phi(x) = erfc(-x / sqrt2) / 2 + x exp(-x^2 / 2) / sqrt(2 pi); float32
             with one exp for both (approx.cdf_and_gauss).
  gelu_tanh  0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u' written with s = sigmoid(v), v = 2u
             (0.5 (1 + tanh u) = s, 1 - tanh^2 u = 4 s (1 - s)): s (1 + x (1 - s) v'),
             v' = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2); s and 1 - s as for silu.
The multiplicative factors take x clamped to +-X_CLAMP (kernels_common.activation_grad),
where every derivative has reached its limit, so no finite x gives inf * 0 = NaN (PyTorch's
float32 tanh-gelu derivative is NaN for |x| > ~1e13); +-inf give the limits 0 and 1.  A NaN
x gives NaN through an explicit select at the end (approx.fexp maps NaN to 0).

Kernels: every kernel takes 1-D C-contiguous arrays of equal length (dispatch flattens);
``*_serial`` runs on the calling thread, ``*_parallel`` splits the array into chunks of
activation.CHUNK elements claimed by the team's threads (parallel.row_run).  The activation
code is branched on outside each loop, so every loop body is branch-free (selects) and
vectorizes.
"""
import numpy as np
from numba import njit, types
from numba.extending import overload

from kernels_common.activation_grad import X_CLAMP

from .activation import CHUNK
from .approx import (OVERLOAD, ACT_GELU, ACT_GELU_TANH, ACT_NONE, ACT_RELU, ACT_SILU, GELU_TANH_C, HELPER, JIT,
                     JIT_BY_ADDRESS, JIT_INNER, SQRT_2_OVER_PI, cdf_and_gauss, fexp, inline_into_callers, like,
                     wide_loops)
from .parallel import (RW_D, c_array_at, launch, like_dtype, only_if, row_args, row_block, row_claim, row_run,
                       worker_address)

INV_SQRT_2PI = 0.3989422804014327


# ---- scalar formulas ---------------------------------------------------------------------------

@njit(**HELPER)
def _clamp(x):
    inline_into_callers()
    k = like(x, X_CLAMP)
    return min(max(x, -k), k)


@njit(**HELPER)
def _not_nan(x, d):
    """d, or x itself when x is NaN (a select: keeps the loop vectorized)."""
    inline_into_callers()
    return d if x == x else x


@njit(**HELPER)
def sigmoid_pair(v):
    """(sigmoid(v), 1 - sigmoid(v)), each to full relative accuracy, for any v: from
    e = exp(-|v|) <= 1, r = 1 / (1 + e) is the larger, e r the smaller."""
    inline_into_callers()
    one = like(v, 1.0)
    e = fexp(-abs(v))
    r = one / (one + e)
    er = e * r
    pos = v >= like(v, 0.0)
    return (r if pos else er), (er if pos else r)


@njit(**HELPER)
def relu_derivative(x):
    inline_into_callers()
    return like(x, 1.0) if x > like(x, 0.0) else (like(x, 0.0) if x <= like(x, 0.0) else x)


@njit(**HELPER)
def relu_grad(g, x):
    """threshold_backward(g, x, 0): g where x > 0, else 0 (NaN for a NaN x)."""
    inline_into_callers()
    return g if x > like(x, 0.0) else (like(x, 0.0) if x <= like(x, 0.0) else x)


@njit(**HELPER)
def silu_value_and_derivative(x):
    """(silu(x), silu'(x))."""
    inline_into_callers()
    s, sc = sigmoid_pair(x)
    d = s * (like(x, 1.0) + _clamp(x) * sc)
    return x * s, _not_nan(x, d)


@njit(**HELPER)
def silu_derivative(x):
    inline_into_callers()
    return silu_value_and_derivative(x)[1]


@njit(**HELPER)
def gelu_value_and_derivative(x):
    """(gelu(x), gelu'(x)), exact (erf) form."""
    inline_into_callers()
    cdf, e = cdf_and_gauss(x)
    xc = _clamp(x)
    return x * cdf, _not_nan(x, cdf + xc * (e * like(x, INV_SQRT_2PI)))


@njit(**HELPER)
def gelu_derivative(x):
    inline_into_callers()
    return gelu_value_and_derivative(x)[1]


@njit(**HELPER)
def gelu_tanh_value_and_derivative(x):
    """(gelu_tanh(x), gelu_tanh'(x))."""
    inline_into_callers()
    xc = _clamp(x)
    x2 = xc * xc
    c2 = like(x, 2.0 * SQRT_2_OVER_PI)
    v = c2 * (xc + like(x, GELU_TANH_C) * x2 * xc)
    s, sc = sigmoid_pair(v)
    dv = c2 * (like(x, 1.0) + like(x, 3.0 * GELU_TANH_C) * x2)
    d = s * (like(x, 1.0) + xc * sc * dv)
    return x * s, _not_nan(x, d)


@njit(**HELPER)
def gelu_tanh_derivative(x):
    inline_into_callers()
    return gelu_tanh_value_and_derivative(x)[1]


@njit(**HELPER)
def derivative(x, code):
    """act'(x) for the activation `code` (ACT_*; identity: 1).  One scalar: callers with a
    loop branch on code outside it (as the kernels below do)."""
    inline_into_callers()
    if code == ACT_RELU:
        return relu_derivative(x)
    if code == ACT_GELU:
        return gelu_derivative(x)
    if code == ACT_GELU_TANH:
        return gelu_tanh_derivative(x)
    if code == ACT_SILU:
        return silu_derivative(x)
    return like(x, 1.0)


@njit(**HELPER)
def _grad_input_any(g, x, code):
    inline_into_callers()
    if code == ACT_RELU:
        return relu_grad(g, x)
    return g * derivative(x, code)


def _grad_input_of(d):
    @njit(**HELPER)
    def grad(g, x, code):
        inline_into_callers()
        return g * d(x)

    return grad


@njit(**HELPER)
def _grad_input_relu(g, x, code):
    inline_into_callers()
    return relu_grad(g, x)


@njit(**HELPER)
def _grad_input_none(g, x, code):
    inline_into_callers()
    return g


_GRAD_INPUT = {ACT_NONE: _grad_input_none, ACT_RELU: _grad_input_relu, ACT_GELU: _grad_input_of(gelu_derivative),
               ACT_GELU_TANH: _grad_input_of(gelu_tanh_derivative), ACT_SILU: _grad_input_of(silu_derivative)}


def grad_input(g, x, code):
    """g * act'(x), the gradient through the activation `code` of the incoming gradient g
    (relu: threshold_backward's select, so an inf g where x <= 0 gives 0)."""
    return _grad_input_any(g, x, code)


@overload(grad_input, inline="always", prefer_literal=True, **OVERLOAD)
def _grad_input_overload(g, x, code):
    """A literal code compiles its own activation's formula only: numba types every branch
    of `if code == ...` whatever code's literal value (the comparisons are with globals,
    which its dead-branch pruning does not resolve), so the branching form compiled all four
    derivatives, 0.26 s of linear_backward's 3.8 s cold first call (+gelu, float32, AVX-512
    host, 2026-11-27)."""
    fn = _GRAD_INPUT.get(code.literal_value, _grad_input_any) if isinstance(code, types.IntegerLiteral) \
        else _grad_input_any
    return lambda g, x, code: fn(g, x, code)


# ---- kernels ---------------------------------------------------------------------------------------

@njit(**JIT_INNER)
def unary_grad_block(g, x, out, code):
    """out[:] = g[:] * act'(x[:]) for 1-D arrays."""
    wide_loops()  # 16 float32 lanes on AVX-512 hosts
    n = x.shape[0]
    if code == ACT_RELU:
        for i in range(n):
            out[i] = relu_grad(g[i], x[i])
    elif code == ACT_GELU:
        for i in range(n):
            out[i] = g[i] * gelu_derivative(x[i])
    elif code == ACT_GELU_TANH:
        for i in range(n):
            out[i] = g[i] * gelu_tanh_derivative(x[i])
    elif code == ACT_SILU:
        for i in range(n):
            out[i] = g[i] * silu_derivative(x[i])
    else:
        for i in range(n):
            out[i] = g[i]


@njit(**JIT_INNER)
def gated_grad_block(g, gate, up, dgate, dup, code):
    """For out = act(gate) * up: dgate = (g up) act'(gate), dup = g act(gate) (the order of
    PyTorch's autograd of the composition)."""
    wide_loops()
    n = gate.shape[0]
    if code == ACT_SILU:
        for i in range(n):
            a, d = silu_value_and_derivative(gate[i])
            dgate[i] = g[i] * up[i] * d
            dup[i] = g[i] * a
    elif code == ACT_GELU:
        for i in range(n):
            a, d = gelu_value_and_derivative(gate[i])
            dgate[i] = g[i] * up[i] * d
            dup[i] = g[i] * a
    elif code == ACT_GELU_TANH:
        for i in range(n):
            a, d = gelu_tanh_value_and_derivative(gate[i])
            dgate[i] = g[i] * up[i] * d
            dup[i] = g[i] * a
    else:
        for i in range(n):
            dgate[i] = relu_grad(g[i] * up[i], gate[i])
            dup[i] = g[i] * max(gate[i], like(gate[i], 0.0))


def gated_grad_pair(g, gate, up, code):
    """(dgate, dup) of one element for a literal code (gated_grad_block's formulas; any
    code but silu / gelu / gelu_tanh: ReGLU)."""
    return g, g


_VALUE_AND_DERIVATIVE = {ACT_SILU: silu_value_and_derivative, ACT_GELU: gelu_value_and_derivative,
                         ACT_GELU_TANH: gelu_tanh_value_and_derivative}


@overload(gated_grad_pair, inline="always", **OVERLOAD)
def _gated_grad_pair_overload(g, gate, up, code):
    if not isinstance(code, types.IntegerLiteral):
        return None
    vd = _VALUE_AND_DERIVATIVE.get(code.literal_value)
    if vd is None:
        return lambda g, gate, up, code: (relu_grad(g * up, gate), g * max(gate, like(gate, 0.0)))

    def pair(g, gate, up, code):
        a, d = vd(gate)
        return g * up * d, g * a
    return pair


@njit(**JIT_INNER)
def unary_grad_block_lit(g, x, out, code):
    """unary_grad_block for a literal code (grad_input's overload): only that activation's
    derivative is compiled (the parallel worker's variant; see activation.activation_block_lit)."""
    wide_loops()
    for i in range(x.shape[0]):
        out[i] = grad_input(g[i], x[i], code)


@njit(**JIT_INNER)
def gated_grad_block_lit(g, gate, up, dgate, dup, code):
    """gated_grad_block for a literal code (gated_grad_pair)."""
    wide_loops()
    for i in range(gate.shape[0]):
        dgate[i], dup[i] = gated_grad_pair(g[i], gate[i], up[i], code)


@njit(**JIT)
def unary_grad_serial(g, x, out, code):
    unary_grad_block(g, x, out, code)


@njit(**JIT_BY_ADDRESS)
def grad_worker(me, params, is64, gated, code):
    """Chunks of CHUNK elements claimed from the block (parallel.row_block: units = chunks,
    d = elements).  Unary: arrays g, x, out.  Gated: g, gate, up, dgate, dup.  gated
    (parallel.only_if) and the activation code are literals: a variant compiles one
    activation's gradient."""
    p, _ = row_args(params)
    z = like_dtype(is64)
    n = p[RW_D]
    g = c_array_at(p[0], z, (n,))
    a1 = c_array_at(p[1], z, (n,))
    a2 = c_array_at(p[2], z, (n,))
    a3 = c_array_at(p[3], z, (n,))
    a4 = c_array_at(p[4], z, (n,))
    lo, hi = row_claim(p, me)
    while lo < hi:
        a, b = lo * CHUNK, min(hi * CHUNK, n)
        if gated is not None:
            gated_grad_block_lit(g[a:b], a1[a:b], a2[a:b], a3[a:b], a4[a:b], code)
        else:
            unary_grad_block_lit(g[a:b], a1[a:b], a2[a:b], code)
        lo, hi = row_claim(p, me)


@njit(**JIT)
def _launch(g, a1, a2, a3, a4, code, worker, nw, fn, buf, team_run, team_state):
    n = g.shape[0]
    workers = row_block(buf, (n + CHUNK - 1) // CHUNK, n, 0.0, code, 0, 0, 1, nw, fn)
    buf[0], buf[1], buf[2] = g.ctypes.data, a1.ctypes.data, a2.ctypes.data
    buf[3], buf[4] = a3.ctypes.data, a4.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def unary_grad_parallel(g, x, out, code):
    """unary_grad_serial's result, chunks of CHUNK elements claimed by the team's threads
    (parallel.row_run)."""
    row_run(_launch, worker_address(grad_worker, (bool(x.dtype == np.float64), only_if(False), int(code))),
            g, x, out, out, out, code)


@njit(**JIT)
def gated_grad_serial(g, gate, up, dgate, dup, code):
    gated_grad_block(g, gate, up, dgate, dup, code)


def gated_grad_parallel(g, gate, up, dgate, dup, code):
    """gated_grad_serial's result, chunks claimed by the team's threads."""
    row_run(_launch, worker_address(grad_worker, (bool(gate.dtype == np.float64), only_if(True), int(code))),
            g, gate, up, dgate, dup, code)
