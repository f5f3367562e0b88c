"""dispatch.interpolate (nearest, nearest-exact, bilinear with and without align_corners)
against the float64 reference, for every implementation the dispatcher can pick on the target
device; PyTorch itself on a few cases when it is installed; bad inputs leave out= untouched."""
import math

import numpy as np
import pytest

import dispatch
from tests.reference import resample as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, TOL, assert_close, assert_no_new_specialization, impl_params,
                           poisoned, randn, read_only, rng, run, strided)

OP = "interpolate"
IMPLS = impl_params(OP)
DTYPES = [np.float32, np.float64]

# (x shape, size / scale arguments): sizes up and down, non-integer ratios, 1x1 input, output
# 1, size as int and pair, scale_factor as int, float and pair (integer and not), recompute
# both ways, one axis copied (out == in), batch 1 and 3, channels 3, 5, 13.
FULL = [
    ((1, 3, 7, 10), dict(size=(10, 7))),                      # 7 -> 10 up, 10 -> 7 down
    ((3, 5, 10, 7), dict(size=(7, 10))),
    ((1, 13, 1, 1), dict(size=(3, 4))),                       # 1x1 input
    ((3, 5, 7, 7), dict(size=1)),                             # int size, output 1x1
    ((1, 3, 7, 7), dict(size=(1, 9))),
    ((1, 3, 7, 10), dict(size=(7, 20))),                      # H copied, W 2x by size
    ((3, 5, 7, 9), dict(scale_factor=2.0)),                   # the U-Net's 2x
    ((1, 2, 5, 37), dict(scale_factor=2.0)),                  # 2x rows of several vectors + a part
    ((1, 3, 5, 40), dict(size=(11, 80))),                     # W 2x, H not: rows one at a time
    ((1, 3, 16, 16), dict(scale_factor=4)),                   # int scale
    ((1, 13, 8, 6), dict(scale_factor=0.5)),
    ((1, 3, 7, 10), dict(scale_factor=1.5)),
    ((3, 5, 9, 7), dict(scale_factor=(2.3, 0.5))),
    ((1, 5, 6, 9), dict(scale_factor=(1.5, 2.0))),            # W 2x fast path, H not
    ((1, 3, 7, 10), dict(scale_factor=1.7, recompute_scale_factor=True)),
    ((1, 3, 7, 10), dict(scale_factor=1.7, recompute_scale_factor=False)),
    ((1, 3, 33, 40), dict(size=(64, 17))),
]
# Under the CUDA simulator every GPU thread is a Python thread: few planes, tiny images.
SMALL = [
    ((1, 3, 7, 10), dict(size=(10, 7))),
    ((1, 1, 1, 1), dict(size=(3, 4))),
    ((3, 1, 5, 5), dict(size=1)),
    ((1, 2, 4, 5), dict(scale_factor=2.0)),
    ((1, 1, 7, 6), dict(scale_factor=(2.3, 0.5))),
    ((1, 1, 7, 10), dict(scale_factor=1.7, recompute_scale_factor=True)),
]
CASES = SMALL if SMALL_SHAPES else FULL
MODES = [("nearest", None), ("nearest-exact", None), ("bilinear", False), ("bilinear", True)]


def _id(case):
    shape, kw = case
    return "x".join(map(str, shape)) + "-" + ",".join(f"{k}={v}" for k, v in kw.items())


def _out_shape(shape, kw):
    n, c, h, w = shape
    if "size" in kw:
        s = kw["size"]
        oh, ow = (s, s) if isinstance(s, int) else s
    else:
        s = kw["scale_factor"]
        sh, sw = s if isinstance(s, tuple) else (s, s)
        oh, ow = math.floor(h * sh), math.floor(w * sw)
    return n, c, oh, ow


def _tol(dtype, shape, mode):
    """float64: 1e-12.  float32 bilinear: the kernels compute the source coordinate in float32
    as PyTorch does (the reference in float64): its rounding, up to ~2 ulp of a coordinate
    < max(H, W), moves a weight by that much, times a neighbour difference up to 2 max|x|."""
    if np.dtype(dtype) == np.float64:
        return TOL[np.dtype(dtype)]
    return TOL[np.dtype(dtype)] + 4 * max(shape[2:]) * 2.0**-24


def _check(got, want, dtype, shape, mode, what):
    assert got.dtype == dtype
    if mode == "bilinear":
        assert_close(got, want, _tol(dtype, shape, mode), what, cancel=True)
    else:  # the same pixels: exactly the input's values
        np.testing.assert_array_equal(got, want.astype(dtype), err_msg=what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("mode, align", MODES, ids=[f"{m}-{a}" for m, a in MODES])
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, mode, align, case, dtype):
    shape, kw = case
    x = randn(rng(), shape, dtype)
    oshape = _out_shape(shape, kw)
    want = ref.interpolate(x, mode=mode, align_corners=align, **kw)
    assert want.shape == oshape
    out = poisoned(oshape, dtype)
    got = run(impl, dispatch.interpolate, x, mode=mode, align_corners=align, out=out, _op=OP, **kw)
    _check(got, want, dtype, shape, mode, f"{mode} {kw}")
    # a non-contiguous x, no out=
    got2 = run(impl, dispatch.interpolate, strided(x), mode=mode, align_corners=align, _op=OP, **kw)
    _check(got2, want, dtype, shape, mode, f"{mode} {kw} strided")


@pytest.mark.parametrize("mode, align", MODES, ids=[f"{m}-{a}" for m, a in MODES])
@pytest.mark.parametrize("impl", IMPLS)
def test_recompute_scale_factor_is_the_size_call(impl, mode, align):
    """recompute_scale_factor=True is size=floor(in * scale_factor); without it the
    coordinates use 1 / scale_factor, which differs at non-integer factors."""
    shape = (1, 2, 7, 10) if SMALL_SHAPES else (1, 3, 17, 23)
    x = randn(rng(), shape, np.float64)
    kw = dict(mode=mode, align_corners=align, _op=OP)
    a = run(impl, dispatch.interpolate, x, scale_factor=1.7, recompute_scale_factor=True, **kw)
    b = run(impl, dispatch.interpolate, x, size=(math.floor(shape[2] * 1.7), math.floor(shape[3] * 1.7)), **kw)
    np.testing.assert_array_equal(a, b)
    if mode != "bilinear" or not align:  # align_corners never reads the scale factor
        c = run(impl, dispatch.interpolate, x, scale_factor=1.7, **kw)
        assert not np.array_equal(a, c)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode, align", MODES, ids=[f"{m}-{a}" for m, a in MODES])
@pytest.mark.parametrize("impl", IMPLS)
def test_nan_propagates(impl, mode, align, dtype):
    """A NaN pixel gives NaN in every output that reads it (bilinear: with any weight, as
    PyTorch), and nowhere else."""
    g = rng()
    x = randn(g, (1, 2, 5, 6), dtype)
    x[0, 1, 2, 3] = np.nan
    for kw in (dict(scale_factor=2.0), dict(size=(7, 9))):
        got = run(impl, dispatch.interpolate, x, mode=mode, align_corners=align, _op=OP, **kw)
        want = ref.interpolate(x, mode=mode, align_corners=align, **kw)
        nan = np.isnan(got)
        np.testing.assert_array_equal(nan, np.isnan(want), err_msg=f"{mode} {kw}")
        assert nan[0, 1].any() and not nan[0, 0].any()
        _check(np.where(nan, 0, got).astype(dtype), np.where(nan, 0, want), dtype, x.shape, mode, f"{mode} {kw}")


@pytest.mark.skipif(not ON_CUDA, reason="float16 runs on CUDA only")
@pytest.mark.parametrize("mode, align", MODES, ids=[f"{m}-{a}" for m, a in MODES])
@pytest.mark.parametrize("impl", IMPLS)
def test_float16_blends_in_float32(impl, mode, align):
    x = randn(rng(), (1, 2, 5, 6), np.float16)
    for kw in (dict(scale_factor=2.0), dict(size=(7, 4))):
        got = run(impl, dispatch.interpolate, x, mode=mode, align_corners=align, _op=OP, **kw)
        assert got.dtype == np.float16
        # float16 nearest picks: the float32 coordinates, as the reference does for float32
        want = ref.interpolate(x.astype(np.float32), mode=mode, align_corners=align, **kw)
        if mode == "bilinear":
            assert_close(got, want, 1e-3, f"{mode} {kw}", cancel=True)  # float16 rounding: 2^-11
        else:
            np.testing.assert_array_equal(got, want.astype(np.float16))


# ---- host-only checks ---------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="host arrays: the CPU target")


@cpu_only
@pytest.mark.parametrize("impl", IMPLS)
def test_bilinear_2x_width_tables(impl):
    """The width tables that take the CPU's 2x bilinear path (neighbour pairs, no gathers:
    AxisTable.doubles) are exactly the half-pixel 2x ones: not align_corners, not 2x + 1,
    not a 1-pixel input; and that path gives the reference's values."""
    from dispatch.ops import resample as R
    for acc in (np.float32, np.float64):
        assert R.axis_table(9, 18, "bilinear", False, 2.0, acc).doubles
        assert R.axis_table(2, 4, "bilinear", False, 2.0, acc).doubles
        assert not R.axis_table(9, 18, "bilinear", True, 2.0, acc).doubles
        assert not R.axis_table(9, 19, "bilinear", False, 19 / 9, acc).doubles
        assert not R.axis_table(1, 2, "bilinear", False, 2.0, acc).doubles
        assert not R.axis_table(9, 18, "bilinear", False, 1.9, acc).doubles   # scale given, not 2
    g = rng()
    for dtype in DTYPES:
        x = randn(g, (2, 3, 6, 21), dtype)
        x[1, 2, 3, 0] = np.inf   # an edge column: the table's path there
        got = run(impl, dispatch.interpolate, x, scale_factor=(1.5, 2.0), mode="bilinear", _op=OP)
        want = ref.interpolate(x, scale_factor=(1.5, 2.0), mode="bilinear")
        np.testing.assert_array_equal(np.isinf(got) | np.isnan(got), np.isinf(want) | np.isnan(want))
        bad = ~np.isfinite(want)
        _check(np.where(bad, 0, got).astype(dtype), np.where(bad, 0, want), dtype, x.shape, "bilinear", impl)


@cpu_only
@pytest.mark.parametrize("mode, align", MODES, ids=[f"{m}-{a}" for m, a in MODES])
@pytest.mark.parametrize("impl", IMPLS)
def test_read_only_and_broadcast_inputs(impl, mode, align):
    g = rng()
    x = randn(g, (3, 5, 7, 9), np.float32)
    want = ref.interpolate(x, scale_factor=2.0, mode=mode, align_corners=align)
    for v, what in ((read_only(x), "read-only"), (np.broadcast_to(x[:1], x.shape), "broadcast batch")):
        got = run(impl, dispatch.interpolate, v, scale_factor=2.0, mode=mode, align_corners=align,
                  out=poisoned(want.shape, np.float32), _op=OP)
        w = want if what == "read-only" else np.broadcast_to(want[:1], want.shape)
        _check(got, w, np.float32, x.shape, mode, what)


@cpu_only
@pytest.mark.parametrize("impl", IMPLS)
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    from kernels_cpu import resample as K

    x = randn(rng(), (1, 3, 5, 7), np.float32)
    for mode in ("nearest", "bilinear"):
        run(impl, dispatch.interpolate, x, scale_factor=2.0, mode=mode, _op=OP)
        run(impl, dispatch.interpolate, x, size=(3, 9), mode=mode, _op=OP)

    def variants():
        for mode in ("nearest", "bilinear"):
            run(impl, dispatch.interpolate, read_only(x), scale_factor=2.0, mode=mode, _op=OP)
            run(impl, dispatch.interpolate, np.broadcast_to(x[:, :1], x.shape), size=(3, 9), mode=mode, _op=OP)

    assert_no_new_specialization([K], variants, impl)


@cpu_only
def test_out_is_returned_and_strided_out_is_filled():
    x = randn(rng(), (1, 3, 4, 5), np.float32)
    out = np.empty((1, 3, 8, 10), np.float32)
    assert dispatch.interpolate(x, scale_factor=2, out=out) is out
    big = np.full((1, 3, 8, 20), np.nan, np.float32)
    view = big[..., ::2]
    assert dispatch.interpolate(x, scale_factor=2, mode="bilinear", out=view) is view
    assert_close(view, ref.interpolate(x, scale_factor=2, mode="bilinear"), 1e-5, cancel=True)
    assert np.isnan(big[..., 1::2]).all()


@cpu_only
@pytest.mark.parametrize("shape", [(0, 3, 4, 5), (2, 0, 4, 5)], ids=str)
def test_empty_batch_or_channels(shape):
    y = dispatch.interpolate(np.ones(shape, np.float32), size=(3, 7), mode="bilinear")
    assert y.shape == shape[:2] + (3, 7) and y.dtype == np.float32


@cpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode, align", MODES, ids=[f"{m}-{a}" for m, a in MODES])
def test_matches_torch(mode, align, dtype):
    """PyTorch itself, where installed: nearest picks the same pixels, bilinear agrees to the
    float32 coordinate rounding.  (Outputs at least 128 wide: for narrower ones PyTorch's
    CPU takes another code path whose nearest shortcuts (out == in copies, out == 2 in
    halves the index) pick other pixels at factors such as 1.2 or 2.01; at scale 2.0 the two
    agree.)"""
    torch = pytest.importorskip("torch")
    g = rng()
    for shape, kw in (((1, 3, 7, 100), dict(scale_factor=(1.5, 2.01))), ((2, 3, 9, 70), dict(scale_factor=2.3)),
                      ((1, 5, 8, 64), dict(scale_factor=2.0)), ((1, 3, 10, 200), dict(size=(7, 130))),
                      ((1, 2, 64, 64), dict(scale_factor=1.7, recompute_scale_factor=True))):
        x = randn(g, shape, dtype)
        want = torch.nn.functional.interpolate(torch.from_numpy(x), mode=mode, align_corners=align, **kw).numpy()
        got = dispatch.interpolate(x, mode=mode, align_corners=align, **kw)
        if mode == "bilinear":
            assert_close(got, want, _tol(dtype, shape, mode), f"torch {mode} {kw}", cancel=True)
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"torch {mode} {kw}")


# ---- bad input ---------------------------------------------------------------------------

X = np.ones((1, 3, 7, 10), np.float32)
GOOD_OUT = (1, 3, 14, 20)


@cpu_only
@pytest.mark.parametrize("args, kw, err, name", [
    ((X, (14, 20), 2.0), {}, ValueError, "scale_factor"),                        # both
    ((X,), {}, ValueError, "size"),                                               # neither
    ((X, 0), {}, ValueError, "size"),
    ((X, (14, 0)), {}, ValueError, "size"),
    ((X, (14,)), {}, ValueError, "size"),
    ((X, 2.5), {}, TypeError, "size"),
    ((X, None, -2.0), {}, ValueError, "scale_factor"),
    ((X, None, 0.0), {}, ValueError, "scale_factor"),
    ((X, None, float("nan")), {}, ValueError, "scale_factor"),
    ((X, None, float("inf")), {}, ValueError, "scale_factor"),
    ((X, None, 1e308), {}, ValueError, "scale_factor"),                           # inf output size
    ((X, (2**31, 4)), {}, ValueError, "size"),
    ((X, None, 0.1), {}, ValueError, "scale_factor"),                             # floor(7 * 0.1) == 0
    ((X, None, (2.0, 2.0, 2.0)), {}, ValueError, "scale_factor"),
    ((X, None, "2"), {}, TypeError, "scale_factor"),
    ((X, None, 2.0), {"align_corners": True}, ValueError, "align_corners"),      # nearest
    ((X, None, 2.0), {"mode": "nearest-exact", "align_corners": False}, ValueError, "align_corners"),
    ((X, None, 2.0), {"mode": "bilinear", "align_corners": "yes"}, TypeError, "align_corners"),
    ((X, None, 2.0), {"mode": "bicubic"}, ValueError, "mode"),
    ((X, None, 2.0), {"mode": "linear"}, ValueError, "mode"),
    ((X, (14, 20)), {"recompute_scale_factor": True}, ValueError, "recompute_scale_factor"),
    ((X, None, 2.0), {"recompute_scale_factor": "no"}, TypeError, "recompute_scale_factor"),
    ((np.ones((3, 7, 10), np.float32), None, 2.0), {}, ValueError, "x"),
    ((np.ones((1, 1, 3, 7, 10), np.float32), None, 2.0), {}, ValueError, "x"),
    ((np.ones((1, 3, 0, 10), np.float32), None, 2.0), {}, ValueError, "x"),
    ((X.astype(np.int32), None, 2.0), {}, TypeError, "x"),
    ((X.astype(np.float16), None, 2.0), {}, TypeError, "x"),
    ((X.tolist(), None, 2.0), {}, TypeError, "x"),
], ids=lambda v: None)
def test_bad_inputs_raise_naming_the_argument_and_leave_out_untouched(args, kw, err, name):
    import re

    out = np.full(GOOD_OUT, np.nan, np.float32)
    with pytest.raises(err) as info:
        dispatch.interpolate(*args, out=out, **kw)
    msg = str(info.value)
    assert re.search(rf"\b{re.escape(name)}\b", msg), msg
    assert np.isnan(out).all()
    with pytest.raises(err):
        dispatch.explain(OP, *args, **kw)


@cpu_only
def test_unknown_mode_lists_the_supported_ones():
    with pytest.raises(ValueError, match=r"mode must be one of \['nearest', 'nearest-exact', 'bilinear'\]"):
        dispatch.interpolate(X, scale_factor=2, mode="bicubic")


@cpu_only
def test_bad_out_rejected_and_untouched():
    for bad, err, msg in [(np.zeros((1, 3, 14, 21), np.float32), ValueError, "out must have shape"),
                          (np.zeros(GOOD_OUT, np.float64), TypeError, "out must have dtype")]:
        before = bad.copy()
        with pytest.raises(err, match=msg):
            dispatch.interpolate(X, scale_factor=2, out=bad)
        assert np.array_equal(bad, before)
    x = np.ones((1, 3, 7, 10), np.float32)
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.interpolate(x, size=(7, 10), out=x)
