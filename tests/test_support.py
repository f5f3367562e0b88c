"""The test infrastructure itself: per-test seeds and their replay, the seed printed on
failure, seeds drawn by hypothesis and impl_params' skip marks.  Pure numpy: no kernel
runs here."""
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings

from tests import support
from tests.support import SEEDS, impl_params, rng

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
