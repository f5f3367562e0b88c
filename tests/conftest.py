"""pytest setup shared by all tests.

With NK_TEST_DEVICE=cuda under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set in the
environment before numba is imported), the simulator gets the test-only warp-primitive
emulation (tests/cuda/simwarp.py) so kernels using warp shuffles run unchanged.  Without
numba-cuda, or on the CPU target, nothing happens here.
"""
import os

import pytest

TARGET = os.environ.get("NK_TEST_DEVICE", "cpu")

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
    """tests/cuda/ holds CUDA-only tests: skipped on the CPU target."""
    if TARGET == "cuda":
        return
    skip = pytest.mark.skip(reason="CUDA-only test (run with NK_TEST_DEVICE=cuda)")
    for item in items:
        if "/tests/cuda/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)
