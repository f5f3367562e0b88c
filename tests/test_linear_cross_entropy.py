"""linear_cross_entropy(_with_grad): the chunked sweep against the float64 composition,
its gradients, its autograd form against PyTorch's, its extra memory at T = 4096,
V = 32768, and bad inputs."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import dispatch
from dispatch.ops import linear_cross_entropy as L
from tests import support
from tests.reference import linear_cross_entropy as R


def _ref(x, w, t, b, reduction, ignore_index):
    """float64 loss, and (dx, dweight, dbias) for "mean" / "sum"."""
    loss = R.linear_cross_entropy(x, w, t, b, reduction=reduction, ignore_index=ignore_index)
    if reduction == "none":
        return loss, None
    return loss, R.linear_cross_entropy_with_grad(x, w, t, b, reduction=reduction, ignore_index=ignore_index)[1:]


def _inputs(rng, t, h, v, dtype, bias, ignore):
    x = rng.standard_normal((t, h)).astype(dtype)
    w = (rng.standard_normal((v, h)) / np.sqrt(h)).astype(dtype)
    b = rng.standard_normal(v).astype(dtype) if bias else None
    tg = rng.integers(0, v, size=t)
    if ignore:
        tg[::4] = -100
    return x, w, tg, b


def _run(impl, chunk_bytes, *args, **kw):
    """The implementation run directly with a chunk size (params), on the test's target."""
    op = dispatch.registry.OPS[kw.pop("op")]
    call = op.describe(*(support.to_target(a) for a in args), **kw)
    return support.to_host(op.implementations[impl].run({"chunk_bytes": chunk_bytes}, *call.args))


TOL = {np.float32: 2e-4, np.float64: 1e-9}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


# (T, H, V, rows per chunk): the simulator runs every GPU thread in Python, so tiny there:
# two chunks, the second shorter (each chunk is ~10 simulated launches; three chunks made
# these the slowest simulator tests, 6-7 s each)
SHAPE = (9, 4, 20, 5) if support.SMALL_SHAPES else (37, 16, 300, 7)


# bias and ignored targets: every combination, except under the simulator, where a bias
# with ignored targets and neither (each feature on, and off) keep the job's time down: the
# 24 cases took 6-10 s each there, the slowest tests of the simulator job (2026-11-27)
BIAS_IGNORE = [(False, False), (True, True)] if support.SIMULATOR else [(b, i) for b in (False, True) for i in (False, True)]


@pytest.mark.parametrize("impl", support.impl_params("linear_cross_entropy"))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias, ignore", BIAS_IGNORE)
def test_loss_and_grads_match_reference(impl, dtype, reduction, bias, ignore):
    rng = support.rng()
    t, h, v, rows = SHAPE
    x, w, tg, b = _inputs(rng, t, h, v, dtype, bias, ignore)
    want, want_grads = _ref(x, w, tg, b, reduction, -100)
    # a few rows of logits per chunk, the last chunk shorter: the chunk edges are exercised
    chunk = rows * v * np.dtype(dtype).itemsize
    got = _run(impl, chunk, x, w, tg, b, reduction=reduction, op="linear_cross_entropy")
    assert np.asarray(got).dtype == dtype and _rel(got, want) <= TOL[dtype]
    with dispatch.use(linear_cross_entropy=impl):
        whole = dispatch.linear_cross_entropy(*(support.to_target(a) for a in (x, w, tg, b)), reduction=reduction)
    assert _rel(support.to_host(whole), want) <= TOL[dtype]
    if reduction == "none":
        return
    loss, dx, dw, db = _run(impl, chunk, x, w, tg, b, reduction=reduction, op="linear_cross_entropy_with_grad")
    assert _rel(loss, want) <= TOL[dtype]
    for name, g, r in (("dx", dx, want_grads[0]), ("dweight", dw, want_grads[1])):
        assert g.dtype == dtype and _rel(g, r) <= TOL[dtype], name
    assert (db is None) == (b is None)
    if b is not None:
        assert _rel(db, want_grads[2]) <= TOL[dtype]


HOST_ONLY = pytest.mark.skipif(support.ON_CUDA, reason="host path (the CPU test step runs it)")


@HOST_ONLY
@pytest.mark.parametrize("t, v, chunk_bytes", [(512, 50257, 32 << 20), (37, 300, 7 * 300 * 4), (1, 50257, 32 << 20),
                                                (129, 10, 64 * 10 * 4), (1000, 7, 1), (0, 300, 1200),
                                                (4096, 50257, 32 << 20), (4096, 32768, 32 << 20)])
def test_rows_per_chunk_spreads_rows_without_adding_chunks(t, v, chunk_bytes):
    """At most most_rows a chunk, no more chunks than most_rows needs, and every chunk but
    the last the same size (GPT-2's 512 rows: four of 128, not 3 x 166 + 14)."""
    w = np.zeros((v, 1), np.float32)
    most = L.most_rows({"chunk_bytes": chunk_bytes}, v, 4, t)
    assert most >= L.chunk_rows(v, 4, chunk_bytes)
    rows = L.rows_per_chunk({"chunk_bytes": chunk_bytes}, w, np.float32, t)
    assert 1 <= rows <= most
    assert -(-t // rows) == -(-t // most)
    if t:
        assert rows == -(-t // -(-t // most))
    if (t, v) == (512, 50257):
        assert rows == 128
    if t == 4096:   # an eighth of the logits, up to CHUNK_MAX_ROWS: eight chunks of 512
        assert rows == L.CHUNK_MAX_ROWS == 512


@HOST_ONLY  # host arrays: under the simulator it ran the CPU kernels again (16 s, 2026-12-02)
def test_per_row_backward_matches_reference():
    rng = support.rng()
    x, w, t, b = _inputs(rng, 21, 8, 50, np.float64, True, True)
    gl = rng.standard_normal(21)
    dx, dw, db = L.backward_per_row(gl, x, w, t, b, chunk_bytes=5 * 50 * 8)
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    keep = t != -100
    p[np.arange(21)[keep], t[keep]] -= 1
    p[~keep] = 0
    g = p * gl[:, None]
    assert _rel(dx, g @ w) <= 1e-9 and _rel(dw, g.T @ x) <= 1e-9 and _rel(db, g.sum(0)) <= 1e-9


@HOST_ONLY
def test_all_ignored_mean_is_nan_as_pytorch():
    rng = support.rng()
    x, w, t, b = _inputs(rng, 5, 4, 9, np.float64, False, False)
    t[:] = -100
    assert np.isnan(dispatch.linear_cross_entropy(x, w, t))


@HOST_ONLY
def test_nan_in_gives_nan_out():
    rng = support.rng()
    x, w, t, _ = _inputs(rng, 6, 4, 9, np.float32, False, False)
    x[2, 1] = np.nan
    assert np.isnan(dispatch.linear_cross_entropy(x, w, t))
    assert np.isnan(dispatch.linear_cross_entropy(x, w, t, reduction="none")[2])


@HOST_ONLY
@pytest.mark.parametrize("change, exc, name", [
    (lambda a: {**a, "targets": np.array([0, 1, 9, 2, 3, 4])}, ValueError, "targets"),
    (lambda a: {**a, "weight": a["weight"][:, :3]}, ValueError, "weight"),
    (lambda a: {**a, "weight": a["weight"].astype(np.float64)}, TypeError, "weight"),
    (lambda a: {**a, "bias": np.zeros(8, np.float32)}, ValueError, "bias"),
    (lambda a: {**a, "targets": np.zeros(6, np.float32)}, TypeError, "targets"),
    (lambda a: {**a, "reduction": "avg"}, ValueError, "reduction"),
])
def test_bad_input_names_argument(change, exc, name):
    rng = support.rng()
    x, w, t, _ = _inputs(rng, 6, 4, 9, np.float32, False, False)
    a = change({"x": x, "weight": w, "targets": t, "bias": None, "reduction": "mean"})
    with pytest.raises(exc, match=name):
        dispatch.linear_cross_entropy(a["x"], a["weight"], a["targets"], a["bias"], reduction=a["reduction"])


@HOST_ONLY
def test_with_grad_refuses_none_reduction():
    rng = support.rng()
    x, w, t, _ = _inputs(rng, 6, 4, 9, np.float32, False, False)
    with pytest.raises(ValueError, match="none"):
        dispatch.linear_cross_entropy_with_grad(x, w, t, reduction="none")


@HOST_ONLY
def test_extra_memory_well_under_a_quarter_of_the_logits():
    """T = 4096, V = 32768 float32 (512 MiB of logits): the sweep with gradients allocates
    well under a quarter of that beyond its results (numpy allocations, traced by
    tracemalloc): one chunk of logits, an eighth of them (64 MiB, 512 rows), the dweight
    GEMM packing its A (the chunk's gradient) in its tasks, into ~1 MiB of slices (a copy
    of that gradient would double the extra: gemm.A_TASK_OK); where the chunks' logits GEMM
    runs our GEMM, its packed copy of the weight too (4 MiB)."""
    rng = support.rng()
    t, h, v = 4096, 32, 32768
    x = rng.standard_normal((t, h), dtype=np.float32)
    w = (rng.standard_normal((v, h), dtype=np.float32) / np.sqrt(h)).astype(np.float32)
    tg = rng.integers(0, v, size=t)
    logits_bytes = t * v * 4
    # compile first, at this very shape: the dispatcher picks other kernels (parallel, another
    # GEMM) for a small one, and a compile inside the traced call allocated 75 MiB (a cold cache)
    dispatch.linear_cross_entropy_with_grad(x, w, tg)
    dispatch.empty_cache()   # the result arena's buffers from that call: allocated again, and traced, below
    tracemalloc.start()
    try:
        loss, dx, dw, db = dispatch.linear_cross_entropy_with_grad(x, w, tg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    results = dx.nbytes + dw.nbytes
    extra = peak - results
    assert extra <= logits_bytes / 8 + w.nbytes + (1 << 20), \
        f"extra {extra / 2**20:.0f} MiB vs logits {logits_bytes / 2**20:.0f} MiB"
    assert np.isfinite(loss)


@HOST_ONLY
def test_autograd_matches_pytorch():
    torch = pytest.importorskip("torch")
    import dispatch.autograd as nka
    F = torch.nn.functional
    g = torch.Generator().manual_seed(int(support.rng().integers(2 ** 62)))
    for reduction in ("mean", "sum", "none"):
        for bias in (False, True):
            x = torch.randn(13, 6, generator=g, dtype=torch.float64)
            w = torch.randn(40, 6, generator=g, dtype=torch.float64)
            b = torch.randn(40, generator=g, dtype=torch.float64) if bias else None
            t = torch.randint(0, 40, (13,), generator=g)
            t[3] = -100
            leaves = [a for a in (x, w, b) if a is not None]

            def grads(fn):
                ins = [a.clone().requires_grad_() for a in leaves]
                xs, ws, bs = ins[0], ins[1], (ins[2] if bias else None)
                loss = fn(xs, ws, t, bs)
                up = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype).reshape(loss.shape)
                (loss * up).sum().backward()
                return loss.detach(), [a.grad for a in ins]

            ours = grads(lambda x, w, t, b: nka.linear_cross_entropy(x, w, t, b, reduction=reduction))
            ref = grads(lambda x, w, t, b: F.cross_entropy(F.linear(x, w, b), t, reduction=reduction))
            assert _rel(ours[0].numpy(), ref[0].numpy()) <= 1e-9
            for a, r in zip(ours[1], ref[1]):
                assert _rel(a.numpy(), r.numpy()) <= 1e-9, (reduction, bias)
