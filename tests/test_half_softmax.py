"""softmax and log_softmax of bfloat16 / float16 x (PyTorch's 16-bit softmax; CPU), each
test once per format (the `half` fixture): float32 inside, each result rounded once to x's
dtype.  Every CPU implementation is forced and compared with the float64 reference of the
same 16-bit values: rows of 1 to 32000, any axis, -inf entries and NaN / all -inf rows, the
largest finite value, views, NaN-poisoned out=, threads, bad input."""
import numpy as np
import pytest

import dispatch
from tests.reference import softmax as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, as_half, assert_half_close, concurrent_mismatches, half_limits,
                           impl_params, poisoned, randn, rng, run, strided)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 / float16 x is a CPU input here")

F32_SLACK = 1e-5        # float32 exp / log and sums, relative to the terms (1, or |x| for log_softmax)

SHAPES = [(1,), (7,), (3, 5), (2, 3, 37)] if SMALL_SHAPES else [(1,), (7,), (3, 5), (1, 12, 8, 128), (2, 32000),
                                                               (5, 3, 9)]
OPS = [("softmax", dispatch.softmax, ref.softmax), ("log_softmax", dispatch.log_softmax, ref.log_softmax)]


def _cases():
    return [pytest.param(name, fn, r, p.values[0], id=f"{name}-{p.id}", marks=p.marks)
            for name, fn, r in OPS for p in impl_params(name, "cpu")]


def check(got, want, x, log, what=""):
    """assert_half_close with the float32 error relative to the terms (1, or |x| + 1 for
    log_softmax)."""
    terms = (np.abs(np.asarray(x, np.float64)) + 1.0) if log else 1.0
    assert_half_close(got, want, F32_SLACK * terms, what)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, impl", _cases())
def test_matches_reference(name, fn, reference, impl, shape, half):
    x = as_half(half, randn(rng(), shape, np.float32) * 4)
    log = name == "log_softmax"
    for axis in sorted({-1, 0}):
        out = poisoned(shape, half)
        got = run(impl, fn, x, axis, out=out)
        assert got is out
        with np.errstate(divide="ignore"):
            check(got, reference(x, axis), x, log, f"{impl} {shape} axis {axis}")


@pytest.mark.parametrize("name, fn, reference, impl", _cases())
def test_special_rows_views_and_out(name, fn, reference, impl, half):
    """-inf entries (0 / -inf), a NaN row, an all -inf row and a +inf row (all NaN), the
    largest finite value; a strided x, a non-contiguous out=; no rows."""
    g = rng()
    n = 9 if SMALL_SHAPES else 300
    x = randn(g, (6, n), np.float32) * 3
    x[0, ::3] = -np.inf
    x[1, 2] = np.nan
    x[2, :] = -np.inf
    x[3, 4] = np.inf
    x[4, 1] = half_limits(half)[0]
    x = as_half(half, x)
    log = name == "log_softmax"
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        want = reference(x)
        want[1:4] = np.nan       # as PyTorch (and the float32 kernels): such rows give NaN
        check(run(impl, fn, x), want, x, log, f"{impl} special rows")
        xs = strided(x)
        assert not xs.flags.c_contiguous
        check(run(impl, fn, xs), want, x, log, f"{impl} strided")
        tout = np.full((n, 6), np.nan, half).T
        assert run(impl, fn, x, out=tout) is tout
        check(tout, want, x, log, f"{impl} non-contiguous out=")
    empty = run(impl, fn, np.zeros((0, n), half))
    assert empty.shape == (0, n) and empty.dtype == half


def test_bad_input_changes_nothing(half):
    x = as_half(half, randn(rng(), (3, 8), np.float32))
    out = np.full((3, 8), np.nan, half)
    with pytest.raises(TypeError, match=r"x must have dtype float32 or float64.*bfloat16 / float16"):
        dispatch.softmax(x.astype(np.int16), out=out)
    with pytest.raises((TypeError, ValueError), match="out"):
        dispatch.log_softmax(x, out=np.full((3, 8), np.nan, np.float32))
    with pytest.raises(ValueError, match="axis"):
        dispatch.softmax(x, 2, out=out)
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


def test_threads_bitwise(half):
    g = rng()
    shapes = [(3, 7), (40, 128), (8, 3000), (300, 64)] if not SMALL_SHAPES else [(3, 7), (4, 16), (2, 30), (5, 9)]
    cases = [as_half(half, randn(g, s, np.float32) * 3) for s in shapes]

    def call(x):
        return np.concatenate([dispatch.softmax(x).view(np.uint16).ravel(),
                               dispatch.log_softmax(x).view(np.uint16).ravel()])

    assert concurrent_mismatches(call, cases) == []
