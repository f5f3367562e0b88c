"""batch_norm and group_norm of bfloat16 / float16 x (PyTorch's 16-bit norms of a CNN or a
diffusion U-Net; CPU), each test once per format (the `half` fixture): float32 inside, each
result rounded once to x's dtype, parameters in x's dtype or float32.  Every CPU
implementation is forced and compared with the float64 reference of the same 16-bit
values: planes longer than the widening chunk, rank-2 (N, C) input, every activation,
weight / bias or none, NaN / inf, constant groups (exactly the bias), views, NaN-poisoned
out=, threads, and bad input that changes nothing."""
import numpy as np
import pytest

import dispatch
from tests.reference import channel_norm as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, as_half, assert_half_close, concurrent_mismatches, impl_params,
                           other_half, poisoned, randn, rng, run, strided)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 / float16 x is a CPU input here (float16 on CUDA: "
                                "test_channel_norm)")

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]
# the float32 arithmetic (and activation approximations) before the rounding, relative to
# the size of the terms that meet in an output
F32_SLACK = 1e-5
# (1, 3, 40, 40): planes of 1600 elements, past kernels_cpu.channel_norm.HALF_CHUNK
BN_SHAPES = [(3, 5), (1, 1), (2, 3, 7), (1, 3, 4, 4)] if SMALL_SHAPES else \
    [(3, 5), (1, 1), (2, 3, 7), (3, 13, 7, 7), (1, 3, 40, 40), (2, 3, 4, 5, 6), (2, 2000)]
GN_CASES = [((3, 6), 3), ((2, 4, 7), 2), ((1, 6, 3, 3), 3)] if SMALL_SHAPES else \
    [((3, 6), 3), ((2, 4, 7), 2), ((3, 13, 7, 7), 13), ((3, 13, 7, 7), 1), ((1, 64, 16, 16), 32)]


def _params(g, c, half, kind):
    """(weight, bias): in x's dtype `half`, float32, or none."""
    if kind is None:
        return None, None
    dt = half if kind == "half" else np.float32
    return (1 + 0.1 * randn(g, (c,), np.float32)).astype(dt), randn(g, (c,), np.float32).astype(dt)


def _bn_args(g, shape, half, kind):
    c = shape[1]
    x = as_half(half, randn(g, shape, np.float32) * 2 + 0.5)
    mean = (0.5 * randn(g, (c,), np.float32)).astype(half if kind == "half" else np.float32)
    var = (g.random(c) + 0.25).astype(half if kind == "half" else np.float32)
    return [x, mean, var, *_params(g, c, half, kind)]


def _f64(a):
    return None if a is None else np.asarray(a, np.float64)


def _per_channel(p, ndim):
    return 1.0 if p is None else np.abs(_f64(p)).reshape((1, -1) + (1,) * (ndim - 2))


def check_bn(got, args, activation, what):
    """The terms x * s, mean * s and bias (s = weight / sqrt(var + eps)) of each output."""
    x, mean, var, w, b = args
    s = _per_channel(w, x.ndim) / np.sqrt(_per_channel(var, x.ndim) + 1e-5)
    terms = np.abs(_f64(x)) * s + _per_channel(mean, x.ndim) * s + (_per_channel(b, x.ndim) if b is not None else 0)
    assert_half_close(got, ref.batch_norm(*args, activation=activation), F32_SLACK * (terms + 1), what)


def check_gn(got, x, groups, w, b, activation, what):
    """The normalized value (at most ~4 here) times |weight|, plus |bias|."""
    terms = 4.0 * _per_channel(w, x.ndim) + (_per_channel(b, x.ndim) if b is not None else 0)
    with np.errstate(invalid="ignore"):
        want = ref.group_norm(x, groups, w, b, activation=activation)
    assert_half_close(got, want, F32_SLACK * np.broadcast_to(terms, x.shape), what)


@pytest.mark.parametrize("kind", ["half", "f32", None], ids=["half-params", "f32-params", "no-params"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
@pytest.mark.parametrize("impl", impl_params("batch_norm", "cpu"))
def test_batch_norm_matches_reference(impl, shape, activation, kind, half):
    g = rng()
    args = _bn_args(g, shape, half, kind)
    out = poisoned(shape, half)
    got = run(impl, dispatch.batch_norm, *args, activation=activation, out=out, _op="batch_norm")
    assert got is out
    check_bn(got, args, activation, f"{impl} {shape} {activation} params={kind}")


@pytest.mark.parametrize("kind", ["half", "f32", None], ids=["half-params", "f32-params", "no-params"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("shape, groups", GN_CASES, ids=str)
@pytest.mark.parametrize("impl", impl_params("group_norm", "cpu"))
def test_group_norm_matches_reference(impl, shape, groups, activation, kind, half):
    g = rng()
    x = as_half(half, randn(g, shape, np.float32) * 2 + 0.5)
    w, b = _params(g, shape[1], half, kind)
    out = poisoned(shape, half)
    got = run(impl, dispatch.group_norm, x, groups, w, b, activation=activation, out=out, _op="group_norm")
    assert got is out
    check_gn(got, x, groups, w, b, activation, f"{impl} {shape}/{groups} {activation} params={kind}")


@pytest.mark.parametrize("impl", impl_params("group_norm", "cpu"))
def test_group_norm_special_groups_and_views(impl, half):
    """A constant group gives exactly the bias; a NaN or an inf makes its group NaN; a
    strided x and a non-contiguous out=; no samples."""
    g = rng()
    n, c, h = (2, 4, 3) if SMALL_SHAPES else (2, 8, 9)
    x = randn(g, (n, c, h, h), np.float32)
    x[0, 0:2] = 7.5            # group 0 of sample 0: constant
    x[1, 2, 1, 1] = np.nan     # group 1 of sample 1
    x[1, 0, 0, 0] = np.inf     # group 0 of sample 1
    x = as_half(half, x)
    w, b = _params(g, c, half, "half")
    got = run(impl, dispatch.group_norm, x, c // 2, w, b, _op="group_norm")
    np.testing.assert_array_equal(got[0, 0:2].view(np.uint16), np.broadcast_to(b[0:2, None, None], (2, h, h)).view(
        np.uint16))
    assert np.isnan(np.asarray(got[1, 0:4], np.float32)).all()   # its groups 0 and 1 (channels 0-3)
    check_gn(got, x, c // 2, w, b, None, f"{impl} special groups")
    xs = strided(x)
    assert not xs.flags.c_contiguous
    check_gn(run(impl, dispatch.group_norm, xs, c // 2, w, b, _op="group_norm"), x, c // 2, w, b, None,
             f"{impl} strided")
    tout = np.full((h, h, c, n), np.nan, half).T
    assert run(impl, dispatch.group_norm, x, c // 2, w, b, out=tout, _op="group_norm") is tout
    check_gn(tout, x, c // 2, w, b, None, f"{impl} non-contiguous out=")
    empty = run(impl, dispatch.group_norm, x[:0], c // 2, w, b, _op="group_norm")
    assert empty.shape == (0, c, h, h) and empty.dtype == half


@pytest.mark.parametrize("impl", impl_params("batch_norm", "cpu"))
def test_batch_norm_nan_and_views(impl, half):
    g = rng()
    shape = (2, 3, 4, 5)
    args = _bn_args(g, shape, half, "half")
    x = np.asarray(args[0], np.float32)
    x[1, 2, 3, 4] = np.nan
    args[0] = as_half(half, x)
    got = run(impl, dispatch.batch_norm, *args, activation="silu", _op="batch_norm")
    assert np.isnan(np.asarray(got[1, 2, 3, 4], np.float32))
    check_bn(got, args, "silu", f"{impl} NaN")
    xs = strided(args[0])
    check_bn(run(impl, dispatch.batch_norm, xs, *args[1:], _op="batch_norm"), args, None, f"{impl} strided")


@pytest.mark.parametrize("op", ["batch_norm", "group_norm"])
def test_bad_input_changes_nothing(op, half):
    g = rng()
    args = _bn_args(g, (2, 4, 3), half, "half")
    x, w, b = args[0], args[3], args[4]
    other = other_half(half)   # the other 16-bit format: not a parameter dtype for this x
    out = np.full(x.shape, np.nan, half)
    call = (lambda *a, **kw: dispatch.batch_norm(*a, *args[1:], **kw)) if op == "batch_norm" else \
        (lambda *a, **kw: dispatch.group_norm(*a, 2, w, b, **kw))
    bad = [((x.astype(np.int32),), {}, TypeError, "x must have dtype float32 or float64.*bfloat16 / float16"),
           ((x,), {"out": np.full(x.shape, np.nan, np.float32)}, (TypeError, ValueError), "out"),
           ((x,), {"eps": float("nan")}, ValueError, "eps")]
    for a, kw, exc, match in bad:
        with pytest.raises(exc, match=match):
            call(*a, **({"out": out} | kw))
    with pytest.raises(TypeError, match=f"weight must have dtype {half} or float32"):
        if op == "batch_norm":
            dispatch.batch_norm(x, args[1], args[2], w.astype(other), b, out=out)
        else:
            dispatch.group_norm(x, 2, w.astype(other), b, out=out)
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


def test_threads_bitwise(half):
    """Calls from 4 Python threads at once give each case its single-threaded bits."""
    g = rng()
    shapes = [(1, 8, 3, 3), (2, 32, 16, 16), (1, 64, 32, 32), (3, 16, 7, 7)] if not SMALL_SHAPES else \
        [(1, 4, 3, 3), (2, 4, 2, 2), (1, 8, 3, 3), (3, 4, 2, 2)]
    cases = [_bn_args(g, s, half, "half") for s in shapes]

    def call(args):
        x, w, b = args[0], args[3], args[4]
        return np.concatenate([dispatch.group_norm(x, 4, w, b, activation="silu").view(np.uint16).ravel(),
                               dispatch.batch_norm(*args, activation="relu").view(np.uint16).ravel()])

    assert concurrent_mismatches(call, cases) == []
