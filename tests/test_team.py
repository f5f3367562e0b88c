"""The thread team (kernels_cpu/team.py): every index runs once, from any number of
Python threads at once, whether or not a team thread joins; the team's threads do take
work; NK_SPIN_US is checked; with the team off the kernels still run."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from kernels_cpu import team
from kernels_cpu.approx import JIT_BY_ADDRESS
from kernels_cpu.parallel import c_array_at, fetch_add, run_at, run_workers, worker_address

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(team._UNSUPPORTED is not None, reason=f"team off here: {team._UNSUPPORTED}")


@njit(**JIT_BY_ADDRESS)
def _count(w, params):
    """p[1 + w] += 1, p[0] += 1 (atomically: an index run twice would show)."""
    p = c_array_at(params, np.int64(0), (512,))
    fetch_add(p, 1 + w, 1)
    fetch_add(p, 0, 1)


@njit(**JIT_BY_ADDRESS)
def _meet(w, params):
    """Index w marks itself started, then waits (up to p[0] spins) for the other index:
    both only finish early when two threads run them at once."""
    p = c_array_at(params, np.int64(0), (8,))
    fetch_add(p, 1 + w, 1)
    other = 2 - w
    spins = 0
    while fetch_add(p, other, 0) == 0 and spins < p[0]:
        spins += 1
    p[4 + w] = spins


@pytest.mark.parametrize("n", [2, 3, 64, 500])
def test_run_runs_each_index_once(n):
    p = np.zeros(512, np.int64)
    for _ in range(20):
        p[:] = 0
        assert team.run(worker_address(_count, ()), p.ctypes.data, n), team.describe()
        assert p[0] == n
        np.testing.assert_array_equal(p[1:1 + n], 1)
        assert not p[1 + n:].any()


def test_concurrent_callers_each_run_their_indices_once():
    """8 Python threads, 200 calls each: whoever holds the team runs on it, the others fall
    back to numba's threads (run_at); every call's indices run exactly once."""
    fn = worker_address(_count, ())
    errors = []

    def caller(seed):
        rng = np.random.default_rng(seed)
        p = np.zeros(512, np.int64)
        for _ in range(200):
            n = int(rng.integers(2, 40))
            p[:] = 0
            run_at(fn, p.ctypes.data, n)
            if p[0] != n or not (p[1:1 + n] == 1).all() or p[1 + n:].any():
                errors.append((seed, n, p[:1 + n].tolist()))

    threads = [threading.Thread(target=caller, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"seed, n, counts: {errors[:3]}"


def test_team_threads_take_indices():
    """Index 0 waits for index 1 to start (bounded): with a team thread running, the two
    meet; the team's count of indices it ran goes up."""
    if team.size() < 2:
        pytest.skip("one thread")
    p = np.zeros(8, np.int64)
    before = team.taken()
    met = 0
    for _ in range(20):
        p[:] = 0
        p[0] = 200_000_000  # spins before giving up (about 1 s): never reached when the two meet
        assert team.run(worker_address(_meet, ()), p.ctypes.data, 2)
        met += int(p[1] == 1 and p[2] == 1 and p[4] < p[0] and p[5] < p[0])
    assert team.taken() > before and met > 0, (team.taken(), before, met)


def test_a_team_thread_woken_on_the_callers_cpu_moves_off_it_and_stays_off():
    """The caller and every team thread pinned to one CPU: the next call's wake-up can only
    put a team thread there, so it moves itself off (everywhere else allowed) and keeps that
    mask, which the next wake-up after a pause must respect (the pause case of the module
    docstring)."""
    cpus = sorted(os.sched_getaffinity(0))
    if team.size() < 2 or len(cpus) < 2 or max(cpus) >= 64:
        pytest.skip("needs two CPUs below 64 and a team")
    p = np.zeros(512, np.int64)
    assert team.run(worker_address(_count, ()), p.ctypes.data, 2), team.describe()
    ids = [t.native_id for t in team._threads]
    mine = threading.get_native_id()
    here = cpus[0]
    try:
        for tid in ids + [mine]:
            os.sched_setaffinity(tid, {here})
        threading.Event().wait(0.05)   # past the spin window: the team threads sleep
        p[:] = 0
        assert team.run(worker_address(_count, ()), p.ctypes.data, 2)
        assert p[0] == 2
        deadline = threading.Event()
        for _ in range(200):   # the move is the team thread's own, after it wakes
            if all(os.sched_getaffinity(tid) == set(cpus) - {here} for tid in ids):
                break
            deadline.wait(0.005)
        assert [os.sched_getaffinity(tid) for tid in ids] == [set(cpus) - {here}] * len(ids)
    finally:
        for tid in ids + [mine]:
            os.sched_setaffinity(tid, set(cpus))


def test_run_workers_goes_through_the_team():
    before = team.taken()
    p = np.zeros(512, np.int64)
    for _ in range(200):
        p[:] = 0
        run_workers(worker_address(_count, ()), p, 2)
        assert p[0] == 2
    assert team.taken() >= before  # (the team thread may have slept through all of them)


@pytest.mark.parametrize("raw", ["x", "-1", "inf", "nan"])
def test_garbage_spin_window_is_an_error_naming_the_variable(raw):
    with pytest.raises(ValueError, match="NK_SPIN_US"):
        team._spin_from_env(raw)


def test_a_garbage_spin_window_is_a_clear_error_at_import():
    env = {**os.environ, "NK_SPIN_US": "lots"}
    p = subprocess.run([sys.executable, "-c", "import dispatch"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "NK_SPIN_US='lots'" in p.stderr, p.stderr[-2000:]


def test_spin_window_from_the_environment():
    assert team._spin_from_env(None) == team.DEFAULT_SPIN_US
    assert team._spin_from_env(" ") == team.DEFAULT_SPIN_US
    assert team._spin_from_env("0") == 0.0
    assert team._spin_from_env("12.5") == 12.5


def test_set_spin_us_checks_its_argument():
    with pytest.raises(TypeError, match="us must be a number"):
        team.set_spin_us("5")
    with pytest.raises(ValueError, match="non-negative"):
        team.set_spin_us(-1)


def test_with_the_team_off_row_kernels_run_on_numbas_threads():
    """set_spin_us(0): team.entry() is (0, 0), run() refuses, and the row kernels (which
    then fall back to numba's threads) still give the serial result (to the last bits a
    vectorized sum's order, which follows the buffers' alignment, may change)."""
    from kernels_cpu import activation, norm, norm_grad, softmax
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 257)).astype(np.float32)
    ref = np.empty_like(x)
    softmax.softmax_serial(x, ref, False)
    old = team.set_spin_us(0)
    try:
        assert team.entry() == (0, 0)
        assert not team.run(worker_address(_count, ()), np.zeros(512, np.int64).ctypes.data, 2)
        got = np.full_like(x, np.nan)
        softmax.softmax_parallel(x, got, False)
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=0)
        flat = x.ravel()
        a, b = np.full_like(flat, np.nan), np.full_like(flat, np.nan)
        activation.activation_serial(flat, a, 1)
        activation.activation_parallel(flat, b, 1)
        np.testing.assert_array_equal(a, b)
        w, bias = np.ones(257, np.float32), np.zeros(257, np.float32)
        o1, o2 = np.full_like(x, np.nan), np.full_like(x, np.nan)
        norm.layer_norm_serial(x, x, x, w, bias, np.float32(1e-5), o1, False)
        norm.layer_norm_parallel(x, x, x, w, bias, np.float32(1e-5), o2, False)
        np.testing.assert_allclose(o2, o1, rtol=2e-5, atol=2e-6)
        # the norm backward's prange fallback sums its row blocks as the serial driver does
        go = rng.standard_normal(x.shape).astype(np.float32)
        d1, d2 = np.full_like(x, np.nan), np.full_like(x, np.nan)
        s1, s2 = np.full((2, 257), np.nan, np.float32), np.full((2, 257), np.nan, np.float32)
        norm_grad.layer_norm_grad_serial(go, x, w, x, np.float32(1e-5), d1, s1, False)
        norm_grad.layer_norm_grad_parallel(go, x, w, x, np.float32(1e-5), d2, s2, False)
        np.testing.assert_array_equal(d2, d1)
        np.testing.assert_array_equal(s2, s1)
    finally:
        team.set_spin_us(old)
    assert team.entry() != (0, 0)


def _child_softmax(q):
    from kernels_cpu import softmax
    rng = np.random.default_rng(1)
    x = rng.standard_normal((600, 130)).astype(np.float32)
    ref, got = np.empty_like(x), np.full_like(x, np.nan)
    softmax.softmax_serial(x, ref, False)
    softmax.softmax_parallel(x, got, False)
    q.put((bool(np.allclose(got, ref, rtol=2e-6, atol=0)), team.describe(), team._run is not None))


def test_a_forked_child_starts_a_team_of_its_own():
    """The parent's team threads do not exist in a forked child: the child's first call
    starts its own (a call in flight at the fork may have left the parent's state busy)."""
    import multiprocessing as mp
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork here")
    p = np.zeros(512, np.int64)
    assert team.run(worker_address(_count, ()), p.ctypes.data, 2)  # the parent's team runs
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_child_softmax, args=(q,))
    proc.start()
    equal, line, started = q.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0 and equal and started, line
