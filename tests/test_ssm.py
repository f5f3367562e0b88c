"""dispatch.{selective_scan, selective_state_update} against the float64 references of
tests/reference/ssm.py, for every implementation on the target device (CPU: cpu-serial,
cpu-parallel; CUDA, on a GPU or the simulator: cuda-chunked-scan, cuda-update), and the
properties that tie them together: causality, and step-by-step decoding equal to the scan.

Tolerance (derived, not fitted).  With u the unit roundoff of the state's dtype (2^-24
float32, 2^-53 float64), each step's decay a_t = exp(dt_t A) carries a relative error of a
few u (the exp itself: 1.6e-7 = 2.7u for the CPU's float32 polynomial, libm-grade
elsewhere; dt's softplus, the product dt*A and the log2(e) scaling add c u |dt A|), the
input term b_t = dt_t u_t B_t about 6u, and h_t = a_t h_{t-1} + b_t rounds twice.  The
term b_k reaches h_t multiplied by prod_{k<j<=t} a_j, whose relative error is at most
(t - k)(2.7u + 2u) plus c u sum_j |dt_j A| = c u |log prod a_j| (bounded by c u / e once
multiplied by the product itself).  Summing over k with the magnitude recurrence h~ (the
same recurrence on |b_k|, tests/reference/ssm.scan_magnitude):

    |h_t - h_t^ref| <= u (5 t + 9) h~_t,

and y_t = sum_n h_t C_t + D u_t (N roundings), times silu(z_t) (a few u), gives

    |y_t - y_t^ref| <= u (5 L + N + 24) y~_t          (BOUND below)

for every element, y~ the magnitude output (|C|, |D u|, |silu z|).  Worst case: the
errors grow like L only when every a_t is close to 1 (long memory) and all rounding goes
one way; measured on the CPU kernel, float32, 11 channels x N 16: at most 50 u y~ at L =
200 and 150-410 u (y~ or h~) at L = 1024, an order of magnitude inside the bound.
float16 outputs (CUDA) add their own rounding, 2^-11 |y| (and the float16 underflow).
"""
import numpy as np
import pytest

import dispatch
from tests.reference import ssm as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, UNDERFLOW, assert_no_new_specialization, current_seed, impl_params,
                           poisoned, randn, read_only, rng, run, strided, to_host, to_target)

DTYPES = [np.float32, np.float64]
SCAN = impl_params("selective_scan")
UPDATE = impl_params("selective_state_update")
UNIT = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float64): 2.0**-53}

# (batch, dim, L, N, G): L = 1, N = 1, G = 1 and 2, dims not a multiple of any vector
# width (blocks of 8 / 4 channels, a group of 13 channels: one full block and a tail),
# sequences shorter and longer than one 64-step chunk; the simulator's shapes stay tiny.
SMALL = [(1, 1, 1, 1, 1), (2, 3, 5, 2, 1), (1, 4, 9, 3, 2), (2, 2, 16, 4, 2)]
FULL = [(1, 1, 1, 1, 1), (3, 5, 1, 4, 1), (1, 13, 37, 1, 1), (2, 12, 64, 16, 2), (3, 10, 130, 7, 2),
        (1, 26, 200, 16, 2), (2, 9, 65, 3, 3)]
CASES = SMALL if SMALL_SHAPES else FULL

# Optional arguments, on and off: D, z, delta_bias, softplus, initial_state, return_last_state
OPTIONS = ["Dzbsir", "", "zbsir", "Dbsir", "Dzsir", "Dzbir", "Dzbsr", "Dzbsi", "D", "z", "b", "s", "i", "r"]


def _combos():
    """(case, options) pairs: on the CPU every other option set with each case (each set
    meets at least three cases); under the simulator (every GPU thread a Python thread)
    one set per case, from all on to all off."""
    if SMALL_SHAPES:
        pairs = list(zip(CASES, ["Dzbsir", "", "zbi", "Dsr"]))
    else:
        pairs = [(c, o) for i, c in enumerate(CASES) for o in OPTIONS[i % 2::2] + ["Dzbsir"] * (i % 2)]
    return [pytest.param(c, o, id=f"{'x'.join(map(str, c))}-{o or 'none'}") for c, o in pairs]


def _inputs(g, batch, dim, L, N, G, dtype, options="Dzbsir"):
    """Named arguments of selective_scan.  A mostly negative (Mamba: -exp(A_log)), a tenth
    of it small and positive (the op takes any real A; smaller for long L); delta such that dt stays positive
    (softplus, or a positive delta without it) with one value past softplus's threshold of
    20 (outside the simulator)."""
    soft = "s" in options
    acc = np.float64 if dtype == np.float64 else np.float32
    A = -np.exp(0.5 * g.standard_normal((dim, N)))
    # positive entries grow the state by exp(A * sum(dt)): scaled with 1 / L so that long
    # sequences stay far from float32's overflow (0.05 at L 700 reached 1e39 for one seed)
    A = np.where(g.random((dim, N)) < 0.1, 0.05 * min(1.0, 64.0 / max(L, 1)) * np.abs(A), A).astype(dtype)
    delta = (g.standard_normal((batch, dim, L)) - 1.0) if soft else 0.3 * np.abs(g.standard_normal((batch, dim, L)))
    if soft and delta.size > 8:
        delta.flat[delta.size // 2] = 25.0
    bc = (batch, G, N, L) if G > 1 else (batch, N, L)
    a = {"u": randn(g, (batch, dim, L), dtype), "delta": delta.astype(dtype), "A": A, "B": randn(g, bc, dtype),
         "C": randn(g, bc, dtype), "D": randn(g, (dim,), dtype) if "D" in options else None,
         "z": randn(g, (batch, dim, L), dtype) if "z" in options else None,
         "delta_bias": (0.5 * (g.standard_normal(dim) if soft else np.abs(g.standard_normal(dim)))).astype(dtype)
         if "b" in options else None,
         "delta_softplus": soft,
         "initial_state": randn(g, (batch, dim, N), acc) if "i" in options else None}
    return a


def _scan_args(a):
    return (a["u"], a["delta"], a["A"], a["B"], a["C"], a["D"], a["z"]), \
        {"delta_bias": a["delta_bias"], "delta_softplus": a["delta_softplus"], "initial_state": a["initial_state"]}


def _bound(mag, dtype, L, N, want=None, out_dtype=None):
    """BOUND of the module docstring (dtype: the inputs'; float16 computes in float32)."""
    unit = UNIT[np.dtype(np.float64 if dtype == np.float64 else np.float32)]
    b = unit * (5 * L + N + 24) * mag
    if out_dtype is not None and np.dtype(out_dtype) == np.float16:
        b = b + 2.0**-11 * np.abs(want) + UNDERFLOW[np.dtype(np.float16)]
    return b


def _check(got, want, bound, what):
    """NaN / inf patterns equal, and |got - want| <= bound elementwise."""
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = np.flatnonzero(test(got) != test(want))
        assert not bad.size, (f"{what}: {name} pattern differs at {bad.size} element(s), first at flat index "
                              f"{bad[0]}: got {got.flat[bad[0]]}, ref {want.flat[bad[0]]} [seed {current_seed()}]")
    fin = np.isfinite(want)
    with np.errstate(invalid="ignore"):
        excess = np.where(fin, np.abs(got - want) - bound, 0.0)
    if np.any(excess > 0):
        i = int(np.argmax(np.where(fin, np.abs(got - want) / np.maximum(bound, 1e-300), 0.0)))
        raise AssertionError(f"{what}: {int(np.sum(excess > 0))} element(s) outside the bound; worst flat index {i}: "
                             f"got {got.flat[i]!r}, ref {want.flat[i]!r}, bound {bound.flat[i]:.3e} "
                             f"[seed {current_seed()}]")


def _scan(impl, *args, **kw):
    return run(impl, dispatch.selective_scan, *args, _op="selective_scan", **kw)


def _update(impl, state, *args, **kw):
    """selective_state_update on the target: (y, the state after) on the host (state itself
    is left as it was)."""
    sd = to_target(state.copy())
    y = run(impl, dispatch.selective_state_update, sd, *args, _op="selective_state_update", **kw)
    return y, to_host(sd)


def _want(a, L, N, dtype, out_dtype=None):
    """(y, last_state) of the reference and their bounds."""
    args, kw = _scan_args(a)
    want, want_h = ref.selective_scan(*args, **kw, return_last_state=True)
    mag, mag_h = ref.scan_magnitude(*args, **kw)
    return want, want_h, _bound(mag, dtype, L, N, want, out_dtype), _bound(mag_h, dtype, L, 0)


# ---- selective_scan --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case, options", _combos())
@pytest.mark.parametrize("impl", SCAN)
def test_scan_matches_reference(impl, case, options, dtype):
    batch, dim, L, N, G = case
    a = _inputs(rng(), batch, dim, L, N, G, dtype, options)
    want, want_h, bound, bound_h = _want(a, L, N, dtype)
    args, kw = _scan_args(a)
    ret = "r" in options
    got = _scan(impl, *args, **kw, return_last_state=ret, out=poisoned(want.shape, dtype))
    y, h = got if ret else (got, None)
    assert y.dtype == dtype and y.shape == (batch, dim, L)
    _check(y, want, bound, f"y ({options})")
    if ret:
        assert h.dtype == np.dtype(np.float64 if dtype == np.float64 else np.float32) and h.shape == (batch, dim, N)
        _check(h, want_h, bound_h, f"last_state ({options})")
    if ON_CUDA:
        return  # run() copies host arrays to contiguous device arrays: the layout tests are the CPU's
    # non-contiguous and read-only inputs, no out=: the same numbers
    sargs = [None if v is None else strided(v) for v in args]
    skw = {k: (strided(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    got2 = _scan(impl, *sargs, **skw, return_last_state=ret)
    rargs = [read_only(v) for v in args]
    rkw = {k: (read_only(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    got3 = _scan(impl, *rargs, **rkw, return_last_state=ret)
    for other, what in ((got2, "strided"), (got3, "read-only")):
        for x, x2 in zip(got if ret else (got,), other if ret else (other,)):
            np.testing.assert_array_equal(x2, x, err_msg=what)


@pytest.mark.skipif(SMALL_SHAPES, reason="a Mamba-length sequence: too long for the simulator")
@pytest.mark.parametrize("impl", SCAN)
def test_scan_of_a_long_sequence_stays_within_the_bound(impl):
    """L = 1024, slow decay (dt ~ 0.01, A ~ -1: about 100 steps of memory) in float32, the
    regime where the state's rounding errors add up."""
    g = rng()
    a = _inputs(g, 1, 11, 1024, 16, 1, np.float32)
    a["delta_bias"] = np.full(11, np.log(np.expm1(0.01)), np.float32)
    want, want_h, bound, bound_h = _want(a, 1024, 16, np.float32)
    args, kw = _scan_args(a)
    y, h = _scan(impl, *args, **kw, return_last_state=True)
    _check(y, want, bound, "y")
    _check(h, want_h, bound_h, "last_state")


@pytest.mark.parametrize("impl", SCAN)
def test_outputs_do_not_see_later_inputs(impl):
    """y[..., :t] is bitwise the same whatever u, delta, B, C and z hold from step t on."""
    batch, dim, L, N, G = (2, 3, 12, 3, 1) if SMALL_SHAPES else (2, 11, 150, 5, 1)
    g = rng()
    a = _inputs(g, batch, dim, L, N, G, np.float32)
    args, kw = _scan_args(a)
    y0 = _scan(impl, *args, **kw)
    t = L // 3 + 1
    b = dict(a)
    for name in ("u", "delta", "B", "C", "z"):
        b[name] = a[name].copy()
        b[name][..., t:] = randn(g, b[name][..., t:].shape, np.float32) * np.float32(3)
    args1, kw1 = _scan_args(b)
    y1 = _scan(impl, *args1, **kw1)
    np.testing.assert_array_equal(y1[..., :t], y0[..., :t])
    assert not np.array_equal(y1[..., t:], y0[..., t:])


@pytest.mark.parametrize("impl", SCAN)
def test_nan_reaches_the_outputs_it_feeds(impl):
    """NaN in u at step l0 makes its channel NaN from l0 on (and its last state); NaN in
    A[d, n] makes channel d NaN at every step and its state n.  Everything else finite."""
    batch, dim, L, N = (1, 3, 6, 2) if SMALL_SHAPES else (2, 12, 70, 4)
    a = _inputs(rng(), batch, dim, L, N, 1, np.float32)
    a["u"][0, 1, L // 2] = np.nan
    a["A"][dim - 1, 1] = np.nan
    want, want_h, bound, bound_h = _want(a, L, N, np.float32)
    args, kw = _scan_args(a)
    y, h = _scan(impl, *args, **kw, return_last_state=True, out=poisoned(want.shape, np.float32))
    assert np.isnan(y[0, 1, L // 2:]).all() and np.isfinite(y[0, 1, :L // 2]).all()
    assert np.isnan(y[:, dim - 1]).all() and np.isnan(h[:, dim - 1, 1]).all()
    _check(y, want, bound, "y")
    _check(h, want_h, bound_h, "last_state")


@pytest.mark.skipif(not ON_CUDA, reason="the CUDA kernel's launch")
@pytest.mark.parametrize("params, L", [({"block": 32}, 300), ({"steps_per_warp": 1}, 40),
                                       ({"block": 64, "steps_per_warp": 1}, 700)],
                         ids=["1warp-2passes", "4warps", "2warps-2passes"])
def test_chunked_scan_across_warps_and_passes(params, L):
    """The block scan's warp-to-warp carry and the pass-to-pass carry (hs), at sequence
    lengths the default launch covers with one warp and one pass at the simulator's sizes:
    the launch forced to more warps or fewer steps per pass."""
    from dispatch import registry

    impl = registry.OPS["selective_scan"].implementations["cuda-chunked-scan"]
    a = _inputs(rng(), 1, 2, L, 2, 1, np.float32)
    want, want_h, bound, bound_h = _want(a, L, 2, np.float32)
    args, kw = _scan_args(a)
    call = registry.OPS["selective_scan"].describe(*[to_target(v) for v in args], return_last_state=True,
                                                    **{k: to_target(v) for k, v in kw.items()})
    y, h = impl.run({**impl.params, **params}, *call.args)
    _check(to_host(y), want, bound, "y")
    _check(to_host(h), want_h, bound_h, "last_state")


@pytest.mark.skipif(not ON_CUDA, reason="float16 runs on CUDA only")
def test_float16_computes_in_float32():
    """float16 u, delta, A, B, C, D, z, bias; float32 state (initial and last) and
    arithmetic: within the float32 bound plus the output's rounding."""
    batch, dim, L, N, G = (2, 3, 9, 3, 1) if SMALL_SHAPES else (2, 20, 300, 16, 2)
    a = _inputs(rng(), batch, dim, L, N, G, np.float16)
    a["delta"] = np.minimum(a["delta"], np.float16(10))
    want, want_h, bound, bound_h = _want(a, L, N, np.float16, np.float16)
    args, kw = _scan_args(a)
    y, h = _scan(SCAN[0].values[0], *args, **kw, return_last_state=True)
    assert y.dtype == np.float16 and h.dtype == np.float32
    _check(y, want, bound, "y float16")
    _check(h, want_h, bound_h, "last_state float32")
    st = np.ascontiguousarray(a["initial_state"])
    y1, st1 = _update(UPDATE[0].values[0], st, a["u"][..., 0].copy(), a["delta"][..., 0].copy(), a["A"],
                      np.ascontiguousarray(a["B"][..., 0]), np.ascontiguousarray(a["C"][..., 0]), a["D"],
                      a["z"][..., 0].copy(), dt_bias=a["delta_bias"], dt_softplus=True)
    b1 = dict(a, **{k: a[k][..., :1] for k in ("u", "delta", "B", "C", "z")})
    w1, wh1, bd1, bdh1 = _want(b1, 1, N, np.float16, np.float16)
    assert y1.dtype == np.float16 and st1.dtype == np.float32
    _check(y1, w1[..., 0], bd1[..., 0], "update y float16")
    _check(st1, wh1, bdh1, "update state")


# ---- selective_state_update ------------------------------------------------------------------

def _step_inputs(a, t):
    """The arguments of selective_state_update for step t of a scan's inputs."""
    x = np.ascontiguousarray(a["u"][..., t])
    dt = np.ascontiguousarray(a["delta"][..., t])
    B = np.ascontiguousarray(a["B"][..., t])
    C = np.ascontiguousarray(a["C"][..., t])
    z = None if a["z"] is None else np.ascontiguousarray(a["z"][..., t])
    return (x, dt, a["A"], B, C, a["D"], z), {"dt_bias": a["delta_bias"], "dt_softplus": a["delta_softplus"]}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case, options", _combos())
@pytest.mark.parametrize("impl", UPDATE)
def test_update_matches_reference(impl, case, options, dtype):
    batch, dim, _, N, G = case
    a = _inputs(rng(), batch, dim, 1, N, G, dtype, options.replace("i", "") + "i")
    state = a["initial_state"]
    args, kw = _step_inputs(a, 0)
    want, want_h, bound, bound_h = _want(a, 1, N, dtype)
    y, new = _update(impl, state, *args, **kw, out=poisoned((batch, dim), dtype))
    assert y.dtype == dtype and y.shape == (batch, dim) and new.dtype == state.dtype
    _check(y, want[..., 0], bound[..., 0], f"y ({options})")
    _check(new, want_h, bound_h, f"state ({options})")
    if ON_CUDA:
        return
    # a strided (writeable) state is updated in place; strided and read-only inputs
    big = np.full(state.shape[:-1] + (2 * N,), np.nan, state.dtype)
    big[..., ::2] = state
    y2 = run(impl, dispatch.selective_state_update, big[..., ::2], *[None if v is None else strided(v) for v in args],
             **kw, _op="selective_state_update")
    np.testing.assert_array_equal(big[..., ::2], new)
    assert np.isnan(big[..., 1::2]).all()
    st3 = state.copy()
    y3 = run(impl, dispatch.selective_state_update, st3, *[read_only(v) for v in args],
             **{k: read_only(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()},
             _op="selective_state_update")
    np.testing.assert_array_equal(st3, new)
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(y3, y)


@pytest.mark.parametrize("impl", UPDATE)
def test_update_with_more_states_than_a_warp(impl):
    """N = 40: the CUDA kernel's 32 lanes of a row take two states each (some one); the CPU
    loop runs full vectors and a tail."""
    a = _inputs(rng(), 2, 3, 1, 40, 1, np.float32)
    args, kw = _step_inputs(a, 0)
    want, want_h, bound, bound_h = _want(a, 1, 40, np.float32)
    y, new = _update(impl, a["initial_state"], *args, **kw)
    _check(y, want[..., 0], bound[..., 0], "y")
    _check(new, want_h, bound_h, "state")


SCAN_UPDATE = [pytest.param(s.values[0], u.values[0], marks=s.marks + u.marks, id=f"{s.id}+{u.id}")
               for s in SCAN for u in UPDATE]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scan_impl, update_impl", SCAN_UPDATE)
def test_update_step_by_step_equals_the_scan(scan_impl, update_impl, dtype):
    """Decoding L steps with selective_state_update from initial_state gives the scan's y,
    and the state it ends with is the scan's last_state (both within the scan's bound of
    the reference, so within twice that of each other)."""
    batch, dim, L, N, G = (2, 3, 5, 3, 1) if SMALL_SHAPES else (2, 19, 40, 16, 1)
    a = _inputs(rng(), batch, dim, L, N, G, dtype)
    want, want_h, bound, bound_h = _want(a, L, N, dtype)
    args, kw = _scan_args(a)
    y, h = _scan(scan_impl, *args, **kw, return_last_state=True)
    state = a["initial_state"].copy()
    steps = []
    for t in range(L):
        sargs, skw = _step_inputs(a, t)
        yt, state = _update(update_impl, state, *sargs, **skw)
        steps.append(yt)
    _check(np.stack(steps, -1), np.asarray(y, np.float64), 2 * bound, "steps vs scan y")
    _check(state, np.asarray(h, np.float64), 2 * bound_h, "final state vs last_state")


# ---- edge cases and rules ----------------------------------------------------------------------

@pytest.mark.skipif(ON_CUDA, reason="host-only edge cases")
@pytest.mark.parametrize("impl", SCAN)
def test_empty_sequences_and_batches(impl):
    g = rng()
    a = _inputs(g, 2, 5, 0, 3, 1, np.float32)
    args, kw = _scan_args(a)
    y, h = _scan(impl, *args, **kw, return_last_state=True)
    assert y.shape == (2, 5, 0)
    np.testing.assert_array_equal(h, a["initial_state"])  # no step: the state is the initial one
    kw["initial_state"] = None
    y, h = _scan(impl, *args, **kw, return_last_state=True)
    np.testing.assert_array_equal(h, np.zeros((2, 5, 3), np.float32))
    for batch, dim in ((0, 5), (2, 0)):
        a = _inputs(g, batch, dim, 4, 3, 1, np.float32)
        args, kw = _scan_args(a)
        y, h = _scan(impl, *args, **kw, return_last_state=True)
        assert y.shape == (batch, dim, 4) and h.shape == (batch, dim, 3)


@pytest.mark.skipif(ON_CUDA, reason="the CPU rule")
def test_rules():
    def chosen(op, shapes, **kw):
        i = dispatch.registry.OPS[op].inputs(shapes, {}, np.random.default_rng(0), np.float32)
        args, kwargs = dispatch.registry.OPS[op].signature(i)
        return dispatch.explain(op, *args, **kwargs).chosen

    from dispatch.ops.ssm import EXAMPLE_SHAPES
    assert chosen("selective_scan", EXAMPLE_SHAPES["selective_scan"]["small"]) == "cpu-serial"
    assert chosen("selective_scan", EXAMPLE_SHAPES["selective_scan"]["large"]) == "cpu-parallel"
    assert chosen("selective_state_update", EXAMPLE_SHAPES["selective_state_update"]["small"]) == "cpu-serial"
    assert chosen("selective_state_update", EXAMPLE_SHAPES["selective_state_update"]["large"]) == "cpu-parallel"
    # enough work, but one block of 8 channels: nothing to split
    one_block = {"u": (1, 8, 4096), "delta": (1, 8, 4096), "A": (8, 16), "B": (1, 16, 4096), "C": (1, 16, 4096)}
    assert chosen("selective_scan", one_block) == "cpu-serial"


@pytest.mark.skipif(ON_CUDA, reason="numba CPU kernels")
@pytest.mark.parametrize("impl", SCAN)
def test_options_and_read_only_inputs_reuse_the_compiled_kernels(impl):
    """Every option on or off, read-only inputs: the workers compiled for the first call
    (one per dtype; the options are run-time flags)."""
    from kernels_cpu import ssm as K

    g = rng()
    a = _inputs(g, 1, 9, 20, 4, 1, np.float32)
    args, kw = _scan_args(a)
    _scan(impl, *args, **kw, return_last_state=True)
    st = a["initial_state"].copy()
    sargs, skw = _step_inputs(a, 0)
    run(impl, dispatch.selective_state_update, st, *sargs, **skw, _op="selective_state_update")

    def variants():
        b = _inputs(g, 2, 12, 7, 4, 2, np.float32, "")
        ba, bk = _scan_args(b)
        _scan(impl, *[read_only(v) for v in ba], **bk)
        run(impl, dispatch.selective_state_update, st, *[read_only(v) for v in sargs], dt_softplus=False,
            _op="selective_state_update")

    assert_no_new_specialization([K], variants, impl)


# ---- bad input -----------------------------------------------------------------------------------

cpu_only = pytest.mark.skipif(ON_CUDA, reason="argument checks are device-independent")
F = np.float32
U3 = np.ones((2, 4, 5), F)
A2 = -np.ones((4, 3), F)
B3 = np.ones((2, 3, 5), F)
P4 = np.ones(4, F)


def _sc(**change):
    a = {"u": U3, "delta": U3, "A": A2, "B": B3, "C": B3, "D": None, "z": None}
    kw = {}
    for k, v in change.items():
        (a if k in a else kw)[k] = v
    return lambda out: dispatch.selective_scan(*a.values(), **kw, out=out)


SCAN_BAD = [
    (_sc(u=U3.astype(np.int32)), TypeError, "u must have dtype float32 or float64"),
    (_sc(u=np.ones((2, 4), F)), ValueError, r"u must have 3 dimensions \(batch, dim, L\)"),
    (_sc(delta=np.ones((2, 4, 6), F)), ValueError, r"delta must have shape \(2, 4, 5\)"),
    (_sc(delta=U3.astype(np.float64)), TypeError, "delta must have the same dtype as u"),
    (_sc(delta=None), TypeError, "delta must be an array, got None"),
    (_sc(A=np.ones((5, 3), F)), ValueError, r"A must have shape \(dim, N\) with dim = 4"),
    (_sc(A=np.ones(4, F)), ValueError, "A must have 2 dimensions"),
    (_sc(A=A2.astype(np.float64)), TypeError, "A must have the same dtype as u"),
    (_sc(B=np.ones((2, 4, 5), F)), ValueError, r"B must have shape \(2, 3, 5\)"),
    (_sc(B=np.ones((2, 3, 3, 5), F), C=np.ones((2, 3, 3, 5), F)), ValueError, "B's group count G .* divide dim = 4"),
    (_sc(B=np.ones((2, 0, 3, 5), F), C=np.ones((2, 0, 3, 5), F)), ValueError, "B's group count G"),
    (_sc(B=np.ones((3, 5), F)), ValueError, r"B must have 3 to 4 dimensions \(batch, N, L\)"),
    (_sc(C=np.ones((2, 1, 3, 5), F)), ValueError, r"C must have shape \(2, 3, 5\) \(B's shape\)"),
    (_sc(C=B3.astype(np.float64)), TypeError, "C must have the same dtype as u"),
    (_sc(D=np.ones(5, F)), ValueError, r"D must have shape \(4,\)"),
    (_sc(D=np.ones(4)), TypeError, "D must have the same dtype as u"),
    (_sc(z=np.ones((2, 4, 4), F)), ValueError, r"z must have shape \(2, 4, 5\)"),
    (_sc(delta_bias=np.ones((1, 4), F)), ValueError, r"delta_bias must have shape \(4,\)"),
    (_sc(delta_softplus=1), TypeError, "delta_softplus must be a bool"),
    (_sc(return_last_state="yes"), TypeError, "return_last_state must be a bool"),
    (_sc(initial_state=np.ones((2, 4, 3))), TypeError, "initial_state must have dtype float32"),
    (_sc(initial_state=np.ones((2, 4, 4), F)), ValueError, r"initial_state must have shape \(2, 4, 3\)"),
    (_sc(u=[[[1.0]]]), TypeError, "u must be a numpy array"),
]


@cpu_only
@pytest.mark.parametrize("call, err, msg", SCAN_BAD, ids=[f"{i}-{b[2][:30]}" for i, b in enumerate(SCAN_BAD)])
def test_bad_scan_inputs_raise_and_leave_out_untouched(call, err, msg):
    out = np.full(U3.shape, np.nan, F)
    with pytest.raises(err, match=msg):
        call(out)
    assert np.isnan(out).all()


X2 = np.ones((2, 4), F)
B2 = np.ones((2, 3), F)


def _up(**change):
    a = {"x": X2, "dt": X2, "A": A2, "B": B2, "C": B2}
    kw = {}
    for k, v in change.items():
        (a if k in a else kw)[k] = v
    state = kw.pop("state", None)
    return lambda st, out: dispatch.selective_state_update(st if state is None else state, *a.values(), **kw, out=out)


UPDATE_BAD = [
    (_up(x=np.ones((2, 4, 1), F)), ValueError, r"x must have 2 dimensions \(batch, dim\)"),
    (_up(dt=np.ones((2, 5), F)), ValueError, r"dt must have shape \(2, 4\)"),
    (_up(A=np.ones((4, 2), F), B=np.ones((2, 2), F), C=np.ones((2, 2), F)), ValueError,
     r"state must have shape \(2, 4, 2\)"),
    (_up(B=np.ones((2, 4), F)), ValueError, r"B must have shape \(2, 3\)"),
    (_up(B=np.ones((2, 3, 3), F), C=np.ones((2, 3, 3), F)), ValueError, "B's group count G"),
    (_up(C=np.ones((2, 2, 3), F)), ValueError, r"C must have shape \(2, 3\)"),
    (_up(z=np.ones((2, 4), np.float64)), TypeError, "z must have the same dtype as x"),
    (_up(D=np.ones(3, F)), ValueError, r"D must have shape \(4,\)"),
    (_up(dt_bias=np.ones(4)), TypeError, "dt_bias must have the same dtype as x"),
    (_up(dt_softplus=None), TypeError, "dt_softplus must be a bool"),
    (_up(state=np.ones((2, 4, 3))), TypeError, r"state must have dtype float32 \(it is updated in place\)"),
    (_up(state=np.ones((2, 4, 4), F)), ValueError, r"state must have shape \(2, 4, 3\)"),
    (_up(state=read_only(np.ones((2, 4, 3), F))), ValueError, "state must be writeable"),
    (_up(x=X2.astype(np.float64), dt=X2.astype(np.float64)), TypeError, "A must have the same dtype as x"),
]


@cpu_only
@pytest.mark.parametrize("call, err, msg", UPDATE_BAD, ids=[f"{i}-{b[2][:30]}" for i, b in enumerate(UPDATE_BAD)])
def test_bad_update_inputs_raise_and_leave_state_and_out_untouched(call, err, msg):
    state = np.arange(24, dtype=F).reshape(2, 4, 3)
    out = np.full((2, 4), np.nan, F)
    with pytest.raises(err, match=msg):
        call(state, out)
    assert np.isnan(out).all()
    np.testing.assert_array_equal(state, np.arange(24, dtype=F).reshape(2, 4, 3))


@cpu_only
def test_state_sharing_memory_with_another_argument_is_refused_untouched():
    state = np.arange(24, dtype=F).reshape(2, 4, 3)
    before = state.copy()
    with pytest.raises(ValueError, match="state overlaps input x"):
        dispatch.selective_state_update(state, state[..., 0], X2, A2, B2, B2)
    with pytest.raises(ValueError, match="out overlaps input state"):
        dispatch.selective_state_update(state, X2, X2, A2, B2, B2, out=state[..., 1])
    np.testing.assert_array_equal(state, before)
    out = np.zeros((2, 4), F)
    with pytest.raises(ValueError, match="out overlaps input u"):
        dispatch.selective_scan(U3, U3, A2, B3, B3, out=U3)
    assert dispatch.selective_state_update(np.zeros((2, 4, 3), F), X2, X2, A2, B2, B2, out=out) is out
