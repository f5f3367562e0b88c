"""Public causal_conv1d and causal_conv1d_update: the depthwise causal convolution of a
Mamba block and its decode step, with the semantics of the causal-conv1d package
(Dao-AILab, causal_conv1d_fn / causal_conv1d_update).

    causal_conv1d(x, weight, bias=None, *, activation=None, initial_state=None,
                  return_final_state=False, out=None)
        x (batch, dim, L), weight (dim, W), bias (dim,):
        y[b, d, t] = act(bias[d] + sum_k weight[d, k] * x[b, d, t - (W - 1) + k])
        where x at negative times is initial_state (batch, dim, W - 1), zeros when None.
        Returns y (batch, dim, L), or (y, final_state) with final_state (batch, dim, W - 1)
        the last W - 1 inputs (taken from initial_state / zeros where L < W - 1).

    causal_conv1d_update(conv_state, x, weight, bias=None, *, activation=None, out=None)
        conv_state (batch, dim, state_len) with state_len >= W - 1 (the package's current
        convention; mamba-ssm's own step allocates state_len = W, and causal_conv1d's
        final_state, state_len = W - 1, continues a prefill directly); x (batch, dim) or
        (batch, dim, seqlen).  The window of each output is the state's last W - 1 values
        followed by x; conv_state is then shifted left by seqlen with x appended, in place.
        Returns y of x's shape.  Unlike the package, conv_state comes first (as
        selective_state_update's state).

activation: None, "silu" or "swish" (the same).  float32 or float64 on the CPU, also
float16 on CUDA (computed in float32); every argument of one dtype, conv_state included.
Stepping causal_conv1d_update over x[..., t] from causal_conv1d's final_state of a prefix
gives causal_conv1d's outputs of the whole sequence, and its final state.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACT_NONE, ACT_SILU, FLOPS_PER_ELEMENT
from kernels_cpu import causal_conv as K
from kernels_cpu.parallel import num_threads

from .. import validate as V
from ..registry import Call, Implementation, Op, bucket, register, register_op
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, serial_parallel_rule, size_bucket
from .conv import _synthesize
from .linalg import _zeros

ACTIVATIONS = {None: ACT_NONE, "silu": ACT_SILU, "swish": ACT_SILU}

# Serial below these output element counts (bucketed).  Measured 2026-11-23 (AMD znver3, 2
# cores, a host loaded by other jobs; cpu-serial vs cpu-parallel, medians of 7 alternating
# rounds back to back, and of 7 single calls after 0.2 s idle; float32, W 4, SiLU):
# causal_conv1d on (1, dim, L): 2^16 136 / 163 us, 2^18 618 / 450 us, Mamba-130M's 2^20.6
# 1573 / 866 us back to back, parallel behind after idle up to 2^20.6 and ahead at 2^22
# (8.4 / 4.4 ms).  causal_conv1d_update on (batch, dim) steps, state 4: 2^12 77 / 104 us,
# 2^14 158 / 153, 2^14.6 213 / 184, 2^16 473 / 347 back to back, behind after idle up to
# 2^18.
PARALLEL_THRESHOLD = {"causal_conv1d": 1 << 18, "causal_conv1d_update": 1 << 14}
_MEASURED = {"causal_conv1d": "parallel ahead back to back from 2^18 output elements (measured, 2 cores)",
             "causal_conv1d_update": "parallel even at 2^14 rows, ahead from 2^14.6 back to back (measured, 2 cores)"}

_KERNELS = ("kernels_cpu.causal_conv", "kernels_cpu.approx", "kernels_cpu.parallel")

# Example inputs for warmup and the contract tests (dispatch/examples.py): odd dims and
# lengths, W 4 with and without an initial state, a length shorter than W - 1; the update
# with mamba-ssm's state_len = W, a (batch, dim) step and a 3-step (batch, dim, 3) one.
EXAMPLE_SHAPES = {
    "causal_conv1d": {
        "small": {"x": (2, 5, 7), "weight": (5, 4), "bias": (5,)},
        "large": {"x": (2, 40, 1000), "weight": (40, 4), "bias": (40,), "initial_state": (2, 40, 3)},
        "decode": {"x": (1, 9, 2), "weight": (9, 4), "bias": (9,), "initial_state": (1, 9, 3)},
    },
    "causal_conv1d_update": {
        "small": {"conv_state": (2, 5, 4), "x": (2, 5), "weight": (5, 4), "bias": (5,)},
        "large": {"conv_state": (4, 2000, 4), "x": (4, 2000), "weight": (2000, 4), "bias": (2000,)},
        "decode": {"conv_state": (1, 9, 3), "x": (1, 9, 3), "weight": (9, 4), "bias": (9,)},
    },
}


class CausalConvKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int           # bucket of the output's element count batch * dim * L
    rows: int           # bucket of batch * dim
    width: int          # W
    code: int           # kernels_common.activation.ACT_NONE / ACT_SILU
    has_bias: bool
    has_state: bool     # initial_state given
    final: bool         # return_final_state


class CausalConvArgs(NamedTuple):
    x: object               # (batch, dim, L)
    weight: object          # (dim, W)
    bias: object            # (dim,) or None
    initial_state: object   # (batch, dim, W - 1) or None
    code: int
    final: bool
    out: object


class CausalConvUpdateKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    size: int           # bucket of the output's element count batch * dim * seqlen
    rows: int           # bucket of batch * dim
    width: int          # W
    state_len: int      # bucket of state_len
    code: int
    has_bias: bool


class CausalConvUpdateArgs(NamedTuple):
    conv_state: object      # (batch, dim, state_len), updated in place
    x: object               # (batch, dim) or (batch, dim, seqlen)
    weight: object          # (dim, W)
    bias: object            # (dim,) or None
    code: int
    out: object


def _weights(x, weight, bias, dt, dim):
    """W after checking weight (dim, W) and bias (dim,) against x's dim."""
    V.same_dtype("weight", weight, "x", dt)
    V.rank("weight", weight, 2, " (dim, W)")
    if int(weight.shape[0]) != dim or int(weight.shape[1]) < 1:
        raise ValueError(f"weight must have shape (dim, W) with dim = {dim} (x's dimension 1) and W >= 1, "
                         f"got {tuple(weight.shape)}")
    if bias is not None:
        V.same_dtype("bias", bias, "x", dt)
        V.shape("bias", bias, (dim,), " (dim,)")
    return int(weight.shape[1])


def _activation(activation):
    V.choice("activation", activation, list(ACTIVATIONS))
    return ACTIVATIONS[activation]


def _describe(x, weight, bias=None, *, activation=None, initial_state=None, return_final_state=False, out=None):
    """Call.args = CausalConvArgs, key CausalConvKey."""
    V.required(x=x, weight=weight)
    dev = V.device_of(x=x, weight=weight, bias=bias, initial_state=initial_state, out=out)
    dt = V.float_dtype("x", x)
    V.rank("x", x, 3, " (batch, dim, L)")
    b, d, n = (int(s) for s in x.shape)
    w = _weights(x, weight, bias, dt, d)
    code = _activation(activation)
    final = V.flag("return_final_state", return_final_state)
    if initial_state is not None:
        V.same_dtype("initial_state", initial_state, "x", dt)
        V.shape("initial_state", initial_state, (b, d, w - 1), " (batch, dim, W - 1)")
    V.out(out, x.shape, dt, x=x, weight=weight, bias=bias, initial_state=initial_state)
    key = CausalConvKey("causal_conv1d", dev, dt, size_bucket(b, d, n), bucket(b * d), w, code, bias is not None,
                        initial_state is not None, final)
    return Call(key, CausalConvArgs(x, weight, bias, initial_state, code, final, out))


def _describe_update(conv_state, x, weight, bias=None, *, activation=None, out=None):
    """Call.args = CausalConvUpdateArgs, key CausalConvUpdateKey."""
    V.required(conv_state=conv_state, x=x, weight=weight)
    dev = V.device_of(conv_state=conv_state, x=x, weight=weight, bias=bias, out=out)
    dt = V.float_dtype("x", x)
    V.rank("x", x, (2, 3), " (batch, dim) or (batch, dim, seqlen)")
    b, d = int(x.shape[0]), int(x.shape[1])
    n = int(x.shape[2]) if x.ndim == 3 else 1
    w = _weights(x, weight, bias, dt, d)
    code = _activation(activation)
    V.rank("conv_state", conv_state, 3, " (batch, dim, state_len)")
    slen = int(conv_state.shape[2])
    if slen < w - 1:
        raise ValueError(f"conv_state must have state_len >= W - 1 = {w - 1} (its last dimension), "
                         f"got shape {tuple(conv_state.shape)}")
    V.updated("conv_state", conv_state, (b, d, slen), dt, x=x, weight=weight, bias=bias, out=out)
    V.out(out, x.shape, dt, x=x, weight=weight, bias=bias, conv_state=conv_state)
    key = CausalConvUpdateKey("causal_conv1d_update", dev, dt, size_bucket(b, d, n), bucket(b * d), w,
                              bucket(slen), code, bias is not None)
    return Call(key, CausalConvUpdateArgs(conv_state, x, weight, bias, code, out))


# ---- CPU ---------------------------------------------------------------------------------------

def _conv_host(parallel):
    def run(params, x, weight, bias, initial_state, code, final, out):
        dt = x.dtype
        b, d, n = x.shape
        h = weight.shape[1] - 1
        rows = b * d
        res = result_buffer(out, x.shape, dt)
        fin = np.empty((b, d, h), dt)
        # no initial state: the shared read-only zeros (as a missing bias), one kernel signature
        init = (_zeros(rows * h, dt) if initial_state is None else contiguous(initial_state)).reshape(rows, h)
        bvec = _zeros(d, dt) if bias is None else contiguous(bias)
        K.conv(contiguous(x).reshape(rows, n), contiguous(weight), bvec, init, res.reshape(rows, n),
               fin.reshape(rows, h), code, num_threads() if parallel else 1)
        y = deliver(res, out)
        return (y, fin) if final else y

    return run


def _update_host(parallel):
    kernel = K.update_parallel if parallel else K.update_serial

    def run(params, conv_state, x, weight, bias, code, out):
        dt = x.dtype
        b, d, slen = conv_state.shape
        rows = b * d
        n = x.shape[2] if x.ndim == 3 else 1
        res = result_buffer(out, x.shape, dt)
        state = contiguous(conv_state)  # the caller's memory unless conv_state is a strided view
        bvec = _zeros(d, dt) if bias is None else contiguous(bias)
        if rows:
            kernel(state.reshape(rows, slen), contiguous(x).reshape(rows, n), contiguous(weight), bvec,
                   res.reshape(rows, n), code)
            if not conv_state.flags.c_contiguous:
                conv_state[...] = state
        return deliver(res, out)

    return run


def _flops(call):
    """2W multiply-adds per output, the bias add, the activation."""
    a = call.args
    outs = int(np.prod(a.x.shape))
    return outs * (2 * int(a.weight.shape[1]) + (a.bias is not None) + FLOPS_PER_ELEMENT[a.code])


def _itemsize(a):
    return np.dtype(V.dtype_of(a)).itemsize


def _size(a):
    return 0 if a is None else int(np.prod(a.shape))


def _bytes(call):
    """x read and y written once, the weight and bias, the initial state read and the final
    state written when asked."""
    a = call.args
    b, d, _ = a.x.shape
    fin = b * d * (int(a.weight.shape[1]) - 1) if a.final else 0
    return (2 * _size(a.x) + _size(a.weight) + _size(a.bias) + _size(a.initial_state) + fin) * _itemsize(a.x)


def _bytes_update(call):
    """x read and y written, the state read and written back, the weight and bias."""
    a = call.args
    return (2 * _size(a.x) + 2 * _size(a.conv_state) + _size(a.weight) + _size(a.bias)) * _itemsize(a.x)


def _signature(i):
    return ((i["x"], i["weight"], i.get("bias")),
            {"activation": i.get("activation"), "initial_state": i.get("initial_state"),
             "return_final_state": i.get("return_final_state", False)})


def _signature_update(i):
    return (i["conv_state"], i["x"], i["weight"], i.get("bias")), {"activation": i.get("activation")}


_NOTES = {"causal_conv1d": "per (batch, dim) row one vector loop with the W taps unrolled (W <= 4; the first "
                           "W - 1 outputs read the state), then a SiLU pass; a worker called by address",
          "causal_conv1d_update": "per (batch, dim) row the step's taps over the state's tail and x, the state "
                                  "shifted in place, then one SiLU pass over the outputs"}


def _register(name, describe, signature, bytes_, host, updates=()):
    op = register_op(Op(name, describe, family="causal_conv", bound="memory", signature=signature, flops=_flops,
                        memo=True, bytes=bytes_, synthesize=_synthesize, updates=updates,
                        rules={"cpu": serial_parallel_rule("size", PARALLEL_THRESHOLD[name], _MEASURED[name])}))
    register(Implementation(name, "cpu-serial", "cpu", host(False), kernel_modules=_KERNELS,
                            notes=f"{_NOTES[name]}; {HOST_COPY_NOTE}"))
    register(Implementation(name, "cpu-parallel", "cpu", host(True), kernel_modules=_KERNELS,
                            notes=f"{_NOTES[name]}; blocks of rows over threads; {HOST_COPY_NOTE}"))
    return op


_causal_conv1d = _register("causal_conv1d", _describe, _signature, _bytes, _conv_host)
_causal_conv1d_update = _register("causal_conv1d_update", _describe_update, _signature_update, _bytes_update,
                                  _update_host, updates=("conv_state",))


@_causal_conv1d.expose
def causal_conv1d(x, weight, bias=None, *, activation=None, initial_state=None, return_final_state=False, out=None):
    """Depthwise causal 1-D convolution of x (batch, dim, L) with weight (dim, W):

        y[b, d, t] = act(bias[d] + sum_k weight[d, k] * x[b, d, t - (W - 1) + k])

    x before time 0 is initial_state (batch, dim, W - 1), zeros when None.  bias: (dim,) or
    None; activation: None, "silu" or "swish".  Returns y (batch, dim, L) (written to out=
    when given), or with return_final_state=True (y, final_state): final_state
    (batch, dim, W - 1) holds the last W - 1 inputs (from initial_state / zeros when
    L < W - 1), the conv_state to continue with causal_conv1d_update.  As the
    causal-conv1d package's causal_conv1d_fn (see the module docstring)."""
    return _causal_conv1d(x, weight, bias, activation=activation, initial_state=initial_state,
                          return_final_state=return_final_state, out=out)


@_causal_conv1d_update.expose
def causal_conv1d_update(conv_state, x, weight, bias=None, *, activation=None, out=None):
    """One decode step of causal_conv1d: x (batch, dim) or (batch, dim, seqlen) new inputs,
    conv_state (batch, dim, state_len >= W - 1) the previous inputs, updated in place
    (shifted left by seqlen, x appended).  Each output reads the state's last W - 1 values
    and x.  Returns y of x's shape (written to out= when given).  conv_state must have x's
    dtype and be writeable; a bad argument raises before conv_state is touched."""
    return _causal_conv1d_update(conv_state, x, weight, bias, activation=activation, out=out)
