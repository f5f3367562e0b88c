"""conv2d of bfloat16 / float16 x, weight and bias (PyTorch's 16-bit conv2d; CPU), each test
once per format (the `half` fixture): widened to float32, the float32 kernels, the result
rounded once to x's dtype.  Every CPU implementation that takes a geometry is forced and
compared with the float64 convolution of the same 16-bit values: dense / grouped /
depthwise, strides, dilation, padding, 1x1 and 7x7, unbatched x, every activation, a strided
x, NaN-poisoned and non-contiguous out=, threads, and bad input that changes nothing."""
import numpy as np
import pytest

import dispatch
from tests.reference import conv as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, as_half, assert_half_close, concurrent_mismatches, impl_params,
                           need_half_format,
                           half_dtype, other_half, poisoned, randn, reduction_tol, rng, run, strided)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 / float16 x is a CPU input here (float16 on CUDA: "
                                "test_conv)")

# (x shape, weight shape, keyword arguments)
GEOMETRIES = [
    ((1, 3, 7, 7), (5, 3, 3, 3), dict(padding=1)),                       # Winograd takes it
    ((3, 4, 6, 5), (6, 2, 3, 3), dict(stride=2, groups=2)),
    ((1, 4, 7, 6), (4, 1, 3, 3), dict(padding=1, groups=4, dilation=(2, 1))),   # depthwise
    ((2, 3, 5, 5), (6, 3, 1, 1), dict()),
] + ([] if SMALL_SHAPES else [
    ((1, 3, 23, 21), (10, 3, 7, 7), dict(stride=2, padding=3)),
    ((1, 20, 9, 9), (33, 20, 1, 1), dict()),
    ((2, 16, 12, 13), (24, 16, 3, 3), dict(padding=1)),                 # Winograd, several tiles
    ((1, 8, 10, 9), (8, 1, 3, 3), dict(padding="same", groups=8)),     # depthwise
])


def _supports(impl, wshape, kw):
    groups = kw.get("groups", 1)
    depthwise = groups > 1 and wshape[1] == 1
    if impl == "cpu-bf16-amx":   # dense only
        return groups == 1
    if impl == "cpu-bf16-dot":   # dense only
        return groups == 1
    if "winograd" in impl:
        return (groups == 1 and tuple(wshape[2:]) == (3, 3) and kw.get("stride", 1) in (1, (1, 1))
                and kw.get("dilation", 1) in (1, (1, 1)))
    return depthwise or "depthwise" not in impl


def _cases():
    return [pytest.param(p.values[0], geo, id=f"{p.id}-{i}", marks=p.marks)
            for p in impl_params("conv2d", "cpu") for i, geo in enumerate(GEOMETRIES)
            if _supports(p.values[0] or "", geo[1], geo[2])]


def _inputs(g, xs, ws, half):
    x = as_half(half, randn(g, xs, np.float32))
    w = as_half(half, randn(g, ws, np.float32) / np.sqrt(np.prod(ws[1:])))
    b = as_half(half, 0.1 * randn(g, (ws[0],), np.float32))
    return x, w, b


def check(got, x, w, b, activation, kw, what):
    """Within the 16-bit rounding plus the float32 sum's error over the fan-in, relative to
    the size of the terms each output sums (support.product_scale's reasoning)."""
    absb = None if b is None else np.abs(np.asarray(b, np.float64))
    terms = ref.conv2d(np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64)), absb, **kw)
    fan_in = int(np.prod(w.shape[1:]))
    want = ref.conv2d(x, w, b, activation=activation, **kw)
    assert_half_close(got, want, 1.2 * reduction_tol(np.float32, fan_in) * terms, what)


@pytest.mark.parametrize("activation", [None, "relu", "silu"] if not SMALL_SHAPES else ["silu"], ids=str)
@pytest.mark.parametrize("impl, geo", _cases())
def test_matches_reference(impl, geo, activation, half):
    need_half_format(impl, half)
    xs, ws, kw = geo
    g = rng()
    x, w, b = _inputs(g, xs, ws, half)
    oshape = ref.conv2d(x, w, None, **kw).shape
    out = poisoned(oshape, half)
    got = run(impl, dispatch.conv2d, x, w, b, activation=activation, out=out, _op="conv2d", **kw)
    assert got is out and got.dtype == half
    check(got, x, w, b, activation, kw, f"{impl} {geo} {activation}")
    got = run(impl, dispatch.conv2d, x, w, _op="conv2d", **kw)   # no bias, no activation
    check(got, x, w, None, None, kw, f"{impl} {geo} plain")


@pytest.mark.parametrize("impl", [p for p in impl_params("conv2d", "cpu") if "depthwise" not in (p.values[0] or "")])
def test_views_unbatched_and_out(impl, half):
    """A strided x, an unbatched (C, H, W) x, a non-contiguous out=, NaN in x."""
    need_half_format(impl, half)
    g = rng()
    x, w, b = _inputs(g, (1, 4, 8, 8), (6, 4, 3, 3), half)
    kw = dict(padding=1)
    want_shape = (1, 6, 8, 8)
    check(run(impl, dispatch.conv2d, strided(x), w, b, _op="conv2d", **kw), x, w, b, None, kw, f"{impl} strided")
    got = run(impl, dispatch.conv2d, x[0], w, b, _op="conv2d", **kw)
    assert got.shape == want_shape[1:]
    check(got[None], x, w, b, None, kw, f"{impl} unbatched")
    tout = np.full((8, 8, 6, 1), np.nan, half).T
    assert run(impl, dispatch.conv2d, x, w, b, out=tout, _op="conv2d", **kw) is tout
    check(tout, x, w, b, None, kw, f"{impl} non-contiguous out=")
    xn = np.asarray(x, np.float32)
    xn[0, 1, 4, 4] = np.nan
    xn = as_half(half, xn)
    got = run(impl, dispatch.conv2d, xn, w, b, _op="conv2d", **kw)
    assert np.isnan(np.asarray(got[0, :, 3:6, 3:6], np.float32)).all()
    check(got, xn, w, b, None, kw, f"{impl} NaN")


def test_bad_input_changes_nothing(half):
    g = rng()
    x, w, b = _inputs(g, (1, 4, 6, 6), (5, 4, 3, 3), half)
    out = np.full((1, 5, 4, 4), np.nan, half)
    with pytest.raises(TypeError, match="weight must have the same dtype as x"):
        dispatch.conv2d(x, w.astype(np.float32), out=out)
    with pytest.raises(TypeError, match="weight must have the same dtype as x"):
        dispatch.conv2d(x, w.astype(other_half(half)), out=out)
    with pytest.raises(TypeError, match="bias must have the same dtype as x"):
        dispatch.conv2d(x, w, b.astype(np.float32), out=out)
    with pytest.raises(TypeError, match=r"x must have dtype float32 or float64.*bfloat16 / float16"):
        dispatch.conv2d(x.astype(np.int16), w, out=out)
    with pytest.raises((TypeError, ValueError), match="out"):
        dispatch.conv2d(x, w, out=np.full((1, 5, 4, 4), np.nan, np.float32))
    with pytest.raises(TypeError, match="weight must have the same dtype as x"):
        dispatch.conv2d(x, dispatch.prepack(np.asarray(w, np.float32), op="conv2d"), out=out)
    with pytest.raises(TypeError, match="weight must have the same dtype as x"):
        dispatch.conv2d(x, dispatch.prepack(w.astype(other_half(half)), op="conv2d"), out=out)
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


# (x shape, weight shape, keyword arguments): the direct form's panels (stride 1: odd C,
# channels past a 64- and a 32-channel panel, dilation, a 1x1 with Cin >= Cout and one with
# Cin < Cout, which the AMX form runs as im2col), the strided form, grouped and depthwise
PACKED_GEOMETRIES = [
    ((2, 7, 11, 13), (100, 7, 3, 3), dict(padding=(2, 1), dilation=(2, 2))),
    ((1, 40, 9, 10), (33, 40, 3, 3), dict(padding=1)),
    ((1, 20, 6, 7), (12, 20, 1, 1), dict()),
    ((1, 8, 6, 7), (40, 8, 1, 1), dict()),
    ((1, 3, 23, 21), (10, 3, 7, 7), dict(stride=2, padding=3)),
    ((3, 4, 6, 5), (6, 2, 3, 3), dict(stride=2, groups=2)),
    ((1, 4, 7, 6), (4, 1, 3, 3), dict(padding=1, groups=4)),
]


@pytest.mark.parametrize("impl, geo", [pytest.param(p.values[0], geo, id=f"{p.id}-{i}", marks=p.marks)
                                       for p in impl_params("conv2d", "cpu") for i, geo in enumerate(PACKED_GEOMETRIES)
                                       if _supports(p.values[0] or "", geo[1], geo[2])])
def test_prepacked_equals_unpacked(impl, geo, half):
    """dispatch.prepack(weight, op="conv2d") of a 16-bit weight gives the unpacked call's bits
    on every implementation that takes the geometry: a bfloat16 weight with groups 1 on a
    host with a bfloat16 form holds that form's panels (the direct form reads them, not the
    weight again), any other the float32 panels of its widened values (the widening GEMM and
    Winograd kernels read them)."""
    need_half_format(impl, half)
    xs, ws, kw = geo
    g = rng()
    x, w, b = _inputs(g, xs, ws, half)
    pw = dispatch.prepack(w, op="conv2d", groups=kw.get("groups", 1))
    want = run(impl, dispatch.conv2d, x, w, b, activation="relu", **kw)
    got = run(impl, dispatch.conv2d, x, pw, b, activation="relu", **kw)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert "prepacked=True" in str(dispatch.explain("conv2d", x, pw, b, **kw))


def test_prepacked_panels_are_what_runs(half):
    """The packed kernels read the panels, not the source: after the source is zeroed a
    PackedWeight still gives the packed weight's result where its panels serve the chosen
    kernel (the stride-1 direct form of this host's bfloat16 kernel, else the widened
    GEMM's float32 panels), and an unpacked call sees the zeros."""
    from dispatch.ops import conv_bf16
    g = rng()
    x, w, b = _inputs(g, (1, 40, 9, 10), (33, 40, 3, 3), half)
    pw = dispatch.prepack(w, op="conv2d")
    form = conv_bf16.host_form() if np.dtype(half) == dispatch.validate.BF16 else None
    assert pw.tile == (form or dispatch.ops.conv.active_tile().name), pw
    assert pw.panels.dtype == (np.uint32 if form else np.float32), pw
    impl = {"bf16-amx": "cpu-bf16-amx", "bf16-dot": "cpu-bf16-dot", None: "cpu-gemm"}[form]
    want = run(impl, dispatch.conv2d, x, w, b, padding=1)
    w[...] = 0
    np.testing.assert_array_equal(run(impl, dispatch.conv2d, x, pw, b, padding=1).view(np.uint16),
                                  want.view(np.uint16))
    zeroed = run(impl, dispatch.conv2d, x, w, b, padding=1)
    assert not np.array_equal(zeroed.view(np.uint16), want.view(np.uint16))


def test_prepacked_for_another_form(half, monkeypatch):
    """A bfloat16 PackedWeight whose panels are for another bfloat16 kernel than this host's
    (packed on another machine kind) is refused, naming both and what to do."""
    from dispatch.ops import conv_bf16
    if np.dtype(half) != dispatch.validate.BF16 or conv_bf16.host_form() is None:
        pytest.skip("bfloat16 panels: a host with AVX-512 BF16 or AMX")
    g = rng()
    x, w, b = _inputs(g, (1, 8, 6, 6), (4, 8, 3, 3), half)
    pw = dispatch.prepack(w, op="conv2d")
    monkeypatch.setattr(conv_bf16, "host_form", lambda: "bf16-elsewhere")
    out = poisoned((1, 4, 4, 4), half)
    with pytest.raises(ValueError, match=f"panels of the {pw.tile} bfloat16 kernel; this host runs bf16-elsewhere"):
        dispatch.conv2d(x, pw, b, out=out)
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


def test_threads_bitwise(half):
    """Calls from 4 Python threads at once give each case its single-threaded bits (the
    widened copies come from each call's own arena buffers)."""
    g = rng()
    geos = [((1, 8, 12, 12), (16, 8, 3, 3), dict(padding=1)), ((2, 6, 9, 9), (6, 1, 3, 3), dict(groups=6)),
            ((1, 16, 7, 7), (8, 16, 1, 1), dict()), ((1, 3, 15, 15), (8, 3, 5, 5), dict(stride=2))]
    cases = [(_inputs(g, xs, ws, half), kw) for xs, ws, kw in geos]
    (x, w, b), kw = cases[0]
    cases.append(((x, dispatch.prepack(w, op="conv2d"), b), kw))   # its panels shared by the threads

    def call(case):
        (x, w, b), kw = case
        return dispatch.conv2d(x, w, b, activation="relu", **kw).view(np.uint16).ravel()

    assert concurrent_mismatches(call, cases) == []


AMX_GEOMETRIES = [
    ((2, 40, 17, 19), (45, 40, 3, 3), dict(padding=1)),       # K 361: two blocks of chunks; 45 rows of tiles
    ((1, 33, 20, 21), (70, 33, 3, 5), dict(stride=(2, 1), dilation=(1, 2), padding=(2, 3))),
    ((1, 3, 30, 30), (8, 3, 7, 7), dict(stride=2, padding=3)),  # the stem's form, odd K with the bias row
    ((3, 64, 9, 7), (33, 64, 1, 1), dict()),                  # 1x1, K a whole chunk (+ the bias row)
    ((1, 16, 1, 1), (5, 16, 3, 3), dict(padding=1)),          # a 1x1 image: one pixel, most taps padding
    # the direct form (stride 1): dilation (a call per tap), odd C, output channels split
    # over tasks; K blocks of a kernel row (9 chunks), 8-pair transposes with a ragged
    # row; an even kernel's asymmetric padding; a 1x1 with more output channels (im2col)
    ((2, 7, 11, 13), (100, 7, 3, 3), dict(padding=(2, 1), dilation=(2, 2))),
    ((1, 96, 10, 9), (40, 96, 3, 3), dict(padding="same")),
    ((1, 6, 8, 8), (4, 6, 2, 4), dict(padding="same")),
    ((1, 8, 12, 12), (40, 8, 1, 1), dict()),
] + ([] if SMALL_SHAPES else [((1, 64, 24, 24), (64, 64, 3, 3), dict(padding=1))])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("xs, ws, kw", AMX_GEOMETRIES, ids=str)
@pytest.mark.parametrize("impl", ["cpu-bf16-amx", "cpu-bf16-dot"])
def test_amx_geometries(impl, xs, ws, kw, bias):
    """cpu-bf16-amx across its tiles, tasks and K blocks: the im2col matrix formed in the
    tiles' panels (strides, dilation, padding, images), the bias as one more product; and
    cpu-bf16-dot over the same geometries: the direct form on vdpbf16ps at stride 1 (6-pixel
    groups past a row's end and the block's, odd C, channels past a 64-channel panel,
    dilation, a 1x1 image), the im2col form in 64-pixel panels at the others (an odd K
    completed with a zero column, with and without the bias's row)."""
    half = half_dtype("bfloat16")
    need_half_format(impl, half)
    g = rng()
    x, w, b = _inputs(g, xs, ws, half)
    b = b if bias else None
    out = poisoned(ref.conv2d(x, w, None, **kw).shape, half)
    got = run(impl, dispatch.conv2d, x, w, b, activation="gelu", out=out, **kw)
    assert got is out
    check(got, x, w, b, "gelu", kw, f"{impl} {xs} {ws} {kw}")


def test_amx_rule(half):
    """bfloat16 dense convolutions on an AMX host run on AMX tiles, on a host with AVX-512
    BF16 but no AMX by vdpbf16ps (any stride); float16, grouped ones, or any on other hosts
    run the float32 kernels on widened copies, with the refusals named."""
    from kernels_cpu import bf16_gemm as KB
    x = as_half(half, np.ones((1, 8, 6, 6), np.float32))
    dense = str(dispatch.explain("conv2d", x, as_half(half, np.ones((4, 8, 3, 3), np.float32))))
    grouped = str(dispatch.explain("conv2d", x, as_half(half, np.ones((4, 4, 3, 3), np.float32)), groups=2))
    bf16 = np.dtype(half) == dispatch.validate.BF16
    assert f"cpu-bf16-amx: refused: {'grouped convolution' if bf16 else 'dtype float16'}" in grouped, grouped
    strided = str(dispatch.explain("conv2d", x, as_half(half, np.ones((4, 8, 3, 3), np.float32)), stride=2))
    dot = bf16 and KB.amx_refusal() is not None and KB.host_refusal() is None
    if bf16 and KB.amx_refusal() is None:
        assert "chosen: cpu-bf16-amx" in dense, dense
    else:
        assert "chosen: cpu-bf16-amx" not in dense and "cpu-bf16-amx: refused" in dense, dense
        assert ("chosen: cpu-bf16-dot" in dense) == dot, dense
        assert ("chosen: cpu-bf16-dot" in strided) == dot and "chosen: cpu-bf16-dot" not in grouped, (strided, grouped)
