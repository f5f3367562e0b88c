"""dispatch.attention_backward and attention(return_lse=True) against the float64 references
(tests/reference/attention_grad.py, checked themselves against PyTorch autograd of the
softmax(q k^T scale + mask) v composition), for every implementation the dispatcher can
pick on the target device: causal (bottom-right) or not, bool / additive masks, GQA, Sq <
Skv, Sq = 1, Sq > Skv, D not a multiple of 16, fused-QKV views, read-only inputs, NaN."""
import numpy as np
import pytest

import dispatch
from dispatch.select import NoImplementationError
from tests.reference import attention as fwd
from tests.reference import attention_grad as ref
from tests.support import ON_CUDA, SMALL_SHAPES, assert_close, impl_params, poisoned, randn, read_only, rng, run

IMPLS = impl_params("attention_backward")
FWD_IMPLS = impl_params("attention", dtype=np.float32)
DTYPES = [np.float32, np.float64]
TOL = {np.dtype(np.float32): 2e-4, np.dtype(np.float64): 1e-9}
host_only = pytest.mark.skipif(ON_CUDA, reason="host-array checks run on the CPU target")

# (B, Hq, Hkv, Sq, Skv, D, causal)
FULL = [
    (1, 1, 1, 1, 1, 1, False),
    (2, 4, 2, 9, 20, 24, True),         # GQA, Sq < Skv, D = 24 (not a multiple of 16)
    (1, 4, 1, 1, 300, 64, True),        # MQA decode: key chunks and the dq reduction pass
    (1, 2, 2, 70, 70, 16, True),        # square causal over tile edges
    (2, 3, 3, 40, 20, 8, True),         # Sq > Skv: the first rows see no key
    (1, 4, 2, 37, 150, 24, False),      # GQA, several key tiles, non-causal
    (1, 8, 2, 65, 129, 80, True),       # two query tiles per group row block, D = 80
]
SMALL = [
    (1, 1, 1, 1, 1, 1, False),
    (1, 4, 2, 3, 7, 8, True),
    (1, 2, 1, 1, 40, 4, True),
    (1, 2, 2, 5, 3, 3, True),
]
SHAPES = SMALL if SMALL_SHAPES else FULL


def _sid(s):
    return "B{}Hq{}Hkv{}Sq{}Skv{}D{}{}".format(*s[:6], "c" if s[6] else "")


def _inputs(g, B, Hq, Hkv, Sq, Skv, D, dtype, *, causal=False, mask=None, scale=None):
    """q, k, v, grad_out and the forward's out and lse (the float64 reference, rounded to
    dtype: the backward is checked alone)."""
    q = randn(g, (B, Hq, Sq, D), dtype) * 1.5
    k, v = randn(g, (B, Hkv, Skv, D), dtype), randn(g, (B, Hkv, Skv, D), dtype)
    go = randn(g, (B, Hq, Sq, D), dtype)
    out = fwd.attention(q, k, v, causal=causal, mask=mask, scale=scale).astype(dtype)
    lse = ref.attention_lse(q, k, v, causal=causal, mask=mask, scale=scale).astype(dtype)
    return go, q, k, v, out, lse


def _check(got, want, dtype, what):
    assert len(got) == 3
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert a.dtype == dtype and a.shape == b.shape, (name, a.dtype, a.shape)
        assert_close(a, b, TOL[np.dtype(dtype)], f"{what} {name}", cancel=True)


# ---- the references ----------------------------------------------------------------------

@host_only
@pytest.mark.parametrize("causal, mask_kind", [(False, None), (True, None), (True, "bool"), (False, "add")])
def test_reference_matches_torch_autograd(causal, mask_kind):
    torch = pytest.importorskip("torch")
    g = rng()
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 5, 9, 6
    mask = None
    if mask_kind == "bool":
        mask = g.random((B, 1, Sq, Skv)) < 0.7
        # every row sees a key (torch's softmax of a row of -inf is NaN): key 0, which the
        # bottom-right causal mask leaves visible to every row (the last key is hidden from
        # all but the last row: NK_TEST_SEED=1970735781 masked a whole causal row)
        mask[..., 0] = True
    elif mask_kind == "add":
        mask = randn(g, (Sq, Skv), np.float64)
        mask[g.random((Sq, Skv)) < 0.3] = -np.inf
        mask[:, 0] = 0.0
    go, q, k, v, out, lse = _inputs(g, B, Hq, Hkv, Sq, Skv, D, np.float64, causal=causal, mask=mask, scale=0.7)
    tq, tk, tv = (torch.from_numpy(a).requires_grad_(True) for a in (q, k, v))
    kk, vv = tk.repeat_interleave(Hq // Hkv, dim=1), tv.repeat_interleave(Hq // Hkv, dim=1)
    s = tq @ kk.transpose(-1, -2) * 0.7
    if mask is not None:
        tm = torch.from_numpy(mask)
        s = s.masked_fill(~tm, -np.inf) if mask.dtype == np.bool_ else s + tm
    if causal:
        vis = torch.ones(Sq, Skv, dtype=torch.bool).tril(Skv - Sq)
        s = s.masked_fill(~vis, -np.inf)
    y = torch.softmax(s, dim=-1) @ vv
    assert_close(torch.logsumexp(s, dim=-1).detach().numpy(), lse, 1e-13, "lse", cancel=True)
    assert_close(y.detach().numpy(), out, 1e-13, "out", cancel=True)
    want = torch.autograd.grad(y, (tq, tk, tv), torch.from_numpy(go))
    got = ref.attention_backward(go, q, k, v, out, lse, causal=causal, mask=mask, scale=0.7)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert_close(a, b.numpy(), 1e-9, name, cancel=True)


# ---- the forward's log-sum-exp -------------------------------------------------------------

LSE_SHAPES = [(1, 4, 2, 3, 7, 8, True), (1, 2, 1, 1, 40, 4, False)] if SMALL_SHAPES else \
    [(2, 4, 2, 9, 70, 24, True), (1, 4, 1, 1, 600, 64, True), (1, 2, 2, 130, 130, 16, False),
     (1, 2, 1, 40, 20, 8, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", LSE_SHAPES, ids=_sid)
@pytest.mark.parametrize("impl", FWD_IMPLS)
def test_forward_returns_lse(impl, shape, dtype):
    """attention(return_lse=True): the same out as without, and lse of the reference (-inf
    for the rows that see no key: Sq > Skv causal, a fully masked row)."""
    B, Hq, Hkv, Sq, Skv, D, causal = shape
    g = rng()
    q = randn(g, (B, Hq, Sq, D), dtype) * 2
    k, v = randn(g, (B, Hkv, Skv, D), dtype), randn(g, (B, Hkv, Skv, D), dtype)
    mask = g.random((Sq, Skv)) < 0.8
    mask[Sq // 2] = False
    for m in (None, mask):
        plain = run(impl, dispatch.attention, q, k, v, causal=causal, mask=m)
        got, lse = run(impl, dispatch.attention, q, k, v, causal=causal, mask=m, return_lse=True,
                       out=poisoned(q.shape, dtype))
        assert lse.dtype == dtype and lse.shape == (B, Hq, Sq)
        np.testing.assert_array_equal(got, plain)
        want = ref.attention_lse(q, k, v, causal=causal, mask=m)
        assert np.array_equal(np.isneginf(lse), np.isneginf(want))
        fin = np.isfinite(want)
        assert_close(lse[fin], want[fin], TOL[np.dtype(dtype)] / 10, f"{impl} lse", cancel=True)


# ---- the backward --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_sid)
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, shape, dtype):
    B, Hq, Hkv, Sq, Skv, D, causal = shape
    g = rng()
    args = _inputs(g, B, Hq, Hkv, Sq, Skv, D, dtype, causal=causal)
    if ON_CUDA and dtype == np.float64 and D > 64:
        # the float64 kernel's 128-wide tiles would need more shared memory than a kernel may
        # declare statically: refused with the reason, as the forward (test_attention.py)
        with pytest.raises(NoImplementationError, match="shared memory"):
            run(impl, dispatch.attention_backward, *args, causal=causal)
        return
    want = ref.attention_backward(*args, causal=causal)
    got = run(impl, dispatch.attention_backward, *args, causal=causal)
    _check(got, want, dtype, f"{impl} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_scale(impl, dtype):
    g = rng()
    args = _inputs(g, 1, 4, 2, 6, 11, 8, dtype, scale=0.3)
    _check(run(impl, dispatch.attention_backward, *args, scale=0.3),
           ref.attention_backward(*args, scale=0.3), dtype, f"{impl} scale")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind, mshape", [("bool", "skv"), ("add", "sq_skv"), ("bool", "b1_sq_skv"),
                                          ("add", "b_hq_sq_skv")])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_masks(impl, dtype, kind, mshape, causal):
    """Masks of every form the forward takes; a fully masked row (its output zeros)
    contributes nothing."""
    B, Hq, Hkv, Sq, Skv, D = (1, 2, 1, 3, 9, 4) if SMALL_SHAPES else (2, 4, 2, 37, 150, 24)
    g = rng()
    full = {"skv": (Skv,), "sq_skv": (Sq, Skv), "b1_sq_skv": (B, 1, Sq, Skv), "b_hq_sq_skv": (B, Hq, Sq, Skv)}[mshape]
    if kind == "bool":
        mask = g.random(full) < 0.7
    else:
        mask = randn(g, full, dtype)
        mask[g.random(full) < 0.3] = -np.inf
    if len(full) >= 2:
        mask[..., Sq - 1, :] = False if kind == "bool" else -np.inf
    args = _inputs(g, B, Hq, Hkv, Sq, Skv, D, dtype, causal=causal, mask=mask)
    got = run(impl, dispatch.attention_backward, *args, causal=causal, mask=mask)
    want = ref.attention_backward(*args, causal=causal, mask=mask)
    _check(got, want, dtype, f"{impl} {kind} {mshape}")
    if len(full) >= 2:
        assert np.all(got[0][:, :, Sq - 1] == 0)


@pytest.mark.parametrize("D", [16, 24])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_fused_qkv_views(impl, dtype, D):
    """q, k, v as the transposed views of one fused QKV projection (B, S, 3, H, D), grad_out
    and out as transposed (B, S, H, D) buffers: what a transformer layer hands over."""
    B, H, S = (1, 2, 5) if SMALL_SHAPES else (2, 3, 70)
    g = rng()
    qkv = randn(g, (B, S, 3, H, D), dtype)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    go = randn(g, (B, S, H, D), dtype).transpose(0, 2, 1, 3)
    out = fwd.attention(q, k, v, causal=True).astype(dtype)
    outv = np.empty((B, S, H, D), dtype).transpose(0, 2, 1, 3)
    outv[...] = out
    lse = ref.attention_lse(q, k, v, causal=True).astype(dtype)
    got = run(impl, dispatch.attention_backward, go, q, k, v, outv, lse, causal=True)
    _check(got, ref.attention_backward(go, q, k, v, out, lse, causal=True), dtype, f"{impl} views")


@pytest.mark.parametrize("impl", IMPLS)
def test_roundtrip_with_forward(impl):
    """attention(return_lse=True) then attention_backward, both ours (float64)."""
    g = rng()
    B, Hq, Hkv, Sq, Skv, D = (1, 2, 1, 3, 6, 4) if SMALL_SHAPES else (1, 4, 2, 50, 90, 32)
    q = randn(g, (B, Hq, Sq, D), np.float64)
    k, v = randn(g, (B, Hkv, Skv, D), np.float64), randn(g, (B, Hkv, Skv, D), np.float64)
    go = randn(g, (B, Hq, Sq, D), np.float64)
    fimpl = "cuda-flash" if ON_CUDA else "cpu-flash"
    out, lse = run(fimpl, dispatch.attention, q, k, v, causal=True, return_lse=True)
    got = run(impl, dispatch.attention_backward, go, q, k, v, out, lse, causal=True)
    want = ref.attention_backward(go, q, k, v, fwd.attention(q, k, v, causal=True),
                                  ref.attention_lse(q, k, v, causal=True), causal=True)
    _check(got, want, np.float64, f"{impl} round trip")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("where", ["q", "grad_out"])
@pytest.mark.parametrize("impl", IMPLS)
def test_nan_in_gives_nan_out(impl, where):
    """NaN in one query's q (its scores, out and lse NaN) or grad_out (its D_i): that row's
    dq and every dk / dv of its kv head are NaN (the row sees every key), nothing else."""
    g = rng()
    B, Hq, Hkv, Sq, Skv, D = (1, 4, 2, 3, 5, 4) if SMALL_SHAPES else (2, 4, 2, 9, 70, 16)
    go, q, k, v, out, lse = _inputs(g, B, Hq, Hkv, Sq, Skv, D, np.float32)
    if where == "q":
        q[1 % B, 3, 2, 1] = np.nan
        out = fwd.attention(q, k, v).astype(np.float32)
        lse = ref.attention_lse(q, k, v).astype(np.float32)
    else:
        go[1 % B, 3, 2, 1] = np.nan
    got = run(impl, dispatch.attention_backward, go, q, k, v, out, lse)
    want = ref.attention_backward(go, q, k, v, out, lse)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
    assert np.isnan(got[0][1 % B, 3, 2]).all() and np.isnan(got[1][1 % B, 1]).all()
    assert np.isfinite(got[1][0 if B > 1 else 0, 0]).all()
    _check(got, want, np.float32, f"{impl} NaN")


@host_only
@pytest.mark.parametrize("impl", IMPLS)
def test_read_only_and_broadcast_inputs(impl):
    g = rng()
    args = _inputs(g, 2, 4, 2, 9, 70, 16, np.float32, causal=True)
    want = ref.attention_backward(*args, causal=True)
    got = run(impl, dispatch.attention_backward, *(read_only(a) for a in args), causal=True)
    _check(got, want, np.float32, f"{impl} read-only")
    go, q, k, v, out, lse = args
    kb = np.broadcast_to(k[:1, :1], k.shape)
    outb = fwd.attention(q, kb, kb, causal=True).astype(np.float32)
    lseb = ref.attention_lse(q, kb, kb, causal=True).astype(np.float32)
    got = run(impl, dispatch.attention_backward, go, q, kb, kb, outb, lseb, causal=True)
    _check(got, ref.attention_backward(go, q, np.array(kb), np.array(kb), outb, lseb, causal=True), np.float32,
           f"{impl} broadcast k, v")


@host_only
def test_deterministic_across_threads_and_implementations():
    """The same bits at 1 and 2 threads, from cpu-flash and cpu-serial, and across runs, with
    a decode shape (key chunks, dq reduced over them) and a prefill shape."""
    import numba

    g = rng()
    for shape in ((1, 4, 1, 1, 300, 64), (1, 4, 2, 70, 90, 24)):
        args = _inputs(g, *shape, np.float32, causal=True)
        results = []
        old = numba.get_num_threads()
        try:
            for nt, impl in ((1, "cpu-flash"), (min(2, numba.config.NUMBA_NUM_THREADS), "cpu-flash"),
                             (2 if numba.config.NUMBA_NUM_THREADS >= 2 else 1, "cpu-serial")):
                numba.set_num_threads(nt)
                results.append(run(impl, dispatch.attention_backward, *args, causal=True))
                results.append(run(impl, dispatch.attention_backward, *args, causal=True))
        finally:
            numba.set_num_threads(old)
        for r in results[1:]:
            for a, b in zip(r, results[0]):
                assert np.array_equal(a, b)


@host_only
def test_empty_kv_gives_zero_dq():
    g = rng()
    q = randn(g, (1, 2, 3, 8), np.float32)
    k = np.zeros((1, 1, 0, 8), np.float32)
    out = np.zeros_like(q)
    lse = np.full((1, 2, 3), -np.inf, np.float32)
    dq, dk, dv = dispatch.attention_backward(q, q, k, k, out, lse)
    assert np.all(dq == 0) and dk.shape == (1, 1, 0, 8) and dv.shape == (1, 1, 0, 8)


# ---- bad input ---------------------------------------------------------------------------

def _ok():
    g = rng()
    return list(_inputs(g, 2, 4, 2, 5, 7, 8, np.float32))


@host_only
@pytest.mark.parametrize("change, err, match", [
    (lambda a: a.__setitem__(0, a[0][..., :4]), ValueError, r"grad_out must have shape \(2, 4, 5, 8\)"),
    (lambda a: a.__setitem__(4, a[4][:, :2]), ValueError, r"output must have shape \(2, 4, 5, 8\)"),
    (lambda a: a.__setitem__(5, a[5][..., :3]), ValueError, r"lse must have shape \(2, 4, 5\)"),
    (lambda a: a.__setitem__(0, a[0].astype(np.float64)), TypeError, "grad_out must have the same dtype as q"),
    (lambda a: a.__setitem__(5, a[5].astype(np.float64)), TypeError, "lse must have the same dtype as q"),
    (lambda a: a.__setitem__(2, a[2][:, :, :6]), ValueError, "v must have the shape of k"),
    (lambda a: a.__setitem__(1, a[1][0]), ValueError, "q must have 4 dimensions"),
    (lambda a: a.__setitem__(5, None), TypeError, "lse must be"),
])
def test_bad_inputs(change, err, match):
    a = _ok()
    change(a)
    with pytest.raises(err, match=match):
        dispatch.attention_backward(*a)


@host_only
@pytest.mark.parametrize("kw, err, match", [
    ({"causal": 1}, TypeError, "causal must be a bool"),
    ({"mask": np.ones((5, 6), bool)}, ValueError, "mask of shape"),
    ({"mask": np.ones(7, np.int8)}, TypeError, "mask must have dtype bool or float32"),
    ({"scale": float("nan")}, ValueError, "scale must be a finite"),
])
def test_bad_options(kw, err, match):
    with pytest.raises(err, match=match):
        dispatch.attention_backward(*_ok(), **kw)


@host_only
def test_return_lse_must_be_bool():
    q = np.ones((1, 1, 2, 4), np.float32)
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        dispatch.attention(q, q, q, return_lse=1)


@host_only
def test_explain_names_the_kernels():
    g = rng()
    small = _inputs(g, 1, 2, 2, 5, 5, 8, np.float32)
    big = _inputs(g, 1, 4, 4, 128, 128, 64, np.float32, causal=True)
    assert dispatch.explain("attention_backward", *small).chosen == "cpu-serial"
    assert dispatch.explain("attention_backward", *big, causal=True).chosen == "cpu-flash"
