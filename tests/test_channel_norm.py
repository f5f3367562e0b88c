"""dispatch.{batch_norm, group_norm} (with every fused activation) against float64
references, for every implementation the dispatcher can pick on the target device."""
import numpy as np
import pytest

import dispatch
from tests.reference import channel_norm as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, TOL, assert_close, assert_no_new_specialization, broadcast_rows,
                           impl_params, poisoned, randn, read_only, rng, run, strided)

DTYPES = [np.float32, np.float64]
ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]

# batch_norm shapes: ranks 2-5, C = 1 and 3 and not a multiple of 8, 1x1 and 7x7 planes,
# batch 1 and 3; the full list also has a C > 1024 row (BatchNorm1d pieces) and arrays big
# enough that the parallel kernel cuts planes and rows between several tasks.
BN_FULL = [(3, 5), (1, 1), (2, 3, 7), (1, 3, 1, 1), (3, 13, 7, 7), (1, 10, 9, 11), (2, 3, 4, 5, 6),
           (3, 2500), (300, 70), (2, 24, 33, 29)]
BN_SMALL = [(3, 5), (1, 1), (2, 3, 7), (1, 3, 1, 1), (3, 5, 3, 3), (1, 2, 2, 3, 2)]
BN_SHAPES = BN_SMALL if SMALL_SHAPES else BN_FULL

# group_norm (shape, num_groups): G = 1, G = C and between; the last full ones have 16 and
# 3 x 8 (sample, group) blocks (several parallel tasks), and 1 x 1 planes.
GN_FULL = [((3, 6), 3), ((1, 1, 1, 1), 1), ((2, 4, 7), 2), ((3, 13, 7, 7), 13), ((3, 13, 7, 7), 1),
           ((1, 12, 9, 11), 4), ((2, 6, 3, 4, 5), 3), ((1, 30, 1, 1), 10), ((2, 40, 33, 17), 8),
           ((3, 16, 40), 8)]
GN_SMALL = [((3, 6), 3), ((1, 1, 1, 1), 1), ((2, 4, 7), 2), ((1, 6, 3, 3), 6), ((3, 6, 2, 3), 1),
            ((1, 12, 3, 3), 4), ((2, 6, 2, 2, 3), 3)]
GN_CASES = GN_SMALL if SMALL_SHAPES else GN_FULL


def _gn_id(c):
    return f"{c[0]}g{c[1]}"


def _with_activations(items):
    """(item, activation) pairs: every activation with every item, or under the simulator
    (each block of threads simulated in Python) one activation per item, in turn."""
    if SMALL_SHAPES:
        pairs = [(it, ACTIVATIONS[i % len(ACTIVATIONS)]) for i, it in enumerate(items)]
    else:
        pairs = [(it, a) for it in items for a in ACTIVATIONS]
    return [pytest.param(it, a, id=f"{_gn_id(it) if isinstance(it[0], tuple) else it}-{a}") for it, a in pairs]


def _params(g, c, dtype, which):
    w = (randn(g, (c,), dtype) + dtype(1)) if "w" in which else None
    b = randn(g, (c,), dtype) if "b" in which else None
    return w, b


def _bn_inputs(g, shape, dtype, which="wb"):
    c = shape[1]
    x = randn(g, shape, dtype) * dtype(2) + dtype(0.5)
    mean = randn(g, (c,), dtype) * dtype(0.5)
    var = (g.random(c) + 0.25).astype(dtype)
    w, b = _params(g, c, dtype, which)
    return [x, mean, var, w, b]


def _bn_scale(x, mean, var, w, b, eps):
    """assert_close's scale for batch_norm (see support.product_scale): the size of the
    terms x * s and mean * s + b (s = w / sqrt(var + eps)) before they cancel, times an
    activation's slope.  NK_TEST_SEED=530160452 on a (1, 1) gelu case: an output of 1.6e-4
    off by 9.3e-5 of itself in float32, also at the start commit of 8bc9ac7."""
    c = x.shape[1]
    bshape = (1, c) + (1,) * (x.ndim - 2)
    s = np.abs(1.0 if w is None else np.asarray(w, np.float64)) / np.sqrt(np.asarray(var, np.float64) + eps)
    terms = (np.abs(np.asarray(x, np.float64)) + np.abs(np.asarray(mean, np.float64)).reshape(bshape)) * \
        np.broadcast_to(s, (c,)).reshape(bshape)
    if b is not None:
        terms = terms + np.abs(np.asarray(b, np.float64)).reshape(bshape)
    terms = terms[np.isfinite(terms)]
    return 1.2 * float(np.max(terms)) if terms.size else 0.0


def _gn_inputs(g, shape, dtype, which="wb"):
    x = randn(g, shape, dtype) * dtype(2) + dtype(0.5)
    return x, *_params(g, shape[1], dtype, which)


def _which(i):
    """weight and bias, neither, weight only, bias only: every combination over the shapes."""
    return ("wb", "", "w", "b")[i % 4]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, activation", _with_activations(BN_SHAPES))
@pytest.mark.parametrize("impl", impl_params("batch_norm"))
def test_batch_norm_matches_reference(impl, shape, dtype, activation):
    g = rng()
    args = _bn_inputs(g, shape, dtype, _which(BN_SHAPES.index(shape) + ACTIVATIONS.index(activation)))
    eps = float(g.choice([1e-5, 1e-3, 0.1]))
    want = ref.batch_norm(*args, eps=eps, activation=activation)
    out = poisoned(shape, dtype)
    got = run(impl, dispatch.batch_norm, *args, eps=eps, activation=activation, out=out, _op="batch_norm")
    assert got.dtype == dtype and got.shape == shape
    scale = _bn_scale(*args, eps)
    assert_close(got, want, TOL[np.dtype(dtype)], "batch_norm", cancel=True, scale=scale)
    if ON_CUDA:
        return  # run() copies a non-contiguous host array to a contiguous device array
    # non-contiguous x and parameters, no out=
    sargs = [None if a is None else strided(a) for a in args]
    got2 = run(impl, dispatch.batch_norm, *sargs, eps=eps, activation=activation, _op="batch_norm")
    assert_close(got2, want, TOL[np.dtype(dtype)], "batch_norm strided", cancel=True, scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case, activation", _with_activations(GN_CASES))
@pytest.mark.parametrize("impl", impl_params("group_norm"))
def test_group_norm_matches_reference(impl, case, dtype, activation):
    shape, groups = case
    g = rng()
    x, w, b = _gn_inputs(g, shape, dtype, _which(GN_CASES.index(case) + ACTIVATIONS.index(activation)))
    eps = float(g.choice([1e-5, 1e-3, 0.1]))
    want = ref.group_norm(x, groups, w, b, eps=eps, activation=activation)
    got = run(impl, dispatch.group_norm, x, groups, w, b, eps=eps, activation=activation,
              out=poisoned(shape, dtype), _op="group_norm")
    assert got.dtype == dtype and got.shape == shape
    assert_close(got, want, TOL[np.dtype(dtype)], "group_norm", cancel=True)
    if ON_CUDA:
        return  # run() copies a non-contiguous host array to a contiguous device array
    got2 = run(impl, dispatch.group_norm, strided(x), groups, *[None if a is None else strided(a) for a in (w, b)],
               eps=eps, activation=activation, _op="group_norm")
    assert_close(got2, want, TOL[np.dtype(dtype)], "group_norm strided", cancel=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("batch_norm"))
def test_batch_norm_views_and_default_eps(impl, dtype):
    """Channel-sliced, reversed and transposed views of x; out= a non-contiguous view."""
    g = rng()
    base = randn(g, (2, 8, 3, 4) if SMALL_SHAPES else (3, 40, 20, 18), dtype)
    for view in (base[:, ::2], base[..., ::-1], base.transpose(0, 1, 3, 2), base[1:, 3:7, 1:, ::3]):
        args = _bn_inputs(g, view.shape, dtype)
        args[0] = view
        want = ref.batch_norm(*args)
        got = run(impl, dispatch.batch_norm, *args, _op="batch_norm")
        assert_close(got, want, TOL[np.dtype(dtype)], "batch_norm view", cancel=True)
    if not ON_CUDA:
        big = np.full(base.shape[:-1] + (2 * base.shape[-1],), np.nan, dtype)
        out = big[..., ::2]
        args = _bn_inputs(g, base.shape, dtype)
        got = run(impl, dispatch.batch_norm, *args, activation="relu", out=out, _op="batch_norm")
        assert got is out
        assert_close(out, ref.batch_norm(*args, activation="relu"), TOL[np.dtype(dtype)], "out view", cancel=True)
        assert np.isnan(big[..., 1::2]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("group_norm"))
def test_group_norm_views_and_default_eps(impl, dtype):
    g = rng()
    base = randn(g, (2, 6, 3, 4) if SMALL_SHAPES else (3, 48, 20, 18), dtype)
    views = (base[:, ::2], base[..., ::-1], base.transpose(0, 1, 3, 2), base[1:, 3:6, 1:, ::3])
    for view in views[::2] if SMALL_SHAPES else views:
        x, w, b = _gn_inputs(g, view.shape, dtype)
        got = run(impl, dispatch.group_norm, view, 3, w, b, _op="group_norm")
        assert_close(got, ref.group_norm(view, 3, w, b), TOL[np.dtype(dtype)], "group_norm view", cancel=True)
    if not ON_CUDA:
        big = np.full(base.shape[:-1] + (2 * base.shape[-1],), np.nan, dtype)
        out = big[..., ::2]
        got = run(impl, dispatch.group_norm, base, 6, activation="silu", out=out, _op="group_norm")
        assert got is out
        assert_close(out, ref.group_norm(base, 6, activation="silu"), TOL[np.dtype(dtype)], "out view", cancel=True)
        assert np.isnan(big[..., 1::2]).all()


# ---- numerics ----------------------------------------------------------------------------------

CONST_VALUES = [0.0, 3.7, 1e4 + 0.1, -2.5e6, 1e20]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [((5, 1), 1), ((5, 4, 7), 1), ((5, 6, 3, 3), 2)] if SMALL_SHAPES else
                         [((5, 1), 1), ((5, 7, 1), 7), ((5, 6, 3, 3), 2), ((5, 64, 8, 8), 1), ((5, 20, 16, 16), 2)],
                         ids=_gn_id)
@pytest.mark.parametrize("impl", impl_params("group_norm"))
def test_group_norm_constant_groups_give_bias(impl, case, dtype):
    """A constant (sample, group) block has no deviation: the output is exactly the bias
    (0 without one), for every finite constant (PyTorch gives the same), group lengths
    from 1 to 4096."""
    shape, groups = case
    g = rng()
    c = np.array(CONST_VALUES, dtype).reshape((-1,) + (1,) * (len(shape) - 1))
    x = np.broadcast_to(c, shape).copy()
    _, w, b = _gn_inputs(g, shape, dtype)
    for bias in (b, None):
        got = run(impl, dispatch.group_norm, x, groups, w, bias, out=poisoned(shape, dtype), _op="group_norm")
        want = np.zeros(shape, dtype) if bias is None else np.broadcast_to(ref._per_channel(bias, len(shape)), shape)
        for i, cv in enumerate(CONST_VALUES):
            np.testing.assert_array_equal(got[i], want[i], err_msg=f"c = {cv!r}, bias {bias is not None}")


@pytest.mark.parametrize("spread", [1.0, 1e-2])
@pytest.mark.parametrize("offset", [30.0, 1e4])
@pytest.mark.parametrize("activation", [None, "silu"], ids=["None", "silu"])
@pytest.mark.parametrize("impl", impl_params("group_norm"))
def test_group_norm_large_offset_groups_keep_precision(impl, activation, offset, spread):
    """Groups whose mean is far from zero relative to their spread: float32 statistics must
    not cancel (the shifted, corrected two-pass), tolerance as for any float32 group."""
    g = rng()
    shape, groups = ((2, 8, 5, 7), 4) if SMALL_SHAPES else ((2, 64, 16, 16), 32)
    x = (np.float32(offset) + np.float32(spread) * randn(g, shape, np.float32)).astype(np.float32)
    _, w, b = _gn_inputs(g, shape, np.float32)
    got = run(impl, dispatch.group_norm, x, groups, w, b, activation=activation, _op="group_norm")
    assert_close(got, ref.group_norm(x, groups, w, b, activation=activation), 1e-5,
                 f"offset {offset}, spread {spread}", cancel=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("group_norm"))
def test_group_norm_nan_and_inf_give_nan_groups(impl, dtype):
    """A NaN or an inf in a (sample, group) block makes that whole block NaN (PyTorch: the
    mean is NaN or inf, x - mean NaN); the other blocks are untouched, with every activation."""
    g = rng()
    x, w, b = _gn_inputs(g, (2, 6, 3, 3), dtype)
    x[0, 1, 2, 0] = np.nan   # sample 0, group 0
    x[1, 5, 0, 1] = np.inf   # sample 1, group 2
    for act in [None, "silu"] if SMALL_SHAPES else ACTIVATIONS:
        got = run(impl, dispatch.group_norm, x, 3, w, b, activation=act, out=poisoned(x.shape, dtype),
                  _op="group_norm")
        assert np.isnan(got[0, 0:2]).all() and np.isnan(got[1, 4:6]).all(), act
        with np.errstate(invalid="ignore"):
            want = ref.group_norm(x, 3, w, b, activation=act)
        assert_close(got, want, TOL[np.dtype(dtype)], f"nan groups {act}", cancel=True)
        assert np.isfinite(got[0, 2:]).all() and np.isfinite(got[1, :4]).all(), act


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("batch_norm"))
def test_batch_norm_nan_propagates_and_negative_var_gives_nan(impl, dtype):
    """NaN in x gives NaN in that element only, through every activation; a negative
    running_var (allowed by PyTorch) gives NaN in its channel."""
    g = rng()
    args = _bn_inputs(g, (2, 4, 3, 5), dtype)
    x = args[0]
    x[0, 1, 2, 3] = np.nan
    x[1, 3, 0, 0] = np.nan
    args[2] = args[2].copy()
    args[2][2] = -1.0
    for act in [None, "gelu"] if SMALL_SHAPES else ACTIVATIONS:
        got = run(impl, dispatch.batch_norm, *args, activation=act, out=poisoned(x.shape, dtype), _op="batch_norm")
        want = ref.batch_norm(*args, activation=act)
        assert np.isnan(got[:, 2]).all() and np.isnan(got[0, 1, 2, 3]) and np.isnan(got[1, 3, 0, 0]), act
        assert_close(got, want, TOL[np.dtype(dtype)], f"nan {act}", cancel=True)


@pytest.mark.parametrize("activation", [None, "silu", "relu"], ids=["None", "silu", "relu"])
@pytest.mark.parametrize("op", ["batch_norm", "group_norm"])
def test_float16_accumulates_in_float32(op, activation):
    """float16 in and out, statistics and arithmetic in float32: within a few float16 ulps
    (on the CPU as on CUDA; test_half_channel_norm holds the CPU's 16-bit cases)."""
    g = rng()
    shape = (2, 6, 5, 7) if SMALL_SHAPES else (2, 64, 32, 32)
    impl = impl_params(op)[0].values[0]
    if op == "batch_norm":
        args = [None if a is None else a.astype(np.float16) for a in _bn_inputs(g, shape, np.float32)]
        want = ref.batch_norm(*args, activation=activation)
        got = run(impl, dispatch.batch_norm, *args, activation=activation, _op=op)
    else:
        x, w, b = (a.astype(np.float16) for a in _gn_inputs(g, shape, np.float32))
        want = ref.group_norm(x, 3 if SMALL_SHAPES else 32, w, b, activation=activation)
        got = run(impl, dispatch.group_norm, x, 3 if SMALL_SHAPES else 32, w, b, activation=activation, _op=op)
    assert got.dtype == np.float16
    assert_close(got, want, 2e-3, f"{op} float16", cancel=True)


# ---- input variants ----------------------------------------------------------------------------

@pytest.mark.skipif(ON_CUDA, reason="read-only host arrays: the CPU target")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("batch_norm"))
def test_batch_norm_read_only_and_broadcast_inputs(impl, dtype):
    g = rng()
    args = _bn_inputs(g, (3, 5, 4, 6), dtype)
    w1 = np.broadcast_to(args[3][:1], args[3].shape)
    for vargs, what in (([read_only(a) for a in args], "read-only"),
                        ([broadcast_rows(args[0])] + args[1:], "broadcast x"),
                        (args[:3] + [w1, args[4]], "broadcast weight")):
        got = run(impl, dispatch.batch_norm, *vargs, activation="gelu", out=poisoned((3, 5, 4, 6), dtype),
                  _op="batch_norm")
        want = ref.batch_norm(*[np.array(a) for a in vargs], activation="gelu")
        assert_close(got, want, TOL[np.dtype(dtype)], what, cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="read-only host arrays: the CPU target")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("group_norm"))
def test_group_norm_read_only_and_broadcast_inputs(impl, dtype):
    g = rng()
    x, w, b = _gn_inputs(g, (3, 6, 4, 5), dtype)
    xb = x.copy()
    xb[:, :, 0] += 1  # broadcast rows of a sample differ from constant: the group is not constant
    for vargs, what in (([read_only(a) for a in (x, w, b)], "read-only"),
                        ([broadcast_rows(xb), w, b], "broadcast x"),
                        ([x, np.broadcast_to(w[:1], w.shape), read_only(b)], "broadcast weight")):
        got = run(impl, dispatch.group_norm, vargs[0], 2, *vargs[1:], activation="silu",
                  out=poisoned(x.shape, dtype), _op="group_norm")
        want = ref.group_norm(np.array(vargs[0]), 2, *[np.array(a) for a in vargs[1:]], activation="silu")
        assert_close(got, want, TOL[np.dtype(dtype)], what, cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
@pytest.mark.parametrize("impl", impl_params("group_norm"))
def test_read_only_inputs_and_activations_reuse_the_compiled_kernels(impl):
    """Read-only and broadcast inputs, another activation, weight / bias given or not: the
    machine code compiled for the first call (no new specialization, no warning)."""
    from kernels_cpu import channel_norm as K

    g = rng()
    args = _bn_inputs(g, (2, 5, 4, 6), np.float32)
    x, w, b = _gn_inputs(g, (2, 6, 4, 5), np.float32)
    run(impl, dispatch.batch_norm, *args, _op="batch_norm")
    run(impl, dispatch.batch_norm, args[0][:, :, 0, 0].copy(), *args[1:3], _op="batch_norm")  # S == 1
    run(impl, dispatch.group_norm, x, 3, w, b, _op="group_norm")

    def variants():
        run(impl, dispatch.batch_norm, read_only(args[0]), *[read_only(a) for a in args[1:]], activation="relu",
            _op="batch_norm")
        run(impl, dispatch.batch_norm, broadcast_rows(args[0]), *args[1:3], activation="gelu_tanh",
            _op="batch_norm")
        run(impl, dispatch.group_norm, read_only(x), 2, broadcast_rows(w), None, activation="silu",
            _op="group_norm")
        run(impl, dispatch.group_norm, broadcast_rows(x), 6, None, read_only(b), activation="gelu",
            _op="group_norm")

    assert_no_new_specialization([K], variants, impl)


@pytest.mark.skipif(ON_CUDA, reason="host-only edge case")
@pytest.mark.parametrize("shape", [(0, 4), (0, 4, 5), (2, 4, 0), (2, 0, 3), (3, 4, 2, 0)], ids=str)
def test_empty(shape):
    x = np.ones(shape, np.float32)
    c = shape[1]
    p = np.ones(c, np.float32)
    assert dispatch.batch_norm(x, p, p, p, p, activation="silu").shape == shape
    assert dispatch.group_norm(x, 2 if c else 1, p, p, activation="relu").shape == shape
    out = np.empty(shape, np.float32)
    assert dispatch.group_norm(x, 1, out=out) is out


@pytest.mark.skipif(ON_CUDA, reason="the CPU rule")
def test_rules():
    def chosen(op, *args):
        return dispatch.explain(op, *args).chosen

    small, large = np.ones((2, 8, 5, 5), np.float32), np.ones((1, 64, 128, 128), np.float32)
    p8, p64 = np.ones(8, np.float32), np.ones(64, np.float32)
    assert chosen("batch_norm", small, p8, p8) == "cpu-serial"
    assert chosen("batch_norm", large, p64, p64) == "cpu-parallel"
    assert chosen("group_norm", small, 4) == "cpu-serial"
    assert chosen("group_norm", large, 32) == "cpu-parallel"
    assert chosen("group_norm", large, 1) == "cpu-serial"  # one (sample, group) block


# ---- bad input ---------------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="argument checks are device-independent")
X = np.ones((2, 4, 3, 3), np.float32)
P = np.ones(4, np.float32)
P5 = np.ones(5, np.float32)


def _bn(*args, **kw):
    a = [X, P, P, P, P]
    a[:len(args)] = args
    return lambda out: dispatch.batch_norm(*a, out=out, **kw)


def _gn(*args, **kw):
    a = [X, 2, P, P]
    a[:len(args)] = args
    return lambda out: dispatch.group_norm(*a, out=out, **kw)


BAD = [
    (_bn(X, P5), ValueError, r"running_mean must have shape \(4,\) \(C,\) for x's channel dimension 1"),
    (_bn(X, P, P5), ValueError, r"running_var must have shape \(4,\)"),
    (_bn(X, P, P, P5), ValueError, r"weight must have shape \(4,\)"),
    (_bn(X, P, P, P, np.ones((1, 4), np.float32)), ValueError, r"bias must have shape \(4,\)"),
    (_bn(X, None), TypeError, "running_mean must be an array, got None"),
    (_bn(X, P, np.ones(4)), TypeError, r"running_var must have the same dtype as x \(float32\)"),
    (_bn(X, P, P, np.ones(4)), TypeError, "weight must have the same dtype as x"),
    (_bn(X.astype(np.int32)), TypeError, "x must have dtype float32 or float64"),
    (_bn(np.ones(4, np.float32)), ValueError, r"x must have at least 2 dimensions \(N, C, \*spatial\)"),
    (_bn(eps=0.0), ValueError, "eps must be a finite positive number"),
    (_bn(eps=-1e-5), ValueError, "eps must be a finite positive number"),
    (_bn(eps=float("nan")), ValueError, "eps must be a finite positive number"),
    (_bn(eps="1e-5"), TypeError, "eps must be a real number"),
    (_bn(activation="tanh"), ValueError, "activation must be one of"),
    (_bn(activation=["relu"]), ValueError, "activation must be one of"),
    (_bn([[1.0, 2.0]]), TypeError, "x must be a numpy array"),
    (_gn(X, 3), ValueError, r"num_groups must divide the channel count C = 4 \(x's dimension 1\), got 3"),
    (_gn(X, 0), ValueError, "num_groups must be a positive int, got 0"),
    (_gn(X, -2), ValueError, "num_groups must be a positive int"),
    (_gn(X, True), TypeError, "num_groups must be an int, got bool"),
    (_gn(X, 2.0), TypeError, "num_groups must be an int, got float"),
    (_gn(X, None), TypeError, "num_groups must be an int"),
    (_gn(X, 2, P5), ValueError, r"weight must have shape \(4,\)"),
    (_gn(X, 2, P, np.ones(4)), TypeError, "bias must have the same dtype as x"),
    (_gn(X.astype(np.float64), 2), TypeError, r"weight must have the same dtype as x \(float64\)"),
    (_gn(np.ones(4, np.float32), 2), ValueError, "x must have at least 2 dimensions"),
    (_gn(eps=0.0), ValueError, "eps must be a finite positive number"),
    (_gn(eps=1e300), ValueError, "eps=1e\\+300 is not finite in float32"),
    (_gn(activation="gelu_erf"), ValueError, "activation must be one of"),
    (_gn(activation=1), ValueError, "activation must be one of"),
]


@cpu_only
@pytest.mark.parametrize("call, err, msg", BAD, ids=[f"{i}-{b[2][:30]}" for i, b in enumerate(BAD)])
def test_bad_inputs_raise_and_leave_out_untouched(call, err, msg):
    out = np.full(X.shape, np.nan, np.float32)
    with pytest.raises(err, match=msg):
        call(out)
    assert np.isnan(out).all()


@cpu_only
@pytest.mark.parametrize("op", ["batch_norm", "group_norm"])
def test_bad_out_rejected_and_untouched(op):
    call = _bn if op == "batch_norm" else _gn
    for bad, err, msg in [(np.zeros((2, 4, 3, 4), np.float32), ValueError, r"out must have shape \(2, 4, 3, 3\)"),
                          (np.zeros((2, 4, 3, 3), np.float64), TypeError, "out must have dtype float32"),
                          (np.zeros((2, 4, 3, 3), np.float32)[:, :, :, :2], ValueError, "out must have shape")]:
        before = bad.copy()
        with pytest.raises(err, match=msg):
            call()(bad)
        assert np.array_equal(bad, before)
    x, p = X.copy(), P.copy()
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.group_norm(x, 2, out=x)
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.batch_norm(x, p, p, out=x)
    assert np.array_equal(x, X) and np.array_equal(p, P)


@cpu_only
def test_out_is_returned():
    g = rng()
    args = _bn_inputs(g, (2, 3, 4), np.float32)
    out = np.empty((2, 3, 4), np.float32)
    assert dispatch.batch_norm(*args, out=out) is out
    assert dispatch.group_norm(args[0], 3, out=out) is out
