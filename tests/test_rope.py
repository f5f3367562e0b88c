"""dispatch.rope against the float64 reference, both layouts, for every implementation the
dispatcher can pick on the target device."""
import numpy as np
import pytest

import dispatch
from tests.reference import rope as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, TOL, assert_close, assert_no_new_specialization, broadcast_rows,
                           impl_params, poisoned, randn, read_only, rng, run, strided)

# (..., S, D): 2-D, (B, S, D), (B, H, S, D) and odd sizes
FULL = [(1, 2), (7, 10), (5, 3, 64), (2, 4, 33, 128), (3, 2, 5, 6), (1, 1, 1, 2), (2, 300, 62)]
SMALL = [(1, 2), (7, 10), (2, 3, 5, 6), (2, 2, 9, 16), (3, 11, 4)]
SHAPES = SMALL if SMALL_SHAPES else FULL
DTYPES = [np.float32, np.float64]


def _tables(g, s, d, dtype):
    """cos / sin of real angles (as a model builds them), (S, D/2)."""
    inv = 10000.0 ** (-np.arange(d // 2) / max(d // 2, 1))
    ang = np.arange(s)[:, None] * inv[None, :] + g.random((s, d // 2))
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("impl", impl_params("rope"))
def test_matches_reference(impl, shape, dtype, interleaved):
    g = rng()
    x = randn(g, shape, dtype)
    c, s = _tables(g, shape[-2], shape[-1], dtype)
    out = poisoned(shape, dtype)
    got = run(impl, dispatch.rope, x, c, s, interleaved=interleaved, out=out)
    want = ref.rope(x, c, s, interleaved=interleaved)
    assert got.dtype == dtype
    assert_close(got, want, TOL[np.dtype(dtype)], "rope", cancel=True)
    # non-contiguous x and tables, no out=
    got2 = run(impl, dispatch.rope, strided(x), strided(c), strided(s), interleaved=interleaved)
    assert_close(got2, want, TOL[np.dtype(dtype)], "rope strided", cancel=True)


@pytest.mark.parametrize("impl", impl_params("rope"))
def test_layouts_agree_up_to_permutation(impl):
    """The interleaved layout is the rotate-half layout with the last axis permuted."""
    g = rng()
    b, h, s, d = (2, 3, 7, 16) if SMALL_SHAPES else (2, 4, 37, 64)
    x = randn(g, (b, h, s, d), np.float64)
    c, sn = _tables(g, s, d, np.float64)
    perm = np.empty(d, np.int64)
    perm[0::2] = np.arange(d // 2)
    perm[1::2] = np.arange(d // 2) + d // 2  # interleaved position k holds rotate-half index perm[k]
    half = run(impl, dispatch.rope, x, c, sn)
    inter = run(impl, dispatch.rope, np.ascontiguousarray(x[..., perm]), c, sn, interleaved=True)
    assert_close(inter, half[..., perm], 1e-12, cancel=True)
    # rotation keeps each pair's norm
    np.testing.assert_allclose(np.linalg.norm(half, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)


@pytest.mark.skipif(ON_CUDA, reason="host-only check")
def test_returns_new_array_or_out():
    x = rng().random((3, 8)).astype(np.float32)
    c, s = np.ones((3, 4), np.float32), np.zeros((3, 4), np.float32)
    y = dispatch.rope(x, c, s)
    assert y is not x and np.array_equal(y, x)
    out = np.empty_like(x)
    assert dispatch.rope(x, c, s, out=out) is out


@pytest.mark.skipif(ON_CUDA, reason="read-only host arrays: the CPU target")
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("rope"))
def test_read_only_and_broadcast_inputs(impl, dtype, interleaved):
    """Read-only x and tables, x broadcast over the batch (np.broadcast_to), and tables
    that are broadcast views themselves (one angle row for every position)."""
    g = rng()
    x = randn(g, (3, 4, 9, 16), dtype)
    c, s = _tables(g, 9, 16, dtype)
    for xx, cc, ss, what in [(read_only(x), read_only(c), read_only(s), "read-only"),
                             (broadcast_rows(x), c, s, "broadcast x"),
                             (x, broadcast_rows(c), broadcast_rows(s), "broadcast tables")]:
        got = run(impl, dispatch.rope, xx, cc, ss, interleaved=interleaved, out=poisoned(x.shape, dtype))
        want = ref.rope(np.array(xx), np.array(cc), np.array(ss), interleaved=interleaved)
        assert_close(got, want, TOL[np.dtype(dtype)], f"rope {what}", cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
@pytest.mark.parametrize("impl", impl_params("rope"))
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    """Read-only and broadcast inputs run the machine code compiled for writeable arrays:
    no new specialization of any rope kernel, no warning."""
    from kernels_cpu import rope as K

    g = rng()
    x = randn(g, (2, 7, 16), np.float32)
    c, s = _tables(g, 7, 16, np.float32)
    run(impl, dispatch.rope, x, c, s)
    run(impl, dispatch.rope, x, c, s, interleaved=True)

    def variants():
        run(impl, dispatch.rope, read_only(x), read_only(c), read_only(s))
        run(impl, dispatch.rope, broadcast_rows(x), broadcast_rows(c), s, interleaved=True)

    assert_no_new_specialization([K], variants, impl)


# ---- bad input ---------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="argument checks are device-independent")
X = np.ones((2, 5, 8), np.float32)
C = np.ones((5, 4), np.float32)


@cpu_only
@pytest.mark.parametrize("args, kw, err, msg", [
    ((np.ones((5, 8), np.int64), C, C), {}, TypeError, "x must have dtype float32 or float64"),
    ((X, C.astype(np.float64), C), {}, TypeError, r"cos must have the same dtype as x \(float32\)"),
    ((X, C, C.astype(np.float64)), {}, TypeError, "sin must have the same dtype as x"),
    ((np.ones((5, 7), np.float32), np.ones((5, 3), np.float32), np.ones((5, 3), np.float32)), {}, ValueError,
     "x must have an even last dimension"),
    ((np.ones(8, np.float32), C, C), {}, ValueError, "x must have at least 2 dimensions"),
    ((X, np.ones((4, 4), np.float32), C), {}, ValueError, r"cos must have shape \(5, 4\)"),
    ((X, C, np.ones((5, 8), np.float32)), {}, ValueError, r"sin must have shape \(5, 4\)"),
    ((X, C, C), {"interleaved": "yes"}, TypeError, "interleaved must be a bool"),
])
def test_bad_inputs(args, kw, err, msg):
    with pytest.raises(err, match=msg):
        dispatch.rope(*args, **kw)


@cpu_only
def test_bad_out_rejected_and_untouched():
    g = rng()
    x = g.random((2, 5, 8)).astype(np.float32)
    c = g.random((5, 4)).astype(np.float32)
    for bad, err, msg in [(np.zeros((2, 5, 6), np.float32), ValueError, "out must have shape"),
                          (np.zeros((2, 5, 8), np.float64), TypeError, "out must have dtype")]:
        before = bad.copy()
        with pytest.raises(err, match=msg):
            dispatch.rope(x, c, c, out=bad)
        assert np.array_equal(bad, before)
    xs = x.copy()
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.rope(x, c, c, out=x)
    assert np.array_equal(x, xs)
