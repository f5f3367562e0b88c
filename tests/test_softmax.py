"""dispatch.{softmax, log_softmax, cross_entropy} against float64 references, for every
implementation the dispatcher can pick on the target device."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import dispatch
from tests.reference import softmax as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, SEEDS, assert_close, assert_no_new_specialization,
                           broadcast_rows, impl_params, poisoned, randn, read_only, reduction_tol, rng, run, strided, to_target)

FULL = [(1,), (7,), (3, 5), (1, 1), (33, 1), (5, 1037), (2, 3, 257), (3, 32000), (2, 3, 4, 9)]
SMALL = [(7,), (3, 5), (1, 1), (5, 67), (2, 3, 37), (2, 3, 4, 9)]
SHAPES = SMALL if SMALL_SHAPES else FULL
DTYPES = [np.float32, np.float64]
OPS = [("softmax", dispatch.softmax, ref.softmax), ("log_softmax", dispatch.log_softmax, ref.log_softmax)]


def _cases(ops):
    out = []
    for name, fn, r in ops:
        for p in impl_params(name):
            out.append(pytest.param(name, fn, r, p.values[0], id=f"{name}-{p.id}", marks=p.marks))
    return out


def _tol(dtype, n):
    return reduction_tol(dtype, n)


def _kw(name):
    """assert_close options: probabilities have a small relative error everywhere (the
    strict default); a log-probability or a loss near 0 (a dominant entry) is a difference
    that cancels: log(sum) - (x - max), absolute error ~ eps * |x|."""
    return {} if name == "softmax" else {"cancel": True}


def assert_nonfinite_close(got, want, tol, what="", **kw):
    """Same NaN / +-inf pattern, finite entries within tol (assert_close checks both)."""
    assert_close(got, want, tol, what, **kw)


# ---- softmax / log_softmax ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, impl", _cases(OPS))
def test_matches_reference_last_axis(name, fn, reference, impl, shape, dtype):
    x = randn(rng(), shape, dtype) * 3
    out = poisoned(shape, dtype)
    got = run(impl, fn, x, out=out, _op=name)
    assert_close(got, reference(x), _tol(dtype, shape[-1]), name, **_kw(name))
    got2 = run(impl, fn, strided(x), _op=name)  # non-contiguous view, no out=
    assert_close(got2, reference(x), _tol(dtype, shape[-1]), name + " strided", **_kw(name))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 3, 4, 9)] if SMALL_SHAPES else [(3, 5, 7), (2, 1, 4, 33), (3, 1037)],
                         ids=str)
@pytest.mark.parametrize("name, fn, reference, impl", _cases(OPS))
def test_every_axis(name, fn, reference, impl, shape, dtype):
    x = randn(rng(), shape, dtype) * 3
    for axis in list(range(len(shape))) + [-1, -len(shape)]:
        out = poisoned(shape, dtype)
        got = run(impl, fn, x, axis, out=out, _op=name)
        assert_close(got, reference(x, axis), _tol(dtype, shape[axis]), f"{name} axis={axis}", **_kw(name))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, impl", _cases(OPS))
def test_transposed_and_sliced_views(name, fn, reference, impl, dtype):
    base = randn(rng(), (20, 37) if SMALL_SHAPES else (300, 130), dtype)
    for view in (base.T, base[3:31:2, 5:], base[::-1, ::3]):
        got = run(impl, fn, view, _op=name)
        assert_close(got, reference(view), _tol(dtype, view.shape[-1]), name + " view", **_kw(name))
        got0 = run(impl, fn, view, 0, _op=name)
        assert_close(got0, reference(view, 0), _tol(dtype, view.shape[0]), name + " view axis 0", **_kw(name))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, impl", _cases(OPS))
def test_huge_magnitudes_are_stable(name, fn, reference, impl, dtype):
    n = 37 if SMALL_SHAPES else 1029
    g = rng()
    x = randn(g, (6, n), dtype)
    x[0] = 1e30
    x[1] = -1e30
    x[2, ::2] = 1e30
    x[2, 1::2] = -1e30
    x[3, 5] = 1e30
    x[4] *= 1e30
    x[5] = dtype(-1e30) + x[5] * dtype(1e23)
    got = run(impl, fn, x, out=poisoned(x.shape, dtype), _op=name)
    assert np.all(np.isfinite(got))
    assert_close(got, reference(x), _tol(dtype, n), name, **_kw(name))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, impl", _cases(OPS))
def test_neg_inf_entries_and_nonfinite_rows(name, fn, reference, impl, dtype):
    """-inf entries give 0 (log: -inf); rows that are all -inf, or hold +inf or NaN, give
    NaN (documented; PyTorch gives NaN for these rows as well).  Rows of 100 share one
    block of the CPU kernel's short-row passes (kernels_cpu/softmax.py ROW_BLOCK), rows of
    1031 go one by one."""
    for n in ((41,) if SMALL_SHAPES else (100, 1031)):
        _check_nonfinite_rows(name, fn, reference, impl, dtype, n)


def _check_nonfinite_rows(name, fn, reference, impl, dtype, n):
    x = randn(rng(), (7, n), dtype)
    x[0, ::3] = -np.inf          # a causal-mask-like row
    x[1] = -np.inf               # all masked: NaN
    x[2, :-1] = -np.inf          # one survivor: exactly 1 (log 0)
    x[3, 17] = np.inf            # +inf: NaN row
    x[4, 9] = np.nan             # NaN: NaN row
    x[5, :] = -np.inf
    x[5, 0] = 1e30
    want = reference(x)
    got = run(impl, fn, x, out=poisoned(x.shape, dtype), _op=name)
    assert_nonfinite_close(got, want, _tol(dtype, n), name, **_kw(name))
    # and into zeros: the NaN rows must be written, not left as the poisoned out= held them
    got = run(impl, fn, x, out=to_target(np.zeros(x.shape, dtype)), _op=name)
    assert_nonfinite_close(got, want, _tol(dtype, n), name, **_kw(name))
    if name == "softmax":
        assert np.all(got[0, ::3] == 0) and got[2, -1] == 1 and np.all(got[2, :-1] == 0)
        assert np.all(np.isnan(got[1])) and np.all(np.isnan(got[3])) and np.all(np.isnan(got[4]))
    else:
        assert np.all(np.isneginf(got[0, ::3])) and got[2, -1] == 0


_hyp_settings = settings(max_examples=5 if SMALL_SHAPES else 40, deadline=None)


@pytest.mark.parametrize("impl", impl_params("softmax"))
@_hyp_settings
@given(data=st.data())
def test_property_softmax_rows_sum_to_one(impl, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9 if SMALL_SHAPES else 40))
    scale = data.draw(st.sampled_from([1.0, 30.0, 1e4, 1e30]))
    x = (randn(rng(data.draw(SEEDS, label="seed")), shape, dtype) * dtype(scale)).astype(dtype)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    p = run(impl, dispatch.softmax, x, axis)
    assert np.all(p >= 0) and np.all(p <= 1)
    np.testing.assert_allclose(p.astype(np.float64).sum(axis=axis), 1.0, atol=_tol(dtype, shape[axis]) * 4)


@pytest.mark.parametrize("impl", impl_params("log_softmax"))
@_hyp_settings
@given(data=st.data())
def test_property_log_softmax_is_log_of_softmax(impl, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9 if SMALL_SHAPES else 40))
    scale = data.draw(st.sampled_from([1.0, 30.0, 1e4]))
    x = (randn(rng(data.draw(SEEDS, label="seed")), shape, dtype) * dtype(scale)).astype(dtype)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ls = run(impl, dispatch.log_softmax, x, axis, _op="log_softmax")
    p = run(impl, dispatch.softmax, x, axis)
    assert np.all(ls <= 0)
    big = p > 1e-20  # log(softmax) is finite and well conditioned there
    atol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(ls[big], np.log(p[big].astype(np.float64)), atol=atol)


# ---- cross_entropy -----------------------------------------------------------------------

CE_SHAPES = [(1, 1), (7, 3), (13, 67)] if SMALL_SHAPES else [(1, 1), (7, 3), (33, 1037), (4, 32000), (300, 10)]
TARGET_DTYPES = [np.int64, np.int32, np.int16, np.uint8, np.uint64, np.int8]


@pytest.mark.skipif(ON_CUDA, reason="the CPU parallel kernel's block order")
def test_cross_entropy_parallel_sum_is_deterministic():
    """The parallel kernel adds its row blocks' losses in block order whichever thread ran
    which block: repeated calls give the same bits."""
    g = rng()
    logits = randn(g, (997, 300), np.float32) * 4
    targets = g.integers(0, 300, 997)
    with dispatch.use(cross_entropy="cpu-parallel"):
        first = dispatch.cross_entropy(logits, targets, reduction="sum")
        for _ in range(20):
            assert dispatch.cross_entropy(logits, targets, reduction="sum").tobytes() == first.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CE_SHAPES, ids=str)
@pytest.mark.parametrize("impl", impl_params("cross_entropy"))
def test_cross_entropy_matches_reference(impl, shape, dtype):
    g = rng()
    n, c = shape
    logits = randn(g, shape, dtype) * 4
    tdt = TARGET_DTYPES[g.integers(len(TARGET_DTYPES))]
    hi = min(c, np.iinfo(tdt).max + 1)
    targets = g.integers(0, hi, n).astype(tdt)
    ignore = -100
    if np.iinfo(tdt).min < 0 and n > 1:
        targets[g.random(n) < 0.3] = ignore  # some ignored rows
    tol = reduction_tol(dtype, c + n)
    for reduction in ("mean", "sum", "none"):
        got = run(impl, dispatch.cross_entropy, logits, targets, reduction=reduction, ignore_index=ignore)
        want = ref.cross_entropy(logits, targets, reduction=reduction, ignore_index=ignore)
        assert got.dtype == dtype
        assert np.shape(got) == np.shape(want), reduction
        if reduction == "none":
            assert np.all(got[targets.astype(np.int64) == ignore] == 0)
        if reduction == "mean" and np.isnan(want):  # every row ignored
            assert np.isnan(got)
        else:
            # a loss log(sum) - (x - max) near 0 carries the rounding of terms as large as
            # the logits (NK_TEST_SEED=3544578235, (7, 3): a mean loss of 4.5e-5 off by
            # 5.7e-4 of itself in float32, also at the start commit of 8bc9ac7)
            rows = int(np.sum(targets.astype(np.int64) != ignore)) if reduction == "sum" else 1
            scale = 2 * float(np.max(np.abs(logits))) * rows
            assert_close(got, want, tol, f"cross_entropy {reduction} targets {np.dtype(tdt)}", scale=scale,
                         **_kw("cross_entropy"))


@pytest.mark.parametrize("impl", impl_params("cross_entropy"))
def test_cross_entropy_ignore_index_is_a_class_and_all_ignored(impl):
    g = rng()
    logits = randn(g, (9, 5), np.float32)
    t = np.array([0, 2, 4, 2, 1, 2, 3, 2, 0])
    for reduction in ("mean", "sum", "none"):
        got = run(impl, dispatch.cross_entropy, logits, t, reduction=reduction, ignore_index=2)
        want = ref.cross_entropy(logits, t, reduction=reduction, ignore_index=2)
        assert_close(got, want, reduction_tol(np.float32, 14), reduction, **_kw("cross_entropy"))
    allign = np.full(9, -100)
    mean = run(impl, dispatch.cross_entropy, logits, allign)
    assert mean.shape == () and mean.dtype == np.float32 and np.isnan(mean)  # PyTorch: nan
    total = run(impl, dispatch.cross_entropy, logits, allign, reduction="sum")
    assert total.shape == () and total == 0
    none = run(impl, dispatch.cross_entropy, logits, allign, reduction="none")
    assert none.shape == (9,) and np.all(none == 0)


@pytest.mark.parametrize("impl", impl_params("cross_entropy"))
def test_cross_entropy_huge_logits(impl):
    x = np.array([[1e30, -1e30, 0.0], [-1e30, -1e30, 5.0], [3.0, 3.0, 3.0]], np.float32)
    t = np.array([0, 1, 2])
    got = run(impl, dispatch.cross_entropy, x, t, reduction="none")
    assert_close(got, ref.cross_entropy(x, t, reduction="none"), 1e-6, **_kw("cross_entropy"))
    # large offsets: x_t - max is exact, so the loss keeps full precision
    g = rng()
    x = (np.float32(1e4) + randn(g, (20, 37), np.float32)).astype(np.float32)
    t = g.integers(0, 37, 20)
    got = run(impl, dispatch.cross_entropy, x, t, reduction="none")
    assert_close(got, ref.cross_entropy(x, t, reduction="none"), 1e-5, "offset 1e4", **_kw("cross_entropy"))


# ---- read-only and broadcast inputs (host arrays) ---------------------------------------

@pytest.mark.skipif(ON_CUDA, reason="read-only host arrays: the CPU target")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, impl", _cases(OPS))
def test_read_only_and_broadcast_inputs(name, fn, reference, impl, dtype):
    x = randn(rng(), (6, 257), dtype) * 3
    for xx, what in [(read_only(x), "read-only"), (broadcast_rows(x), "broadcast_to"),
                     (read_only(x).T, "read-only transposed")]:
        for axis in (-1, 0):
            got = run(impl, fn, xx, axis, out=poisoned(xx.shape, dtype), _op=name)
            want = reference(np.array(xx), axis)
            assert_close(got, want, _tol(dtype, xx.shape[axis]), f"{name} {what} axis {axis}", **_kw(name))


@pytest.mark.skipif(ON_CUDA, reason="read-only host arrays: the CPU target")
@pytest.mark.parametrize("impl", impl_params("cross_entropy"))
def test_cross_entropy_read_only_inputs(impl):
    g = rng()
    logits = randn(g, (9, 40), np.float32) * 3
    t = g.integers(0, 40, 9)
    want = ref.cross_entropy(logits, t, reduction="none")
    for ll, tt, what in [(read_only(logits), read_only(t), "read-only"),
                         (np.broadcast_to(logits[:1], logits.shape), np.broadcast_to(t[:1], t.shape), "broadcast_to")]:
        got = run(impl, dispatch.cross_entropy, ll, tt, reduction="none")
        want = ref.cross_entropy(np.array(ll), np.array(tt), reduction="none")
        assert_close(got, want, reduction_tol(np.float32, 49), f"cross_entropy {what}", **_kw("cross_entropy"))


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
@pytest.mark.parametrize("impl", impl_params("softmax"))
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    """Read-only and broadcast inputs run the machine code compiled for writeable arrays:
    no new specialization of any softmax-family kernel, no warning."""
    from kernels_cpu import softmax as K

    g = rng()
    x = randn(g, (4, 50), np.float32)
    t = g.integers(0, 50, 4)
    ops = {"softmax": dispatch.softmax, "log_softmax": dispatch.log_softmax}
    for name, fn in ops.items():
        run(impl, fn, x, _op=name)
    run(impl, dispatch.cross_entropy, x, t, reduction="none")

    def variants():
        for name, fn in ops.items():
            run(impl, fn, read_only(x), _op=name)
            run(impl, fn, broadcast_rows(x), _op=name)
        run(impl, dispatch.cross_entropy, read_only(x), read_only(t), reduction="none")

    assert_no_new_specialization([K], variants, impl)


# ---- bad input ---------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="argument checks are device-independent")


@cpu_only
def test_bad_dtype_names_argument():
    with pytest.raises(TypeError, match="x must have dtype float32 or float64, got int64"):
        dispatch.softmax(np.arange(3))
    with pytest.raises(TypeError, match="logits must have dtype float32 or float64"):
        dispatch.cross_entropy(np.ones((2, 3), np.float16), np.zeros(2, np.int64))


@cpu_only
@pytest.mark.parametrize("axis, err", [(2, ValueError), (-3, ValueError), (1.0, TypeError), (None, TypeError),
                                       (True, TypeError)])
def test_bad_axis(axis, err):
    x = np.ones((2, 3), np.float32)
    out = np.zeros((2, 3), np.float32)
    with pytest.raises(err, match="axis"):
        dispatch.log_softmax(x, axis, out=out)
    assert np.all(out == 0)


@cpu_only
def test_zero_dim_rejected():
    with pytest.raises(ValueError, match="x must have at least 1 dimensions"):
        dispatch.softmax(np.ones((), np.float32))


@cpu_only
@pytest.mark.parametrize("bad_out, err, msg", [
    (np.zeros((3, 3), np.float32), ValueError, "out must have shape"),
    (np.zeros((2, 3), np.float64), TypeError, "out must have dtype"),
])
def test_bad_out_rejected_and_untouched(bad_out, err, msg):
    x = np.ones((2, 3), np.float32)
    before = bad_out.copy()
    with pytest.raises(err, match=msg):
        dispatch.softmax(x, out=bad_out)
    assert np.array_equal(bad_out, before)


@cpu_only
def test_out_aliasing_input_rejected():
    x = rng().random((4, 8)).astype(np.float32)
    before = x.copy()
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.softmax(x, out=x)
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.log_softmax(x[:2], out=x[1:3])
    assert np.array_equal(x, before)


@cpu_only
def test_read_only_out_rejected():
    out = np.zeros((2, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        dispatch.softmax(np.ones((2, 3), np.float32), out=out)


@cpu_only
def test_not_an_array_rejected():
    with pytest.raises(TypeError, match="x must be a numpy array or a CUDA device array, got list"):
        dispatch.softmax([1.0, 2.0])


@cpu_only
@pytest.mark.parametrize("kwargs, err, msg", [
    (dict(targets=np.zeros(3, np.float32)), TypeError, "targets must have an integer dtype, got float32"),
    (dict(targets=np.zeros(3, bool)), TypeError, "targets must have an integer dtype, got bool"),
    (dict(targets=np.zeros(4, np.int64)), ValueError, r"targets must have shape \(3,\)"),
    (dict(targets=np.zeros((3, 1), np.int64)), ValueError, r"targets must have shape \(3,\)"),
    (dict(targets=np.array([0, 5, 1])), ValueError, r"targets\[1\] = 5 is out of range"),
    (dict(targets=np.array([0, -1, 1])), ValueError, r"targets\[1\] = -1 is out of range"),
    (dict(targets=np.array([0, 1, 2**63 + 5], np.uint64)), ValueError, r"targets\[2\] = .* is out of range"),
    (dict(logits=np.zeros((3, 5, 1), np.float32)), ValueError, "logits must have 2 dimensions"),
    (dict(logits=np.zeros(5, np.float32)), ValueError, "logits must have 2 dimensions"),
    (dict(reduction="avg"), ValueError, "reduction must be one of"),
    (dict(ignore_index=1.5), TypeError, "ignore_index must be an int"),
])
def test_cross_entropy_bad_inputs(kwargs, err, msg):
    args = dict(logits=np.zeros((3, 5), np.float32), targets=np.zeros(3, np.int64))
    args.update(kwargs)
    logits, targets = args.pop("logits"), args.pop("targets")
    with pytest.raises(err, match=msg):
        dispatch.cross_entropy(logits, targets, **args)


@cpu_only
@pytest.mark.parametrize("impl", impl_params("cross_entropy"))
def test_cross_entropy_out_of_range_with_every_impl(impl):
    with dispatch.use(cross_entropy=impl):
        with pytest.raises(ValueError, match=r"targets\[0\] = 7 is out of range"):
            dispatch.cross_entropy(np.zeros((2, 7), np.float64), np.array([7, -100]), reduction="none")


@cpu_only
def test_explain_names_the_rule():
    text = str(dispatch.explain("softmax", np.ones((4, 8), np.float32), 0))
    assert "chosen: cpu-" in text and "moved last" in text


@cpu_only
def test_empty_inputs():
    assert dispatch.softmax(np.ones((0, 5), np.float32)).shape == (0, 5)
    assert dispatch.log_softmax(np.ones((3, 0), np.float32), 0).shape == (3, 0)
    logits, t = np.ones((0, 4), np.float32), np.zeros(0, np.int64)
    assert np.isnan(dispatch.cross_entropy(logits, t))  # mean over no rows, as PyTorch
    assert dispatch.cross_entropy(logits, t, reduction="sum") == 0
    assert dispatch.cross_entropy(logits, t, reduction="none").shape == (0,)


@pytest.mark.skipif(ON_CUDA, reason="the CPU kernels' raw-memory guard")
def test_cross_entropy_workers_refuse_arrays_they_cannot_read_raw():
    """The by-address workers read raw memory: their launchers refuse a non-contiguous or
    wrongly typed array, naming it, before any worker runs."""
    from kernels_cpu import softmax as K, softmax_grad as KG
    x = np.zeros((8, 10), np.float32)
    t = np.zeros(8, np.int64)
    losses = np.full(8, 7.0, np.float32)
    with pytest.raises(ValueError, match="cross_entropy_parallel: x must be C-contiguous"):
        K.cross_entropy_parallel(np.zeros((10, 8), np.float32).T, t, -100, losses)
    with pytest.raises(ValueError, match="cross_entropy_parallel: targets must be C-contiguous int64"):
        K.cross_entropy_parallel(x, t.astype(np.int32), -100, losses)
    with pytest.raises(ValueError, match="ce_grad_parallel: grad must be C-contiguous float32"):
        KG.ce_grad_parallel(x, t, -100, x.astype(np.float64), losses, np.ones(1, np.float32), False, 1.0)
    assert (losses == 7.0).all()
