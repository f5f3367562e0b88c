"""dispatch.{causal_conv1d, causal_conv1d_update} against the float64 references of
tests/reference/causal_conv.py, for every implementation on the target device (CPU:
cpu-serial, cpu-parallel; CUDA, on a GPU or the simulator: cuda-rows), and the properties
that tie them together: causality, and step-by-step decoding equal to the prefill."""
import numpy as np
import pytest

import dispatch
from tests.reference import causal_conv as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, TOL, assert_close, impl_params, poisoned, randn, read_only, rng,
                           run, strided, to_host, to_target)

DTYPES = [np.float32, np.float64]
CONV = impl_params("causal_conv1d")
UPDATE = impl_params("causal_conv1d_update")

# (batch, dim, L, W): L = 1, L < W - 1, L = W - 1, W = 1, 2, 3, 4 (the package's widths)
# and 5, 6 (the generic path), dims not a multiple of any vector width; the full list adds
# Mamba-sized rows and enough rows for several parallel tasks.
SMALL = [(1, 3, 1, 4), (2, 3, 2, 4), (1, 2, 3, 4), (2, 3, 7, 4), (1, 4, 5, 1), (2, 3, 6, 2), (1, 3, 5, 3),
         (1, 2, 6, 5)]
FULL = SMALL + [(1, 5, 9, 6), (3, 17, 33, 4), (2, 40, 1000, 4), (1, 96, 257, 3), (4, 150, 64, 2)]
CASES = SMALL if SMALL_SHAPES else FULL


def _inputs(g, b, d, n, w, dtype):
    x = randn(g, (b, d, n), dtype)
    weight = (randn(g, (d, w), dtype) / dtype(np.sqrt(w))).astype(dtype)
    return x, weight, randn(g, (d,), dtype), randn(g, (b, d, w - 1), dtype)


def _variants(i):
    """(bias, initial_state, activation) combinations taken in turn over the cases."""
    return [(True, True, "silu"), (False, False, None), (True, False, "swish"), (False, True, None)][i % 4]


def _conv(impl, *args, **kw):
    return run(impl, dispatch.causal_conv1d, *args, _op="causal_conv1d", **kw)


def _update(impl, state, *args, **kw):
    """causal_conv1d_update on the target: (y, the state after) on the host."""
    sd = to_target(state)
    y = run(impl, dispatch.causal_conv1d_update, sd, *args, _op="causal_conv1d_update", **kw)
    return y, to_host(sd)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("impl", CONV)
def test_causal_conv1d_matches_reference(impl, case, dtype):
    b, d, n, w = case
    g = rng()
    x, weight, bias, init = _inputs(g, b, d, n, w, dtype)
    has_bias, has_init, act = _variants(CASES.index(case) + DTYPES.index(dtype))
    bias, init = (bias if has_bias else None), (init if has_init else None)
    want, want_f = ref.causal_conv1d(x, weight, bias, activation=act, initial_state=init, return_final_state=True)
    y, f = _conv(impl, x, weight, bias, activation=act, initial_state=init, return_final_state=True,
                 out=poisoned(x.shape, dtype))
    assert y.dtype == dtype and f.dtype == dtype and f.shape == (b, d, w - 1)
    assert_close(y, want, TOL[np.dtype(dtype)], f"y {act}", cancel=True)
    np.testing.assert_array_equal(f, want_f.astype(dtype))  # a copy of inputs: exact
    y2 = _conv(impl, x, weight, bias, activation=act, initial_state=init)  # y alone, no out=
    np.testing.assert_array_equal(y2, y)
    if ON_CUDA:
        return  # run() copies non-contiguous host arrays to contiguous device arrays
    sx, sw = strided(x), strided(weight)
    y3 = _conv(impl, sx, sw, None if bias is None else strided(bias), activation=act,
               initial_state=None if init is None else read_only(init))
    np.testing.assert_array_equal(y3, y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("impl", UPDATE)
def test_causal_conv1d_update_matches_reference(impl, case, dtype):
    """One step of seqlen 1 (x (batch, dim) or (batch, dim, 1)) or 3 (x (batch, dim, 3))
    against states of W - 1 (causal_conv1d's final state), W (mamba-ssm's) and W + 1 values."""
    b, d, _, w = case
    g = rng()
    i = CASES.index(case)
    slen = w - 1 + i % 3
    n, xshape = ((1, (b, d)), (1, (b, d, 1)), (3, (b, d, 3)))[(i // 2) % 3]
    x, weight, bias, _ = _inputs(g, b, d, n, w, dtype)
    x = x.reshape(xshape)
    state = randn(g, (b, d, slen), dtype)
    has_bias, _, act = _variants(i + DTYPES.index(dtype))
    bias = bias if has_bias else None
    want_state = state.copy()
    want = ref.causal_conv1d_update(want_state, x, weight, bias, activation=act)
    y, got_state = _update(impl, state, x, weight, bias, activation=act, out=poisoned(xshape, dtype))
    assert y.dtype == dtype and y.shape == xshape
    assert_close(y, want, TOL[np.dtype(dtype)], f"y {act}", cancel=True)
    np.testing.assert_array_equal(got_state, want_state)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", UPDATE)
def test_update_with_steps_longer_than_the_state(impl, dtype):
    """seqlen >= state_len: the new state is the last state_len inputs (W 4, state 3 and 4)."""
    g = rng()
    b, d = (1, 3) if SMALL_SHAPES else (2, 9)
    for slen, n in ((3, 5), (4, 4), (3, 3)):
        x, weight, bias, _ = _inputs(g, b, d, n, 4, dtype)
        state = randn(g, (b, d, slen), dtype)
        want_state = state.copy()
        want = ref.causal_conv1d_update(want_state, x, weight, bias, activation="silu")
        y, got = _update(impl, state, x, weight, bias, activation="silu")
        assert_close(y, want, TOL[np.dtype(dtype)], f"state {slen}, seqlen {n}", cancel=True)
        np.testing.assert_array_equal(got, x[..., n - slen:])
        np.testing.assert_array_equal(got, want_state)


# ---- properties --------------------------------------------------------------------------------

@pytest.mark.parametrize("w", [1, 2, 4, 5])
@pytest.mark.parametrize("impl", CONV)
def test_outputs_do_not_see_later_inputs(impl, w):
    """Changing x from time t on leaves outputs 0..t-1 bit for bit as they were."""
    g = rng()
    b, d, n = (1, 2, 6) if SMALL_SHAPES else (2, 7, 40)
    x, weight, bias, init = _inputs(g, b, d, n, w, np.float32)
    y = _conv(impl, x, weight, bias, activation="silu", initial_state=init)
    for t in (0, 1, n // 2, n - 1):
        x2 = x.copy()
        x2[..., t:] = randn(g, (b, d, n - t), np.float32) * np.float32(100)
        y2 = _conv(impl, x2, weight, bias, activation="silu", initial_state=init)
        np.testing.assert_array_equal(y2[..., :t], y[..., :t], err_msg=f"t = {t}")
        assert not np.array_equal(y2[..., t:], y[..., t:])


@pytest.mark.parametrize("extra", [0, 1], ids=["state W-1", "state W"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", UPDATE)
def test_update_step_by_step_equals_the_full_convolution(impl, dtype, extra):
    """Prefill a prefix with causal_conv1d, then causal_conv1d_update one step at a time from
    its final state (or that state behind one older value: mamba-ssm's state of W): the
    outputs are the full convolution's, the state after the steps its final state."""
    g = rng()
    b, d, n, w, p = (1, 3, 5, 4, 2) if SMALL_SHAPES else (2, 13, 24, 4, 7)
    x, weight, bias, init = _inputs(g, b, d, n, w, dtype)
    conv_impl = impl_params("causal_conv1d")[0].values[0]
    full, final = _conv(conv_impl, x, weight, bias, activation="silu", initial_state=init, return_final_state=True)
    _, state = _conv(conv_impl, x[..., :p], weight, bias, activation="silu", initial_state=init,
                     return_final_state=True)
    if extra:
        state = np.concatenate([randn(g, (b, d, 1), dtype), state], axis=-1)
    sd = to_target(np.ascontiguousarray(state))
    ys = []
    for t in range(p, n):
        ys.append(run(impl, dispatch.causal_conv1d_update, sd, x[..., t], weight, bias, activation="silu",
                      _op="causal_conv1d_update"))
    assert_close(np.stack(ys, axis=-1), full[..., p:], TOL[np.dtype(dtype)], "steps", cancel=True)
    np.testing.assert_array_equal(to_host(sd)[..., extra:], final)


@pytest.mark.parametrize("impl", CONV)
def test_final_state_of_short_sequences_comes_from_the_initial_state(impl):
    """L < W - 1: final_state is the initial state's last W - 1 - L values, then x; zeros
    without an initial state."""
    g = rng()
    x, weight, bias, init = _inputs(g, 2, 3, 1, 4, np.float32)
    _, f = _conv(impl, x, weight, bias, initial_state=init, return_final_state=True)
    np.testing.assert_array_equal(f, np.concatenate([init[..., 1:], x], axis=-1))
    _, f0 = _conv(impl, x, weight, return_final_state=True)
    np.testing.assert_array_equal(f0, np.concatenate([np.zeros((2, 3, 2), np.float32), x], axis=-1))


@pytest.mark.parametrize("impl", CONV)
def test_nan_reaches_only_the_outputs_whose_window_holds_it(impl):
    g = rng()
    x, weight, bias, init = _inputs(g, 1, 3, 9, 4, np.float32)
    x[0, 1, 4] = np.nan
    init[0, 2, 1] = np.nan
    y = _conv(impl, x, weight, bias, activation="silu", initial_state=init, out=poisoned(x.shape, np.float32))
    want = np.zeros(x.shape, bool)
    want[0, 1, 4:8] = True    # x[.., 4] is in the windows of outputs 4..7
    want[0, 2, 0:2] = True    # initial_state[.., 1] (time -2) in those of outputs 0 and 1
    np.testing.assert_array_equal(np.isnan(y), want)
    assert_close(y, ref.causal_conv1d(x, weight, bias, activation="silu", initial_state=init), TOL[np.dtype(np.float32)],
                 "nan", cancel=True)


# ---- layouts -----------------------------------------------------------------------------------

@pytest.mark.skipif(ON_CUDA, reason="host layouts")
@pytest.mark.parametrize("impl", UPDATE)
def test_strided_conv_state_is_updated_in_place(impl):
    """A strided view as conv_state (a slice of a bigger cache), read-only inputs, and a
    strided out= view: the view's elements are updated, the rest of the cache untouched."""
    g = rng()
    x, weight, bias, _ = _inputs(g, 2, 5, 1, 4, np.float32)
    cache = randn(g, (2, 5, 8), np.float32)
    before = cache.copy()
    view = cache[:, :, 1::2]
    want_state = view.copy()
    want = ref.causal_conv1d_update(want_state, x[..., 0], weight, bias, activation="silu")
    big = np.full((2, 10), np.nan, np.float32)
    got = dispatch.causal_conv1d_update(view, read_only(x[..., 0]), read_only(weight), read_only(bias),
                                        activation="silu", out=big[:, ::2])
    assert got.base is big
    assert_close(got, want, 1e-5, "strided state", cancel=True)
    np.testing.assert_array_equal(view, want_state)
    np.testing.assert_array_equal(cache[:, :, 0::2], before[:, :, 0::2])
    assert np.isnan(big[:, 1::2]).all()


@pytest.mark.skipif(ON_CUDA, reason="host-only edge case")
def test_empty_inputs():
    w = np.ones((3, 4), np.float32)
    y, f = dispatch.causal_conv1d(np.ones((0, 3, 5), np.float32), w, return_final_state=True)
    assert y.shape == (0, 3, 5) and f.shape == (0, 3, 3)
    y, f = dispatch.causal_conv1d(np.ones((2, 3, 0), np.float32), w, return_final_state=True)
    assert y.shape == (2, 3, 0) and (f == 0).all() and f.shape == (2, 3, 3)
    assert dispatch.causal_conv1d_update(np.ones((0, 3, 3), np.float32), np.ones((0, 3), np.float32), w).shape == (0, 3)


@pytest.mark.skipif(ON_CUDA, reason="the CPU rule")
def test_rules():
    def chosen(op, *args):
        return dispatch.explain(op, *args).chosen

    w = np.ones((1536, 4), np.float32)
    assert chosen("causal_conv1d", np.ones((1, 8, 16), np.float32), w[:8]) == "cpu-serial"
    assert chosen("causal_conv1d", np.ones((1, 1536, 1024), np.float32), w) == "cpu-parallel"
    assert chosen("causal_conv1d_update", np.ones((1, 8, 4), np.float32), np.ones((1, 8), np.float32),
                  w[:8]) == "cpu-serial"


@pytest.mark.skipif(not ON_CUDA, reason="float16 runs on CUDA only")
def test_float16_computes_in_float32():
    g = rng()
    impl_c, impl_u = CONV[0].values[0], UPDATE[0].values[0]
    x, weight, bias, init = (a.astype(np.float16) for a in _inputs(g, 1, 3, 6, 4, np.float32))
    y, f = _conv(impl_c, x, weight, bias, activation="silu", initial_state=init, return_final_state=True)
    want, want_f = ref.causal_conv1d(x, weight, bias, activation="silu", initial_state=init, return_final_state=True)
    assert y.dtype == np.float16
    assert_close(y, want, 2e-3, "float16", cancel=True)
    np.testing.assert_array_equal(f, want_f.astype(np.float16))
    state = init.copy()
    want_state = state.copy()
    want = ref.causal_conv1d_update(want_state, x[..., 0], weight, bias, activation="silu")
    y, got = _update(impl_u, state, x[..., 0], weight, bias, activation="silu")
    assert y.dtype == np.float16
    assert_close(y, want, 2e-3, "float16 update", cancel=True)
    np.testing.assert_array_equal(got, want_state)


# ---- bad input ---------------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="argument checks are device-independent")
X = np.ones((2, 3, 5), np.float32)
W4 = np.ones((3, 4), np.float32)
B3 = np.ones(3, np.float32)
S3 = np.ones((2, 3, 3), np.float32)


def _c(*args, **kw):
    a = [X, W4, B3]
    a[:len(args)] = args
    return lambda out: dispatch.causal_conv1d(*a, out=out, **kw), X.shape


def _u(state=None, x=None, w=W4, b=B3, **kw):
    state = S3 if state is None else state
    x = X[..., 0] if x is None else x
    return lambda out: dispatch.causal_conv1d_update(state, x, w, b, out=out, **kw), X.shape[:2]


BAD = [
    (_c(X.astype(np.int32)), TypeError, "x must have dtype float32 or float64"),
    (_c(X[0]), ValueError, r"x must have 3 dimensions \(batch, dim, L\)"),
    (_c(X, None), TypeError, "weight must be an array, got None"),
    (_c(X, W4.astype(np.float64)), TypeError, r"weight must have the same dtype as x \(float32\)"),
    (_c(X, W4[:2]), ValueError, r"weight must have shape \(dim, W\) with dim = 3"),
    (_c(X, np.ones((3, 0), np.float32)), ValueError, "weight must have shape .* W >= 1"),
    (_c(X, W4[0]), ValueError, r"weight must have 2 dimensions \(dim, W\)"),
    (_c(X, W4, np.ones(4, np.float32)), ValueError, r"bias must have shape \(3,\)"),
    (_c(X, W4, np.ones(3)), TypeError, "bias must have the same dtype as x"),
    (_c(activation="gelu"), ValueError, "activation must be one of"),
    (_c(activation=["silu"]), ValueError, "activation must be one of"),
    (_c(initial_state=np.ones((2, 3, 4), np.float32)), ValueError,
     r"initial_state must have shape \(2, 3, 3\) \(batch, dim, W - 1\)"),
    (_c(initial_state=S3.astype(np.float64)), TypeError, "initial_state must have the same dtype as x"),
    (_c(return_final_state=1), TypeError, "return_final_state must be a bool"),
    (_c([[[1.0]]]), TypeError, "x must be a numpy array"),
    (_u(state=np.ones((2, 3, 2), np.float32)), ValueError, r"conv_state must have state_len >= W - 1 = 3"),
    (_u(state=np.ones((2, 4, 3), np.float32)), ValueError, r"conv_state must have shape \(2, 3, 3\)"),
    (_u(state=np.ones((2, 3), np.float32)), ValueError, r"conv_state must have 3 dimensions"),
    (_u(state=S3.astype(np.float64)), TypeError, "conv_state must have dtype float32 .it is updated in place"),
    (_u(state=read_only(S3)), ValueError, "conv_state must be writeable"),
    (_u(state=np.broadcast_to(S3[:1], S3.shape)), ValueError, "conv_state must be writeable"),
    (_u(x=np.ones(3, np.float32)), ValueError, r"x must have 2 to 3 dimensions"),
    (_u(w=np.ones((4, 4), np.float32)), ValueError, "weight must have shape .dim, W. with dim = 3"),
    (_u(b=np.ones(3)), TypeError, "bias must have the same dtype as x"),
    (_u(activation="relu"), ValueError, "activation must be one of"),
]


@cpu_only
@pytest.mark.parametrize("call, err, msg", BAD, ids=[f"{i}-{b[2][:30]}" for i, b in enumerate(BAD)])
def test_bad_inputs_raise_and_leave_state_and_out_untouched(call, err, msg):
    fn, out_shape = call
    before = S3.copy()
    out = np.full(out_shape, np.nan, np.float32)
    with pytest.raises(err, match=msg):
        fn(out)
    assert np.isnan(out).all()
    np.testing.assert_array_equal(S3, before)


@cpu_only
def test_update_state_overlapping_another_argument_is_refused_untouched():
    state = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    before = state.copy()
    with pytest.raises(ValueError, match="conv_state overlaps input x"):
        dispatch.causal_conv1d_update(state, state[..., 0], W4)
    out = state[..., 1]
    with pytest.raises(ValueError, match="overlaps"):
        dispatch.causal_conv1d_update(state, np.ones((2, 3), np.float32), W4, out=out)
    np.testing.assert_array_equal(state, before)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 3\)"):
        dispatch.causal_conv1d_update(state, np.ones((2, 3), np.float32), W4, out=np.empty((2, 3, 1), np.float32))
    np.testing.assert_array_equal(state, before)
