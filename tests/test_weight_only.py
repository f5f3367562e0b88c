"""linear with a low-precision weight (float16, bfloat16, int8 QuantizedArray per channel or
per tensor; dispatch/ops/weight_only.py) against the float64 linear on the dequantized
weight, every weight-only implementation forced: decode and prefill row counts, K not a
multiple of any vector width, N below a tile, batched / 1-D x, views and read-only inputs,
bias and every activation, NaN-poisoned out=, NaN propagation, both vector widths of the
CPU GEMV, bad input, and the rule."""
import ml_dtypes
import numpy as np
import pytest

import dispatch
from dispatch.quantized import QuantizedArray
from tests.reference import weight_only as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, assert_close, assert_half_close, concurrent_mismatches, impl_params,
                           poisoned, product_scale, randn, read_only, reduction_tol, rng, run, strided, to_target)

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]
FORMATS = ["float16", "bfloat16", "int8-channel", "int8-tensor", "int8-asym"]
# cpu-wo-amx takes bfloat16 weights only (on AMX hosts): its own tests below
WO_IMPLS = [p for p in impl_params("linear") if p.values[0] is None or ("-wo-" in p.values[0]
                                                                          and p.values[0] != "cpu-wo-amx")]

# (x shape, weight shape (N, K))
SHAPES_FULL = [
    ((1, 64), (100, 64)),           # decode
    ((2, 17), (3, 17)),             # K = 17: no full 16-lane vector + tail
    ((7, 1), (1, 1)),               # K = 1, N = 1
    ((1, 4095), (3, 4095)),         # long K, odd
    ((1, 40), (1000, 40)),          # one row of x: 8 tasks of 125 weight rows
    ((33, 130), (70, 130)),         # x rows past the tile's group of 4
    ((128, 48), (300, 48)),         # prefill: N past one widened block (256 rows)
    ((5, 3, 33), (17, 33)),         # batched x
    ((65,), (9, 65)),               # 1-D x
]
SHAPES_SMALL = [((1, 24), (5, 24)), ((2, 3, 9), (3, 9)), ((3, 1), (2, 1)), ((10, 8), (3, 8))]  # 10 rows: 2 groups of 8
SHAPES = SHAPES_SMALL if SMALL_SHAPES else SHAPES_FULL
EPI = ((2, 11), (3, 11)) if SMALL_SHAPES else ((7, 45), (37, 45))


def make_weight(g, shape, fmt):
    """A low-precision (N, K) weight of format fmt drawn from g (host arrays)."""
    w = randn(g, shape, np.float32) / np.float32(np.sqrt(shape[1]))
    if fmt == "float16":
        return w.astype(np.float16)
    if fmt == "bfloat16":
        return w.astype(ml_dtypes.bfloat16)
    if fmt == "int8-tensor":
        sc = np.float32(np.abs(w).max() / 127 or 1)
        return QuantizedArray(np.round(w / sc).astype(np.int8), sc)
    sc = (np.maximum(np.abs(w).max(axis=1), 1e-6) / 127).astype(np.float32)
    q = np.round(w / sc[:, None])
    if fmt == "int8-asym":
        zp = g.integers(-20, 21, shape[0]).astype(np.int8)
        return QuantizedArray(np.clip(q + zp[:, None], -128, 127).astype(np.int8), sc, zp, axis=0)
    return QuantizedArray(q.astype(np.int8), sc, axis=0)


def on_target(w):
    """The weight on the test's device: a QuantizedArray's values moved, its scales kept."""
    if isinstance(w, QuantizedArray):
        return QuantizedArray(to_target(w.values), w.scale, w.zero_point, w.axis) if ON_CUDA else w
    return to_target(w)


def _tol(k):
    # the weight's values are exact in float32; only the float32 accumulation differs
    return reduction_tol(np.float32, k)


def _scale(x, w, bias):
    """assert_close's scale for act(x @ w.T + bias) (support.product_scale): with an
    activation after it, every output can be a product that cancelled to near 0, where
    max|ref| alone cannot bound the terms' float32 rounding.  NK_TEST_SEED=912736210 on
    test_epilogues[cuda-wo-gemv-relu-bias] (simulator, (2, 11) x (3, 11)): relu left
    max|ref| = 1.3e-3, and an output off by 8e-8 (6e-5 of it) failed."""
    return product_scale(x, ref.dequantize(w), bias, transpose_b=True)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("sx, sw", SHAPES, ids=str)
@pytest.mark.parametrize("impl", WO_IMPLS)
def test_matches_reference(impl, sx, sw, fmt):
    g = rng()
    x, bias = randn(g, sx, np.float32), randn(g, sw[:1], np.float32)
    w = make_weight(g, sw, fmt)
    shape = sx[:-1] + sw[:1]
    got = run(impl, dispatch.linear, x, on_target(w), bias, activation="silu", out=poisoned(shape, np.float32))
    assert_close(got, ref.linear(x, w, bias, activation="silu"), _tol(sx[-1]), f"{fmt} linear", cancel=True,
                 scale=_scale(x, w, bias))
    got = run(impl, dispatch.linear, x, on_target(w))
    assert_close(got, ref.linear(x, w), _tol(sx[-1]), f"{fmt} linear no epilogue", cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="the CPU GEMV's vector widths")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 9])
@pytest.mark.parametrize("lanes", [8, 16])
def test_cpu_gemv_both_widths(lanes, m, fmt):
    """The 8-lane (AVX2) path runs here too, forced, with every x-row group size."""
    from kernels_cpu import weight_only as KW

    if lanes == 16 and not KW.host_has_avx512():
        pytest.skip("no avx512f on this host")
    g = rng()
    k, n = 45, 13
    x, bias = randn(g, (m, k), np.float32), randn(g, (n,), np.float32)
    w = make_weight(g, (n, k), fmt)
    prev = KW.use_lanes(lanes)
    try:
        got = run("cpu-wo-gemv", dispatch.linear, x, w, bias, activation="gelu_tanh")
    finally:
        KW.use_lanes(prev)
    assert_close(got, ref.linear(x, w, bias, activation="gelu_tanh"), _tol(k), f"{fmt} {lanes} lanes", cancel=True,
                 scale=_scale(x, w, bias))


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("impl", WO_IMPLS)
def test_epilogues(impl, activation, with_bias):
    g = rng()
    sx, sw = EPI
    x = randn(g, sx, np.float32)
    bias = randn(g, sw[:1], np.float32) if with_bias else None
    for fmt in ("bfloat16", "int8-channel"):
        w = make_weight(g, sw, fmt)
        got = run(impl, dispatch.linear, x, on_target(w), bias, activation=activation,
                  out=poisoned(sx[:-1] + sw[:1], np.float32))
        assert_close(got, ref.linear(x, w, bias, activation=activation), _tol(sx[-1]), f"{fmt} {activation}",
                     cancel=True, scale=_scale(x, w, bias))


@pytest.mark.skipif(ON_CUDA, reason="host views (device arrays are made contiguous by to_target)")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("impl", WO_IMPLS)
def test_views_and_read_only(impl, fmt):
    g = rng()
    x, bias = randn(g, (3, 40), np.float32), randn(g, (21,), np.float32)
    w = make_weight(g, (21, 40), fmt)
    want = ref.linear(x, w, bias)

    def rebuilt(values_fn):
        if isinstance(w, QuantizedArray):
            return QuantizedArray(values_fn(w.values), w.scale, w.zero_point, w.axis)
        return values_fn(w)

    def every_other(a):  # strided() for any dtype (it fills the gaps with NaN)
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        return big[..., ::2]

    for what, xv, wv in [("strided x and weight", strided(x), rebuilt(every_other)),
                         ("read-only x and weight", read_only(x), rebuilt(read_only)),
                         ("transposed weight view", x, rebuilt(lambda a: np.ascontiguousarray(a.T).T))]:
        got = run(impl, dispatch.linear, xv, wv, bias)
        assert_close(got, want, _tol(40), f"{fmt} {what}", cancel=True)
    out = np.full((7, 3, 21), np.nan, np.float32)[2]  # a C-contiguous slice of a bigger buffer
    got = run(impl, dispatch.linear, x, w, bias, out=out)
    assert got is out
    assert_close(out, want, _tol(40), f"{fmt} out=", cancel=True)
    tout = np.full((21, 3), np.nan, np.float32).T  # a non-contiguous out=
    got = run(impl, dispatch.linear, x, w, bias, out=tout)
    assert got is tout
    assert_close(tout, want, _tol(40), f"{fmt} non-contiguous out=", cancel=True)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "int8-asym"])
@pytest.mark.parametrize("impl", WO_IMPLS)
def test_nan_in_x_propagates(impl, fmt):
    g = rng()
    m, k, n = (2, 9, 3) if SMALL_SHAPES else (5, 37, 20)
    x = randn(g, (m, k), np.float32)
    x[1, k // 2] = np.nan
    w = make_weight(g, (n, k), fmt)
    got = run(impl, dispatch.linear, x, on_target(w))
    assert np.isnan(got[1]).all(), got[1]
    keep = np.arange(m) != 1
    assert np.isfinite(got[keep]).all()
    assert_close(got[keep], ref.linear(x[keep], w), _tol(k), f"{fmt} other rows", cancel=True)


def _bad_cases():
    g = np.random.default_rng(0)
    x = g.standard_normal((2, 8)).astype(np.float32)
    w = g.standard_normal((3, 8)).astype(np.float32)
    q8 = np.round(w * 20).astype(np.int8)
    sc = np.full(3, 0.05, np.float32)
    return [
        ("uint16 weight", (x, w.astype(ml_dtypes.bfloat16).view(np.uint16)), {}, TypeError,
         r"bits.view\(ml_dtypes.bfloat16\)"),
        ("int8 ndarray weight", (x, q8), {}, TypeError, "QuantizedArray"),
        ("uint8 ndarray weight", (x, q8.view(np.uint8)), {}, TypeError, "QuantizedArray"),
        ("per-channel along axis 1", (x, QuantizedArray(q8, np.full(8, 0.05, np.float32), axis=1)), {}, ValueError,
         "axis=0"),
        ("uint8 QuantizedArray", (x, QuantizedArray(q8.view(np.uint8), sc, axis=0)), {}, TypeError, "int8 values"),
        ("wrong K", (x[:, :7], w.astype(np.float16)), {}, ValueError, "K=7"),
        ("wrong K int8", (x[:, :7], QuantizedArray(q8, sc, axis=0)), {}, ValueError, "K=7"),
        ("float64 x", (x.astype(np.float64), w.astype(ml_dtypes.bfloat16)), {}, TypeError, "cast x to float32"),
        ("float64 bias", (x, w.astype(np.float16), np.zeros(3)), {}, TypeError, "bias"),
        ("bias shape", (x, w.astype(np.float16), np.zeros(4, np.float32)), {}, ValueError,
         r"bias must have shape \(3,\)"),
        ("weight rank", (x, w.astype(np.float16).reshape(3, 8, 1)), {}, ValueError, "weight must have 2 dimensions"),
        ("activation", (x, w.astype(np.float16)), {"activation": "tanh"}, ValueError, "activation"),
        ("out dtype", (x, w.astype(np.float16)), {"out": np.zeros((2, 3))}, TypeError, "out"),
        ("out shape", (x, w.astype(np.float16)), {"out": np.zeros((2, 4), np.float32)}, ValueError, "out"),
    ]


@pytest.mark.skipif(ON_CUDA, reason="validation is device-independent (host inputs)")
@pytest.mark.parametrize("what, args, kwargs, err, match", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input(what, args, kwargs, err, match):
    out = kwargs.get("out")
    if out is not None:
        out[...] = 7
    with pytest.raises(err, match=match):
        dispatch.linear(*args, **kwargs)
    if out is not None:
        assert (out == 7).all(), "out= written before the error"


@pytest.mark.skipif(ON_CUDA, reason="host-side checks")
def test_prepack_refuses_int8():
    """An int8 QuantizedArray weight is not prepacked (the kernels read it in place); 16-bit
    weights are (below, and tests/test_half_matmul.py)."""
    for op in ("linear", "matmul"):
        with pytest.raises(TypeError, match="low-precision weight"):
            dispatch.prepack(QuantizedArray(np.ones((3, 4), np.int8), np.float32(1)), op=op)


@pytest.mark.skipif(ON_CUDA, reason="PackedWeight: host weights")
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("x_half", [False, True], ids=["float32-x", "16-bit-x"])
@pytest.mark.parametrize("impl", [p for p in impl_params("linear") if p.values[0] is None or p.values[0].startswith("cpu-")
                                  and p.values[0] not in ("cpu-gemm", "cpu-gemv")])
def test_prepacked_16_bit_weight(impl, fmt, x_half):
    """prepack(weight) of a float16 / bfloat16 linear weight: the float32 panels of its
    widened values, which cpu-wo-gemm reads in place of widening the weight (bits the same
    as the unpacked call's: same tile, same sums); the other kernels read the 16-bit source.
    Zeroing the source after packing leaves cpu-wo-gemm's result as it was (it reads the
    panels) and changes the GEMV's (it reads the source)."""
    from kernels_cpu import bf16_gemm as KB
    g = rng()
    w = make_weight(g, (70, 130), fmt)   # K even (vdpbf16ps), not a multiple of a vector
    xdt = w.dtype if x_half else np.float32
    if impl in ("cpu-bf16-dot", "cpu-bf16-amx") and not (x_half and fmt == "bfloat16"):
        pytest.skip(f"{impl} takes bfloat16 x with a bfloat16 weight")
    if impl == "cpu-wo-amx" and (x_half or fmt != "bfloat16"):
        pytest.skip("cpu-wo-amx takes float32 x with a bfloat16 weight")
    why = {"cpu-bf16-dot": KB.host_refusal(), "cpu-bf16-amx": KB.amx_refusal(), "cpu-wo-amx": KB.amx_refusal()}.get(impl)
    if why is not None:
        pytest.skip(f"{impl}: {why}")
    x = randn(g, (40, 130), np.float32).astype(xdt)
    b = randn(g, (70,), np.float32).astype(xdt)
    pw = dispatch.prepack(w)
    assert pw.dtype == w.dtype and pw.panels.dtype == np.float32, pw
    want = run(impl, dispatch.linear, x, w, b, activation="silu")
    got = run(impl, dispatch.linear, x, pw, b, activation="silu")
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    text = str(dispatch.explain("linear", x, pw, b))
    assert "prepacked=True" in text, text
    if impl in ("cpu-wo-gemm", "cpu-wo-gemv"):
        w[...] = 0
        after = run(impl, dispatch.linear, x, pw, b, activation="silu")
        assert np.array_equal(np.asarray(after, np.float32), np.asarray(want, np.float32)) == (impl == "cpu-wo-gemm")


@pytest.mark.skipif(ON_CUDA, reason="the CPU rule")
def test_prepacked_16_bit_rule_and_checks():
    """A prepacked 16-bit weight runs the GEMV on its source below WO_GEMV_ROWS_PACKED rows of
    x and the GEMM on its panels from there; a PackedWeight of another dtype than x's 16-bit
    one, float64 x, or a wrong K are refused naming the argument, out= untouched."""
    from dispatch.ops.weight_only import WO_GEMV_ROWS_PACKED as ROWS
    g = rng()
    w = make_weight(g, (64, 32), "float16")
    pw = dispatch.prepack(w)
    few = dispatch.explain("linear", np.ones((ROWS // 2, 32), np.float32), pw)
    many = dispatch.explain("linear", np.ones((ROWS, 32), np.float32), pw)
    assert few.chosen == "cpu-wo-gemv" and many.chosen == "cpu-wo-gemm", (few, many)
    assert "(prepacked)" in str(many), many
    out = np.full((3, 64), 7, np.float32)
    with pytest.raises(TypeError, match="x must be float32"):
        dispatch.linear(np.ones((3, 32), np.float64), pw, out=out)
    with pytest.raises(TypeError, match="x must be float32"):
        dispatch.linear(np.ones((3, 32), ml_dtypes.bfloat16), pw, out=np.full((3, 64), 7, ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match="weight must have K=31 columns"):
        dispatch.linear(np.ones((3, 31), np.float32), pw, out=out)
    with pytest.raises(TypeError, match="op='linear'; matmul needs"):
        dispatch.matmul(np.ones((3, 64), np.float32), pw)
    assert (out == 7).all(), "out= written before the error"


@pytest.mark.skipif(ON_CUDA, reason="the CPU rule")
def test_rule_and_refusals():
    g = np.random.default_rng(1)
    w = make_weight(g, (64, 32), "bfloat16")
    one = str(dispatch.explain("linear", np.ones((1, 32), np.float32), w))
    assert "chosen: cpu-wo-gemv" in one and "weight_format=2" in one, one
    assert "cpu-gemm: refused: weight is bfloat16" in one, one
    many = str(dispatch.explain("linear", np.ones((600, 32), np.float32), make_weight(g, (64, 32), "int8-channel")))
    assert "chosen: cpu-wo-gemm" in many, many
    dense = str(dispatch.explain("linear", np.ones((1, 32), np.float32), np.ones((64, 32), np.float32)))
    assert "cpu-wo-gemv: refused: weight is dense" in dense, dense
    assert "weight_format=0" in dense


@pytest.mark.skipif(ON_CUDA, reason="CPU threads")
@pytest.mark.parametrize("impl", [p for p in WO_IMPLS if p.values[0] is not None])
def test_threads_give_single_thread_results(impl):
    """4 Python threads calling at once (the kernels release the GIL; the GEMM path's panel
    buffers are per thread) give bitwise the single-threaded results."""
    g = np.random.default_rng(5)
    cases = []
    for i, fmt in enumerate(["float16", "bfloat16", "int8-channel", "int8-asym"]):
        m, k, n = [(1, 300, 70), (3, 129, 300), (40, 64, 513), (9, 33, 17)][i]
        cases.append((g.standard_normal((m, k)).astype(np.float32), make_weight(g, (n, k), fmt),
                      g.standard_normal(n).astype(np.float32)))
    x, w, b = cases[2]
    cases.append((x, dispatch.prepack(make_weight(g, w.shape, "float16")), b))   # its panels shared by the threads
    def call(c):
        with dispatch.use(linear=impl):
            return dispatch.linear(*c, activation="gelu")

    bad = concurrent_mismatches(call, cases)
    assert not bad, f"threads {bad} differ from their single-threaded results"


@pytest.mark.skipif(ON_CUDA, reason="accuracy against the float32 op, host side")
def test_accuracy_against_float32_linear():
    """The cost of storing the weight in low precision (not a kernel error): bfloat16 keeps
    8 bits of mantissa, float16 11, int8 per channel about 7 per row's range.  Normal
    weights: normwise error vs the float32 linear well under these bounds; one large
    outlier per row ruins the per-channel int8 scale of its row only (shown, not hidden)."""
    g = np.random.default_rng(3)
    x = g.standard_normal((4, 512)).astype(np.float32)
    w = g.standard_normal((64, 512)).astype(np.float32) / np.float32(np.sqrt(512))
    def err(wq, wf):
        fp32 = x.astype(np.float64) @ wf.T.astype(np.float64)
        return float(np.abs(dispatch.linear(x, wq) - fp32).max() / np.abs(fp32).max())

    def int8(wf):
        sc = np.abs(wf).max(axis=1) / 127
        return QuantizedArray(np.round(wf / sc[:, None]).astype(np.int8), sc.astype(np.float32), axis=0)

    assert err(w.astype(np.float16), w) < 2e-3
    assert err(w.astype(ml_dtypes.bfloat16), w) < 1e-2
    normal = err(int8(w), w)
    assert normal < 2e-2
    wo = w.copy()
    wo[np.arange(64), g.integers(0, 512, 64)] *= 50   # one outlier per row
    assert err(int8(wo), wo) > 3 * normal
    assert err(wo.astype(ml_dtypes.bfloat16), wo) < 1e-2  # bfloat16's exponent takes outliers in stride


@pytest.mark.skipif(not ON_CUDA, reason="float16 x on CUDA (test_cpu_float16_x_and_weight: the CPU)")
@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_float16_x(fmt):
    """float16 x (and bias, out) with a low-precision weight: float32 accumulation, the result
    rounded once to float16; a float16 weight with float16 x stays the dense op."""
    g = rng()
    x, bias = randn(g, (3, 20), np.float16), randn(g, (4,), np.float16)
    w = make_weight(g, (4, 20), fmt)
    if fmt == "float16":
        text = str(dispatch.explain("linear", to_target(x), to_target(w)))
        assert "weight_format=0" in text and "cuda-wo-gemv: refused: weight is dense" in text, text
    else:
        got = run("cuda-wo-gemv", dispatch.linear, x, on_target(w), bias, activation="relu")
        assert got.dtype == np.float16
        assert_close(got, ref.linear(x, w, bias, activation="relu"), 2e-3, f"{fmt} float16 x", cancel=True,
                     scale=_scale(x, w, bias))
        text = str(dispatch.explain("linear", to_target(x), on_target(w)))
        assert "chosen: cuda-wo-gemv" in text and "cuda-gemv: refused" in text, text


@pytest.mark.skipif(ON_CUDA, reason="float16 x with a float16 weight is CUDA's dense op; the CPU widens x")
@pytest.mark.parametrize("sx, sw", SHAPES, ids=str)
@pytest.mark.parametrize("impl", WO_IMPLS)
def test_cpu_float16_x_and_weight(impl, sx, sw):
    """float16 x, weight and bias on the CPU (PyTorch's float16 linear): x widened to float32,
    the float16 weight read by the weight-only kernels, bias and activation in float32, the
    result rounded once to float16; a strided x, out=; the other 16-bit format refused."""
    g = rng()
    x, bias = randn(g, sx, np.float16), randn(g, sw[:1], np.float16)
    w = randn(g, sw, np.float16)
    shape = sx[:-1] + sw[:1]
    out = poisoned(shape, np.float16)
    got = run(impl, dispatch.linear, x, w, bias, activation="gelu", out=out)
    assert got is out
    slack = _tol(sx[-1]) * _scale(x, w, bias)
    assert_half_close(got, ref.linear(x, w, bias, activation="gelu"), slack, f"{impl} float16 linear")
    xs = strided(x) if x.ndim == 2 else x
    assert_half_close(run(impl, dispatch.linear, xs, w), ref.linear(x, w), _tol(sx[-1]) * _scale(x, w, None),
                      f"{impl} float16 linear, strided x")
    with pytest.raises(TypeError, match="x must be float32 .*bfloat16 / float16 too with a weight of that dtype"):
        dispatch.linear(x, w.astype(ml_dtypes.bfloat16), out=out)


@pytest.mark.parametrize("fmt", ["bfloat16", "int8-channel"])
@pytest.mark.parametrize("impl", WO_IMPLS)
def test_empty_and_zero_k(impl, fmt):
    """K = 0: act(bias) (an empty sum); M = 0 or N = 0: an empty result."""
    g = rng()
    bias = randn(g, (3,), np.float32)
    w0 = np.zeros((3, 0), ml_dtypes.bfloat16) if fmt == "bfloat16" else QuantizedArray(
        np.zeros((3, 0), np.int8), np.full(3, 0.5, np.float32), axis=0)
    got = run(impl, dispatch.linear, np.zeros((2, 0), np.float32), on_target(w0), bias, activation="relu",
              out=poisoned((2, 3), np.float32))
    np.testing.assert_array_equal(got, np.broadcast_to(np.maximum(bias, 0), (2, 3)))
    w = make_weight(g, (3, 5), fmt)
    assert run(impl, dispatch.linear, np.zeros((0, 5), np.float32), on_target(w)).shape == (0, 3)
    wn = np.zeros((0, 5), ml_dtypes.bfloat16) if fmt == "bfloat16" else QuantizedArray(
        np.zeros((0, 5), np.int8), np.zeros(0, np.float32), axis=0)
    assert run(impl, dispatch.linear, np.ones((2, 5), np.float32), on_target(wn)).shape == (2, 0)


@pytest.mark.skipif(ON_CUDA, reason="the CPU GEMM path's packers")
@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_gemm_path_widens_in_its_tasks(fmt, monkeypatch):
    """cpu-wo-gemm is one GEMM whose tasks widen the weight's panels themselves: its B is the
    weight as stored (16-bit patterns, or int8 values with the scale and zero point's
    addresses in two extra slots for pack_bq8), never a float32 copy; N past whole panels,
    an odd K, bias and activation, into a NaN-poisoned out=."""
    from kernels_cpu import gemm as K
    real, seen = K.gemm_launch, []

    def launch(args, a3, ap, b3, bp, out3, ai, bi, bias, extra=()):
        seen.append((b3.dtype, len(extra)))
        return real(args, a3, ap, b3, bp, out3, ai, bi, bias, extra)

    monkeypatch.setattr(K, "gemm_launch", launch)
    g = rng()
    x, bias = randn(g, (20, 37), np.float32), randn(g, (150,), np.float32)
    w = make_weight(g, (150, 37), fmt)
    got = run("cpu-wo-gemm", dispatch.linear, x, w, bias, activation="gelu", out=poisoned((20, 150), np.float32))
    assert_close(got, ref.linear(x, w, bias, activation="gelu"), _tol(37), f"{fmt} in the tasks", cancel=True,
                 scale=_scale(x, w, bias))
    int8 = fmt.startswith("int8")
    assert seen == [(np.dtype(np.int8), 2) if int8 else (np.dtype(np.uint16), 0)], seen


# ---- cpu-wo-amx: float32 x split into three bfloat16 parts on AMX tiles -----------------------

def _amx_refusal():
    from kernels_cpu import bf16_gemm as KB
    return KB.amx_refusal()


needs_amx = pytest.mark.skipif(ON_CUDA or _amx_refusal() is not None,
                               reason=f"cpu-wo-amx needs AMX-BF16 on the CPU: {_amx_refusal()}")
# even K (the tiles multiply pairs of K): decode, rows past a tile group, N past a task, batched
AMX_SHAPES = ([((1, 24), (5, 24)), ((2, 3, 10), (3, 10)), ((10, 8), (3, 8))] if SMALL_SHAPES else
              [((1, 64), (100, 64)), ((33, 130), (70, 130)), ((128, 48), (300, 48)), ((5, 3, 34), (17, 34)),
               ((70, 4096), (40, 4096)), ((64,), (9, 64))])


@needs_amx
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("sx, sw", AMX_SHAPES, ids=str)
def test_wo_amx_matches_reference(sx, sw, activation):
    """x split into hi + mid + lo (exactly x) on the tiles: within the float32 GEMM's bound of
    the float64 product, with and without bias, every activation, into a NaN-poisoned out=;
    a strided and a read-only x."""
    g = rng()
    x, bias = randn(g, sx, np.float32), randn(g, sw[:1], np.float32)
    w = make_weight(g, sw, "bfloat16")
    shape = sx[:-1] + sw[:1]
    out = poisoned(shape, np.float32)
    got = run("cpu-wo-amx", dispatch.linear, x, w, bias, activation=activation, out=out)
    assert got is out
    assert_close(got, ref.linear(x, w, bias, activation=activation), _tol(sx[-1]), f"cpu-wo-amx {activation}",
                 cancel=True, scale=_scale(x, w, bias))
    assert_close(run("cpu-wo-amx", dispatch.linear, x, w), ref.linear(x, w), _tol(sx[-1]), "no bias", cancel=True)
    if x.ndim == 2:
        xs = strided(x)
        assert_close(run("cpu-wo-amx", dispatch.linear, xs, read_only(w)), ref.linear(x, w), _tol(sx[-1]),
                     "strided x, read-only w", cancel=True)


@needs_amx
def test_wo_amx_keeps_float32_precision():
    """Against the float32 weight path on the same (bfloat16-exact) weight: the split loses
    nothing a bfloat16-rounded x would (its error is 2^-9 relative, this one float32's)."""
    g = rng()
    x = randn(g, (48, 1024), np.float32) * np.float32(3)
    w = make_weight(g, (96, 1024), "bfloat16")
    want = ref.linear(x, w)
    got = run("cpu-wo-amx", dispatch.linear, x, w)
    err = np.abs(got - want).max() / np.abs(want).max()
    rounded = x.astype(ml_dtypes.bfloat16).astype(np.float32) @ w.astype(np.float32).T
    err_bf16_x = np.abs(rounded - want).max() / np.abs(want).max()
    assert err < 1e-6 < err_bf16_x, (err, err_bf16_x)


@needs_amx
def test_wo_amx_nan_inf_and_edges():
    """NaN in a row gives NaN in that row only (also a NaN with its payload in the low bits,
    which truncation to bfloat16 would make an infinity); an infinity gives the infinite
    product (not inf - inf); zeros; K = 0 gives act(bias); M = 0 and N = 0 empty results."""
    g = rng()
    x = randn(g, (5, 40), np.float32)
    w = make_weight(g, (20, 40), "bfloat16")
    x[1, 7] = np.nan
    x[1, 9] = np.array(0x7F800001, np.uint32).view(np.float32)   # a NaN whose payload is in the low 16 bits
    x[2, 3] = np.array(0xFF800003, np.uint32).view(np.float32)
    x[3, :] = 0
    x[3, 5] = np.inf
    got = run("cpu-wo-amx", dispatch.linear, x, w)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all(), got[1:3]
    wf = w.astype(np.float32)
    np.testing.assert_array_equal(got[3], np.where(wf[:, 5] > 0, np.inf, np.where(wf[:, 5] < 0, -np.inf, np.nan)))
    keep = [0, 4]
    assert_close(got[keep], ref.linear(x[keep], w), _tol(40), "other rows", cancel=True)
    bias = randn(g, (3,), np.float32)
    got = run("cpu-wo-amx", dispatch.linear, np.zeros((2, 0), np.float32), np.zeros((3, 0), ml_dtypes.bfloat16), bias,
              activation="relu", out=poisoned((2, 3), np.float32))
    np.testing.assert_array_equal(got, np.broadcast_to(np.maximum(bias, 0), (2, 3)))
    assert run("cpu-wo-amx", dispatch.linear, np.zeros((0, 6), np.float32), w[:, :6].copy()).shape == (0, 20)
    assert run("cpu-wo-amx", dispatch.linear, np.ones((2, 6), np.float32),
               np.zeros((0, 6), ml_dtypes.bfloat16)).shape == (2, 0)


@needs_amx
def test_wo_amx_threads_and_rule():
    """4 Python threads at once give the single-threaded bits; the rule picks it from
    WO_AMX_MIN_ROWS rows of a float32 x with a bfloat16 weight of even K, and refuses the
    other formats and odd K."""
    from dispatch.ops import weight_only as W
    g = np.random.default_rng(5)
    cases = [(g.standard_normal((m, k)).astype(np.float32), make_weight(g, (n, k), "bfloat16"),
              g.standard_normal(n).astype(np.float32)) for m, k, n in [(9, 64, 70), (40, 130, 300), (3, 32, 17)]]

    def call(c):
        with dispatch.use(linear="cpu-wo-amx"):
            return dispatch.linear(*c, activation="gelu")

    assert not concurrent_mismatches(call, cases)
    w = make_weight(g, (64, 32), "bfloat16")
    many = str(dispatch.explain("linear", np.ones((W.WO_AMX_MIN_ROWS, 32), np.float32), w))
    assert "chosen: cpu-wo-amx" in many, many
    odd = str(dispatch.explain("linear", np.ones((64, 33), np.float32), make_weight(g, (64, 33), "bfloat16")))
    assert "cpu-wo-amx: refused: K is odd" in odd, odd
    f16 = str(dispatch.explain("linear", np.ones((64, 32), np.float32), make_weight(g, (64, 32), "float16")))
    assert "cpu-wo-amx: refused: weight is float16" in f16, f16
