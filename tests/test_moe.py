"""dispatch.moe_ffn against the float64 reference (tests/reference/moe.py: a plain loop over
tokens and slots), for every implementation the dispatcher can pick on the target device."""
import numpy as np
import pytest

import dispatch
from tests.reference import moe as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, assert_close, assert_no_new_specialization, impl_params, poisoned,
                           read_only, rng, run, strided, to_target)

OP = "moe_ffn"
DTYPES = [np.float16, np.float32] if ON_CUDA else [np.float32, np.float64]


def _tol(dtype, h, f):
    """Normwise tolerance: sums of H (gate, up) then F (down) products in the kernel's
    accumulation type."""
    if dtype == np.float16:
        return 3e-3  # the float16 output's rounding dominates (float32 accumulation)
    eps = np.finfo(dtype).eps
    return 8 * eps * (np.sqrt(max(h, 1)) + np.sqrt(max(f, 1))) + 8 * eps


def _routing(g, t, e, k, kind="random"):
    """(indices (t, k) int64): k distinct random experts per token ("random"), only the
    even experts ("sparse": the odd ones receive no token), every token on expert e - 1
    ("one"), or repeats allowed ("repeat")."""
    if kind == "one" or t == 0:
        return np.full((t, k), e - 1, np.int64)
    if kind == "repeat":
        return g.integers(0, e, (t, k)).astype(np.int64)
    pool = np.arange(0, e, 2) if kind == "sparse" else np.arange(e)
    return np.stack([g.permutation(pool)[:k] for _ in range(t)]).reshape(t, k).astype(np.int64)


def _inputs(g, t, h, f, e, k, dtype, kind="random"):
    x = g.standard_normal((t, h)).astype(dtype)
    wg = (g.standard_normal((e, f, h)) / np.sqrt(h)).astype(dtype)
    wu = (g.standard_normal((e, f, h)) / np.sqrt(h)).astype(dtype)
    wd = (g.standard_normal((e, h, f)) / np.sqrt(f)).astype(dtype)
    w = g.random((t, k)).astype(dtype)
    return x, w, _routing(g, t, e, k, kind), wg, wu, wd


# (T, H, F, E, k, routing): T = 1, k = 1 and k = E, E = 1, experts without tokens, every
# token on one expert, repeated experts in a row, H and F not multiples of the 4 x 3 tile,
# the vector width or the F / H task blocks (48), and past the K block (4096) in each phase.
CASES_SMALL = [
    (1, 9, 7, 3, 2, "random"),
    (3, 5, 12, 2, 2, "random"),        # k = E
    (4, 16, 11, 3, 1, "one"),
    (2, 13, 6, 1, 1, "random"),        # E = 1
    (34, 4, 3, 2, 1, "one"),           # one expert's rows over several row tiles
]
CASES_FULL = [
    (1, 37, 53, 4, 2, "random"),
    (7, 19, 29, 3, 1, "random"),
    (5, 24, 19, 4, 4, "random"),       # k = E
    (9, 33, 17, 6, 2, "sparse"),       # experts 1, 3, 5 receive nothing
    (11, 20, 23, 4, 1, "one"),         # every token on one expert
    (6, 16, 40, 1, 1, "random"),       # E = 1
    (8, 21, 30, 3, 3, "repeat"),       # a repeated expert counts once per slot
    (13, 100, 130, 5, 2, "random"),    # several F and H blocks
    (9, 4100, 12, 1, 1, "random"),     # H > the K block (4096) with > 4 rows: gate/up in two K blocks
    (9, 8, 4100, 2, 2, "random"),      # F > the K block: down in two K blocks
    (40, 64, 96, 8, 2, "random"),
]
CASES = CASES_SMALL if SMALL_SHAPES else CASES_FULL


def _case_id(c):
    return "T{}-H{}-F{}-E{}-k{}-{}".format(*c)


@pytest.mark.parametrize("activation", ["silu"] if SMALL_SHAPES else ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("impl", impl_params(OP))
def test_matches_reference(impl, case, dtype, activation):
    t, h, f, e, k, kind = case
    if SMALL_SHAPES and impl == "cuda-gemv" and t > 8:
        pytest.skip("simulator time: the rule sends T > 8 to cuda-grouped (the GEMV's passes over more rows: "
                    "test_float64_on_cuda)")
    x, w, idx, wg, wu, wd = _inputs(rng(), t, h, f, e, k, dtype, kind)
    want = ref.moe_ffn(x, w, idx, wg, wu, wd, activation=activation)
    got = run(impl, dispatch.moe_ffn, x, w, idx, wg, wu, wd, activation=activation, out=poisoned((t, h), dtype),
              _op=OP)
    assert got.dtype == dtype and got.shape == (t, h)
    assert_close(got, want, _tol(dtype, h, f), f"moe_ffn {impl}", cancel=True)


@pytest.mark.skipif(not ON_CUDA, reason="float64 on CUDA (the CPU tests run it everywhere)")
@pytest.mark.parametrize("impl", impl_params(OP))
def test_float64_on_cuda(impl):
    """float64 (the GEMV's gate/up takes 4 rows per pass there): 10 rows on one expert."""
    t, h, f, e, k = 5, 6, 7, 3, 2
    x, w, idx, wg, wu, wd = _inputs(rng(), t, h, f, e, k, np.float64, "one")
    got = run(impl, dispatch.moe_ffn, x, w, idx, wg, wu, wd, out=poisoned((t, h), np.float64), _op=OP)
    assert_close(got, ref.moe_ffn(x, w, idx, wg, wu, wd), _tol(np.float64, h, f), f"moe_ffn {impl}", cancel=True)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("impl", impl_params(OP))
def test_index_dtypes_and_strided_inputs(impl, index_dtype):
    """int32 and int64 indices; non-contiguous views of every input (copied to C order;
    the indices as a Fortran-ordered array)."""
    t, h, f, e, k = (3, 8, 6, 3, 2) if SMALL_SHAPES else (10, 27, 35, 5, 2)
    x, w, idx, wg, wu, wd = _inputs(rng(), t, h, f, e, k, np.float32)
    idx = idx.astype(index_dtype)
    want = ref.moe_ffn(x, w, idx, wg, wu, wd)
    got = run(impl, dispatch.moe_ffn, x, w, idx, wg, wu, wd, _op=OP)
    assert_close(got, want, _tol(np.float32, h, f), "contiguous", cancel=True)
    got = run(impl, dispatch.moe_ffn, strided(x), strided(w), np.asfortranarray(idx), strided(wg), strided(wu),
              strided(wd), _op=OP)
    assert_close(got, want, _tol(np.float32, h, f), "strided", cancel=True)


@pytest.mark.parametrize("impl", impl_params(OP))
def test_all_experts_with_unit_weights_sum_every_expert(impl):
    """k = E with every weight 1 equals the sum over experts of each expert's FFN, each
    computed alone (k = 1, every token on that expert)."""
    t, h, f, e = (2, 8, 6, 3) if SMALL_SHAPES else (7, 30, 44, 5)
    g = rng()
    x, _, _, wg, wu, wd = _inputs(g, t, h, f, e, 1, np.float32)
    idx = np.stack([g.permutation(e) for _ in range(t)]).astype(np.int64)
    all_at_once = run(impl, dispatch.moe_ffn, x, np.ones((t, e), np.float32), idx, wg, wu, wd, _op=OP)
    one_by_one = sum(run(impl, dispatch.moe_ffn, x, np.ones((t, 1), np.float32), np.full((t, 1), i), wg, wu, wd,
                         _op=OP).astype(np.float64) for i in range(e))
    assert_close(all_at_once, one_by_one, 4 * _tol(np.float32, h, f), "k = E, weights 1", cancel=True)


@pytest.mark.parametrize("impl", impl_params(OP))
def test_nan_stays_in_its_token(impl):
    t, h, f, e, k = (3, 8, 6, 3, 2) if SMALL_SHAPES else (9, 20, 26, 4, 2)
    x, w, idx, wg, wu, wd = _inputs(rng(), t, h, f, e, k, np.float32)
    x[1, 3] = np.nan
    got = run(impl, dispatch.moe_ffn, x, w, idx, wg, wu, wd, _op=OP)
    assert np.isnan(got[1]).all()
    assert np.isfinite(np.delete(got, 1, axis=0)).all()


@pytest.mark.parametrize("impl", impl_params(OP))
def test_out_of_range_indices_raise_and_write_nothing(impl):
    t, h, f, e, k = 3, 8, 6, 3, 2
    x, w, idx, wg, wu, wd = _inputs(rng(), t, h, f, e, k, np.float32)
    for bad_value in (-1, e):
        bad = idx.copy()
        bad[2, 1] = bad_value
        out = poisoned((t, h), np.float32)
        with pytest.raises(ValueError, match=rf"indices must be expert ids in \[0, {e}\)"):
            run(impl, dispatch.moe_ffn, x, w, bad, wg, wu, wd, out=out, _op=OP)
        assert np.isnan(out if isinstance(out, np.ndarray) else out.copy_to_host()).all()


@pytest.mark.parametrize("impl", impl_params(OP))
def test_empty_sizes(impl):
    """No tokens, k = 0 (nothing routed: zeros), F = 0 (zeros)."""
    g = rng()
    x, w, idx, wg, wu, wd = _inputs(g, 0, 8, 6, 3, 2, np.float32)
    assert run(impl, dispatch.moe_ffn, x, w, idx, wg, wu, wd, _op=OP).shape == (0, 8)
    x, w, idx, wg, wu, wd = _inputs(g, 3, 8, 6, 3, 0, np.float32)
    np.testing.assert_array_equal(run(impl, dispatch.moe_ffn, x, w, idx, wg, wu, wd, out=poisoned((3, 8), np.float32),
                                      _op=OP), np.zeros((3, 8), np.float32))
    x, w, idx, wg, wu, wd = _inputs(g, 3, 8, 0, 3, 2, np.float32)
    np.testing.assert_array_equal(run(impl, dispatch.moe_ffn, x, w, idx, wg, wu, wd, _op=OP),
                                  np.zeros((3, 8), np.float32))


# ---- host only: threads' determinism, read-only inputs, the rule ------------------------------

host_only = pytest.mark.skipif(ON_CUDA, reason="host arrays and the CPU kernels")


@host_only
def test_serial_and_parallel_agree_bit_for_bit():
    """Each task owns its outputs and sums in a fixed order: the thread count changes nothing."""
    x, w, idx, wg, wu, wd = _inputs(rng(), 23, 150, 170, 6, 2, np.float32)
    with dispatch.use(moe_ffn="cpu-serial"):
        want = dispatch.moe_ffn(x, w, idx, wg, wu, wd)
    with dispatch.use(moe_ffn="cpu-parallel"):
        np.testing.assert_array_equal(dispatch.moe_ffn(x, w, idx, wg, wu, wd), want)


@host_only
@pytest.mark.parametrize("impl", impl_params(OP))
def test_read_only_inputs_reuse_the_compiled_kernels(impl):
    from kernels_cpu import moe as K

    x, w, idx, wg, wu, wd = _inputs(rng(), 5, 12, 10, 3, 2, np.float32)
    want = run(impl, dispatch.moe_ffn, x, w, idx, wg, wu, wd, _op=OP)

    def variants():
        got = run(impl, dispatch.moe_ffn, *(read_only(a) for a in (x, w, idx, wg, wu, wd)), _op=OP)
        np.testing.assert_array_equal(got, want)

    assert_no_new_specialization([K], variants, impl)


@host_only
def test_rule_serial_for_a_small_call_parallel_for_a_large_one():
    x, w, idx, wg, wu, wd = _inputs(rng(), 2, 16, 8, 4, 2, np.float32)
    assert dispatch.explain(OP, x, w, idx, wg, wu, wd).chosen == "cpu-serial"
    x, w, idx, wg, wu, wd = _inputs(rng(), 16, 256, 512, 4, 2, np.float32)
    assert dispatch.explain(OP, x, w, idx, wg, wu, wd).chosen == "cpu-parallel"


# ---- bad input ---------------------------------------------------------------------------------

T_, H_, F_, E_, K_ = 3, 8, 6, 4, 2


def _good():
    g = np.random.default_rng(0)
    x, w, idx, wg, wu, wd = _inputs(g, T_, H_, F_, E_, K_, np.float32)
    return dict(x=x, weights=w, indices=idx, w_gate=wg, w_up=wu, w_down=wd)


@host_only
@pytest.mark.parametrize("change, err, msg", [
    (dict(x=np.ones((T_, H_), np.int32)), TypeError, "x must have dtype float32 or float64"),
    (dict(weights=np.ones((T_, K_))), TypeError, "weights must have the same dtype as x"),
    (dict(w_down=np.ones((E_, H_, F_))), TypeError, "w_down must have the same dtype as x"),
    (dict(indices=np.ones((T_, K_), np.float32)), TypeError, "indices must have dtype int32 or int64"),
    (dict(indices=np.ones((T_, K_), np.uint8)), TypeError, "indices must have dtype int32 or int64"),
    (dict(x=np.ones((1, T_, H_), np.float32)), ValueError, "x must have 2 dimensions"),
    (dict(indices=np.ones(T_, np.int64)), ValueError, "indices must have 2 dimensions"),
    (dict(indices=np.ones((T_ + 1, K_), np.int64)), ValueError, r"indices must have shape \(3, 2\)"),
    (dict(weights=np.ones((T_, K_ + 1), np.float32)), ValueError, r"weights must have shape \(3, 2\)"),
    (dict(w_gate=np.ones((E_, F_), np.float32)), ValueError, "w_gate must have 3 dimensions"),
    (dict(w_gate=np.ones((E_, F_, H_ + 1), np.float32)), ValueError, r"w_gate must have shape \(E, F, 8\)"),
    (dict(w_up=np.ones((E_, F_ + 1, H_), np.float32)), ValueError, r"w_up must have shape \(4, 6, 8\)"),
    (dict(w_down=np.ones((E_, F_, H_), np.float32)), ValueError, r"w_down must have shape \(4, 8, 6\)"),
    (dict(w_down=None), TypeError, "w_down must be an array"),
    (dict(indices=[[0, 1]] * T_), TypeError, "indices must be a numpy array"),
    (dict(indices=np.full((T_, K_), E_)), ValueError, r"indices must be expert ids in \[0, 4\)"),
    (dict(indices=np.full((T_, K_), -1, np.int32)), ValueError, r"indices must be expert ids in \[0, 4\)"),
    (dict(activation="relu"), ValueError, "activation must be one of"),
    (dict(activation=None), ValueError, "activation must be one of"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_inputs_raise_naming_the_argument_and_write_nothing(change, err, msg):
    args = _good()
    args.update(change)
    act = args.pop("activation", "silu")
    out = np.full((T_, H_), np.nan, np.float32)
    with pytest.raises(err, match=msg):
        dispatch.moe_ffn(**args, activation=act, out=out)
    assert np.isnan(out).all()


@host_only
def test_bad_out_rejected_and_untouched():
    args = _good()
    for bad, err, msg in [(np.zeros((T_, H_ + 1), np.float32), ValueError, "out must have shape"),
                          (np.zeros((T_, H_), np.float64), TypeError, "out must have dtype")]:
        before = bad.copy()
        with pytest.raises(err, match=msg):
            dispatch.moe_ffn(**args, out=bad)
        assert np.array_equal(bad, before)
    x = args.pop("x")
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.moe_ffn(x, **args, out=x)


@pytest.mark.skipif(not ON_CUDA, reason="mixing host and device arrays")
def test_host_weights_with_device_x_refused():
    args = _good()
    args["x"] = to_target(args["x"])
    with pytest.raises(ValueError, match="same device"):
        dispatch.moe_ffn(**args)
