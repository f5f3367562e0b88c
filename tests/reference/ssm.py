"""float64 references of the state-space ops, written from the recurrence (mamba-ssm's
selective_scan_ref and selective_state_update_ref): a plain loop over the sequence.

Per batch b, channel d (group g = d // (dim / G)) and state n:
    dt_l   = softplus?(delta[b, d, l] + delta_bias[d])          (softplus: x above 20)
    h_l[n] = exp(dt_l * A[d, n]) * h_{l-1}[n] + dt_l * u[b, d, l] * B[b, g, n, l]
    y_l    = (sum_n h_l[n] C[b, g, n, l] + D[d] u[b, d, l]) * silu(z[b, d, l])
"""
import numpy as np


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def softplus(x):
    with np.errstate(over="ignore"):
        return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def silu(x):
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def _expand(M, dim, grouped):
    """B or C, (batch, N, ...) or grouped (batch, G, N, ...), as (batch, dim, N, ...):
    channel d reads group d // (dim / G)."""
    M = _f64(M)
    if not grouped:
        M = M[:, None]
    return np.repeat(M, dim // M.shape[1], axis=1)


def _scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, absolute):
    u, A = _f64(u), _f64(A)
    batch, dim, L = u.shape
    dt = _f64(delta)
    if delta_bias is not None:
        dt = dt + _f64(delta_bias)[:, None]
    if delta_softplus:
        dt = softplus(dt)
    Bd = _expand(B, dim, np.ndim(B) == 4)
    Cd = _expand(C, dim, np.ndim(C) == 4)
    h = np.zeros((batch, dim, A.shape[1])) if initial_state is None else _f64(initial_state).copy()
    gate = None if z is None else silu(_f64(z))
    Dv = None if D is None else _f64(D)
    if absolute:
        u, Bd, Cd, h = np.abs(u), np.abs(Bd), np.abs(Cd), np.abs(h)
        gate = None if gate is None else np.abs(gate)
        Dv = None if Dv is None else np.abs(Dv)
    y = np.zeros((batch, dim, L))
    with np.errstate(invalid="ignore", over="ignore"):
        for l in range(L):
            dtl = dt[:, :, l, None]
            h = np.exp(dtl * A) * h + (np.abs(dtl) if absolute else dtl) * u[:, :, l, None] * Bd[..., l]
            y[:, :, l] = (h * Cd[..., l]).sum(-1)
        if Dv is not None:
            y = y + Dv[:, None] * u
        if gate is not None:
            y = y * gate
    return y, h


def selective_scan(u, delta, A, B, C, D=None, z=None, *, delta_bias=None, delta_softplus=False,
                   initial_state=None, return_last_state=False):
    """y (batch, dim, L) float64, or (y, last_state (batch, dim, N))."""
    y, h = _scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, False)
    return (y, h) if return_last_state else y


def scan_magnitude(u, delta, A, B, C, D=None, z=None, *, delta_bias=None, delta_softplus=False,
                   initial_state=None):
    """(y~, h~): the recurrence on absolute values (|dt u B|, |C|, |D u|, |silu z|, |h_0|,
    the same decay factors exp(dt A) >= 0), the scale that the rounding errors of y_l and
    h_l are relative to (the tests' tolerance, tests/test_ssm.py)."""
    return _scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, True)


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, *, dt_bias=None, dt_softplus=False):
    """One step: state (batch, dim, N) is overwritten with the new state, as the op does;
    returns y (batch, dim) float64."""
    y, h = _scan(np.asarray(x)[..., None], np.asarray(dt)[..., None], A, np.asarray(B)[..., None],
                 np.asarray(C)[..., None], D, None if z is None else np.asarray(z)[..., None], dt_bias, dt_softplus,
                 state, False)
    state[...] = h
    return y[..., 0]
