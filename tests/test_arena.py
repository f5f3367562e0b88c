"""The CPU result arena (dispatch/ops/_arena.py): a large result's memory is reused only
once nothing refers to it, from any thread; its size limit, switch and empty_cache."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import dispatch
from dispatch.ops import _arena
from kernels_common.memory import ALIGN
from tests.support import ON_CUDA, TOL, assert_close, rng

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHAPE = (512, 1024)  # 2 MiB of float32: above MIN_BYTES


def _ref_softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _addr(a):
    return a.__array_interface__["data"][0]


pytestmark = [pytest.mark.skipif(_arena.KEEP_BYTES == 0, reason="NK_ARENA_MB=0: the arena is off"),
              # host buffers only: under the simulator these ran again (their three
              # child processes 6.5-6.9 s each in CI's simulator step, 2026-12-02)
              pytest.mark.skipif(ON_CUDA, reason="the host result arena (the CPU step runs it)")]


def test_reused_only_when_unreferenced():
    x = rng().standard_normal(SHAPE).astype(np.float32)
    dispatch.empty_cache()             # idle buffers of earlier tests would be handed out first
    y = dispatch.softmax(x)
    assert not y.flags.owndata and y.base.dtype == np.uint8
    y2 = dispatch.softmax(x)           # y is alive: another buffer
    assert not np.shares_memory(y, y2)
    view = y[3:, ::2]                  # a view keeps the buffer too
    mem = memoryview(y2)               # and so does a buffer export
    seen = {_addr(y), _addr(y2)}
    del y, y2
    y3 = dispatch.softmax(x)
    assert not np.shares_memory(y3, view) and not np.shares_memory(y3, np.asarray(mem))
    assert_close(view, _ref_softmax(x)[3:, ::2], TOL[np.dtype(np.float32)], "softmax held by a view")
    seen.add(_addr(y3))
    del view, mem, y3
    y4 = dispatch.softmax(x)           # every earlier buffer is free now: one is reused
    assert _addr(y4) in seen
    assert_close(y4, _ref_softmax(x), TOL[np.dtype(np.float32)], "softmax in a reused buffer")


def test_results_start_on_a_cache_line():
    """The arena offsets each result into its buffer so that it starts on a 64-byte line
    (kernels_common.memory.ALIGN), at byte PAGE_OFFSET of a page (away from where numpy's
    and PyTorch's large arrays start), and the buffer it keeps is still what a result
    refers to (the idle test counts references to it)."""
    x = rng().standard_normal(SHAPE).astype(np.float32)
    dispatch.empty_cache()
    ys = [dispatch.softmax(x) for _ in range(3)]
    for y in ys:
        assert _addr(y) % ALIGN == 0
        assert _addr(y) % _arena.PAGE == _arena.PAGE_OFFSET
        assert any(y.base is buf for bufs in _arena._BUFS.values() for buf in bufs)
    del ys
    assert dispatch.empty_cache() > 0  # all three idle again, so freed


def test_live_results_never_share_memory_across_threads():
    gen = rng()
    xs = [gen.standard_normal(SHAPE).astype(np.float32) for _ in range(4)]
    refs = [_ref_softmax(x) for x in xs]
    errors, live = [], [[] for _ in xs]

    def work(i):
        try:
            for r in range(12):
                y = dispatch.softmax(xs[i])
                live[i].append(y)
                if len(live[i]) > 2:
                    live[i].pop(0)     # drop an old one: its buffer becomes free for anyone
                assert_close(y, refs[i], TOL[np.dtype(np.float32)], f"thread {i} round {r}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    held = [y for ys in live for y in ys]
    for i in range(len(held)):
        for j in range(i + 1, len(held)):
            assert not np.shares_memory(held[i], held[j])
    for ys, ref in zip(live, refs):
        for y in ys:
            assert_close(y, ref, TOL[np.dtype(np.float32)], "softmax kept by a thread")


def test_limit_and_empty_cache(monkeypatch):
    x = rng().standard_normal(SHAPE).astype(np.float32)
    dispatch.empty_cache()
    base = _arena.kept_bytes()         # buffers other tests still hold
    monkeypatch.setattr(_arena, "KEEP_BYTES", base + x.nbytes + _arena.ALIGN)
    a = dispatch.softmax(x)            # fits under the limit: from the arena
    b = dispatch.softmax(x)            # would not fit while a is alive: plain np.empty
    assert not a.flags.owndata and b.flags.owndata
    assert_close(b, _ref_softmax(x), TOL[np.dtype(np.float32)], "softmax past the limit")
    kept = _arena.kept_bytes()
    assert dispatch.empty_cache() == 0 and _arena.kept_bytes() == kept   # a is alive
    del a
    assert dispatch.empty_cache() >= x.nbytes and _arena.kept_bytes() == base


def test_small_results_are_plain_arrays():
    x = rng().standard_normal((4, 64)).astype(np.float32)
    assert dispatch.softmax(x).flags.owndata


@pytest.mark.parametrize("value, ok", [("0", True), ("64", True), ("", True), ("lots", False), ("-1", False),
                                       ("1.5", False)])
def test_environment_variable(value, ok):
    code = ("import numpy as np, dispatch; y = dispatch.softmax(np.ones((512, 1024), np.float32)); "
            "print(y.flags.owndata)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "NK_ARENA_MB": value}, timeout=300)
    if ok:
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == ("True" if value == "0" else "False")
    else:
        assert r.returncode != 0 and "NK_ARENA_MB" in r.stderr and "MiB" in r.stderr
