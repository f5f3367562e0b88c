"""pytest setup shared by all tests.

Seeds: every test runs with its own seed (tests/support.py: a fresh random one, or
NK_TEST_SEED=<n> to replay); a failing test's report gets a "seed" section with the seed
and the command that replays it, and the seed is recorded in item.user_properties
(``nk_test_seed``, in --junitxml output).  Parametrized tests over implementations must
keep impl_params' skip marks: a test that would run with impl=None is a collection error.

With NK_TEST_DEVICE=cuda under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set in the
environment before numba is imported), the simulator gets the test-only warp-primitive
emulation (tests/cuda/simwarp.py) so kernels using warp shuffles run unchanged.  Without
numba-cuda, or on the CPU target, nothing happens here.  On a real GPU the CUDA result
pool fills every buffer it hands out with NaN (dispatch/cuda_impls/_pool.py, POISON).
"""
import hashlib
import os
import pathlib

import pytest

TARGET = os.environ.get("NK_TEST_DEVICE", "cpu")


def _drop_stale_kernel_cache():
    """numba's cache=True checks only the timestamp of the kernel's own file, but the kernels
    inline helpers from other modules (approx.py, parallel.py) and constants from
    kernels_common: after an edit there the
    cache would hand back old machine code.  Drop the cached kernels whenever any
    kernels_cpu source differs from the one the cache was built from."""
    top = pathlib.Path(__file__).resolve().parent.parent
    root = top / "kernels_cpu"
    sources = sorted(root.glob("*.py")) + sorted((top / "kernels_common").glob("*.py"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    stamp = root / "__pycache__" / "kernel-sources.sha256"
    if stamp.exists() and stamp.read_text() == digest:
        return
    for p in root.glob("__pycache__/*.nb[ic]"):
        p.unlink()
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(digest)


if not os.environ.get("PYTEST_XDIST_WORKER"):  # once, in the controller, before workers compile
    _drop_stale_kernel_cache()

if TARGET == "cuda":
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        from tests.cuda import simwarp

        simwarp.install()

from tests import support  # noqa: E402  (imports dispatch: after the cache check and the simulator set-up)

if support.ON_CUDA and not support.SIMULATOR:
    # on a real GPU every result and scratch buffer the CUDA result pool hands out is filled
    # with NaN first (0xFF bytes), so an element a kernel leaves unwritten fails its test
    from dispatch.cuda_impls import _pool

    _pool.POISON = True


def pytest_report_header(config):
    if TARGET != "cuda":
        return f"NK_TEST_DEVICE={TARGET}"
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    return f"NK_TEST_DEVICE=cuda ({'CUDA simulator with emulated warp primitives' if sim else 'real GPU'})"


@pytest.fixture(autouse=True)
def _test_seed(request):
    """Seed the test's random inputs (tests.support.rng) and record the seed."""
    state = support.begin_test(request.node.nodeid)
    request.node.user_properties.append(("nk_test_seed", state.seed))
    request.node.nk_test_seed = state
    yield state
    support.end_test()


@pytest.fixture(params=list(support.HALF_FORMATS))
def half(request):
    """Each 16-bit format the CPU ops take (bfloat16, float16: support.HALF_FORMATS), as its
    numpy dtype: a test that takes `half` runs once per format."""
    return support.half_dtype(request.param)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    state = getattr(item, "nk_test_seed", None)
    if report.failed and state is not None:
        if state.draws:
            text = (f"{support.SEED_ENV}={state.seed} ({state.draws} generator(s) drawn from it)\n"
                    f"replay: {support.replay_command(item.nodeid, state.seed)}")
        else:
            text = (f"{support.SEED_ENV}={state.seed}, but this test drew no generator from it "
                    "(a hypothesis test shows the seeds it drew in its falsifying example)")
        report.sections.append(("seed", text))


def _check_impl_params_keep_marks(items):
    """A test parametrized with impl=None runs without an implementation: impl_params gives
    None only in a skip-marked param, so the mark was dropped (p.values[0] without p.marks)."""
    bad = [item.nodeid for item in items
           if "impl" in getattr(getattr(item, "callspec", None), "params", {})
           and item.callspec.params["impl"] is None
           and not any(m.name in ("skip", "skipif") for m in item.iter_markers())]
    if bad:
        raise pytest.UsageError("parametrized with impl=None but not skipped (impl_params' skip mark dropped): "
                                + ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))


# Seconds of test time per file in CI's two pytest steps (fresh clone, 2 xdist workers,
# --durations=0 summed per file; 2026-11-25, Sapphire Rapids host, before the simulator's
# block manager was made event-driven): the files over 15 s.  CI runs xdist with
# --dist loadfile --no-loadscope-reorder, which hands out whole files in collection order;
# the longest go first (longest-processing-time-first), so no long file starts last while
# the other worker idles.  xdist's own reorder (most tests first) started the 148 s
# portability file (2 tests) last: the CPU step took 467 s for 740 s of test time.  (CI now
# runs test_portability.py as a step of its own, first: its entry orders `pytest tests`.)
FILE_SECONDS = {
    "cpu": {"test_portability.py": 148, "test_attention.py": 104, "test_contract.py": 83,
            "test_bench.py": 69, "test_threads.py": 69, "test_linalg_grad.py": 33,
            "test_autograd.py": 30, "test_attention_grad.py": 27, "test_quant.py": 26,
            "test_linalg.py": 20, "test_weight_only.py": 20, "test_warmup.py": 16,
            "test_cache_safety.py": 15},
    # re-measured 2026-11-28 (Zen 4-class EPYC, one process, --durations=0 summed per file:
    # 307 s of test time, with tests/cuda/simwarp.py's greenlet blocks; 2026-11-27's weights,
    # with a thread per simulated thread, summed to about 700 s on a Zen 5)
    "cuda": {"test_tensor_core_paths.py": 41, "test_probes.py": 32, "test_softmax.py": 28,
             "test_cuda_backend.py": 24, "test_arena.py": 22, "test_wgmma.py": 18, "test_norm.py": 15,
             "test_contract.py": 13, "test_linalg.py": 13, "test_softmax_grad.py": 12, "test_attention.py": 12},
}


def _longest_files_first(items):
    weight = FILE_SECONDS.get(TARGET, {})
    items.sort(key=lambda item: -weight.get(pathlib.Path(str(item.fspath)).name, 0))  # stable


def pytest_collection_modifyitems(config, items):
    """Longest test files first (FILE_SECONDS).  tests/cuda/ holds CUDA-only tests: skipped on the CPU target.  Under the simulator,
    float64 runs the first case of each test function per implementation, every float32
    and float16 case runs: each simulated thread is Python code, the kernels are
    dtype-generic code (the dtype picks the accumulation type, which the first float64 case
    exercises), and bench.ptx compiles every float64 kernel for the real chips.  The
    block-per-row kernels too (until 2026-11-28 they ran no float64 case there; with the
    greenlet blocks of tests/cuda/simwarp.py their first case costs seconds).  On a real GPU
    everything runs.  (Measured 2026-11-23: float64 was about 40% of the simulator step's
    530 s.)"""
    _check_impl_params_keep_marks(items)
    _longest_files_first(items)
    if TARGET == "cuda":
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
            f64_skip = pytest.mark.skip(reason="simulator: float64 runs the first case of this test and impl")
            first_f64 = set()
            for item in items:
                if "float64" not in item.name:
                    continue
                params = getattr(getattr(item, "callspec", None), "params", {})
                key = (str(item.fspath), item.originalname, str(params.get("impl")))
                if key in first_f64:
                    item.add_marker(f64_skip)
                first_f64.add(key)
        return
    skip = pytest.mark.skip(reason="CUDA-only test (run with NK_TEST_DEVICE=cuda)")
    for item in items:
        if "/tests/cuda/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)
