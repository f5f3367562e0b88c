"""The contract under threads (issue #7): every op, with every CPU implementation forced and
with the default dispatch, gives from four concurrent Python threads bit for bit what it
gives from one; and `dispatch.use` overrides belong to the thread (or asyncio task) that
set them.

The ops come from the registry, the inputs from tests/small_inputs.py (shapes by input
pattern, arrays drawn by each op's own `Op.inputs`).  The parallel kernels (numba prange
regions) release the GIL while they run, so threads really do run them at once: a buffer
shared between calls (the GEMM's packing workspace once was) corrupts results here.  (The
serial kernels hold the GIL: threads take turns, which these tests check all the same.)
Catching a shared buffer this way is a matter of timing, so the GEMM's workspace is also
checked directly (`test_gemm_workspace_is_per_thread`).
"""
from __future__ import annotations

import asyncio
import contextlib
import threading

import numpy as np
import pytest

import dispatch
from dispatch import registry, select, tuning
from tests import small_inputs as S
from tests.small_inputs import DEFAULT
from tests.support import ON_CUDA

# Every test here runs CPU implementations and the CPU dispatch: under NK_TEST_DEVICE=cuda
# they would repeat the cpu job's run (83 s of the simulator job).  CUDA ops from several
# threads are not covered yet: the simulator cannot run launches concurrently (it swaps each
# kernel's module globals for the launch), so such a test needs a real GPU.
pytestmark = pytest.mark.skipif(ON_CUDA, reason="CPU implementations from threads (the cpu job runs them)")

N_THREADS = 4
REPS = 20
TIMEOUT = 300  # seconds for one test's threads (first numba compiles included)

OPS = list(registry.OPS.values())


@pytest.fixture(autouse=True)
def _no_tuning_cache(tmp_path, monkeypatch):
    """Decisions come from the shape rules: no tuning file of this machine's user interferes."""
    monkeypatch.setenv("NK_TUNING_CACHE", str(tmp_path / "no-tuning.json"))
    tuning.reload()
    select.clear_cache()
    yield
    tuning.reload()
    select.clear_cache()


def _forcing(op_name, impl):
    return dispatch.use(**{op_name: impl}) if impl != DEFAULT else contextlib.nullcontext()


def _cases():
    out = []
    for op in OPS:
        for impl in S.cpu_impls(op):
            out.append(pytest.param(op.name, impl, id=f"{op.name}-{impl}"))
        out.append(pytest.param(op.name, DEFAULT, id=f"{op.name}-default"))
    return out


def _run_threads(n, target, timeout=TIMEOUT):
    """Run target(i) in n threads started together; re-raise the first exception."""
    barrier = threading.Barrier(n, timeout=timeout)
    errors = [None] * n

    def body(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported in the main thread
            errors[i] = exc
            barrier.abort()

    threads = [threading.Thread(target=body, args=(i,), daemon=True, name=f"nk-test-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "threads did not finish (deadlock or hang)"
    for exc in errors:
        if exc is not None and not isinstance(exc, threading.BrokenBarrierError):
            raise exc
    for exc in errors:
        if exc is not None:
            raise exc


def _size_of_thread(size, i):
    if size == "mixed":  # serial-sized and parallel-sized calls at the same time
        return S.SIZES[i % len(S.SIZES)]
    return size


@pytest.mark.parametrize("size", [*S.SIZES, "mixed"])
@pytest.mark.parametrize("op_name, impl", _cases())
def test_threads_give_single_thread_results(op_name, impl, size):
    """4 threads call the op REPS times each on their own inputs (with and without out=),
    each result bitwise equal to the single-threaded result of the same inputs."""
    op = registry.OPS[op_name]
    inputs = [S.inputs(op, _size_of_thread(size, i), seed=1000 + i) for i in range(N_THREADS)]
    pristine = [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inp.items()} for inp in inputs]
    with _forcing(op_name, impl):
        expected = [S.call(op, inp) for inp in inputs]
    chosen_main = [dispatch.explain(op_name, *S.call_args(op, inp)[0], **S.call_args(op, inp)[1]).chosen
                   for inp in inputs]
    with_out = S.has_out(op)
    bad = []

    def worker(i):
        args, kwargs = S.call_args(op, inputs[i])
        exp = expected[i]
        with _forcing(op_name, impl):
            chosen = dispatch.explain(op_name, *args, **kwargs).chosen
            want = impl if impl != DEFAULT else chosen_main[i]
            if chosen != want:
                bad.append(f"thread {i}: explain chose {chosen}, expected {want}")
            out = np.empty_like(exp) if with_out and isinstance(exp, np.ndarray) else None
            for r in range(REPS):
                if op.updates:  # fresh copies of the states the op updates in place
                    args, kwargs = S.call_args(op, inputs[i])
                if out is not None and r % 2:
                    out[...] = np.nan
                    got = op.public(*args, **kwargs, out=out)
                    if got is not out:
                        bad.append(f"thread {i} rep {r}: out= given but another array returned")
                else:
                    got = op.public(*args, **kwargs)
                if not S.same(got, exp):
                    bad.append(f"thread {i} rep {r}: result differs from the single-threaded one")

    _run_threads(N_THREADS, worker)
    assert not bad, f"{op_name} ({impl or 'default dispatch'}, {size}):\n  " + "\n  ".join(bad[:10])
    for inp, orig in zip(inputs, pristine):
        for name, v in orig.items():
            if isinstance(v, np.ndarray):
                assert S.same(inp[name], v), f"input {name} was modified"


@pytest.mark.parametrize("impl", ["cpu-gemm", "cpu-gemv", "blas"])
@pytest.mark.parametrize("op_name", ["matmul", "linear"])
def test_gemm_threads_of_different_shapes(op_name, impl):
    """Threads packing panels of different sizes at once (a shared workspace would be
    resized / overwritten under another thread's kernel)."""
    op = registry.OPS[op_name]
    rng = np.random.default_rng(7)
    dims = [(64, 256, 256), (37, 300, 129), (6, 512, 64), (130, 96, 200)]
    inputs = []
    for m, k, n in dims:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if op_name == "linear" else (k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        inputs.append((a, b, bias))
    fn = op.public
    with dispatch.use(**{op_name: impl}):
        expected = [fn(a, b, bias=bias, activation="gelu") for a, b, bias in inputs]
    bad = []

    def worker(i):
        a, b, bias = inputs[i]
        with dispatch.use(**{op_name: impl}):
            for r in range(3 * REPS):
                got = fn(a, b, bias=bias, activation="gelu")
                if not S.same(got, expected[i]):
                    bad.append(f"thread {i} ({dims[i]}) rep {r} differs")

    _run_threads(N_THREADS, worker)
    assert not bad, "\n".join(bad[:10])


def test_gemm_workspace_is_per_thread():
    """The packing workspace of the CPU GEMM is never handed to two threads at once (white
    box: dispatch.ops.linalg._workspace; the race above is only caught when timing helps)."""
    from dispatch.ops import linalg

    ws = getattr(linalg, "_workspace", None)
    if ws is None:
        pytest.skip("dispatch.ops.linalg has no _workspace helper any more")
    bufs = [None] * N_THREADS

    def worker(i):
        bufs[i] = ws(64 * 256 + 256 * 256, np.dtype(np.float32))

    _run_threads(N_THREADS, worker)
    main = ws(64 * 256 + 256 * 256, np.dtype(np.float32))
    for i in range(N_THREADS):
        for j in range(i + 1, N_THREADS):
            assert not np.shares_memory(bufs[i], bufs[j]), f"threads {i} and {j} got one packing buffer"
        assert not np.shares_memory(bufs[i], main)


def test_gemm_tasks_packing_a_from_threads():
    """The GEMM path whose tasks pack their own A panels into their workers' slices
    (kernels_cpu.gemm A_TASK_OK; the small inputs above never reach it: it needs several row
    blocks): linear_backward with gelu and linear_cross_entropy_with_grad (its dweight GEMM),
    four threads with inputs of their own, bit for bit what each gives alone."""
    from kernels_cpu import gemm as K
    rng = np.random.default_rng(13)
    n = 275 * K.active_tile().mr + 3   # W's rows: several row blocks of the dweight GEMM
    calls = []
    for i in range(N_THREADS):
        g, x = rng.standard_normal((40 + i, n), dtype=np.float32), rng.standard_normal((40 + i, 24), dtype=np.float32)
        w, pre = rng.standard_normal((n, 24), dtype=np.float32), rng.standard_normal((40 + i, n), dtype=np.float32)
        calls.append(lambda g=g, x=x, w=w, pre=pre: dispatch.linear_backward(g, x, w, pre, activation="gelu",
                                                                             has_bias=True))
        xs = rng.standard_normal((300 + i, 16), dtype=np.float32)
        ws = rng.standard_normal((3000, 16), dtype=np.float32)
        calls.append(lambda xs=xs, ws=ws, t=rng.integers(0, 3000, 300 + i): dispatch.linear_cross_entropy_with_grad(xs, ws, t))
    alone = [c() for c in calls]
    got = [None] * len(calls)

    def worker(i):
        for _ in range(3):
            got[2 * i], got[2 * i + 1] = calls[2 * i](), calls[2 * i + 1]()

    _run_threads(N_THREADS, worker)
    for want, res in zip(alone, got):
        for a, b in zip(want, res):
            if a is not None:
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op_name", ["matmul_int8", "dynamic_quant_linear"])
def test_int8_threads_of_different_shapes(op_name):
    """Threads running the packed int8 paths on different shapes at once, decode rows among
    them: each packs A into its own scratch (a per-thread cache for small calls)."""
    rng = np.random.default_rng(11)
    dims = [(1, 768, 768), (3, 200, 130), (1, 64, 48), (37, 300, 129)]
    calls = []
    for m, k, n in dims:
        x = rng.standard_normal((m, k)).astype(np.float32)
        if op_name == "matmul_int8":
            a = dispatch.quantize(x, axis=0)
            b = dispatch.quantize(rng.standard_normal((k, n)).astype(np.float32), axis=1)
            calls.append(lambda a=a, b=b: dispatch.matmul_int8(a, b, activation="relu"))
        else:
            w = dispatch.quantize(rng.standard_normal((n, k)).astype(np.float32), axis=0)
            calls.append(lambda x=x, w=w: dispatch.dynamic_quant_linear(x, w, activation="relu"))
    expected = [c() for c in calls]
    bad = []

    def worker(i):
        for r in range(3 * REPS):
            if not S.same(calls[i](), expected[i]):
                bad.append(f"thread {i} ({dims[i]}) rep {r} differs")

    _run_threads(N_THREADS, worker)
    assert not bad, "\n".join(bad[:10])


def test_quantize_static_numbers_from_threads():
    """Per-tensor static scales given as numbers are remembered per value in the op's one
    memo table: four threads, each with its own scale and zero point on its own x, each get
    what they get alone (a table entry served to the wrong value would show here)."""
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal((64, 96)).astype(np.float32) for _ in range(N_THREADS)]
    params = [(0.01, 3), (0.02, None), (np.float32(0.05), np.uint8(100)), (0.1, 128)]
    registry.OPS["quantize"]._described.clear()
    expected = [dispatch.quantize(x, dtype="uint8", scale=s, zero_point=z).values for x, (s, z) in zip(xs, params)]
    bad = []

    def worker(i):
        s, z = params[i]
        for r in range(5 * REPS):
            if not np.array_equal(dispatch.quantize(xs[i], dtype="uint8", scale=s, zero_point=z).values, expected[i]):
                bad.append(f"thread {i} (scale {s}) rep {r} differs")

    _run_threads(N_THREADS, worker)
    assert not bad, "\n".join(bad[:10])


def test_int8_workspace_is_per_thread():
    """The int8 paths' packed-A scratch is never handed to two threads (white box:
    dispatch.ops.int8_linalg._a_workspace)."""
    from dispatch.ops import int8_linalg

    bufs = [None] * N_THREADS

    def worker(i):
        bufs[i] = int8_linalg._a_workspace(8, 768, np.uint8, 1)

    _run_threads(N_THREADS, worker)
    main = int8_linalg._a_workspace(8, 768, np.uint8, 1)
    for i in range(N_THREADS):
        for j in range(i + 1, N_THREADS):
            for a, b in zip(bufs[i], bufs[j]):
                assert not np.shares_memory(a, b), f"threads {i} and {j} share int8 scratch"
        for a, b in zip(bufs[i], main):
            assert not np.shares_memory(a, b)


# ---- overrides are per thread ----------------------------------------------------------------

def _probe(op, size):
    """(args, kwargs, rule's choice, another CPU implementation) for op, or None when the
    op has a single CPU implementation."""
    named = S.inputs(op, size, seed=5)
    args, kwargs = S.call_args(op, named)
    e = dispatch.explain(op.name, *args, **kwargs)
    others = [n for n in S.cpu_impls(op) if n != e.chosen]
    if not others:
        return None
    return args, kwargs, e.chosen, others[0]


@pytest.mark.parametrize("size", S.SIZES)
@pytest.mark.parametrize("op_name", [op.name for op in OPS])
def test_use_in_one_thread_does_not_change_another(op_name, size):
    """While thread A is inside use(op=<not the rule's choice>), thread B's explain (and
    call) still follow the rule."""
    op = registry.OPS[op_name]
    probe = _probe(op, size)
    if probe is None:
        pytest.skip(f"{op_name} has one CPU implementation")
    args, kwargs, rule_choice, forced = probe
    a_inside, b_done = threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with dispatch.use(**{op_name: forced}):
            e = dispatch.explain(op_name, *args, **kwargs)
            seen["a"] = (e.chosen, e.source)
            a_inside.set()
            assert b_done.wait(60), "thread B did not finish"
            e = dispatch.explain(op_name, *args, **kwargs)
            seen["a after b"] = (e.chosen, e.source)
        e = dispatch.explain(op_name, *args, **kwargs)
        seen["a after block"] = (e.chosen, e.source)

    def thread_b():
        assert a_inside.wait(60), "thread A did not enter its block"
        try:
            e = dispatch.explain(op_name, *args, **kwargs)
            seen["b"] = (e.chosen, e.source)
            op.public(*args, **kwargs)
            seen["b state"] = select.current()
        finally:
            b_done.set()

    _run_threads(2, lambda i: (thread_a, thread_b)[i]())
    assert seen["a"] == (forced, "forced")
    assert seen["a after b"] == (forced, "forced")
    assert seen["b"] == (rule_choice, "rule"), f"thread B saw thread A's override: {seen['b']}"
    assert seen["b state"].force_op == () and seen["b state"].force == ()
    assert seen["a after block"] == (rule_choice, "rule")


def test_exclude_in_one_thread_does_not_make_another_raise():
    """use(exclude=<every CPU softmax implementation>) makes thread A's call raise
    NoImplementationError; thread B's plain call, at the same time, runs."""
    op = registry.OPS["softmax"]
    x = S.inputs(op, "small", seed=3)["x"]
    expected = dispatch.softmax(x)
    a_inside, b_done = threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with dispatch.use(exclude=S.cpu_impls(op)):
            with pytest.raises(dispatch.NoImplementationError):
                dispatch.softmax(x)
            seen["a raised"] = True
            a_inside.set()
            assert b_done.wait(60)
            with pytest.raises(dispatch.NoImplementationError):
                dispatch.softmax(x)
        seen["a after"] = dispatch.softmax(x)

    def thread_b():
        assert a_inside.wait(60)
        try:
            seen["b"] = [dispatch.softmax(x) for _ in range(5)]
        finally:
            b_done.set()

    _run_threads(2, lambda i: (thread_a, thread_b)[i]())
    assert seen["a raised"]
    assert all(S.same(r, expected) for r in seen["b"])
    assert S.same(seen["a after"], expected)


def test_interleaved_enter_exit_leaves_no_override():
    """A enters, B enters, A exits, B exits (and nested blocks in between): each thread sees
    only its own override at every step, and afterwards no thread has one."""
    op = registry.OPS["softmax"]
    x = S.inputs(op, "large", seed=4)["x"]
    rule_choice = dispatch.explain("softmax", x).chosen
    other = next(n for n in S.cpu_impls(op) if n != rule_choice)
    steps = [threading.Event() for _ in range(6)]
    log = []

    def chosen():
        e = dispatch.explain("softmax", x)
        return e.chosen, e.source

    def thread_a():
        with dispatch.use(softmax=other):
            log.append(("A in", chosen()))
            steps[0].set()
            assert steps[1].wait(60)            # B is inside its block
            with dispatch.use(exclude="blas", tuned=False):  # nested, then left
                log.append(("A nested", chosen()))
            log.append(("A after nested", chosen()))
        log.append(("A out", chosen()))
        steps[2].set()                          # A has left while B is still inside
        assert steps[3].wait(60)
        log.append(("A end", chosen()))

    def thread_b():
        assert steps[0].wait(60)
        with dispatch.use(softmax=rule_choice):
            log.append(("B in", chosen()))
            steps[1].set()
            assert steps[2].wait(60)
            log.append(("B after A left", chosen()))
        log.append(("B out", chosen()))
        steps[3].set()

    _run_threads(2, lambda i: (thread_a, thread_b)[i]())
    got = dict(log)
    assert got["A in"] == (other, "forced")
    assert got["A nested"] == (other, "forced")
    assert got["A after nested"] == (other, "forced")
    assert got["B in"] == (rule_choice, "forced")
    assert got["B after A left"] == (rule_choice, "forced")
    for k in ("A out", "B out", "A end"):
        assert got[k] == (rule_choice, "rule"), (k, got[k])

    fresh = {}
    t = threading.Thread(target=lambda: fresh.update(e=chosen(), state=select.current()))
    t.start()
    t.join(60)
    assert fresh["e"] == (rule_choice, "rule")
    assert fresh["state"].force == () and fresh["state"].force_op == () and not fresh["state"].exclude
    assert chosen() == (rule_choice, "rule")
    assert select._current.get() is None


def test_thread_started_inside_a_block_does_not_inherit_it():
    """A thread started inside `with use(...)` starts from the process default (a
    threading.Thread does not copy the starter's context)."""
    op = registry.OPS["softmax"]
    x = S.inputs(op, "large", seed=4)["x"]
    rule_choice = dispatch.explain("softmax", x).chosen
    other = next(n for n in S.cpu_impls(op) if n != rule_choice)
    seen = {}
    with dispatch.use(softmax=other):
        t = threading.Thread(target=lambda: seen.update(e=dispatch.explain("softmax", x).chosen))
        t.start()
        t.join(60)
        assert dispatch.explain("softmax", x).chosen == other
    assert seen["e"] == rule_choice


def test_overrides_per_asyncio_task():
    """Two interleaved asyncio tasks on one thread each keep their own override."""
    op = registry.OPS["softmax"]
    x = S.inputs(op, "large", seed=4)["x"]
    rule_choice = dispatch.explain("softmax", x).chosen
    other = next(n for n in S.cpu_impls(op) if n != rule_choice)

    async def forced_task(ev_in, ev_go):
        with dispatch.use(softmax=other):
            ev_in.set()
            await ev_go.wait()
            return dispatch.explain("softmax", x).chosen

    async def plain_task(ev_in, ev_go):
        await ev_in.wait()
        chosen = dispatch.explain("softmax", x).chosen
        ev_go.set()
        return chosen

    async def main():
        ev_in, ev_go = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(forced_task(ev_in, ev_go), plain_task(ev_in, ev_go))

    a, b = asyncio.run(main())
    assert a == other
    assert b == rule_choice
    assert dispatch.explain("softmax", x).chosen == rule_choice


# ---- process-wide state first touched from many threads at once ------------------------------

def test_environment_parsed_once_when_threads_start_together(monkeypatch):
    """NK_USE / NK_EXCLUDE are parsed by the first call, once, even when many threads make
    their first call at the same moment; every thread sees the forced implementation."""
    op = registry.OPS["softmax"]
    x = S.inputs(op, "large", seed=4)["x"]
    rule_choice = dispatch.explain("softmax", x).chosen
    other = next(n for n in S.cpu_impls(op) if n != rule_choice)
    monkeypatch.setenv("NK_USE", f"softmax={other}")
    monkeypatch.delenv("NK_EXCLUDE", raising=False)
    monkeypatch.setattr(select, "_env_state", None)
    monkeypatch.setattr(select, "_env_error", None)
    calls = []
    real_parse = select.parse_spec

    def slow_parse(*args, **kwargs):
        calls.append(args[0])
        threading.Event().wait(0.02)  # widen the window in which a second parse could start
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(select, "parse_spec", slow_parse)
    seen = [None] * 8

    def worker(i):
        e = dispatch.explain("softmax", x)
        seen[i] = (e.chosen, e.source)

    _run_threads(8, worker)
    assert sorted(calls) == ["NK_EXCLUDE", "NK_USE"], f"parsed {calls}"
    assert seen == [(other, "forced")] * 8


def test_tuning_cache_read_once_when_threads_start_together(tmp_path, monkeypatch):
    """The tuning file is read once for all threads, and every thread gets its entry."""
    import json

    import numba

    op = registry.OPS["softmax"]
    x = S.inputs(op, "large", seed=4)["x"]
    rule_choice = dispatch.explain("softmax", x).chosen
    other = next(n for n in S.cpu_impls(op) if n != rule_choice)
    key = op.describe(x).key
    impl = op.implementations[other]
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"format": tuning.FORMAT, "entries": {tuning.entry_key("softmax", key): {
        "impl": other, "params": {}, "time_s": 1e-5, "kernel_version": impl.version,
        "numba_version": numba.__version__}}}))
    monkeypatch.setenv("NK_TUNING_CACHE", str(path))
    tuning.reload()
    select.clear_cache()
    loads = []
    real_load = tuning._load

    def slow_load():
        loads.append(1)
        threading.Event().wait(0.02)
        return real_load()

    monkeypatch.setattr(tuning, "_load", slow_load)
    seen = [None] * 8

    def worker(i):
        e = dispatch.explain("softmax", x)
        seen[i] = (e.chosen, e.source)
        dispatch.softmax(x)

    _run_threads(8, worker)
    assert len(loads) == 1, f"the tuning file was read {len(loads)} times"
    assert seen == [(other, "tuned")] * 8


def test_same_override_shares_its_decisions_and_clear_cache_empties_them():
    """Blocks that set the same override share one state and its decision cache (a fresh
    state per block re-decided every call); a thread using the same override reuses the
    decisions, and clear_cache() (after the tuning cache changes) empties every shared one."""
    op = registry.OPS["softmax"]
    x = S.inputs(op, "large", seed=5)["x"]
    other = next(n for n in S.cpu_impls(op) if n != dispatch.explain("softmax", x).chosen)
    states = []

    def run():
        with dispatch.use(softmax=other):
            assert dispatch.explain("softmax", x).chosen == other
            dispatch.softmax(x)
            states.append(select.current())

    run()
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert len(states) == 2 and states[0] is states[1]
    assert states[0].cache, "the block's decision was not kept"
    select.clear_cache()
    assert not states[0].cache
    assert select.current() is not states[0]  # outside the blocks: no override left
    with pytest.raises(ValueError, match="no implementation"):  # a bad name still raises, each time
        with dispatch.use(softmax="no-such-impl"):
            pass
    with pytest.raises(ValueError, match="no implementation"):
        with dispatch.use(softmax="no-such-impl"):
            pass
