"""Elementwise activations and gated linear units on flat contiguous arrays.

Shapes: every kernel takes 1-D C-contiguous arrays of equal length (dispatch flattens).
``*_serial`` runs on the calling thread; ``*_parallel`` lets the team's threads claim ranges of
chunks of CHUNK elements (parallel.row_run).  The activation is chosen by an integer code
(approx.ACT_*) outside the loop so that each loop body is branch-free and vectorizes.

bfloat16 and float16 (``*_half_*``; arrays of 16-bit patterns, uint16 / int16: half.py):
each value widened to float32 (exact), the float32 activation (times up, widened, for the
gated units) and one rounding to the arrays' format (nearest even), in the same loop.
"""
from numba import njit

from .approx import (ACT_GELU, ACT_GELU_TANH, ACT_RELU, ACT_SILU, JIT, JIT_BY_ADDRESS, JIT_INNER, activate_lit, gelu,
                     gelu_tanh, relu, silu, wide_loops)
from .half import round_to, widen
from .parallel import (RW_D, c_array_at, launch, only_if, row_args, row_block, row_claim, row_run,
                       worker_address, zero_of)

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


# The gated units' codes; any other means ReGLU (gated_block's last branch)
GATED_CODES = (ACT_SILU, ACT_GELU, ACT_GELU_TANH)


@njit(**JIT_INNER)
def activation_block_lit(x, out, code):
    """activation_block for a literal code (approx.activate_lit): only that activation is
    compiled.  The parallel worker's variant; the serial kernel, compiled once for every
    code, keeps activation_block (a literal there would compile per code, and calling
    with one from Python costs microseconds a call)."""
    wide_loops()
    for i in range(x.shape[0]):
        out[i] = activate_lit(x[i], code)


@njit(**JIT_INNER)
def gated_block_lit(gate, up, out, code):
    """gated_block for a literal code in GATED_CODES or ACT_RELU (see activation_block_lit)."""
    wide_loops()
    for i in range(gate.shape[0]):
        out[i] = activate_lit(gate[i], code) * up[i]


@njit(**JIT)
def activation_serial(x, out, code):
    activation_block(x, out, code)


@njit(**JIT_BY_ADDRESS)
def activation_worker(me, params, fmt, half, gated, code):
    """Chunks of CHUNK elements claimed from the block (parallel.row_block: units = chunks,
    d = elements; arrays x, up (gated only), out).  fmt: the arrays' literal type character
    (parallel.zero_of: "f", "d", or 16-bit bits "H" / "h", which take the *_half blocks:
    half, as gated, a parallel.only_if literal).  gated and the activation code are
    literals: a variant compiles one activation's loop.  Cold first call of relu 128x3072
    (empty cache, Zen 4, 2026-12-04): every activation compiled into the worker, 0.69 s of
    its 1.18 s."""
    p, _ = row_args(params)
    z = zero_of(fmt)
    n = p[RW_D]
    x = c_array_at(p[0], z, (n,))
    up = c_array_at(p[1], z, (n,))
    out = c_array_at(p[2], z, (n,))
    lo, hi = row_claim(p, me)
    while lo < hi:
        a, b = lo * CHUNK, min(hi * CHUNK, n)
        if gated is not None:
            if half is not None:
                gated_block_half_lit(x[a:b], up[a:b], out[a:b], code)
            else:
                gated_block_lit(x[a:b], up[a:b], out[a:b], code)
        elif half is not None:
            activation_block_half_lit(x[a:b], out[a:b], code)
        else:
            activation_block_lit(x[a:b], out[a:b], code)
        lo, hi = row_claim(p, me)


def _variant(x, gated, code):
    """activation_worker's literals for arrays like x (dtype.char: 0.04 us, dtype.name 1.8)."""
    return x.dtype.char, only_if(x.dtype.itemsize == 2), only_if(gated), int(code)


@njit(**JIT)
def _launch(x, up, out, code, worker, nw, fn, buf, team_run, team_state):
    n = x.shape[0]
    workers = row_block(buf, (n + CHUNK - 1) // CHUNK, n, 0.0, code, 0, 0, 1, nw, fn)
    buf[0], buf[1], buf[2] = x.ctypes.data, up.ctypes.data, out.ctypes.data
    return launch(worker, buf.ctypes.data, workers, team_run, team_state)


def activation_parallel(x, out, code):
    """activation_serial's result, chunks of CHUNK elements claimed by the team's threads
    (parallel.row_run)."""
    row_run(_launch, worker_address(activation_worker, _variant(x, False, code)), x, x, out, code)


@njit(**JIT)
def gated_serial(gate, up, out, code):
    gated_block(gate, up, out, code)


def gated_parallel(gate, up, out, code):
    """gated_serial's result, chunks of CHUNK elements claimed by the team's threads."""
    code = int(code) if code in GATED_CODES else ACT_RELU
    row_run(_launch, worker_address(activation_worker, _variant(gate, True, code)), gate, up, out, code)


@njit(**JIT_INNER)
def activation_block_half(x, out, code):
    """out[:] = round(act(x[:])) for 1-D 16-bit arrays of one format (activation_block's branches)."""
    wide_loops()
    n = x.shape[0]
    if code == ACT_RELU:
        for i in range(n):
            out[i] = round_to(relu(widen(x[i])), out)
    elif code == ACT_GELU:
        for i in range(n):
            out[i] = round_to(gelu(widen(x[i])), out)
    elif code == ACT_GELU_TANH:
        for i in range(n):
            out[i] = round_to(gelu_tanh(widen(x[i])), out)
    elif code == ACT_SILU:
        for i in range(n):
            out[i] = round_to(silu(widen(x[i])), out)
    else:
        for i in range(n):
            out[i] = x[i]


@njit(**JIT_INNER)
def gated_block_half(gate, up, out, code):
    """out[:] = round(act(gate[:]) * up[:]), one rounding (gated_block's branches)."""
    wide_loops()
    n = gate.shape[0]
    if code == ACT_SILU:
        for i in range(n):
            out[i] = round_to(silu(widen(gate[i])) * widen(up[i]), out)
    elif code == ACT_GELU:
        for i in range(n):
            out[i] = round_to(gelu(widen(gate[i])) * widen(up[i]), out)
    elif code == ACT_GELU_TANH:
        for i in range(n):
            out[i] = round_to(gelu_tanh(widen(gate[i])) * widen(up[i]), out)
    else:
        for i in range(n):
            out[i] = round_to(relu(widen(gate[i])) * widen(up[i]), out)


@njit(**JIT_INNER)
def activation_block_half_lit(x, out, code):
    """activation_block_half for a literal code (the parallel worker's; see activation_block_lit)."""
    wide_loops()
    for i in range(x.shape[0]):
        out[i] = round_to(activate_lit(widen(x[i]), code), out)


@njit(**JIT_INNER)
def gated_block_half_lit(gate, up, out, code):
    """gated_block_half for a literal code in GATED_CODES or ACT_RELU."""
    wide_loops()
    for i in range(gate.shape[0]):
        out[i] = round_to(activate_lit(widen(gate[i]), code) * widen(up[i]), out)


@njit(**JIT)
def activation_half_serial(x, out, code):
    activation_block_half(x, out, code)


@njit(**JIT)
def gated_half_serial(gate, up, out, code):
    gated_block_half(gate, up, out, code)


