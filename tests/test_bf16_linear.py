"""linear with bfloat16 activations and a bfloat16 weight (PyTorch's bfloat16 linear; CPU):
the result in bfloat16, from float32 sums of the exact products, bias and activation in
float32, one rounding.  Every implementation that takes it is forced (cpu-bf16-amx: AMX
tiles, on hosts with AMX-BF16; cpu-bf16-dot: vdpbf16ps, on hosts with AVX-512 BF16; the
weight-only kernels on x widened to float32) and compared with the float64 linear of the
same bfloat16 values: x rows across panels, tiles and blocks of the kernels, N not a
multiple of their tiles, K = 2, K not a multiple of a 32-value AMX chunk and long K,
batched / 1-D x, views and read-only inputs, NaN-poisoned out=, NaN propagation, threads,
bad input and the rule."""
import ml_dtypes
import numpy as np
import pytest

import dispatch
from kernels_cpu import bf16_gemm as KB
from kernels_cpu import target
from tests.reference import linalg as ref
from tests.support import (HALF_FORMATS, ON_CUDA, SMALL_SHAPES, concurrent_mismatches, poisoned, product_scale, randn,
                           reduction_tol, rng, run, strided)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 x is a CPU input (CUDA takes float32 / float16 x)")

BF = ml_dtypes.bfloat16
DOT = pytest.param("cpu-bf16-dot", id="cpu-bf16-dot",
                   marks=pytest.mark.skipif(KB.host_refusal() is not None, reason=str(KB.host_refusal())))
AMX = pytest.param("cpu-bf16-amx", id="cpu-bf16-amx",
                   marks=pytest.mark.skipif(KB.amx_refusal() is not None, reason=str(KB.amx_refusal())))
IMPLS = [AMX, DOT, "cpu-wo-gemv", "cpu-wo-gemm"]
ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]

# (x shape, weight shape (N, K)); K even (an odd K is refused by cpu-bf16-dot: test_odd_k)
SHAPES_FULL = [
    ((1, 64), (100, 64)),            # decode
    ((2, 18), (3, 18)),              # N below a 6-row group
    ((7, 2), (1, 2)),                # K = 2 (one pair), N = 1
    ((33, 130), (70, 130)),          # 33 rows: part of one 64-row panel
    ((64, 4096), (13, 4096)),        # long K
    ((130, 48), (300, 48)),          # 3 panels, 2 blocks of 128 rows, 7 tasks of 48 weight rows
    ((97, 64), (95, 64)),            # AMX: whole chunks, a short last row group and panel
    ((40, 1000), (33, 1000)),        # AMX: 31 whole chunks and 8 values
    ((5, 3, 34), (17, 34)),          # batched x
    ((66,), (9, 66)),                # 1-D x
]
SHAPES_SMALL = [((1, 24), (5, 24)), ((2, 3, 8), (3, 8)), ((70, 10), (7, 10))]
SHAPES = SHAPES_SMALL if SMALL_SHAPES else SHAPES_FULL


def bf16(a):
    return np.asarray(a, np.float32).astype(BF)


U_BF16 = HALF_FORMATS["bfloat16"][1]   # bfloat16's rounding, relative


def check(got, x, w, bias=None, activation=None, what=""):
    """got (bfloat16) against the float64 reference: per element within bfloat16's rounding
    (2^-8 of the value) plus the float32 sum's error over K terms (reduction_tol) times the
    size of the terms (product_scale: a sum can cancel far below them), and normwise;
    NaN exactly where the reference has NaN."""
    assert got.dtype == BF, f"{what}: result dtype {got.dtype}, want bfloat16"
    want = ref.linear(x, w, bias, activation=activation)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    g = np.asarray(got, np.float64)
    nan = np.isnan(want)
    assert (np.isnan(g) == nan).all(), f"{what}: NaN pattern differs"
    k = w.shape[-1]
    acc = reduction_tol(np.float32, k) * product_scale(x, w, bias, transpose_b=True)
    err = np.abs(g - want)[~nan]
    bound = U_BF16 * np.abs(want)[~nan] + acc
    if err.size:
        i = int(np.argmax(err - bound))
        assert (err <= bound).all(), (f"{what}: element {i} off by {err[i]:.3g}, allowed {bound[i]:.3g} "
                                      f"(ref {want[~nan][i]:.6g})")
        assert err.max() <= U_BF16 * np.abs(want[~nan]).max() + acc, f"{what}: normwise {err.max():.3g}"


@pytest.mark.parametrize("sx, sw", SHAPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, sx, sw):
    g = rng()
    x, w, bias = bf16(randn(g, sx, np.float32)), bf16(randn(g, sw, np.float32) / np.sqrt(sw[1])), \
        bf16(randn(g, sw[:1], np.float32))
    shape = sx[:-1] + sw[:1]
    got = run(impl, dispatch.linear, x, w, bias, activation="silu", out=poisoned(shape, BF))
    check(got, x, w, bias, "silu", f"{impl} {sx} x {sw} + bias, silu")
    check(run(impl, dispatch.linear, x, w), x, w, what=f"{impl} {sx} x {sw}")


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_epilogues(impl, activation, with_bias):
    g = rng()
    m, k, n = (3, 12, 5) if SMALL_SHAPES else (70, 46, 53)
    x, w = bf16(randn(g, (m, k), np.float32)), bf16(randn(g, (n, k), np.float32) / np.sqrt(k))
    bias = bf16(randn(g, (n,), np.float32)) if with_bias else None
    check(run(impl, dispatch.linear, x, w, bias, activation=activation), x, w, bias, activation,
          f"{impl} {activation} bias={with_bias}")


@pytest.mark.parametrize("impl", IMPLS)
def test_views_read_only_and_out(impl):
    """A strided x, a read-only weight and bias, x rows all equal (a broadcast view), a
    non-contiguous out= (filled by a copy)."""
    g = rng()
    m, k, n = (4, 8, 3) if SMALL_SHAPES else (40, 36, 21)
    x, w, bias = bf16(randn(g, (m, k), np.float32)), bf16(randn(g, (n, k), np.float32)), \
        bf16(randn(g, (n,), np.float32))
    wr, br = w.copy(), bias.copy()
    wr.flags.writeable = br.flags.writeable = False
    xs = strided(x)
    assert not xs.flags.c_contiguous
    check(run(impl, dispatch.linear, xs, wr, br), x, w, bias, what=f"{impl} strided x, read-only weight")
    xb = np.broadcast_to(x[:1], x.shape)
    check(run(impl, dispatch.linear, xb, w), np.array(xb), w, what=f"{impl} broadcast x")
    tout = np.full((n, m), np.nan, BF).T
    got = run(impl, dispatch.linear, x, w, bias, out=tout)
    assert got is tout
    check(tout, x, w, bias, what=f"{impl} non-contiguous out=")


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_and_inf_propagate(impl):
    g = rng()
    m, k, n = (3, 10, 4) if SMALL_SHAPES else (66, 38, 20)
    x = randn(g, (m, k), np.float32)
    x[1, k // 2] = np.nan
    x[2, 3] = np.inf
    x, w = bf16(x), bf16(randn(g, (n, k), np.float32))
    got = np.asarray(run(impl, dispatch.linear, x, w), np.float64)
    assert np.isnan(got[1]).all(), got[1]
    assert not np.isfinite(got[2]).any(), got[2]     # inf times weights of either sign: +-inf or NaN
    keep = np.arange(m) > 2
    assert np.isfinite(got[keep]).all()
    check(run(impl, dispatch.linear, x[keep], w), x[keep], w, what=f"{impl} other rows")


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_and_zero_k(impl):
    g = rng()
    w0 = bf16(np.zeros((5, 0), np.float32))
    bias = bf16(randn(g, (5,), np.float32))
    got = run(impl, dispatch.linear, bf16(np.zeros((70, 0))), w0, bias, activation="gelu")
    check(got, np.zeros((70, 0)), np.zeros((5, 0)), bias, "gelu", f"{impl} K = 0")
    got = run(impl, dispatch.linear, bf16(np.zeros((0, 6))), bf16(np.ones((5, 6))))
    assert got.shape == (0, 5) and got.dtype == BF


def test_odd_k():
    """The widening kernels take odd K; cpu-bf16-dot, which multiplies pairs of K, refuses it
    by name (the key carries K's parity) and the rule picks a widening one."""
    g = rng()
    x, w = bf16(randn(g, (70, 17), np.float32)), bf16(randn(g, (9, 17), np.float32))
    check(dispatch.linear(x, w), x, w, what="odd K, as dispatched")
    e = str(dispatch.explain("linear", x, w))
    assert "k_odd=True" in e and "cpu-bf16-dot: refused: K is odd" in e, e
    assert "cpu-bf16-amx: refused: K is odd" in e, e
    assert "chosen: cpu-wo-" in e, e


@pytest.mark.skipif(KB.host_refusal() is not None, reason="the vdpbf16ps rule on a host with AVX-512 BF16")
def test_rule():
    """Many rows: AMX tiles on an AMX host, else vdpbf16ps; few rows: the widening GEMV."""
    from dispatch.ops import weight_only as WO

    w = bf16(np.ones((64, 32)))
    many = str(dispatch.explain("linear", bf16(np.ones((128, 32))), w))
    first = "cpu-bf16-amx" if KB.amx_refusal() is None else "cpu-bf16-dot"
    assert f"chosen: {first}" in many and "dtype=bfloat16" in many, many
    assert "cpu-gemm: refused" in many, many
    few = str(dispatch.explain("linear", bf16(np.ones((min(WO.BF16_AMX_MIN_ROWS, WO.BF16_DOT_MIN_ROWS) // 2, 32))), w))
    assert "chosen: cpu-wo-gemv" in few and "bfloat16 x widened to float32" in few, few
    f32 = str(dispatch.explain("linear", np.ones((128, 32), np.float32), w))
    assert "cpu-bf16-dot: refused: dtype float32 not supported" in f32, f32
    assert "cpu-bf16-amx: refused: dtype float32 not supported" in f32, f32


@pytest.mark.parametrize("missing, impl", [("avx512bf16", "cpu-bf16-dot"), ("amx-bf16", "cpu-bf16-amx")])
def test_host_without_the_instructions(monkeypatch, missing, impl):
    """A host without AVX-512 BF16 (Zen 3, Ice Lake) refuses cpu-bf16-dot by name, one without
    AMX-BF16 (every AMD host) cpu-bf16-amx, and the rule runs the next (their results checked
    in the tests above)."""
    from dispatch import select

    feats = target.features() - {missing}
    monkeypatch.setattr(target, "features", lambda: feats)
    select.clear_cache()
    try:
        e = str(dispatch.explain("linear", bf16(np.ones((128, 32))), bf16(np.ones((64, 32)))))
    finally:
        monkeypatch.undo()
        select.clear_cache()
    assert f"{impl}: refused: host" in e and "lacks" in e and missing in e, e
    assert f"chosen: {impl}" not in e, e


@pytest.mark.skipif(KB.amx_refusal() is not None, reason=str(KB.amx_refusal()))
def test_amx_blocks_of_x(monkeypatch):
    """The AMX path's tasks run a weight panel over a block of x's rows (AMX_X_BYTES of
    them): with small blocks, rows in three blocks and a short last one."""
    monkeypatch.setattr(KB, "AMX_X_BYTES", 1)
    g = rng()
    x, w, bias = bf16(randn(g, (300, 40), np.float32)), bf16(randn(g, (70, 40), np.float32)), \
        bf16(randn(g, (70,), np.float32))
    check(run("cpu-bf16-amx", dispatch.linear, x, w, bias, activation="gelu"), x, w, bias, "gelu", "blocks of x")


@pytest.mark.skipif(KB.amx_refusal() is not None, reason=str(KB.amx_refusal()))
@pytest.mark.parametrize("few_max", [0, 1000], ids=["packed-weight", "weight-in-place"])
def test_amx_both_forms(monkeypatch, few_max):
    """Both forms of the AMX path at any M: the weight packed per task (AMX_FEW_MAX 0) and
    read in place with x as B panels (AMX_FEW_MAX 1000: several blocks of x's rows), over
    a K tail (130 = 4 chunks + 2), a short last row group and a bias + activation."""
    monkeypatch.setattr(KB, "AMX_FEW_MAX", few_max)
    g = rng()
    for m in (1, 33, 300):
        x, w, bias = bf16(randn(g, (m, 130), np.float32)), bf16(randn(g, (70, 130), np.float32) / 12), \
            bf16(randn(g, (70,), np.float32))
        check(run("cpu-bf16-amx", dispatch.linear, x, w, bias, activation="silu"), x, w, bias, "silu",
              f"M {m}, AMX_FEW_MAX {few_max}")


@pytest.mark.skipif(KB.amx_refusal() is not None, reason=str(KB.amx_refusal()))
def test_amx_x_buffer_on_a_cache_line():
    """The AMX kernel refuses an x buffer off a cache line (its tiles would run at half
    speed) rather than use it."""
    from kernels_common.memory import aligned_empty

    x, w = np.zeros((4, 32), np.uint16), np.zeros((3, 32), np.uint16)
    shape = KB.panels_shape(4, 32, True)
    raw = aligned_empty(int(np.prod(shape)) + 4, np.uint32)
    with pytest.raises(ValueError, match="cache line"):
        KB.run(x, w, np.zeros(3, np.float32), 0, np.zeros((4, 3), np.uint16), raw[4:].reshape(shape), True, True)


def _bad_cases():
    g = np.random.default_rng(0)
    x = bf16(g.standard_normal((2, 8)))
    w = bf16(g.standard_normal((3, 8)))
    return [
        ("float32 weight", (x, np.asarray(w, np.float32)), {}, TypeError, "x is bfloat16: .* bfloat16 weight"),
        ("prepacked float32 weight", (x, dispatch.prepack(np.asarray(w, np.float32))), {}, TypeError,
         "x is bfloat16: .* got a weight of dtype float32"),
        ("float16 weight", (x, np.asarray(w, np.float16)), {}, TypeError, "bfloat16 / float16 too with a weight of that dtype"),
        ("float32 x", (np.asarray(x, np.float64), w), {}, TypeError, "cast x to float32"),
        ("float32 bias", (x, w, np.zeros(3, np.float32)), {}, TypeError, "bias must have the same dtype"),
        ("bias shape", (x, w, bf16(np.zeros(4))), {}, ValueError, r"bias must have shape \(3,\)"),
        ("wrong K", (x[:, :6], w), {}, ValueError, "K=6"),
        ("out dtype", (x, w), {"out": np.zeros((2, 3), np.float32)}, TypeError, "out"),
        ("out shape", (x, w), {"out": bf16(np.zeros((2, 4)))}, ValueError, "out"),
        ("out over x", (x, w), {"out": x[:, :3]}, ValueError, "out"),
    ]


@pytest.mark.parametrize("what, args, kwargs, err, match", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input(what, args, kwargs, err, match):
    out = kwargs.get("out")
    before = None if out is None else np.array(out, copy=True)
    with pytest.raises(err, match=match):
        dispatch.linear(*args, **kwargs)
    if out is not None:
        assert np.array_equal(np.asarray(out, np.float32), np.asarray(before, np.float32)), "out= written"


@pytest.mark.parametrize("impl", IMPLS)
def test_threads_give_single_thread_results(impl):
    """4 Python threads calling at once (the kernels release the GIL; x's panels and the
    widened blocks are per thread) give bitwise the single-threaded results."""
    g = np.random.default_rng(5)
    cases = []
    for m, k, n in [(70, 300, 70), (130, 128, 300), (40, 64, 513), (9, 34, 17)]:
        cases.append((bf16(g.standard_normal((m, k))), bf16(g.standard_normal((n, k)) / np.sqrt(k)),
                      bf16(g.standard_normal(n))))
    def call(c):
        with dispatch.use(linear=impl):
            return dispatch.linear(*c, activation="gelu").view(np.uint16)

    bad = concurrent_mismatches(call, cases)
    assert not bad, f"threads {bad} differ from their single-threaded results"

