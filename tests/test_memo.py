"""Validated calls remembered by signature (dispatch/memo.py, Op.memo).

* Every op that opts in gives, on a remembered call with new arrays of the same signature,
  exactly the result of describe's own path (the table emptied first), and remembers the
  small example of conv2d, layer_norm, softmax, attention and linear.
* What the contract leaves out still runs describe: a value of another type (True for an
  int, 1.0 for 1), -0.0 against 0.0, the same array twice, an out= that overlaps an input
  or is read-only (a remembered out= call otherwise), a 0-d array, a PackedWeight freed and
  another made (whose id may be the old one's), a PackedWeight after the active GEMM tile
  changed, a QuantizedArray weight after the call that packed it, an out= over memory that
  an argument object holds (a QuantizedArray's values, a PackedWeight's source).
* A QuantizedArray's part of the signature is structural: matmul_int8 with a new a_q on
  every call is served by one entry, with each call's own result.
* Several Python threads calling one op at once, each with its own arrays, get their own
  results.
"""
from __future__ import annotations

import numpy as np
import pytest

import dispatch
from dispatch import memo, registry
from tests import small_inputs as S
from tests.support import assert_close, rng
from tests.test_threads import _run_threads

MEMO_OPS = sorted(n for n, op in registry.OPS.items() if op.memo and not op.updates)


def _fresh(op):
    op._described.clear()


@pytest.mark.parametrize("name", MEMO_OPS)
def test_remembered_call_equals_describe(name):
    """A call rebuilt from the table (second signature-equal call, new arrays) returns what
    the same call returns through describe: results bitwise equal."""
    op = registry.OPS[name]
    seed = int(rng().integers(2 ** 31))
    first = S.inputs(op, "small", seed=seed)
    second = S.inputs(op, "small", seed=seed + 1)
    _fresh(op)
    S.call(op, first)
    remembered = S.call(op, second)
    _fresh(op)
    try:
        op.memo = False
        direct = S.call(op, second)
    finally:
        op.memo = True
    assert S.same(remembered, direct), f"{name}: the remembered call's result differs from describe's"
    if not S.has_out(op) or not isinstance(direct, np.ndarray):
        return
    # out= is part of the signature: a remembered call writes the new out
    _fresh(op)
    S.call(op, first, out=np.full(direct.shape, np.nan, direct.dtype))
    out = np.full(direct.shape, np.nan, direct.dtype)
    got = S.call(op, second, out=out)
    assert got is out and S.same(out, direct), f"{name}: the remembered out= call differs from describe's"


@pytest.mark.parametrize("name", ["conv2d", "layer_norm", "softmax", "attention", "linear"])
def test_small_calls_are_remembered(name):
    op = registry.OPS[name]
    _fresh(op)
    S.call(op, S.inputs(op, "small", seed=int(rng().integers(2 ** 31))))
    assert any(isinstance(t, memo.Template) for t in op._described.values()), f"{name}: nothing remembered"


def test_other_types_and_signed_zero_are_other_signatures():
    a = np.ones((2, 3), np.float32)
    sig = memo.signature
    assert sig((a, 1), {})[0] != sig((a, True), {})[0] != sig((a, 1.0), {})[0]
    assert sig((a,), {"s": 0.0})[0] != sig((a,), {"s": -0.0})[0]
    assert sig((a, np.float32(0.0)), {})[0] != sig((a, np.float32(-0.0)), {})[0]
    assert sig((a, [1, 2]), {})[0] != sig((a, (1, 2)), {})[0]
    assert sig((a, a), {}) is None  # the same array twice
    assert sig((np.array(2.0),), {}) is None  # 0-d
    assert sig((object(),), {}) is None
    assert sig((a[:, ::2],), {})[0] != sig((np.ones((2, 2), np.float32),), {})[0]  # strides


def test_a_bool_after_an_int_still_raises():
    g = rng()
    x = g.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = g.standard_normal((3, 2, 3, 3)).astype(np.float32)
    dispatch.conv2d(x, w, stride=1)
    with pytest.raises(TypeError, match="stride"):
        dispatch.conv2d(x, w, stride=True)


def test_same_array_twice_and_out_run_describe():
    g = rng()
    q, k, v = (g.standard_normal((1, 2, 5, 8)).astype(np.float32) for _ in range(3))
    dispatch.attention(q, k, v)
    got = dispatch.attention(q, q, q)
    op = registry.OPS["attention"]
    _fresh(op)
    assert S.same(got, dispatch.attention(q, q, q))
    x = g.standard_normal((4, 16)).astype(np.float32)
    dispatch.layer_norm(x)
    with pytest.raises(ValueError, match="overlaps"):
        dispatch.layer_norm(x, out=x)
    # out= views of one buffer, same signature: remembered while apart, refused when they overlap
    big = g.standard_normal((4, 48)).astype(np.float32)
    keep = big.copy()
    dispatch.layer_norm(big[:, :16], out=big[:, 32:])
    want = dispatch.layer_norm(big[:, :16])
    out = big[:, 8:24]
    before = big.copy()
    with pytest.raises(ValueError, match="overlaps"):
        dispatch.layer_norm(big[:, :16], out=out)
    assert S.same(big, before), "a refused out= was written"
    fresh = np.empty((4, 16), np.float32)
    assert S.same(dispatch.layer_norm(keep[:, :16]), dispatch.layer_norm(keep[:, :16], out=fresh))
    assert S.same(want, dispatch.layer_norm(big[:, :16]))
    ro = np.empty((4, 16), np.float32)
    dispatch.layer_norm(x, out=ro)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        dispatch.layer_norm(x, out=ro)


def test_packed_weight_freed_then_another():
    """A new PackedWeight (possibly at a freed one's id) is never served the old one's panels."""
    g = rng()
    x = g.standard_normal((3, 32)).astype(np.float32)
    for _ in range(4):
        w = g.standard_normal((24, 32)).astype(np.float32)
        pw = dispatch.prepack(w, op="linear")
        assert_close(dispatch.linear(x, pw), x.astype(np.float64) @ w.T.astype(np.float64), 1e-5, "prepacked",
                     cancel=True)
        # the table's template is the current object's, whether or not its id is a freed one's
        # (templates of other tests' calls may hold a structural memo object: no reference)
        assert any(isinstance(t, memo.Template) and t.refs and t.refs[0] is not None and t.refs[0]() is pw
                   for t in registry.OPS["linear"]._described.values())
        del pw


def test_quantized_weight_remembered_with_its_packing():
    """dynamic_quant_linear remembers a call by its QuantizedArray weight's structure and
    cached layouts: after the call that packs the weight the signature is described again
    (key and note then say prepacked), then remembered; a new weight of the same shape is
    described as not packed yet (its own first call packs it), and never served another's
    panels (the run takes them from the weight it is given)."""
    op = registry.OPS["dynamic_quant_linear"]
    g = rng()
    x = g.standard_normal((1, 64)).astype(np.float32)
    _fresh(op)
    for _ in range(4):
        w_q = dispatch.quantize(g.standard_normal((24, 64)).astype(np.float32), axis=0)
        first = memo.described(op._described, op.describe, (x, w_q), {})
        assert not first.key.prepacked and "packed on this call" in first.prep_notes[0]
        got = dispatch.dynamic_quant_linear(x, w_q)  # the remembered call; it packs w_q
        second = memo.described(op._described, op.describe, (x, w_q), {})
        assert second.key.prepacked and "prepacked" in second.prep_notes[0]
        assert memo.described(op._described, op.describe, (x, w_q), {}).key == second.key
        entry = op._described[memo.signature((x, w_q), {})[0]]
        assert isinstance(entry, memo.Template)
        try:
            op.memo = False
            assert S.same(got, dispatch.dynamic_quant_linear(x, w_q)), "the remembered call's result differs"
        finally:
            op.memo = True
        del w_q, first, second


@pytest.mark.parametrize("fmt", ["int8-tensor", "int8-asym"])
def test_linear_with_a_quantized_weight_remembered(fmt):
    """linear with a QuantizedArray weight (weight-only int8, remembered by the weight's
    identity and cached layouts): calls after the first give describe's bits, for new x
    arrays and out=, and a new weight of the same shape is never served another's."""
    from tests.test_weight_only import make_weight
    op = registry.OPS["linear"]
    g = rng()
    _fresh(op)
    for _ in range(2):
        w = make_weight(g, (24, 40), fmt)
        bias = g.standard_normal(24).astype(np.float32)
        for _ in range(3):
            x = g.standard_normal((5, 40)).astype(np.float32)
            got = dispatch.linear(x, w, bias, activation="gelu")
            out = dispatch.linear(x, w, bias, activation="gelu", out=np.full((5, 24), np.nan, np.float32))
            try:
                op.memo = False
                want = dispatch.linear(x, w, bias, activation="gelu")
            finally:
                op.memo = True
            assert S.same(got, want) and S.same(out, want), f"{fmt}: the remembered call's result differs"
        del w


def test_packed_weight_after_the_tile_changed_is_refused():
    from kernels_cpu import gemm as K
    g = rng()
    x = g.standard_normal((3, 32)).astype(np.float32)
    prev = K.use_tile("6x16")
    try:
        pw = dispatch.prepack(g.standard_normal((24, 32)).astype(np.float32), op="linear")
        dispatch.linear(x, pw)
        K.use_tile("8x48")
        with pytest.raises(ValueError, match="packed for the 6x16 GEMM tile"):
            dispatch.linear(x, pw)
    finally:
        K.use_tile(prev)


def test_threads_each_get_their_own_result():
    """Four threads, one signature, each its own array: each gets its own array's result
    (a template shared by the threads takes each call's arrays)."""
    g = rng()
    xs = [g.standard_normal((16, 64)).astype(np.float32) for _ in range(4)]
    want = [dispatch.layer_norm(x) for x in xs]

    def work(i):
        for _ in range(50):
            assert S.same(dispatch.layer_norm(xs[i]), want[i]), f"thread {i}: another thread's result"

    _run_threads(4, work)


def test_table_is_bounded():
    op = registry.OPS["softmax"]
    _fresh(op)
    for n in range(1, memo.MAX_ENTRIES + 10):
        dispatch.softmax(np.ones((1, n), np.float32))
    assert len(op._described) <= memo.MAX_ENTRIES


def test_quantize_checks_a_static_scale_on_every_call():
    """quantize is remembered, but a static scale is an array describe derives (float32,
    (C,)), so that signature is never remembered and every scale's values are checked: a
    zero scale after good ones of the same shape and dtype still raises, naming scale."""
    x = np.ones((4, 3), np.float32)
    good = np.full(3, 0.5, np.float32)
    bad = np.array([0.5, 0.0, 0.5], np.float32)
    zp = np.zeros(3, np.int8)
    _fresh(registry.OPS["quantize"])
    for _ in range(3):
        q = dispatch.quantize(x, axis=1, scale=good, zero_point=zp)
        assert np.array_equal(q.values, np.full((4, 3), 2, np.int8))
    assert list(registry.OPS["quantize"]._described.values()) == [memo._NOT_REMEMBERED]
    with pytest.raises(ValueError, match="scale must be positive"):
        dispatch.quantize(x, axis=1, scale=bad, zero_point=zp)


def test_quantize_per_tensor_numbers_remembered_per_value():
    """A per-tensor static scale and zero point given as numbers are kept as numbers
    (quantize._scalar_params), so the call is remembered; each value is its own signature:
    a call with another scale never gets a remembered one's, every result equals the same
    scale given as arrays, and a bad number after good ones still raises naming it."""
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    op = registry.OPS["quantize"]
    _fresh(op)
    for _ in range(2):
        for s, z in ((0.5, 3), (np.float32(0.25), np.uint8(7)), (0.125, None)):
            got = dispatch.quantize(x, dtype="uint8", scale=s, zero_point=z)
            want = dispatch.quantize(x, dtype="uint8", scale=np.array([s], np.float32),
                                     zero_point=np.array([0 if z is None else z], np.uint8))
            assert np.array_equal(got.values, want.values), (s, z)
            assert got.scale.shape == () and got.scale == np.float32(s) and got.zero_point == (z or 0)
    assert sum(isinstance(t, memo.Template) for t in op._described.values()) == 3
    for bad in (0.0, -0.5, float("nan"), 1e39):
        with pytest.raises(ValueError, match="scale"):
            dispatch.quantize(x, dtype="uint8", scale=bad, zero_point=3)
    with pytest.raises(ValueError, match="zero_point"):
        dispatch.quantize(x, dtype="uint8", scale=0.5, zero_point=256)


def test_matmul_int8_remembered_for_a_new_activation_each_call():
    """matmul_int8's a_q is a new QuantizedArray on every decode step: one entry serves
    them all (a QuantizedArray's signature part is structural), and each call's result is
    its own a_q's, as describe's path gives it; a b_q of the same shape that is not packed
    yet is described as such."""
    op = registry.OPS["matmul_int8"]
    g = rng()
    b_q = dispatch.quantize(g.standard_normal((64, 40)).astype(np.float32), axis=1)
    _fresh(op)
    dispatch.matmul_int8(dispatch.quantize(g.standard_normal((3, 64)).astype(np.float32), axis=0), b_q)  # packs b_q
    for _ in range(3):
        a_q = dispatch.quantize(g.standard_normal((3, 64)).astype(np.float32), axis=0)
        got = dispatch.matmul_int8(a_q, b_q)
        try:
            op.memo = False
            want = dispatch.matmul_int8(a_q, b_q)
        finally:
            op.memo = True
        assert S.same(got, want), "the remembered call's result differs from describe's"
    assert sum(isinstance(t, memo.Template) for t in op._described.values()) == 2  # before / after b_q's packing
    other = dispatch.quantize(g.standard_normal((64, 40)).astype(np.float32), axis=1)
    call = memo.described(op._described, op.describe, (a_q, other), {})
    assert not call.key.prepacked and "packed on this call" in call.prep_notes[0]


@pytest.mark.parametrize("case", ["dequantize", "matmul_int8 a_q", "linear int8 weight", "linear prepacked"])
def test_out_over_memory_an_argument_object_holds_is_refused(case):
    """out= overlapping the caller's memory inside an argument object (a QuantizedArray's
    values, a PackedWeight's source weight) raises as describe does, also after a call of
    the same signature was remembered, and nothing is written."""
    g = rng()
    if case == "dequantize":
        raw = np.zeros(64, np.uint8)
        vals = raw[:16].view(np.int8).reshape(4, 4)
        q = dispatch.QuantizedArray(vals, np.float32(0.5))
        call = lambda out: dispatch.dequantize(q, out=out)  # noqa: E731
        buf = raw
        clear = np.empty((4, 4), np.float32)
        bad = raw.view(np.float32).reshape(4, 4)  # its first 16 bytes are the values
    elif case == "matmul_int8 a_q":
        raw = np.zeros(4 * 8 * 4, np.uint8)
        a_q = dispatch.QuantizedArray(raw[:4 * 8].view(np.int8).reshape(4, 8), np.float32(0.1))
        b_q = dispatch.quantize(g.standard_normal((8, 8)).astype(np.float32), axis=1)
        call = lambda out: dispatch.matmul_int8(a_q, b_q, out=out)  # noqa: E731
        buf = raw
        clear = np.empty((4, 8), np.float32)
        bad = raw.view(np.float32).reshape(4, 8)
    elif case == "linear int8 weight":
        raw = np.zeros(8 * 8 * 4, np.uint8)
        w = dispatch.QuantizedArray(raw[:64].view(np.int8).reshape(8, 8), np.full(8, 0.1, np.float32), axis=0)
        x = g.standard_normal((8, 8)).astype(np.float32)
        call = lambda out: dispatch.linear(x, w, out=out)  # noqa: E731
        buf = raw
        clear = np.empty((8, 8), np.float32)
        bad = raw.view(np.float32).reshape(8, 8)
    else:
        src = g.standard_normal((24, 32)).astype(np.float32)
        pw = dispatch.prepack(src, op="linear")
        x = g.standard_normal((32, 32)).astype(np.float32)
        call = lambda out: dispatch.linear(x, pw, out=out)  # noqa: E731
        buf = src
        clear = np.empty((32, 24), np.float32)
        bad = src.reshape(32, 24)
    call(clear)
    call(np.empty_like(clear))     # remembered now
    before = buf.copy()
    with pytest.raises(ValueError, match="overlaps"):
        call(bad)
    assert np.array_equal(buf, before), f"{case}: a refused out= was written"
