"""The GPU probes' logic at tiny shapes (DRY=1), so that they work on the first try on a lent
GPU: under the simulator without one, or on the GPU itself.  Each runs as its own process,
as on the lent machine.  Run with NK_TEST_DEVICE=cuda (under NUMBA_ENABLE_CUDASIM=1 without a
GPU)."""
import json
import os
import subprocess
import sys

import pytest

from tests.support import ON_CUDA

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="CUDA target only")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(script, **env):
    # the caller's PYTHONPATH stays behind the root: on the lent GPU it carries bench/gpu_shim
    # (numpy 2.5 against numba-cuda 0.30), without which nothing compiles there
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    e = dict(os.environ, DRY="1", PYTHONPATH=path, **env)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script)], capture_output=True, text=True,
                       env=e, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def test_mma_probe_runs():
    rows = _run("gpu_probe_mma.py")
    assert rows and all(r["hmma"] == r["blocks_per_sm"] * r["sms"] * r["warps_per_block"] * r["chains"] * r["iters"]
                        for r in rows)


def test_gemm_probe_runs_a_dynamic_shared_memory_build():
    """One build above 48 KB (launch_dynamic's opt-in path), a partial K tile, checked by the
    probe itself (exit status 1 when a result is wrong)."""
    from kernels_common.cuda_tiles import TC_ASYNC_RUN, TC_ASYNC_TILES

    build = next(b for b in TC_ASYNC_RUN if TC_ASYNC_TILES[b].dynamic)
    rows = _run("gpu_probe_gemm.py", VARIANTS=build, SHAPES="40,24,72,kn")
    assert [r["kernel"] for r in rows if r["kernel"] != "torch"] == [build] and rows[-1]["rel_err"] <= 2e-3


def test_stream_probe_runs():
    rows = _run("gpu_probe_stream.py")
    assert rows and rows[0]["op"] == "copy"
