"""dispatch.attention against the float64 reference, for every implementation the
dispatcher can pick, plus property tests (causal prefix, GQA = repeated MHA, decode step
by step = causal prefill) and bad-input tests."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dispatch
from tests.reference import attention as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, SEEDS, assert_close, assert_no_new_specialization, broadcast_rows,
                           impl_params, poisoned, randn, read_only, reduction_tol, rng, run)

IMPLS = impl_params("attention", dtype=np.float32)
DTYPES = [np.float32, np.float64]

# (B, Hq, Hkv, Sq, Skv, D, causal)
FULL = [
    (1, 1, 1, 1, 1, 1, False),
    (2, 3, 3, 5, 9, 1, True),           # D = 1, Sq < Skv causal
    (1, 4, 1, 1, 300, 8, True),         # MQA decode, Skv not a multiple of tiles
    (2, 8, 2, 7, 77, 64, False),        # GQA 4
    (1, 8, 1, 70, 133, 80, True),       # GQA 8, D = 80, Sq < Skv, several tiles
    (1, 2, 2, 130, 130, 128, True),     # square causal over tile edges
    (1, 2, 1, 40, 20, 64, True),        # Sq > Skv: the first rows see nothing -> zeros
    (2, 2, 2, 3, 600, 64, False),       # decode-like, several KV splits
    (1, 1, 1, 65, 65, 8, False),
    (1, 3, 1, 66, 1100, 16, True),      # GQA 3, keys past the CPU's one-tile limit (ONE_TILE): several tiles
]
SMALL = [
    (1, 1, 1, 1, 1, 1, False),
    (1, 2, 1, 3, 7, 8, True),
    (1, 4, 2, 5, 13, 4, False),
    (2, 2, 2, 6, 6, 3, True),
]
SHAPES = SMALL if SMALL_SHAPES else FULL


def _qkv(g, B, Hq, Hkv, Sq, Skv, D, dtype):
    return (randn(g, (B, Hq, Sq, D), dtype), randn(g, (B, Hkv, Skv, D), dtype),
            randn(g, (B, Hkv, Skv, D), dtype))


def _tol(dtype, Skv):
    return reduction_tol(dtype, max(Skv, 1))


def _sid(s):
    return "B{}Hq{}Hkv{}Sq{}Skv{}D{}{}".format(*s[:6], "c" if s[6] else "")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_sid)
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, shape, dtype):
    B, Hq, Hkv, Sq, Skv, D, causal = shape
    if ON_CUDA and dtype == np.float64 and D > 64:
        pytest.skip("CUDA refuses float64 with D > 64 (86 KB of shared memory): test_wide_float64_heads_are_refused_on_cuda")
    g = rng()
    q, k, v = _qkv(g, B, Hq, Hkv, Sq, Skv, D, dtype)
    q *= 2  # sharper softmax than unit scores
    out = poisoned((B, Hq, Sq, D), dtype)
    got = run(impl, dispatch.attention, q, k, v, causal=causal, out=out)
    assert_close(got, ref.attention(q, k, v, causal=causal), _tol(dtype, Skv), f"{impl} {shape}", cancel=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_scale_and_no_out(impl, dtype):
    g = rng()
    q, k, v = _qkv(g, 1, 4, 2, 9, 21, 16, dtype)
    got = run(impl, dispatch.attention, q, k, v, scale=0.3)
    assert_close(got, ref.attention(q, k, v, scale=0.3), _tol(dtype, 21), cancel=True)


MASK_SHAPES = ["skv", "sq_skv", "b1_sq_skv"]


def _mask(g, kind, mshape, B, Sq, Skv, dtype):
    full = {"skv": (Skv,), "sq_skv": (Sq, Skv), "b1_sq_skv": (B, 1, Sq, Skv)}[mshape]
    if kind == "bool":
        return g.random(full) < 0.7
    m = randn(g, full, dtype)
    m[g.random(full) < 0.3] = -np.inf
    return m


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["bool", "add"])
@pytest.mark.parametrize("mshape", MASK_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_masks(impl, dtype, mshape, kind, causal):
    B, Hq, Hkv, Sq, Skv, D = (1, 2, 1, 3, 11, 8) if SMALL_SHAPES else (2, 4, 2, 37, 150, 64)
    g = rng()
    q, k, v = _qkv(g, B, Hq, Hkv, Sq, Skv, D, dtype)
    mask = _mask(g, kind, mshape, B, Sq, Skv, dtype)
    out = poisoned((B, Hq, Sq, D), dtype)
    got = run(impl, dispatch.attention, q, k, v, causal=causal, mask=mask, out=out)
    assert np.all(np.isfinite(got))
    assert_close(got, ref.attention(q, k, v, causal=causal, mask=mask), _tol(dtype, Skv), f"{impl} {mshape} {kind}",
                 cancel=True)


@pytest.mark.parametrize("kind", ["bool", "add"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_fully_masked_rows_are_zero(impl, dtype, kind):
    B, Hq, Hkv, Sq, Skv, D = (1, 2, 1, 4, 9, 8) if SMALL_SHAPES else (1, 4, 2, 6, 140, 64)
    g = rng()
    q, k, v = _qkv(g, B, Hq, Hkv, Sq, Skv, D, dtype)
    if kind == "bool":
        mask = g.random((B, Hq, Sq, Skv)) < 0.5
        mask[:, :, 1] = False
        mask[0, 1, 3] = False
    else:
        mask = randn(g, (B, Hq, Sq, Skv), dtype)
        mask[:, :, 1] = -np.inf
        mask[0, 1, 3] = -np.inf
    out = poisoned((B, Hq, Sq, D), dtype)
    got = run(impl, dispatch.attention, q, k, v, mask=mask, out=out)
    assert np.all(got[:, :, 1] == 0) and np.all(got[0, 1, 3] == 0)
    assert_close(got, ref.attention(q, k, v, mask=mask), _tol(dtype, Skv), cancel=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_empty_kv_gives_zeros(impl, dtype):
    g = rng()
    q, k, v = _qkv(g, 1, 2, 1, 3, 0, 8, dtype)
    got = run(impl, dispatch.attention, q, k, v, out=poisoned((1, 2, 3, 8), dtype))
    assert np.all(got == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs(impl, dtype):
    """q, k, v as views of the (B, S, H, D) layout, and a strided mask."""
    B, Hq, Hkv, Sq, Skv, D = (1, 2, 1, 3, 7, 8) if SMALL_SHAPES else (2, 8, 2, 33, 90, 64)
    g = rng()
    q = randn(g, (B, Sq, Hq, D), dtype).transpose(0, 2, 1, 3)
    k = randn(g, (B, Skv, Hkv, D), dtype).transpose(0, 2, 1, 3)
    v = randn(g, (B, Skv, Hkv, 2 * D), dtype).transpose(0, 2, 1, 3)[..., ::2]
    mask = (g.random((Sq, 2 * Skv)) < 0.8)[:, ::2]
    got = run(impl, dispatch.attention, q, k, v, causal=True, mask=mask, out=poisoned((B, Hq, Sq, D), dtype))
    assert_close(got, ref.attention(q, k, v, causal=True, mask=mask), _tol(dtype, Skv), cancel=True)


@pytest.mark.parametrize("D", [64, 24])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_fused_qkv_views(impl, dtype, D):
    """q, k, v as the transposed views of one fused QKV projection, as a transformer
    layer makes them: qkv (B, S, 3, H, D)[:, :, i].transpose(0, 2, 1, 3) (rows contiguous,
    v's row stride 3 H D, not D).  The CPU kernels read them in place; D = 24 is not a
    multiple of the 16-column micro-kernel (the P V tail loop)."""
    B, H, S = (1, 2, 5) if SMALL_SHAPES else (2, 3, 70)
    g = rng()
    qkv = randn(g, (B, S, 3, H, D), dtype)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    mask = g.random((B, 1, 1, S)) < 0.9
    for kw in ({"causal": True}, {"mask": mask}):
        got = run(impl, dispatch.attention, q, k, v, out=poisoned((B, H, S, D), dtype), **kw)
        assert_close(got, ref.attention(q, k, v, **kw), _tol(dtype, S), f"{impl} {kw}", cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
@pytest.mark.parametrize("dtype", DTYPES)
def test_v_off_cache_lines_gives_the_same_bits(dtype, monkeypatch):
    """cpu-flash copies a V whose adjacent rows start off cache lines (kernels_cpu.attention
    flash: V_OFF_LINES) and reads one on lines in place: the same bits either way, causal
    and not, over several key tiles; the copy is taken only for the V off lines."""
    from kernels_cpu import attention as KA
    from kernels_common.memory import aligned_empty
    g = rng()
    B, H, S, D = 1, 3, 2 * KA.BK + 5, 16
    q, k, v = (randn(g, (B, H, S, D), dtype) for _ in range(3))
    on = aligned_empty((B, H, S, D), dtype)
    off = aligned_empty(v.size + 1, dtype)[1:].reshape(v.shape)
    on[...], off[...] = v, v
    flags = []
    workers, serial = KA.run_workers, KA.run_serial
    monkeypatch.setattr(KA, "run_workers", lambda fn, p, n: flags.append(int(p[KA.F_VROWS])) or workers(fn, p, n))
    monkeypatch.setattr(KA, "run_serial", lambda fn, p: flags.append(int(p[KA.F_VROWS])) or serial(fn, p))
    for causal in (False, True):
        with dispatch.use(attention="cpu-flash"):
            a = dispatch.attention(q, k, on, causal=causal, out=poisoned(q.shape, dtype))
            b = dispatch.attention(q, k, off, causal=causal, out=poisoned(q.shape, dtype))
        np.testing.assert_array_equal(a, b)
        assert_close(a, ref.attention(q, k, v, causal=causal), _tol(dtype, S), cancel=True)
    assert flags == [0, 1, 0, 1], flags


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
def test_fused_qkv_views_are_not_copied(monkeypatch):
    """The views reach the kernel as they are (no np.ascontiguousarray on the way)."""
    from dispatch.ops import attention as A

    seen = []
    real = A.rows_input
    monkeypatch.setattr(A, "rows_input", lambda x: seen.append(real(x)) or seen[-1])
    g = rng()
    qkv = randn(g, (1, 20, 3, 2, 16), np.float32)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    dispatch.attention(q, k, v)
    assert [np.shares_memory(a, qkv) for a in seen] == [True] * 3


@pytest.mark.skipif(ON_CUDA, reason="a strided view of a host buffer as out=: the CPU target")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_out_view_written_in_place(impl, dtype):
    """out= as the (B, H, S, D) transposed view of a (B, S, H, D) buffer (what the next
    projection reads as (B*S, H*D)): on the CPU the kernel writes the view itself, rows
    of other views are untouched; GQA and a decode shape (split-KV) too."""
    g = rng()
    for B, Hq, Hkv, Sq, Skv, D in ((2, 4, 2, 9, 70, 16), (1, 4, 1, 1, 300, 24)):
        q, k, v = _qkv(g, B, Hq, Hkv, Sq, Skv, D, dtype)
        buf = poisoned((B, Sq, Hq + 1, D), dtype)  # one extra head: a row the kernel must not write
        out = buf[:, :, :Hq].transpose(0, 2, 1, 3)
        got = run(impl, dispatch.attention, q, k, v, out=out, causal=True)
        assert got is out
        assert_close(got, ref.attention(q, k, v, causal=True), _tol(dtype, Skv), f"{impl}", cancel=True)
        assert np.isnan(buf[:, :, Hq]).all()


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
def test_out_view_is_not_a_copy(monkeypatch):
    """The transposed out= view reaches the kernel as it is; an overlapping view does not."""
    from dispatch.ops import _common
    from dispatch.ops import attention as A

    seen = []
    real = _common.result_buffer
    monkeypatch.setattr(A, "result_buffer", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])
    g = rng()
    q, k, v = _qkv(g, 1, 2, 2, 20, 20, 16, np.float32)
    out = np.empty((1, 20, 2, 16), np.float32).transpose(0, 2, 1, 3)
    dispatch.attention(q, k, v, out=out)
    assert seen[-1] is out
    assert not _common._no_self_overlap(np.lib.stride_tricks.as_strided(out, strides=(0, 64, 32, 4)))
    assert _common._no_self_overlap(out)


@pytest.mark.skipif(ON_CUDA, reason="CPU shape rule")
def test_default_dispatch_decode_and_prefill():
    g = rng()
    for shape in [(1, 4, 2, 1, 300, 64), (1, 2, 2, 100, 100, 64), (1, 2, 1, 3, 5, 8)]:
        q, k, v = _qkv(g, *shape, np.float32)
        got = dispatch.attention(q, k, v, causal=True)
        assert_close(got, ref.attention(q, k, v, causal=True), _tol(np.float32, shape[4]), cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="read-only host arrays: the CPU target")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_read_only_and_broadcast_inputs(impl, dtype):
    """Read-only q, k, v and mask; k and v broadcast over the batch and heads
    (np.broadcast_to), a mask broadcast over the query rows."""
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 9, 70, 16
    g = rng()
    q, k, v = _qkv(g, B, Hq, Hkv, Sq, Skv, D, dtype)
    mask = g.random((Sq, Skv)) < 0.8
    kb = np.broadcast_to(k[:1, :1], k.shape)
    vb = np.broadcast_to(v[:1, :1], v.shape)
    for qq, kk, vv, mm, what in [(read_only(q), read_only(k), read_only(v), read_only(mask), "read-only"),
                                 (q, kb, vb, None, "broadcast k, v"),
                                 (broadcast_rows(q), k, v, broadcast_rows(mask), "broadcast q, mask")]:
        got = run(impl, dispatch.attention, qq, kk, vv, causal=True, mask=mm, out=poisoned(q.shape, dtype))
        want = ref.attention(np.array(qq), np.array(kk), np.array(vv), causal=True,
                             mask=None if mm is None else np.array(mm))
        assert_close(got, want, _tol(dtype, Skv), f"{impl} {what}", cancel=True)


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
@pytest.mark.parametrize("impl", IMPLS)
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    """Read-only and broadcast inputs run the machine code compiled for writeable arrays:
    no new specialization of any attention kernel, no warning."""
    from kernels_cpu import attention as K

    g = rng()
    q, k, v = _qkv(g, 1, 2, 1, 3, 40, 8, np.float32)
    mask = g.random((3, 40)) < 0.8
    run(impl, dispatch.attention, q, k, v, causal=True)
    run(impl, dispatch.attention, q, k, v, mask=mask)

    def variants():
        run(impl, dispatch.attention, read_only(q), read_only(k), read_only(v), causal=True)
        run(impl, dispatch.attention, q, np.broadcast_to(k, k.shape), broadcast_rows(v), mask=read_only(mask))

    assert_no_new_specialization([K], variants, impl)


# ---- properties ------------------------------------------------------------------

_dims = st.tuples(
    st.integers(1, 2),            # B
    st.sampled_from([1, 2, 4]),   # Hkv
    st.sampled_from([1, 4, 8]),   # G
    st.integers(1, 6 if SMALL_SHAPES else 70),   # Sq
    st.integers(0, 6 if SMALL_SHAPES else 70),   # extra keys beyond Sq
    # D (float64 draws: CUDA refuses float64 with D > 64, test_wide_float64_heads_are_refused_on_cuda)
    st.sampled_from([1, 8] if SMALL_SHAPES else [1, 8, 64] if ON_CUDA else [1, 8, 64, 80]),
)
_examples = settings(max_examples=4 if SMALL_SHAPES else 12, deadline=None)


@pytest.mark.parametrize("impl", IMPLS)
@_examples
@given(dims=_dims, data=st.data())
def test_causal_prefix_does_not_see_the_future(impl, dims, data):
    B, Hkv, G, Sq, extra, D = dims
    if SMALL_SHAPES:
        Hkv, G = 1, min(G, 2)
    Skv = Sq + extra
    g = rng(data.draw(SEEDS, label="seed"))
    q, k, v = _qkv(g, B, Hkv * G, Hkv, Sq, Skv, D, np.float64)
    t = data.draw(st.integers(1, Sq), label="t")
    o1 = run(impl, dispatch.attention, q, k, v, causal=True)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    q2[:, :, t:] = randn(g, q2[:, :, t:].shape, np.float64)
    last = t + Skv - Sq  # keys the first t queries may see: j < last
    k2[:, :, last:] = randn(g, k2[:, :, last:].shape, np.float64)
    v2[:, :, last:] = randn(g, v2[:, :, last:].shape, np.float64)
    o2 = run(impl, dispatch.attention, q2, k2, v2, causal=True)
    assert_close(o2[:, :, :t], o1[:, :, :t], 1e-12, "prefix changed", cancel=True)


@pytest.mark.parametrize("impl", IMPLS)
@_examples
@given(dims=_dims, causal=st.booleans(), seed=SEEDS)
def test_gqa_equals_mha_with_repeated_kv(impl, dims, causal, seed):
    B, Hkv, G, Sq, extra, D = dims
    if SMALL_SHAPES:
        Hkv, G = 1, min(G, 2)
    Skv = Sq + extra
    g = rng(seed)
    q, k, v = _qkv(g, B, Hkv * G, Hkv, Sq, Skv, D, np.float64)
    gqa = run(impl, dispatch.attention, q, k, v, causal=causal)
    mha = run(impl, dispatch.attention, q, np.repeat(k, G, axis=1), np.repeat(v, G, axis=1), causal=causal)
    assert_close(gqa, mha, 1e-12, cancel=True)


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=3 if SMALL_SHAPES else 8, deadline=None)
@given(dims=_dims, seed=SEEDS)
def test_decode_steps_equal_causal_prefill(impl, dims, seed):
    B, Hkv, G, Sq, extra, D = dims
    if SMALL_SHAPES:
        Hkv, G, Sq = 1, min(G, 2), min(Sq, 3)
    Sq = min(Sq, 24)  # one call per step
    Skv = Sq + extra
    g = rng(seed)
    q, k, v = _qkv(g, B, Hkv * G, Hkv, Sq, Skv, D, np.float64)
    full = run(impl, dispatch.attention, q, k, v, causal=True)
    for i in range(Sq):
        n = Skv - Sq + i + 1  # cache length after appending token i
        step = run(impl, dispatch.attention, q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n], causal=True)
        assert_close(step[:, :, 0], full[:, :, i], 1e-12, f"step {i}", cancel=True)


# ---- bad input -------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="validation is device-agnostic; tested on the CPU")


def _ok(dtype=np.float32):
    g = rng()
    return _qkv(g, 2, 4, 2, 5, 7, 8, dtype)


@cpu_only
@pytest.mark.parametrize("change, err, match", [
    (lambda q, k, v: (q[0], k, v, {}), ValueError, "q must have 4 dimensions"),
    (lambda q, k, v: (q, k[0], v, {}), ValueError, "k must have 4 dimensions"),
    (lambda q, k, v: (q, k, v[..., 0], {}), ValueError, "v must have 4 dimensions"),
    (lambda q, k, v: (q, k[..., :4], v[..., :4], {}), ValueError, "k must have head dim 8"),
    (lambda q, k, v: (q, k, v[:, :, :6], {}), ValueError, "v must have the shape of k"),
    (lambda q, k, v: (q, k, v[..., :4], {}), ValueError, "v must have the shape of k"),
    (lambda q, k, v: (q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1), {}), ValueError, "must divide q's 4 heads"),
    (lambda q, k, v: (q, k[:1], v[:1], {}), ValueError, "k must have batch size 2"),
    (lambda q, k, v: (q, k.astype(np.float64), v, {}), TypeError, "k must have the same dtype as q"),
    (lambda q, k, v: (q, k, v.astype(np.float64), {}), TypeError, "v must have the same dtype as q"),
    (lambda q, k, v: (q.astype(np.int32), k, v, {}), TypeError, "q must have dtype float32 or float64"),
    (lambda q, k, v: (q, k, v, {"mask": np.ones((5, 6), bool)}), ValueError, "mask of shape"),
    (lambda q, k, v: (q, k, v, {"mask": np.ones((3, 2, 4, 5, 7), bool)}), ValueError, "mask of shape"),
    (lambda q, k, v: (q, k, v, {"mask": np.ones(7, np.float64)}), TypeError, "mask must have dtype bool or float32"),
    (lambda q, k, v: (q, k, v, {"mask": np.ones(7, np.int8)}), TypeError, "mask must have dtype bool or float32"),
    (lambda q, k, v: (q, k, v, {"scale": float("nan")}), ValueError, "scale must be a finite"),
    (lambda q, k, v: (q, k, v, {"scale": float("inf")}), ValueError, "scale must be a finite"),
    (lambda q, k, v: (q, k, v, {"scale": "big"}), TypeError, "scale must be a real number"),
    (lambda q, k, v: (q, k, v, {"causal": 1}), TypeError, "causal must be a bool"),
    (lambda q, k, v: ([[1.0]], k, v, {}), TypeError, "q must be a numpy array"),
])
def test_bad_input_rejected_out_untouched(change, err, match):
    q, k, v = _ok()
    q, k, v, kw = change(q, k, v)
    out = np.full((2, 4, 5, 8), 7.0, np.float32)
    with pytest.raises(err, match=match):
        dispatch.attention(q, k, v, out=out, **kw)
    assert np.all(out == 7.0)


@cpu_only
@pytest.mark.parametrize("bad_out, err, match", [
    (np.zeros((2, 4, 5, 7), np.float32), ValueError, "out must have shape"),
    (np.zeros((2, 4, 5, 8), np.float64), TypeError, "out must have dtype"),
])
def test_bad_out_rejected_and_untouched(bad_out, err, match):
    q, k, v = _ok()
    before = bad_out.copy()
    with pytest.raises(err, match=match):
        dispatch.attention(q, k, v, out=bad_out)
    assert np.array_equal(bad_out, before)


@cpu_only
@pytest.mark.parametrize("victim", ["q", "k", "v", "mask"])
def test_out_aliasing_input_rejected(victim):
    g = rng()
    out = np.zeros((2, 4, 5, 8), np.float32)
    arrays = {"q": randn(g, (2, 4, 5, 8), np.float32), "k": randn(g, (2, 2, 8, 8), np.float32),
              "v": randn(g, (2, 2, 8, 8), np.float32), "mask": randn(g, (5, 8), np.float32)}
    if victim == "q":
        arrays["q"] = out
    elif victim == "mask":
        arrays["mask"] = out[0, 0]
    else:  # a (2, 2, 5, 8) view of out as the first 5 keys
        arrays[victim] = out[:, :2]
        other = "v" if victim == "k" else "k"
        arrays[other] = arrays[other][:, :, :5]
        arrays["mask"] = arrays["mask"][:, :5]
    out[...] = 3.0
    before = {n: a.copy() for n, a in arrays.items()}
    with pytest.raises(ValueError, match=f"out overlaps input {victim}"):
        dispatch.attention(arrays["q"], arrays["k"], arrays["v"], mask=arrays["mask"], out=out)
    assert np.all(out == 3.0)
    for n, a in arrays.items():
        assert np.array_equal(a, before[n])


def test_explain_names_a_cpu_kernel():
    if ON_CUDA:
        pytest.skip("CPU rule")
    q, k, v = _qkv(rng(), 1, 4, 4, 1, 512, 64, np.float32)
    assert dispatch.explain("attention", q, k, v, causal=True).chosen == "cpu-splitkv"
    q, k, v = _qkv(rng(), 1, 4, 4, 256, 256, 64, np.float32)
    assert dispatch.explain("attention", q, k, v, causal=True).chosen == "cpu-flash"


def test_kernel_argument_block_is_cached_per_layout_and_still_checks_strides():
    """kernels_cpu.attention._params caches the shape/stride part of the workers' block:
    a second call with other arrays of the same layout gets their addresses, not the first
    call's, and a layout the workers cannot read is refused on every call (an error is
    never cached)."""
    if ON_CUDA:
        pytest.skip("CPU kernel module")
    from kernels_cpu import attention as K
    g = rng()
    q, k, v = _qkv(g, 1, 2, 2, 5, 7, 4, np.float32)
    dummy = np.ndarray((1, 2, 5, 7), np.float32, buffer=bytes(8), strides=(0, 0, 0, 0))
    outs = [np.full(q.shape, np.nan, np.float32) for _ in range(2)]
    ps = [K._params(q, k, v, dummy, K.MASK_NONE, False, o, 0.5) for o in outs]
    assert ps[0][K.F_OUT] == outs[0].ctypes.data and ps[1][K.F_OUT] == outs[1].ctypes.data
    assert ps[0].flags.writeable and ps[1].flags.writeable and ps[0] is not ps[1]
    for o in outs:
        K.flash(q, k, v, dummy, K.MASK_NONE, False, 0.5, o, 1)
    assert np.array_equal(outs[0], outs[1]) and np.isfinite(outs[0]).all()
    flipped = q[:, :, ::-1]
    for _ in range(2):
        with pytest.raises(ValueError, match="strides must be non-negative"):
            K._params(flipped, k, v, dummy, K.MASK_NONE, False, outs[0], 0.5)


# ---- NaN / inf in, NaN out ---------------------------------------------------------

NONFINITE = ["q_nan", "k_nan", "v_nan", "mask_nan", "q_posinf", "q_neginf", "mask_posinf", "mask_neginf",
             "k_nan_bool_masked"]
# (B, Hq, Hkv, Sq, Skv, D): decode (Sq = 1, long KV: cpu-splitkv runs 3 splits, cuda-splitkv
# several) and a shape of several query and key tiles (CPU: 64 x 64; CUDA: 16 rows x 32 keys)
NONFINITE_SHAPES = {"decode": (1, 4, 2, 1, 70, 4), "tiles": (1, 4, 2, 9, 40, 4)} if SMALL_SHAPES else \
    {"decode": (1, 4, 2, 1, 700, 16), "tiles": (1, 4, 2, 70, 150, 16)}


def _nonfinite_inputs(g, case, shape, dtype, causal):
    """Inputs with one kind of non-finite value placed where rows see it (and, for masks,
    also where the causal rule hides it)."""
    B, Hq, Hkv, Sq, Skv, D = shape
    q, k, v = _qkv(g, B, Hq, Hkv, Sq, Skv, D, dtype)
    off = Skv - Sq
    i = Sq // 2
    mask = None
    if case == "q_nan":
        q[0, Hq - 1, Sq - 1, D // 2] = np.nan
    elif case == "k_nan":
        k[0, 0, Skv - 3, D - 1] = np.nan  # causal: only the last 3 queries see it
    elif case == "v_nan":
        v[0, 0, 0, D - 1] = np.nan  # key 0: seen by every query
        if not causal:
            v[0, 0, Skv - 2, 0] = np.nan
    elif case in ("q_posinf", "q_neginf"):
        q[0, 0, i, 0] = np.inf if case == "q_posinf" else -np.inf
    elif case.startswith("mask"):
        mask = randn(g, (Sq, Skv), dtype)
        mask[g.random((Sq, Skv)) < 0.2] = -np.inf
        val = {"mask_nan": np.nan, "mask_posinf": np.inf, "mask_neginf": -np.inf}[case]
        mask[i, (i + off) // 2] = val  # visible, causal or not
        if case == "mask_neginf":
            mask[i, ::3] = -np.inf
            if Sq > 1:
                mask[Sq - 1] = -np.inf  # a fully masked row: zeros
        elif Sq > 1:
            mask[0, Skv - 1] = val  # past query 0's causal limit: seen only without causal
    elif case == "k_nan_bool_masked":
        # a bool mask adds -inf (PyTorch): NaN + -inf is still NaN for every row that
        # reaches the key, masked or not (past the causal limit it is never read)
        mask = g.random((Sq, Skv)) < 0.8
        mask[:, Skv - 3] = False
        k[0, 0, Skv - 3, 0] = np.nan
    return q, k, v, mask


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the CUDA simulator's numpy scalars
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("where", list(NONFINITE_SHAPES))
@pytest.mark.parametrize("case", NONFINITE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_nonfinite_inputs_propagate_like_pytorch(impl, dtype, case, where, causal):
    """NaN in q, k, v or an additive mask, and +inf (or -inf, which meets keys of both
    signs) in q or the mask make exactly the reference's rows NaN (PyTorch's: checked
    against torch's scaled_dot_product_attention in float64); -inf in a mask only masks,
    fully masked rows stay zeros.  Everything else matches the reference."""
    if SMALL_SHAPES and dtype == np.float64 and causal:
        pytest.skip("simulator: float64 runs non-causal only (the kernels are dtype-generic; ~4 s a case)")
    shape = NONFINITE_SHAPES[where]
    B, Hq, Hkv, Sq, Skv, D = shape
    g = rng()
    q, k, v, mask = _nonfinite_inputs(g, case, shape, dtype, causal)
    want = ref.attention(q, k, v, causal=causal, mask=mask)
    got = run(impl, dispatch.attention, q, k, v, causal=causal, mask=mask, out=poisoned(want.shape, dtype))
    nan_rows = np.isnan(want).any(axis=-1)
    if case == "mask_neginf":
        assert not nan_rows.any()
        if Sq > 1:
            assert np.all(got[:, :, Sq - 1] == 0)
    else:
        assert nan_rows.any(), "test inputs should make some rows NaN"
    bad = np.argwhere(np.isnan(got) != np.isnan(want))
    assert bad.size == 0, f"{impl} {case}: NaN pattern differs from the reference at {bad[:5].tolist()} " \
                          f"(got NaN: {np.isnan(got[tuple(bad[0])])})"
    assert not np.isinf(got).any()
    fin = ~np.isnan(want)
    assert_close(got[fin], want[fin], _tol(dtype, Skv), f"{impl} {case} finite entries", cancel=True)


@pytest.mark.skipif(not ON_CUDA, reason="a CUDA limit")
def test_wide_float64_heads_are_refused_on_cuda():
    """float64 tiles 128 wide need 86,272 B of static shared memory (48 KB allowed): CUDA
    refuses float64 with 64 < D <= 128 with the reason, and writes nothing to out=."""
    from tests.support import to_target

    q = to_target(randn(rng(), (1, 2, 3, 80), np.float64))
    out = to_target(poisoned((1, 2, 3, 80), np.float64))
    for impl in ("cuda-flash", "cuda-splitkv"):
        with dispatch.use(attention=impl), pytest.raises((TypeError, ValueError, RuntimeError), match="shared memory"):
            dispatch.attention(q, q, q, out=out)
    assert np.isnan(out.copy_to_host()).all()


_HASWELL_SCRIPT = r"""
import numpy as np
import dispatch
from kernels_cpu import attention as KA, gemm as KG
from tests.reference import attention as ref
assert not KA.WIDE and KA.MR == 4, (KA.WIDE, KA.MR)
assert KG.active_tile().name == "6x16", KG.active_tile()
g = np.random.default_rng(7)
for dt, tol in ((np.float32, 2e-5), (np.float64, 1e-11)):
    for (B, Hq, Hkv, Sq, Skv, D), causal in (((1, 4, 2, 37, 53, 24), False), ((2, 2, 2, 70, 70, 16), True),
                                              ((1, 3, 1, 1, 90, 40), False)):
        q = g.standard_normal((B, Hq, Sq, D)).astype(dt)
        k = g.standard_normal((B, Hkv, Skv, D)).astype(dt)
        v = g.standard_normal((B, Hkv, Skv, D)).astype(dt)
        mask = g.random((B, 1, Sq, Skv)) < 0.8
        want = ref.attention(q, k, v, causal=causal)
        wantm = ref.attention(q, k, v, mask=mask)
        for impl in ("cpu-flash", "cpu-splitkv"):
            with dispatch.use(attention=impl):
                got = dispatch.attention(q, k, v, causal=causal)
                gotm = dispatch.attention(q, k, v, mask=mask)
            for a, b in ((got, want), (gotm, wantm)):
                err = np.abs(a - b).max() / np.abs(b).max()
                assert err < tol, (impl, dt, B, Hq, Sq, Skv, D, causal, err)
print("ok")
"""


@pytest.mark.skipif(ON_CUDA, reason="the CPU kernels' target")
def test_narrow_vector_path_on_a_haswell_target():
    """The AVX2 build (4 x 16 ymm attention micro-kernel, 6x16 GEMM tile) compiled for a
    Haswell target in a subprocess (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES: numba's cache is
    keyed on them), so an AVX-512 host also checks what an AVX2-only host runs."""
    import os
    import platform
    import subprocess
    import sys
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("an x86 target")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="+avx,+avx2,+fma,+f16c,+popcnt,+sse4.2")
    env.pop("NK_GEMM_TILE", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _HASWELL_SCRIPT], env=env, capture_output=True, text=True, cwd=root)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
