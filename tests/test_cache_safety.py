"""kernels_cpu/cache_safety.py: processes that compile one cached function with different
signatures at the same moment leave a cache in which every signature loads its own code.

Stock numba 0.68 (measured 2026-11-28, ten processes, ten dtypes, started together): 2 of 6
trials left an entry that loaded another dtype's code ("can't unbox array"), 3 of 6 lost
entries; the chance that both trials here pass without the fix is about 1 in 10."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.support import ON_CUDA

pytestmark = pytest.mark.skipif(ON_CUDA, reason="numba's CPU cache")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = ("int8", "int16", "int32", "int64", "uint16", "uint32", "float32", "float64")

MODULE = """
from numba import njit

@njit(cache=True)
def f(a):
    s = a[0] * 0
    for i in range(a.shape[0]):
        s += a[i] * (i + 1)
    return s
"""

COMPILE = """
import sys, time
import numpy as np
import kernels_cpu  # installs the cache's safe save
import mod
start = float(sys.argv[2])
while time.time() < start:
    pass
mod.f(np.arange(10).astype(sys.argv[1]))
"""

CHECK = """
import sys
import numpy as np
import kernels_cpu
import mod
for dt in sys.argv[1:]:
    r = mod.f(np.arange(10).astype(dt))
    assert r == 330, (dt, r)
print(sum(mod.f.stats.cache_hits.values()), sum(mod.f.stats.cache_misses.values()))
"""


@pytest.mark.parametrize("trial", range(2))
def test_simultaneous_compiles_leave_every_signature_its_own_code(tmp_path, trial):
    (tmp_path / "mod.py").write_text(MODULE)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    env.pop("NUMBA_CACHE_DIR", None)  # the module's own __pycache__ in tmp_path
    start = time.time() + 4.0  # every process imported and waiting before the first compiles
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(COMPILE), dt, repr(start)], env=env,
                              cwd=tmp_path, stderr=subprocess.PIPE, text=True) for dt in DTYPES]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHECK), *DTYPES], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    hits, misses = map(int, out.stdout.split())
    assert (hits, misses) == (len(DTYPES), 0), f"cache hits / misses {hits} / {misses}: entries lost"
    assert np.all([p.returncode == 0 for p in procs])


# ---- the kernel packages' stamp -------------------------------------------------------------

def test_kernel_caches_are_recognized_by_their_directory():
    from kernels_cpu import cache_safety as C

    assert C.is_kernel_cache(os.path.join(ROOT, "kernels_cpu", "__pycache__"))
    assert C.is_kernel_cache(os.path.join("/tmp", "numba-cache", "kernels_common_0123abcd"))  # NUMBA_CACHE_DIR's form
    assert not C.is_kernel_cache(os.path.join(ROOT, "tests", "__pycache__"))
    assert not C.is_kernel_cache(os.path.join("/tmp", "numba-cache", "my_kernels_cpu_tools_01"))


def test_package_stamp_follows_every_source_file(tmp_path, monkeypatch):
    """A change to any .py file of a kernel package changes the stamp (fake packages here:
    touching the real ones would make every other test recompile its kernels)."""
    from kernels_cpu import cache_safety as C

    for pkg in C.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "a.py").write_text("x = 1\n")
    (tmp_path / "kernels_cpu" / "notes.txt").write_text("not a source\n")
    monkeypatch.setattr(C, "_ROOT", str(tmp_path))
    first = C.package_stamp()
    assert C.package_stamp() == first
    (tmp_path / "kernels_cpu" / "notes.txt").write_text("still not a source, longer\n")
    assert C.package_stamp() == first
    (tmp_path / "kernels_common" / "a.py").write_text("x = 22\n")  # another size
    second = C.package_stamp()
    assert second != first
    (tmp_path / "kernels_cuda" / "b.py").write_text("")
    assert C.package_stamp() != second


def test_an_index_from_other_kernel_sources_is_not_loaded(tmp_path, monkeypatch):
    """A kernel cache's index saved under one package stamp is stale under another (numba
    then recompiles), while other caches keep numba's own per-file stamp."""
    from numba.core import caching

    from kernels_cpu import cache_safety as C

    kdir, odir = tmp_path / "kernels_cpu_0123", tmp_path / "elsewhere"
    kdir.mkdir()
    odir.mkdir()
    for d in (kdir, odir):
        f = caching.IndexDataCacheFile(str(d), "mod.f-1.py311", (1.0, 100))
        f._save_index({"sig": "mod.f-1.py311.0.nbc"})
    assert caching.IndexDataCacheFile(str(kdir), "mod.f-1.py311", (1.0, 100))._load_index() == {
        "sig": "mod.f-1.py311.0.nbc"}
    monkeypatch.setattr(C, "_STAMP", ["another release"])
    assert caching.IndexDataCacheFile(str(kdir), "mod.f-1.py311", (1.0, 100))._load_index() == {}
    assert caching.IndexDataCacheFile(str(odir), "mod.f-1.py311", (1.0, 100))._load_index() == {
        "sig": "mod.f-1.py311.0.nbc"}
