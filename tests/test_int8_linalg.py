"""dispatch.matmul_int8 and dispatch.dynamic_quant_linear against the float64 references,
every implementation forced (on this AVX-512 host: the VNNI, the AVX2 and the portable
paths): the integer sum is exact, so the float32 result must be the float64 value rounded
once (within one float32 ulp).  Per-tensor / per-row / per-column scales, int8 and uint8
a, zero points, full-range weights with -128 (vpmaddubsw's saturation trap), K not a
multiple of the 4-byte groups, M / N of 1 and off the register tiles, batched a, bias and
every activation, NaN / inf bias, out=, bad input, the prepacked weight."""
import numpy as np
import pytest

import dispatch
from dispatch.quantized import QuantizedArray
from tests.reference import int8_linalg as ref
from tests.test_threads import _run_threads
from tests.support import (ON_CUDA, SMALL_SHAPES, assert_close, compile_events, impl_params, poisoned, rng, run, to_host,
                           to_target)

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]


def host_impls(op, device=None):
    """impl_params(op) with the CPU paths this host lacks (AMX, AVX-512 VNNI on an AVX2-only
    host) skipped, with the reason: CI may run on either kind of host."""
    from dispatch.ops import int8_linalg as M

    out = []
    for p in (impl_params(op) if device is None else impl_params(op, device)):
        name = p.values[0]
        why = M._HOST.get(M._IMPL_PATH[name]) if name in M._IMPL_PATH else None
        out.append(p if why is None else pytest.param(name, id=name, marks=pytest.mark.skip(reason=why)))
    return out


def runnable(params):
    """The parameters of host_impls that are not skipped (for loops inside a test)."""
    return [p for p in params if not p.marks]

# (a shape, b shape (K, N))
MATMUL_FULL = [
    ((1, 1), (1, 1)),
    ((1, 5), (5, 48)),           # M = 1, K = 5 (one group of 4 and a tail)
    ((7, 3), (3, 1)),            # N = 1, K = 3
    ((9, 65), (65, 49)),         # one past the 8 x 48 tile
    ((17, 130), (130, 97)),
    ((130, 64), (64, 100)),      # many row panels
    ((2, 3, 7, 19), (19, 33)),   # batched a
    ((64, 768), (768, 96)),
]
MATMUL_SMALL = [((1, 5), (5, 7)), ((3, 9), (9, 10)), ((2, 5, 6), (6, 5))]   # the last: 10 rows, the tile kernel
MATMUL_SHAPES = MATMUL_SMALL if SMALL_SHAPES else MATMUL_FULL
LINEAR_FULL = [((1, 64), (100, 64)), ((33,), (9, 33)), ((5, 3, 31), (17, 31)), ((130, 70), (50, 70))]
LINEAR_SMALL = [((1, 8), (6, 8)), ((2, 5, 5), (4, 5))]
LINEAR_SHAPES = LINEAR_SMALL if SMALL_SHAPES else LINEAR_FULL


def _ints(g, shape, dtype):
    lo, hi = (-128, 127) if np.dtype(dtype) == np.int8 else (0, 255)
    return g.integers(lo, hi + 1, size=shape, dtype=dtype)


def _scales(g, n, unit=1.0):
    return ((0.001 + g.random(n)) * unit).astype(np.float32)


def make_a(g, shape, dtype=np.int8, kind="row", zp=True, unit=1.0):
    vals = _ints(g, shape, dtype)
    m = shape[-2]
    if kind == "row":
        z = _ints(g, (m,), dtype) if zp else None
        return QuantizedArray(vals, _scales(g, m, unit), z, axis=len(shape) - 2)
    z = _ints(g, (), dtype) if zp else None
    return QuantizedArray(vals, _scales(g, 1, unit)[0], z)


def make_b(g, shape, kind="col", zp=False, axis=1, unit=1.0):
    vals = _ints(g, shape, np.int8)
    if kind == "col":
        n = shape[axis]
        return QuantizedArray(vals, _scales(g, n, unit), _ints(g, (n,), np.int8) if zp else None, axis=axis)
    return QuantizedArray(vals, _scales(g, 1, unit)[0], _ints(g, (), np.int8) if zp else None)


def assert_one_rounding(got, want, what=""):
    """got (float32) is the float64 want rounded once: within one float32 ulp of it, NaN /
    inf patterns equal."""
    got = np.asarray(got)
    assert got.dtype == np.float32, what
    assert got.shape == want.shape, (got.shape, want.shape)
    fin = np.isfinite(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaN pattern differs"
    assert np.array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)].astype(np.float32)), what
    g, w = got[fin].astype(np.float64), want[fin]
    ulp = np.spacing(np.abs(w).astype(np.float32)).astype(np.float64)
    bad = np.abs(g - w) > ulp
    if bad.any():
        i = int(np.argmax(np.abs(g - w) / ulp))
        raise AssertionError(f"{what}: {int(bad.sum())} element(s) beyond one float32 rounding; worst got {g[i]!r}, "
                             f"exact {w[i]!r} ({abs(g[i] - w[i]) / ulp[i]:.2f} ulp)")


def on_target(q):
    """A QuantizedArray with its values on the test's device (the same scales)."""
    if isinstance(q, QuantizedArray) and ON_CUDA:
        return QuantizedArray(to_target(np.asarray(q.values)), q.scale, q.zero_point, q.axis)
    return q


def _call(impl, fn, *args, **kwargs):
    return run(impl, fn, *(on_target(a) for a in args), **{k: on_target(v) for k, v in kwargs.items()})


# ---- matmul_int8 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("b_kind", ["col", "tensor"])
@pytest.mark.parametrize("a_kind", ["row", "tensor"])
@pytest.mark.parametrize("a_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("impl", host_impls("matmul_int8"))
def test_matmul_int8_exact(impl, sa, sb, a_dtype, a_kind, b_kind):
    g = rng()
    a = make_a(g, sa, a_dtype, a_kind)
    b = make_b(g, sb, b_kind, zp=bool(g.integers(2)))
    got = _call(impl, dispatch.matmul_int8, a, b)
    assert_one_rounding(got, ref.matmul_int8(a, b), f"{impl} {sa}x{sb}")


@pytest.mark.parametrize("a_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("impl", host_impls("matmul_int8"))
def test_full_range_extremes_do_not_saturate(impl, a_dtype):
    """a at its extremes (255 for uint8, -128 for int8 (stored 0 after the +128 shift)) against
    weights of -128 / 127: pair sums of 255 * -128 * 2 overflow int16 (vpmaddubsw saturates
    there); every path must give the exact sum."""
    k, n = (12, 5) if SMALL_SHAPES else (260, 50)
    g = rng()
    hi = 255 if a_dtype == np.uint8 else 127
    lo = 0 if a_dtype == np.uint8 else -128
    av = np.where(g.random((3, k)) < 0.8, hi, lo).astype(a_dtype)
    bv = np.where(g.random((k, n)) < 0.5, -128, 127).astype(np.int8)
    bv[:, 0] = -128
    av[0] = hi
    a = QuantizedArray(av, np.float32(1.0))
    b = QuantizedArray(bv, np.float32(1.0))
    got = _call(impl, dispatch.matmul_int8, a, b)
    want = ref.matmul_int8(a, b)
    assert got[0, 0] == hi * -128 * k
    assert_one_rounding(got, want, impl)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("impl", host_impls("matmul_int8"))
def test_matmul_int8_bias_and_activation(impl, activation):
    g = rng()
    sa, sb = ((2, 5, 9), (9, 10)) if SMALL_SHAPES else ((3, 21, 70), (70, 53))
    a = make_a(g, sa, np.uint8, "row", unit=1 / 128)   # outputs of order one: the activations' range
    b = make_b(g, sb, "col", zp=True, unit=1 / (128 * np.sqrt(sb[0])))
    bias = g.standard_normal(sb[1]).astype(np.float32)
    got = _call(impl, dispatch.matmul_int8, a, b, bias=bias, activation=activation)
    want = ref.matmul_int8(a, b, bias=bias, activation=activation)
    if activation in (None, "relu"):
        assert_one_rounding(got, want, f"{impl} {activation}")
    else:
        assert_close(got, want, 1e-5, f"{impl} {activation}", cancel=True)


@pytest.mark.parametrize("impl", host_impls("matmul_int8"))
def test_nonfinite_bias_propagates(impl):
    g = rng()
    a = make_a(g, (5, 13), np.int8, "row")
    b = make_b(g, (13, 6), "col")
    bias = g.standard_normal(6).astype(np.float32)
    bias[1], bias[3], bias[4] = np.nan, np.inf, -np.inf
    got = _call(impl, dispatch.matmul_int8, a, b, bias=bias, activation="relu")
    want = ref.matmul_int8(a, b, bias=bias, activation="relu")
    assert np.isnan(got[:, 1]).all() and np.isposinf(got[:, 3]).all() and (got[:, 4] == 0).all()
    assert_one_rounding(got, want, impl)


@pytest.mark.parametrize("impl", host_impls("matmul_int8"))
def test_matmul_int8_out(impl):
    g = rng()
    a = make_a(g, (2, 7, 11), np.int8, "row")
    b = make_b(g, (11, 9), "col")
    want = ref.matmul_int8(a, b)
    out = poisoned((2, 7, 9), np.float32)
    with dispatch.use(matmul_int8=impl):
        got = dispatch.matmul_int8(on_target(a), on_target(b), out=out)
    assert got is out
    assert_one_rounding(to_host(out), want, impl)
    if not ON_CUDA:  # a non-contiguous out= is filled as well
        big = np.full((2, 7, 18), np.nan, np.float32)
        with dispatch.use(matmul_int8=impl):
            got = dispatch.matmul_int8(a, b, out=big[..., ::2])
        assert_one_rounding(big[..., ::2], want, impl)
        assert np.isnan(big[..., 1::2]).all()


def test_empty_and_zero_rows():
    g = rng()
    a = make_a(g, (0, 8), np.int8, "tensor")
    b = make_b(g, (8, 5), "col")
    assert dispatch.matmul_int8(a, b).shape == (0, 5)
    # x rows of zeros quantize with scale 1, zp 0: exact zeros (+ bias)
    x = np.zeros((3, 8), np.float32)
    w = make_b(g, (5, 8), "col", axis=0)
    bias = g.standard_normal(5).astype(np.float32)
    np.testing.assert_array_equal(dispatch.dynamic_quant_linear(x, w, bias), np.broadcast_to(bias, (3, 5)))


# ---- bad input --------------------------------------------------------------------------------------

def _bad_cases():
    g = np.random.default_rng(0)
    a = make_a(g, (4, 8), np.int8, "row")
    b = make_b(g, (8, 5), "col")
    a_k = QuantizedArray(a.values, _scales(g, 8), axis=1)
    b_k = QuantizedArray(b.values, _scales(g, 8), axis=0)
    b_u8 = QuantizedArray(_ints(g, (8, 5), np.uint8), np.float32(1.0))
    return [
        ("a_q", TypeError, (a.values, b), {}),
        ("a_q", TypeError, (np.zeros((4, 8), np.float32), b), {}),
        ("b_q", TypeError, (a, b.values), {}),
        ("a_q", ValueError, (a_k, b), {}),                       # scale along K
        ("b_q", ValueError, (a, b_k), {}),                       # scale along K
        ("b_q", TypeError, (a, b_u8), {}),
        ("b_q", ValueError, (a, make_b(g, (7, 5), "col")), {}),  # K mismatch
        ("b_q", ValueError, (a, QuantizedArray(np.zeros((2, 8, 5), np.int8), np.float32(1))), {}),
        ("bias", ValueError, (a, b), {"bias": np.zeros(4, np.float32)}),
        ("bias", TypeError, (a, b), {"bias": np.zeros(5, np.float64)}),
        ("activation", ValueError, (a, b), {"activation": "tanh"}),
        ("out_dtype", ValueError, (a, b), {"out_dtype": np.float64}),
        ("out", ValueError, (a, b), {"out": np.zeros((4, 6), np.float32)}),
        ("out", TypeError, (a, b), {"out": np.zeros((4, 5), np.float64)}),
    ]


@pytest.mark.parametrize("name, exc, args, kwargs", _bad_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_matmul_int8_bad_input(name, exc, args, kwargs):
    out = kwargs.get("out")
    if out is None:
        out = np.full((4, 5), np.nan, np.float32)
        kwargs = {**kwargs, "out": out}
    with pytest.raises(exc, match=name):
        dispatch.matmul_int8(*args, **kwargs)
    assert np.all(np.isnan(out)) or not np.any(out)


def test_k_too_large_refused():
    k = ref_max_k = 65793 + 1
    assert ref_max_k == dispatch.registry.OPS["matmul_int8"].describe.__globals__["MAX_K"] + 1
    a = QuantizedArray(np.zeros((1, k), np.int8), np.float32(1))
    b = QuantizedArray(np.zeros((k, 1), np.int8), np.float32(1))
    with pytest.raises(ValueError, match="K = 65794 is too large"):
        dispatch.matmul_int8(a, b)
    with pytest.raises(ValueError, match="too large"):
        dispatch.dynamic_quant_linear(np.zeros((1, k), np.float32), QuantizedArray(np.zeros((1, k), np.int8),
                                                                                   np.float32(1)))


def test_dynamic_quant_linear_bad_input():
    g = np.random.default_rng(1)
    x = g.standard_normal((3, 8)).astype(np.float32)
    w = make_b(g, (5, 8), "col", axis=0)
    with pytest.raises(TypeError, match="w_q"):
        dispatch.dynamic_quant_linear(x, w.values)
    with pytest.raises(ValueError, match="w_q"):
        dispatch.dynamic_quant_linear(x, QuantizedArray(w.values, _scales(g, 8), axis=1))
    with pytest.raises(ValueError, match="w_q"):
        dispatch.dynamic_quant_linear(x[:, :7], w)
    with pytest.raises(TypeError, match="x"):
        dispatch.dynamic_quant_linear(x.astype(np.float64), w)
    out = np.full((3, 5), np.nan, np.float32)
    for bad in (np.nan, np.inf, -np.inf):
        xb = x.copy()
        xb[1, 2] = bad
        for impl in runnable(host_impls("dynamic_quant_linear", "cpu")):
            with dispatch.use(dynamic_quant_linear=impl.values[0]), pytest.raises(ValueError, match="x must be finite"):
                dispatch.dynamic_quant_linear(xb, w, out=out)
        for impl in runnable(host_impls("dynamic_quant_linear")):  # the target's (the CUDA quantizer under NK_TEST_DEVICE=cuda)
            with pytest.raises(ValueError, match="x must be finite"):
                _call(impl.values[0], dispatch.dynamic_quant_linear, xb, w)
    assert np.isnan(out).all()


# ---- dynamic_quant_linear ------------------------------------------------------------------------------

@pytest.mark.parametrize("w_kind", ["col", "tensor"])
@pytest.mark.parametrize("sx, sw", LINEAR_SHAPES, ids=str)
@pytest.mark.parametrize("impl", host_impls("dynamic_quant_linear"))
def test_dynamic_quant_linear_exact(impl, sx, sw, w_kind):
    g = rng()
    x = g.standard_normal(sx).astype(np.float32)
    if x.ndim >= 2:
        x[..., 0, :] = np.abs(x[..., 0, :])    # a one-sided row (zp 0)
        x[..., -1, :] *= 50                    # a row of another scale
    w = make_b(g, sw, w_kind, axis=0, zp=w_kind == "tensor")
    got = _call(impl, dispatch.dynamic_quant_linear, x, w)
    assert_one_rounding(got, ref.dynamic_quant_linear(x, w), f"{impl} {sx}")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("impl", host_impls("dynamic_quant_linear"))
def test_dynamic_quant_linear_bias_and_activation(impl, activation):
    g = rng()
    sx, sw = ((10, 7), (6, 7)) if SMALL_SHAPES else ((20, 96), (70, 96))
    x = g.standard_normal(sx).astype(np.float32)
    w = make_b(g, sw, "col", axis=0, unit=1 / (128 * np.sqrt(sw[1])))
    bias = g.standard_normal(sw[0]).astype(np.float32)
    got = _call(impl, dispatch.dynamic_quant_linear, x, w, bias, activation=activation)
    want = ref.dynamic_quant_linear(x, w, bias, activation=activation)
    if activation in (None, "relu"):
        assert_one_rounding(got, want, f"{impl} {activation}")
    else:
        assert_close(got, want, 1e-5, f"{impl} {activation}", cancel=True)


def test_quantization_matches_the_reference_quantizer():
    """The kernels' per-row quantization is the reference's, integer for integer: checked
    through a weight that is the identity (the product returns the quantized x)."""
    g = rng()
    k = 12 if SMALL_SHAPES else 40
    x = (g.standard_normal((6, k)) * np.array([[1], [10], [1e-3], [1e4], [0.5], [3]])).astype(np.float32)
    x[4] = np.abs(x[4])
    x[5] = -np.abs(x[5])
    w = QuantizedArray(np.eye(k, dtype=np.int8), np.float32(1))
    q, s, z = ref.quantize_rows_dynamic(x)
    for impl in runnable(host_impls("dynamic_quant_linear")):
        got = _call(impl.values[0], dispatch.dynamic_quant_linear, x, w)
        np.testing.assert_array_equal(got, ((q.astype(np.float64) - z[:, None]) * s[:, None]).astype(np.float32))


def test_dynamic_quant_linear_accuracy_against_float():
    """Against the unquantized float32 linear: per-row uint8 activations and per-channel
    int8 weights keep the normwise relative error near 1% on normal data (a sanity bound)."""
    g = rng()
    x = g.standard_normal((32, 256)).astype(np.float32)
    wf = (g.standard_normal((64, 256)) / 16).astype(np.float32)
    w = ref.quantize(wf, np.int8, axis=0, symmetric=True)
    got = dispatch.dynamic_quant_linear(x, w)
    full = x.astype(np.float64) @ wf.T.astype(np.float64)
    err = np.max(np.abs(got - full)) / np.max(np.abs(full))
    assert err < 0.03, err


# ---- the prepacked weight, the paths ------------------------------------------------------------------

@pytest.mark.skipif(ON_CUDA, reason="the CPU packing")
def test_weight_is_packed_once_and_explain_says_so():
    g = rng()
    a = make_a(g, (9, 40), np.int8, "row")
    b = make_b(g, (40, 50), "col")
    e = dispatch.explain("matmul_int8", a, b)
    assert not e.key.prepacked and "packed on this call" in str(e)
    dispatch.matmul_int8(a, b)
    e = dispatch.explain("matmul_int8", a, b)
    assert e.key.prepacked and "prepacked" in str(e) and e.chosen in str(e)
    keys = b.cached_keys()
    first = b.cached(keys[0], lambda: None)
    dispatch.matmul_int8(a, b)
    assert b.cached_keys() == keys and b.cached(keys[0], lambda: None) is first


@pytest.mark.skipif(ON_CUDA, reason="the CPU kernels")
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_portable_path_calls_compile_nothing_once_warm(activation):
    """The portable kernel takes the activation as a numba literal without re-typing itself on
    each call (numba's literally() did: 13 ms a call at 4x64x32, 2026-11-28)."""
    g = rng()
    x = g.standard_normal((4, 64)).astype(np.float32)
    w = dispatch.quantize(g.standard_normal((32, 64)).astype(np.float32), axis=0)
    with dispatch.use(dynamic_quant_linear="cpu-portable"):
        first = dispatch.dynamic_quant_linear(x, w, activation=activation)
        with compile_events() as seen:
            again = dispatch.dynamic_quant_linear(x, w, activation=activation)
    assert not seen, f"compiles / typings on a warm call: {seen}"
    np.testing.assert_array_equal(again, first)


@pytest.mark.skipif(ON_CUDA, reason="the CPU rule")
def test_rule_follows_the_host_features(monkeypatch):
    from dispatch import select
    from dispatch.ops import int8_linalg as M

    g = rng()
    a = make_a(g, (9, 40), np.int8, "row")
    b = make_b(g, (40, 50), "col")
    host = dict(M._HOST)
    order = ["cpu-amx", "cpu-vnni512", "cpu-avx2"]
    usable = [n for n in order if host[M._IMPL_PATH[n]] is None] + ["cpu-portable"]
    assert dispatch.explain("matmul_int8", a, b).chosen == usable[0]
    # take the paths away one by one, as hosts without them have it
    for i, name in enumerate(order):
        monkeypatch.setitem(M._HOST, M._IMPL_PATH[name], f"host lacks {name} (simulated)")
        select.clear_cache()
        e = dispatch.explain("matmul_int8", a, b)
        assert e.chosen == [n for n in usable if n not in order[:i + 1]][0]
        assert f"host lacks {name} (simulated)" in str(e)
        with dispatch.use(matmul_int8=name), pytest.raises(dispatch.NoImplementationError):
            dispatch.matmul_int8(a, b)
    assert dispatch.explain("matmul_int8", a, b).chosen == "cpu-portable"
    monkeypatch.undo()
    select.clear_cache()


# ---- dp4a ---------------------------------------------------------------------------------------------

def test_dp4a_twin_is_the_ptx_semantics():
    """kernels_cuda.int8_gemm.dp4a_reference (the simulator's dp4a) against the PTX ISA's
    definition of dp4a.u32.s32 computed with numpy: unsigned bytes of a, signed bytes of b,
    added to c with 32-bit wrap-around."""
    pytest.importorskip("numba.cuda")
    from kernels_cuda.int8_gemm import dp4a_reference

    g = rng()
    words = g.integers(-2**31, 2**31, size=(400, 3), dtype=np.int64)
    words[:8, :2] = [[-1, -2**31], [2**31 - 1, -1], [-1, -1], [0x7F7F7F7F, -0x7F7F7F80], [-1, 0x80808080 - 2**32],
                     [0, 0], [1, -1], [0x01020304, 0x7F80FF01]]
    words[8:12, 2] = [2**31 - 1, -2**31, 2**31 - 100, -2**31 + 5]
    for a, b, c in words:
        ua = np.array([a & 0xFFFFFFFF], np.uint32).view(np.uint8).astype(np.int64)
        sb = np.array([b & 0xFFFFFFFF], np.uint32).view(np.int8).astype(np.int64)
        want = np.array([(c + int(ua @ sb)) & 0xFFFFFFFF], np.uint32).view(np.int32)[0]
        assert dp4a_reference(a, b, c) == want, (a, b, c)


@pytest.mark.skipif(not ON_CUDA, reason="runs the dp4a device function (the simulator's twin, or the GPU's)")
def test_dp4a_on_the_device():
    from numba import cuda

    from kernels_cuda.int8_gemm import dp4a_probe, dp4a_reference

    g = rng()
    a, b, c = (g.integers(-2**31, 2**31, size=40, dtype=np.int64).astype(np.int32) for _ in range(3))
    d = cuda.device_array(40, np.int32)
    dp4a_probe()[1, 64](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), d)
    assert list(d.copy_to_host()) == [dp4a_reference(x, y, z) for x, y, z in zip(a, b, c)]


@pytest.mark.skipif(ON_CUDA, reason="host-side constants")
def test_cuda_launch_constants_match_the_kernels():
    pytest.importorskip("numba.cuda")
    from dispatch.cuda_impls import int8_linalg as C
    from kernels_cuda import int8_gemm as KC

    want = {"GEMV_MAX_ROWS": KC.GEMV_MAX_ROWS, "GEMV_THREADS": KC.GEMV_THREADS, "BM": KC.BM, "BN": KC.BN,
            "TX": KC.TX, "TY": KC.TY, "ROW_THREADS": KC.ROW_THREADS}
    assert C._kernel_consts() == want


@pytest.mark.skipif(SMALL_SHAPES, reason="K = 65793 rows of work per simulated thread")
@pytest.mark.parametrize("impl", host_impls("matmul_int8"))
def test_exact_at_the_largest_k(impl):
    """K = MAX_K with every product at its extreme (255 * -128, and 255 * 127): the int32
    accumulator reaches -2,147,483,520, 127 short of its limit, and must stay exact."""
    from dispatch.ops.int8_linalg import MAX_K

    k = MAX_K
    av = np.full((2, k), 255, np.uint8)
    bv = np.empty((k, 3), np.int8)
    bv[:, 0], bv[:, 1], bv[:, 2] = -128, 127, np.where(np.arange(k) % 2, -128, 127)
    a = QuantizedArray(av, np.float32(1.0))
    b = QuantizedArray(bv, np.float32(1.0))
    got = _call(impl, dispatch.matmul_int8, a, b)
    assert got[0, 0] == np.float32(-255 * 128 * k) and got[1, 1] == np.float32(255 * 127 * k)
    assert_one_rounding(got, ref.matmul_int8(a, b), impl)


@pytest.mark.parametrize("impl", host_impls("matmul_int8"))
def test_several_row_blocks_and_column_edges(impl):
    """Rows past one 64-row CUDA tile (and 32-row AMX block), columns off every tile width,
    K off the 8-word staging step: the edges of every kernel's blocking."""
    g = rng()
    a = make_a(g, (70, 37), np.int8, "row")
    b = make_b(g, (37, 21), "col", zp=True)
    got = _call(impl, dispatch.matmul_int8, a, b)
    assert_one_rounding(got, ref.matmul_int8(a, b), impl)
    # more row panels than one task takes (ROW_PANELS_MAX: 16 of 32 AMX rows), and columns
    # split in parts per thread whose last panel is partial
    from dispatch.ops.int8_linalg import ROW_PANELS_MAX
    a = make_a(g, (32 * ROW_PANELS_MAX + 37, 37), np.int8, "row")
    b = make_b(g, (37, 70), "col", zp=True)
    got = _call(impl, dispatch.matmul_int8, a, b, activation="relu")
    assert_one_rounding(got, np.maximum(ref.matmul_int8(a, b), 0), impl)


def test_task_blocking_splits_rows_on_the_vnni_path():
    """The VNNI path's tasks are ranges of row panels (each thread its rows of A and the
    whole weight), columns cut at ROWS_TASK_COLS; the other paths cut the columns; one row
    panel, or one thread, falls back to column parts."""
    from dispatch.ops import int8_linalg as M
    P = M.K
    npn = 3072 // 48
    assert M._blocks(16, 16, 48, 2, P.PATH_VNNI512) == (8, 16, 2)
    assert M._blocks(64, 16, 48, 2, P.PATH_VNNI512) == (16, 16, 4)        # <= ROW_PANELS_MAX a task
    assert M._blocks(16, npn, 48, 2, P.PATH_VNNI512) == (8, M.ROWS_TASK_COLS // 48, 2 * -(-npn // (M.ROWS_TASK_COLS // 48)))
    assert M._blocks(1, 16, 48, 2, P.PATH_VNNI512) == (1, 8, 2)          # one row panel: column parts
    assert M._blocks(16, 16, 48, 1, P.PATH_VNNI512)[2] == 2              # one thread: as before
    assert M._blocks(4, 24, 32, 2, P.PATH_AMX) == (4, 12, 2)
    assert M._blocks(16, 48, 16, 2, P.PATH_AVX2) == (16, 24, 2)


@pytest.mark.skipif(ON_CUDA, reason="the CPU VNNI implementation's row split")
def test_vnni_row_split_with_column_parts(monkeypatch):
    """Row ranges across column parts whose last panel is partial (ROWS_TASK_COLS cut to
    two 48-column panels), row panels split unevenly between the threads: exact."""
    from dispatch.ops import int8_linalg as M
    if M._HOST[M.K.PATH_VNNI512] is not None:
        pytest.skip(M._HOST[M.K.PATH_VNNI512])
    monkeypatch.setattr(M, "ROWS_TASK_COLS", 96)
    M.clear_plans()   # a plan kept from an earlier call of these shapes has the old blocking
    g = rng()
    a = make_a(g, (70, 45), np.int8, "row")
    b = make_b(g, (45, 230), "col", zp=True)
    bias = g.standard_normal(230).astype(np.float32)
    try:
        got = _call("cpu-vnni512", dispatch.matmul_int8, a, b, bias=bias, activation="relu")
    finally:
        M.clear_plans()
    assert_one_rounding(got, ref.matmul_int8(a, b, bias=bias, activation="relu"), "cpu-vnni512")


@pytest.mark.skipif(ON_CUDA, reason="the CPU packed paths' kept plans")
@pytest.mark.parametrize("impl", [p for p in host_impls("matmul_int8", "cpu") if p.values[0] != "cpu-portable"])
@pytest.mark.parametrize("rows", [1, 3, 20])
def test_kept_plans_take_each_call_s_arrays(impl, rows):
    """A packed path keeps a call's plan (blocking and argument blocks) per thread and shapes
    (dispatch/ops/int8_linalg.py _plan): later calls of the same shapes with other weights,
    activations (int8 and uint8, per row and per tensor), biases or none, and out= or none
    each get their own exact result, in any order, from several threads too, and the plan
    is the one kept."""
    from dispatch.ops import int8_linalg as M
    g = rng()
    k, n = 70, 100
    ws = [make_b(g, (k, n), "col", zp=True) for _ in range(2)]
    wts = [make_b(g, (n, k), "col", zp=False, axis=0) for _ in range(2)]
    biases = [None, g.standard_normal(n).astype(np.float32), g.standard_normal(n).astype(np.float32)]

    def check(step):
        a = make_a(g, (rows, k), (np.int8, np.uint8)[step % 2], ("row", "tensor")[step // 2 % 2])
        w, bias = ws[step % 2], biases[step % 3]
        out = poisoned((rows, n), np.float32) if step % 4 == 3 else None
        got = _call(impl, dispatch.matmul_int8, a, w, bias=bias, activation="relu", out=out)
        assert out is None or got is out
        assert_one_rounding(got, ref.matmul_int8(a, w, bias=bias, activation="relu"), f"{impl} step {step}")
        x = g.standard_normal((rows, k)).astype(np.float32)
        wt = wts[step % 2]
        got = _call(impl, dispatch.dynamic_quant_linear, x, wt, bias)
        assert_one_rounding(got, ref.dynamic_quant_linear(x, wt, bias), f"{impl} dql step {step}")

    M.clear_plans()
    check(0)
    kept = dict(M._PLANS.plans)
    assert kept, "no plan kept"
    for step in range(1, 9):
        check(step)
    assert all(M._PLANS.plans.get(key) is plan for key, plan in kept.items()), "the first call's plans were replaced"
    _run_threads(4, lambda i: [check(step) for step in range(i, i + 6)])


@pytest.mark.skipif(ON_CUDA, reason="the CPU packed paths' launch")
@pytest.mark.parametrize("team_free", [True, False], ids=["team", "team-busy"])
@pytest.mark.parametrize("rows", [1, 64, 600])
@pytest.mark.parametrize("impl", [p for p in host_impls("dynamic_quant_linear", "cpu")
                                  if p.values[0] != "cpu-portable"])
def test_packed_call_each_launch(impl, rows, team_free, monkeypatch):
    """Every way a packed-path call is launched (dispatch/ops/int8_linalg.py _run_packed): A
    packed on the calling thread first (one row; out= given), by the GEMM's tasks (no
    out=), or on several threads first (600 rows with out=, the call not kept in one
    compiled step), the GEMM on the thread team or, with the team taken (its entry
    gone), on numba's threads: exact results for dynamic_quant_linear and per-tensor and
    per-row matmul_int8, and a row of x holding NaN raises with out= untouched."""
    from kernels_cpu import team

    if not team_free:
        monkeypatch.setattr(team, "entry", lambda: (0, 0))
    g = rng()
    k, n = 700, 400     # a one-row product of 2^18+ weights runs on the workers on every host
    wt = make_b(g, (n, k), "col", axis=0)
    x = g.standard_normal((rows, k)).astype(np.float32)
    bad = x.copy()
    bad[rows // 2, 3] = np.nan
    for with_out in (False, True):
        out = poisoned((rows, n), np.float32) if with_out else None
        got = _call(impl, dispatch.dynamic_quant_linear, x, wt, out=out)
        assert out is None or got is out
        assert_one_rounding(got, ref.dynamic_quant_linear(x, wt), f"{impl} rows {rows} out= {with_out}")
        out = poisoned((rows, n), np.float32) if with_out else None
        with pytest.raises(ValueError, match="x must be finite"):
            _call(impl, dispatch.dynamic_quant_linear, bad, wt, out=out)
        assert out is None or np.isnan(out).all()
    w = make_b(g, (k, n), "col", zp=True)
    for kind in ("tensor", "row"):
        a = make_a(g, (rows, k), np.uint8, kind)
        bias = g.standard_normal(n).astype(np.float32)
        got = _call(impl, dispatch.matmul_int8, a, w, bias=bias)
        assert_one_rounding(got, ref.matmul_int8(a, w, bias=bias), f"{impl} rows {rows} a per {kind}")


@pytest.mark.skipif(ON_CUDA, reason="the CPU VNNI implementation's one-row path")
@pytest.mark.parametrize("a_dtype", [np.int8, np.uint8])
def test_vnni_one_row_path(a_dtype):
    """A one-row call to cpu-vnni512 runs vpdpbusd with MR = 1 over the same 48-column panels
    (kernels_cpu.int8_gemm.PATH_VNNI_ROWS): exact on N off the panel, with zero points, bias
    and an activation, on the calling thread and on the workers; it equals the 8-row tile's
    result on the same packed weight (two rows run the tile)."""
    from dispatch.ops import int8_linalg as M
    if M._HOST[M.K.PATH_VNNI_ROWS] is not None:
        pytest.skip(M._HOST[M.K.PATH_VNNI_ROWS])
    g = rng()
    for k, n in ((70, 33), (1100, 1000)):
        a = make_a(g, (2, k), a_dtype, "row")
        b = make_b(g, (k, n), "col", zp=True)
        bias = g.standard_normal(n).astype(np.float32)
        both = _call("cpu-vnni512", dispatch.matmul_int8, a, b, bias=bias, activation="relu")
        a1 = dispatch.QuantizedArray(a.values[:1], a.scale[:1], a.zero_point[:1], axis=0)
        got = _call("cpu-vnni512", dispatch.matmul_int8, a1, b, bias=bias, activation="relu")
        np.testing.assert_array_equal(got, both[:1])
        want = np.maximum(ref.matmul_int8(a1, b) + bias.astype(np.float64), 0)
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-6, err_msg=f"1x{k}x{n}")
        assert_one_rounding(_call("cpu-vnni512", dispatch.matmul_int8, a1, b), ref.matmul_int8(a1, b), f"1x{k}x{n}")
        x = g.standard_normal((2, k)).astype(np.float32)
        w = make_b(g, (n, k), "col", zp=False, axis=0)
        two = _call("cpu-vnni512", dispatch.dynamic_quant_linear, x, w)
        np.testing.assert_array_equal(_call("cpu-vnni512", dispatch.dynamic_quant_linear, x[:1], w), two[:1])


@pytest.mark.skipif(ON_CUDA, reason="the CPU AMX implementation's one-row path")
@pytest.mark.parametrize("a_dtype", [np.int8, np.uint8])
def test_amx_one_row_path(a_dtype):
    """A one-row call to cpu-amx runs vpdpbusd over the AMX panels (kernels_cpu.int8_gemm
    .PATH_AMX_ROWS): exact on K and N off the 64-byte chunk and the 32-column panel, with
    zero points, bias and an activation, on the calling thread (a small weight) and on the
    workers (a weight over ROWS_SERIAL_MAX values); both matmul_int8 and
    dynamic_quant_linear (the transposed weight)."""
    from dispatch.ops import int8_linalg as M
    if M._HOST[M.K.PATH_AMX_ROWS] is not None:
        pytest.skip(M._HOST[M.K.PATH_AMX_ROWS])
    g = rng()
    for k, n in ((70, 33), (1100, 1000)):
        assert (k * n > M.rows_serial_max()) == (k == 1100)
        a = make_a(g, (1, k), a_dtype, "row")
        b = make_b(g, (k, n), "col", zp=True)
        bias = g.standard_normal(n).astype(np.float32)
        got = _call("cpu-amx", dispatch.matmul_int8, a, b, bias=bias, activation="relu")
        want = np.maximum(ref.matmul_int8(a, b) + bias.astype(np.float64), 0)
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-6, err_msg=f"1x{k}x{n}")
        assert_one_rounding(_call("cpu-amx", dispatch.matmul_int8, a, b), ref.matmul_int8(a, b), f"1x{k}x{n}")
        x = g.standard_normal((1, k)).astype(np.float32)
        w = make_b(g, (n, k), "col", zp=False, axis=0)
        with dispatch.use(dynamic_quant_linear="cpu-vnni512"):
            want = dispatch.dynamic_quant_linear(x, w)
        np.testing.assert_array_equal(_call("cpu-amx", dispatch.dynamic_quant_linear, x, w), want)


@pytest.mark.skipif(ON_CUDA, reason="the CPU packer of A")
@pytest.mark.parametrize("wide", [False, True], ids=["uint8", "int16"])
@pytest.mark.parametrize("a_dtype", [np.int8, np.uint8])
def test_pack_a_rows_and_sums(a_dtype, wide):
    """kernels_cpu.int8_gemm.pack_a from integer A: each packed row is a + 128 (int8 a) or a
    (uint8) and zero padding, c = shift + za, rs = sum_k (a - za) exactly, for K below, at
    and past the 64-byte AMX word, full-range values included, on one and on two workers,
    into uint8 (AMX, VNNI) and int16 (AVX2) layouts."""
    from kernels_cpu import int8_gemm as K
    g = rng()
    info = np.iinfo(a_dtype)
    shift = 128 if a_dtype == np.int8 else 0
    for k in (1, 63, 64, 65, 130, 768):
        m = 19
        a = g.integers(info.min, info.max, (m, k), endpoint=True).astype(a_dtype)
        a[0] = info.max
        a[1] = info.min
        za = g.integers(-3, 4, m).astype(np.float64)
        kp = -(-k // 64) * 64
        for nworkers in (1, 2):
            dst = np.full((32, kp), 7, np.int16 if wide else np.uint8)
            c, rs = np.full(m, np.nan), np.full(m, np.nan)
            K.pack_a(a, dst, c, rs, za=za, nworkers=nworkers)
            want = a.astype(np.int64) + shift
            np.testing.assert_array_equal(dst[:m, :k], want, err_msg=f"K={k}")
            assert not dst[:m, k:].any() and not dst[m:].any(), f"K={k}: padding not zero"
            np.testing.assert_array_equal(c, shift + za)
            np.testing.assert_array_equal(rs, (a.astype(np.int64) - za[:, None]).sum(axis=1), err_msg=f"K={k}")


@pytest.mark.skipif(ON_CUDA, reason="the CPU GEMM worker")
@pytest.mark.parametrize("quant", [False, True], ids=["int8-rows", "float32-rows"])
def test_gemm_packs_its_tasks_rows(quant):
    """kernels_cpu.int8_gemm.gemm with pack= (each task packs the A rows of its own row
    panels) gives the bits of pack_a then gemm, and the same packed A, c, rs (and sa for
    float32 rows), on every packed path this host runs, its one-row form included: one and
    two workers, one row panel per task and all in one, rows not a multiple of the tile
    (the padding rows zeroed by their task), poisoned scratch; and refuses a split of the
    columns (a row panel in two tasks)."""
    from kernels_cpu import int8_gemm as K
    from dispatch.ops import int8_linalg as M
    g = rng()
    for path, why in K.host_paths().items():
        if why is not None or path == K.PATH_PORTABLE or path in K.ROWS_OF.values():
            continue
        for kpath, m in ((path, 19), (K.ROWS_OF.get(path), 1)):
            if kpath is None:
                continue
            k, n = 70, 50
            mr, nr, kg = K.TILES[kpath]
            kq = K.k_words(k, path)
            mp, npn = -(-m // mr), -(-n // nr)
            et = np.int16 if path == K.PATH_AVX2 else np.uint8
            w = make_b(g, (k, n), "col")
            pw = M._packed_weight(w, False, path)
            if quant:
                src = g.standard_normal((m, k)).astype(np.float32)
            else:
                a = make_a(g, (m, k))
                src = np.asarray(a.values)
                sa0, za = M._row_params(a, m, m, np.empty(m), np.empty(m))
            bias = g.standard_normal(n).astype(np.float32)
            for nworkers, mc in ((1, mp), (2, 1)):
                got = {}
                for fused in (False, True):
                    dst = np.full((mp * mr, kq * kg), 7, et)
                    c, rs = np.full(m, np.nan), np.full(m, np.nan)
                    sa = np.full(m, np.nan) if quant else sa0
                    pa = K.a_params(src, dst, c, rs, za=None if quant else za, sa=sa if quant else None)
                    if not fused:
                        K.run_pack_a(pa, dst, nworkers)
                    out = np.full((m, n), np.nan, np.float32)
                    K.gemm(kpath, 0, dst.reshape(-1).view(np.int32), pw.bp, sa, c, rs, pw.sb, pw.colsum, pw.zb,
                           bias, out, mc, npn, -(-mp // mc), kq, nworkers=nworkers, pack=pa if fused else None)
                    got[fused] = (out, dst, c, rs, sa)
                    assert not np.isnan(out).any(), f"path {kpath}: rows left unwritten"
                for x, y in zip(got[False], got[True]):
                    np.testing.assert_array_equal(x, y, err_msg=f"path {kpath}, {nworkers} workers, mc {mc}")
            if npn > 1:
                with pytest.raises(ValueError, match="one column block"):
                    K.gemm(kpath, 0, dst.reshape(-1).view(np.int32), pw.bp, sa, c, rs, pw.sb, pw.colsum, pw.zb,
                           bias, out, mp, 1, npn, kq, pack=pa)
