"""matmul of bfloat16 / float16 a, b and bias (PyTorch's 16-bit matmul; CPU), each test once
per format (the `half` fixture): widened to float32, the float32 kernels, the result rounded
once to a's dtype -- or bfloat16 on AMX tiles (cpu-bf16-amx, hosts with AMX-BF16) or by
vdpbf16ps (cpu-bf16-dot, hosts with AVX-512 BF16; K even, odd K refused).  Every
CPU implementation that takes the format is forced and compared with the float64 product
of the same 16-bit values: matrix, batched and broadcast operands, vectors of one row /
column, odd K, rows and columns across the AMX tiles and tasks, bias and each activation,
strided operands, NaN-poisoned and non-contiguous out=, autograd, threads, and bad input
that changes nothing."""
import math

import numpy as np
import pytest

import dispatch
from dispatch import registry
from tests.reference import linalg as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, as_half, assert_half_close, concurrent_mismatches, impl_params,
                           need_half_format,
                           other_half, poisoned, product_scale, randn, reduction_tol, rng, run, strided)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 / float16 a is a CPU input here (float16 on CUDA: "
                                "test_linalg)")

SHAPES = [((3, 5), (5, 4)), ((1, 7), (7, 1)), ((2, 3, 6), (6, 5)), ((2, 1, 4, 3), (3, 3, 2))] + ([] if SMALL_SHAPES
                                                                                              else [((70, 130), (130, 90)),
                                                                                                    ((1, 300), (300, 257)),
                                                                                                    ((3, 97, 33), (1, 33, 130))])
IMPLS = [p for p in impl_params("matmul", "cpu")]


def refuses_odd_k(impl, a, b, **kw):
    """cpu-bf16-dot with an odd K: forced, the call is refused naming why, out= untouched
    (True: the caller checks nothing more)."""
    if impl != "cpu-bf16-dot" or a.shape[-1] % 2 == 0:
        return False
    out = poisoned(ref.matmul(a, b).shape, a.dtype)
    with pytest.raises(dispatch.NoImplementationError, match="cpu-bf16-dot: refused: K is odd"):
        run(impl, dispatch.matmul, a, b, out=out, **kw)
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"
    return True


def check(got, a, b, bias, activation, what):
    """Within the 16-bit rounding plus the float32 sum's error over K, relative to the
    size of the terms each output sums."""
    slack = reduction_tol(np.float32, a.shape[-1]) * product_scale(a, b, bias)
    assert_half_close(got, ref.matmul(a, b, bias=bias, activation=activation), slack, what)


@pytest.mark.parametrize("activation", [None, "gelu"], ids=str)
@pytest.mark.parametrize("sa, sb", SHAPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, sa, sb, activation, half):
    need_half_format(impl, half)
    g = rng()
    a, b = as_half(half, randn(g, sa, np.float32)), as_half(half, randn(g, sb, np.float32) / np.sqrt(sb[-2]))
    bias = as_half(half, randn(g, (sb[-1],), np.float32))
    if refuses_odd_k(impl, a, b, bias=bias, activation=activation):
        return
    oshape = ref.matmul(a, b).shape
    out = poisoned(oshape, half)
    got = run(impl, dispatch.matmul, a, b, bias=bias, activation=activation, out=out)
    assert got is out and got.dtype == half
    check(got, a, b, bias, activation, f"{impl} {sa} @ {sb} {activation}")
    check(run(impl, dispatch.matmul, a, b), a, b, None, None, f"{impl} {sa} @ {sb} plain")


@pytest.mark.parametrize("impl", IMPLS)
def test_views_out_and_nan(impl, half):
    need_half_format(impl, half)
    g = rng()
    a, b = as_half(half, randn(g, (6, 8), np.float32)), as_half(half, randn(g, (8, 5), np.float32))
    check(run(impl, dispatch.matmul, strided(a), b), a, b, None, None, f"{impl} strided a")
    check(run(impl, dispatch.matmul, a, b.T.copy().T), a, b, None, None, f"{impl} transposed b")
    tout = np.full((5, 6), np.nan, half).T
    assert run(impl, dispatch.matmul, a, b, out=tout) is tout
    check(tout, a, b, None, None, f"{impl} non-contiguous out=")
    an = np.asarray(a, np.float32)
    an[2, 3] = np.nan
    an = as_half(half, an)
    got = run(impl, dispatch.matmul, an, b)
    assert np.isnan(np.asarray(got[2], np.float32)).all()
    check(got, an, b, None, None, f"{impl} NaN")


def test_bad_input_changes_nothing(half):
    g = rng()
    a, b = as_half(half, randn(g, (3, 4), np.float32)), as_half(half, randn(g, (4, 2), np.float32))
    out = np.full((3, 2), np.nan, half)
    with pytest.raises(TypeError, match="b must have the same dtype as a"):
        dispatch.matmul(a, b.astype(other_half(half)), out=out)
    with pytest.raises(TypeError, match="b must have the same dtype as a"):
        dispatch.matmul(a, b.astype(np.float32), out=out)
    with pytest.raises(TypeError, match="bias must have the same dtype as a"):
        dispatch.matmul(a, b, bias=np.zeros(2, np.float32), out=out)
    with pytest.raises(TypeError, match=r"a must have dtype float32 or float64.*bfloat16 / float16"):
        dispatch.matmul(a.astype(np.int16), b, out=out)
    with pytest.raises((TypeError, ValueError), match="out"):
        dispatch.matmul(a, b, out=np.full((3, 2), np.nan, np.float32))
    with pytest.raises(TypeError, match="b must have the same dtype as a"):
        dispatch.matmul(a, dispatch.prepack(np.asarray(b, np.float32), op="matmul"), out=out)
    with pytest.raises(TypeError, match="b must have the same dtype as a"):
        dispatch.matmul(a, dispatch.prepack(b.astype(other_half(half)), op="matmul"), out=out)
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


def test_autograd_matches_float64(half):
    """dispatch.autograd.matmul on 16-bit tensors: the forward as above, the backward in
    float32 on the widened tensors with each gradient rounded once (as linear's)."""
    torch = pytest.importorskip("torch")
    import dispatch.autograd as nka
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[half.name]
    g = torch.Generator().manual_seed(int(rng().integers(2**31)))
    a = torch.randn(2, 5, 6, generator=g).to(tdt).requires_grad_()
    b = torch.randn(6, 3, generator=g).to(tdt).requires_grad_()
    bias = torch.randn(3, generator=g).to(tdt).requires_grad_()
    y = nka.matmul(a, b, bias=bias, activation="silu")
    assert y.dtype == tdt
    gy = torch.randn(y.shape, generator=g).to(tdt)
    y.backward(gy)
    a64, b64, bias64 = (t.detach().double().requires_grad_() for t in (a, b, bias))
    y64 = torch.nn.functional.silu(a64 @ b64 + bias64)
    y64.backward(gy.double())
    tol = 2.0 ** -6   # a few 16-bit roundings (the pre-activation, the activation, each gradient)
    for got, want, name in ((y, y64, "y"), (a.grad, a64.grad, "da"), (b.grad, b64.grad, "db"),
                            (bias.grad, bias64.grad, "dbias")):
        err = (got.double() - want).abs().max().item()
        assert err <= tol * (want.abs().max().item() + 1), (name, err)


def test_threads_bitwise(half):
    g = rng()
    # the last three: b widened by our kernels (b of GEMM16_MIN_B elements on): in the GEMM's
    # tasks (linalg._gemm16), and by the GEMV's workers at 3 rows (linalg._gemv16)
    shapes = [((3, 5), (5, 4)), ((40, 64), (64, 48)), ((2, 30, 20), (20, 33)), ((1, 200), (200, 100)),
              ((2, 30, 130), (130, 200)), ((3, 20, 100), (3, 100, 150)), ((3, 700), (700, 800))]
    cases = [(as_half(half, randn(g, sa, np.float32)), as_half(half, randn(g, sb, np.float32))) for sa, sb in shapes]
    a, b = cases[1]
    cases.append((a, dispatch.prepack(b, op="matmul")))   # its float32 panels shared by the threads

    def call(case):
        return dispatch.matmul(*case, activation="relu").view(np.uint16).ravel()

    assert concurrent_mismatches(call, cases) == []


@pytest.mark.parametrize("sa, sb", [((40, 130), (130, 90)), ((3, 20, 64), (64, 50)), ((5, 300), (300, 257))], ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_prepacked_b(impl, sa, sb, half):
    """prepack(b, op="matmul") of a 16-bit (K, N) b: the float32 panels of its widened values,
    which cpu-gemm reads after widening a (bits the same as unpacked: the same tile and sums),
    or for bfloat16 where cpu-bf16-dot runs (no AMX) the panels that kernel packs per call
    otherwise; every other kernel reads the 16-bit source.  Zeroing the source after packing
    leaves the result of the kernel that reads the panels as it was and changes the others'."""
    from dispatch.ops.bf16_matmul import packed_form
    need_half_format(impl, half)
    g = rng()
    a, b = as_half(half, randn(g, sa, np.float32)), as_half(half, randn(g, sb, np.float32) / 10)
    bias = as_half(half, randn(g, (sb[1],), np.float32))
    if refuses_odd_k(impl, a, b):
        return
    pb = dispatch.prepack(b, op="matmul")
    form = packed_form() if np.dtype(half) == dispatch.validate.BF16 and sb[0] % 2 == 0 else None
    assert pb.dtype == b.dtype and pb.panels.dtype == (np.uint32 if form else np.float32), pb
    want = run(impl, dispatch.matmul, a, b, bias=bias, activation="relu")
    got = run(impl, dispatch.matmul, a, pb, bias=bias, activation="relu")
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    b[...] = 0
    after = run(impl, dispatch.matmul, a, pb, bias=bias, activation="relu")
    reads_panels = impl == ("cpu-bf16-dot" if form else "cpu-gemm")
    assert np.array_equal(after.view(np.uint16), want.view(np.uint16)) == reads_panels, impl


def test_prepacked_b_rule(half):
    """A prepacked 16-bit b: the GEMV on the 16-bit b below GEMV_ROWS rows, our GEMM on its
    panels from there (bfloat16 on a host with a bfloat16 kernel: that kernel, on the source)."""
    from dispatch.ops.linalg import GEMV_ROWS
    from kernels_cpu import bf16_gemm as KB
    b = as_half(half, np.ones((768, 768), np.float32))
    pb = dispatch.prepack(b, op="matmul")
    few = dispatch.explain("matmul", as_half(half, np.ones((GEMV_ROWS // 2, 768), np.float32)), pb)
    many = dispatch.explain("matmul", as_half(half, np.ones((GEMV_ROWS * 16, 768), np.float32)), pb)
    assert few.chosen == "cpu-gemv", few
    bf16_kernel = np.dtype(half) == dispatch.validate.BF16 and (KB.amx_refusal() is None or KB.host_refusal() is None)
    if bf16_kernel:
        assert many.chosen in ("cpu-bf16-amx", "cpu-bf16-dot"), many
    else:
        assert "(prepacked)" in str(few), few
        assert many.chosen == "cpu-gemm" and "float32 panels" in str(many), many


def test_prepacked_b_for_another_form(half, monkeypatch):
    """A PackedWeight b holding a bfloat16 kernel's panels on a host that runs another is
    refused, naming both and what to do, out= untouched."""
    from dispatch.ops import bf16_matmul
    b = as_half(half, np.ones((64, 48), np.float32))
    pb = dispatch.prepack(b, op="matmul")
    if pb.panels.dtype != np.uint32:
        pytest.skip("float32 panels here (bfloat16 panels: cpu-bf16-dot hosts)")
    monkeypatch.setattr(bf16_matmul, "packed_form", lambda: None)
    out = poisoned((3, 48), half)
    with pytest.raises(ValueError, match="panels of the bf16-dot bfloat16 kernel; this host runs another"):
        dispatch.matmul(as_half(half, np.ones((3, 64), np.float32)), pb, out=out)
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


@pytest.mark.parametrize("impl", IMPLS)
def test_odd_k_and_tiles(impl, half):
    """An odd K (AMX: the last pair completed with a zero; vdpbf16ps: refused), K past whole
    32-value chunks, rows and columns past whole tiles and 64-column tasks (vdpbf16ps: 6-row
    groups of a, 48-row tasks, 64-column panels, 128-column blocks, K past a packing task's
    32 pairs), a broadcast b or a."""
    need_half_format(impl, half)
    g = rng()
    shapes = [((5, 33), (33, 7)), ((2, 40, 1), (1, 70)), ((7, 2), (2, 3)), ((3, 2, 65, 77), (2, 77, 129)),
              ((2, 1, 50, 66), (3, 66, 130)), ((97, 130), (1, 130, 200)),
              ((2, 300, 66), (66, 200))]   # vdpbf16ps: more rows of a than KN_SELF_ROWS (b packed first)
    for sa, sb in shapes[:3] if SMALL_SHAPES else shapes:
        a, b = as_half(half, randn(g, sa, np.float32)), as_half(half, randn(g, sb, np.float32) / np.sqrt(sb[-2]))
        if not refuses_odd_k(impl, a, b, activation="silu"):
            check(run(impl, dispatch.matmul, a, b, activation="silu"), a, b, None, "silu", f"{impl} {sa} @ {sb}")


def _b16_cases(half, g, cases):
    """(case, (a, b, bias, NaN-poisoned out)) for cases (a's shape, b's shape, b a transposed
    view, ...) whose b has at least GEMM16_MIN_B elements (our kernels widen it themselves)."""
    from dispatch.ops import linalg as L
    for case in cases:
        sa, sb, transposed = case[:3]
        assert math.prod(sb) >= L.GEMM16_MIN_B
        a = as_half(half, randn(g, sa, np.float32))
        b = as_half(half, randn(g, sb, np.float32) / np.sqrt(sb[-1 if transposed else -2]))
        b = b.T if transposed else b
        bias = as_half(half, randn(g, (b.shape[-1],), np.float32))
        yield case, (a, b, bias, poisoned(ref.matmul(a, b).shape, half))


def test_b_widened_in_the_gemm_tasks(half, monkeypatch):
    """cpu-gemm with b of at least GEMM16_MIN_B elements: b's 16-bit panels widened by the
    GEMM's tasks (kernels_cpu.weight_only.pack_b16, b (K, N) and a transposed view, every
    panel width past whole panels), a's batch folded into its rows for a 2-D b, batched and
    broadcast-a b, bias and activation, into a NaN-poisoned out=; where b is broadcast
    along a batch dim the widened copies run instead.  Checked by the GEMM's b: 16-bit
    patterns (uint16) on the new path."""
    from kernels_cpu import gemm as K
    g = rng()
    real, b_dtypes = K.gemm_launch, []

    def launch(args, a3, ap, b3, *rest, **kw):
        b_dtypes.append(b3.dtype)
        return real(args, a3, ap, b3, *rest, **kw)

    monkeypatch.setattr(K, "gemm_launch", launch)
    cases = [((70, 130), (130, 300), False, True), ((37, 129), (300, 129), True, True),
             ((2, 3, 40, 130), (130, 200), False, True), ((3, 50, 130), (3, 130, 150), False, True),
             ((1, 50, 130), (3, 130, 150), False, True), ((3, 50, 130), (1, 130, 150), False, False)]
    for (sa, sb, transposed, widened_in_tasks), (a, b, bias, out) in _b16_cases(half, g, cases):
        b_dtypes.clear()
        got = run("cpu-gemm", dispatch.matmul, a, b, bias=bias, activation="gelu_tanh", out=out)
        assert got is out
        check(got, a, b, bias, "gelu_tanh", f"{sa} @ {sb} transposed={transposed}")
        assert b_dtypes == [np.dtype(np.uint16) if widened_in_tasks else np.dtype(np.float32)], (sa, sb, b_dtypes)


def test_rule(half):
    """bfloat16 on an AMX host: AMX tiles; on an AVX-512 BF16 host: vdpbf16ps from a batch x
    M x N x K of 2^19 with K even; float16, or bfloat16 elsewhere: the float32 kernels on
    widened copies, with the refusals named."""
    from kernels_cpu import bf16_gemm as KB
    bf16 = np.dtype(half) == dispatch.validate.BF16
    a = as_half(half, np.ones((128, 64), np.float32))
    e = str(dispatch.explain("matmul", a, a.T))
    if bf16 and KB.amx_refusal() is None:
        assert "chosen: cpu-bf16-amx" in e, e
    else:
        assert "chosen: cpu-bf16-amx" not in e and "cpu-bf16-amx: refused" in e, e
        dot = bf16 and KB.host_refusal() is None
        assert ("chosen: cpu-bf16-dot" in e) == dot and (dot or "cpu-bf16-dot: refused" in e), e
        if dot:
            odd = str(dispatch.explain("matmul", a[:, :63], a[:63, :]))
            assert "cpu-bf16-dot: refused: K is odd" in odd and "chosen: cpu-bf16-dot" not in odd, odd
            small = str(dispatch.explain("matmul", a[:32, :64], a[:32, :64].T))
            assert "chosen: cpu-bf16-dot" not in small and "< 2^19" in small, small


def test_rule_b_widened_in_tasks(half):
    """Where our kernels widen b themselves (linalg.b16_in_tasks): from a batch x M x N x K
    bucket of GEMM16_MIN_WORK cpu-gemv under GEMV_ROWS rows (also for bfloat16 on an AMX
    host) and cpu-gemm from there (bfloat16 on an AMX host: its tiles), OpenBLAS on widened
    copies below it (AMX tiles); a b broadcast along a batch dim keeps the float32
    thresholds (its copy is made either way)."""
    from dispatch.ops import linalg as L
    from kernels_cpu import bf16_gemm as KB
    amx = np.dtype(half) == dispatch.validate.BF16 and KB.amx_refusal() is None
    dot = np.dtype(half) == dispatch.validate.BF16 and KB.host_refusal() is None
    ones = lambda *s: as_half(half, np.ones(s, np.float32))  # noqa: E731
    for a, b, chosen in [(ones(1, 768), ones(768, 768), "cpu-gemv"), (ones(4, 768), ones(768, 3072), "cpu-gemv"),
                         (ones(4, 8, 768), ones(768, 768), "cpu-gemm"), (ones(8, 384), ones(384, 384), "cpu-gemm"),
                         (ones(2, 384), ones(384, 384), "blas"), (ones(1, 512), ones(512, 512), "blas")]:
        key = registry.OPS["matmul"].describe(a, b).key
        assert key.b16_tasks and (key.batch * key.m * key.n * key.k >= L.GEMM16_MIN_WORK) == (chosen != "blas")
        e = str(dispatch.explain("matmul", a, b))
        fast = "cpu-bf16-amx" if amx else "cpu-bf16-dot" if dot and chosen != "blas" else None
        chosen = fast if fast and chosen != "cpu-gemv" else chosen
        assert f"chosen: {chosen}" in e and ("16-bit" in e or chosen == fast), (a.shape, b.shape, e)
    a, b = ones(3, 50, 130), ones(1, 130, 150)   # b broadcast along the batch: widened copies
    assert not registry.OPS["matmul"].describe(a, b).key.b16_tasks
    assert not registry.OPS["matmul"].describe(ones(64, 64), ones(64, 64)).key.b16_tasks   # under GEMM16_MIN_B


def test_gemv_reads_b_as_it_is(half, monkeypatch):
    """cpu-gemv with b of at least GEMM16_MIN_B elements reads b's 16-bit patterns itself:
    a (K, N) b by kernels_cpu.weight_only.gemv_kn16 (2-D, a's batch folded into its rows,
    and batched), whose sums are the float32 gemv's on the widened b bit for bit; a 2-D b
    stored (N, K) (a transposed view) by the weight-only GEMV's workers; bias, activation,
    a NaN-poisoned out=.  A b broadcast along a batch dim takes the widened copies."""
    from dispatch.ops import linalg as L
    from kernels_cpu import gemm as K
    from kernels_cpu import weight_only as KW
    g = rng()
    seen = []
    real_kn, real_wo = K.gemv_kn, KW.run_gemv
    monkeypatch.setattr(K, "gemv_kn", lambda *a, **k: seen.append(("kn", a[1].dtype)) or real_kn(*a, **k))
    monkeypatch.setattr(KW, "run_gemv", lambda *a, **k: seen.append(("nk", a[1].dtype)) or real_wo(*a, **k))
    u16, f32 = np.dtype(np.uint16), np.dtype(np.float32)
    cases = [((1, 300), (300, 200), False, ("kn", u16)), ((5, 1029), (1029, 517), False, ("kn", u16)),
             ((2, 3, 130), (130, 150), False, ("kn", u16)), ((3, 5, 130), (3, 130, 150), False, ("kn", u16)),
             ((4, 140), (130, 140), True, ("nk", u16)), ((3, 5, 130), (1, 130, 150), False, ("kn", f32))]
    for (sa, sb, transposed, path), (a, b, bias, out) in _b16_cases(half, g, cases):
        seen.clear()
        got = run("cpu-gemv", dispatch.matmul, a, b, bias=bias, activation="gelu_tanh", out=out)
        assert got is out
        check(got, a, b, bias, "gelu_tanh", f"{sa} @ {sb} transposed={transposed}")
        assert seen == [path], (sa, sb, seen)
        if path == ("kn", u16):   # the float32 gemv on widened copies: the same bits
            code = L.ACTIVATION_CODES["gelu_tanh"]
            wide = L._run_gemv(None, a.astype(np.float32), b.astype(np.float32), bias.astype(np.float32), None, code,
                               False)
            np.testing.assert_array_equal(L._gemv16(a, b, bias, code), wide, err_msg=f"{sa} @ {sb}")
    # NaN in, NaN out: a NaN in a's first row spoils that row only
    a, b = as_half(half, randn(g, (2, 300), np.float32)), as_half(half, randn(g, (300, 200), np.float32))
    a[0, 7] = np.nan
    got = run("cpu-gemv", dispatch.matmul, a, b).astype(np.float32)
    assert np.isnan(got[0]).all() and not np.isnan(got[1]).any()


def test_b_pair_panels():
    """The (K, N) b packers of both bfloat16 paths (kernels_cpu.bf16_gemm: AMX_NR-column B
    panels, NR-column vdpbf16ps panels) against the layout built in numpy: the word of pair
    q and column n is b[2q, n] | b[2q + 1, n] << 16, zeros past K and N, for every packing
    task's range of pairs; runs on any host (no bfloat16 instruction)."""
    from numba import njit
    from kernels_cpu import bf16_gemm as KB

    def packer(pack):
        @njit
        def run(b16, dst, m, q0, q1, K, N, K2p):
            pack(b16, dst, m, q0, q1, K, N, K2p)
        return run

    g = rng()
    for pack, width in ((KB._pack_kn_pairs, KB.AMX_NR), (KB._pack_kn_dot, KB.NR)):
        run_pack = packer(pack)
        for nb, k, n in ((2, 7, 70), (1, 66, 2 * width), (1, 1, 5)):
            b = g.integers(0, 1 << 16, (nb, k, n), dtype=np.uint16)
            k2p = -(-k // 2) + 1   # one pair past K: zeros too
            npan = -(-n // width)
            got = np.full(nb * npan * k2p * width, 0xDEADBEEF, np.uint32)
            for m in range(nb):
                for q0 in range(0, k2p, 3):   # tasks of 3 pairs
                    run_pack(b.reshape(-1), got, m, q0, min(q0 + 3, k2p), k, n, k2p)
            pad = np.zeros((nb, 2 * k2p, npan * width), np.uint32)
            pad[:, :k, :n] = b
            want = pad[:, 0::2] | (pad[:, 1::2] << 16)                       # (nb, k2p, npan * width)
            want = want.reshape(nb, k2p, npan, width).transpose(0, 2, 1, 3)  # (nb, panel, pair, lane)
            assert np.array_equal(got, want.ravel()), (width, nb, k, n)
