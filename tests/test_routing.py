"""dispatch.topk_softmax against the float64 reference of tests/reference/routing.py, for
every implementation on the target device (CPU: cpu-serial, cpu-parallel; CUDA, on a GPU
or the simulator: cuda-warp-row): the chosen experts exactly (ties included), the weights
within the float tolerance, and the routing properties."""
import numpy as np
import pytest

import dispatch
from tests.reference import routing as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, assert_close, impl_params, randn, read_only, reduction_tol, rng, run,
                           strided)

DTYPES = [np.float32, np.float64]
IMPLS = impl_params("topk_softmax")

# (T, E, k): T = 1, E = 1, k = 1 and k = E, Mixtral's 8 / 2, DeepSeek-V2(-Lite)'s 64 and
# 160 / 6, 256 / 8; the full list adds many rows (several parallel tasks).
SMALL = [(1, 1, 1), (3, 8, 2), (2, 8, 8), (5, 3, 1), (2, 40, 6)]
FULL = SMALL + [(1, 8, 2), (33, 64, 6), (17, 160, 6), (9, 256, 8), (3000, 8, 2), (700, 64, 6)]
CASES = SMALL if SMALL_SHAPES else FULL


def _logits(g, t, e, dtype, ties):
    """Standard-normal logits; with ties, rounded to multiples of 1/2 so that rows hold
    many exactly equal logits."""
    x = randn(g, (t, e), dtype) * dtype(2)
    return (np.round(x * 2) / 2).astype(dtype) if ties else x


def _topk(impl, logits, k, **kw):
    return run(impl, dispatch.topk_softmax, logits, k, _op="topk_softmax", **kw)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_topk_softmax_matches_reference(impl, case, dtype, ties, renormalize):
    t, e, k = case
    x = _logits(rng(), t, e, dtype, ties)
    want_w, want_i = ref.topk_softmax(x, k, renormalize=renormalize)
    w, i = _topk(impl, x, k, renormalize=renormalize)
    assert w.dtype == dtype and i.dtype == np.int64 and w.shape == i.shape == (t, k)
    np.testing.assert_array_equal(i, want_i)
    assert_close(w, want_w, reduction_tol(dtype, e), "weights")
    if ON_CUDA:
        return  # run() copies non-contiguous host arrays to contiguous device arrays
    w2, i2 = _topk(impl, strided(x), k, renormalize=renormalize)
    np.testing.assert_array_equal(i2, i)
    # Bit for bit.  Once in CI (2026-11-26, NK_TEST_SEED=4266796053, cpu-parallel, (700, 64,
    # 6) float32 with ties, renormalize) one row's weights came out 2 ulp apart between the
    # two calls: the loop that wrote the renormalized weights also summed them, and LLVM's
    # vectorizer ran it as a scalar loop (another summation order) when the output row lay
    # within one vector step of the loop's loads (tests/ir_checks.py, which found it).
    np.testing.assert_array_equal(w2, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_routing_properties(impl, dtype):
    """Renormalized weights sum to 1; indices distinct and in range; weights descending;
    without renormalize they are the softmax probabilities (sum <= 1)."""
    g = rng()
    t, e, k = (4, 16, 4) if SMALL_SHAPES else (200, 64, 6)
    x = _logits(g, t, e, dtype, ties=True)
    w, i = _topk(impl, x, k)
    tol = reduction_tol(dtype, k)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=tol, atol=0)
    assert (np.diff(w, axis=1) <= 0).all()
    assert ((i >= 0) & (i < e)).all()
    assert all(len(set(row)) == k for row in i.tolist())
    p, ip = _topk(impl, x, k, renormalize=False)
    np.testing.assert_array_equal(ip, i)
    assert (p.sum(axis=1) <= 1 + tol).all()
    np.testing.assert_allclose(w, p / p.sum(axis=1, keepdims=True), rtol=4 * tol)


@pytest.mark.parametrize("impl", IMPLS)
def test_ties_go_to_the_lower_expert_index(impl):
    """Equal logits rank by index: a constant row picks experts 0..k-1 with equal weights;
    a row with two equal maxima picks the lower first; -inf experts (probability 0) are
    taken last, in index order."""
    e = 8
    x = np.zeros((4, e), np.float32)
    x[1, [2, 6]] = 3.0
    x[2, [5, 1, 7]] = 1.0
    x[3] = -np.inf
    x[3, [4, 6]] = 0.5
    w, i = _topk(impl, x, 4)
    np.testing.assert_array_equal(i, [[0, 1, 2, 3], [2, 6, 0, 1], [1, 5, 7, 0], [4, 6, 0, 1]])
    np.testing.assert_allclose(w[0], 0.25, rtol=1e-6)
    np.testing.assert_allclose(w[3], [0.5, 0.5, 0, 0], rtol=1e-6)
    w1, i1 = _topk(impl, x, 1, renormalize=False)
    np.testing.assert_array_equal(i1[:, 0], [0, 2, 1, 4])
    np.testing.assert_allclose(w1[:, 0], [1 / 8, np.exp(3) / (2 * np.exp(3) + 6), np.e / (3 * np.e + 5), 0.5],
                               rtol=1e-6)


@pytest.mark.parametrize("e", [8, 80])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_rows_without_a_softmax_give_nan(impl, dtype, e):
    """A NaN, a +inf, or only -inf in a row: NaN weights and indices 0..k-1 there; the other
    rows as usual (huge finite logits do not overflow; a row of two finite logits among
    -inf ones takes -inf experts in index order).  E 80 runs the CPU's group prefilter."""
    g = rng()
    x = _logits(g, 6, e, dtype, ties=False)
    x[0, 3] = np.nan
    x[1, e - 1] = np.inf
    x[2] = -np.inf
    x[3] += dtype(3e4 if dtype == np.float32 else 3e300)
    x[4, 2:] = -np.inf
    for renormalize in (True, False):
        w, i = _topk(impl, x, 3, renormalize=renormalize)
        assert np.isnan(w[:3]).all() and (i[:3] == [0, 1, 2]).all()
        assert i[4, 2] == 2 and w[4, 2] == 0
        want_w, want_i = ref.topk_softmax(x, 3, renormalize=renormalize)
        np.testing.assert_array_equal(i, want_i)
        assert_close(w, want_w, reduction_tol(dtype, e), "weights")


@pytest.mark.skipif(ON_CUDA, reason="host layouts")
@pytest.mark.parametrize("impl", IMPLS)
def test_read_only_and_broadcast_logits(impl):
    g = rng()
    x = _logits(g, 6, 16, np.float32, ties=True)
    w, i = _topk(impl, x, 3)
    w2, i2 = _topk(impl, read_only(x), 3)
    np.testing.assert_array_equal(w2, w)
    np.testing.assert_array_equal(i2, i)
    w3, i3 = _topk(impl, np.broadcast_to(x[:1], x.shape), 3)
    np.testing.assert_array_equal(i3, np.broadcast_to(i[:1], i.shape))
    np.testing.assert_array_equal(w3, np.broadcast_to(w[:1], w.shape))


@pytest.mark.skipif(ON_CUDA, reason="host-only edge case")
def test_no_tokens():
    w, i = dispatch.topk_softmax(np.ones((0, 8), np.float32), 2)
    assert w.shape == i.shape == (0, 2) and w.dtype == np.float32 and i.dtype == np.int64


@pytest.mark.skipif(ON_CUDA, reason="the CPU rule")
def test_rules():
    def chosen(x, k=2):
        return dispatch.explain("topk_softmax", x, k).chosen

    assert chosen(np.ones((1, 8), np.float32)) == "cpu-serial"
    assert chosen(np.ones((64, 8), np.float32)) == "cpu-serial"
    assert chosen(np.ones((4096, 64), np.float32)) == "cpu-parallel"


@pytest.mark.skipif(not ON_CUDA, reason="float16 runs on CUDA only")
def test_float16_logits_give_float32_weights():
    x = _logits(rng(), 3, 8, np.float16, ties=True)
    w, i = _topk(IMPLS[0].values[0], x, 2)
    want_w, want_i = ref.topk_softmax(x, 2)
    assert w.dtype == np.float32
    np.testing.assert_array_equal(i, want_i)
    assert_close(w, want_w, 1e-5, "float16 logits")


# ---- bad input ---------------------------------------------------------------------------------

X = np.ones((3, 8), np.float32)
BAD = [
    ((X, 0), {}, ValueError, r"k must be in \[1, E\] = \[1, 8\]"),
    ((X, 9), {}, ValueError, r"k must be in \[1, E\] = \[1, 8\] .*got 9"),
    ((X, -1), {}, ValueError, "k must be in"),
    ((X, 2.0), {}, TypeError, "k must be an int, got float"),
    ((X, True), {}, TypeError, "k must be an int, got bool"),
    ((X, None), {}, TypeError, "k must be an int"),
    ((np.ones((3, 0), np.float32), 1), {}, ValueError, r"k must be in \[1, E\] = \[1, 0\]"),
    ((X[0], 2), {}, ValueError, r"logits must have 2 dimensions \(T, E\)"),
    ((X[None], 2), {}, ValueError, "logits must have 2 dimensions"),
    ((X.astype(np.int64), 2), {}, TypeError, "logits must have dtype float32 or float64"),
    ((None, 2), {}, TypeError, "logits must be an array, got None"),
    (([[1.0, 2.0]], 1), {}, TypeError, "logits must be a numpy array"),
    ((X, 2), {"renormalize": 1}, TypeError, "renormalize must be a bool"),
    ((X, 2), {"renormalize": None}, TypeError, "renormalize must be a bool"),
]


@pytest.mark.skipif(ON_CUDA, reason="argument checks are device-independent")
@pytest.mark.parametrize("args, kw, err, msg", BAD, ids=[f"{i}-{b[3][:30]}" for i, b in enumerate(BAD)])
def test_bad_inputs_raise_naming_the_argument(args, kw, err, msg):
    with pytest.raises(err, match=msg):
        dispatch.topk_softmax(*args, **kw)
    with pytest.raises(err, match=msg):
        dispatch.explain("topk_softmax", *args, **kw)
