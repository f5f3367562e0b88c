"""kernels_cpu/compile_helper.py and parallel.worker_addresses: a cold first call's kernels
compiled in two processes at once.  A helper compiles its share into numba's cache and this
process loads it from there; a helper that fails changes nothing but the time (and none is
started again); warm kernels, uncached functions and NK_COMPILE_HELPER=off start no helper;
a garbage setting is an error naming the variable."""
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from kernels_cpu import compile_helper as H
from tests.support import ON_CUDA

pytestmark = pytest.mark.skipif(ON_CUDA, reason="numba's CPU cache")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Kernels called by address (parallel.worker_address's convention: (w, params, *variant));
# `mod` is imported by the test's process and by the helper, which cannot import it when
# FAIL_IN_HELPER is set.
MODULE = """
import os

import numpy as np
from numba import njit

from kernels_cpu.approx import JIT_BY_ADDRESS
from kernels_cpu.parallel import c_array_at

if os.environ.get("FAIL_IN_HELPER") and os.environ.get("NK_COMPILE_HELPER") == "off":
    raise ImportError("not importable in the helper")


@njit(**JIT_BY_ADDRESS)
def big(w, params, k):
    p = c_array_at(params, np.int64(0), (1,))
    p[0] = p[0] * k + 1


@njit(**JIT_BY_ADDRESS)
def small(w, params, k):
    p = c_array_at(params, np.int64(0), (1,))
    p[0] = p[0] + k


@njit(no_cpython_wrapper=True, no_cfunc_wrapper=False)
def uncached(w, params, k):
    p = c_array_at(params, np.int64(0), (1,))
    p[0] = p[0] - k
"""

RUN = """
import json, sys, threading
import numpy as np
from kernels_cpu import compile_helper as H, parallel as P
import mod

def value(addr, start):
    p = np.array([start], np.int64)
    P.run_serial(addr, p)
    return int(p[0])

out = {}
addrs = P.worker_addresses([(mod.big, (3,)), (mod.small, (5,)), (mod.small, (7,))])
out["values"] = [value(a, 10) for a in addrs]
out["after_batch"] = dict(H.STATS)
# the same kernels again, and functions numba keeps no cache for: no helper
P.worker_addresses([(mod.big, (3,)), (mod.small, (5,))])
P.worker_addresses([(mod.uncached, (1,)), (mod.uncached, (2,))])
out["after_warm_and_uncached"] = dict(H.STATS)
# four threads at once asking for the same cold batch: one helper, the same addresses
got = []
threads = [threading.Thread(target=lambda: got.append(P.worker_addresses([(mod.big, (11,)), (mod.small, (13,))])))
           for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["threads_same"] = all(g == got[0] for g in got) and len(got) == 4
out["threads_values"] = [value(a, 10) for a in got[0]]
out["after_threads"] = dict(H.STATS)
# compile_ahead: a helper starts on the kernels at once; the call that needs them later
# compiles the ones the helper has not started on and loads the others from the cache
P.compile_ahead([(mod.big, (17,)), (mod.small, (19,)), (mod.small, (23,))])
out["after_ahead"] = dict(H.STATS)
P.compile_ahead([(mod.big, (17,))])  # already given to a helper: no other
out["after_second_ahead"] = dict(H.STATS)
out["ahead_values"] = [value(a, 10) for a in P.worker_addresses([(mod.big, (17,)), (mod.small, (19,)),
                                                                   (mod.small, (23,))])]
out["ahead_pending"] = len(P._AHEAD)
out["cache_hits"] = {f.__name__: sum(f.stats.cache_hits.values()) for f in (mod.big, mod.small)}
out["cache_misses"] = {f.__name__: sum(f.stats.cache_misses.values()) for f in (mod.big, mod.small)}
print(json.dumps(out))
"""


def _run(tmp_path, **env_extra):
    (tmp_path / "mod.py").write_text(MODULE)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               **env_extra)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_helper_compiles_into_the_cache_and_this_process_loads_it(tmp_path):
    out = _run(tmp_path, NK_COMPILE_HELPER="on")
    assert out["values"] == [31, 15, 17]  # 10 * 3 + 1, 10 + 5, 10 + 7
    assert out["threads_values"] == [111, 23] and out["threads_same"]
    # one helper for the first batch, none for warm kernels or uncached functions, one for
    # the threads' batch; each compiled its share
    assert out["after_batch"]["started"] == 1 and out["after_batch"]["succeeded"] == 1, out
    assert out["after_warm_and_uncached"]["started"] == 1, out
    assert out["after_threads"]["started"] == 2 and out["after_threads"]["succeeded"] == 2, out
    # this process compiled big(3) and big(11) (each batch's first) and loaded the helper's
    # small(5) (its first) from the cache
    assert out["cache_misses"]["big"] <= 3, out
    assert out["cache_hits"]["small"] >= 1, out
    # compile_ahead started one helper (not two for the same kernels); every kernel it was
    # given was then taken over, from the helper or compiled here
    assert out["after_ahead"]["started"] == 3 and out["after_second_ahead"]["started"] == 3, out
    assert out["ahead_values"] == [171, 29, 33] and out["ahead_pending"] == 0, out
    # a second process finds every kernel in the cache: no helper
    again = _run(tmp_path, NK_COMPILE_HELPER="on")
    assert again["values"] == [31, 15, 17] and again["after_threads"]["started"] == 0, again
    assert again["ahead_values"] == [171, 29, 33] and again["after_ahead"]["started"] == 0, again
    assert sum(again["cache_misses"].values()) == 0, again


def test_a_helper_that_fails_changes_nothing_but_the_time(tmp_path):
    out = _run(tmp_path, NK_COMPILE_HELPER="on", FAIL_IN_HELPER="1")
    assert out["values"] == [31, 15, 17] and out["threads_values"] == [111, 23], out
    assert out["ahead_values"] == [171, 29, 33], out
    # the first helper failed: none is started again in this process
    assert out["after_ahead"]["started"] == 1 and out["after_ahead"]["failed"] == 1, out
    assert "not importable in the helper" in out["after_threads"]["last_error"], out
    assert sum(out["cache_hits"].values()) == 0, out  # this process compiled everything itself


def test_a_helper_outliving_its_starter_cleans_up(tmp_path):
    """compile_ahead's helper goes on after the process that started it exits, fills the
    cache, and removes its claims directory itself."""
    (tmp_path / "mod.py").write_text(MODULE)
    code = """
        from kernels_cpu import parallel as P
        import mod
        P.compile_ahead([(mod.big, (29,)), (mod.small, (31,))])
        print(next(iter(P._AHEAD.values()))[0].claims)
    """
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               NK_COMPILE_HELPER="on")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    claims = p.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 120
    while os.path.exists(claims) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(claims), os.listdir(claims)
    # and what it compiled is in the cache
    check = """
        import mod
        from kernels_cpu import parallel as P
        P.worker_addresses([(mod.big, (29,)), (mod.small, (31,))])
        print(sum(mod.big.stats.cache_hits.values()) + sum(mod.small.stats.cache_hits.values()))
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(check)], env=dict(env, NK_COMPILE_HELPER="off"),
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.split()[-1] == "2", (p.stdout, p.stderr[-3000:])


def test_off_starts_no_helper(tmp_path):
    out = _run(tmp_path, NK_COMPILE_HELPER="off")
    assert out["values"] == [31, 15, 17] and out["ahead_values"] == [171, 29, 33]
    assert out["after_ahead"]["started"] == 0, out


def test_attention_cold_with_a_helper_matches_the_warm_result(tmp_path):
    """The kernels a helper compiles are the ones this process would: a cold attention call
    (fresh cache, helper on) gives the same output as this process's kernels."""
    import dispatch
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 33, 16)).astype(np.float32) for _ in range(3))
    np.save(tmp_path / "qkv.npy", np.stack([q, k, v]))
    code = f"""
        import json
        import numpy as np
        import dispatch
        from kernels_cpu import attention as A, compile_helper as H
        q, k, v = np.load({str(tmp_path / 'qkv.npy')!r})
        np.save({str(tmp_path / 'out.npy')!r}, dispatch.attention(q, k, v, causal=True))
        print(json.dumps({{"stats": H.STATS, "worker_hits": sum(A.flash_worker.stats.cache_hits.values())}}))
    """
    env = dict(os.environ, PYTHONPATH=ROOT, NUMBA_CACHE_DIR=str(tmp_path / "cache"), NK_COMPILE_HELPER="on")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["stats"]["started"] >= 1 and res["stats"]["failed"] == 0, res
    assert res["worker_hits"] >= 1, res  # the worker came from the helper, through the cache
    want = dispatch.attention(q, k, v, causal=True)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-6, atol=1e-7)


# ---- when a helper runs --------------------------------------------------------------------

@pytest.mark.parametrize("value, mode", [(None, "auto"), ("", "auto"), (" ", "auto"), ("on", "on"), ("OFF", "off"),
                                         ("auto", "auto")])
def test_mode_from_env(value, mode):
    assert H.mode_from_env(value) == mode


@pytest.mark.parametrize("value", ["1", "yes", "lots"])
def test_garbage_mode_names_the_variable(value):
    with pytest.raises(ValueError, match=f"NK_COMPILE_HELPER={value!r}: expected one of auto, on, off"):
        H.mode_from_env(value)


def test_garbage_mode_stops_the_import():
    env = {**os.environ, "NK_COMPILE_HELPER": "lots", "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "-c", "import kernels_cpu.parallel"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "NK_COMPILE_HELPER='lots'" in p.stderr, p.stderr[-2000:]


def test_auto_wants_a_free_core(monkeypatch):
    monkeypatch.setattr(H, "_usable_cpus", lambda: 2)
    monkeypatch.setattr(H, "_others_running", lambda: 0)
    assert H.wanted("auto") and H.wanted("on") and not H.wanted("off")
    monkeypatch.setattr(H, "_others_running", lambda: 1)  # the other core is busy
    assert not H.wanted("auto") and H.wanted("on")
    monkeypatch.setattr(H, "_others_running", lambda: None)  # not known
    assert not H.wanted("auto")
    monkeypatch.setattr(H, "_usable_cpus", lambda: 1)
    monkeypatch.setattr(H, "_others_running", lambda: 0)
    assert not H.wanted("auto")
    monkeypatch.setattr(H, "_usable_cpus", lambda: 2)
    monkeypatch.setitem(H.STATS, "failed", 1)  # a helper failed in this process: no more
    assert not H.wanted("auto") and not H.wanted("on")


def test_others_running_leaves_out_this_process():
    n = H._others_running()
    assert n is None or n >= 0


@pytest.mark.parametrize("n", range(1, 7))
def test_the_two_orders_cover_every_kernel(n):
    main, helper = H.main_order(n), H.helper_order(n)
    assert main[0] == 0 and (n < 2 or helper[0] == 1)
    assert sorted(main) == sorted(set(main)) and sorted(helper) == sorted(set(helper))
    assert set(main) | set(helper) == set(range(n))
