"""relu, silu, gelu (both forms), swiglu and geglu of bfloat16 / float16 inputs (PyTorch's
16-bit activations; CPU), each test once per format (the `half` fixture): float32 on the
widened values, the result rounded once to the input's dtype.  Every CPU implementation is
forced and compared with the float64 reference of the same 16-bit values, rounded: per
element within the format's rounding plus the float32 approximations' error; sizes across
the parallel kernel's chunks, views, read-only and broadcast inputs, NaN-poisoned out=,
NaN / inf, the largest finite value and subnormals, -0.0, threads, and bad input that
changes nothing."""
import numpy as np
import pytest

import dispatch
from tests.reference import activation as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, as_half, assert_half_close, concurrent_mismatches, half_limits,
                           impl_params, other_half, poisoned, randn, rng, run, strided)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 / float16 inputs are CPU inputs here")

F32_SLACK = 2e-6        # the float32 erf / exp approximations, relative to the terms' size

SHAPES = [(1,), (7,), (3, 5), (2, 3, 170)] if SMALL_SHAPES else [(1,), (7,), (3, 5), (2, 3, 1000), (4, 1, 16385)]
UNARY = [("relu", dispatch.relu, ref.relu, {}), ("silu", dispatch.silu, ref.silu, {}),
         ("gelu", dispatch.gelu, ref.gelu, {}), ("gelu", dispatch.gelu, ref.gelu, {"approximate": "tanh"})]
GATED = [("swiglu", dispatch.swiglu, ref.swiglu, {}), ("geglu", dispatch.geglu, ref.geglu, {}),
         ("geglu", dispatch.geglu, ref.geglu, {"approximate": "tanh"})]


def _cases(table):
    return [pytest.param(name, fn, r, kw, p.values[0], id=f"{name}{kw.get('approximate', '')}-{p.id}",
                         marks=p.marks)
            for name, fn, r, kw in table for p in impl_params(name, "cpu")]


def check(got, want, scale, what=""):
    """assert_half_close with the float32 approximations' error relative to the terms'
    size `scale` (|x|, or |x| * |up|); signs of zero aside."""
    assert_half_close(got, want, F32_SLACK * np.asarray(scale, np.float64), what)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(UNARY))
def test_unary_matches_reference(name, fn, reference, kw, impl, shape, half):
    x = as_half(half, randn(rng(), shape, np.float32) * 4)
    out = poisoned(shape, half)
    got = run(impl, fn, x, out=out, **kw)
    assert got is out
    check(got, reference(x, **kw), np.abs(np.asarray(x, np.float64)), f"{impl} {name}{kw} {shape}")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(GATED))
def test_gated_matches_reference(name, fn, reference, kw, impl, shape, half):
    g = rng()
    gate, up = as_half(half, randn(g, shape, np.float32) * 4), as_half(half, randn(g, shape, np.float32))
    out = poisoned(shape, half)
    got = run(impl, fn, gate, up, out=out, **kw)
    assert got is out
    scale = np.abs(np.asarray(gate, np.float64)) * np.abs(np.asarray(up, np.float64))
    check(got, reference(gate, up, **kw), scale, f"{impl} {name}{kw} {shape}")


@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(UNARY + GATED))
def test_special_values_views_and_out(name, fn, reference, kw, impl, half):
    """NaN, +-inf, +-0, the format's largest value and a subnormal; a strided and a read-only
    input, a broadcast one, a non-contiguous out= (filled by a copy); n = 0."""
    g = rng()
    big, tiny = half_limits(half)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, big, -big, tiny, -tiny, 1.5],
                       np.float32)
    n = special.size
    x = as_half(half, np.concatenate([special, randn(g, (70,), np.float32) * 3]))
    gated = name in ("swiglu", "geglu")
    up = as_half(half, np.concatenate([np.full(n, 0.5, np.float32), randn(g, (70,), np.float32)])) if gated else None
    args = (x, up) if gated else (x,)
    want = reference(*args, **kw)
    scale = np.abs(np.asarray(x, np.float64)) * (np.abs(np.asarray(up, np.float64)) if gated else 1)
    what = f"{impl} {name}{kw}"
    with np.errstate(invalid="ignore", over="ignore"):
        check(run(impl, fn, *args, **kw), want, scale, what + " special values")
        xs = tuple(strided(a) for a in args)
        assert not xs[0].flags.c_contiguous
        check(run(impl, fn, *xs, **kw), want, scale, what + " strided")
        ro = tuple(a.copy() for a in args)
        for a in ro:
            a.flags.writeable = False
        check(run(impl, fn, *ro, **kw), want, scale, what + " read-only")
        tout = np.full((2, x.size // 2), np.nan, half).T
        two = tuple(a.reshape(x.size // 2, 2) for a in args)
        assert run(impl, fn, *two, out=tout, **kw) is tout
        check(tout, reference(*two, **kw), scale.reshape(tout.shape), what + " non-contiguous out=")
    b = tuple(np.broadcast_to(a[n:n + 1], (5, 9)) for a in args)
    check(run(impl, fn, *b, **kw), reference(*b, **kw), np.ones((5, 9)) * 10, what + " broadcast")
    empty = run(impl, fn, *(a[:0] for a in args), **kw)
    assert empty.shape == (0,) and empty.dtype == half


def test_bad_input_changes_nothing(half):
    g = rng()
    x = as_half(half, randn(g, (3, 8), np.float32))
    out = np.full((3, 8), np.nan, half)
    with pytest.raises(TypeError, match=r"x must have dtype float32 or float64.*bfloat16 / float16"):
        dispatch.gelu(x.astype(np.int16), out=out)
    with pytest.raises(TypeError, match="up must have the same dtype as gate"):
        dispatch.swiglu(x, x.astype(other_half(half)), out=out)
    with pytest.raises(TypeError, match="up must have the same dtype as gate"):
        dispatch.swiglu(x, x.astype(np.float32), out=out)
    with pytest.raises(ValueError, match="up must have the shape of gate"):
        dispatch.geglu(x, x[:2], out=out)
    with pytest.raises((TypeError, ValueError), match="out"):
        dispatch.silu(x, out=np.full((3, 8), np.nan, np.float32))
    with pytest.raises((TypeError, ValueError), match="out"):
        dispatch.relu(x, out=out[:2])
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


def test_threads_bitwise(half):
    """Calls from 4 Python threads at once give each case its single-threaded bits."""
    g = rng()
    sizes = [3, 5000, 40000, 70000] if not SMALL_SHAPES else [3, 50, 100, 170]
    cases = [(as_half(half, randn(g, (n,), np.float32) * 3), as_half(half, randn(g, (n,), np.float32))) for n in sizes]

    def call(case):
        x, up = case
        return np.concatenate([dispatch.gelu(x).view(np.uint16), dispatch.swiglu(x, up).view(np.uint16),
                               dispatch.silu(x).view(np.uint16)])

    assert concurrent_mismatches(call, cases) == []
