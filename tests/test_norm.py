"""dispatch.{layer_norm, rms_norm} (with and without the fused residual add) against float64
references, for every implementation the dispatcher can pick on the target device."""
import numpy as np
import pytest

import dispatch
from tests.reference import norm as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, TOL, assert_close, assert_no_new_specialization, broadcast_rows,
                           impl_params, poisoned, randn, read_only, rng, run, strided)

FULL = [(1,), (7,), (3, 5), (1, 1), (33, 1), (5, 768), (2, 3, 257), (2, 32000), (2, 3, 4, 9)]
SMALL = [(7,), (3, 5), (1, 1), (5, 67), (2, 3, 37), (2, 3, 4, 9)]
SHAPES = SMALL if SMALL_SHAPES else FULL
DTYPES = [np.float32, np.float64]

# (op, public function, reference, which parameters: "wb", "w", "b" or "")
VARIANTS = [("layer_norm", dispatch.layer_norm, ref.layer_norm, p) for p in ("wb", "w", "b", "")] + \
           [("rms_norm", dispatch.rms_norm, ref.rms_norm, p) for p in ("w", "")]


def _cases():
    out = []
    for name, fn, r, params in VARIANTS:
        for p in impl_params(name):
            out.append(pytest.param(name, fn, r, params, p.values[0], id=f"{name}[{params}]-{p.id}", marks=p.marks))
    return out


def _inputs(g, name, params, shape, dtype):
    d = shape[-1]
    args = [randn(g, shape, dtype) * 2 + dtype(0.5)]
    kw = {}
    w = (randn(g, (d,), dtype) + dtype(1)) if "w" in params else None
    b = randn(g, (d,), dtype) if "b" in params else None
    if name == "layer_norm":
        args += [w, b]
    else:
        args += [w]
    return args, kw


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, params, impl", _cases())
def test_matches_reference(name, fn, reference, params, impl, shape, dtype, residual):
    g = rng()
    args, kw = _inputs(g, name, params, shape, dtype)
    eps = float(g.choice([1e-5, 1e-6, 1e-2]))
    tol = TOL[np.dtype(dtype)]
    out = poisoned(shape, dtype)
    if residual:
        r = randn(g, shape, dtype)
        got, h = run(impl, fn, *args, eps=eps, residual=r, out=out, _op=name)
        want, want_h = reference(*args, eps=eps, residual=r)
        assert_close(got, want, tol, name, cancel=True)
        assert h.dtype == dtype and h.shape == shape
        np.testing.assert_array_equal(h, args[0] + r)  # one rounding, as numpy's add
        # strided views of x and residual, no out=
        got2, h2 = run(impl, fn, strided(args[0]), *args[1:], eps=eps, residual=strided(r), _op=name)
        assert_close(got2, want, tol, name + " strided", cancel=True)
        np.testing.assert_array_equal(h2, args[0] + r)
    else:
        got = run(impl, fn, *args, eps=eps, out=out, _op=name)
        want = reference(*args, eps=eps)
        assert got.dtype == dtype
        assert_close(got, want, tol, name, cancel=True)
        got2 = run(impl, fn, strided(args[0]), *[None if a is None else strided(a) for a in args[1:]], eps=eps,
                   _op=name)
        assert_close(got2, want, tol, name + " strided", cancel=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, params, impl", [c for c in _cases() if "w" in c.values[3]])
def test_default_eps_and_views(name, fn, reference, params, impl, dtype):
    g = rng()
    base = randn(g, (20, 37) if SMALL_SHAPES else (300, 130), dtype)
    for view in (base.T, base[3:31:2, 5:], base[::-1, ::3]):
        args, _ = _inputs(g, name, params, view.shape, dtype)
        args[0] = view
        got = run(impl, fn, *args, _op=name)
        assert_close(got, reference(*args), TOL[np.dtype(dtype)], name + " view", cancel=True)


@pytest.mark.parametrize("name, fn, reference, params, impl", [c for c in _cases() if c.values[3] in ("wb", "w")])
def test_large_offset_rows_keep_precision(name, fn, reference, params, impl):
    """Rows with a mean far from zero: float32 statistics must not cancel catastrophically."""
    g = rng()
    shape = (6, 67) if SMALL_SHAPES else (6, 768)
    args, _ = _inputs(g, name, params, shape, np.float32)
    args[0] = (np.float32(30) + randn(g, shape, np.float32)).astype(np.float32)
    got = run(impl, fn, *args, _op=name)
    assert_close(got, reference(*args), 1e-5, name + " offset", cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="read-only host arrays: the CPU target")
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, params, impl", [c for c in _cases() if c.values[3] in ("wb", "w")])
def test_read_only_and_broadcast_inputs(name, fn, reference, params, impl, dtype, residual):
    """Read-only x, weight, bias and residual; x and residual broadcast over rows
    (np.broadcast_to), and a weight that is a broadcast view of one value."""
    g = rng()
    shape = (6, 130)
    args, _ = _inputs(g, name, params, shape, dtype)
    r = randn(g, shape, dtype) if residual else None
    w1 = np.broadcast_to(args[1][:1], args[1].shape)
    variants = [([read_only(a) for a in args], read_only(r), "read-only"),
                ([broadcast_rows(args[0])] + args[1:], broadcast_rows(r), "broadcast rows"),
                ([args[0], w1] + args[2:], r, "broadcast weight")]
    for vargs, rr, what in variants:
        kw = {"residual": rr} if residual else {}
        got = run(impl, fn, *vargs, out=poisoned(shape, dtype), _op=name, **kw)
        plain = [None if a is None else np.array(a) for a in vargs]
        if residual:
            want, _ = reference(*plain, residual=np.array(rr))
            np.testing.assert_array_equal(got[1], plain[0] + np.array(rr))
            got = got[0]
        else:
            want = reference(*plain)
        assert_close(got, want, TOL[np.dtype(dtype)], f"{name} {what}", cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
@pytest.mark.parametrize("impl", impl_params("layer_norm"))
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    """Read-only and broadcast inputs run the machine code compiled for writeable arrays:
    no new specialization of any norm kernel, no warning."""
    from kernels_cpu import norm as K

    g = rng()
    x, r = randn(g, (5, 40), np.float32), randn(g, (5, 40), np.float32)
    w, b = randn(g, (40,), np.float32), randn(g, (40,), np.float32)
    run(impl, dispatch.layer_norm, x, w, b, _op="layer_norm")
    run(impl, dispatch.layer_norm, x, w, b, residual=r, _op="layer_norm")
    run(impl, dispatch.rms_norm, x, w, _op="rms_norm")
    run(impl, dispatch.rms_norm, x, w, residual=r, _op="rms_norm")

    def variants():
        run(impl, dispatch.layer_norm, read_only(x), read_only(w), read_only(b), _op="layer_norm")
        run(impl, dispatch.layer_norm, broadcast_rows(x), w, b, residual=read_only(r), _op="layer_norm")
        run(impl, dispatch.rms_norm, read_only(x), broadcast_rows(w), _op="rms_norm")
        run(impl, dispatch.rms_norm, x, read_only(w), residual=broadcast_rows(r), _op="rms_norm")

    assert_no_new_specialization([K], variants, impl)


@pytest.mark.skipif(ON_CUDA, reason="host-only check of the returned buffers")
@pytest.mark.parametrize("name, fn", [("layer_norm", dispatch.layer_norm), ("rms_norm", dispatch.rms_norm)])
def test_out_is_returned_and_h_is_new(name, fn):
    g = rng()
    x = g.random((4, 9)).astype(np.float32)
    r = g.random((4, 9)).astype(np.float32)
    out = np.empty_like(x)
    assert fn(x, out=out) is out
    y, h = fn(x, residual=r, out=out)
    assert y is out and h is not x and h is not r and not np.shares_memory(h, out)


@pytest.mark.skipif(ON_CUDA, reason="host-only edge case")
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (2, 0, 4)], ids=str)
def test_empty(shape):
    x = np.ones(shape, np.float32)
    assert dispatch.layer_norm(x).shape == shape
    y, h = dispatch.rms_norm(x, residual=x.copy())
    assert y.shape == h.shape == shape


# ---- bad input ---------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="argument checks are device-independent")
X = np.ones((3, 4), np.float32)


@cpu_only
@pytest.mark.parametrize("call, err, msg", [
    (lambda: dispatch.layer_norm(np.ones((3, 4), np.int32)), TypeError, "x must have dtype float32 or float64"),
    (lambda: dispatch.layer_norm(X, np.ones(4)), TypeError, r"weight must have the same dtype as x \(float32\)"),
    (lambda: dispatch.layer_norm(X, None, np.ones(4)), TypeError, "bias must have the same dtype as x"),
    (lambda: dispatch.rms_norm(X, residual=np.ones((3, 4))), TypeError, "residual must have the same dtype as x"),
    (lambda: dispatch.layer_norm(X, np.ones(5, np.float32)), ValueError, r"weight must have shape \(4,\)"),
    (lambda: dispatch.layer_norm(X, None, np.ones((1, 4), np.float32)), ValueError, r"bias must have shape \(4,\)"),
    (lambda: dispatch.rms_norm(X, np.ones(3, np.float32)), ValueError, r"weight must have shape \(4,\)"),
    (lambda: dispatch.rms_norm(X, residual=np.ones((1, 4), np.float32)), ValueError,
     r"residual must have shape \(3, 4\)"),
    (lambda: dispatch.layer_norm(np.ones((), np.float32)), ValueError, "x must have at least 1 dimensions"),
    (lambda: dispatch.layer_norm(X, eps=0.0), ValueError, "eps must be a finite positive number"),
    (lambda: dispatch.rms_norm(X, eps=-1e-6), ValueError, "eps must be a finite positive number"),
    (lambda: dispatch.rms_norm(X, eps=float("nan")), ValueError, "eps must be a finite positive number"),
    (lambda: dispatch.layer_norm(X, eps=float("inf")), ValueError, "eps must be a finite positive number"),
    (lambda: dispatch.layer_norm(X, eps="small"), TypeError, "eps must be a real number"),
    (lambda: dispatch.rms_norm([[1.0, 2.0]]), TypeError, "x must be a numpy array"),
])
def test_bad_inputs(call, err, msg):
    with pytest.raises(err, match=msg):
        call()


@cpu_only
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_bad_out_rejected_and_untouched(name):
    fn = getattr(dispatch, name)
    g = rng()
    x = g.random((3, 4)).astype(np.float32)
    r = g.random((3, 4)).astype(np.float32)
    w = g.random(4).astype(np.float32)
    for bad, err, msg, kw in [
        (np.zeros((3, 5), np.float32), ValueError, "out must have shape", {}),
        (np.zeros((3, 4), np.float64), TypeError, "out must have dtype", {}),
        (np.zeros((3, 4), np.float32)[:, :3], ValueError, "out must have shape", {"residual": r}),
    ]:
        before = bad.copy()
        with pytest.raises(err, match=msg):
            fn(x, w, out=bad, **kw)
        assert np.array_equal(bad, before)
    xs, rs = x.copy(), r.copy()
    with pytest.raises(ValueError, match="out overlaps input x"):
        fn(x, w, out=x)
    with pytest.raises(ValueError, match="out overlaps input residual"):
        fn(x, w, residual=r, out=r)
    assert np.array_equal(x, xs) and np.array_equal(r, rs)


# ---- constant rows and large offsets ------------------------------------------------------

CONST_VALUES = [0.0, 3.7, 1e4 + 0.1, -2.5e6, 1e20]
CONST_D = [1, 7, 67, 300] if SMALL_SHAPES else [1, 7, 768, 4096]
LN_CASES = [c for c in _cases() if c.values[0] == "layer_norm" and c.values[3] in ("wb", "")]


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", CONST_D)
@pytest.mark.parametrize("name, fn, reference, params, impl", LN_CASES)
def test_layer_norm_constant_rows_give_bias(name, fn, reference, params, impl, d, dtype, residual):
    """A constant row has no deviation: the output is exactly the bias (0 without one), for
    every finite constant (PyTorch gives the same).  Before the shifted, corrected two-pass
    statistics, float32 D = 4096 gave 1.4e-3 at c = 3.7, 0.53 at 1e4 + 0.1, -1 at 1e20."""
    g = rng()
    rows = len(CONST_VALUES)
    c = np.array(CONST_VALUES, dtype)[:, None]
    x = np.broadcast_to(c, (rows, d)).copy()
    args, _ = _inputs(g, name, params, (rows, d), dtype)
    args[0] = x
    eps = 1e-5
    want = np.zeros((rows, d), dtype) if args[2] is None else np.broadcast_to(args[2], (rows, d))
    if residual:
        # h = x/2 + x/2 == x exactly (halving and doubling are exact, 1e20 included)
        half = (x / dtype(2)).astype(dtype)
        got, h = run(impl, fn, half, *args[1:], eps=eps, residual=half, out=poisoned(x.shape, dtype), _op=name)
        np.testing.assert_array_equal(h, x)
    else:
        got = run(impl, fn, *args, eps=eps, out=poisoned(x.shape, dtype), _op=name)
    for i, cv in enumerate(CONST_VALUES):
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"c = {cv!r}, D = {d}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, params, impl", LN_CASES)
def test_layer_norm_infinite_rows_give_nan(name, fn, reference, params, impl, dtype):
    """A row holding +-inf has no finite mean: NaN, as PyTorch."""
    g = rng()
    x = randn(g, (3, 9), dtype)
    x[0] = np.inf
    x[1, 4] = -np.inf
    args, _ = _inputs(g, name, params, x.shape, dtype)
    args[0] = x
    got = run(impl, fn, *args, out=poisoned(x.shape, dtype), _op=name)
    assert np.all(np.isnan(got[:2])) and np.all(np.isfinite(got[2]))
    with np.errstate(invalid="ignore"):  # inf - inf in the reference's rows 0 and 1
        want = reference(*args)
    assert_close(got[2], want[2], TOL[np.dtype(dtype)], cancel=True)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("spread", [1.0, 1e-2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, params, impl",
                         [c for c in _cases() if c.values[0] == "layer_norm"])
def test_layer_norm_offset_rows_keep_precision(name, fn, reference, params, impl, dtype, spread, residual):
    """Rows 1e4 + small noise (and rows at other offsets): accurate relative to the spread,
    i.e. the mean is not rounded to the dtype (float32: half an ulp of 1e4 is 4.9e-4)."""
    g = rng()
    shape = (4, 67) if SMALL_SHAPES else (6, 4096)
    offsets = np.array([1e4, -1e4, 3e5, 1e4], dtype)[:, None] if SMALL_SHAPES else \
        np.array([1e4, -1e4, 3e5, 1e4, 123.456, -7e3], dtype)[:, None]
    x = (offsets + dtype(spread) * randn(g, shape, dtype)).astype(dtype)
    args, _ = _inputs(g, name, params, shape, dtype)
    tol = TOL[np.dtype(dtype)]
    if residual:
        r = (dtype(spread) * randn(g, shape, dtype)).astype(dtype)
        args[0] = (x - r).astype(dtype)
        got, h = run(impl, fn, *args, residual=r, out=poisoned(shape, dtype), _op=name)
        hd = args[0] + r  # h as stored (rounded to the dtype: ulp(3e5) = 0.03 in float32)
        np.testing.assert_array_equal(h, hd)
        want = reference(hd, *args[1:])
    else:
        args[0] = x
        got = run(impl, fn, *args, out=poisoned(shape, dtype), _op=name)
        want = reference(*args)
    assert_close(got, want, tol, f"{name} offset, spread {spread}", cancel=True)
