"""dispatch.conv2d against the float64 reference (tests/reference/conv.py), for every
implementation the dispatcher can pick on the target device: the implicit GEMM for every
geometry, the depthwise kernels where groups == C (they refuse the rest)."""
import numpy as np
import pytest

import dispatch
from dispatch import registry
from tests.reference import conv as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, assert_close, assert_no_new_specialization, impl_params,
                           poisoned, randn, read_only, rng, run, strided, to_host, to_target)

DTYPES = [np.float16, np.float32] if ON_CUDA else [np.float32, np.float64]
# the implementations of these dtypes (cpu-bf16-amx takes bfloat16 only: test_half_conv.py)
IMPLS = [p for p in impl_params("conv2d")
         if p.values[0] is None or np.float32 in dispatch.registry.OPS["conv2d"].implementations[p.values[0]].dtypes]


def _tol(dtype, fan_in):
    """Normwise tolerance: a sum of fan_in products in the kernel's accumulation type."""
    if dtype == np.float16:
        return 2e-3  # the float16 output's rounding dominates (float32 accumulation)
    eps = np.finfo(dtype).eps
    return 8 * eps * np.sqrt(max(fan_in, 1)) + 4 * eps


# (x shape, weight shape, keyword arguments): odd images, 1x1 and 7x7, kernels 1/3/5/7,
# stride 2 on odd sizes, dilation 2, groups 1 / 2 / C, Cout not a multiple of any tile
# (6 rows x 16 columns on the CPU), batch 1 and 3, asymmetric "same" padding.
GEOMETRIES_SMALL = [
    ((1, 3, 7, 7), (5, 3, 3, 3), dict(padding=1)),
    ((3, 4, 6, 5), (6, 2, 3, 3), dict(stride=2, groups=2)),
    ((1, 4, 7, 6), (4, 1, 3, 3), dict(padding=1, groups=4, dilation=(2, 1))),
    ((2, 3, 5, 5), (6, 3, 1, 1), dict()),
    ((1, 2, 1, 1), (3, 2, 1, 1), dict()),
    ((1, 2, 6, 6), (3, 2, 2, 4), dict(padding="same")),
]
GEOMETRIES_FULL = [
    ((1, 3, 7, 7), (5, 3, 3, 3), dict(padding=1)),
    ((3, 6, 13, 11), (19, 6, 3, 3), dict(stride=2, padding=(1, 2))),
    ((1, 3, 23, 21), (10, 3, 7, 7), dict(stride=2, padding=3)),
    ((2, 8, 15, 17), (14, 4, 5, 5), dict(padding=2, groups=2)),
    ((1, 5, 12, 12), (5, 1, 3, 3), dict(padding=1, groups=5)),
    ((3, 6, 9, 10), (12, 1, 3, 3), dict(stride=2, padding=1, groups=6)),          # depthwise, multiplier 2
    ((1, 7, 11, 11), (7, 1, 5, 5), dict(padding=4, dilation=2, groups=7)),
    ((2, 20, 9, 9), (33, 20, 1, 1), dict()),                                      # 1x1
    ((1, 24, 7, 7), (24, 24, 3, 3), dict(padding=1)),                            # a 7x7 image: few tasks
    ((1, 2, 1, 1), (3, 2, 1, 1), dict()),                                          # a 1x1 image
    ((1, 3, 1, 1), (4, 3, 3, 3), dict(padding=1)),
    ((1, 4, 10, 9), (6, 4, 4, 2), dict(padding="same", dilation=2)),             # even kernel: asymmetric pad
    ((1, 3, 8, 8), (4, 3, 3, 3), dict(padding="valid", stride=(1, 3))),
    ((1, 16, 40, 3), (6, 16, 3, 3), dict(padding=1)),                            # K > KC would need 256+: below
    ((1, 40, 6, 30), (9, 40, 3, 3), dict(padding=1, stride=(2, 1))),             # Kc = 360 > KC = 256 blocks
    ((1, 300, 20, 21), (10, 300, 1, 1), dict()),       # 1x1 tiles packed: K blocks, tasks of several tiles
    ((2, 6, 11, 13), (8, 3, 1, 1), dict(groups=2)),    # 1x1 packed across groups; the last tile past x's end
    ((3, 10, 15, 12), (19, 10, 3, 3), dict(padding=(1, 2))),  # Winograd: odd output rows, uneven padding, batch 3
    ((1, 40, 23, 30), (9, 40, 3, 3), dict()),          # Winograd: odd output columns, runs of several tile blocks
    ((2, 7, 5, 4), (5, 7, 3, 3), dict(padding=2)),     # Winograd: padding past a whole patch
]
GEOMETRIES = GEOMETRIES_SMALL if SMALL_SHAPES else GEOMETRIES_FULL


def _geo_id(geo):
    xs, ws, kw = geo
    return "x" + "x".join(map(str, xs)) + "-w" + "x".join(map(str, ws)) + "".join(f"-{k}{v}" for k, v in kw.items())


def _supports(impl, wshape, kw):
    groups = kw.get("groups", 1)
    depthwise = groups > 1 and wshape[1] == 1
    if "winograd" in impl:  # F(2x2, 3x3): dense 3x3, stride and dilation 1
        return (groups == 1 and tuple(wshape[2:]) == (3, 3) and kw.get("stride", 1) in (1, (1, 1))
                and kw.get("dilation", 1) in (1, (1, 1)))
    return depthwise or "depthwise" not in impl


def _scale(x, w, b, **kw):
    """assert_close's scale for act(conv2d(x, w) + b): the size of the terms each output
    sums (as support.product_scale for a product), from the reference convolution of their
    magnitudes.  With relu after it, every output can be a sum that cancelled to near 0 or
    was cut to 0 (a 1x1 image of 3 channels: three outputs), where max|ref| alone cannot
    bound the terms' rounding."""
    absb = None if b is None else np.abs(np.asarray(b, np.float64))
    terms = ref.conv2d(np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64)), absb, **kw)
    terms = terms[np.isfinite(terms)]
    return 1.2 * float(terms.max()) if terms.size else 0.0


def _inputs(g, xs, ws, dtype):
    x = randn(g, xs, dtype)
    w = (randn(g, ws, np.float64) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = randn(g, (ws[0],), dtype)
    return x, w, b


def _impl_geo():
    """(impl, geometry) pairs: the depthwise kernels only with groups == C."""
    return [pytest.param(p.values[0], geo, id=f"{p.id}-{_geo_id(geo)}", marks=p.marks)
            for p in IMPLS for geo in GEOMETRIES if _supports(p.values[0] or "", geo[1], geo[2])]


@pytest.mark.parametrize("activation", ["silu"] if SMALL_SHAPES else [None, "relu", "silu"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl, geo", _impl_geo())
def test_matches_reference(impl, geo, dtype, activation):
    xs, ws, kw = geo
    g = rng()
    x, w, b = _inputs(g, xs, ws, dtype)
    want = ref.conv2d(x, w, b, activation=activation, **kw)
    out = poisoned(want.shape, dtype)
    got = run(impl, dispatch.conv2d, x, w, b, activation=activation, out=out, **kw)
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, want, _tol(dtype, np.prod(ws[1:])), f"conv2d {impl}", cancel=True, scale=_scale(x, w, b, **kw))
    # no bias, and strided (non-contiguous) views of x and the weight
    got2 = run(impl, dispatch.conv2d, strided(x), strided(w), **kw)
    assert_close(got2, ref.conv2d(x, w, **kw), _tol(dtype, np.prod(ws[1:])), f"conv2d {impl} strided", cancel=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_unbatched_input(impl):
    g = rng()
    groups = 3 if "depthwise" in impl else 1
    x, w, b = _inputs(g, (3, 6, 5), (6, 3 // groups, 3, 3), np.float32)
    got = run(impl, dispatch.conv2d, x, w, b, padding=1, groups=groups)
    assert got.shape == (6, 6, 5)
    assert_close(got, ref.conv2d(x, w, b, padding=1, groups=groups), _tol(np.float32, 27), "unbatched", cancel=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_propagates(impl):
    g = rng()
    groups = 2 if "depthwise" in impl else 1
    x, w, b = _inputs(g, (1, 2, 6, 6), (2, 2 // groups, 3, 3), np.float32)
    x[0, 0, 2, 3] = np.nan
    got = to_host(run(impl, dispatch.conv2d, x, w, b, groups=groups))
    want = ref.conv2d(x, w, b, groups=groups)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want).any()


# ---- host-only: read-only inputs, prepacked weights, explain, threads ---------------------------

host_only = pytest.mark.skipif(ON_CUDA, reason="host arrays and the CPU kernels")


@host_only
@pytest.mark.parametrize("impl", IMPLS)
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    from kernels_cpu import conv as K, conv_winograd as KW

    g = rng()
    groups = 4 if "depthwise" in impl else 1
    x, w, b = _inputs(g, (1, 4, 8, 8), (4, 4 // groups, 3, 3), np.float32)
    want = run(impl, dispatch.conv2d, x, w, b, groups=groups, padding=1)

    def variants():
        got = run(impl, dispatch.conv2d, read_only(x), read_only(w), read_only(b), groups=groups, padding=1)
        np.testing.assert_array_equal(got, want)

    assert_no_new_specialization([K, KW], variants, impl)


GEMM_SHAPES = [((2, 6, 13, 11), (19, 6, 3, 3), dict(stride=2, padding=1)),
               ((1, 8, 9, 9), (12, 4, 3, 3), dict(groups=2, padding="same")),
               ((1, 20, 7, 7), (7, 20, 1, 1), dict()),
               ((1, 40, 6, 30), (9, 40, 3, 3), dict(padding=1))]


@host_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geo", GEMM_SHAPES, ids=_geo_id)
def test_prepacked_equals_unpacked(geo, dtype):
    """A PackedWeight gives bit for bit the unpacked call's result (the same panels)."""
    xs, ws, kw = geo
    g = rng()
    x, w, b = _inputs(g, xs, ws, dtype)
    pw = dispatch.prepack(w, op="conv2d", groups=kw.get("groups", 1))
    with dispatch.use(conv2d="cpu-gemm"):
        want = dispatch.conv2d(x, w, b, activation="relu", **kw)
        got = dispatch.conv2d(x, pw, b, activation="relu", **kw)
    np.testing.assert_array_equal(got, want)
    w[...] = 0  # the panels are a snapshot of the weight
    np.testing.assert_array_equal(dispatch.conv2d(x, pw, b, activation="relu", **kw), want)


@host_only
def test_prepacked_checks_and_explain():
    g = rng()
    x, w, b = _inputs(g, (1, 4, 6, 6), (6, 2, 3, 3), np.float32)
    pw = dispatch.prepack(w, op="conv2d", groups=2)
    text = str(dispatch.explain("conv2d", x, pw, b, groups=2))
    assert "prepacked=True" in text and "chosen: cpu-gemm" in text, text
    with pytest.raises(ValueError, match="packed with groups=2"):
        dispatch.conv2d(x, pw, b, groups=1)
    with pytest.raises(TypeError, match="op='linear'"):
        dispatch.conv2d(x, dispatch.prepack(np.ones((3, 4), np.float32)), b)
    with pytest.raises(ValueError, match="groups"):
        dispatch.prepack(w, op="conv2d", groups=4)
    with pytest.raises(ValueError, match="weight must have 4 dimensions"):
        dispatch.prepack(np.ones((3, 4), np.float32), op="conv2d")
    with pytest.raises(ValueError, match="groups"):
        dispatch.prepack(np.ones((3, 4), np.float32), op="linear", groups=2)


@host_only
def test_rule_picks_depthwise_and_gemm():
    x = np.ones((1, 8, 9, 9), np.float32)
    dw = str(dispatch.explain("conv2d", x, np.ones((8, 1, 3, 3), np.float32), groups=8))
    assert "chosen: cpu-depthwise" in dw, dw
    dense = str(dispatch.explain("conv2d", x, np.ones((4, 8, 3, 3), np.float32)))
    assert "chosen: cpu-gemm" in dense and "cpu-depthwise: refused" in dense, dense
    # Winograd for a 3x3 stride-1 layer of 64 channels at 56x56; refused for stride 2
    x = np.ones((1, 64, 56, 56), np.float32)
    w = np.ones((64, 64, 3, 3), np.float32)
    wino = str(dispatch.explain("conv2d", x, w, padding=1))
    assert "chosen: cpu-winograd" in wino and "Winograd F(2x2, 3x3)" in wino, wino
    s2 = str(dispatch.explain("conv2d", x, w, padding=1, stride=2))
    assert "chosen: cpu-gemm" in s2 and "cpu-winograd: refused: stride (2, 2)" in s2, s2


@host_only
@pytest.mark.parametrize("shape", [(0, 3, 5, 5), (2, 3, 5, 5)], ids=str)
def test_empty_batch_and_channels(shape):
    x = np.ones(shape, np.float32)
    y = dispatch.conv2d(x, np.ones((0, 3, 3, 3), np.float32))
    assert y.shape == (shape[0], 0, 3, 3)
    assert dispatch.conv2d(x, np.ones((2, 3, 3, 3), np.float32)).shape == (shape[0], 2, 3, 3)


# ---- bad input ------------------------------------------------------------------------------

X = np.ones((1, 4, 6, 6), np.float32)
W = np.ones((6, 4, 3, 3), np.float32)


@host_only
@pytest.mark.parametrize("kw, err, msg", [
    (dict(x=np.ones((1, 4, 6, 6), np.int32)), TypeError, "x must have dtype float32 or float64"),
    (dict(weight=np.ones((6, 4, 3, 3))), TypeError, "weight must have the same dtype as x"),
    (dict(x=np.ones((4, 6), np.float32)), ValueError, "x must have 3 to 4 dimensions"),
    (dict(weight=np.ones((6, 4, 3), np.float32)), ValueError, "weight must have 4 dimensions"),
    (dict(weight=np.ones((6, 3, 3, 3), np.float32)), ValueError, "weight must have C / groups = 4"),
    (dict(groups=3), ValueError, "groups=3 must divide x's channels"),
    (dict(groups=4, weight=np.ones((6, 1, 3, 3), np.float32)), ValueError, "groups=4 must divide weight's output"),
    (dict(groups=0), ValueError, "groups must be a positive int"),
    (dict(groups=True), TypeError, "groups must be an int"),
    (dict(bias=np.ones(5, np.float32)), ValueError, r"bias must have shape \(6,\)"),
    (dict(stride=0), ValueError, "stride must be positive"),
    (dict(stride=(1, 2, 3)), ValueError, "stride must be an int or a pair"),
    (dict(stride=1.5), TypeError, "stride must be an int or a pair"),
    (dict(padding=-1), ValueError, "padding must be >= 0"),
    (dict(padding="full"), ValueError, "padding must be one of"),
    (dict(padding="same", stride=2), ValueError, "padding='same' needs stride 1"),
    (dict(dilation=0), ValueError, "dilation must be positive"),
    (dict(weight=np.ones((6, 4, 7, 7), np.float32)), ValueError, "larger than the padded input"),
    (dict(dilation=3), ValueError, "larger than the padded input"),
    (dict(activation="tanh"), ValueError, "activation must be one of"),
])
def test_bad_inputs_raise_naming_the_argument_and_write_nothing(kw, err, msg):
    args = dict(x=X, weight=W, bias=None)
    args.update(kw)
    x, w, b = args.pop("x"), args.pop("weight"), args.pop("bias")
    out = np.full((1, 6, 4, 4), np.nan, np.float32)
    with pytest.raises(err, match=msg):
        dispatch.conv2d(x, w, b, out=out, **args)
    assert np.isnan(out).all()


@host_only
def test_bad_out_rejected_and_untouched():
    for bad, err, msg in [(np.zeros((1, 6, 4, 5), np.float32), ValueError, "out must have shape"),
                          (np.zeros((1, 6, 4, 4), np.float64), TypeError, "out must have dtype")]:
        before = bad.copy()
        with pytest.raises(err, match=msg):
            dispatch.conv2d(X, W, out=bad)
        assert np.array_equal(bad, before)
    x = np.ones((1, 4, 4, 4), np.float32)
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.conv2d(x, np.ones((4, 4, 1, 1), np.float32), out=x)


@pytest.mark.skipif(not ON_CUDA, reason="the CUDA implementations' refusal")
def test_cuda_refuses_host_panels():
    pw = dispatch.prepack(np.ones((4, 2, 3, 3), np.float32), op="conv2d")
    x = to_target(np.ones((1, 2, 5, 5), np.float32))
    with pytest.raises(Exception, match="device"):
        dispatch.conv2d(x, pw)


def test_registry_has_both_kernel_kinds():
    names = set(registry.OPS["conv2d"].implementations)
    assert {"cpu-gemm", "cpu-depthwise", "cpu-depthwise-serial", "cuda-implicit-gemm", "cuda-depthwise"} <= names


@host_only
@pytest.mark.parametrize("tile", ["6x16", "8x48", "12x32"])
def test_conv_runs_the_active_gemm_tile(tile):
    """conv2d's implicit GEMM runs the GEMM's active register tile (kernels_cpu.gemm.use_tile /
    NK_GEMM_TILE), its weight panels packed for that tile's rows: each tile matches the
    reference on the direct form (pitched tiles across rows, strides, an edge of output
    channels) and the 1x1 form, prepacked equal to unpacked, and a PackedWeight packed
    under another tile is refused by name, writing nothing."""
    from kernels_cpu import gemm as K
    g = rng()
    cases = [((1, 6, 9, 10), (7, 6, 3, 3), dict(padding=1)), ((2, 20, 7, 7), (9, 20, 1, 1), dict()),
             ((1, 5, 23, 61), (13, 5, 3, 3), dict(stride=2, padding=1)),
             ((2, 3, 40, 53), (17, 3, 7, 7), dict(stride=2, padding=3))]
    prev = K.use_tile("6x16")
    try:
        other = dispatch.prepack(np.ones((4, 2, 3, 3), np.float32), op="conv2d")
        K.use_tile(tile)
        for xs, ws, kw in cases:
            x, w, b = _inputs(g, xs, ws, np.float32)
            with dispatch.use(conv2d="cpu-gemm"):
                got = dispatch.conv2d(x, w, b, **kw)
                np.testing.assert_array_equal(dispatch.conv2d(x, dispatch.prepack(w, op="conv2d"), b, **kw), got)
            assert_close(got, ref.conv2d(x, w, b, **kw), _tol(np.float32, np.prod(ws[1:])), f"conv2d {tile}",
                         cancel=True)
        if tile != "6x16":
            out = np.full((1, 4, 3, 3), 7.0, np.float32)
            with pytest.raises(ValueError, match="packed for the 6x16 GEMM tile"):
                dispatch.conv2d(np.ones((1, 2, 5, 5), np.float32), other, out=out)
            assert (out == 7.0).all()
    finally:
        K.use_tile(prev)


@host_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("impl", ["cpu-depthwise", "cpu-depthwise-serial"])
def test_depthwise_forms(impl, dtype):
    """Each form of the CPU depthwise kernel against the reference: the direct form (tiles of
    kernels_cpu.conv.DW_ROWS rows x one vector of columns read with masked loads) unrolled
    for 3x3 and 5x5 and looping for other kernels, dilations and row strides; planes
    narrower and wider than a vector (a partial last vector), taller than a tile (a
    partial last tile), 1x1; padding 0 to past the kernel's reach; channel multipliers;
    the phase form for column strides 2 and 3; bias + relu in the tile, silu after it."""
    g = rng()
    cases = [((1, 6, 14, 14), (6, 1, 3, 3), dict(padding=1)),                       # MobileNet's 14x14
             ((2, 3, 23, 37), (3, 1, 3, 3), dict(padding=0)),                       # partial tiles, 3 vectors
             ((1, 4, 9, 17), (4, 1, 3, 3), dict(padding=2)),                        # padding past the taps
             ((1, 5, 16, 33), (5, 1, 5, 5), dict(padding=2)),                       # 5x5 unrolled
             ((1, 3, 1, 1), (3, 1, 3, 3), dict(padding=1)),                         # a 1x1 image
             ((1, 2, 13, 19), (6, 1, 3, 3), dict(padding=1)),                       # multiplier 3
             ((1, 3, 15, 21), (3, 1, 7, 7), dict(padding=3)),                       # 7x7: the loop
             ((1, 3, 12, 20), (3, 1, 3, 2), dict(padding=(1, 0), dilation=(2, 3))),  # dilations, 3x2
             ((2, 3, 17, 18), (3, 1, 3, 3), dict(padding=1, stride=(2, 1))),        # row stride 2
             ((1, 3, 17, 18), (3, 1, 3, 3), dict(padding=1, stride=2)),             # phase form
             ((1, 2, 20, 23), (4, 1, 5, 5), dict(padding=2, stride=(1, 3))),        # phase form, stride 3
             ]
    for xs, ws, kw in cases:
        x, w, b = _inputs(g, xs, ws, dtype)
        for activation in (None, "relu", "silu"):
            want = ref.conv2d(x, w, b, groups=xs[1], activation=activation, **kw)
            out = poisoned(want.shape, dtype)
            got = run(impl, dispatch.conv2d, x, w, b, groups=xs[1], activation=activation, out=out, **kw)
            assert_close(got, want, _tol(dtype, np.prod(ws[1:])), f"depthwise {xs} {ws} {kw} {activation}",
                         cancel=True, scale=_scale(x, w, b, groups=xs[1], **kw))
        got = run(impl, dispatch.conv2d, x, w, groups=xs[1], **kw)  # no bias
        assert_close(got, ref.conv2d(x, w, groups=xs[1], **kw), _tol(dtype, np.prod(ws[1:])),
                     f"depthwise {xs} {ws} {kw} no bias", cancel=True)
        xn = x.copy()
        xn[0, 0, 0, -1] = np.nan  # at the plane's corner: the masked edge of a vector
        got = run(impl, dispatch.conv2d, xn, w, b, groups=xs[1], activation="relu", **kw)
        want = ref.conv2d(xn, w, b, groups=xs[1], activation="relu", **kw)
        assert np.array_equal(np.isnan(got), np.isnan(want)), f"depthwise NaN {xs} {ws} {kw}"


@host_only
def test_winograd_from_threads():
    """4 threads run the Winograd kernel at once (its per-worker buffers, the plan cache) on
    their own inputs, each result bitwise equal to the single-threaded one."""
    import threading
    g = rng()
    cases = [_inputs(g, (1 + i % 2, 8 + 8 * i, 12 + i, 9 + 2 * i), (5 + 3 * i, 8 + 8 * i, 3, 3), np.float32)
             for i in range(4)]
    with dispatch.use(conv2d="cpu-winograd"):
        want = [dispatch.conv2d(x, w, b, padding=1, activation="relu") for x, w, b in cases]
    bad = []

    def worker(i):
        x, w, b = cases[i]
        with dispatch.use(conv2d="cpu-winograd"):
            for _ in range(20):
                got = dispatch.conv2d(x, w, b, padding=1, activation="relu")
                if not np.array_equal(got, want[i]):
                    bad.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad, f"threads {sorted(set(bad))} got results that differ from the single-threaded ones"
