"""What every op test shares: the implementations to test, forcing one, moving data to
its device, poisoned outputs, seeded random inputs and the error measures.

The target device of a test run is NK_TEST_DEVICE ("cpu", the default, or "cuda": the
CUDA implementations, on a GPU or under NUMBA_ENABLE_CUDASIM=1 set before numba loads).

Seeds
-----
Every test gets its own seed: a fresh random 32-bit number, or NK_TEST_SEED=<n> from the
environment to replay one (tests/conftest.py sets it before each test and, when a test
fails, prints the seed and the command that replays it).  `rng()` derives its
generators from that seed: the i-th call in a test gets the i-th child stream
(``SeedSequence(seed, spawn_key=(i,))``), so several calls give independent streams and a
replay gives the same ones.  Tests never draw from numpy's global state.

Hypothesis tests (@given) must not call `rng()` without a seed (it raises): they draw the
seed from hypothesis, ``rng(data.draw(SEEDS))`` or a ``seed=SEEDS`` argument, so hypothesis
can shrink it and print it in the falsifying example, and its database replays it.
"""
from __future__ import annotations

import os
import secrets
import shlex
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

import dispatch
from dispatch import registry

TARGET = os.environ.get("NK_TEST_DEVICE", "cpu")
ON_CUDA = TARGET == "cuda"
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
# The CUDA simulator runs every GPU thread as a Python thread: under it the tests use small
# shapes; on the CPU and on a real GPU the full ones (model head dims 64/80/128, long rows,
# many tiles).  NK_TEST_SMALL_SHAPES=1 asks for the small ones on a real GPU too: the
# compute-sanitizer runs (bench.gpu --sanitize), whose tools slow every access down.
SMALL_SHAPES = ON_CUDA and (SIMULATOR or os.environ.get("NK_TEST_SMALL_SHAPES", "0") not in ("", "0"))


def impl_params(op: str, device: str = TARGET, dtype=None):
    """pytest params: every implementation of op on the device (that takes `dtype`, when
    given: a bfloat16-only kernel is left out of a float32 test), by name; a single
    skip-marked param when there is none.  Parametrize with these params themselves (or
    copy ``p.marks`` when building new ones): taking ``p.values[0]`` alone drops the skip
    mark and the test then runs with impl=None (tests/conftest.py rejects that)."""
    impls = [i for i in registry.implementations(op, device=device) if dtype is None or np.dtype(dtype) in i.dtypes]
    return [pytest.param(impl.name, id=impl.name) for impl in impls] or [
        pytest.param(None, id=f"no-{device}-{op}",
                     marks=pytest.mark.skip(reason=f"no {device} implementation of {op}"))
    ]


# ---- seeds ---------------------------------------------------------------------------------

SEED_ENV = "NK_TEST_SEED"
SEED_MAX = 2**32 - 1


@dataclass
class TestSeed:
    """The seed of the running test and how many generators `rng()` has derived from it."""

    __test__ = False  # not a test class for pytest

    seed: int
    nodeid: str
    draws: int = 0


_current: TestSeed | None = None


def seed_from_env() -> int | None:
    """NK_TEST_SEED as an int (None when unset); a malformed value is an error naming it."""
    text = os.environ.get(SEED_ENV, "").strip()
    if not text:
        return None
    try:
        seed = int(text, 0)
    except ValueError:
        raise ValueError(f"{SEED_ENV} must be an integer in [0, 2**32), got {text!r}") from None
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"{SEED_ENV} must be an integer in [0, 2**32), got {text!r}")
    return seed


def begin_test(nodeid: str) -> TestSeed:
    """Give the test `nodeid` its seed (NK_TEST_SEED, else a fresh random one)."""
    global _current
    seed = seed_from_env()
    _current = TestSeed(secrets.randbits(32) if seed is None else seed, nodeid)
    return _current


def end_test() -> None:
    global _current
    _current = None


def current_seed() -> int | None:
    """The running test's seed (None outside a test)."""
    return None if _current is None else _current.seed


def replay_command(nodeid: str, seed: int) -> str:
    """The shell command that reruns one test with the given seed on this target."""
    env = [f"{SEED_ENV}={seed}"]
    if ON_CUDA:
        env.append("NK_TEST_DEVICE=cuda")
        if SIMULATOR:
            env.append("NUMBA_ENABLE_CUDASIM=1")
    return " ".join(env) + " python -m pytest " + shlex.quote(nodeid)


def _in_hypothesis_example() -> bool:
    try:
        from hypothesis.control import currently_in_test_context
    except ImportError:  # pragma: no cover - hypothesis is a test dependency
        return False
    return currently_in_test_context()


def rng(seed=None):
    """A numpy Generator.

    rng(): the next independent stream derived from the running test's seed (see the
    module docstring); rng(seed): a generator of that explicit seed (hypothesis tests pass
    the seed they drew).  Calling rng() without a seed inside a hypothesis example, or
    outside a test, is an error: those draws could not be replayed."""
    if seed is not None:
        return np.random.default_rng(seed)
    if _in_hypothesis_example():
        raise RuntimeError("rng() inside a hypothesis example: draw the seed from hypothesis so it can shrink "
                           "and replay it, e.g. rng(data.draw(SEEDS)) or a seed=SEEDS argument to @given")
    state = _current
    if state is None:
        raise RuntimeError("rng() outside a test: random inputs must come from the test's seed "
                           "(draw them inside the test function)")
    child = np.random.SeedSequence(state.seed, spawn_key=(state.draws,))
    state.draws += 1
    return np.random.default_rng(child)


def _seeds_strategy():
    try:
        from hypothesis import strategies as st
    except ImportError:  # pragma: no cover
        return None
    return st.integers(0, SEED_MAX)


SEEDS = _seeds_strategy()  # hypothesis strategy of generator seeds: rng(data.draw(SEEDS))


def randn(gen, shape, dtype):
    return gen.standard_normal(shape).astype(dtype)


# ---- arrays on the target device -------------------------------------------------------------

def to_target(a):
    """Host array -> an array on the target device (identity on the CPU)."""
    if not ON_CUDA or not isinstance(a, np.ndarray):
        return a
    from dispatch import devices

    return devices.to_device(a)  # bfloat16 too


def to_host(a):
    if isinstance(a, tuple):
        return tuple(to_host(x) for x in a)
    if isinstance(a, np.ndarray) or a is None or np.isscalar(a):
        return a
    return a.copy_to_host()


def poisoned(shape, dtype):
    """An out= array full of NaN on the target device, so an unwritten element fails."""
    return to_target(np.full(shape, np.nan, dtype=dtype))


def run(impl: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) with implementation `impl` forced for fn's op, arrays moved to
    the target device and the result brought back to the host."""
    op = kwargs.pop("_op", fn.__name__)
    args = tuple(to_target(a) for a in args)
    kwargs = {k: to_target(v) for k, v in kwargs.items()}
    with dispatch.use(**{op: impl}):
        return to_host(fn(*args, **kwargs))


def concurrent_mismatches(call, cases, rounds=5):
    """Indices of the cases whose result differs (bitwise) from its single-threaded one when
    call(case) runs `rounds` times for every case at once, one Python thread per case (the
    kernels release the GIL; per-thread workspaces must keep the threads apart).  call
    enters any dispatch.use override itself: overrides are per thread."""
    import threading

    want = [np.asarray(call(c)) for c in cases]
    bad = []

    def worker(i):
        for _ in range(rounds):
            got = np.asarray(call(cases[i]))
            if got.shape != want[i].shape or got.tobytes() != want[i].tobytes():
                bad.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return sorted(set(bad))


def strided(a):
    """A non-contiguous view with the values of a (every other element of a bigger array)."""
    big = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype) if a.ndim else np.empty((2,), a.dtype)
    if a.ndim == 0:
        return a
    big[..., ::2] = a
    big[..., 1::2] = np.nan
    return big[..., ::2]


def read_only(a):
    """A C-contiguous copy of a with writeable=False (None stays None)."""
    if a is None:
        return None
    r = np.array(a, copy=True, order="C")
    r.flags.writeable = False
    return r


def broadcast_rows(a):
    """np.broadcast_to of a's first index along axis 0 to a's shape: a read-only view with
    zero strides on axis 0 (every row equal).  Compare with the reference on
    ``np.array(view)``.  Arrays with fewer than 2 dimensions broadcast their first element."""
    if a is None:
        return None
    if a.ndim < 2:
        return np.broadcast_to(a.reshape(-1)[:1].reshape((1,) * a.ndim), a.shape)
    return np.broadcast_to(a[:1], a.shape)


# ---- kernel specializations ----------------------------------------------------------------

def kernel_dispatchers(module):
    """The numba dispatchers (njit functions) defined in a kernel module, by name."""
    from numba.core.dispatcher import Dispatcher

    return {name: obj for name, obj in vars(module).items() if isinstance(obj, Dispatcher)}


def signature_counts(*modules) -> dict:
    """{module.kernel: number of compiled signatures} over the kernels of the modules."""
    return {f"{m.__name__}.{n}": len(d.signatures) for m in modules for n, d in kernel_dispatchers(m).items()}


def assert_no_new_specialization(modules, call, what=""):
    """Run call() and assert it compiled (or loaded from numba's cache) no new signature of
    any kernel in modules and emitted no warning of any kind.  Warm the kernels first with
    the same call on writeable arrays: this checks that a variant of the inputs (read-only,
    broadcast) reuses the machine code compiled for plain arrays."""
    before = signature_counts(*modules)
    assert before, f"no numba kernels found in {[m.__name__ for m in modules]}"
    assert any(before.values()), f"{what}: the warm-up compiled no kernel of {[m.__name__ for m in modules]}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    after = signature_counts(*modules)
    grown = {k: (before.get(k, 0), v) for k, v in after.items() if v != before.get(k, 0)}
    assert not grown, f"{what}: new kernel specializations (signatures before, after): {grown}"
    assert not caught, f"{what}: warnings emitted: " + "; ".join(
        f"{w.category.__name__}: {w.message}" for w in caught)



class compile_events:
    """``with compile_events() as seen:`` collects numba's "numba:compile" events of the
    block (every compile, cache load and typing attempt, also those that add no signature:
    numba's literally() re-types a function on each call without one)."""

    def __enter__(self):
        import numba.core.event as ev

        seen = self.seen = []

        class _Listener(ev.Listener):
            def on_start(self, event):
                seen.append(event.data.get("dispatcher"))

            def on_end(self, event):
                pass

        self._listener = _Listener()
        ev.register("numba:compile", self._listener)
        return seen

    def __exit__(self, *exc):
        import numba.core.event as ev

        ev.unregister("numba:compile", self._listener)
        return False

# ---- error measures --------------------------------------------------------------------------
#
# assert_close(got, ref, tol) checks two bounds (ref is the float64 reference):
#
# 1. normwise:    max|got - ref| <= tol * max|ref|   (or <= UNDERFLOW[dtype], see below)
#    tol is the caller's: TOL[dtype] for elementwise ops, reduction_tol(dtype, k) for
#    results that sum k terms (float32 error grows ~ k * 2e-7 in the worst case; the
#    1e-5 floor is ~80 float32 ulps).  float64: 1e-12 (~4500 ulps; the kernels' float64
#    paths use libm-grade exp / erfc and no float32 intermediates).
#
# 2. elementwise: |got - ref| <= atol + rtol * |ref|   for every element
#    rtol = tol: every element gets the relative accuracy asked of the largest ones, so
#    a probability of 1e-8 computed as 2e-8 (relative error 1) fails although its
#    normwise error (1e-8 of the row's max) is far below any float32 bound.
#
#    atol, by default (strict): max(FLOOR[dtype] * max|ref|, UNDERFLOW[dtype]).
#      For results with a small relative error everywhere: activations, softmax
#      probabilities, exact zeros.  The floor only absorbs the far tails:
#      - float32 FLOOR 1e-20: exp's argument carries a relative rounding error of eps, so
#        exp(-z^2) or exp(-2u) of a large argument has a relative error ~ |arg| * eps:
#        measured on the kernels, gelu's erfc for x < -10 and tanh-gelu for x < -8 reach
#        1.2e-5 to 1.8e-5 (> rtol), but those results are below 1e-20 of any output scale
#        >= 1 (gelu(-10) = -8e-23).  Every result above that floor met rtol = 1e-5 on a
#        4-million-point sweep of x in [-40, 40] (gelu, tanh-gelu, silu) and in 7 full
#        runs of the CPU suite (softmax probabilities: every element within rtol).
#      - float64 FLOOR 1e-290: exp64 and libm keep relative accuracy down to underflow.
#      - float16 FLOOR 1e-20: float16 kernels compute in float32 (same tails).
#      - UNDERFLOW: absolute error of results that flush to 0: float32 silu(x) for
#        x < -88.4 is x / inf = -0 where the true value is ~5e-37; float16 results are
#        rounded to subnormals of quantum 6e-8; float64 underflows near 1e-300.  The
#        normwise check accepts it too: a one-element tanh-gelu of x = -10.4 is -0.0
#        against -1.5e-39 (a normwise error of 1; NK_TEST_SEED=1633739782 on
#        test_unary_matches_reference[gelutanh-cpu-serial-(1,)-float32]).
#    atol with cancel=True: CANCEL_FLOOR * tol * max|ref|, at least UNDERFLOW.
#      For results that are sums or differences with cancellation (matmul, norm, rope
#      and attention outputs, log-probabilities and losses near 0): their absolute error
#      is ~ eps * (scale of the terms), which an element that cancels to ~0 carries whole,
#      so their relative error is unbounded.  Measured on the current kernels (7 runs of
#      the CPU suite, 19,800 comparisons): the atol these results needed, as a fraction
#      of tol * max|ref|, was at most 0.11 (layer_norm of rows with mean 30, float32),
#      0.04 (attention), 0.014 (matmul), 0.0016 (rope), 0.0013 (cross_entropy, log_softmax);
#      float64 at most 9e-4.  CANCEL_FLOOR = 0.5 keeps 4x headroom over the worst.
#
# NaN, +inf and -inf patterns of got must equal ref's (a NaN-poisoned out= element that
# was never written fails here).  A failure names the worst element (index, got, ref) and
# the test's seed.

TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def reduction_tol(dtype, k: int) -> float:
    """Bound for results that are reductions over k terms (matmul, softmax denominators)."""
    if np.dtype(dtype) == np.float64:
        return 1e-12
    return max(1e-5, k * 2e-7)


FLOOR = {np.dtype(np.float16): 1e-20, np.dtype(np.float32): 1e-20, np.dtype(np.float64): 1e-290}
UNDERFLOW = {np.dtype(np.float16): 6e-8, np.dtype(np.float32): 1e-36, np.dtype(np.float64): 1e-300}
CANCEL_FLOOR = 0.5


def _float_dtype(got, ref):
    for a in (got, ref):
        dt = np.asarray(a).dtype
        if dt.kind == "f":
            return dt
    return np.dtype(np.float64)


def rel_err(got, ref) -> float:
    """max|got - ref| / max|ref| (0/0 -> 0); NaN anywhere in got gives inf."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != reference {ref.shape}"
    if np.isnan(got).any() and not np.isnan(ref).any():
        return np.inf
    scale = np.max(np.abs(ref)) if ref.size else 0.0
    diff = np.max(np.abs(got - ref)) if ref.size else 0.0
    if scale == 0.0:
        return float(diff)
    return float(diff / scale)


def _seed_note() -> str:
    seed = current_seed()
    if _in_hypothesis_example():
        return "inputs drawn by hypothesis (its falsifying example shows the seed)"
    return f"{SEED_ENV}={seed}" if seed is not None else "no test seed"


def _at(shape, flat):
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _nonfinite_mismatch(got, ref, what):
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        gm, rm = test(got), test(ref)
        bad = np.flatnonzero(gm != rm)
        if bad.size:
            i = _at(got.shape, bad[0])
            return (f"{what}: {name} pattern differs at {bad.size} element(s), first at index {i}: "
                    f"got {got[i]!s}, ref {ref[i]!s} [{_seed_note()}]")
    return None


def product_scale(a, b, bias=None, *, transpose_b=False):
    """The scale for assert_close of act(a @ b + bias) (b as (N, K) with transpose_b, as
    linear's weight): max of |a| @ |b| + |bias|, the size of the terms each output sums.
    Their float rounding (~ eps * that size) survives whole in a product that cancels to
    near 0, and an activation then passes it on at a slope of up to ~1.13 (gelu_tanh;
    silu 1.1) while its output is as small as the product: max|ref| alone cannot bound
    it.  NK_TEST_SEED=568 on a (1, 1) @ (1, 1) + bias gelu_tanh product: 0.688 * -1.241 +
    0.852 = -1.3e-3, off by 2.2e-5 of itself in float32 (1.1e-8 of the terms)."""
    aa = np.abs(np.asarray(a, np.float64))
    bb = np.abs(np.asarray(b, np.float64))
    if transpose_b:
        bb = np.swapaxes(bb, -1, -2)
    terms = aa @ bb if aa.size and bb.size else np.zeros(1)
    if bias is not None:
        terms = terms + np.abs(np.asarray(bias, np.float64))
    terms = terms[np.isfinite(terms)]   # rows with inf / NaN inputs are compared by pattern
    return 1.2 * float(np.max(terms)) if terms.size else 0.0


def assert_close(got, ref, tol, what="", *, rtol=None, atol=None, cancel=False, scale=None):
    """Normwise and elementwise comparison with the float64 reference (see above):
    max|got - ref| <= tol * S, and |got - ref| <= atol + rtol * |ref| per element,
    where unless given rtol = tol and atol = max(FLOOR[dtype] * S, UNDERFLOW[dtype])
    (dtype: got's) or, with cancel=True, atol = max(CANCEL_FLOOR * tol * S, UNDERFLOW[dtype]).
    S = max|ref|, or `scale` when given: the size of the terms the result was computed
    from, where they can cancel to a result far smaller than themselves before a further
    step (an activation after a product: see product_scale).  NaN / inf patterns must
    match.  A failure names the worst element and the test's seed."""
    got, ref = np.asarray(got), np.asarray(ref)
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    assert g.shape == r.shape, f"{what}: shape {g.shape} != reference {r.shape} [{_seed_note()}]"
    if g.size == 0:
        return
    dtype = _float_dtype(got, ref)
    msg = _nonfinite_mismatch(got, ref, what)
    assert msg is None, msg
    fin = np.isfinite(r)
    if not fin.any():
        return
    gf, rf = g[fin], r[fin]
    scale = float(np.max(np.abs(rf))) if scale is None else max(float(scale), float(np.max(np.abs(rf))))
    diff = np.abs(gf - rf)
    idx = np.flatnonzero(fin)
    f64 = np.dtype(np.float64)
    underflow = UNDERFLOW.get(dtype, UNDERFLOW[f64])
    # normwise (an output that underflowed whole, e.g. gelu of one very negative x, is 0)
    dmax = float(np.max(diff))
    err = dmax / scale if scale else dmax
    if not (err <= tol or dmax <= underflow):
        w = int(np.argmax(diff))
        i = _at(g.shape, idx[w])
        raise AssertionError(
            f"{what} normwise relative error {err:.3e} > {tol:.1e} (max|ref| = {scale:.3e}); worst element "
            f"{i}: got {got[i]!s}, ref {ref[i]!s} [{_seed_note()}]")
    # elementwise
    rtol = tol if rtol is None else rtol
    if atol is None:
        if cancel:
            # a result below the dtype's underflow is 0 or a subnormal there, with nothing
            # to cancel against: a one-element batch_norm + gelu_tanh of a large negative
            # value is -0.0 in float32 against -8.2e-48 (NK_TEST_SEED=4211731053 on
            # test_batch_norm_matches_reference[cpu-parallel-(1, 1)-gelu_tanh-float32])
            atol = max(CANCEL_FLOOR * tol * scale, underflow)
        else:
            atol = max(FLOOR.get(dtype, FLOOR[f64]) * scale, underflow)
    bound = atol + rtol * np.abs(rf)
    excess = diff - bound
    if np.any(excess > 0):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(bound > 0, diff / bound, np.inf)
        w = int(np.argmax(ratio))
        i = _at(g.shape, idx[w])
        nbad = int(np.count_nonzero(excess > 0))
        raise AssertionError(
            f"{what} elementwise: {nbad} of {rf.size} element(s) outside |got - ref| <= atol + rtol*|ref| "
            f"(rtol {rtol:.1e}, atol {atol:.1e}); worst element {i}: got {got[i]!s}, ref {ref[i]!s}, "
            f"|got - ref| = {diff[w]:.3e} > {bound[w]:.3e} [{_seed_note()}]")



# The 16-bit formats the CPU ops take (kernels_cpu/half.py): name -> (dtype, u, sub).  Rounding
# to nearest is within u of the value (bfloat16 keeps 8 significant bits, float16 11), or of
# half a subnormal step below the format's normal range (2^-133 / 2^-25).
HALF_FORMATS = {"bfloat16": (None, 2.0 ** -8, 2.0 ** -133), "float16": (np.dtype(np.float16), 2.0 ** -11, 2.0 ** -25)}


def half_dtype(name):
    """The numpy dtype of the 16-bit format `name` (ml_dtypes.bfloat16 imported only here)."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return HALF_FORMATS[name][0]


def need_half_format(impl, half):
    """Skip unless the forced implementation takes this 16-bit format on this host
    (cpu-bf16-amx, of matmul and conv2d: bfloat16 on AMX hosts; cpu-bf16-dot, of matmul:
    bfloat16 on AVX-512 BF16 hosts)."""
    from kernels_cpu import bf16_gemm as KB
    if impl == "cpu-bf16-amx" and (np.dtype(half) != dispatch.validate.BF16 or KB.amx_refusal() is not None):
        pytest.skip(f"cpu-bf16-amx takes bfloat16 on AMX hosts ({np.dtype(half)}; {KB.amx_refusal()})")
    if impl == "cpu-bf16-dot" and (np.dtype(half) != dispatch.validate.BF16 or KB.host_refusal() is not None):
        why = KB.host_refusal() or "the host has it"
        pytest.skip(f"cpu-bf16-dot takes bfloat16 on AVX-512 BF16 hosts ({np.dtype(half)}; {why})")


def other_half(dt):
    """The 16-bit dtype that is not dt (a wrong dtype of the same size, for bad-input tests)."""
    return half_dtype("float16" if dt.name == "bfloat16" else "bfloat16")


def as_half(dt, a):
    """a rounded to the 16-bit dtype dt (through float32, as a model's tensors are made)."""
    return np.asarray(a, np.float32).astype(dt)


def half_limits(dt):
    """(largest finite, a subnormal) of the 16-bit dtype dt: the edge values tests feed."""
    import ml_dtypes
    fi = ml_dtypes.finfo(dt)
    return float(fi.max), 3.0 * float(fi.smallest_subnormal)


def assert_half_close(got, want, slack, what=""):
    """got (a bfloat16 / float16 array) against the float64 want: NaN exactly where want has
    NaN, infinities equal, and elsewhere within the format's rounding of the value plus
    `slack` (a number or an array of want's shape: the float32 arithmetic's error before
    the rounding, for the op to state)."""
    name = got.dtype.name
    assert name in HALF_FORMATS, f"{what}: result dtype {got.dtype}, want bfloat16 or float16"
    _, u, sub = HALF_FORMATS[name]
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    g = np.asarray(got, np.float64)
    nan = np.isnan(want)
    assert (np.isnan(g) == nan).all(), f"{what}: NaN pattern differs"
    inf = np.isinf(want)
    assert (g[inf] == want[inf]).all(), f"{what}: infinities differ"
    fin = ~nan & ~inf
    err = np.abs(g - want)[fin]
    bound = (u * np.abs(want) + np.broadcast_to(np.asarray(slack, np.float64), want.shape) + sub)[fin]
    if err.size:
        i = int(np.argmax(err - bound))
        assert (err <= bound).all(), (f"{what}: element {i} off by {err[i]:.3g}, allowed {bound[i]:.3g} "
                                      f"(ref {want[fin][i]:.6g})")


# ---- the CPU GEMM's plans ---------------------------------------------------------------------

def forget_gemm_plans(real_plan):
    """After changing a constant the GEMM's plans read: forget kernels_cpu.gemm's plans
    (real_plan, the cached _gemm_plan) and dispatch's decisions made from them."""
    from dispatch.ops import linalg as L
    real_plan.cache_clear()
    L._PLANS.clear()
    L._plan16.cache_clear()


def spy_gemm_plans(monkeypatch, record):
    """Watch the GEMM's plans: every plan kernels_cpu.gemm._gemm_plan makes (each launch
    plans through it) appends record(plan) to the list returned, with the real, cached
    _gemm_plan (for forget_gemm_plans)."""
    from kernels_cpu import gemm as K
    seen = []
    real_plan = K._gemm_plan

    def plan(*args):
        res = real_plan(*args)
        seen.append(record(res))
        return res

    monkeypatch.setattr(K, "_gemm_plan", plan)
    return seen, real_plan
