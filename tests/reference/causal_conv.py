"""float64 numpy references for dispatch.{causal_conv1d, causal_conv1d_update}, same
signatures.

Written from the definition (the causal-conv1d package's causal_conv1d_ref /
causal_conv1d_update_ref): the input is preceded by its W - 1 earlier values (the state,
zeros by default) and each output is bias + the W-tap dot product ending at its own time
step, then SiLU if asked."""
import numpy as np

from tests.reference.activation import silu


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _conv(c, w, bias, n, activation):
    """The last n outputs of the valid convolution of c (batch, dim, n + W - 1)."""
    y = np.zeros(c.shape[:2] + (n,))
    for k in range(w.shape[1]):
        y += w[None, :, k, None] * c[..., k:k + n]
    if bias is not None:
        y += _f64(bias)[None, :, None]
    if activation is None:
        return y
    with np.errstate(over="ignore", invalid="ignore"):
        return silu(y)


def causal_conv1d(x, weight, bias=None, *, activation=None, initial_state=None, return_final_state=False,
                  out=None):
    x, w = _f64(x), _f64(weight)
    b, d, n = x.shape
    h = w.shape[1] - 1
    s = np.zeros((b, d, h)) if initial_state is None else _f64(initial_state)
    c = np.concatenate([s, x], axis=-1)
    y = _conv(c, w, bias, n, activation)
    return (y, c[..., n:n + h]) if return_final_state else y


def causal_conv1d_update(conv_state, x, weight, bias=None, *, activation=None, out=None):
    """Updates conv_state in place (in its own dtype), as the op does; returns y."""
    w = _f64(weight)
    h = w.shape[1] - 1
    x3 = _f64(x)[..., None] if np.ndim(x) == 2 else _f64(x)
    n = x3.shape[-1]
    slen = conv_state.shape[-1]
    state = _f64(conv_state)
    y = _conv(np.concatenate([state[..., slen - h:], x3], axis=-1), w, bias, n, activation)
    c = np.concatenate([state, x3], axis=-1)
    conv_state[...] = c[..., c.shape[-1] - slen:]
    return y[..., 0] if np.ndim(x) == 2 else y
