"""dispatch.{max_pool2d, avg_pool2d, adaptive_avg_pool2d} against the float64 references of
tests/reference/pool.py, for every implementation the dispatcher can pick on the target
device (CPU: cpu-serial and cpu-parallel; CUDA, on a GPU or the simulator: cuda-direct)."""
import numpy as np
import pytest

import dispatch
from tests.reference import pool as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, assert_close, impl_params, poisoned, randn, read_only,
                           reduction_tol, rng, run, strided)

DTYPES = [np.float32, np.float64] + ([np.float16] if ON_CUDA else [])
F16_TOL = 1e-3  # float16 results: one rounding to float16 (2^-11 relative) of a float32 sum


def _tol(dtype, window=1):
    if np.dtype(dtype) == np.float16:
        return F16_TOL
    return reduction_tol(dtype, window)


def _impls(op):
    return [pytest.param(op, p.values[0], id=f"{op}-{p.id}", marks=p.marks) for p in impl_params(op)]


MAX_IMPLS, AVG_IMPLS, ADAPTIVE_IMPLS = _impls("max_pool2d"), _impls("avg_pool2d"), _impls("adaptive_avg_pool2d")

# (x shape, kernel_size, stride, padding, dilation, ceil_mode): odd images, 1x1 and 7x7,
# batch 1 and 3, C = 1 and C not a multiple of 8, 3-D input, pairs, stride [] / None.
MAX_CASES = [
    ((2, 3, 9, 11), 3, 2, 1, 1, False),               # the ResNet stem's window on an odd image
    ((1, 1, 7, 7), 3, 2, 1, 1, True),                 # ceil_mode, padding on every edge
    ((2, 3, 8, 8), 3, 2, 1, 1, True),                 # ceil_mode: the last window runs past the padding
    ((3, 5, 8, 8), 2, 3, 0, 1, False),                # stride > kernel (rows and columns skipped)
    ((1, 10, 11, 9), 3, 1, 1, 2, False),              # dilation 2, stride 1
    ((3, 2, 1, 1), 1, 1, 0, 1, False),                # 1x1 image
    ((7, 6, 5), (2, 3), (1, 2), (1, 1), 1, True),     # 3-D input (C, H, W), pair arguments
    ((1, 13, 7, 7), 7, None, 0, 1, False),            # one window over the whole 7x7 image
    ((2, 1, 5, 12), (3, 2), (2, 1), (1, 0), (1, 2), True),
    ((1, 9, 6, 10), 3, [], 1, 1, True),               # stride [] is kernel_size
    ((1, 2, 37, 75), 3, 2, 1, 1, True),               # 38 outputs a row, 19 rows: partial vectors and row blocks
    ((1, 2, 29, 41), 3, 1, 1, 1, False),              # 3x3/1 (pooled separably), 41 columns
    ((1, 3, 16, 33), 2, 2, 0, 1, True),               # 2x2/2 (separably), ceil_mode clips the last column
    ((1, 2, 17, 40), 3, 1, 1, 1, False),              # stride 1, 40 columns: 3 vectors of 16
    ((1, 1, 9, 36), (3, 5), (1, 2), (1, 2), (2, 2), False),  # column stride 2, dilation 2, wide
]
# (x shape, kernel_size, stride, padding, ceil_mode)
AVG_CASES = [
    ((2, 3, 9, 11), 3, 2, 1, False),
    ((1, 1, 7, 7), 3, 2, 1, True),                    # ceil_mode, padding on every edge
    ((2, 3, 8, 8), 3, 2, 1, True),                    # the last window is clipped at H + padding
    ((3, 5, 8, 8), 2, 3, 0, False),                   # stride > kernel
    ((1, 12, 10, 10), 2, None, 0, False),             # DenseNet's transition 2x2 s2
    ((3, 2, 1, 1), 1, 1, 0, True),                    # 1x1 image
    ((7, 6, 5), (2, 3), (1, 2), (1, 1), True),        # 3-D input, pair arguments
    ((2, 1, 5, 12), (4, 2), (3, 1), (2, 1), True),
    ((1, 3, 31, 70), 2, 2, 0, True),                  # 35 outputs a row, 16 rows
    ((1, 2, 29, 41), 3, 1, 1, False),                 # stride 1, 41 columns
]
AVG_DIVISORS = [(True, None), (False, None), (True, 3), (False, 5)]  # (count_include_pad, divisor_override)
# (dtype, count_include_pad, divisor_override); under the simulator the overrides on float32 only (time)
AVG_VARIANTS = [pytest.param(dt, cip, div, id=f"{np.dtype(dt).name}-{cip}-{div}")
                for dt in DTYPES for cip, div in AVG_DIVISORS
                if not SMALL_SHAPES or dt == np.float32 or div is None]
# (x shape, output_size)
ADAPTIVE_CASES = [
    ((1, 9, 7, 7), 1),                 # global pooling (ResNet's head)
    ((3, 37, 7, 7), 1),                # global, 111 planes: vectors of planes (16 or 8) and the rest
    ((2, 20, 9, 9), 1),                # global, 81 values a plane: 5 whole vectors and one masked
    ((1, 33, 4, 4), 1),                # global, 16 values a plane: nothing masked
    ((1, 40, 1, 1), 1),                # global over 1x1 planes: one masked lane each
    ((2, 3, 14, 14), (7, 7)),          # VGG's head: 2x2 windows (tiling: run as an avg_pool)
    ((2, 3, 12, 15), (4, 5)),          # tiling 3x3 windows, oblong plane
    ((1, 5, 10, 9), (3, 4)),           # uneven, overlapping windows
    ((3, 2, 5, 7), (None, 3)),         # None keeps H
    ((6, 4, 6), 4),                    # 3-D input
    ((1, 2, 3, 3), (5, 7)),            # more outputs than inputs
    ((1, 3, 1, 1), 1),                 # 1x1 image
    ((2, 4, 6, 9), (1, None)),         # whole-row windows (the contiguous-run path), W kept
]


def _x(g, shape, dtype):
    return randn(g, shape, dtype)


# ---- values ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", MAX_CASES, ids=str)
@pytest.mark.parametrize("op, impl", MAX_IMPLS)
def test_max_pool2d_matches_reference(op, impl, case, dtype):
    shape, k, s, p, d, ceil = case
    g = rng()
    x = _x(g, shape, dtype)
    want = ref.max_pool2d(x, k, s, p, d, ceil_mode=ceil)
    got = run(impl, dispatch.max_pool2d, x, k, s, p, d, ceil_mode=ceil, out=poisoned(want.shape, dtype), _op=op)
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, want, _tol(dtype), "max_pool2d")
    got = run(impl, dispatch.max_pool2d, strided(x), k, s, p, d, ceil_mode=ceil, _op=op)
    assert_close(got, want, _tol(dtype), "max_pool2d strided")


@pytest.mark.parametrize("dtype, cip, divisor", AVG_VARIANTS)
@pytest.mark.parametrize("case", AVG_CASES, ids=str)
@pytest.mark.parametrize("op, impl", AVG_IMPLS)
def test_avg_pool2d_matches_reference(op, impl, case, dtype, cip, divisor):
    shape, k, s, p, ceil = case
    g = rng()
    x = _x(g, shape, dtype)
    kw = dict(ceil_mode=ceil, count_include_pad=cip, divisor_override=divisor)
    want = ref.avg_pool2d(x, k, s, p, **kw)
    got = run(impl, dispatch.avg_pool2d, x, k, s, p, **kw, out=poisoned(want.shape, dtype), _op=op)
    assert got.dtype == dtype and got.shape == want.shape
    window = int(np.prod(k))
    assert_close(got, want, _tol(dtype, window), "avg_pool2d", cancel=True)
    if divisor is None and cip:  # one strided call per case is enough
        got = run(impl, dispatch.avg_pool2d, strided(x), k, s, p, **kw, _op=op)
        assert_close(got, want, _tol(dtype, window), "avg_pool2d strided", cancel=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=str)
@pytest.mark.parametrize("op, impl", ADAPTIVE_IMPLS)
def test_adaptive_avg_pool2d_matches_reference(op, impl, case, dtype):
    shape, size = case
    g = rng()
    x = _x(g, shape, dtype)
    want = ref.adaptive_avg_pool2d(x, size)
    got = run(impl, dispatch.adaptive_avg_pool2d, x, size, out=poisoned(want.shape, dtype), _op=op)
    assert got.dtype == dtype and got.shape == want.shape
    window = shape[-2] * shape[-1]
    assert_close(got, want, _tol(dtype, window), "adaptive_avg_pool2d", cancel=True)
    got = run(impl, dispatch.adaptive_avg_pool2d, strided(x), size, _op=op)
    assert_close(got, want, _tol(dtype, window), "adaptive_avg_pool2d strided", cancel=True)


# The model shapes of bench/cases/pool.py (smaller under the simulator).
MODEL = [
    ("max_pool2d", (1, 8, 14, 14) if SMALL_SHAPES else (1, 64, 112, 112), (3,), dict(stride=2, padding=1)),
    ("avg_pool2d", (1, 8, 8, 8) if SMALL_SHAPES else (1, 256, 56, 56), (2,), dict(stride=2)),
    ("adaptive_avg_pool2d", (1, 16, 14, 14) if SMALL_SHAPES else (1, 512, 14, 14), ((7, 7),), {}),
    ("adaptive_avg_pool2d", (1, 40, 7, 7) if SMALL_SHAPES else (1, 2048, 7, 7), (1,), {}),
]


@pytest.mark.parametrize("name, shape, args, kw", MODEL, ids=[f"{m[0]}-{'x'.join(map(str, m[1]))}" for m in MODEL])
@pytest.mark.parametrize("impl", ["cpu-serial", "cpu-parallel"] if not ON_CUDA else ["cuda-direct"])
def test_model_shapes(name, shape, args, kw, impl):
    """ResNet-50's stem max pool and head, DenseNet's transition, VGG's head (both CPU
    kernels on every shape, whichever the rule would pick)."""
    g = rng()
    x = _x(g, shape, np.float32)
    want = getattr(ref, name)(x, *args, **kw)
    got = run(impl, getattr(dispatch, name), x, *args, **kw, _op=name)
    window = shape[-2] * shape[-1] if name.startswith("adaptive") else 9
    assert_close(got, want, reduction_tol(np.float32, window), name, cancel=name != "max_pool2d")


# ---- NaN, infinities ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op, impl", MAX_IMPLS + AVG_IMPLS + ADAPTIVE_IMPLS)
def test_nan_propagates(op, impl, dtype):
    """A NaN anywhere in a window makes that output NaN (max pooling too: PyTorch's rule,
    whatever the order of NaN and larger values in the window)."""
    g = rng()
    shape = (2, 3, 9, 10)
    x = _x(g, shape, dtype)
    x[g.random(shape) < 0.04] = np.nan
    x[0, 0, 0, 0] = np.nan   # a corner, the first element of a window
    x[1, 2, 4, 5] = 1e4      # a large value beside a NaN: the NaN must still win
    x[1, 2, 4, 4] = np.nan
    args = {"max_pool2d": (3, 2, 1), "avg_pool2d": (3, 2, 1), "adaptive_avg_pool2d": ((4, 3),)}[op]
    want = getattr(ref, op)(x, *args)
    assert np.isnan(want).any() and not np.isnan(want).all()
    got = run(impl, getattr(dispatch, op), x, *args, out=poisoned(want.shape, dtype), _op=op)
    assert_close(got, want, _tol(dtype, 9), op, cancel=op != "max_pool2d")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op, impl", ADAPTIVE_IMPLS)
def test_global_pool_nan_stays_in_its_plane(op, impl, dtype):
    """Global pooling sums a vector of planes at a time (kernels_cpu/pool.py _plane_means):
    a NaN or an infinity in one plane, at any position of its values (in a whole vector of
    them or in the masked tail), makes that plane's output, and only it, NaN / inf."""
    x = _x(rng(), (2, 37, 7, 7), dtype)
    flat = x.reshape(74, 49)
    bad = np.arange(0, 74, 3)
    flat[bad, bad % 49] = np.nan
    flat[1, 48] = np.inf
    want = ref.adaptive_avg_pool2d(x, 1)
    got = run(impl, dispatch.adaptive_avg_pool2d, x, 1, out=poisoned(want.shape, dtype), _op=op)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want).sum() == len(bad)
    assert np.isposinf(got.reshape(-1)[1])
    assert_close(got, want, _tol(dtype, 49), op, cancel=True)


@pytest.mark.parametrize("window", [(3, 2, 1), (3, 1, 1), (2, 2, 0)],
                         ids=lambda w: "%dx%d-s%d-p%d" % (w[0], w[0], w[1], w[2]))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op, impl", MAX_IMPLS + AVG_IMPLS)
def test_nan_at_every_column(op, impl, dtype, window):
    """Plane c holds one NaN, at column c of row 2: each output that reads it, and only
    those, is NaN.  The separable windows (3x3/2, 3x3/1, 2x2/2) build their taps from
    shared loads by moving lanes, so a NaN in the last lane of a vector, or in the value
    carried over from the next one, reaches the right outputs; 75 columns span several
    vectors at every width."""
    k, s, p = window
    w = 75
    x = _x(rng(), (w, 5, w), dtype)
    x[np.arange(w), 2, np.arange(w)] = np.nan
    want = getattr(ref, op)(x, k, s, p)
    got = run(impl, getattr(dispatch, op), x, k, s, p, out=poisoned(want.shape, dtype), _op=op)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert_close(got, want, _tol(dtype, 9), op, cancel=op != "max_pool2d")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op, impl", MAX_IMPLS + AVG_IMPLS)
def test_infinite_inputs(op, impl, dtype):
    """-inf inputs: a plane of -inf max-pools to -inf (not to the padding), a -inf in an
    average gives -inf; +inf wins a max."""
    g = rng()
    x = _x(g, (2, 3, 7, 8), dtype)
    x[0, 1] = -np.inf
    x[1, 0, 3, 3] = -np.inf
    x[1, 2, 5, 1] = np.inf
    want = getattr(ref, op)(x, 3, 2, 1)
    assert np.isneginf(want).any() and np.isposinf(want).any()
    got = run(impl, getattr(dispatch, op), x, 3, 2, 1, out=poisoned(want.shape, dtype), _op=op)
    assert_close(got, want, _tol(dtype, 9), op, cancel=op != "max_pool2d")


# ---- layouts -------------------------------------------------------------------------------

@pytest.mark.parametrize("op, impl", MAX_IMPLS + AVG_IMPLS + ADAPTIVE_IMPLS)
def test_non_contiguous_views(op, impl):
    """Channel slices, an NHWC array viewed as NCHW, a reversed W axis."""
    g = rng()
    base = _x(g, (2, 8, 9, 11), np.float64)
    nhwc = _x(g, (2, 9, 11, 6), np.float64)
    args = {"max_pool2d": (3, 2, 1), "avg_pool2d": (2, 1, 1), "adaptive_avg_pool2d": ((3, 5),)}[op]
    for view in (base[:, 1::3], nhwc.transpose(0, 3, 1, 2), base[1, :, :, ::-1]):
        assert not view.flags.c_contiguous
        want = getattr(ref, op)(np.array(view), *args)
        got = run(impl, getattr(dispatch, op), view, *args, _op=op)
        assert_close(got, want, _tol(np.float64, 99), op + " view", cancel=op != "max_pool2d")


@pytest.mark.skipif(ON_CUDA, reason="host arrays: read-only flags and out= views")
@pytest.mark.parametrize("op, impl", MAX_IMPLS + AVG_IMPLS + ADAPTIVE_IMPLS)
def test_read_only_input_and_strided_out(op, impl):
    g = rng()
    x = _x(g, (3, 5, 7, 7), np.float32)
    args = {"max_pool2d": (3, 2, 1), "avg_pool2d": (3, 2, 1), "adaptive_avg_pool2d": (1,)}[op]
    want = getattr(ref, op)(x, *args)
    got = run(impl, getattr(dispatch, op), read_only(x), *args, _op=op)
    assert got.flags.writeable
    assert_close(got, want, _tol(np.float32, 49), op + " read-only", cancel=op != "max_pool2d")
    big = np.full(want.shape[:-1] + (2 * want.shape[-1],), np.nan, np.float32)
    out = big[..., ::2]
    with dispatch.use(**{op: impl}):
        res = getattr(dispatch, op)(x, *args, out=out)
    assert res is out
    assert_close(out, want, _tol(np.float32, 49), op + " strided out", cancel=op != "max_pool2d")
    assert np.isnan(big[..., 1::2]).all()  # the gaps of the view are not written


@pytest.mark.skipif(ON_CUDA, reason="host-only edge case")
@pytest.mark.parametrize("op, args, hw", [("max_pool2d", (3, 2, 1), (4, 4)), ("avg_pool2d", (2,), (4, 4)),
                                         ("adaptive_avg_pool2d", ((2, 3),), (2, 3))])
def test_empty_batch(op, args, hw):
    for shape in [(0, 3, 8, 8), (2, 0, 8, 8), (0, 8, 8)]:
        y = getattr(dispatch, op)(np.ones(shape, np.float32), *args)
        assert y.shape == shape[:-2] + hw and y.dtype == np.float32


# ---- bad input -----------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="argument checks are device-independent")
X = np.ones((2, 3, 6, 6), np.float32)
MP, AP, AAP = dispatch.max_pool2d, dispatch.avg_pool2d, dispatch.adaptive_avg_pool2d

BAD = [
    # (call taking out=, exception, regex of the message)
    (lambda out: MP(X, 3, padding=2, out=out), ValueError, r"padding must be at most half of kernel_size"),
    (lambda out: AP(X, (3, 2), padding=(1, 2), out=out), ValueError, r"padding must be at most half"),
    (lambda out: MP(X, 3, padding=-1, out=out), ValueError, r"padding must be >= 0"),
    (lambda out: AP(X, 3, padding=(0, -1), out=out), ValueError, r"padding must be >= 0"),
    (lambda out: MP(X, 7, out=out), ValueError, r"kernel_size \(7, 7\).*larger than the padded input"),
    (lambda out: MP(X, 3, dilation=3, out=out), ValueError, r"kernel_size .*larger than the padded input"),
    (lambda out: AP(X, (2, 9), padding=1, out=out), ValueError, r"kernel_size .*larger than the padded input"),
    (lambda out: MP(X, 3, stride=0, out=out), ValueError, r"stride must be positive"),
    (lambda out: AP(X, 3, stride=(1, 0), out=out), ValueError, r"stride must be positive"),
    (lambda out: MP(X, 0, out=out), ValueError, r"kernel_size must be positive"),
    (lambda out: MP(X, 3, dilation=0, out=out), ValueError, r"dilation must be positive"),
    (lambda out: MP(X, True, out=out), TypeError, r"kernel_size must be an int or a pair"),
    (lambda out: AP(X, (2, True), out=out), TypeError, r"kernel_size must be an int"),
    (lambda out: MP(X, 2.0, out=out), TypeError, r"kernel_size must be an int or a pair"),
    (lambda out: MP(X, (2, 2, 2), out=out), ValueError, r"kernel_size must be an int or a pair"),
    (lambda out: MP(X, 2, stride="2", out=out), TypeError, r"stride must be an int or a pair"),
    (lambda out: MP(X, 2, ceil_mode=1, out=out), TypeError, r"ceil_mode must be a bool"),
    (lambda out: AP(X, 2, count_include_pad=None, out=out), TypeError, r"count_include_pad must be a bool"),
    (lambda out: AP(X, 2, divisor_override=0, out=out), ValueError, r"divisor_override must be a positive int"),
    (lambda out: AP(X, 2, divisor_override=2.0, out=out), TypeError, r"divisor_override must be an int"),
    (lambda out: AP(X, 2, divisor_override=True, out=out), TypeError, r"divisor_override must be an int"),
    (lambda out: AAP(X, 0, out=out), ValueError, r"output_size must be positive"),
    (lambda out: AAP(X, (3, -1), out=out), ValueError, r"output_size must be positive"),
    (lambda out: AAP(X, (3, 3, 3), out=out), ValueError, r"output_size must be an int or a pair"),
    (lambda out: AAP(X, 2.5, out=out), TypeError, r"output_size must be an int or a pair"),
    (lambda out: AAP(X, None, out=out), TypeError, r"output_size must be an int or a pair"),
    (lambda out: AAP(X, (True, 2), out=out), TypeError, r"output_size must be an int"),
    (lambda out: MP(np.ones((6, 6), np.float32), 2, out=out), ValueError, r"x must have 3 to 4 dimensions"),
    (lambda out: AAP(np.ones((1, 2, 3, 6, 6), np.float32), 2, out=out), ValueError, r"x must have 3 to 4 dim"),
    (lambda out: MP(np.ones((1, 3, 0, 6), np.float32), 1, out=out), ValueError, r"x must have H >= 1"),
    (lambda out: MP(X.astype(np.float16), 2, out=out), TypeError, r"x must have dtype float32 or float64"),
    (lambda out: AP(X.astype(np.int32), 2, out=out), TypeError, r"x must have dtype float32 or float64"),
    (lambda out: AAP(X.astype(np.float64), 3, out=out), TypeError, r"out must have dtype float64"),
    (lambda out: MP([[[[1.0]]]], 1, out=out), TypeError, r"x must be a numpy array"),
]


@cpu_only
@pytest.mark.parametrize("call, err, msg", BAD, ids=[f"{i}-{b[2][:30]}" for i, b in enumerate(BAD)])
def test_bad_inputs_raise_and_leave_out_untouched(call, err, msg):
    out = np.full((2, 3, 3, 3), np.nan, np.float32)
    with pytest.raises(err, match=msg):
        call(out)
    assert np.isnan(out).all()


@cpu_only
@pytest.mark.parametrize("op, args", [("max_pool2d", (2,)), ("avg_pool2d", (2,)), ("adaptive_avg_pool2d", (3,))])
def test_bad_out_rejected_and_untouched(op, args):
    fn = getattr(dispatch, op)
    x = rng().standard_normal((2, 3, 6, 6)).astype(np.float32)
    for bad, err, msg in [(np.full((2, 3, 3, 4), np.nan, np.float32), ValueError, r"out must have shape \(2, 3, 3, 3\)"),
                          (np.full((2, 3, 3, 3), np.nan, np.float64), TypeError, "out must have dtype float32"),
                          (np.full((3, 3, 3), np.nan, np.float32), ValueError, "out must have shape")]:
        with pytest.raises(err, match=msg):
            fn(x, *args, out=bad)
        assert np.isnan(bad).all()
    xs = x.copy()
    with pytest.raises(ValueError, match="out overlaps input x"):
        fn(x, *args, out=x[:, :, :3, :3])
    assert np.array_equal(x, xs)


@pytest.mark.skipif(not ON_CUDA, reason="the CUDA kernels' grid-stride loops")
@pytest.mark.parametrize("kind", ["max", "avg", "adaptive_avg"])
def test_cuda_grid_stride_loops_cover_every_output(kind):
    """A grid far smaller than the output (one block of 2x2x2 threads): every thread loops
    over columns, rows and planes."""
    from numba import cuda

    from kernels_cuda import pool as KC

    g = rng()
    x = randn(g, (5, 6, 7), np.float32)
    if kind == "max":
        want, args = ref.max_pool2d(x, 3, 1, 1, 1), (3, 3, 1, 1, 1, 1, 1, 1)
    elif kind == "avg":
        want, args = ref.avg_pool2d(x, 3, 1, 1, count_include_pad=False), (3, 3, 1, 1, 1, 1, False, 0)
    else:
        want, args = ref.adaptive_avg_pool2d(x, (5, 3)), ()
    out = cuda.to_device(np.full(want.shape, np.nan, np.float32))
    KC.kernel_for(kind, np.dtype(np.float32))[(1, 1, 1), (2, 2, 2)](cuda.to_device(x), out, *args)
    assert_close(out.copy_to_host(), want, 1e-5, kind, cancel=kind != "max")


@pytest.mark.skipif(not ON_CUDA, reason="device array views")
@pytest.mark.parametrize("op, impl", MAX_IMPLS + AVG_IMPLS + ADAPTIVE_IMPLS)
def test_device_strided_input_and_out(op, impl):
    """A strided device view as x (copied to C order on the device) and as out= (filled by
    one device copy, the gaps untouched)."""
    from numba import cuda

    g = rng()
    big = _x(g, (2, 3, 7, 16), np.float32)
    args = {"max_pool2d": (3, 2, 1), "avg_pool2d": (3, 2, 1), "adaptive_avg_pool2d": ((3, 2),)}[op]
    want = getattr(ref, op)(big[:, :, :, ::2], *args)
    obig = cuda.to_device(np.full(want.shape[:-1] + (2 * want.shape[-1],), np.nan, np.float32))
    out = obig[:, :, :, ::2]
    with dispatch.use(**{op: impl}):
        res = getattr(dispatch, op)(cuda.to_device(big)[:, :, :, ::2], *args, out=out)
    assert res is out
    host = obig.copy_to_host()
    assert_close(host[..., ::2], want, _tol(np.float32, 9), op + " device views", cancel=op != "max_pool2d")
    assert np.isnan(host[..., 1::2]).all()
