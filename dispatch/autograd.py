"""Differentiable versions of the ops, for PyTorch tensors: ``dispatch.autograd.<op>``.

    import torch, dispatch.autograd as nka
    h = nka.linear(x, w1, b1, activation="gelu")          # w1.requires_grad: w1.grad after backward
    loss = nka.cross_entropy(nka.linear(nka.rms_norm(h, g), w2), targets)
    loss.backward()                                       # our backward kernels

Same names and signatures as the plain ops.  Each forward and each backward is a
`torch.library.custom_op` in the ``nk`` namespace (``torch.ops.nk.softmax``,
``torch.ops.nk.softmax_backward``, ...) with a fake (meta) implementation and a registered
autograd formula, so `torch.compile` sees opaque ops instead of breaking the graph; in
eager mode the same forward, context and backward functions run through a
torch.autograd.Function, which costs far less per call than the custom-op machinery (see
_Op).  The forward ops call the plain `dispatch` ops on the tensors' memory (numpy views
made once per call by _Op.eager, no copies; CUDA tensors through dispatch.interop); the
backward ops call the registered backward ops (``dispatch.softmax_backward``,
``dispatch.layer_norm_backward``, ...), which the tests, the report and asv cover like any
op.

What each op saves for its backward (its memory cost):
  softmax / log_softmax   the output y
  cross_entropy           the gradient of the loss w.r.t. the logits, computed in the
                          forward's own sweep (no probability matrix is stored besides it;
                          backward scales it by the incoming gradient)
  layer_norm / rms_norm   the normalized input (h = x + residual when fused); the row
                          statistics are recomputed in the backward pass
  activations             the input(s)
  rope                    nothing but cos and sin (the backward is the inverse rotation)
  matmul / linear         the inputs, and with an activation the pre-activation product
                          (the forward then runs the GEMM with its bias epilogue and the
                          activation as a second pass, as PyTorch does; without autograd the
                          plain op's fused epilogue is used); the backward GEMMs apply the
                          activation's derivative while packing the incoming gradient
  attention               the output and the rows' log-sum-exp (O(S) beyond the output)
  linear_cross_entropy    dx, dweight and dbias, computed in the forward in chunks of rows
                          (the (T, V) logits never exist at once)

This module imports torch (an optional extra: ``pip install .[torch]``); ``import
dispatch`` does not import it.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

import dispatch
from dispatch import interop

_NS = "nk"
_HALF = (torch.bfloat16, torch.float16)   # 16-bit tensors: float32 backward kernels on widened values
_ACT_BACKWARD = {"relu": ("relu_backward", {}), "silu": ("silu_backward", {}),
                 "gelu": ("gelu_backward", {"approximate": "none"}),
                 "gelu_tanh": ("gelu_backward", {"approximate": "tanh"})}


class _Op:
    """One forward or backward op, two ways in.

    Under torch.compile it is the custom op nk::<name> (with its fake implementation and
    registered autograd formula), which the compiler traces as one opaque node.  In eager
    mode the custom-op machinery costs about 30 us per call and about 250 us per forward +
    backward of a differentiable op (measured 2026-11-25: layer_norm (4, 8) fwd+bwd 332 us
    through custom ops, 111 us for PyTorch's own), which at a model's shapes is most of the
    time: there the same functions run through a torch.autograd.Function (forward,
    setup_context and backward unchanged) or, with no gradient to record, directly."""

    def __init__(self, name, fn, fake):
        self.name, self.raw = name, fn
        self.custom = torch.library.custom_op(f"{_NS}::{name}", mutates_args=())(fn)
        self.custom.register_fake(fake)
        self.function = None

    def eager(self, args):
        """raw on args outside torch.compile: on numpy views of CPU tensors, made once here
        and turned back into tensors once (dispatch's own conversion of tensor arguments
        then has nothing to do); other tensors (CUDA, bfloat16, float16) go to raw as they are."""
        arrays = _host_arrays(args)
        if arrays is None:
            return self.raw(*args)
        return _tensors(self.raw(*arrays))

    def register_autograd(self, backward, *, setup_context):
        self.custom.register_autograd(backward, setup_context=setup_context)
        eager = self.eager

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                # unused outputs' gradients arrive as None (cross_entropy's second output is
                # logits-sized: no zeros of that size are made), except the first, main output's
                ctx.set_materialize_grads(False)
                output = eager(inputs)
                setup_context(ctx, inputs, output)
                main = output[0] if isinstance(output, tuple) else output
                ctx.main_meta = (main.shape, main.dtype, main.device)   # not the tensor: kept alive otherwise
                return output

            @staticmethod
            def backward(ctx, *grads):
                if grads[0] is None:
                    shape, dtype, device = ctx.main_meta
                    grads = (torch.zeros(shape, dtype=dtype, device=device), *grads[1:])
                return backward(ctx, *grads)

        Function.__name__ = Function.__qualname__ = f"nk_{self.name}"
        self.function = Function

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.custom(*args)
        if self.function is not None and torch.is_grad_enabled():
            for a in args:
                if isinstance(a, Tensor) and a.requires_grad:
                    return self.function.apply(*args)
        return self.eager(args)


def _op(name, fake):
    """Decorator: the function becomes the op nk::name (see _Op) with `fake` as its meta
    implementation (shapes and dtypes only, for torch.compile and meta tensors)."""
    return lambda fn: _Op(name, fn, fake)


def _like(x, *_a, **_k):
    return torch.empty_like(x)


# the arrays _absent hands out, by dtype: _tensors knows them by identity
_ABSENT = {}


def _absent(like):
    """Placeholder output for one that does not exist (custom ops cannot return None): an
    empty tensor, turned back into None by `_given`.  Under _Op.eager (like an array) it is
    one shared empty array per dtype, which _tensors turns into None itself: an output
    tensor costs torch.autograd.Function about 2 us more than a None (a Function with 5
    inputs, forward + backward, 46.7 against 44.8 us, Zen 4, 2026-12-05)."""
    if isinstance(like, np.ndarray):
        a = _ABSENT.get(like.dtype)
        if a is None:
            a = _ABSENT.setdefault(like.dtype, np.empty(0, like.dtype))
        return a
    return like.new_empty((0,))


def _host_arrays(args):
    """args with every tensor replaced by its numpy view (no copy), or None when one is not
    a CPU tensor of a numpy dtype: dispatch.interop's general conversion then does it.
    Not interop.from_torch / back here: with them layer_norm forward + backward through
    this module took 1.08-1.10x this path's time at 4x8 and 512x768 (one process,
    interleaved, paired medians; Zen 3 VM, 2026-12-02), also with interop's per-tensor
    steps folded into one numpy(force=True)."""
    out = list(args)
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            if not a.is_cpu or a.dtype in _HALF:   # (the 16-bit backward widens tensors: _widened)
                return None
            out[i] = a.numpy(force=True)   # detached; conj / neg views resolved (copied)
    return out


def _tensors(result):
    """An op's arrays (alone or in a tuple) as tensors over the same memory: a writeable
    float array, or a tuple of them, straight through torch.from_numpy (the ops' results
    are such arrays), _absent's arrays as None; anything else through dispatch.interop.
    The direct path took 1.5 us for three arrays where interop's general walk took 4.0
    (4x8 float32, Zen 4, 2026-12-04)."""
    if type(result) is tuple:
        out = []
        for r in result:
            if type(r) is not np.ndarray or r.dtype.kind != "f":
                break
            if r.size == 0 and r is _ABSENT.get(r.dtype):
                out.append(None)
            elif r.flags.writeable:
                out.append(torch.from_numpy(r))
            else:
                break
        else:
            return tuple(out)
    elif type(result) is np.ndarray and result.dtype.kind == "f" and result.flags.writeable:
        return torch.from_numpy(result)
    return interop.to_torch(torch, result)


def _half_of(a):
    """a's dtype when a is a bfloat16 / float16 tensor, else None.  The raw functions get
    numpy arrays in eager mode: `array.dtype in _HALF` asks numpy to compare its dtype with
    torch's (0.65 us of Python in numpy's ctypes check, a call)."""
    return a.dtype if isinstance(a, Tensor) and a.dtype in _HALF else None


def _given(t):
    return t if t is not None and t.numel() else None


def _widened(backward, *args):
    """backward(*args); with bfloat16 / float16 tensors (PyTorch's 16-bit softmax and
    activations) the float32 backward kernels run on the widened (exact) values and each
    gradient is rounded once to that 16-bit dtype."""
    half = next((a.dtype for a in args if isinstance(a, Tensor) and a.dtype in _HALF), None)
    if half is None:
        return backward(*args)
    out = backward(*(a.float() if isinstance(a, Tensor) and a.dtype in _HALF else a for a in args))
    return tuple(o.to(half) for o in out) if isinstance(out, tuple) else out.to(half)


# ---- softmax, log_softmax ----------------------------------------------------------------

@_op("softmax", _like)
def _softmax(x: Tensor, axis: int) -> Tensor:
    return dispatch.softmax(x, axis)


@_op("log_softmax", _like)
def _log_softmax(x: Tensor, axis: int) -> Tensor:
    return dispatch.log_softmax(x, axis)


@_op("softmax_backward", _like)
def _softmax_backward(grad_out: Tensor, y: Tensor, axis: int) -> Tensor:
    return _widened(dispatch.softmax_backward, grad_out, y, axis)


@_op("log_softmax_backward", _like)
def _log_softmax_backward(grad_out: Tensor, y: Tensor, axis: int) -> Tensor:
    return _widened(dispatch.log_softmax_backward, grad_out, y, axis)


def _save_output_axis(ctx, inputs, output):
    ctx.axis = inputs[1]
    ctx.save_for_backward(output)


_softmax.register_autograd(lambda ctx, g: (_softmax_backward(g, ctx.saved_tensors[0], ctx.axis), None),
                           setup_context=_save_output_axis)
_log_softmax.register_autograd(lambda ctx, g: (_log_softmax_backward(g, ctx.saved_tensors[0], ctx.axis), None),
                               setup_context=_save_output_axis)


def softmax(x, axis=-1):
    """dispatch.softmax, differentiable in x."""
    return _softmax(x, axis)


def log_softmax(x, axis=-1):
    """dispatch.log_softmax, differentiable in x."""
    return _log_softmax(x, axis)


# ---- cross_entropy: the gradient from the forward's own sweep ---------------------------------

def _ce_fake(logits, targets, reduction, ignore_index):
    n = logits.shape[0]
    loss = logits.new_empty((n,) if reduction == "none" else ())
    return loss, torch.empty_like(logits)


@_op("cross_entropy_with_grad", _ce_fake)
def _cross_entropy_with_grad(logits: Tensor, targets: Tensor, reduction: str,
                             ignore_index: int) -> tuple[Tensor, Tensor]:
    loss, grad = dispatch.cross_entropy_with_grad(logits, targets, reduction=reduction,
                                                  ignore_index=ignore_index)
    return loss, grad


def _ce_setup(ctx, inputs, output):
    ctx.reduction = inputs[2]
    ctx.save_for_backward(output[1])


def _ce_backward(ctx, g_loss, _g_grad):
    (grad,) = ctx.saved_tensors
    # grad is d(loss)/d(logits) for an incoming gradient of 1 (per row for "none")
    scale = g_loss.unsqueeze(-1) if ctx.reduction == "none" else g_loss
    return grad * scale, None, None, None


_cross_entropy_with_grad.register_autograd(_ce_backward, setup_context=_ce_setup)


def cross_entropy(logits, targets, *, reduction="mean", ignore_index=-100):
    """dispatch.cross_entropy, differentiable in logits.  Under autograd the gradient is
    computed in the forward's sweep over each row and kept (logits' size) until backward."""
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return dispatch.cross_entropy(logits, targets, reduction=reduction, ignore_index=ignore_index)
    loss, _ = _cross_entropy_with_grad(logits, targets, reduction, ignore_index)
    return loss


# ---- layer_norm, rms_norm ---------------------------------------------------------------------

def _norm_fake(x, weight, bias, residual, eps):
    return torch.empty_like(x), torch.empty_like(x)


@_op("layer_norm", _norm_fake)
def _layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], residual: Optional[Tensor],
                eps: float) -> tuple[Tensor, Tensor]:
    if residual is None:
        y = dispatch.layer_norm(x, weight, bias, eps=eps)
        return y, _absent(x)
    return dispatch.layer_norm(x, weight, bias, eps=eps, residual=residual)


@_op("rms_norm", lambda x, weight, residual, eps: (torch.empty_like(x), torch.empty_like(x)))
def _rms_norm(x: Tensor, weight: Optional[Tensor], residual: Optional[Tensor],
              eps: float) -> tuple[Tensor, Tensor]:
    if residual is None:
        y = dispatch.rms_norm(x, weight, eps=eps)
        return y, _absent(x)
    return dispatch.rms_norm(x, weight, eps=eps, residual=residual)


def _ln_bwd_fake(grad_out, x, weight, bias, grad_residual, eps):
    return (torch.empty_like(x), _absent(x) if weight is None else torch.empty_like(weight),
            _absent(x) if bias is None else torch.empty_like(bias))


def _norm_backward_of(backward, grad_out, x, params, grad_residual, eps):
    """backward(grad_out, x, *params, eps=, grad_residual=) -> (dx, *dparams); for bfloat16 /
    float16 x (PyTorch's 16-bit norms) the float32 kernels run on the widened (exact) tensors
    and each gradient is rounded once to its input's dtype (a float32 weight's stays float32)."""
    if _half_of(x) is None:
        return backward(grad_out, x, *params, eps=eps, grad_residual=grad_residual)

    def wide(t):
        return None if t is None else t.float()

    grads = backward(wide(grad_out), wide(x), *(wide(p) for p in params), eps=eps,
                     grad_residual=wide(grad_residual))
    return tuple(None if g is None else g.to(like.dtype) for g, like in zip(grads, (x, *params)))


@_op("layer_norm_backward", _ln_bwd_fake)
def _layer_norm_backward(grad_out: Tensor, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                         grad_residual: Optional[Tensor],
                         eps: float) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = _norm_backward_of(dispatch.layer_norm_backward, grad_out, x, (weight, bias), grad_residual, eps)
    return dx, _absent(x) if dw is None else dw, _absent(x) if db is None else db


@_op("rms_norm_backward", lambda grad_out, x, weight, grad_residual, eps: (
    torch.empty_like(x), _absent(x) if weight is None else torch.empty_like(weight)))
def _rms_norm_backward(grad_out: Tensor, x: Tensor, weight: Optional[Tensor], grad_residual: Optional[Tensor],
                       eps: float) -> tuple[Tensor, Tensor]:
    dx, dw = _norm_backward_of(dispatch.rms_norm_backward, grad_out, x, (weight,), grad_residual, eps)
    return dx, _absent(x) if dw is None else dw


def _norm_setup(ctx, inputs, output):
    x, residual, eps = inputs[0], inputs[-2], inputs[-1]
    ctx.eps = eps
    ctx.fused = residual is not None
    ctx.params = inputs[1:-2]               # (weight, bias) or (weight,)
    ctx.save_for_backward(output[1] if ctx.fused else x, *ctx.params)


def _norm_grads(ctx, g_y, g_h, backward):
    h, *params = ctx.saved_tensors
    params = [p if p is not None and p.numel() else None for p in params]
    g_res = g_h if ctx.fused and g_h is not None and g_h.numel() else None
    grads = backward(g_y, h, *params, g_res, ctx.eps)
    dx, dparams = grads[0], [_given(d) for d in grads[1:]]
    return (dx, *dparams, dx if ctx.fused else None, None)


_layer_norm.register_autograd(lambda ctx, g_y, g_h: _norm_grads(ctx, g_y, g_h, _layer_norm_backward),
                              setup_context=_norm_setup)
_rms_norm.register_autograd(lambda ctx, g_y, g_h: _norm_grads(ctx, g_y, g_h, _rms_norm_backward),
                            setup_context=_norm_setup)


def layer_norm(x, weight=None, bias=None, *, eps=1e-5, residual=None):
    """dispatch.layer_norm, differentiable in x, weight, bias and residual; returns y, or
    (y, h) with a residual, as the plain op."""
    y, h = _layer_norm(x, weight, bias, residual, float(eps))
    return y if residual is None else (y, h)


def rms_norm(x, weight=None, *, eps=1e-6, residual=None):
    """dispatch.rms_norm, differentiable in x, weight and residual."""
    y, h = _rms_norm(x, weight, residual, float(eps))
    return y if residual is None else (y, h)


# ---- activations ----------------------------------------------------------------------------

@_op("relu", _like)
def _relu(x: Tensor) -> Tensor:
    return dispatch.relu(x)


@_op("silu", _like)
def _silu(x: Tensor) -> Tensor:
    return dispatch.silu(x)


@_op("gelu", _like)
def _gelu(x: Tensor, approximate: str) -> Tensor:
    return dispatch.gelu(x, approximate)


@_op("relu_backward", _like)
def _relu_backward(grad_out: Tensor, x: Tensor) -> Tensor:
    return _widened(dispatch.relu_backward, grad_out, x)


@_op("silu_backward", _like)
def _silu_backward(grad_out: Tensor, x: Tensor) -> Tensor:
    return _widened(dispatch.silu_backward, grad_out, x)


@_op("gelu_backward", _like)
def _gelu_backward(grad_out: Tensor, x: Tensor, approximate: str) -> Tensor:
    return _widened(dispatch.gelu_backward, grad_out, x, approximate)


def _save_inputs(ctx, inputs, output):
    ctx.opts = [a for a in inputs if not isinstance(a, Tensor)]
    ctx.save_for_backward(*[a for a in inputs if isinstance(a, Tensor)])


_relu.register_autograd(lambda ctx, g: _relu_backward(g, *ctx.saved_tensors), setup_context=_save_inputs)
_silu.register_autograd(lambda ctx, g: _silu_backward(g, *ctx.saved_tensors), setup_context=_save_inputs)
_gelu.register_autograd(lambda ctx, g: (_gelu_backward(g, *ctx.saved_tensors, *ctx.opts), None),
                        setup_context=_save_inputs)


def relu(x):
    """dispatch.relu, differentiable (gradient 0 where x <= 0, as PyTorch)."""
    return _relu(x)


def silu(x):
    """dispatch.silu, differentiable."""
    return _silu(x)


def gelu(x, approximate="none"):
    """dispatch.gelu (both forms), differentiable."""
    return _gelu(x, approximate)


def _pair_fake(grad_out, gate, up, *opts):
    return torch.empty_like(gate), torch.empty_like(up)


@_op("swiglu", lambda gate, up: torch.empty_like(gate))
def _swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return dispatch.swiglu(gate, up)


@_op("geglu", lambda gate, up, approximate: torch.empty_like(gate))
def _geglu(gate: Tensor, up: Tensor, approximate: str) -> Tensor:
    return dispatch.geglu(gate, up, approximate)


@_op("swiglu_backward", _pair_fake)
def _swiglu_backward(grad_out: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    dg, du = _widened(dispatch.swiglu_backward, grad_out, gate, up)
    return dg, du


@_op("geglu_backward", _pair_fake)
def _geglu_backward(grad_out: Tensor, gate: Tensor, up: Tensor, approximate: str) -> tuple[Tensor, Tensor]:
    dg, du = _widened(dispatch.geglu_backward, grad_out, gate, up, approximate)
    return dg, du


_swiglu.register_autograd(lambda ctx, g: _swiglu_backward(g, *ctx.saved_tensors), setup_context=_save_inputs)
_geglu.register_autograd(lambda ctx, g: (*_geglu_backward(g, *ctx.saved_tensors, *ctx.opts), None),
                         setup_context=_save_inputs)


def swiglu(gate, up):
    """dispatch.swiglu (silu(gate) * up), differentiable in gate and up."""
    return _swiglu(gate, up)


def geglu(gate, up, approximate="none"):
    """dispatch.geglu (gelu(gate) * up), differentiable in gate and up."""
    return _geglu(gate, up, approximate)


# ---- rope -------------------------------------------------------------------------------------

@_op("rope", lambda x, cos, sin, interleaved: torch.empty_like(x))
def _rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    return dispatch.rope(x, cos, sin, interleaved=interleaved)


@_op("rope_backward", lambda grad_out, cos, sin, interleaved: torch.empty_like(grad_out))
def _rope_backward(grad_out: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    return _widened(lambda g, c, s: dispatch.rope_backward(g, c, s, interleaved=interleaved), grad_out, cos, sin)


def _rope_setup(ctx, inputs, output):
    ctx.interleaved = inputs[3]
    ctx.save_for_backward(inputs[1], inputs[2])


_rope.register_autograd(lambda ctx, g: (_rope_backward(g, *ctx.saved_tensors, ctx.interleaved), None, None, None),
                        setup_context=_rope_setup)


def rope(x, cos, sin, *, interleaved=False):
    """dispatch.rope, differentiable in x (cos and sin are tables, not trained)."""
    return _rope(x, cos, sin, bool(interleaved))


# ---- matmul, linear ---------------------------------------------------------------------------

def _act(activation, pre):
    """The activation applied to the kept pre-activation (its own elementwise op).  A
    16-bit pre-activation (linear with bfloat16 activations) goes through the float32
    kernel and is rounded back, as PyTorch's 16-bit activation does."""
    if _half_of(pre) is not None:
        return _act(activation, pre.float()).to(pre.dtype)
    if activation == "gelu_tanh":
        return dispatch.gelu(pre, "tanh")
    return getattr(dispatch, activation)(pre)


def _product_fake(a, b, bias, activation, shape):
    pre = a.new_empty(shape) if activation is not None else _absent(a)
    return a.new_empty(shape), pre


@_op("linear", lambda x, weight, bias, activation: _product_fake(
    x, weight, bias, activation, (*x.shape[:-1], weight.shape[0])))
def _linear(x: Tensor, weight: Tensor, bias: Optional[Tensor],
            activation: Optional[str]) -> tuple[Tensor, Tensor]:
    if activation is None:
        return dispatch.linear(x, weight, bias), _absent(x)
    pre = dispatch.linear(x, weight, bias)
    return _act(activation, pre), pre


def _matmul_shape(a, b):
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return (*batch, a.shape[-2], b.shape[-1])


@_op("matmul", lambda a, b, bias, activation: _product_fake(a, b, bias, activation, _matmul_shape(a, b)))
def _matmul(a: Tensor, b: Tensor, bias: Optional[Tensor], activation: Optional[str]) -> tuple[Tensor, Tensor]:
    if activation is None:
        return dispatch.matmul(a, b, bias=bias), _absent(a)
    pre = dispatch.matmul(a, b, bias=bias)
    return _act(activation, pre), pre


def _product_bwd_fake(grad_out, a, b, pre, activation, has_bias):
    n = b.shape[0] if b.dim() == 2 and grad_out.shape[-1] == b.shape[0] else b.shape[-1]
    return torch.empty_like(a), torch.empty_like(b), grad_out.new_empty((n,)) if has_bias else _absent(a)


@_op("linear_backward", _product_bwd_fake)
def _linear_backward(grad_out: Tensor, x: Tensor, weight: Tensor, pre: Tensor, activation: Optional[str],
                     has_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    half = _half_of(grad_out)
    if half is not None:
        # 16-bit training: the float32 backward kernels on the widened (exact) tensors, the
        # gradients rounded to x's dtype once (PyTorch's 16-bit linear also sums in float32)
        grad_out, x, weight, pre = grad_out.float(), x.float(), weight.float(), pre.float()
    dx, dw, db = dispatch.linear_backward(grad_out, x, weight, pre if activation is not None else None,
                                          activation=activation, has_bias=has_bias)
    if half is not None:
        dx, dw, db = dx.to(half), dw.to(half), None if db is None else db.to(half)
    return dx, dw, _absent(x) if db is None else db


@_op("matmul_backward", _product_bwd_fake)
def _matmul_backward(grad_out: Tensor, a: Tensor, b: Tensor, pre: Tensor, activation: Optional[str],
                     has_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    half = _half_of(grad_out)
    if half is not None:   # as _linear_backward: float32 kernels on the widened tensors, rounded once
        grad_out, a, b, pre = grad_out.float(), a.float(), b.float(), pre.float()
    da, db_, dbias = dispatch.matmul_backward(grad_out, a, b, pre if activation is not None else None,
                                              activation=activation, has_bias=has_bias)
    if half is not None:
        da, db_, dbias = da.to(half), db_.to(half), None if dbias is None else dbias.to(half)
    return da, db_, _absent(a) if dbias is None else dbias


def _product_setup(ctx, inputs, output):
    a, b, bias, activation = inputs
    ctx.activation, ctx.has_bias = activation, bias is not None
    ctx.save_for_backward(a, b, output[1])


def _product_grads(backward):
    def grads(ctx, g_y, _g_pre):
        a, b, pre = ctx.saved_tensors
        da, db, dbias = backward(g_y, a, b, pre, ctx.activation, ctx.has_bias)
        return da, db, _given(dbias), None
    return grads


_linear.register_autograd(_product_grads(_linear_backward), setup_context=_product_setup)
_matmul.register_autograd(_product_grads(_matmul_backward), setup_context=_product_setup)


def _check_activation(activation):
    if activation is not None and activation not in _ACT_BACKWARD:
        raise ValueError(f"activation must be one of {sorted(_ACT_BACKWARD)} or None, got {activation!r}")


def _tracking(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(x, weight, bias=None, *, activation=None):
    """dispatch.linear (x @ weight.T + bias, then the activation), differentiable in x,
    weight and bias.  The backward is dispatch.linear_backward: the activation's derivative
    is applied to the incoming gradient inside the backward GEMMs' packing (no separate
    elementwise pass), dbias from the same packed panels.  bfloat16 / float16 tensors (x,
    weight and bias all of one, as PyTorch's 16-bit linear): the backward runs in float32 on
    the widened tensors and rounds the gradients to that dtype."""
    _check_activation(activation)
    if not _tracking(x, weight, bias):
        return dispatch.linear(x, weight, bias, activation=activation)
    return _linear(x, weight, bias, activation)[0]


def matmul(a, b, *, bias=None, activation=None):
    """dispatch.matmul (a @ b with broadcast batch dims, + bias, then the activation),
    differentiable in a, b and bias (dispatch.matmul_backward; a broadcast operand's
    gradient is summed over the batch dims it was broadcast along, as PyTorch)."""
    _check_activation(activation)
    if not _tracking(a, b, bias):
        return dispatch.matmul(a, b, bias=bias, activation=activation)
    return _matmul(a, b, bias, activation)[0]


# ---- attention ----------------------------------------------------------------------------------

def _attn_fake(q, k, v, mask, causal, scale):
    # a 16-bit attention's log-sum-exp is float32 on the CPU (dispatch/ops/attention.py)
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32 if q.dtype in _HALF and q.is_cpu
                                            else None)


@_op("attention", _attn_fake)
def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool,
               scale: Optional[float]) -> tuple[Tensor, Tensor]:
    out, lse = dispatch.attention(q, k, v, causal=causal, mask=mask, scale=scale, return_lse=True)
    return out, lse


@_op("attention_backward", lambda grad_out, q, k, v, out, lse, mask, causal, scale: (
    torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)))
def _attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        mask: Optional[Tensor], causal: bool, scale: Optional[float]) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = _widened(lambda g, q, k, v, o, m: dispatch.attention_backward(g, q, k, v, o, lse, causal=causal,
                                                                               mask=m, scale=scale),
                          grad_out, q, k, v, out, mask)
    return dq, dk, dv


def _attn_setup(ctx, inputs, output):
    q, k, v, mask, causal, scale = inputs
    ctx.causal, ctx.scale = causal, scale
    ctx.save_for_backward(q, k, v, mask, *output)


def _attn_grads(ctx, g_out, _g_lse):
    q, k, v, mask, out, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward(g_out.contiguous(), q, k, v, out, lse, mask, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None


_attention.register_autograd(_attn_grads, setup_context=_attn_setup)


def attention(q, k, v, *, causal=False, mask=None, scale=None):
    """dispatch.attention, differentiable in q, k and v (not the mask).  The forward keeps
    its output and the rows' log-sum-exp (B, Hq, Sq); the backward
    (dispatch.attention_backward) recomputes each tile's probabilities from them, never
    the (Sq, Skv) matrix, and sums dK, dV over the query heads of a GQA group."""
    if not _tracking(q, k, v):
        return dispatch.attention(q, k, v, causal=causal, mask=mask, scale=scale)
    return _attention(q, k, v, mask, bool(causal), None if scale is None else float(scale))[0]


# ---- linear_cross_entropy -----------------------------------------------------------------------

def _lce_grad_fake(x, weight, targets, bias, reduction, ignore_index):
    return (x.new_empty(()), torch.empty_like(x), torch.empty_like(weight),
            _absent(x) if bias is None else torch.empty_like(bias))


@_op("linear_cross_entropy_with_grad", _lce_grad_fake)
def _lce_with_grad(x: Tensor, weight: Tensor, targets: Tensor, bias: Optional[Tensor], reduction: str,
                   ignore_index: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    loss, dx, dw, db = dispatch.linear_cross_entropy_with_grad(x, weight, targets, bias, reduction=reduction,
                                                               ignore_index=ignore_index)
    return loss, dx, dw, _absent(x) if db is None else db


def _lce_grad_setup(ctx, inputs, output):
    ctx.save_for_backward(*output[1:])


def _lce_grad_backward(ctx, g_loss, *_unused):
    dx, dw, db = ctx.saved_tensors
    return dx * g_loss, dw * g_loss, None, _given(db) * g_loss if _given(db) is not None else None, None, None


_lce_with_grad.register_autograd(_lce_grad_backward, setup_context=_lce_grad_setup)


@_op("linear_cross_entropy", lambda x, weight, targets, bias, ignore_index: x.new_empty((x.shape[0],)))
def _lce_per_row(x: Tensor, weight: Tensor, targets: Tensor, bias: Optional[Tensor], ignore_index: int) -> Tensor:
    return dispatch.linear_cross_entropy(x, weight, targets, bias, reduction="none", ignore_index=ignore_index)


@_op("linear_cross_entropy_backward", lambda g, x, weight, targets, bias, ignore_index: (
    torch.empty_like(x), torch.empty_like(weight), _absent(x) if bias is None else torch.empty_like(bias)))
def _lce_per_row_backward(g: Tensor, x: Tensor, weight: Tensor, targets: Tensor, bias: Optional[Tensor],
                          ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
    from .ops.linear_cross_entropy import backward_per_row
    conv = interop.from_torch((g, x, weight, targets, bias), {})   # tensors under torch.compile
    dx, dw, db = backward_per_row(*conv.args, ignore_index=ignore_index)
    return conv.back((dx, dw, _absent(conv.args[1]) if db is None else db))


def _lce_row_setup(ctx, inputs, output):
    x, weight, targets, bias, ignore_index = inputs
    ctx.ignore_index = ignore_index
    ctx.save_for_backward(x, weight, targets, bias)


def _lce_row_backward(ctx, g):
    x, weight, targets, bias = ctx.saved_tensors
    dx, dw, db = _lce_per_row_backward(g, x, weight, targets, bias, ctx.ignore_index)
    return dx, dw, None, _given(db), None


_lce_per_row.register_autograd(_lce_row_backward, setup_context=_lce_row_setup)


def linear_cross_entropy(x, weight, targets, bias=None, *, reduction="mean", ignore_index=-100):
    """dispatch.linear_cross_entropy, differentiable in x, weight and bias.  "mean" and
    "sum": the gradients are computed in the forward's chunked sweep and kept (x's, the
    weight's and the bias's sizes) until backward scales them; "none": the backward pass
    recomputes each chunk's logits."""
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return dispatch.linear_cross_entropy(x, weight, targets, bias, reduction=reduction,
                                             ignore_index=ignore_index)
    if reduction == "none":
        return _lce_per_row(x, weight, targets, bias, int(ignore_index))
    return _lce_with_grad(x, weight, targets, bias, reduction, int(ignore_index))[0]
