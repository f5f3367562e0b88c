"""dispatch.quantize / dispatch.dequantize against the float64 references of
tests/reference/quant.py (the ONNX formulas), for every implementation on the target device
(CPU: cpu-serial, cpu-parallel; CUDA, on a GPU or the simulator: cuda-elementwise):
quantized values, scales and zero points exactly equal (ties at .5, saturation, NaN), the
round trip within scale / 2, dequantize equal to the exact product rounded once, and
onnxruntime's QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear on the same inputs
(when onnxruntime is importable) as a cross-check of the semantics."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dispatch
from dispatch import QuantizedArray
from tests.reference import quant as ref
from tests.support import ON_CUDA, SEEDS, SMALL_SHAPES, impl_params, poisoned, read_only, rng, strided, to_host, to_target

QIMPLS = impl_params("quantize")
DIMPLS = impl_params("dequantize")
DTYPES = [np.float32, np.float64]
QTYPES = ["int8", "uint8"]

# (shape, axis): per tensor and per channel on every axis, size 1, odd sizes, a channel
# axis of extent 1, long rows (the parallel kernels split I), many channels (split C / O).
SMALL = [((5, 37), None), ((5, 37), 0), ((5, 37), 1), ((3, 4, 7), 1), ((3, 4, 7), -1), ((1,), None), ((1,), 0),
         ((6, 1), 1), ((17,), None)]
FULL = SMALL + [((3, 4, 7), 0), ((64, 4100), None), ((64, 4100), 0), ((300, 700), 1), ((2, 130, 33), 1),
                ((9000,), 0), ((70000,), None)]
CASES = SMALL if SMALL_SHAPES else FULL


def _quantize(impl, x, **kw):
    """dispatch.quantize with impl forced, x on the target device; (values, scale, zp, q)
    with values on the host."""
    with dispatch.use(quantize=impl):
        q = dispatch.quantize(to_target(x), **kw)
    assert isinstance(q, QuantizedArray)
    assert q.device == ("cuda" if ON_CUDA else "cpu")
    return to_host(q.values), q.scale, q.zero_point, q


def _target_q(values, scale, zero_point=None, axis=None):
    return QuantizedArray(to_target(values), scale, zero_point, axis)


def _dequantize(impl, q, **kw):
    if "out" in kw and kw["out"] is not None:
        kw["out"] = to_target(kw["out"])
    with dispatch.use(dequantize=impl):
        return to_host(dispatch.dequantize(q, **kw))


def _check_exact(got, want, what):
    gv, gs, gz = got[:3]
    wv, ws, wz = want
    assert gs.dtype == np.float32 and gs.shape == ws.shape, (what, gs.shape, ws.shape)
    np.testing.assert_array_equal(gs, ws, err_msg=f"{what}: scale")
    assert gz.dtype == wz.dtype, what
    np.testing.assert_array_equal(gz, wz, err_msg=f"{what}: zero point")
    assert gv.dtype == wv.dtype and gv.shape == wv.shape, what
    if not np.array_equal(gv, wv):
        bad = np.argwhere(gv != wv)[0]
        raise AssertionError(f"{what}: {int((gv != wv).sum())} values differ, first at {tuple(bad)}: "
                             f"got {gv[tuple(bad)]}, want {wv[tuple(bad)]}")


def _draw(g, shape, dtype):
    """Normal values of mixed magnitudes (some slices 100x larger, a few exact zeros)."""
    x = g.standard_normal(shape) * np.exp(g.uniform(-3, 3, size=shape[:1] + (1,) * (len(shape) - 1)))
    x[g.random(shape) < 0.05] = 0
    return x.astype(dtype)


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("impl", QIMPLS)
def test_quantize_matches_reference(impl, case, dtype, qtype, symmetric):
    shape, axis = case
    x = _draw(rng(), shape, dtype)
    want = ref.quantize(x, dtype=qtype, axis=axis, symmetric=symmetric)
    got = _quantize(impl, x, dtype=qtype, axis=axis, symmetric=symmetric)
    _check_exact(got, want, f"{qtype} {'sym' if symmetric else 'asym'} axis={axis}")
    q = got[3]
    assert q.axis == (None if axis is None else axis % len(shape)) and q.dtype == np.dtype(qtype)
    if symmetric and qtype == "int8":
        assert got[0].min(initial=0) >= -127, "symmetric int8 never gives -128"


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", QIMPLS)
def test_ties_round_half_to_even(impl, dtype, qtype):
    """x = (k + 1/2) * scale exactly: rounded to the even neighbour, then the zero point
    added (ONNX: round first).  Static scale 0.25 and computed scale 0.5 (max|x| = 63.5)."""
    k = np.arange(-130, 130)
    x = ((k + 0.5) * 0.25).astype(dtype)
    zp = 3 if qtype == "int8" else 130
    want = ref.quantize(x, dtype=qtype, scale=0.25, zero_point=np.array(zp, qtype))
    got = _quantize(impl, x, dtype=qtype, scale=0.25, zero_point=np.array(zp, qtype))
    _check_exact(got, want, "static ties")
    inner = np.abs(k + 0.5) < 100
    np.testing.assert_array_equal(got[0][inner].astype(int) - zp, np.rint(k[inner] + 0.5).astype(int))
    assert set(np.rint(k[inner] + 0.5).astype(int) % 2) == {0}
    y = (np.append(np.arange(-127, 126) + 0.5, 127) * 0.5).astype(dtype)   # max|y| = 63.5 -> scale 0.5
    got = _quantize(impl, y, dtype=qtype)
    assert got[1] == np.float32(0.5)
    _check_exact(got, ref.quantize(y, dtype=qtype), "computed-scale ties")


def _near_half_integers(g, dtype, scales, n, kmax=140):
    """n values x per scale s whose quotients x / s lie within a few ulps of k + 1/2 (k in
    [-kmax, kmax)), each in a random position: the values on which a product x * (1 / s)
    rounds differently from the division for some s (kernels_cpu.quant.quantize_run)."""
    out = []
    for s in scales:
        k = g.integers(-kmax, kmax, size=n)
        with np.errstate(over="ignore"):   # (k + 1/2) 1e38 is inf in float32: saturated
            x = ((k + 0.5) * np.float64(s)).astype(dtype)
            for _ in range(3):   # up to 3 ulps either way
                step = g.integers(-1, 2, size=n)
                x = np.where(step > 0, np.nextafter(x, dtype(np.inf)),
                             np.where(step < 0, np.nextafter(x, dtype(-np.inf)), x))
        out.append(x.astype(dtype))
    return out


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", QIMPLS)
def test_quotients_near_half_integers(impl, dtype, qtype):
    """Quotients within a few ulps of k + 1/2 quantize exactly as the division does, with a
    static scale (scales whose reciprocal rounds either way, and scales outside the range
    where the CPU multiplies by the reciprocal), with per-row computed scales, and with a
    static scale per channel along the last axis, in runs long enough for the CPU's checked
    blocks (64 elements) and with a remainder."""
    g = rng()
    n = 200 if SMALL_SHAPES else 2000
    scales = [float(np.float32(v)) for v in (0.1, 1 / 3, 7.3e-3, 0.7, 3.3, 1e-38, 1e38, *g.uniform(1e-3, 10, 3))]
    zp = np.array(3 if qtype == "int8" else 130, qtype)
    for s, x in zip(scales, _near_half_integers(g, dtype, scales, n + 37)):
        got = _quantize(impl, x, dtype=qtype, scale=s, zero_point=zp)
        _check_exact(got, ref.quantize(x, dtype=qtype, scale=s, zero_point=zp), f"static scale {s}")
    # computed scales: with max|x| = 127 s a row's symmetric scale comes out s (checked),
    # so its quotients are the near half-integers again; asymmetric ones get other scales
    rows = np.stack(_near_half_integers(g, dtype, scales[:5], n + 37, kmax=126))
    rows[:, -1] = 127 * np.asarray(scales[:5], dtype)
    for symmetric in (True, False):
        got = _quantize(impl, rows, dtype=qtype, axis=0, symmetric=symmetric)
        want = ref.quantize(rows, dtype=qtype, axis=0, symmetric=symmetric)
        _check_exact(got, want, f"rows symmetric={symmetric}")
        if symmetric:
            assert np.sum(want[1] == np.asarray(scales[:5], np.float32)) >= 3, want[1]
    # channels along the last axis, a static scale each: 130 channels (two checked blocks
    # and a remainder), with every scale in the reciprocal's range, then with all of them
    inside = [v for v in scales if 1e-30 < v < 1e30]
    for chan in (np.resize(inside, 130), np.resize(scales, 130)):
        cols = np.stack(_near_half_integers(g, dtype, chan, 50 if SMALL_SHAPES else 300), axis=1)
        s32, z = np.asarray(chan, np.float32), np.full(130, zp, qtype)
        got = _quantize(impl, cols, dtype=qtype, axis=1, scale=s32, zero_point=z)
        _check_exact(got, ref.quantize(cols, dtype=qtype, axis=1, scale=s32, zero_point=z), "channels last")


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", QIMPLS)
def test_saturation_nan_and_inf(impl, dtype, qtype):
    """Static quantization saturates at both ends (with zero points at and near the type's
    limits), +-inf saturate, NaN gives the type's lowest value."""
    lo, hi = (-128, 127) if qtype == "int8" else (0, 255)
    x = np.array([0, 1, -1, 1e3, -1e3, 3e38, -3e38, np.inf, -np.inf, np.nan, 126.5, -127.5, 127.5, -128.5],
                 dtype)
    for zp in {lo, hi, (lo + hi) // 2, lo + 1, hi - 1}:
        z = np.array(zp, qtype)
        for s in (1.0, 1e-3, 7.5):
            want = ref.quantize(x, dtype=qtype, scale=s, zero_point=z)
            got = _quantize(impl, x, dtype=qtype, scale=s, zero_point=z)
            _check_exact(got, want, f"zp {zp} scale {s}")
            assert got[0][9] == lo and got[0][7] == hi and got[0][8] == lo


@pytest.mark.parametrize("impl", QIMPLS)
def test_per_channel_static_zero_points(impl):
    g = rng()
    x = _draw(g, (4, 9, 6), np.float32)
    for axis in (0, 1, 2):
        c = x.shape[axis]
        s = (g.random(c) * 0.05 + 0.001).astype(np.float32)
        for qtype, (lo, hi) in (("int8", (-128, 127)), ("uint8", (0, 255))):
            z = g.integers(lo, hi + 1, size=c).astype(qtype)
            want = ref.quantize(x, dtype=qtype, axis=axis, scale=s, zero_point=z)
            got = _quantize(impl, x, dtype=qtype, axis=axis, scale=s, zero_point=z)
            _check_exact(got, want, f"axis {axis} {qtype}")


@pytest.mark.parametrize("impl", QIMPLS)
def test_zero_slices_get_scale_one(impl):
    x = np.zeros((3, 8), np.float32)
    x[1] = np.linspace(-1, 2, 8)
    v, s, z, _ = _quantize(impl, x, axis=0)
    assert s[0] == 1 and s[2] == 1 and s[1] == np.float32(2 / 127)
    assert not v[0].any() and not v[2].any()
    v, s, z, _ = _quantize(impl, x, axis=0, symmetric=False, dtype="uint8")
    assert s[0] == 1 and z[0] == 0 and not v[0].any()
    v, s, z, _ = _quantize(impl, np.zeros(5, np.float64), symmetric=False)  # int8: zero point -128
    assert s == 1 and z == -128 and (v == -128).all()


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", QIMPLS)
def test_per_row_scales_of_odd_rows(impl, dtype, qtype, symmetric):
    """One scale per contiguous row (the CPU's fused row path from 64 elements): a zero
    row, rows of subnormal and of huge magnitude, one positive-only and one negative-only
    row, ties; a NaN / inf row raises naming x and its channel."""
    g = rng()
    n = 64 if SMALL_SHAPES else 300
    x = _draw(g, (7, n), dtype)
    x[0] = 0
    x[0, ::2] = -0.0                          # -0.0 is no negative value (the range bits, kernels_cpu/quant.py)
    x[1] *= np.finfo(dtype).tiny * 4          # scale raised to float32's smallest normal
    x[2] *= 1e30 if dtype == np.float32 else 1e36
    x[3] = np.abs(x[3])
    x[4] = -np.abs(x[4])
    x[5, :8] = (np.arange(8) + 0.5) * 0.25
    x[5, 8] = 127 * 0.25
    want = ref.quantize(x, dtype=qtype, axis=0, symmetric=symmetric)
    _check_exact(_quantize(impl, x, dtype=qtype, axis=0, symmetric=symmetric), want, "rows")
    for bad in (np.nan, -np.nan, np.inf, -np.inf):   # either sign: the range's two maxima catch each
        y = x.copy()
        y[6, n // 2] = bad
        with dispatch.use(quantize=impl), pytest.raises(ValueError, match=r"\bx\b.*channel 6"):
            dispatch.quantize(to_target(y), dtype=qtype, axis=0, symmetric=symmetric)
    if dtype == np.float64:
        y = x.copy()
        y[6] *= 1e300
        with dispatch.use(quantize=impl), pytest.raises(ValueError, match=r"\bx\b"):
            dispatch.quantize(to_target(y), dtype=qtype, axis=0, symmetric=symmetric)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", QIMPLS)
def test_round_trip_within_half_a_step(impl, dtype, symmetric, qtype):
    g = rng()
    shape = (4, 13) if SMALL_SHAPES else (33, 500)
    x = _draw(g, shape, dtype)
    for axis in (None, 0, 1):
        v, s, z, q = _quantize(impl, x, dtype=qtype, axis=axis, symmetric=symmetric)
        y = to_host(dispatch.dequantize(q, dtype=dtype))
        step = s if axis is None else np.expand_dims(s, tuple(a for a in range(2) if a != axis))
        err = np.abs(y.astype(np.float64) - x)
        # half a step, plus the roundings of the quotient and of the dequantized product in
        # dtype, plus the scale's own rounding to float32 (ONNX's scale type): it moves the
        # end of the 255-step range by up to 255 of its ulps, which an extreme element that
        # saturates (asymmetric: the zero point's rounding puts it at qmax + 0.5) carries in
        # full (float64 x, seed 1410394422: 0.5 + 1.6e-6 steps at a channel's maximum)
        step64 = step.astype(np.float64)
        bound = (0.5 + 255 * np.finfo(np.float32).eps) * step64 + 4 * np.finfo(dtype).eps * (np.abs(x) + step64)
        assert np.all(err <= bound), (axis, float(np.max(err / step)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("impl", DIMPLS)
def test_dequantize_exact(impl, case, qtype, dtype):
    """(q - zp) * scale rounded once to dtype, into a NaN-poisoned out= and without one."""
    shape, axis = case
    g = rng()
    lo, hi = (-128, 127) if qtype == "int8" else (0, 255)
    values = g.integers(lo, hi + 1, size=shape).astype(qtype)
    c = () if axis is None else (shape[axis],)
    scale = (np.exp(g.uniform(-12, 3, size=c))).astype(np.float32)
    zp = g.integers(lo, hi + 1, size=c).astype(qtype)
    q = _target_q(values, scale, zp, axis)
    want = ref.dequantize(QuantizedArray(values, scale, zp, axis)).astype(dtype)
    got = _dequantize(impl, q, dtype=dtype)
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_array_equal(got, want)
    out = poisoned(shape, dtype)
    with dispatch.use(dequantize=impl):
        res = dispatch.dequantize(q, dtype=dtype, out=out)
    assert res is out
    np.testing.assert_array_equal(to_host(out), want)


@pytest.mark.parametrize("impl", DIMPLS)
def test_dequantize_symmetric_default_zero_point(impl):
    values = np.array([[-128, -127, 0, 1, 127]], np.int8)
    got = _dequantize(impl, _target_q(values, np.float32(0.5)))
    np.testing.assert_array_equal(got, values.astype(np.float32) * 0.5)
    assert got.dtype == np.float32


@pytest.mark.parametrize("impl", QIMPLS)
def test_awkward_layouts(impl):
    """Non-contiguous and read-only x give the contiguous result; size-0 arrays give empty
    values with scale 1."""
    g = rng()
    x = _draw(g, (7, 30), np.float32)
    want = ref.quantize(x, axis=1, symmetric=False)
    if not ON_CUDA:  # run() and to_target copy to contiguous device arrays
        _check_exact(_quantize(impl, strided(x), axis=1, symmetric=False), want, "strided")
        _check_exact(_quantize(impl, x.T.copy().T, axis=1, symmetric=False), want, "Fortran order")
        _check_exact(_quantize(impl, read_only(x), axis=1, symmetric=False), want, "read-only")
    for shape, axis in (((0,), None), ((0, 5), 1), ((3, 0), 0)):
        v, s, z, _ = _quantize(impl, np.zeros(shape, np.float32), axis=axis)
        assert v.shape == shape and v.dtype == np.int8
        assert np.all(s == 1)


@pytest.mark.parametrize("impl", DIMPLS)
def test_dequantize_awkward_layouts(impl):
    if ON_CUDA:
        pytest.skip("host layouts")
    g = rng()
    values = g.integers(-128, 128, size=(5, 12)).astype(np.int8)
    scale = np.full(12, 0.1, np.float32)
    want = ref.dequantize(QuantizedArray(values, scale, None, 1)).astype(np.float32)
    big = np.zeros((5, 24), np.int8)
    big[:, ::2] = values
    for v in (big[:, ::2], read_only(values), np.broadcast_to(values[:1], values.shape)):
        w = ref.dequantize(QuantizedArray(np.array(v), scale, None, 1)).astype(np.float32)
        np.testing.assert_array_equal(_dequantize(impl, QuantizedArray(v, scale, None, 1)), w)
    out = np.full((12, 5), np.nan, np.float32).T     # a non-contiguous out=
    with dispatch.use(dequantize=impl):
        assert dispatch.dequantize(QuantizedArray(values, scale, None, 1), out=out) is out
    np.testing.assert_array_equal(out, want)
    assert _dequantize(impl, QuantizedArray(np.zeros((0, 3), np.int8), np.float32(1))).shape == (0, 3)


@pytest.mark.skipif(SMALL_SHAPES, reason="hypothesis draws too many shapes for the simulator")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=SEEDS, ndim=st.integers(1, 3), qtype=st.sampled_from(QTYPES), symmetric=st.booleans(),
       dtype=st.sampled_from(DTYPES), axis_pick=st.integers(-1, 2), impl=st.sampled_from(
           [p.values[0] for p in QIMPLS]))
def test_quantize_property(seed, ndim, qtype, symmetric, dtype, axis_pick, impl):
    """Random shapes, axes, scales of any magnitude: values / scale / zero point equal the
    reference; dequantize(quantize(x)) within half a step."""
    g = rng(seed)
    shape = tuple(int(s) for s in g.integers(1, 40, size=ndim))
    axis = None if axis_pick < 0 or axis_pick >= ndim else axis_pick
    x = (g.standard_normal(shape) * 10.0 ** g.uniform(-30, 30)).astype(dtype)
    if not np.all(np.isfinite(x)):
        return
    want = ref.quantize(x, dtype=qtype, axis=axis, symmetric=symmetric)
    got = _quantize(impl, x, dtype=qtype, axis=axis, symmetric=symmetric)
    _check_exact(got, want, f"{shape} axis {axis}")


def _ort():
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    return ort, onnx


def _ort_session(ort, onnx, op, in_type, shape, outputs, inits=(), **attrs):
    from onnx import helper, numpy_helper

    names = ["x"] + [n for n, _ in inits]
    node = helper.make_node(op, names, [n for n, _, _ in outputs], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", in_type, list(shape))],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              [numpy_helper.from_array(a, n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10  # onnxruntime 1.31+ rejects the IR version onnx 1.23 writes (machine-facts)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("impl", QIMPLS)
def test_onnxruntime_quantize_dequantize_agree(impl, axis, qtype):
    """Our scales and zero points given to onnxruntime's QuantizeLinear on the same float32
    x give our values (ties, NaN and saturation included); its DequantizeLinear our floats."""
    ort, onnx = _ort()
    from onnx import TensorProto

    g = rng()
    x = _draw(g, (6, 33), np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    x[1, :3] = 1e30
    tt = TensorProto.INT8 if qtype == "int8" else TensorProto.UINT8
    attrs = {} if axis is None else {"axis": axis}
    c = 1 if axis is None else x.shape[axis]
    s = (g.random(c) * 0.05 + 0.001).astype(np.float32)
    lo, hi = (-128, 127) if qtype == "int8" else (0, 255)
    z = g.integers(lo, hi + 1, size=c).astype(qtype)
    if axis is None:
        s, z = s.reshape(()), z.reshape(())
    v, gs, gz, q = _quantize(impl, x, dtype=qtype, axis=axis, scale=s, zero_point=z)
    sess = _ort_session(ort, onnx, "QuantizeLinear", TensorProto.FLOAT, x.shape, [("y", tt, list(x.shape))],
                        [("s", s), ("z", z)], **attrs)
    np.testing.assert_array_equal(v, sess.run(None, {"x": x})[0])
    # ties exactly at .5 of the scale
    xt = ((np.arange(-40, 40) + 0.5)[None, :] * np.ones((6, 1)) * (s.reshape(-1, 1) if axis == 0 else s.ravel()[0])
          ).astype(np.float32) if axis != 1 else None
    if xt is not None:
        vt = _quantize(impl, xt, dtype=qtype, axis=axis, scale=s, zero_point=z)[0]
        st_ = _ort_session(ort, onnx, "QuantizeLinear", TensorProto.FLOAT, xt.shape, [("y", tt, list(xt.shape))],
                           [("s", s), ("z", z)], **attrs)
        np.testing.assert_array_equal(vt, st_.run(None, {"x": xt})[0])
    dq = _ort_session(ort, onnx, "DequantizeLinear", tt, x.shape, [("y", TensorProto.FLOAT, list(x.shape))],
                      [("s", s), ("z", z)], **attrs)
    with dispatch.use(dequantize=[p.values[0] for p in DIMPLS][0]):
        ours = to_host(dispatch.dequantize(_target_q(v, s, z, axis)))
    np.testing.assert_array_equal(ours, dq.run(None, {"x": v})[0])


@pytest.mark.parametrize("impl", QIMPLS)
def test_onnxruntime_dynamic_quantize_agrees(impl):
    """symmetric=False, uint8, one scale: onnxruntime's DynamicQuantizeLinear (scale, zero
    point and values), on data with and without negative values, and all zeros."""
    ort, onnx = _ort()
    from onnx import TensorProto

    g = rng()
    for x in (_draw(g, (8, 50), np.float32), np.abs(_draw(g, (3, 7), np.float32)) + 0.5,
              -np.abs(_draw(g, (5,), np.float32)), np.zeros((4,), np.float32)):
        sess = _ort_session(ort, onnx, "DynamicQuantizeLinear", TensorProto.FLOAT, x.shape,
                            [("y", TensorProto.UINT8, list(x.shape)), ("s", TensorProto.FLOAT, []),
                             ("z", TensorProto.UINT8, [])])
        y, s, z = sess.run(None, {"x": x})
        v, gs, gz, _ = _quantize(impl, x, dtype="uint8", symmetric=False)
        assert gs == s and gz == z, (gs, s, gz, z)
        np.testing.assert_array_equal(v, y)


# ---- bad input ---------------------------------------------------------------------------

def _x():
    return np.ones((4, 6), np.float32)


BAD_Q = [
    (dict(dtype="int4"), ValueError, "dtype"),
    (dict(dtype="float32"), ValueError, "dtype"),
    (dict(dtype=np.int16), ValueError, "dtype"),
    (dict(dtype=["int8"]), ValueError, "dtype"),
    (dict(axis=2), ValueError, "axis"),
    (dict(axis=-3), ValueError, "axis"),
    (dict(axis=1.0), TypeError, "axis"),
    (dict(symmetric="yes"), TypeError, "symmetric"),
    (dict(scale=0.0), ValueError, "scale"),
    (dict(scale=-1.0), ValueError, "scale"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(scale=float("inf")), ValueError, "scale"),
    (dict(scale=1e300), ValueError, "scale"),
    (dict(scale="0.1"), TypeError, "scale"),
    (dict(scale=10 ** 400), TypeError, "scale"),
    (dict(scale=np.ones(3, np.float32)), ValueError, "scale"),
    (dict(scale=np.ones(4, np.float32), axis=1), ValueError, "scale"),
    (dict(scale=0.1, zero_point=np.int16(3)), TypeError, "zero_point"),
    (dict(scale=0.1, zero_point=np.array(3, np.uint8)), TypeError, "zero_point"),
    (dict(scale=0.1, zero_point=300), ValueError, "zero_point"),
    (dict(scale=0.1, zero_point=2.5), TypeError, "zero_point"),
    (dict(scale=np.full(4, 0.1), axis=0, zero_point=np.zeros(6, np.int8)), ValueError, "zero_point"),
    (dict(zero_point=np.int8(0)), ValueError, "zero_point"),
]


@pytest.mark.parametrize("kw, exc, name", BAD_Q, ids=[f"{n}-{i}" for i, (_, _, n) in enumerate(BAD_Q)])
def test_quantize_bad_arguments(kw, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        dispatch.quantize(to_target(_x()), **kw)
    with pytest.raises(exc):
        dispatch.explain("quantize", to_target(_x()), **kw)


def test_quantize_bad_x():
    for bad, exc in ((None, TypeError), ([1.0, 2.0], TypeError), (np.ones(3, np.int32), TypeError),
                     (np.ones(3, np.float16), TypeError), (np.ma.masked_array(np.ones(3, np.float32)), TypeError)):
        if ON_CUDA and isinstance(bad, np.ndarray) and bad.dtype == np.float16:
            continue
        with pytest.raises(exc, match=r"\bx\b"):
            dispatch.quantize(bad)


@pytest.mark.parametrize("impl", QIMPLS)
def test_dynamic_scale_of_nan_or_inf_raises_naming_x(impl):
    for v in (np.nan, -np.nan, np.inf, -np.inf):
        x = np.ones((3, 5), np.float32)
        x[2, 1] = v
        for kw in ({}, {"symmetric": False}, {"axis": 0}, {"axis": 1, "dtype": "uint8", "symmetric": False}):
            with dispatch.use(quantize=impl), pytest.raises(ValueError, match=r"\bx\b.*NaN or inf"):
                dispatch.quantize(to_target(x), **kw)
    big = np.array([1e300, -1.0])
    with dispatch.use(quantize=impl), pytest.raises(ValueError, match=r"\bx\b"):
        dispatch.quantize(to_target(big))


def test_dequantize_bad_arguments():
    q = _target_q(np.zeros((2, 3), np.int8), np.float32(0.5))
    with pytest.raises(TypeError, match=r"\bq\b"):
        dispatch.dequantize(np.zeros((2, 3), np.int8))
    for dt in ("int8", np.int32, "int", None, True):
        with pytest.raises(ValueError, match=r"\bdtype\b"):
            dispatch.dequantize(q, dtype=dt)
    if not ON_CUDA:
        with pytest.raises(ValueError, match=r"\bdtype\b"):
            dispatch.dequantize(q, dtype=np.float16)
    out = poisoned((2, 3), np.float64)
    with pytest.raises(TypeError, match=r"\bout\b"):
        dispatch.dequantize(q, out=out)
    with pytest.raises(ValueError, match=r"\bout\b"):
        dispatch.dequantize(q, out=poisoned((3, 2), np.float32))
    assert np.isnan(to_host(out)).all()
    if not ON_CUDA:
        ro = np.full((2, 3), np.nan, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match=r"\bout\b"):
            dispatch.dequantize(q, out=ro)


def test_quantized_array_checks_its_fields():
    """(dispatch/quantized.py) scale 0 / negative / non-finite, zero point of another
    dtype, masked or matrix fields: errors naming the field."""
    v = np.zeros((2, 3), np.int8)
    for s in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match=r"\bscale\b"):
            QuantizedArray(v, np.float32(s))
    with pytest.raises(TypeError, match=r"\bzero_point\b"):
        QuantizedArray(v, np.float32(1), np.uint8(0))
    with pytest.raises(TypeError, match=r"\bvalues\b"):
        QuantizedArray(np.ma.masked_array(v), np.float32(1))
    with pytest.raises(TypeError, match=r"\bscale\b"):
        QuantizedArray(v, np.ma.masked_array(np.ones(2, np.float32)), None, 0)


@pytest.mark.skipif(ON_CUDA, reason="result types of the host kernels")
def test_quantize_result_is_independent_of_x():
    x = _x()
    q = dispatch.quantize(x)
    x[...] = 7
    assert (q.values == 127).all()
    assert not np.shares_memory(q.values, x)


@pytest.mark.skipif(not ON_CUDA, reason="float16 arrays are CUDA-only")
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("impl", QIMPLS)
def test_float16_on_cuda(impl, symmetric):
    """float16 x quantizes with the quotient in float32 (as the reference); dequantize to
    float16 rounds the product to float32, then to float16: within one float16 ulp of the
    exact product rounded once (the double rounding differs where the float32 product lands
    on a float16 tie: 1 element of 52 in one CI run)."""
    g = rng()
    x = _draw(g, (4, 13) if SMALL_SHAPES else (6, 37), np.float16)
    for axis in (None, 0, 1):
        want = ref.quantize(x, axis=axis, symmetric=symmetric)
        got = _quantize(impl, x, axis=axis, symmetric=symmetric)
        _check_exact(got, want, f"float16 axis {axis}")
        with dispatch.use(dequantize=[p.values[0] for p in DIMPLS][0]):
            y = to_host(dispatch.dequantize(got[3], dtype=np.float16))
        host_q = QuantizedArray(got[0], got[1], got[2], got[3].axis)
        exact = ref.dequantize(host_q)
        np.testing.assert_array_equal(y, exact.astype(np.float32).astype(np.float16))  # the kernel's two roundings
        ulp = np.spacing(np.abs(exact.astype(np.float16))).astype(np.float64)
        assert np.all(np.abs(y.astype(np.float64) - exact) <= ulp), "more than one float16 ulp from the exact product"
