"""dispatch.{softmax_backward, log_softmax_backward, cross_entropy_with_grad,
cross_entropy_backward}: the float64 references against PyTorch autograd, then every
implementation the dispatcher can pick on the target device against the references."""
import math

import numpy as np
import pytest

import dispatch
from tests.reference import softmax as fwd
from tests.reference import softmax_grad as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, assert_close, impl_params, poisoned, randn, read_only,
                           reduction_tol, rng, run, strided, to_host, to_target)

DTYPES = [np.float32, np.float64]
TOL = {np.float32: 2e-4, np.float64: 1e-9}  # grad_common.md: rel err, normwise and elementwise
SM_OPS = [("softmax_backward", fwd.softmax), ("log_softmax_backward", fwd.log_softmax)]
CE_OPS = ["cross_entropy_with_grad", "cross_entropy_backward"]
REDUCTIONS = ["mean", "sum", "none"]
cpu_only = pytest.mark.skipif(ON_CUDA, reason="device-independent checks (host arrays)")


def _cases(names):
    out = []
    for name in names:
        for p in impl_params(name):
            out.append(pytest.param(name, p.values[0], id=f"{name}-{p.id}", marks=p.marks))
    return out


def _close(got, want, dtype, what=""):
    # gradients are differences that cancel (g - sum(g y), softmax - onehot): the absolute
    # error is relative to the largest entry
    assert_close(got, want, TOL[np.dtype(dtype).type], what, cancel=True)


def _sm_inputs(g, shape, dtype, forward, axis=-1):
    x = randn(g, shape, np.float64) * 3
    return randn(g, shape, dtype), forward(x, axis).astype(dtype)


# ---- the references against PyTorch autograd (float64) ------------------------------------

@cpu_only
@pytest.mark.parametrize("shape, axis", [((5, 7), -1), ((3, 4, 6), 1), ((3, 4, 6), 0), ((9,), 0)])
def test_reference_softmax_grads_match_torch_autograd(shape, axis):
    torch = pytest.importorskip("torch")
    g = rng()
    x = randn(g, shape, np.float64) * 3
    go = randn(g, shape, np.float64)
    for name, tfn in (("softmax_backward", torch.softmax), ("log_softmax_backward", torch.log_softmax)):
        tx = torch.from_numpy(x).requires_grad_(True)
        y = tfn(tx, axis)
        y.backward(torch.from_numpy(go))
        want = tx.grad.numpy()
        got = getattr(ref, name)(go, y.detach().numpy(), axis)
        assert_close(got, want, 1e-9, name, cancel=True)


@cpu_only
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ignored", ["none", "some", "all"])
def test_reference_cross_entropy_grad_matches_torch_autograd(reduction, ignored):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g = rng()
    n, c = 9, 7
    logits = randn(g, (n, c), np.float64) * 3
    t = g.integers(0, c, n)
    if ignored == "some":
        t[[1, 4]] = -100
    elif ignored == "all":
        t[:] = -100
    tx = torch.from_numpy(logits).requires_grad_(True)
    loss = F.cross_entropy(tx, torch.from_numpy(t), reduction=reduction, ignore_index=-100)
    up = randn(g, (n,), np.float64) if reduction == "none" else np.array(1.7)
    loss.backward(torch.from_numpy(up))
    want = tx.grad.numpy()
    if reduction == "mean" and ignored == "all":
        assert np.all(np.nan_to_num(want) == 0)  # PyTorch: NaN loss; its NaN scale gives 0 or NaN
        want = np.zeros_like(want)               # ours: ignored rows get a zero gradient
    got = ref.cross_entropy_backward(up, logits, t, reduction=reduction)
    assert_close(got, want, 1e-9, "backward", cancel=True)
    l1, g1 = ref.cross_entropy_with_grad(logits, t, reduction=reduction)
    up1 = np.ones(n) if reduction == "none" else np.array(1.0)
    tx.grad = None
    F.cross_entropy(tx, torch.from_numpy(t), reduction=reduction).backward(torch.from_numpy(up1))
    want1 = np.zeros_like(want) if (reduction == "mean" and ignored == "all") else tx.grad.numpy()
    assert_close(g1, want1, 1e-9, "with_grad", cancel=True)
    assert_close(l1, loss.detach().numpy(), 1e-12, "loss", cancel=True)


# ---- softmax_backward / log_softmax_backward ----------------------------------------------

SM_SHAPES = ([(7,), (3, 5), (1, 1), (5, 67), (2, 3, 37)] if SMALL_SHAPES
             else [(1,), (7,), (3, 5), (1, 1), (33, 1), (5, 1037), (2, 3, 257), (2, 50257)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SM_SHAPES, ids=str)
@pytest.mark.parametrize("name, impl", _cases([n for n, _ in SM_OPS]))
def test_softmax_grads_match_reference(name, impl, shape, dtype):
    forward = dict(SM_OPS)[name]
    go, y = _sm_inputs(rng(), shape, dtype, forward)
    fn = getattr(dispatch, name)
    want = getattr(ref, name)(go, y)
    got = run(impl, fn, go, y, out=poisoned(shape, dtype), _op=name)
    assert got.dtype == dtype
    _close(got, want, dtype, name)
    got2 = run(impl, fn, strided(go), strided(y), _op=name)  # non-contiguous views, no out=
    _close(got2, want, dtype, name + " strided")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 3, 4, 9)] if SMALL_SHAPES else [(3, 5, 7), (2, 1, 4, 33), (3, 1037)],
                         ids=str)
@pytest.mark.parametrize("name, impl", _cases([n for n, _ in SM_OPS]))
def test_softmax_grads_every_axis(name, impl, shape, dtype):
    forward = dict(SM_OPS)[name]
    fn = getattr(dispatch, name)
    g = rng()
    for axis in list(range(len(shape))) + [-1, -len(shape)]:
        go, y = _sm_inputs(g, shape, dtype, forward, axis)
        got = run(impl, fn, go, y, axis, out=poisoned(shape, dtype), _op=name)
        _close(got, getattr(ref, name)(go, y, axis), dtype, f"{name} axis={axis}")


@pytest.mark.parametrize("name, impl", _cases([n for n, _ in SM_OPS]))
def test_softmax_grads_long_inner_axis(name, impl):
    """A reduction along axis 0 with more inner columns than one chunk of the column
    kernel (kernels_cpu.softmax_grad.COL_CHUNK = 512) and a tail."""
    shape = (3, 70) if SMALL_SHAPES else (5, 1300)
    forward = dict(SM_OPS)[name]
    go, y = _sm_inputs(rng(), shape, np.float32, forward, 0)
    got = run(impl, getattr(dispatch, name), go, y, 0, out=poisoned(shape, np.float32), _op=name)
    _close(got, getattr(ref, name)(go, y, 0), np.float32, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, impl", _cases([n for n, _ in SM_OPS]))
def test_softmax_grads_nan_in_nan_out(name, impl, dtype):
    """NaN in grad_out (either op) or y (softmax) makes that row's sum NaN: the row is
    NaN; log_softmax's sum is over grad_out only, so NaN in y is NaN at that element."""
    forward = dict(SM_OPS)[name]
    n = 37 if SMALL_SHAPES else 1029
    go, y = _sm_inputs(rng(), (4, n), dtype, forward)
    go[1, 5] = np.nan
    y[2, 7] = np.nan
    got = run(impl, getattr(dispatch, name), go, y, out=poisoned((4, n), dtype), _op=name)
    assert np.all(np.isnan(got[1]))
    if name == "softmax_backward":
        assert np.all(np.isnan(got[2]))
    else:
        assert np.isnan(got[2, 7]) and np.isfinite(got[2]).sum() == n - 1
    assert np.all(np.isfinite(got[[0, 3]]))
    _close(got[[0, 3]], getattr(ref, name)(go[[0, 3]], y[[0, 3]]), dtype, name)


@cpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, impl", _cases([n for n, _ in SM_OPS]))
def test_softmax_grads_read_only_and_broadcast(name, impl, dtype):
    forward = dict(SM_OPS)[name]
    go, y = _sm_inputs(rng(), (6, 257), dtype, forward)
    for gg, yy, what in [(read_only(go), read_only(y), "read-only"),
                         (np.broadcast_to(go[:1], go.shape), read_only(y), "broadcast grad_out"),
                         (read_only(go).T, read_only(y).T, "read-only transposed")]:
        for axis in (-1, 0):
            got = run(impl, getattr(dispatch, name), gg, yy, axis, out=poisoned(gg.shape, dtype), _op=name)
            _close(got, getattr(ref, name)(np.array(gg), np.array(yy), axis), dtype, f"{name} {what} axis {axis}")


@cpu_only
def test_softmax_grads_bad_inputs_name_the_argument():
    y = np.full((2, 3), 1 / 3, np.float32)
    g = np.ones((2, 3), np.float32)
    out = np.zeros((2, 3), np.float32)
    cases = [
        (dict(grad_out=np.ones((2, 4), np.float32)), ValueError, r"grad_out must have shape \(2, 3\)"),
        (dict(grad_out=np.ones((2, 3))), TypeError, "grad_out must have the same dtype as y"),
        (dict(y=np.ones((2, 3), np.int64)), TypeError, "y must have dtype float32 or float64"),
        (dict(axis=2), ValueError, "axis"),
        (dict(axis=1.0), TypeError, "axis"),
        (dict(out=np.zeros((3, 2), np.float32)), ValueError, "out must have shape"),
        (dict(out=g), ValueError, "out overlaps input grad_out"),
        (dict(grad_out=None), TypeError, "grad_out"),
    ]
    for name in ("softmax_backward", "log_softmax_backward"):
        for change, err, msg in cases:
            args = dict(grad_out=g, y=y, axis=-1, out=out)
            args.update(change)
            with pytest.raises(err, match=msg):
                getattr(dispatch, name)(args.pop("grad_out"), args.pop("y"), args.pop("axis"), **args)
            assert np.all(out == 0)
    with pytest.raises(ValueError, match="y must have at least 1 dimensions"):
        dispatch.softmax_backward(np.ones((), np.float32), np.ones((), np.float32))


@cpu_only
def test_softmax_grads_empty():
    assert dispatch.softmax_backward(np.ones((0, 5), np.float32), np.ones((0, 5), np.float32)).shape == (0, 5)
    assert dispatch.log_softmax_backward(np.ones((3, 0)), np.ones((3, 0)), 0).shape == (3, 0)


# ---- cross_entropy_with_grad / cross_entropy_backward --------------------------------------

CE_SHAPES = [(1, 1), (7, 3), (13, 67)] if SMALL_SHAPES else [(1, 1), (7, 3), (5, 7), (33, 1037), (3, 50257)]


def _ce_inputs(g, shape, dtype, ignored):
    n, c = shape
    logits = randn(g, shape, dtype) * 4
    t = g.integers(0, c, n)
    if ignored == "some" and n > 1:
        t[g.random(n) < 0.3] = -100
        t[0] = -100
    elif ignored == "all":
        t[:] = -100
    return logits, t


def _upstream(g, reduction, n, dtype):
    return randn(g, (n,), dtype) if reduction == "none" else np.asarray(1.0 + g.random(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CE_SHAPES, ids=str)
@pytest.mark.parametrize("impl", impl_params("cross_entropy_with_grad"))
def test_cross_entropy_with_grad_matches_reference(impl, shape, dtype):
    g = rng()
    n, c = shape
    # under the simulator rows without ignored targets are left to the non-finite test
    for ignored in ("some",) if SMALL_SHAPES else ("none", "some"):
        logits, t = _ce_inputs(g, shape, dtype, ignored)
        for reduction in REDUCTIONS:
            grad_out = poisoned(shape, dtype)
            loss, grad = run(impl, dispatch.cross_entropy_with_grad, logits, t, reduction=reduction,
                             grad_out=grad_out)
            want_loss, want_grad = ref.cross_entropy_with_grad(logits, t, reduction=reduction)
            what = f"{reduction} ignored={ignored}"
            assert loss.dtype == dtype and grad.dtype == dtype and np.shape(loss) == np.shape(want_loss)
            # a row's loss, logsumexp - x[target], cancels terms of up to max|logits| + log C
            # to a far smaller value: the size of the terms bounds its rounding (float32, seed
            # 1977972337: a mean loss of 1.2e-3 from logits of size 12 was 2.3e-5 off)
            terms = float(np.max(np.abs(logits))) + math.log(c)
            assert_close(loss, want_loss, reduction_tol(dtype, c + n), "loss " + what, cancel=True, scale=terms)
            _close(grad, want_grad, dtype, "grad " + what)
            if not ON_CUDA:
                assert grad is grad_out
            assert np.all(grad[t == -100] == 0)
            # the loss is the forward op's
            fwd_loss = dispatch.cross_entropy(logits, t, reduction=reduction) if not ON_CUDA else want_loss
            assert_close(loss, fwd_loss, reduction_tol(dtype, c + n), "vs cross_entropy " + what, cancel=True,
                         scale=terms)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("cross_entropy_with_grad"))
def test_cross_entropy_with_grad_in_place_over_logits(impl, dtype):
    """grad_out=logits: the gradient overwrites the logits (no second buffer)."""
    g = rng()
    shape = (7, 37) if SMALL_SHAPES else (9, 1037)
    logits, t = _ce_inputs(g, shape, dtype, "some")
    want_loss, want_grad = ref.cross_entropy_with_grad(logits, t)
    d = to_target(logits.copy())
    with dispatch.use(cross_entropy_with_grad=impl):
        loss, grad = dispatch.cross_entropy_with_grad(d, to_target(t), grad_out=d)
    assert grad is d
    assert_close(to_host(loss), want_loss, reduction_tol(dtype, 1037), "loss", cancel=True,
                 scale=float(np.max(np.abs(logits))) + math.log(shape[1]))
    _close(to_host(d), want_grad, dtype, "in place")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CE_SHAPES, ids=str)
@pytest.mark.parametrize("impl", impl_params("cross_entropy_backward"))
def test_cross_entropy_backward_matches_reference(impl, shape, dtype):
    g = rng()
    n, _ = shape
    logits, t = _ce_inputs(g, shape, dtype, "some")
    for reduction in REDUCTIONS:
        up = _upstream(g, reduction, n, dtype)
        got = run(impl, dispatch.cross_entropy_backward, up, logits, t, reduction=reduction)
        assert got.dtype == dtype and got.shape == shape
        _close(got, ref.cross_entropy_backward(up, logits, t, reduction=reduction), dtype, reduction)
        if reduction != "none":  # a Python number as grad_loss
            got = run(impl, dispatch.cross_entropy_backward, float(up), logits, t, reduction=reduction)
            _close(got, ref.cross_entropy_backward(up, logits, t, reduction=reduction), dtype, reduction + " float")


@pytest.mark.parametrize("impl", impl_params("cross_entropy_with_grad"))
def test_cross_entropy_all_ignored(impl):
    logits, t = _ce_inputs(rng(), (6, 5), np.float32, "all")
    loss, grad = run(impl, dispatch.cross_entropy_with_grad, logits, t)
    assert loss.shape == () and np.isnan(loss)  # PyTorch: NaN
    assert grad.shape == (6, 5) and np.all(grad == 0)
    loss, grad = run(impl, dispatch.cross_entropy_with_grad, logits, t, reduction="sum")
    assert loss == 0 and np.all(grad == 0)
    loss, grad = run(impl, dispatch.cross_entropy_with_grad, logits, t, reduction="none")
    assert np.all(loss == 0) and np.all(grad == 0)


@pytest.mark.parametrize("impl", impl_params("cross_entropy_backward"))
def test_cross_entropy_backward_all_ignored_and_nan_upstream(impl):
    g = rng()
    logits, t = _ce_inputs(g, (6, 5), np.float32, "all")
    assert np.all(run(impl, dispatch.cross_entropy_backward, np.asarray(1.0, np.float32), logits, t) == 0)
    logits, t = _ce_inputs(g, (6, 5), np.float32, "some")
    got = run(impl, dispatch.cross_entropy_backward, np.asarray(np.nan, np.float32), logits, t, reduction="sum")
    keep = t != -100
    assert np.all(np.isnan(got[keep])) and np.all(got[~keep] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", impl_params("cross_entropy_with_grad"))
def test_cross_entropy_with_grad_nonfinite_logits(impl, dtype):
    """A row holding NaN or +inf, or all -inf, gives a NaN loss and a NaN gradient row;
    -inf entries get probability 0; huge finite logits stay finite."""
    c = 9
    x = randn(rng(), (6, c), dtype)
    t = np.array([0, 1, 2, 3, 4, 5])
    x[0, 3] = np.nan
    x[1, 0] = np.inf
    x[2, :] = -np.inf
    x[3, ::2] = -np.inf      # target 3 survives
    x[4] = np.array([1e30, -1e30, 0, 0, 5, 0, 0, 0, 0], dtype)
    loss, grad = run(impl, dispatch.cross_entropy_with_grad, x, t, reduction="none")
    assert np.all(np.isnan(loss[:3])) and np.all(np.isnan(grad[:3]))
    assert np.all(np.isfinite(loss[3:])) and np.all(np.isfinite(grad[3:]))
    assert np.all(grad[3, ::2] == 0)
    want_loss, want_grad = ref.cross_entropy_with_grad(x, t, reduction="none")
    assert_close(loss[3:], want_loss[3:], 1e-5, "loss", cancel=True)
    _close(grad[3:], want_grad[3:], dtype, "grad")
    loss, grad = run(impl, dispatch.cross_entropy_with_grad, x, t)  # mean: NaN
    assert np.isnan(loss) and np.all(np.isnan(grad[:3])) and np.all(np.isfinite(grad[3:]))


@pytest.mark.parametrize("impl", impl_params("cross_entropy_with_grad"))
def test_cross_entropy_with_grad_bad_target_changes_nothing(impl):
    logits = randn(rng(), (3, 7), np.float32)
    for bad in (7, -1):
        t = np.array([0, bad, -100])
        d = to_target(logits.copy())
        with dispatch.use(cross_entropy_with_grad=impl):
            with pytest.raises(ValueError, match=rf"targets\[1\] = {bad} is out of range"):
                dispatch.cross_entropy_with_grad(d, to_target(t), grad_out=d)
        assert np.array_equal(to_host(d), logits)  # grad_out=logits: untouched
        out = poisoned((3, 7), np.float32)
        with dispatch.use(cross_entropy_with_grad=impl):
            with pytest.raises(ValueError, match="targets"):
                dispatch.cross_entropy_with_grad(to_target(logits), to_target(t), grad_out=out)
        assert np.all(np.isnan(to_host(out)))


@pytest.mark.parametrize("impl", impl_params("cross_entropy_backward"))
def test_cross_entropy_backward_bad_target(impl):
    with pytest.raises(ValueError, match=r"targets\[0\] = 5 is out of range"):
        run(impl, dispatch.cross_entropy_backward, 1.0, np.zeros((2, 5), np.float32), np.array([5, 0]))


@cpu_only
@pytest.mark.parametrize("impl", impl_params("cross_entropy_with_grad"))
def test_cross_entropy_with_grad_views_and_read_only(impl):
    g = rng()
    logits, t = _ce_inputs(g, (9, 40), np.float32, "some")
    want_loss, want_grad = ref.cross_entropy_with_grad(logits, t, reduction="none")
    for ll, tt, what in [(read_only(logits), read_only(t), "read-only"), (strided(logits), t[::-1][::-1], "strided")]:
        loss, grad = run(impl, dispatch.cross_entropy_with_grad, ll, tt, reduction="none")
        assert_close(loss, want_loss, 1e-5, what, cancel=True)
        _close(grad, want_grad, np.float32, what)
    # a non-contiguous grad_out is filled (one copy), strided logits overwritten in place
    big = np.full((9, 80), np.nan, np.float32)
    loss, grad = run(impl, dispatch.cross_entropy_with_grad, logits, t, reduction="none", grad_out=big[:, ::2])
    assert grad.base is big and np.all(np.isnan(big[:, 1::2]))
    _close(big[:, ::2], want_grad, np.float32, "strided grad_out")
    sl = strided(logits)
    with dispatch.use(cross_entropy_with_grad=impl):
        dispatch.cross_entropy_with_grad(sl, t, reduction="none", grad_out=sl)
    _close(sl, want_grad, np.float32, "strided in place")


@cpu_only
def test_cross_entropy_grad_bad_inputs_name_the_argument():
    logits = np.zeros((3, 5), np.float32)
    t = np.zeros(3, np.int64)
    cases = [
        (dict(grad_out=np.zeros((3, 4), np.float32)), ValueError, r"grad_out must have shape \(3, 5\)"),
        (dict(grad_out=np.zeros((3, 5))), TypeError, "grad_out must have dtype float32"),
        (dict(grad_out=read_only(logits)), ValueError, "grad_out must be writeable"),
        (dict(grad_out=logits[::-1]), ValueError, "grad_out overlaps input logits"),
        (dict(targets=np.zeros(3, np.float32)), TypeError, "targets must have an integer dtype"),
        (dict(targets=np.zeros(4, np.int64)), ValueError, r"targets must have shape \(3,\)"),
        (dict(reduction="avg"), ValueError, "reduction must be one of"),
        (dict(ignore_index=1.5), TypeError, "ignore_index"),
        (dict(logits=np.zeros(5, np.float32)), ValueError, "logits must have 2 dimensions"),
    ]
    for change, err, msg in cases:
        args = dict(logits=logits, targets=t)
        args.update(change)
        with pytest.raises(err, match=msg):
            dispatch.cross_entropy_with_grad(args.pop("logits"), args.pop("targets"), **args)
    bad_up = [
        (np.zeros(3, np.float32), {}, ValueError, r"grad_loss must have shape \(\) or \(1,\)"),
        (np.zeros((), np.float32), {"reduction": "none"}, ValueError, r"grad_loss must have shape \(3,\)"),
        (1.0, {"reduction": "none"}, ValueError, "grad_loss must be an array"),
        (np.zeros(()), {}, TypeError, "grad_loss must have the same dtype as logits"),
        ("1", {}, TypeError, "grad_loss"),
        (None, {}, TypeError, "grad_loss"),
    ]
    for up, kw, err, msg in bad_up:
        with pytest.raises(err, match=msg):
            dispatch.cross_entropy_backward(up, logits, t, **kw)


@cpu_only
def test_cross_entropy_grad_empty():
    logits, t = np.ones((0, 4), np.float32), np.zeros(0, np.int64)
    loss, grad = dispatch.cross_entropy_with_grad(logits, t)
    assert np.isnan(loss) and grad.shape == (0, 4)
    assert dispatch.cross_entropy_backward(1.0, logits, t).shape == (0, 4)
