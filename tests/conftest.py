"""pytest setup shared by all tests.

With NK_TEST_DEVICE=cuda under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set in the
environment before numba is imported), the simulator gets the test-only warp-primitive
emulation (tests/cuda/simwarp.py) so kernels using warp shuffles run unchanged.  Without
numba-cuda, or on the CPU target, nothing happens here.
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


def pytest_report_header(config):
    if TARGET != "cuda":
        return f"NK_TEST_DEVICE={TARGET}"
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    return f"NK_TEST_DEVICE=cuda ({'CUDA simulator with emulated warp primitives' if sim else 'real GPU'})"


def pytest_collection_modifyitems(config, items):
    """tests/cuda/ holds CUDA-only tests: skipped on the CPU target.  Under the simulator,
    the block-per-row kernels run their float32 cases only: each simulated barrier costs
    milliseconds, the kernels are dtype-generic code, and float64 is covered by the
    warp-per-row kernels (on a real GPU everything runs)."""
    if TARGET == "cuda":
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
            sim_skip = pytest.mark.skip(reason="simulator: block-per-row float64 covered by its float32 cases")
            for item in items:
                if "cuda-block-row" in item.name and "float64" in item.name:
                    item.add_marker(sim_skip)
        return
    skip = pytest.mark.skip(reason="CUDA-only test (run with NK_TEST_DEVICE=cuda)")
    for item in items:
        if "/tests/cuda/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)
