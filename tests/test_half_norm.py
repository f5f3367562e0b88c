"""layer_norm and rms_norm of bfloat16 / float16 x (PyTorch's 16-bit norms; CPU), each test
once per format (the `half` fixture): float32 inside, the result rounded once to x's dtype;
with a residual h = round(x + residual) is returned and normalized as rounded.  Every CPU
implementation is forced and compared with the float64 reference of the same 16-bit values:
rows of 1 and of 4096, batched and 1-D x, parameters in x's dtype and float32 (PyTorch's
mixed form) or none, views and read-only inputs, NaN-poisoned out=, NaN rows, threads, and
bad input that changes nothing."""
import numpy as np
import pytest

import dispatch
from tests.reference import norm as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, as_half, assert_half_close, concurrent_mismatches, impl_params,
                           other_half, poisoned, randn, rng, run, strided)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 / float16 x is a CPU input here")

# the float32 arithmetic before the rounding, relative to the size of the output's terms
F32_SLACK = 1e-5

SHAPES = [(7,), (3, 5), (1, 1), (5, 67), (2, 3, 37)] if SMALL_SHAPES else \
    [(7,), (3, 5), (1, 1), (33, 1), (5, 768), (2, 3, 257), (3, 4096), (2, 3, 4, 9)]
OPS = [("layer_norm", dispatch.layer_norm, ref.layer_norm), ("rms_norm", dispatch.rms_norm, ref.rms_norm)]


def _cases():
    return [pytest.param(name, fn, reference, p.values[0], id=f"{name}-{p.id}", marks=p.marks)
            for name, fn, reference in OPS for p in impl_params(name, "cpu")]


def _params(g, name, d, kind, half):
    """(weight, bias) of a call: in x's dtype `half`, float32 or none."""
    if kind is None:
        return None, None
    dt = half if kind == "half" else np.float32
    w = (1 + 0.1 * randn(g, (d,), np.float32)).astype(dt)
    b = randn(g, (d,), np.float32).astype(dt) if name == "layer_norm" else None
    return w, b


def _call(impl, fn, name, x, w, b, **kw):
    args = (x, w, b) if name == "layer_norm" else (x, w)
    return run(impl, fn, *args, _op=name, **kw)


def check(got, want, x, w, b, what=""):
    """assert_half_close with the float32 arithmetic's error relative to the output's terms
    (the normalized value, at most ~4 here, times |weight|, plus |bias|)."""
    terms = np.full(want.shape, 4.0)
    if w is not None:
        terms = terms * np.abs(np.asarray(w, np.float64))
    if b is not None:
        terms = terms + np.abs(np.asarray(b, np.float64))
    assert_half_close(got, want, F32_SLACK * terms, what)


@pytest.mark.parametrize("params", ["half", "f32", None], ids=["half-params", "f32-params", "no-params"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, impl", _cases())
def test_matches_reference(name, fn, reference, impl, shape, residual, params, half):
    g = rng()
    x = as_half(half, randn(g, shape, np.float32) * 2 + 0.5)
    w, b = _params(g, name, shape[-1], params, half)
    eps = float(g.choice([1e-5, 1e-6, 1e-2]))
    out = poisoned(shape, half)
    what = f"{impl} {shape} params={params}"
    if not residual:
        got = _call(impl, fn, name, x, w, b, eps=eps, out=out)
        assert got is out
        check(got, reference(x, w, b, eps=eps) if name == "layer_norm" else reference(x, w, eps=eps), x, w, b, what)
        return
    r = as_half(half, randn(g, shape, np.float32))
    got, h = _call(impl, fn, name, x, w, b, eps=eps, residual=r, out=out)
    assert got is out
    want_h = (x.astype(np.float32) + r.astype(np.float32)).astype(half)   # one rounding to x's dtype
    assert h.dtype == half and h.shape == shape
    np.testing.assert_array_equal(h.view(np.uint16), want_h.view(np.uint16))
    want = reference(want_h, w, b, eps=eps) if name == "layer_norm" else reference(want_h, w, eps=eps)
    check(got, want, want_h, w, b, what + " residual")


@pytest.mark.parametrize("name, fn, reference, impl", _cases())
def test_views_read_only_and_out(name, fn, reference, impl, half):
    """A strided x, read-only parameters, rows all equal (a broadcast view), a
    non-contiguous out= (filled by a copy); a constant row gives the bias exactly."""
    g = rng()
    m, d = (4, 9) if SMALL_SHAPES else (40, 130)
    x = as_half(half, randn(g, (m, d), np.float32))
    w, b = _params(g, name, d, "half", half)
    for p in (w, b):
        if p is not None:
            p.flags.writeable = False
    xs = strided(x)
    assert not xs.flags.c_contiguous
    want = reference(x, w, b) if name == "layer_norm" else reference(x, w)
    check(_call(impl, fn, name, xs, w, b), want, x, w, b, f"{impl} strided x")
    xb = np.broadcast_to(x[:1], x.shape)
    check(_call(impl, fn, name, xb, w, b), want[:1].repeat(m, 0), x, w, b, f"{impl} broadcast x")
    tout = np.full((d, m), np.nan, half).T
    assert _call(impl, fn, name, x, w, b, out=tout) is tout
    check(tout, want, x, w, b, f"{impl} non-contiguous out=")
    if name == "layer_norm":
        const = np.full((3, d), 7.5, half)
        got = _call(impl, fn, name, const, w, b)
        np.testing.assert_array_equal(got.view(np.uint16), np.broadcast_to(b, (3, d)).view(np.uint16))


@pytest.mark.parametrize("name, fn, reference, impl", _cases())
def test_nan_rows_and_empty(name, fn, reference, impl, half):
    g = rng()
    m, d = (4, 12) if SMALL_SHAPES else (20, 300)
    x = randn(g, (m, d), np.float32)
    x[1, d // 2] = np.nan
    x[2, 3] = np.inf
    x = as_half(half, x)
    w, b = _params(g, name, d, "half", half)
    got = _call(impl, fn, name, x, w, b)
    assert np.isnan(np.asarray(got, np.float64)[1]).all()
    # an inf: layer_norm's row is all NaN; rms_norm's is 0 but NaN at the inf (x / inf), as in float64
    check(got, reference(x, w, b) if name == "layer_norm" else reference(x, w), x, w, b, f"{impl} NaN / inf rows")
    empty = _call(impl, fn, name, np.zeros((0, d), half), w, b)
    assert empty.shape == (0, d) and empty.dtype == half


@pytest.mark.parametrize("name, fn, reference", OPS, ids=[o[0] for o in OPS])
def test_bad_input_changes_nothing(name, fn, reference, half):
    g = rng()
    x = as_half(half, randn(g, (3, 8), np.float32))
    w, b = _params(g, name, 8, "half", half)
    other = other_half(half)   # the other 16-bit format: not a parameter dtype for this x
    out = np.full((3, 8), np.nan, half)
    bad = [
        ((x.astype(np.int32), w, b), {}, TypeError, "x must have dtype float32 or float64.*bfloat16 / float16"),
        ((x, w.astype(np.float64), b), {}, TypeError, f"weight must have dtype {half} or float32"),
        ((x, w.astype(other), b), {}, TypeError, f"weight must have dtype {half} or float32"),
        ((x, w[:7], b), {}, ValueError, "weight must have shape"),
        ((x, w, b), {"residual": x.astype(np.float32)}, TypeError, "residual"),
        ((x, w, b), {"out": np.full((3, 8), np.nan, np.float32)}, (TypeError, ValueError), "out"),
        ((x, w, b), {"eps": float("nan")}, ValueError, "eps"),
    ]
    if name == "layer_norm":
        bad.append(((x, w, b.astype(other)), {}, TypeError, f"bias must have dtype {half} or float32"))
    for args, kw, exc, match in bad:
        args = args if name == "layer_norm" else args[:2]
        with pytest.raises(exc, match=match):
            fn(*args, out=out, **kw) if "out" not in kw else fn(*args, **kw)
        assert np.isnan(out.astype(np.float32)).all(), f"{match}: out= was written"


def test_threads_bitwise(half):
    """Calls from 4 Python threads at once give each case its single-threaded bits (the
    kernels' scratch rows are per call)."""
    g = rng()
    cases = []
    for i in range(4):
        m, d = (8 + 37 * i, 64 * (i + 1)) if not SMALL_SHAPES else (3 + i, 8 * (i + 1))
        x, r = as_half(half, randn(g, (m, d), np.float32)), as_half(half, randn(g, (m, d), np.float32))
        w, b = _params(g, "layer_norm", d, "half", half)
        cases.append((x, r, w, b))

    def call(case):
        x, r, w, b = case
        out, h = dispatch.layer_norm(x, w, b, residual=r)
        return np.concatenate([out.view(np.uint16), h.view(np.uint16), dispatch.rms_norm(x, w).view(np.uint16)])

    assert concurrent_mismatches(call, cases) == []
