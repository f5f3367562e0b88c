"""dispatch.{relu, silu, gelu, swiglu, geglu} against float64 references, for every
implementation the dispatcher can pick."""
import numpy as np
import pytest

import dispatch
from tests.reference import activation as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, TOL, assert_close, assert_no_new_specialization, broadcast_rows,
                           impl_params, poisoned, randn, read_only, rng, run, strided)

FULL = [(1,), (7,), (3, 5), (2, 3, 1000), (32000,), (4, 1, 16385)]
SMALL = [(1,), (7,), (3, 5), (2, 3, 170)]  # the CUDA simulator runs each thread in Python
SHAPES = SMALL if SMALL_SHAPES else FULL
UNARY = [
    ("relu", dispatch.relu, ref.relu, {}),
    ("silu", dispatch.silu, ref.silu, {}),
    ("gelu", dispatch.gelu, ref.gelu, {}),
    ("gelu", dispatch.gelu, ref.gelu, {"approximate": "tanh"}),
]
GATED = [
    ("swiglu", dispatch.swiglu, ref.swiglu, {}),
    ("geglu", dispatch.geglu, ref.geglu, {}),
    ("geglu", dispatch.geglu, ref.geglu, {"approximate": "tanh"}),
]


def _cases(table):
    out = []
    for name, fn, r, kw in table:
        for p in impl_params(name):
            out.append(pytest.param(name, fn, r, kw, p.values[0], id=f"{name}{kw.get('approximate', '')}-{p.id}", marks=p.marks))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(UNARY))
def test_unary_matches_reference(name, fn, reference, kw, impl, shape, dtype):
    x = randn(rng(), shape, dtype) * 4
    out = poisoned(shape, dtype)
    got = run(impl, fn, x, out=out, **kw)
    assert_close(got, reference(x, **kw), TOL[np.dtype(dtype)], name)
    # without out= as well, from a non-contiguous view
    got2 = run(impl, fn, strided(x), **kw)
    assert_close(got2, reference(x, **kw), TOL[np.dtype(dtype)], name + " strided")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(GATED))
def test_gated_matches_reference(name, fn, reference, kw, impl, shape, dtype):
    g = rng()
    gate, up = randn(g, shape, dtype) * 4, randn(g, shape, dtype)
    out = poisoned(shape, dtype)
    got = run(impl, fn, gate, up, out=out, **kw)
    assert_close(got, reference(gate, up, **kw), TOL[np.dtype(dtype)], name)


def test_extreme_values_stay_finite():
    x = np.array([-1e30, -100.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 100.0, 1e30], np.float32)
    for f in (dispatch.silu, dispatch.gelu, lambda v: dispatch.gelu(v, "tanh")):
        y = f(x)
        assert np.all(np.isfinite(y)), y
        # relu is the limit, not the value: silu(-20) = -4e-8, hence the absolute 1e-6
        assert_close(y[1:-1], np.maximum(x[1:-1].astype(np.float64), 0), 1e-5, atol=1e-6)


# ---- read-only and broadcast inputs (host arrays) ----------------------------------------

host_only = pytest.mark.skipif(ON_CUDA, reason="host-array checks run on the CPU target")


@host_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(UNARY))
def test_unary_read_only_and_broadcast_inputs(name, fn, reference, kw, impl, dtype):
    x = randn(rng(), (5, 301), dtype) * 4
    for xx, what in [(read_only(x), "read-only"), (broadcast_rows(x), "broadcast_to")]:
        got = run(impl, fn, xx, out=poisoned(x.shape, dtype), **kw)
        assert_close(got, reference(np.array(xx), **kw), TOL[np.dtype(dtype)], f"{name} {what}")


@host_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name, fn, reference, kw, impl", _cases(GATED))
def test_gated_read_only_and_broadcast_inputs(name, fn, reference, kw, impl, dtype):
    g = rng()
    gate, up = randn(g, (5, 301), dtype) * 4, randn(g, (5, 301), dtype)
    for gg, uu, what in [(read_only(gate), read_only(up), "read-only"),
                         (broadcast_rows(gate), up, "broadcast gate"), (gate, broadcast_rows(up), "broadcast up")]:
        got = run(impl, fn, gg, uu, out=poisoned(gate.shape, dtype), **kw)
        assert_close(got, reference(np.array(gg), np.array(uu), **kw), TOL[np.dtype(dtype)], f"{name} {what}")


@host_only
@pytest.mark.parametrize("impl", impl_params("swiglu"))
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    """Read-only and broadcast inputs run the machine code compiled for writeable arrays:
    no new specialization of any activation kernel, no warning."""
    from kernels_cpu import activation as K

    g = rng()
    x, up = randn(g, (3, 70), np.float32), randn(g, (3, 70), np.float32)
    run(impl, dispatch.swiglu, x, up, _op="swiglu")
    run(impl, dispatch.relu, x, _op="relu")

    def variants():
        run(impl, dispatch.swiglu, read_only(x), broadcast_rows(up), _op="swiglu")
        run(impl, dispatch.relu, read_only(x), _op="relu")
        run(impl, dispatch.relu, broadcast_rows(x), _op="relu")

    assert_no_new_specialization([K], variants, impl)


# ---- bad input (host arrays: the checks are shared by every target) ----------------


@host_only
def test_bad_dtype_names_argument():
    with pytest.raises(TypeError, match="x must have dtype float32 or float64, got int64"):
        dispatch.relu(np.arange(3))


@host_only
def test_mixed_dtypes_rejected():
    with pytest.raises(TypeError, match="up must have the same dtype as gate"):
        dispatch.swiglu(np.ones(3, np.float32), np.ones(3, np.float64))


@host_only
def test_shape_mismatch_rejected():
    with pytest.raises(ValueError, match="up must have the shape of gate"):
        dispatch.geglu(np.ones(3), np.ones(4))


@host_only
def test_unknown_approximate_rejected():
    with pytest.raises(ValueError, match="approximate must be one of"):
        dispatch.gelu(np.ones(3), approximate="erf")


@host_only
def test_not_an_array_rejected():
    with pytest.raises(TypeError, match="x must be a numpy array or a CUDA device array, got list"):
        dispatch.silu([1.0, 2.0])


@host_only
@pytest.mark.parametrize("bad_out, err", [
    (np.zeros(4, np.float32), ValueError),
    (np.zeros(3, np.float64), TypeError),
])
def test_bad_out_rejected_and_untouched(bad_out, err):
    x = np.ones(3, np.float32)
    before = bad_out.copy()
    with pytest.raises(err, match="out must have"):
        dispatch.silu(x, out=bad_out)
    assert np.array_equal(bad_out, before)


@host_only
def test_out_aliasing_input_rejected():
    x = rng().random(8).astype(np.float32)
    before = x.copy()
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.relu(x[:4], out=x[2:6])
    assert np.array_equal(x, before)


@pytest.mark.skipif(ON_CUDA, reason="the CPU kernels' machine code")
def test_exact_gelu_loop_is_vectorized():
    """The exact gelu (erfc) loop compiles to vector FMAs: on zmm registers (16 float32
    lanes) on an AVX-512 target, where approx.wide_loops asks LLVM for 512-bit vectors,
    and on ymm on other x86 targets.  A fresh uncached function: numba does not show the
    machine code of cached kernels."""
    import platform
    import re

    from numba import njit

    from kernels_cpu import approx

    @njit(fastmath=approx.FASTMATH, error_model="numpy")
    def loop(x, out):
        approx.wide_loops()
        for i in range(x.shape[0]):
            out[i] = approx.gelu(x[i])

    x = np.linspace(-4, 4, 100).astype(np.float32)
    out = np.empty_like(x)
    loop(x, out)
    assert_close(out, ref.gelu(x.astype(np.float64)), TOL[np.dtype(np.float32)], "gelu")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("register names checked on x86 only")
    asm = loop.inspect_asm(loop.signatures[0])
    reg = "zmm" if approx._target_has_avx512() else "ymm"
    assert re.search(rf"vfmadd\w+\s+[^\n]*%{reg}", asm), f"no {reg} FMA in the gelu loop"


@pytest.mark.skipif(ON_CUDA, reason="the CPU kernels' float32 exp")
def test_float32_exp_over_its_whole_range():
    """approx.fexp (float32: n and 2^n from one FMA with a magic constant, a degree-6
    polynomial), vectorized as the kernels use it: within 1.2e-7 relative of float64 over
    [-87.3, 88.3] (3M points and the half-integer multiples of ln 2 where the rounding of n
    flips), inf above its range, 0 below it and for NaN (documented: the kernels' -inf
    scores), and exp(0) == 1 exactly.  fexp_nonpos agrees with it on x <= 0."""
    from numba import njit

    from kernels_cpu import approx

    @njit(fastmath=approx.FASTMATH, error_model="numpy")
    def loop(x, out, out_nonpos):
        approx.wide_loops()
        for i in range(x.shape[0]):
            out[i] = approx.fexp(x[i])
        for i in range(x.shape[0]):
            out_nonpos[i] = approx.fexp_nonpos(min(x[i], np.float32(0.0)))

    ties = ((np.arange(-125, 127) + 0.5) * np.log(2.0)).astype(np.float32)
    x = np.concatenate([np.linspace(-87.3, 88.3, 3_000_001, dtype=np.float32), ties]).astype(np.float32)
    edges = np.array([0.0, -0.0, 89.0, 1e30, np.inf, -88.0, -1e30, -np.inf, np.nan], np.float32)
    x = np.concatenate([x, edges])
    out, out_np = poisoned(x.shape, np.float32), poisoned(x.shape, np.float32)
    loop(x, out, out_np)
    n = x.size - edges.size
    want = np.exp(x[:n].astype(np.float64))
    rel = np.abs(out[:n] - want) / want
    assert rel.max() <= 1.2e-7, f"max relative error {rel.max():.3e} at x = {x[:n][np.argmax(rel)]!r}"
    assert out[n] == 1.0 and out[n + 1] == 1.0
    assert np.all(np.isposinf(out[n + 2:n + 5])) and np.all(out[n + 5:] == 0.0)
    neg = x <= 0
    np.testing.assert_array_equal(out_np[neg & ~np.isnan(x)], out[neg & ~np.isnan(x)])
