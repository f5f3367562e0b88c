"""Elementwise activations and gated linear units on flat contiguous arrays.

Shapes: every kernel takes 1-D C-contiguous arrays of equal length (dispatch flattens).
``*_serial`` runs on the calling thread; ``*_parallel`` splits the array into chunks of
CHUNK elements over numba's threads.  The activation is chosen by an integer code
(approx.ACT_*) outside the loop so that each loop body is branch-free and vectorizes.
"""
from numba import njit, prange

from .approx import ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU, JIT, JIT_INNER, gelu, gelu_tanh, relu, silu, wide_loops

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
def activation_parallel(x, out, code):
    n = x.shape[0]
    chunks = (n + CHUNK - 1) // CHUNK
    for c in prange(chunks):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        activation_block(x[lo:hi], out[lo:hi], code)


@njit(**JIT)
def gated_serial(gate, up, out, code):
    gated_block(gate, up, out, code)


@njit(parallel=True, **JIT)
def gated_parallel(gate, up, out, code):
    n = gate.shape[0]
    chunks = (n + CHUNK - 1) // CHUNK
    for c in prange(chunks):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        gated_block(gate[lo:hi], up[lo:hi], out[lo:hi], code)
