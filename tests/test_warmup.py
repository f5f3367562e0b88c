"""python -m dispatch.warmup fills numba's cache so that a later process compiles nothing,
and the cache works for an install into a read-only site-packages (numba falls back to
its per-user cache directory there)."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support import ON_CUDA

pytestmark = pytest.mark.skipif(ON_CUDA, reason="CPU kernels' on-disk cache")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("dispatch", "kernels_common", "kernels_cpu", "kernels_cuda")

# A child's preamble: records numba's compilations (cache misses) in n.
_LISTEN = r"""
import json, numpy as np
from numba.core import event
n = []
class L(event.Listener):
    def on_start(self, ev): n.append(ev.data["dispatcher"].py_func.__qualname__)
    def on_end(self, ev): pass
event.register("numba:compile", L())
import dispatch
"""
# Counts numba compilations during one softmax and one layer_norm call.
_COUNT_COMPILES = _LISTEN + r"""
x = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32)
with dispatch.use(softmax="cpu-serial", layer_norm="cpu-serial"):
    dispatch.softmax(x); dispatch.layer_norm(x, np.ones(37, np.float32))
print(json.dumps(n))
"""


def _env(**over):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env.update(over)
    return env


def _run(args, env, cwd=ROOT):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _compiles(env, cwd=ROOT):
    p = _run([sys.executable, "-c", _COUNT_COMPILES], env, cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_warmup_fills_the_cache_a_later_process_compiles_nothing(tmp_path):
    env = _env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    assert _compiles(env), "an empty cache must compile (else this test proves nothing)"
    shutil.rmtree(tmp_path / "cache")
    p = _run([sys.executable, "-m", "dispatch.warmup", "softmax", "layer_norm", "--dtypes", "float32"], env)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "warmed 4 of 4 kernels" in p.stdout, p.stdout
    assert "softmax cpu-serial float32" in p.stdout
    assert _compiles(env) == []


_BF16_CALLS = _LISTEN + r"""
import ml_dtypes
g = np.random.default_rng(0)
w = g.standard_normal((300, 64)).astype(ml_dtypes.bfloat16)
b = g.standard_normal(300).astype(ml_dtypes.bfloat16)
for m in (128, 3):   # cpu-bf16-amx / cpu-bf16-dot where the host has AMX / AVX-512 BF16; x widened for few rows
    dispatch.linear(g.standard_normal((m, 64)).astype(ml_dtypes.bfloat16), w, b, activation="silu")
print(json.dumps(n))
"""


def test_warmup_bfloat16_linear(tmp_path):
    """--dtypes bfloat16 compiles the bfloat16 kernels of the ops that have them (linear's,
    matmul's, conv2d's, the norms' (batch_norm and group_norm too), the activations',
    softmax's, rope's and attention's; --dtypes float16 the same ops'); a later process's
    bfloat16 linear calls then compile nothing."""
    from dispatch import warmup

    planned = warmup.plan(None, ["bfloat16"])
    assert {op for op, _, _ in planned} == {"linear", "layer_norm", "rms_norm", "relu", "silu", "gelu", "swiglu",
                                           "geglu", "softmax", "log_softmax", "rope", "attention", "batch_norm",
                                           "group_norm", "conv2d", "matmul"}, planned
    names = {impl for op, impl, dt in planned if op == "linear"}
    assert names == {"cpu-bf16-amx", "cpu-bf16-dot", "cpu-wo-gemv", "cpu-wo-gemm"}, names
    assert {impl for op, impl, _ in planned if op not in ("linear", "matmul", "attention", "conv2d")} == {
        "cpu-serial", "cpu-parallel"}
    assert "cpu-bf16-dot" not in {impl for _, impl, _ in warmup.plan(["linear"], ["float32"])}
    half = warmup.plan(None, ["float16"])   # the same ops' float16 paths (linear: x widened, no vdpbf16ps)
    assert {op for op, _, _ in half} == {op for op, _, _ in planned}, half
    assert {impl for op, impl, _ in half if op == "linear"} == {"cpu-wo-gemv", "cpu-wo-gemm"}
    env = _env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    p = _run([sys.executable, "-c", _BF16_CALLS], env)
    assert p.returncode == 0 and json.loads(p.stdout.strip().splitlines()[-1]), \
        "an empty cache must compile (else this test proves nothing)"
    shutil.rmtree(tmp_path / "cache")
    p = _run([sys.executable, "-m", "dispatch.warmup", "linear", "--dtypes", "bfloat16"], env)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    # (2 to 4: cpu-bf16-dot / cpu-bf16-amx where the host has AVX-512 BF16 / AMX-BF16; the others
    # listed as not for this host, and not counted)
    assert re.search(r"warmed (\d) of \1 kernels", p.stdout), p.stdout
    elsewhere = [impl for op, impl, _ in planned if op == "linear" and warmup.not_for_this_host(op, impl)]
    for impl in elsewhere:
        assert f"linear {impl} bfloat16: not for this host: " in p.stdout, p.stdout
    assert (f"({len(elsewhere)} more not for this host)" in p.stdout) == bool(elsewhere), p.stdout
    p = _run([sys.executable, "-c", _BF16_CALLS], env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_warmup_rejects_unknown_ops():
    p = _run([sys.executable, "-m", "dispatch.warmup", "no_such_op"], _env())
    assert p.returncode != 0 and "unknown op" in p.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="permissions / chattr")
def test_read_only_install_caches_in_the_user_cache_dir(tmp_path):
    """The packages copied into a read-only directory (as a non-editable install into a
    system site-packages) and used by a user who cannot write there: kernels compile into
    the user's cache directory and the next process loads them."""
    site = tmp_path / "site"
    for pkg in PACKAGES:
        shutil.copytree(os.path.join(ROOT, pkg), site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    home = tmp_path / "home"
    home.mkdir()
    dirs = [d for d, _, _ in os.walk(site)]
    for d, _, files in os.walk(site):
        for f in files:
            os.chmod(os.path.join(d, f), 0o444)
    for d in dirs:
        os.chmod(d, 0o555)
    # root writes through permission bits (CI runs as root): make the directories
    # immutable instead, which binds root too
    immutable = os.geteuid() == 0
    if immutable:
        p = subprocess.run(["chattr", "+i", *dirs], capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"running as root and chattr +i is not available here: {p.stderr.strip()}")
    try:
        env = _env(PYTHONPATH=str(site), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
        first = _compiles(env, cwd=str(tmp_path))
        assert first, "first process must compile"
        assert not any("__pycache__" in d for d, _, _ in os.walk(site)), "wrote into the read-only install"
        cached = [f for d, _, fs in os.walk(home / ".cache" / "numba") for f in fs if f.endswith(".nbi")]
        assert cached, f"no numba index files under {home / '.cache' / 'numba'}"
        assert _compiles(env, cwd=str(tmp_path)) == []
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", *dirs], capture_output=True)
        for d in dirs:
            os.chmod(d, 0o755)


_BERT_ATTENTION = r"""
import json, numpy as np
from numba.core import event
n = []
class L(event.Listener):
    def on_start(self, ev): n.append(ev.data["dispatcher"].py_func.__qualname__)
    def on_end(self, ev): pass
import dispatch
B, S, H, D = 2, 9, 2, 8
qkv = np.random.default_rng(0).standard_normal((B, S, 3, H, D)).astype(np.float32)
q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
mask = np.ones((B, 1, 1, S), bool)
mask[1, ..., 5:] = False
buf = np.empty((B, S, H, D), np.float32)
event.register("numba:compile", L())
with dispatch.use(attention="cpu-serial"):
    dispatch.attention(q, k, v, mask=mask, out=buf.transpose(0, 2, 1, 3))
print(json.dumps(n))
"""


def test_warmup_covers_the_bert_attention_layout(tmp_path):
    """Op.variants: warmup also compiles attention for fused-QKV views, a bool padding mask
    and a transposed out= (other types than the contiguous example: kernels of their own),
    so a BERT layer's first attention call compiles nothing."""
    env = _env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    warm = "import numpy as np; from dispatch.warmup import compile_one; compile_one('attention', 'cpu-serial', np.float32)"
    p = _run([sys.executable, "-c", warm], env)
    assert p.returncode == 0, p.stderr[-3000:]
    p = _run([sys.executable, "-c", _BERT_ATTENTION], env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


_WO_CALLS = _LISTEN + r"""
import ml_dtypes
from dispatch.ops.weight_only import low_precision_weight
g = np.random.default_rng(0)
w = g.standard_normal((300, 64)).astype(np.float32)
for fmt in ("float16", "bfloat16", "int8"):
    for impl in ("cpu-wo-gemv", "cpu-wo-gemm"):
        with dispatch.use(linear=impl):
            dispatch.linear(g.standard_normal((7, 64)).astype(np.float32), low_precision_weight(w, fmt))
print(json.dumps(n))
"""


def test_warmup_compiles_the_weight_only_kernels_for_float32_x(tmp_path):
    """linear's weight-only kernels take only low-precision weights, which the float32
    example has not: warmup compiles them through linear's weight-format variants
    (Op.variants), so `python -m dispatch.warmup linear` warms them (it reported them as
    'no example input' and exited 1 before) and a later process's calls compile nothing."""
    env = _env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    warm = ("import numpy as np; from dispatch.warmup import compile_one; "
            "print(compile_one('linear', 'cpu-wo-gemv', np.float32), compile_one('linear', 'cpu-wo-gemm', np.float32))")
    p = _run([sys.executable, "-c", warm], env)
    assert p.returncode == 0, p.stderr[-3000:]
    p = _run([sys.executable, "-c", _WO_CALLS], env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_every_implementation_the_host_runs_has_an_example():
    """Every CPU implementation that this host can run takes the op's example or one of its
    variants (Op.variants) at some size, in every dtype it lists: `python -m dispatch.warmup`
    warms it rather than reporting 'no example input' (as it did for linear's weight-only
    kernels with float32 x and for cpu-winograd, whose examples were depthwise)."""
    pytest.importorskip("ml_dtypes")
    from dispatch import warmup

    missing = []
    for op, impl, dt in warmup.plan(None, ["float32", "float64", "bfloat16", "float16"]):
        if warmup.not_for_this_host(op, impl) is None:
            try:
                warmup.forms_taken(op, impl, dt)
            except LookupError as exc:
                missing.append(f"{dt}: {exc}")
    assert missing == [], missing
