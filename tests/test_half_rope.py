"""rope of bfloat16 / float16 x (a 16-bit model's rotary embedding; CPU), each test once per
format (the `half` fixture): tables in x's dtype or float32, each value widened, the
rotation in float32, each result rounded once to x's dtype.  Every CPU implementation is
forced and compared with the float64 rotation of the same values: both layouts, batched x,
views, NaN-poisoned out=, NaN / inf, threads, bad input."""
import numpy as np
import pytest

import dispatch
from dispatch.ops.rope import tables
from tests.reference import rope as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, as_half, assert_half_close, concurrent_mismatches, impl_params,
                           other_half, poisoned, randn, rng, run, strided)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 / float16 x is a CPU input here")

F32_SLACK = 1e-6        # the float32 products and sum, relative to |a| + |b|

SHAPES = [(3, 4), (2, 5, 8)] if SMALL_SHAPES else [(1, 2), (3, 4), (2, 5, 8), (1, 12, 33, 64), (2, 3, 7, 128)]
IMPLS = impl_params("rope", "cpu")


def check(got, x, cos, sin, interleaved, what=""):
    """assert_half_close against the float64 rotation, the float32 error relative to
    |a| + |b| of each pair."""
    want = ref.rope(x, cos, sin, interleaved=interleaved)
    xa = np.abs(np.asarray(x, np.float64))
    d = x.shape[-1]
    partner = xa.reshape(-1, d // 2, 2)[..., ::-1].reshape(x.shape) if interleaved else np.roll(xa, d // 2, axis=-1)
    assert_half_close(got, want, F32_SLACK * (xa + partner), what)


@pytest.mark.parametrize("table_dtype", ["x's", "float32"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, shape, interleaved, table_dtype, half):
    x = as_half(half, randn(rng(), shape, np.float32) * 3)
    t = tables(shape[-2], shape[-1], half if table_dtype == "x's" else np.float32, offset=5)
    out = poisoned(shape, half)
    got = run(impl, dispatch.rope, x, t["cos"], t["sin"], interleaved=interleaved, out=out)
    assert got is out
    check(got, x, t["cos"], t["sin"], interleaved, f"{impl} {shape} {table_dtype} tables")


@pytest.mark.parametrize("impl", IMPLS)
def test_special_values_views_and_out(impl, half):
    g = rng()
    s, d = (4, 8) if SMALL_SHAPES else (9, 64)
    x = randn(g, (2, s, d), np.float32)
    x[0, 1, 3] = np.nan
    x[1, 2, 0] = np.inf
    x = as_half(half, x)
    t = tables(s, d, np.float32)
    with np.errstate(invalid="ignore"):
        check(run(impl, dispatch.rope, x, t["cos"], t["sin"]), x, t["cos"], t["sin"], False, f"{impl} NaN / inf")
        xs = strided(x)
        check(run(impl, dispatch.rope, xs, t["cos"], t["sin"]), x, t["cos"], t["sin"], False, f"{impl} strided")
        tout = np.full((d, s, 2), np.nan, half).transpose(2, 1, 0)
        assert run(impl, dispatch.rope, x, t["cos"], t["sin"], out=tout) is tout
        check(tout, x, t["cos"], t["sin"], False, f"{impl} non-contiguous out=")
    empty = run(impl, dispatch.rope, np.zeros((0, s, d), half), t["cos"], t["sin"])
    assert empty.shape == (0, s, d) and empty.dtype == half


def test_bad_input_changes_nothing(half):
    x = as_half(half, randn(rng(), (2, 4, 8), np.float32))
    t = tables(4, 8, np.float32)
    out = np.full(x.shape, np.nan, half)
    with pytest.raises(TypeError, match=f"cos must have dtype {half} or float32"):
        dispatch.rope(x, t["cos"].astype(np.float64), t["sin"], out=out)
    with pytest.raises(TypeError, match=f"cos must have dtype {half} or float32"):
        dispatch.rope(x, t["cos"].astype(other_half(half)), t["sin"].astype(other_half(half)), out=out)
    with pytest.raises(TypeError, match="sin must have the same dtype as cos"):
        dispatch.rope(x, t["cos"], t["sin"].astype(half), out=out)
    with pytest.raises(TypeError, match=r"x must have dtype float32 or float64.*bfloat16 / float16"):
        dispatch.rope(x.astype(np.int32), t["cos"], t["sin"], out=out)
    with pytest.raises((TypeError, ValueError), match="out"):
        dispatch.rope(x, t["cos"], t["sin"], out=np.full(x.shape, np.nan, np.float32))
    with pytest.raises(ValueError, match="cos must have shape"):
        dispatch.rope(x, t["cos"][:3], t["sin"][:3], out=out)
    with pytest.raises(TypeError, match="grad_out must have dtype float32 or float64"):
        dispatch.rope_backward(x, t["cos"], t["sin"])    # the backward op takes float32 / float64 only
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


def test_threads_bitwise(half):
    g = rng()
    shapes = [(1, 3, 8), (2, 40, 64), (4, 128, 128), (1, 300, 64)] if not SMALL_SHAPES else \
        [(1, 3, 8), (2, 4, 8), (1, 5, 16), (2, 3, 4)]
    cases = [(as_half(half, randn(g, s, np.float32)), tables(s[-2], s[-1], half)) for s in shapes]

    def call(case):
        x, t = case
        return dispatch.rope(x, t["cos"], t["sin"]).view(np.uint16)

    assert concurrent_mismatches(call, cases) == []
