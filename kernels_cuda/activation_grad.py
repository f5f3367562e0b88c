"""Backward of the activations and gated linear units on flat contiguous device arrays.

The device functions come first: ``derivative_fn(acc_np)`` (act'(x, code)),
``grad_input_fn(acc_np)`` (g * act'(x), relu as threshold_backward's select) and
``value_derivative_fn(acc_np)`` ((act(x), act'(x)) sharing their exp), the twins of
kernels_cpu/activation_grad.py's scalar formulas (the same rewriting: sigmoid and 1 - sigmoid
each from exp(-|v|), multiplicative factors on x clamped to +-X_CLAMP, an explicit NaN
select), for any kernel that needs them (a linear-backward GEMM prologue).

The kernels are kernels_cuda/activation.py's grid-stride loop: each thread VEC = 4 elements
per step, four coalesced loads in flight (element base + j*blockDim + threadIdx), the grid
capped at one wave by the dispatcher.  float16 / float32 compute in float32, float64 in
float64; the activation code is a runtime argument, uniform over the grid.
"""
import math
from functools import lru_cache

from numba import cuda, types

from kernels_common.activation import ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU, INV_SQRT2, SQRT_2_OVER_PI
from kernels_common.activation_grad import X_CLAMP

from ._jit import ELEMENTWISE_THREADS, PtxBuild, acc_np, acc_of, arr, device, kernel

VEC = 4  # the kernels below unroll exactly 4
GELU_TANH_C = 0.044715
INV_SQRT_2PI = 0.3989422804014327


@lru_cache(maxsize=None)
def value_derivative_fn(acc_np):
    """Device function vd(x, code) -> (act(x), act'(x)) in accumulation type acc_np."""
    zero, one, half = acc_np(0.0), acc_np(1.0), acc_np(0.5)
    k = acc_np(X_CLAMP)
    c2 = acc_np(2.0 * SQRT_2_OVER_PI)
    cg, cg3 = acc_np(GELU_TANH_C), acc_np(3.0 * GELU_TANH_C)
    inv_sqrt2, inv_sqrt_2pi, mhalf = acc_np(INV_SQRT2), acc_np(INV_SQRT_2PI), acc_np(-0.5)

    @device
    def sigmoid_pair(v):
        # exp(-|v|) <= 1: no overflow (the simulator's math.exp would raise), no cancellation
        e = math.exp(-abs(v))
        r = one / (one + e)
        er = e * r
        if v >= zero:
            return r, er
        return er, r

    @device
    def vd(x, code):
        xc = min(max(x, -k), k)
        if code == ACT_RELU:
            d = one if x > zero else zero
            a = zero if x < zero else x  # NaN stays NaN (max() is fmax on a GPU)
        elif code == ACT_SILU:
            s, sc = sigmoid_pair(x)
            d = s * (one + xc * sc)
            a = x * s
        elif code == ACT_GELU:
            cdf = half * math.erfc(-x * inv_sqrt2)
            d = cdf + xc * (math.exp(mhalf * xc * xc) * inv_sqrt_2pi)
            a = x * cdf
        elif code == ACT_GELU_TANH:
            x2 = xc * xc
            s, sc = sigmoid_pair(c2 * (xc + cg * x2 * xc))
            d = s * (one + xc * sc * (c2 * (one + cg3 * x2)))
            a = x * s
        else:
            d = one
            a = x
        if x != x:  # NaN in, NaN out (min / max above drop a NaN on the GPU)
            d = x
        return a, d

    return vd


@lru_cache(maxsize=None)
def derivative_fn(acc_np):
    """Device function d(x, code) -> act'(x)."""
    vd = value_derivative_fn(acc_np)

    @device
    def d(x, code):
        return vd(x, code)[1]

    return d


@lru_cache(maxsize=None)
def grad_input_fn(acc_np):
    """Device function gi(g, x, code) -> g * act'(x); relu: g where x > 0, 0 where x <= 0
    (an inf or NaN g too: threshold_backward), NaN where x is NaN."""
    zero = acc_np(0.0)
    d = derivative_fn(acc_np)

    @device
    def gi(g, x, code):
        if code == ACT_RELU:
            if x > zero:
                return g
            if x <= zero:
                return zero
            return x
        return g * d(x, code)

    return gi


@lru_cache(maxsize=None)
def unary_grad_kernel(acc_np):
    """kernel(g, x, out, code): out = g * act'(x), 1-D arrays of equal length."""
    acc, _ = acc_of(acc_np)
    gi = grad_input_fn(acc_np)

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def unary_grad(g, x, out, code):
        n = x.shape[0]
        tpb = cuda.blockDim.x
        step = cuda.gridDim.x * tpb * VEC
        base = cuda.blockIdx.x * tpb * VEC + cuda.threadIdx.x
        while base < n:
            if base + 3 * tpb < n:  # all four in range: eight loads issued before any store
                x0, x1, x2, x3 = x[base], x[base + tpb], x[base + 2 * tpb], x[base + 3 * tpb]
                g0, g1, g2, g3 = g[base], g[base + tpb], g[base + 2 * tpb], g[base + 3 * tpb]
                out[base] = gi(acc(g0), acc(x0), code)
                out[base + tpb] = gi(acc(g1), acc(x1), code)
                out[base + 2 * tpb] = gi(acc(g2), acc(x2), code)
                out[base + 3 * tpb] = gi(acc(g3), acc(x3), code)
            else:
                for j in range(VEC):
                    i = base + j * tpb
                    if i < n:
                        out[i] = gi(acc(g[i]), acc(x[i]), code)
            base += step

    return unary_grad


@lru_cache(maxsize=None)
def gated_grad_kernel(acc_np):
    """kernel(g, gate, up, dgate, dup, code): dgate = (g up) act'(gate), dup = g act(gate)."""
    acc, _ = acc_of(acc_np)
    vd = value_derivative_fn(acc_np)

    @device
    def one_element(g, gate, up, dgate, dup, i, code):
        gg = acc(g[i])
        a, d = vd(acc(gate[i]), code)
        dgate[i] = gg * acc(up[i]) * d
        dup[i] = gg * a

    @kernel(launch_bounds=(ELEMENTWISE_THREADS, 4))
    def gated_grad(g, gate, up, dgate, dup, code):
        n = gate.shape[0]
        tpb = cuda.blockDim.x
        step = cuda.gridDim.x * tpb * VEC
        base = cuda.blockIdx.x * tpb * VEC + cuda.threadIdx.x
        while base < n:
            # one element per j: the three loads of each are independent of the other j's
            # stores (distinct elements), so the compiler may hoist them
            for j in range(VEC):
                i = base + j * tpb
                if i < n:
                    one_element(g, gate, up, dgate, dup, i, code)
            base += step

    return gated_grad


def kernel_for(kind, dtype):
    a = acc_of(dtype)[1]
    return (unary_grad_kernel if kind == "unary" else gated_grad_kernel)(a)


# ---- what `python -m bench.ptx` compiles (see _jit.PtxBuild) ----------------------------------
PTX = [
    PtxBuild("activation_grad.unary", "activation_grad", lambda dt: unary_grad_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 1), arr(dt, 1), arr(dt, 1), types.int64), threads=ELEMENTWISE_THREADS),
    PtxBuild("activation_grad.gated", "activation_grad", lambda dt: gated_grad_kernel(acc_np(dt)),
             lambda dt: (arr(dt, 1), arr(dt, 1), arr(dt, 1), arr(dt, 1), arr(dt, 1), types.int64),
             threads=ELEMENTWISE_THREADS),
]
