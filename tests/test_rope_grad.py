"""dispatch.rope_backward against the float64 reference (the inverse rotation, checked itself
against PyTorch autograd of the forward reference), both layouts, for every implementation
the dispatcher can pick on the target device."""
import numpy as np
import pytest

import dispatch
from tests.reference import rope as fwd
from tests.reference import rope_grad as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, TOL, assert_close, assert_no_new_specialization, broadcast_rows,
                           impl_params, poisoned, randn, read_only, rng, run, strided)

# (..., S, D): 2-D, (B, S, D), (B, H, S, D), odd sizes, and one past the parallel threshold
FULL = [(1, 2), (7, 10), (5, 3, 64), (2, 4, 33, 128), (1, 1, 1, 2), (2, 300, 62)]
SMALL = [(1, 2), (7, 10), (2, 3, 5, 6)]
SHAPES = SMALL if SMALL_SHAPES else FULL
DTYPES = [np.float32, np.float64]
LAYOUTS = pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
host_only = pytest.mark.skipif(ON_CUDA, reason="host-array checks run on the CPU target")


def _tables(g, s, d, dtype):
    """cos / sin of real angles (as a model builds them), (S, D/2)."""
    inv = 10000.0 ** (-np.arange(d // 2) / max(d // 2, 1))
    ang = np.arange(s)[:, None] * inv[None, :] + g.random((s, d // 2))
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


@host_only
@LAYOUTS
def test_reference_matches_torch_autograd(interleaved):
    torch = pytest.importorskip("torch")
    g = rng()
    x, grad = randn(g, (2, 3, 9, 16), np.float64), randn(g, (2, 3, 9, 16), np.float64)
    c, s = _tables(g, 9, 16, np.float64)
    xt = torch.from_numpy(x).requires_grad_(True)
    ct, st = torch.from_numpy(c), torch.from_numpy(s)
    if interleaved:
        a, b = xt[..., 0::2], xt[..., 1::2]
        y = torch.stack([a * ct - b * st, b * ct + a * st], dim=-1).flatten(-2)
    else:
        a, b = xt[..., :8], xt[..., 8:]
        y = torch.cat([a * ct - b * st, b * ct + a * st], dim=-1)
    np.testing.assert_allclose(y.detach().numpy(), fwd.rope(x, c, s, interleaved=interleaved), rtol=1e-14, atol=1e-14)
    (want,) = torch.autograd.grad(y, [xt], torch.from_numpy(grad))
    assert_close(ref.rope_backward(grad, c, s, interleaved=interleaved), want.numpy(), 1e-9, "rope_backward",
                 cancel=True)


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("impl", impl_params("rope_backward"))
def test_matches_reference(impl, shape, dtype, interleaved):
    g = rng()
    grad = randn(g, shape, dtype)
    c, s = _tables(g, shape[-2], shape[-1], dtype)
    want = ref.rope_backward(grad, c, s, interleaved=interleaved)
    got = run(impl, dispatch.rope_backward, grad, c, s, interleaved=interleaved, out=poisoned(shape, dtype))
    assert got.dtype == dtype
    assert_close(got, want, TOL[np.dtype(dtype)], "rope_backward", cancel=True)
    # non-contiguous grad_out and tables, no out=
    got2 = run(impl, dispatch.rope_backward, strided(grad), strided(c), strided(s), interleaved=interleaved)
    assert_close(got2, want, TOL[np.dtype(dtype)], "rope_backward strided", cancel=True)


@LAYOUTS
@pytest.mark.parametrize("impl", impl_params("rope_backward"))
def test_undoes_rope(impl, interleaved):
    """rope_backward(rope(x)) = x: the rotation is orthogonal (float64, round-off only)."""
    g = rng()
    shape = (2, 3, 5, 6) if SMALL_SHAPES else (2, 4, 37, 64)
    x = randn(g, shape, np.float64)
    c, s = _tables(g, shape[-2], shape[-1], np.float64)
    y = fwd.rope(x, c, s, interleaved=interleaved)
    back = run(impl, dispatch.rope_backward, y, c, s, interleaved=interleaved)
    assert_close(back, x, 1e-14, "rope_backward(rope(x))", cancel=True)


@pytest.mark.parametrize("impl", impl_params("rope_backward"))
def test_nan_in_gives_nan_out(impl):
    g = rng()
    grad = randn(g, (1, 3, 8), np.float32)
    c, s = _tables(g, 3, 8, np.float32)
    grad[0, 1, 2] = np.nan  # rotate-half: pair (2, 6) of row 1
    c[2, 1] = np.nan        # row 2, pair (1, 5)
    got = run(impl, dispatch.rope_backward, grad, c, s)
    want = ref.rope_backward(grad, c, s)
    assert np.isnan(got[0, 1, [2, 6]]).all() and np.isnan(got[0, 2, [1, 5]]).all()
    assert np.isnan(got).sum() == 4
    assert_close(got, want, TOL[np.dtype(np.float32)], "rope_backward NaN", cancel=True)


@host_only
def test_returns_new_array_or_out():
    g = rng().random((3, 8)).astype(np.float32)
    c, s = np.ones((3, 4), np.float32), np.zeros((3, 4), np.float32)
    y = dispatch.rope_backward(g, c, s)
    assert y is not g and np.array_equal(y, g)
    out = np.empty_like(g)
    assert dispatch.rope_backward(g, c, s, out=out) is out


@host_only
@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("rope_backward"))
def test_read_only_and_broadcast_inputs(impl, dtype, interleaved):
    g = rng()
    grad = randn(g, (3, 4, 9, 16), dtype)
    c, s = _tables(g, 9, 16, dtype)
    for gg, cc, ss, what in [(read_only(grad), read_only(c), read_only(s), "read-only"),
                             (broadcast_rows(grad), c, s, "broadcast grad_out"),
                             (grad, broadcast_rows(c), broadcast_rows(s), "broadcast tables")]:
        got = run(impl, dispatch.rope_backward, gg, cc, ss, interleaved=interleaved, out=poisoned(grad.shape, dtype))
        want = ref.rope_backward(np.array(gg), np.array(cc), np.array(ss), interleaved=interleaved)
        assert_close(got, want, TOL[np.dtype(dtype)], f"rope_backward {what}", cancel=True)


@host_only
@pytest.mark.parametrize("impl", impl_params("rope_backward"))
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    from kernels_cpu import rope as K   # the CPU backward runs rope's kernels

    g = rng()
    grad = randn(g, (2, 7, 16), np.float32)
    c, s = _tables(g, 7, 16, np.float32)
    run(impl, dispatch.rope_backward, grad, c, s)
    run(impl, dispatch.rope_backward, grad, c, s, interleaved=True)

    def variants():
        run(impl, dispatch.rope_backward, read_only(grad), read_only(c), read_only(s))
        run(impl, dispatch.rope_backward, broadcast_rows(grad), broadcast_rows(c), s, interleaved=True)

    assert_no_new_specialization([K], variants, impl)


# ---- bad input ---------------------------------------------------------------------------

G = np.ones((2, 5, 8), np.float32)
C = np.ones((5, 4), np.float32)


@host_only
@pytest.mark.parametrize("args, kw, err, msg", [
    ((np.ones((5, 8), np.int64), C, C), {}, TypeError, "grad_out must have dtype float32 or float64"),
    ((G, C.astype(np.float64), C), {}, TypeError, r"cos must have the same dtype as grad_out \(float32\)"),
    ((G, C, C.astype(np.float64)), {}, TypeError, "sin must have the same dtype as grad_out"),
    ((np.ones((5, 7), np.float32), np.ones((5, 3), np.float32), np.ones((5, 3), np.float32)), {}, ValueError,
     "grad_out must have an even last dimension"),
    ((np.ones(8, np.float32), C, C), {}, ValueError, "grad_out must have at least 2 dimensions"),
    ((G, np.ones((4, 4), np.float32), C), {}, ValueError, r"cos must have shape \(5, 4\)"),
    ((G, C, np.ones((5, 8), np.float32)), {}, ValueError, r"sin must have shape \(5, 4\)"),
    ((G, C, C), {"interleaved": "yes"}, TypeError, "interleaved must be a bool"),
    ((None, C, C), {}, TypeError, "grad_out must be an array, got None"),
])
def test_bad_inputs(args, kw, err, msg):
    with pytest.raises(err, match=msg):
        dispatch.rope_backward(*args, **kw)


@host_only
def test_bad_out_rejected_and_untouched():
    g = rng()
    grad = g.random((2, 5, 8)).astype(np.float32)
    c = g.random((5, 4)).astype(np.float32)
    for bad, err, msg in [(np.full((2, 5, 6), np.nan, np.float32), ValueError, "out must have shape"),
                          (np.full((2, 5, 8), np.nan, np.float64), TypeError, "out must have dtype")]:
        with pytest.raises(err, match=msg):
            dispatch.rope_backward(grad, c, c, out=bad)
        assert np.isnan(bad).all()
    before = grad.copy()
    with pytest.raises(ValueError, match="out overlaps input grad_out"):
        dispatch.rope_backward(grad, c, c, out=grad)
    assert np.array_equal(grad, before)
