"""The test infrastructure itself: per-test seeds and their replay, the seed printed on
failure, seeds drawn by hypothesis, impl_params' skip marks and assert_close's normwise and
elementwise bounds.  Pure numpy: no kernel runs here."""
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings

from tests import support
from tests.support import ON_CUDA, SEEDS, assert_close, impl_params, reduction_tol, rel_err, rng

# the harness itself, device-independent: the CPU step runs it (under the simulator its
# pytest child alone took 6.2 s of CI's simulator step, 2026-12-02)
pytestmark = pytest.mark.skipif(ON_CUDA, reason="the test harness (the CPU step runs it)")

ROOT = pathlib.Path(__file__).resolve().parent.parent


# ---- seeds ---------------------------------------------------------------------------------

def test_each_rng_call_is_a_new_stream_of_the_test_seed():
    seed = support.current_seed()
    assert seed is not None and 0 <= seed < 2**32
    a, b = rng().random(4), rng().random(4)
    assert not np.array_equal(a, b)
    # the same seed gives the same streams again, in order: what a replay does
    again = support.TestSeed(seed, "replay")
    saved, support._current = support._current, again
    try:
        assert np.array_equal(rng().random(4), a) and np.array_equal(rng().random(4), b)
    finally:
        support._current = saved


def test_env_seed_is_used_and_checked(monkeypatch):
    saved = support._current
    try:
        monkeypatch.setenv(support.SEED_ENV, "123")
        assert support.begin_test("x").seed == 123
        first = rng().random(3)
        support.begin_test("x")
        assert np.array_equal(rng().random(3), first)
        for bad in ("abc", "-1", str(2**32)):
            monkeypatch.setenv(support.SEED_ENV, bad)
            with pytest.raises(ValueError, match="NK_TEST_SEED must be an integer"):
                support.begin_test("x")
    finally:
        support._current = saved


def test_rng_outside_a_test_is_an_error():
    saved, support._current = support._current, None
    try:
        with pytest.raises(RuntimeError, match="outside a test"):
            rng()
    finally:
        support._current = saved


@settings(max_examples=3, deadline=None)
@given(seed=SEEDS)
def test_hypothesis_examples_must_draw_their_seed(seed):
    with pytest.raises(RuntimeError, match="draw the seed from hypothesis"):
        rng()
    assert np.array_equal(rng(seed).random(2), np.random.default_rng(seed).random(2))


def test_replay_command_names_seed_and_test():
    cmd = support.replay_command("tests/test_x.py::test_y[a b-float32]", 42)
    assert cmd.startswith("NK_TEST_SEED=42 ")
    assert cmd.endswith("python -m pytest 'tests/test_x.py::test_y[a b-float32]'")


def _run_inner(tmp_path, body, **env):
    """Run a one-test file under this suite's conftest (seed fixture and report hook)."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(body))
    e = {k: v for k, v in os.environ.items() if k not in ("NK_TEST_SEED", "NK_TEST_DEVICE", "NUMBA_ENABLE_CUDASIM")}
    e.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-q", "test_inner.py"],
                          cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)


def test_failure_prints_seed_and_replay_command(tmp_path):
    body = """
        from tests.support import rng

        def test_fails():
            print("DRAWN", rng().integers(0, 10**9))
            assert False
    """
    r = _run_inner(tmp_path, body)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "seed ----" in r.stdout and "replay: NK_TEST_SEED=" in r.stdout, r.stdout
    seed = r.stdout.split("replay: NK_TEST_SEED=")[1].split()[0]
    assert "python -m pytest test_inner.py::test_fails" in r.stdout
    drawn = r.stdout.split("DRAWN ")[1].split()[0]
    # replaying the seed draws the same inputs
    r2 = _run_inner(tmp_path, body, NK_TEST_SEED=seed)
    assert r2.stdout.split("DRAWN ")[1].split()[0] == drawn, r2.stdout
    assert f"replay: NK_TEST_SEED={seed} " in r2.stdout


# ---- impl_params keeps its skip mark ------------------------------------------------------

def test_impl_params_skips_a_device_without_implementation():
    (p,) = impl_params("softmax", device="no-such-device")
    assert p.values == (None,)
    assert [m.name for m in p.marks] == ["skip"]
    assert all(q.values[0] is not None and not q.marks for q in impl_params("softmax", device="cpu"))


# ---- assert_close --------------------------------------------------------------------------

def _softmax_rows(g, n=1000):
    x = g.standard_normal((3, n)) * 3
    x[:, 0] = 30.0  # a dominant entry: the others are small probabilities
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_small_probability_off_by_2x_is_caught():
    """A probability of 1e-8 computed as 2e-8: normwise (max|got-ref|/max|ref| = 1e-8) it
    passes any float32 bound; the elementwise bound catches it."""
    p = _softmax_rows(rng())
    p[1, 7] = 1e-8
    got = p.astype(np.float32)
    got[1, 7] = np.float32(2e-8)
    tol = reduction_tol(np.float32, p.shape[-1])
    assert rel_err(got, p) <= tol
    with pytest.raises(AssertionError, match=r"elementwise: 1 of 3000 element\(s\).*worst element \(1, 7\): "
                                             r"got 2e-08, ref 1e-08") as e:
        assert_close(got, p, tol, "softmax")
    assert f"NK_TEST_SEED={support.current_seed()}" in str(e.value)
    # the correctly rounded float32 values pass
    assert_close(p.astype(np.float32), p, tol, "softmax")


def test_every_element_gets_the_relative_bound():
    g = rng()
    ref = g.standard_normal(50) * 1e3
    tol = 1e-5
    assert_close(ref * (1 + 0.9 * tol), ref, tol)  # every element just inside
    ref[7] = 1e-3  # a small element 3 tol off: normwise 3e-14, elementwise 3x its bound
    got = ref.copy()
    got[7] *= 1 + 3 * tol
    assert rel_err(got, ref) < 1e-10
    with pytest.raises(AssertionError, match=r"elementwise: 1 of 50 element\(s\).*worst element \(7,\)"):
        assert_close(got, ref, tol)


def test_cancel_floor_tolerates_absolute_error_near_zero():
    """A sum that cancels to ~0 carries the absolute error of its terms: cancel=True."""
    ref = np.array([1.0, -2.0, 1e-9])
    got = ref + np.array([0, 0, 5e-6])  # 5e-6 absolute, 2.5e-6 of the scale 2
    with pytest.raises(AssertionError, match="elementwise"):
        assert_close(got, ref, 1e-5)
    assert_close(got, ref, 1e-5, cancel=True)
    with pytest.raises(AssertionError, match="normwise"):
        assert_close(ref + np.array([0, 0, 1e-4]), ref, 1e-5, cancel=True)


def test_normwise_failure_names_worst_element():
    ref = np.arange(1.0, 7.0).reshape(2, 3)
    got = ref.copy()
    got[1, 2] += 1.0
    with pytest.raises(AssertionError, match=r"normwise relative error 1\.667e-01 > 1\.0e-05.*worst element \(1, 2\): "
                                             r"got 7\.0, ref 6\.0"):
        assert_close(got, ref, 1e-5, "x")


def test_nan_and_inf_patterns():
    ref = np.array([1.0, np.nan, -np.inf, 0.5])
    assert_close(ref.copy(), ref, 1e-12)
    with pytest.raises(AssertionError, match=r"NaN pattern differs at 1 element\(s\), first at index \(3,\)"):
        assert_close(np.array([1.0, np.nan, -np.inf, np.nan]), ref, 1e-5)
    with pytest.raises(AssertionError, match="NaN pattern differs"):
        assert_close(np.array([1.0, 2.0, -np.inf, 0.5]), ref, 1e-5)
    with pytest.raises(AssertionError, match=r"-inf pattern differs"):
        assert_close(np.array([1.0, np.nan, -1e30, 0.5]), ref, 1e-5)
    # a poisoned out= that stayed NaN is caught
    with pytest.raises(AssertionError, match="NaN pattern differs"):
        assert_close(np.full(3, np.nan, np.float32), np.ones(3), 1e-5)


def test_whole_output_underflowed_to_zero_passes():
    """gelu(x, "tanh") of one float32 x = -10.4 is -0.0; the float64 reference is -1.5e-39
    (a float32 subnormal): normwise relative error 1, absolute error below UNDERFLOW."""
    assert_close(np.array([-0.0], np.float32), np.array([-1.46e-39]), 1e-5)
    with pytest.raises(AssertionError, match="normwise"):
        assert_close(np.array([-0.0], np.float32), np.array([-1e-30]), 1e-5)


def test_shapes_must_match_and_empty_passes():
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.ones(3), np.ones((3, 1)), 1e-5)
    assert_close(np.ones((0, 4), np.float32), np.ones((0, 4)), 1e-5)
    assert_close(np.zeros(4, np.float32), np.zeros(4), 1e-5)
