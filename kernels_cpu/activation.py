"""Elementwise activations and gated linear units on flat contiguous arrays.

Shapes: every kernel takes 1-D C-contiguous arrays of equal length (dispatch flattens).
``*_serial`` runs on the calling thread; ``*_parallel`` lets numba's threads claim ranges of
chunks of CHUNK elements (parallel.claim).  The activation is chosen by an integer code
(approx.ACT_*) outside the loop so that each loop body is branch-free and vectorizes.
"""
from numba import njit, prange

from .approx import ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU, JIT, JIT_INNER, gelu, gelu_tanh, relu, silu, wide_loops
from .parallel import claim, claims_for, row_split

# Elements per parallel task: 64 KiB of float32, a few L2-friendly pages.  Not tuned by a
# measurement of its own (the serial/parallel threshold in dispatch/ops/activation.py is).
CHUNK = 16384


@njit(**JIT_INNER)
def activation_block(x, out, code):
    """out[:] = act(x[:]) for 1-D arrays."""
    wide_loops()  # 16 float32 lanes on AVX-512 hosts
    n = x.shape[0]
    if code == ACT_RELU:
        for i in range(n):
            out[i] = relu(x[i])
    elif code == ACT_GELU:
        for i in range(n):
            out[i] = gelu(x[i])
    elif code == ACT_GELU_TANH:
        for i in range(n):
            out[i] = gelu_tanh(x[i])
    elif code == ACT_SILU:
        for i in range(n):
            out[i] = silu(x[i])
    else:
        for i in range(n):
            out[i] = x[i]


@njit(**JIT_INNER)
def gated_block(gate, up, out, code):
    """out[:] = act(gate[:]) * up[:] (SwiGLU with ACT_SILU, GeGLU with ACT_GELU[_TANH])."""
    wide_loops()
    n = gate.shape[0]
    if code == ACT_SILU:
        for i in range(n):
            out[i] = silu(gate[i]) * up[i]
    elif code == ACT_GELU:
        for i in range(n):
            out[i] = gelu(gate[i]) * up[i]
    elif code == ACT_GELU_TANH:
        for i in range(n):
            out[i] = gelu_tanh(gate[i]) * up[i]
    else:
        for i in range(n):
            out[i] = relu(gate[i]) * up[i]


@njit(**JIT)
def activation_serial(x, out, code):
    activation_block(x, out, code)


@njit(parallel=True, **JIT)
def _activation_parallel(x, out, code, nw, fn, counters):
    n = (x.shape[0] + CHUNK - 1) // CHUNK
    least, workers = claims_for(n, nw, 1)
    for me in prange(workers):
        lo, hi = claim(fn, counters, n, workers, least, me)
        while lo < hi:
            activation_block(x[lo * CHUNK:hi * CHUNK], out[lo * CHUNK:hi * CHUNK], code)
            lo, hi = claim(fn, counters, n, workers, least, me)


def activation_parallel(x, out, code):
    """activation_serial's result, chunks of CHUNK elements claimed by numba's threads."""
    _activation_parallel(x, out, code, *row_split())


@njit(**JIT)
def gated_serial(gate, up, out, code):
    gated_block(gate, up, out, code)


@njit(parallel=True, **JIT)
def _gated_parallel(gate, up, out, code, nw, fn, counters):
    n = (gate.shape[0] + CHUNK - 1) // CHUNK
    least, workers = claims_for(n, nw, 1)
    for me in prange(workers):
        lo, hi = claim(fn, counters, n, workers, least, me)
        while lo < hi:
            gated_block(gate[lo * CHUNK:hi * CHUNK], up[lo * CHUNK:hi * CHUNK], out[lo * CHUNK:hi * CHUNK], code)
            lo, hi = claim(fn, counters, n, workers, least, me)


def gated_parallel(gate, up, out, code):
    """gated_serial's result, chunks of CHUNK elements claimed by numba's threads."""
    _gated_parallel(gate, up, out, code, *row_split())
