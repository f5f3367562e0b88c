"""dispatch.linear_backward / dispatch.matmul_backward against float64 references (checked
themselves against PyTorch autograd of the forward references), for every implementation the
dispatcher can pick: every activation and none, bias / no bias, M / N / K of 1, 7, 33, 100
(not multiples of any register or CUDA tile), leading dims, batched and broadcast matmul,
non-contiguous and read-only inputs, NaN propagation, bad input."""
import numpy as np
import pytest

import dispatch
from tests.reference import linalg as fwd
from tests.reference import linalg_grad as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, assert_close, forget_gemm_plans, impl_params, randn, read_only, rng,
                           run, spy_gemm_plans, strided)

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]
DTYPES = [np.float32, np.float64]
TOL = {np.dtype(np.float32): 2e-4, np.dtype(np.float64): 1e-9}
host_only = pytest.mark.skipif(ON_CUDA, reason="host-array checks run on the CPU target")

# linear: (x shape, N); M, N, K in {1, 7, 33, 100}, and M = 48 (whole row tiles of every
# register tile: g' formed by rows fills its scratch exactly)
LINEAR_FULL = [((7, 33), 100), ((100, 7), 1), ((1, 100), 33), ((3, 11, 33), 7), ((33, 1), 7), ((2, 24, 40), 33)]
LINEAR_SMALL = [((7, 5), 9), ((2, 3, 4), 1), ((1, 3), 7)]
LINEAR_SHAPES = LINEAR_SMALL if SMALL_SHAPES else LINEAR_FULL
# matmul: (a shape, b shape)
MATMUL_FULL = [((7, 33), (33, 100)), ((2, 3, 7, 19), (19, 33)), ((3, 7, 19), (2, 1, 19, 33)),
               ((4, 13, 40), (4, 40, 18)), ((7, 19), (3, 19, 33)), ((100, 1), (1, 7)),
               ((3, 24, 40), (40, 18)), ((2, 24, 19), (2, 19, 33))]   # m = 24: g' by rows is (batches, m, n) exactly
MATMUL_SMALL = [((3, 5), (5, 7)), ((2, 3, 4), (4, 5)), ((3, 2, 4), (2, 1, 4, 5))]
MATMUL_SHAPES = MATMUL_SMALL if SMALL_SHAPES else MATMUL_FULL


def _check(got, want, dtype, what):
    assert len(got) == 3, what
    for name, g, w in zip(("d0", "d1", "dbias"), got, want):
        if w is None:
            assert g is None, f"{what} {name}: expected None"
            continue
        assert g.dtype == dtype, f"{what} {name}: dtype {g.dtype}"
        assert_close(g, w, TOL[np.dtype(dtype)], f"{what} {name}", cancel=True)


def _linear_inputs(g, sx, n, dtype):
    k = sx[-1]
    x, w = randn(g, sx, dtype), randn(g, (n, k), dtype)
    bias = randn(g, (n,), dtype)
    pre = fwd.linear(x, w, bias).astype(dtype)
    grad = randn(g, sx[:-1] + (n,), dtype)
    return grad, x, w, pre


def _matmul_inputs(g, sa, sb, dtype):
    a, b = randn(g, sa, dtype), randn(g, sb, dtype)
    pre = fwd.matmul(a, b, bias=randn(g, sb[-1:], dtype)).astype(dtype)
    grad = randn(g, pre.shape, dtype)
    return grad, a, b, pre


# ---- the references against PyTorch autograd -------------------------------------------------

@host_only
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_reference_matches_torch_autograd(activation):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    acts = {None: lambda t: t, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
    g = rng()
    # linear with leading dims and a bias
    x, w, bias = randn(g, (3, 5, 13), np.float64), randn(g, (9, 13), np.float64), randn(g, (9,), np.float64)
    grad = randn(g, (3, 5, 9), np.float64)
    ts = [torch.from_numpy(v).requires_grad_(True) for v in (x, w, bias)]
    y = acts[activation](F.linear(*ts))
    np.testing.assert_allclose(y.detach().numpy(), fwd.linear(x, w, bias, activation=activation), rtol=1e-12,
                               atol=1e-12)
    want = [d.numpy() for d in torch.autograd.grad(y, ts, torch.from_numpy(grad))]
    got = ref.linear_backward(grad, x, w, fwd.linear(x, w, bias), activation=activation, has_bias=True)
    for a, b_, nm in zip(got, want, ("dx", "dweight", "dbias")):
        assert_close(a, b_, 1e-9, f"linear {nm}", cancel=True)
    # broadcast matmul (both sides broadcast), no bias
    a, b = randn(g, (3, 1, 6, 7), np.float64), randn(g, (2, 7, 5), np.float64)
    ta, tb = (torch.from_numpy(v).requires_grad_(True) for v in (a, b))
    y = acts[activation](ta @ tb)
    grad = randn(g, tuple(y.shape), np.float64)
    want = [d.numpy() for d in torch.autograd.grad(y, [ta, tb], torch.from_numpy(grad))]
    got = ref.matmul_backward(grad, a, b, fwd.matmul(a, b), activation=activation)
    assert got[2] is None
    for a_, b_, nm in zip(got, want, ("da", "db")):
        assert a_.shape == b_.shape, nm
        assert_close(a_, b_, 1e-9, f"matmul {nm}", cancel=True)


# ---- every implementation against the reference ------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("impl", impl_params("linear_backward"))
def test_linear_backward_matches_reference(impl, activation, dtype):
    g = rng()
    for i, (sx, n) in enumerate(LINEAR_SHAPES):
        has_bias = i % 2 == 0
        grad, x, w, pre = _linear_inputs(g, sx, n, dtype)
        want = ref.linear_backward(grad, x, w, pre, activation=activation, has_bias=has_bias)
        got = run(impl, dispatch.linear_backward, grad, x, w, pre, activation=activation, has_bias=has_bias,
                  _op="linear_backward")
        _check(got, want, dtype, f"linear_backward {activation} {sx} N={n} bias={has_bias}")
        assert got[0].shape == x.shape and got[1].shape == w.shape


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "relu"], ids=str)
@pytest.mark.parametrize("impl", impl_params("matmul_backward"))
def test_matmul_backward_matches_reference(impl, activation, dtype):
    """Batched and broadcast: da / db summed over the dims their operand was broadcast along."""
    g = rng()
    for i, (sa, sb) in enumerate(MATMUL_SHAPES):
        has_bias = i % 2 == 1
        grad, a, b, pre = _matmul_inputs(g, sa, sb, dtype)
        want = ref.matmul_backward(grad, a, b, pre, activation=activation, has_bias=has_bias)
        got = run(impl, dispatch.matmul_backward, grad, a, b, pre, activation=activation, has_bias=has_bias,
                  _op="matmul_backward")
        assert got[0].shape == a.shape and got[1].shape == b.shape, (sa, sb)
        _check(got, want, dtype, f"matmul_backward {activation} {sa} @ {sb} bias={has_bias}")


@pytest.mark.parametrize("impl", impl_params("linear_backward"))
def test_linear_backward_views(impl):
    """Non-contiguous (strided) grad_out, x, weight and pre."""
    g = rng()
    sx, n = ((5, 6), 7) if SMALL_SHAPES else ((33, 100), 7)
    grad, x, w, pre = _linear_inputs(g, sx, n, np.float32)
    want = ref.linear_backward(grad, x, w, pre, activation="silu", has_bias=True)
    got = run(impl, dispatch.linear_backward, strided(grad), strided(x), strided(w), strided(pre), activation="silu",
              has_bias=True, _op="linear_backward")
    _check(got, want, np.float32, "strided")
    # a transposed weight view
    got = run(impl, dispatch.linear_backward, grad, x, np.ascontiguousarray(w.T).T, pre, activation="silu",
              has_bias=True, _op="linear_backward")
    _check(got, want, np.float32, "weight.T view")


@host_only
@pytest.mark.parametrize("impl", impl_params("matmul_backward"))
def test_read_only_inputs(impl):
    g = rng()
    grad, a, b, pre = _matmul_inputs(g, (2, 7, 33), (33, 9), np.float64)
    want = ref.matmul_backward(grad, a, b, pre, activation="gelu", has_bias=True)
    got = run(impl, dispatch.matmul_backward, read_only(grad), read_only(a), read_only(b), read_only(pre),
              activation="gelu", has_bias=True, _op="matmul_backward")
    _check(got, want, np.float64, "read-only")
    # a broadcast (zero-stride) b
    bb = np.broadcast_to(b, (2, 33, 9))
    got = run(impl, dispatch.matmul_backward, grad, a, bb, pre, activation="gelu", has_bias=True,
              _op="matmul_backward")
    want = ref.matmul_backward(grad, a, np.array(bb), pre, activation="gelu", has_bias=True)
    _check(got, want, np.float64, "broadcast b")


@pytest.mark.parametrize("activation", ["gelu", "relu", None], ids=str)
@pytest.mark.parametrize("impl", impl_params("linear_backward"))
def test_nan_in_gives_nan_out(impl, activation):
    """A NaN in pre (or grad_out) at (i, j) makes dx's row i, dweight's row j and dbias[j]
    NaN (relu too: its derivative at NaN is NaN); everything else stays finite."""
    g = rng()
    sx, n = ((6, 5), 7) if SMALL_SHAPES else ((33, 40), 17)
    grad, x, w, pre = _linear_inputs(g, sx, n, np.float32)
    i, j = 3, 4
    if activation is None:
        grad[i, j] = np.nan
    else:
        pre[i, j] = np.nan
    dx, dw, db = run(impl, dispatch.linear_backward, grad, x, w, pre, activation=activation, has_bias=True,
                     _op="linear_backward")
    assert np.isnan(dx[i]).all() and np.isnan(dw[j]).all() and np.isnan(db[j])
    assert np.isfinite(np.delete(dx, i, 0)).all() and np.isfinite(np.delete(dw, j, 0)).all()
    assert np.isfinite(np.delete(db, j)).all()


@host_only
def test_linear_backward_through_torch_tensors():
    """Tensors in, tensors out (dispatch.interop), the same values."""
    torch = pytest.importorskip("torch")
    g = rng()
    grad, x, w, pre = _linear_inputs(g, (9, 20), 11, np.float32)
    got = dispatch.linear_backward(*(torch.from_numpy(v) for v in (grad, x, w, pre)), activation="gelu", has_bias=True)
    assert all(isinstance(t, torch.Tensor) for t in got)
    _check([t.numpy() for t in got], ref.linear_backward(grad, x, w, pre, activation="gelu", has_bias=True),
           np.float32, "tensors")


# ---- bad input -----------------------------------------------------------------------------

@host_only
@pytest.mark.parametrize("call, err, msg", [
    (lambda: dispatch.linear_backward(np.ones((2, 3)), np.ones((2, 4)), np.ones((3, 4)), activation="gelu"),
     ValueError, "pre .* is required with activation='gelu'"),
    (lambda: dispatch.linear_backward(np.ones((2, 5)), np.ones((2, 4)), np.ones((3, 4))), ValueError,
     r"grad_out must have the forward's output shape \(2, 3\)"),
    (lambda: dispatch.linear_backward(np.ones((2, 3)), np.ones((2, 4)), np.ones((3, 5))), ValueError,
     "weight must have K=4 columns"),
    (lambda: dispatch.linear_backward(np.ones((2, 3)), np.ones((2, 4)), np.ones((3, 4)), np.ones((3, 2)),
                                      activation="relu"), ValueError, "pre must have the forward's output shape"),
    (lambda: dispatch.linear_backward(np.ones((2, 3), np.float32), np.ones((2, 4)), np.ones((3, 4))), TypeError,
     "x must have the same dtype as grad_out"),
    (lambda: dispatch.linear_backward(np.ones((2, 3)), np.ones((2, 4)), np.ones((3, 4)), np.ones((2, 3)),
                                      activation="tanh"), ValueError, "activation must be one of"),
    (lambda: dispatch.matmul_backward(np.ones((2, 3)), np.ones((2, 4)), np.ones((5, 3))), ValueError,
     "b must have K=4 rows"),
    (lambda: dispatch.matmul_backward(np.ones((2, 3)), np.ones((2, 2, 4)), np.ones((4, 3))), ValueError,
     r"grad_out must have the forward's output shape \(2, 2, 3\)"),
    (lambda: dispatch.matmul_backward(np.ones((2, 2, 3)), np.ones((2, 2, 4)), np.ones((3, 4, 3))), ValueError,
     "do not broadcast"),
    (lambda: dispatch.matmul_backward(np.arange(6).reshape(2, 3), np.ones((2, 4)), np.ones((4, 3))), TypeError,
     "grad_out must have dtype float32 or float64"),
    (lambda: dispatch.matmul_backward(np.ones((2, 3)), np.ones((2, 4)), np.ones((4, 3)), has_bias="yes"), TypeError,
     "has_bias"),
])
def test_bad_inputs_raise_naming_the_argument(call, err, msg):
    with pytest.raises(err, match=msg):
        call()


# ---- the CPU GEMM's register tiles -------------------------------------------------------------

def _tile_names():
    from kernels_cpu import gemm as K
    return list(K.TILE_NAMES)


@pytest.mark.skipif(ON_CUDA, reason="the CPU GEMM's register tiles")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", _tile_names())
def test_every_tile_matches_reference(tile, dtype):
    """cpu-gemm's prologue packers under each register tile (6x16: MR = 6 rows, not a multiple
    of the vector width, packed without the register transpose; 8x48 / 12x32 AVX-512 panels),
    rows and columns beyond one panel and one GRAD_CHUNK."""
    from kernels_cpu import gemm as K
    g = rng()
    prev = K.use_tile(tile)
    try:
        grad, x, w, pre = _linear_inputs(g, (300, 40), 270, dtype)  # M, N > GRAD_CHUNK
        want = ref.linear_backward(grad, x, w, pre, activation="gelu_tanh", has_bias=True)
        got = run("cpu-gemm", dispatch.linear_backward, grad, x, w, pre, activation="gelu_tanh", has_bias=True,
                  _op="linear_backward")
        _check(got, want, dtype, f"linear_backward tile {tile}")
        grad, a, b, pre = _matmul_inputs(g, (2, 3, 9, 20), (3, 20, 50), dtype)
        want = ref.matmul_backward(grad, a, b, pre, activation="silu", has_bias=True)
        got = run("cpu-gemm", dispatch.matmul_backward, grad, a, b, pre, activation="silu", has_bias=True,
                  _op="matmul_backward")
        _check(got, want, dtype, f"matmul_backward tile {tile}")
    finally:
        K.use_tile(prev)


@pytest.mark.skipif(ON_CUDA, reason="the CPU GEMM's blocking")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dweight_gemm_packs_a_in_its_tasks(dtype, monkeypatch):
    """dweight = g'^T @ x with many rows of W (many row blocks, one column block): its tasks
    pack their own A panels (kernels_cpu.gemm A_TASK_OK), the prologue packer forming g *
    gelu'(pre) and dbias while packing, with the same bits as packing all of A up front,
    and the reference's values."""
    from kernels_cpu import gemm as K
    g = rng()
    tasks, real_plan = spy_gemm_plans(monkeypatch, lambda res: bool(res[0][K.P_A_TASK]))
    n = 275 * K.active_tile().mr + 3   # W's rows: TASKS_MIN row blocks, the columns not split
    grad, x, w, pre = _linear_inputs(g, (50, 30), n, dtype)
    want = ref.linear_backward(grad, x, w, pre, activation="gelu", has_bias=True)
    got = {}
    try:
        for on in (True, False):
            monkeypatch.setattr(K, "A_TASK_OK", on)
            forget_gemm_plans(real_plan)
            tasks.clear()
            got[on] = run("cpu-gemm", dispatch.linear_backward, grad, x, w, pre, activation="gelu", has_bias=True,
                          _op="linear_backward")
            assert len(tasks) == 2 and tasks[1] == on and (on or not tasks[0]), tasks   # [0]: dx's GEMM
    finally:
        forget_gemm_plans(real_plan)
    for a, b in zip(got[True], got[False]):
        np.testing.assert_array_equal(a, b)
    _check(got[True], want, dtype, "linear_backward dweight's A packed in its tasks")


@pytest.mark.skipif(ON_CUDA, reason="the CPU GEMM's plans")
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_forms_the_derivative_once(dtype, monkeypatch):
    """With an activation, the first backward GEMM's prologue forms g' = grad * act'(pre) by
    rows into its packing buffer (kernels_cpu.gemm's a_rows; rows past M zeroed), which its
    micro-kernel reads as an A in place; the second GEMM reads that g', its prologue with no
    activation (dbias only): the derivative is formed once.  Row counts on and off the
    tile's; batched matmul with whole tiles (g' is (batches, m, n) exactly); the reference's
    values."""
    from kernels_cpu import gemm as K, linalg_grad as KG
    from kernels_cpu.approx import ACT_GELU, ACT_NONE
    g = rng()
    mr = K.active_tile().mr
    rows, real_plan = spy_gemm_plans(monkeypatch, lambda res: bool(res[0][K.P_A_ROWS]))
    prologues, real_pro = [], KG.grad_prologue

    def spy(kind, pre, dbias, dt, code, *rest):
        prologues.append((kind, code))
        return real_pro(kind, pre, dbias, dt, code, *rest)

    monkeypatch.setattr(KG, "grad_prologue", spy)
    forget_gemm_plans(real_plan)
    try:
        cases = [("linear", (2 * mr, 30), 19), ("linear", (2 * mr + 1, 30), 19), ("matmul", (2, 2 * mr, 30), (30, 19))]
        for op, s1, s2 in cases:
            rows.clear()
            prologues.clear()
            if op == "linear":
                grad, a, b, pre = _linear_inputs(g, s1, s2, dtype)
                second = "cols_a"
            else:
                grad, a, b, pre = _matmul_inputs(g, s1, s2, dtype)
                second = "cols_b"
            fn, rf = getattr(dispatch, f"{op}_backward"), getattr(ref, f"{op}_backward")
            got = run("cpu-gemm", fn, grad, a, b, pre, activation="gelu", has_bias=True, _op=f"{op}_backward")
            what = f"{op} {s1} {s2}"
            assert rows == [True, False], (what, rows)
            assert prologues == [("rows", ACT_GELU), (second, ACT_NONE)], (what, prologues)
            _check(got, rf(grad, a, b, pre, activation="gelu", has_bias=True), dtype, what)
    finally:
        forget_gemm_plans(real_plan)


@pytest.mark.skipif(ON_CUDA, reason="the CPU GEMM's task plans")
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_gemms_pack_b_in_their_tasks(dtype, monkeypatch):
    """The backward GEMMs are blocked as the forward's: where a call packs B, the tasks pack
    their own B panels (kernels_cpu.gemm B_TASK_SLICE / OWN), capped to B_IN_TASK_BYTES,
    here one panel of dx's B (W, read as (K, N) = (40, 1100): rows too long to read in
    place) - not all of B up front; and the results are the reference's."""
    from kernels_cpu import gemm as K
    g = rng()
    nr = K.active_tile().nr(dtype)
    monkeypatch.setattr(K, "B_IN_TASK_BYTES", 40 * nr * np.dtype(dtype).itemsize)
    tasks, real_plan = spy_gemm_plans(monkeypatch, lambda res: int(res[0][K.P_B_TASK]))
    forget_gemm_plans(real_plan)
    try:
        grad, x, w, pre = _linear_inputs(g, (16, 1100), 40, dtype)
        for activation in (None, "gelu"):
            tasks.clear()
            want = ref.linear_backward(grad, x, w, pre, activation=activation, has_bias=True)
            got = run("cpu-gemm", dispatch.linear_backward, grad, x, w, pre, activation=activation, has_bias=True,
                      _op="linear_backward")
            _check(got, want, dtype, f"linear_backward {activation} B packed in the tasks")
            assert len(tasks) == 2 and K.B_TASK_NONE not in tasks, tasks
    finally:
        forget_gemm_plans(real_plan)
