"""dispatch.{relu, silu, gelu, swiglu, geglu}_backward against float64 references (checked
themselves against PyTorch autograd of the forward references), for every implementation the
dispatcher can pick."""
import numpy as np
import pytest

import dispatch
from tests.reference import activation as fwd
from tests.reference import activation_grad as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, TOL, assert_close, assert_no_new_specialization, broadcast_rows,
                           impl_params, poisoned, randn, read_only, rng, run, strided)

# sizes 1, 7, 4097 (SIMD tails), batched; the last one past the serial/parallel threshold
FULL = [(1,), (7,), (4097,), (3, 5, 33), (4, 1, 16385)]
SMALL = [(1,), (7,), (3, 37)]  # the CUDA simulator runs each thread in Python
SHAPES = SMALL if SMALL_SHAPES else FULL
DTYPES = [np.float32, np.float64]
UNARY = [
    ("relu_backward", dispatch.relu_backward, ref.relu_backward, {}),
    ("silu_backward", dispatch.silu_backward, ref.silu_backward, {}),
    ("gelu_backward", dispatch.gelu_backward, ref.gelu_backward, {}),
    ("gelu_backward", dispatch.gelu_backward, ref.gelu_backward, {"approximate": "tanh"}),
]
GATED = [
    ("swiglu_backward", dispatch.swiglu_backward, ref.swiglu_backward, {}),
    ("geglu_backward", dispatch.geglu_backward, ref.geglu_backward, {}),
    ("geglu_backward", dispatch.geglu_backward, ref.geglu_backward, {"approximate": "tanh"}),
]
host_only = pytest.mark.skipif(ON_CUDA, reason="host-array checks run on the CPU target")


def _cases(table):
    out = []
    for name, fn, r, kw in table:
        for p in impl_params(name):
            out.append(pytest.param(name, fn, r, kw, p.values[0], id=f"{name}{kw.get('approximate', '')}-{p.id}",
                                    marks=p.marks))
    return out


def _check(got, want, dtype, what, scale=None):
    # derivatives cross zero (silu' at x = -1.28, gelu' at -0.75): near there the result
    # cancels, so the elementwise bound carries an absolute part (support.assert_close)
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}"
    assert_close(got, want, TOL[np.dtype(dtype)], what, cancel=True, scale=scale)


def _slope_terms(name, x, kw):
    """Per element, the size of the two terms an activation's derivative sums, which cancel
    near its zero and in its negative tail: gelu' = Phi(x) + x phi(x), silu' = s + x s (1 - s).
    At x = -4.5 gelu' is ~7x smaller than its terms, so float32 rounding of the terms is
    ~1e-5 of the result (NK_TEST_SEED=1965153982: geglu_backward dgate on one element,
    2.0e-5 of itself, 3e-6 of its terms).  The normwise bound is taken against this size."""
    x = np.asarray(x, np.float64)
    if name.startswith("relu"):
        return np.ones_like(x)
    if name.startswith(("silu", "swiglu")):
        s = 1.0 / (1.0 + np.exp(-x))
        return s + np.abs(x) * s * (1.0 - s)
    if kw.get("approximate") == "tanh":
        c = np.sqrt(2.0 / np.pi)
        t = np.tanh(c * (x + 0.044715 * x ** 3))
        return 0.5 * (1.0 + t) + 0.5 * np.abs(x) * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)
    from math import erf
    phi = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)
    Phi = 0.5 * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))
    return Phi + np.abs(x) * phi


def _term_scale(name, kw, grad, x, up=None):
    """assert_close's scale for an activation backward's input gradient: the largest
    |grad (* up)| times the derivative's terms (_slope_terms)."""
    m = np.abs(np.asarray(grad, np.float64)) * _slope_terms(name, x, kw)
    if up is not None:
        m = m * np.abs(np.asarray(up, np.float64))
    m = m[np.isfinite(m)]
    return float(m.max()) if m.size else None


# ---- the references against PyTorch autograd ------------------------------------------------

def _torch_grads(name, kw, arrays, g):
    """torch.autograd.grad of the forward reference composition, float64."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    ts = [torch.from_numpy(a).requires_grad_(True) for a in arrays]
    fns = {
        "relu_backward": lambda x: F.relu(x),
        "silu_backward": lambda x: F.silu(x),
        "gelu_backward": lambda x: F.gelu(x, approximate=kw.get("approximate", "none")),
        "swiglu_backward": lambda a, u: F.silu(a) * u,
        "geglu_backward": lambda a, u: F.gelu(a, approximate=kw.get("approximate", "none")) * u,
    }
    y = fns[name](*ts)
    return [d.numpy() for d in torch.autograd.grad(y, ts, torch.from_numpy(g))]


@host_only
@pytest.mark.parametrize("name, fn, reference, kw", [c[:4] for c in UNARY + GATED],
                         ids=[f"{c[0]}{c[3].get('approximate', '')}" for c in UNARY + GATED])
def test_reference_matches_torch_autograd(name, fn, reference, kw):
    g = rng()
    x = np.concatenate([randn(g, 2000, np.float64) * 6, [0.0, -0.0, 1e-300, -1e-300, 30.0, -30.0, 700.0, -700.0]])
    grad = randn(g, x.shape, np.float64)
    if name in ("swiglu_backward", "geglu_backward"):
        up = randn(g, x.shape, np.float64)
        want = _torch_grads(name, kw, [x, up], grad)
        got = reference(grad, x, up, **kw)
    else:
        want = _torch_grads(name, kw, [x], grad)
        got = [reference(grad, x, **kw)]
    for a, b in zip(got, want):
        assert_close(a, b, 1e-9, name, cancel=True)
    # and the forward reference is the value the gated reference multiplies by
    if name == "swiglu_backward":
        np.testing.assert_allclose(got[1], grad * fwd.silu(x), rtol=1e-14, atol=0)


# ---- every implementation against the reference ------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(UNARY))
def test_unary_matches_reference(name, fn, reference, kw, impl, shape, dtype):
    g = rng()
    x, grad = randn(g, shape, dtype) * 4, randn(g, shape, dtype)
    want = reference(grad, x, **kw)
    sc = _term_scale(name, kw, grad, x)
    got = run(impl, fn, grad, x, out=poisoned(shape, dtype), _op=name, **kw)
    _check(got, want, dtype, name, sc)
    # without out= as well, from non-contiguous views
    got2 = run(impl, fn, strided(grad), strided(x), _op=name, **kw)
    _check(got2, want, dtype, name + " strided", sc)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(GATED))
def test_gated_matches_reference(name, fn, reference, kw, impl, shape, dtype):
    g = rng()
    gate, up, grad = randn(g, shape, dtype) * 4, randn(g, shape, dtype), randn(g, shape, dtype)
    want = reference(grad, gate, up, **kw)
    sc = _term_scale(name, kw, grad, gate, up)
    got = run(impl, fn, grad, gate, up, _op=name, **kw)
    assert isinstance(got, tuple) and len(got) == 2
    _check(got[0], want[0], dtype, name + " dgate", sc)
    _check(got[1], want[1], dtype, name + " dup")
    got2 = run(impl, fn, strided(grad), strided(gate), strided(up), _op=name, **kw)
    _check(got2[0], want[0], dtype, name + " dgate strided", sc)
    _check(got2[1], want[1], dtype, name + " dup strided")


# ---- extreme values, NaN ---------------------------------------------------------------------------

EXTREME = [-np.inf, -3e38, -1e30, -1e13, -100.0, -88.5, -20.0, -1e-30, -0.0, 0.0, 1e-30, 20.0, 88.5, 100.0, 1e13,
           1e30, 3e38, np.inf]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(UNARY))
def test_large_and_signed_zero_inputs_stay_finite(name, fn, reference, kw, impl, dtype):
    """No NaN from overflow: |x| = 100 (exp(100) overflows float32), 1e13 (x^3 overflows
    float32 in the tanh form), 3e38, +-inf (the limits 0 and 1), -0.0."""
    x = np.array(EXTREME, dtype)
    grad = np.ones_like(x)
    got = run(impl, fn, grad, x, _op=name, **kw)
    assert np.all(np.isfinite(got)), dict(zip(EXTREME, got))
    want = reference(grad, x, **kw)
    # the limits: 0 for x << 0 (float64 silu'(-100) is -3.7e-42), 1 for x >> 0
    big = np.abs(x) >= 100
    np.testing.assert_allclose(got[big], (x[big] > 0).astype(dtype), rtol=0, atol=1e-40)
    _check(got, want, dtype, name)


@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(GATED))
def test_gated_large_inputs_stay_finite(name, fn, reference, kw, impl):
    gate = np.array([v for v in EXTREME if np.isfinite(v)], np.float32)
    grad, up = np.ones_like(gate), np.full_like(gate, 0.5)
    dgate, dup = run(impl, fn, grad, gate, up, _op=name, **kw)
    assert np.all(np.isfinite(dgate)), dgate
    want = reference(grad, gate, up, **kw)
    _check(dgate, want[0], np.float32, name + " dgate")
    _check(dup, want[1], np.float32, name + " dup")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(UNARY))
def test_nan_in_gives_nan_out(name, fn, reference, kw, impl, dtype):
    """A NaN x gives NaN (relu too, where PyTorch's threshold_backward would pass grad_out);
    a NaN grad_out gives NaN wherever the derivative is used (relu: where x > 0)."""
    g = rng()
    x, grad = randn(g, (37,), dtype) * 4, randn(g, (37,), dtype)
    x[[0, 5, 36]] = np.nan
    grad[[1, 6, 20]] = np.nan
    x[[6, 20]] = [2.0, -0.5]
    got = run(impl, fn, grad, x, _op=name, **kw)
    assert np.isnan(got[[0, 5, 36]]).all()
    assert np.isnan(got[6])
    if name == "relu_backward":
        assert got[20] == 0.0  # threshold_backward: 0 where x <= 0, whatever grad_out is
    else:
        assert np.isnan(got[20])
    _check(got, reference(grad, x, **kw), dtype, name)


@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(GATED))
def test_gated_nan_in_gives_nan_out(name, fn, reference, kw, impl):
    g = rng()
    gate, up, grad = (randn(g, (23,), np.float64) for _ in range(3))
    gate[0], up[1], grad[2] = np.nan, np.nan, np.nan
    dgate, dup = run(impl, fn, grad, gate, up, _op=name, **kw)
    assert np.isnan(dgate[[0, 1, 2]]).all()
    assert np.isnan(dup[[0, 2]]).all() and np.isfinite(dup[1])  # dup does not depend on up
    want = reference(grad, gate, up, **kw)
    _check(dgate, want[0], np.float64, name)
    _check(dup, want[1], np.float64, name)


@pytest.mark.skipif(ON_CUDA, reason="the CPU kernels' float32 erfc fit")
def test_exact_gelu_float32_sweep():
    """The float32 exact-gelu derivative and value (kernels_cpu.approx.cdf_and_gauss: one
    exp, a fitted rational for erfcx) on a dense sweep of [-40, 40]: every element within
    the float32 tolerance (the derivative with the absolute part near its zero crossing),
    and the forward kernels (gelu, geglu) on the same sweep."""
    from kernels_common.activation import ACT_GELU
    from kernels_cpu import activation_grad as K

    x = np.linspace(-40, 40, 400_001).astype(np.float32)
    ones = np.ones_like(x)
    d, dgate, dup = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    K.unary_grad_serial(ones, x, d, ACT_GELU)
    K.gated_grad_serial(ones, x, ones, dgate, dup, ACT_GELU)
    assert_close(d, ref.gelu_backward(ones, x), TOL[np.dtype(np.float32)], "gelu'", cancel=True)
    assert_close(dgate, d, 1e-7, "dgate = gelu'")
    assert_close(dup, fwd.gelu(x), TOL[np.dtype(np.float32)], "gelu value")
    from kernels_cpu import activation as F

    y, yg = np.empty_like(x), np.empty_like(x)
    F.activation_serial(x, y, ACT_GELU)
    F.gated_serial(x, ones, yg, ACT_GELU)
    assert_close(y, fwd.gelu(x), TOL[np.dtype(np.float32)], "gelu forward")
    assert_close(yg, y, 1e-7, "geglu = gelu with up = 1")


# ---- read-only and broadcast inputs (host arrays) ----------------------------------------

@host_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(UNARY))
def test_unary_read_only_and_broadcast_inputs(name, fn, reference, kw, impl, dtype):
    g = rng()
    x, grad = randn(g, (5, 301), dtype) * 4, randn(g, (5, 301), dtype)
    for gg, xx, what in [(read_only(grad), read_only(x), "read-only"), (broadcast_rows(grad), x, "broadcast grad_out"),
                         (grad, broadcast_rows(x), "broadcast x")]:
        got = run(impl, fn, gg, xx, out=poisoned(x.shape, dtype), _op=name, **kw)
        _check(got, reference(np.array(gg), np.array(xx), **kw), dtype, f"{name} {what}")


@host_only
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(GATED))
def test_gated_read_only_inputs(name, fn, reference, kw, impl):
    g = rng()
    gate, up, grad = randn(g, (5, 301), np.float32) * 4, randn(g, (5, 301), np.float32), randn(g, (5, 301), np.float32)
    for args, what in [((read_only(grad), read_only(gate), read_only(up)), "read-only"),
                       ((grad, broadcast_rows(gate), up), "broadcast gate")]:
        got = run(impl, fn, *args, _op=name, **kw)
        want = reference(*(np.array(a) for a in args), **kw)
        _check(got[0], want[0], np.float32, f"{name} {what} dgate")
        _check(got[1], want[1], np.float32, f"{name} {what} dup")


@host_only
@pytest.mark.parametrize("impl", impl_params("swiglu_backward"))
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    """Read-only and broadcast inputs run the machine code compiled for writeable arrays."""
    from kernels_cpu import activation_grad as K

    g = rng()
    x, up = randn(g, (3, 70), np.float32), randn(g, (3, 70), np.float32)
    run(impl, dispatch.swiglu_backward, up, x, up, _op="swiglu_backward")
    run(impl, dispatch.gelu_backward, up, x, _op="gelu_backward")

    def variants():
        run(impl, dispatch.swiglu_backward, read_only(up), read_only(x), broadcast_rows(up), _op="swiglu_backward")
        run(impl, dispatch.gelu_backward, broadcast_rows(up), read_only(x), _op="gelu_backward")

    assert_no_new_specialization([K], variants, impl)


# ---- bad input (host arrays: the checks are shared by every target) ----------------

@host_only
@pytest.mark.parametrize("call, err, msg", [
    (lambda: dispatch.relu_backward(np.arange(3), np.ones(3)), TypeError,
     "grad_out must have dtype float32 or float64, got int64"),
    (lambda: dispatch.silu_backward(np.ones(3, np.float32), np.ones(3)), TypeError, "x must have the same dtype as grad_out"),
    (lambda: dispatch.gelu_backward(np.ones(3), np.ones(4)), ValueError, r"x must have the shape of grad_out \(3,\)"),
    (lambda: dispatch.gelu_backward(np.ones(3), np.ones(3), approximate="erf"), ValueError, "approximate must be one of"),
    (lambda: dispatch.gelu_backward(None, np.ones(3)), TypeError, "grad_out must be an array, got None"),
    (lambda: dispatch.silu_backward(np.ones(3), [1.0, 2.0, 3.0]), TypeError, "x must be a numpy array"),
    (lambda: dispatch.swiglu_backward(np.ones(3), np.ones(3), np.ones(3, np.float32)), TypeError,
     "up must have the same dtype as grad_out"),
    (lambda: dispatch.swiglu_backward(np.ones(3), np.ones((1, 3)), np.ones(3)), ValueError, "gate must have the shape"),
    (lambda: dispatch.geglu_backward(np.ones(3), np.ones(3), np.ones(2)), ValueError, "up must have the shape"),
    (lambda: dispatch.geglu_backward(np.ones(3), np.ones(3), np.ones(3), approximate=None), ValueError,
     "approximate must be one of"),
])
def test_bad_inputs_raise_naming_the_argument(call, err, msg):
    with pytest.raises(err, match=msg):
        call()


@host_only
@pytest.mark.parametrize("bad_out, err, msg", [
    (np.full(4, np.nan, np.float32), ValueError, "out must have shape"),
    (np.full(3, np.nan, np.float64), TypeError, "out must have dtype"),
])
def test_bad_out_rejected_and_untouched(bad_out, err, msg):
    x = np.ones(3, np.float32)
    with pytest.raises(err, match=msg):
        dispatch.silu_backward(x, x, out=bad_out)
    assert np.isnan(bad_out).all()
    g = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="out overlaps input grad_out"):
        dispatch.relu_backward(g[:4], x[:1].repeat(4), out=g[2:6])
    assert (g == 1).all()


@pytest.mark.skipif(ON_CUDA, reason="the CPU kernels' machine code")
@pytest.mark.parametrize("code_name", ["ACT_SILU", "ACT_GELU", "ACT_GELU_TANH"])
def test_derivative_loops_are_vectorized(code_name):
    """The derivative helpers inline into a caller's loop, which vectorizes (an erfc and an
    exp in one helper stayed a call, and the loop scalar, before inline_into_callers).  A
    fresh uncached loop around the public scalar helper, as a GEMM prologue would call it."""
    import platform
    import re

    from numba import njit

    from kernels_common import activation as A
    from kernels_cpu import activation_grad as K
    from kernels_cpu import approx

    code = getattr(A, code_name)

    @njit(fastmath=approx.FASTMATH, error_model="numpy")
    def loop(g, x, out):
        approx.wide_loops()
        for i in range(x.shape[0]):
            out[i] = K.grad_input(g[i], x[i], code)

    x = np.linspace(-6, 6, 200).astype(np.float32)
    out = np.empty_like(x)
    loop(np.ones_like(x), x, out)
    kind = {"ACT_SILU": "silu", "ACT_GELU": "gelu", "ACT_GELU_TANH": "gelu_tanh"}[code_name]
    want = ref._act_and_derivative(x, kind)[1]
    assert_close(out, want, TOL[np.dtype(np.float32)], kind, cancel=True)
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("register names checked on x86 only")
    asm = loop.inspect_asm(loop.signatures[0])
    reg = "zmm" if approx._target_has_avx512() else "ymm"
    assert re.search(rf"vfmadd\w+\s+[^\n]*%{reg}", asm), f"no {reg} FMA in the {kind} derivative loop"
