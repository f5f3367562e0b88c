"""What every op test shares: the implementations to test, forcing one, moving data to
its device, poisoned outputs, seeded random inputs and the error measure.

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
from dataclasses import dataclass

import numpy as np
import pytest

import dispatch
from dispatch import registry

TARGET = os.environ.get("NK_TEST_DEVICE", "cpu")
ON_CUDA = TARGET == "cuda"
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def impl_params(op: str, device: str = TARGET):
    """pytest params: every implementation of op on the device, by name; a single
    skip-marked param when there is none.  Parametrize with these params themselves (or
    copy ``p.marks`` when building new ones): taking ``p.values[0]`` alone drops the skip
    mark and the test then runs with impl=None (tests/conftest.py rejects that)."""
    impls = registry.implementations(op, device=device)
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
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a)) if a.flags.c_contiguous or a.ndim == 0 else cuda.to_device(a.copy())


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


def strided(a):
    """A non-contiguous view with the values of a (every other element of a bigger array)."""
    big = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype) if a.ndim else np.empty((2,), a.dtype)
    if a.ndim == 0:
        return a
    big[..., ::2] = a
    big[..., 1::2] = np.nan
    return big[..., ::2]


# ---- error measures --------------------------------------------------------------------------

# Normwise relative error bounds: max|got - ref| / max|ref|.
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def reduction_tol(dtype, k: int) -> float:
    """Bound for results that are reductions over k terms (matmul, softmax denominators)."""
    if np.dtype(dtype) == np.float64:
        return 1e-12
    return max(1e-5, k * 2e-7)


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


def assert_close(got, ref, tol, what=""):
    err = rel_err(got, ref)
    assert err <= tol, f"{what} relative error {err:.3e} > {tol:.1e}"
