"""The CPU threading runtime (kernels_cpu/runtime.py): which layer runs when the user sets
nothing, that the user's choice wins, and that no layer crashes or corrupts results when
several Python threads call parallel kernels at once (numba's workqueue layer aborts the
process there unless our guard serializes the calls)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support import ON_CUDA

pytestmark = pytest.mark.skipif(ON_CUDA, reason="CPU threading runtime")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Four threads call the parallel softmax, layer_norm and matmul at once, each on its own
# inputs, and compare with the same calls made alone; prints the layer on success.
_CONCURRENT = r"""
import threading, numpy as np, dispatch
from kernels_cpu import runtime
rng = np.random.default_rng(0)
xs = [rng.standard_normal((512, 1024)).astype(np.float32) for _ in range(4)]
w = rng.standard_normal((1024, 256)).astype(np.float32)
g = np.ones(1024, np.float32)
def calls(x):
    with dispatch.use(softmax="cpu-parallel", layer_norm="cpu-parallel", matmul="cpu-gemm"):
        return dispatch.softmax(x), dispatch.layer_norm(x, g), dispatch.matmul(x, w)
alone = [calls(x) for x in xs]
bad = []
def work(i):
    for _ in range(10):
        for got, want in zip(calls(xs[i]), alone[i]):
            if not np.array_equal(got, want):
                bad.append(i)
ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
assert not bad, f"threads {sorted(set(bad))} got results that differ from the same call alone"
print(runtime.layer())
"""


def _run(code, **env_over):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_THREADING_LAYER")}
    env.update(env_over)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def _tbb_installed():
    from kernels_cpu import runtime
    return runtime._tbb_library_path() is not None


@pytest.mark.parametrize("layer", [None, "tbb", "omp", "workqueue"])
def test_concurrent_calls_from_threads_are_correct_on_every_layer(layer):
    if layer == "tbb" and not _tbb_installed():
        pytest.skip("pip tbb not installed")
    env = {} if layer is None else {"NUMBA_THREADING_LAYER": layer}
    p = _run(_CONCURRENT, **env)
    assert p.returncode == 0, f"exit {p.returncode} with NUMBA_THREADING_LAYER={layer}:\n{p.stderr[-3000:]}"
    got = p.stdout.strip().splitlines()[-1]
    if layer is not None:
        assert got == layer, f"NUMBA_THREADING_LAYER={layer} asked, {got} ran: the user's setting must win"
    elif _tbb_installed():
        assert got == "tbb", f"with nothing set and pip tbb installed the default must be tbb, got {got}"


def test_explain_names_the_threading_layer():
    import dispatch
    from kernels_cpu import runtime, team
    x = np.ones((4, 8), np.float32)
    text = str(dispatch.explain("softmax", x))
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("threading:"))
    assert f"numba's {runtime.layer()} layer" in line and team.describe() in line, line


def test_explain_and_report_say_which_vector_width_runs():
    """explain and the report's machine header name the micro-kernels' vector width and
    whether the target has AVX-512 (the CPU numba compiles for: kernels_cpu/target.py, the
    host unless NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say otherwise)."""
    import dispatch
    from bench import report
    from kernels_cpu import gemm, target
    text = str(dispatch.explain("softmax", np.ones((4, 8), np.float32)))
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("vectors:"))
    tile = gemm.active_tile()
    assert f"{tile.lanes32 * 32}-bit GEMM: {tile.name} tile" in line and f"host {target.cpu_name()}:" in line, line
    has512 = "avx512f" in target.features()
    assert ("no AVX-512" not in line) == has512, line
    assert report.machine_info()["vectors"] in line


def _fresh(fn):
    """An uncached copy of the kernel function fn with a CPython wrapper (numba shows no
    machine code for cached kernels, and fn may be an inner part with no wrapper)."""
    from numba import njit
    opts = {k: v for k, v in fn.targetoptions.items() if k not in ("cache", "nopython")}
    opts["no_cpython_wrapper"] = False
    return njit(**opts)(fn.py_func)


def test_loops_measured_faster_at_16_lanes_run_16_lanes():
    """On an AVX-512 target the kernels whose loops measured faster at 16 float32 lanes
    call approx.wide_loops themselves (the attribute is per compiled function: a caller's
    does not reach a part compiled alone), and their machine code holds zmm vector code:
    group / batch norm's affine and centered passes, cross_entropy's rows, softmax's row
    max, rope's rows."""
    import platform
    import re

    from kernels_cpu import approx, channel_norm, rope, softmax
    if platform.machine().lower() not in ("x86_64", "amd64") or not approx._target_has_avx512():
        pytest.skip("16-lane loops are chosen on AVX-512 targets only")
    f32 = np.float32
    x = np.linspace(-3, 3, 4 * 256, dtype=f32).reshape(4, 256)
    out = np.empty_like(x)
    cos, sin = np.cos(x[:, :128]), np.sin(x[:, :128])
    cases = [(channel_norm.affine_act, (x[0], out[0], f32(1.5), f32(0.5), approx.ACT_SILU, 0, 256)),
             (channel_norm.centered_act, (x[0], out[0], f32(0.1), f32(1.5), f32(0.5), approx.ACT_SILU, 0, 256)),
             (softmax.cross_entropy_rows, (x, np.array([1, 2, 3, 4]), -100, np.empty(4, f32), 0, 4)),
             (softmax._row_max32, (x[1],)),
             (rope.rope_rows, (x, cos, sin, out, 0, 4, False))]
    for fn, args in cases:
        fresh = _fresh(fn)
        fresh(*args)
        asm = fresh.inspect_asm(fresh.signatures[0])
        assert re.search(r"\n\s+v\w+\s+[^\n]*%zmm", asm), f"{fn.__name__}: no zmm vector code"
