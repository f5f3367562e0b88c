"""python -m bench.gpu, the GPU harness: its logic under the simulator (tiny inputs), so that
its first run on a lent GPU is not its first run.  On a real GPU this runs it on the
report's shapes for two ops (the full run is python -m bench.gpu)."""
import json

import pytest

from dispatch import devices
from tests.support import ON_CUDA

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="CUDA target only")


def test_gpu_harness_checks_and_times_every_row(tmp_path):
    """Every (op, dtype) row checked against the reference and timed, the JSON written,
    exit 0."""
    from bench import gpu

    path = tmp_path / "gpu.json"
    ops, dtypes = ("relu", "softmax", "linear"), ("float32", "float16")
    assert gpu.main(["--ops", *ops, "--dtypes", *dtypes, "--json", str(path)]) == 0
    got = json.loads(path.read_text())
    assert got["simulated"] == devices.simulator_enabled()
    rows = got["rows"]
    assert {(r["op"], r["dtype"]) for r in rows} == {(op, dt) for op in ops for dt in dtypes}
    for r in rows:
        assert r["ok"] and r["impl"].startswith("cuda-") and r["seconds"] > 0, r
