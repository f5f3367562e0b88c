"""numba's on-disk kernel cache, made safe for processes that compile at the same time.

numba (0.68) saves a compiled specialization in ``IndexDataCacheFile.save``: it reads the
function's index (signature -> data file), picks the first free name ``f.<n>.nbc``, writes
the index, then the data.  Two processes that compile the same function with different
signatures at once both read the same index, both pick ``<n>``, and the last index write and
the last data write can come from different processes: the index then maps one signature to
the other signature's machine code.  Every later process loads that code for it.  Seen
here: ten processes compiling one function for ten dtypes at once (2026-11-28), two of six
trials left an entry whose next load raised "can't unbox array" (another dtype's code);
for two layouts of one dtype the wrong code runs silently (CI's two pytest workers saw
layer_norm_backward's serial and parallel kernels differ in the last bit in 2.8% of dx:
code compiled for other array layouts, by their fastmath reassociation).  Users meet
the same race with a cold cache in multi-process jobs (data-loader workers, gunicorn,
pytest-xdist).

``install()`` replaces that save: the data goes first, under a name no other process picks
(48 random bits), and the index is then re-read, updated and written under an exclusive
lock on a file beside it (``fcntl.flock``; where there is none, entries may still be lost,
which costs a recompile, but never cross-wired).  A replaced entry's old data file is
removed.  Loading is numba's own.

numba also keys a cached function on its own source file alone (modification time and
size), while a kernel compiles in code and constants from other modules: helpers it
inlines, argument-block slot numbers (gemm.P_COUNT, which linalg_grad's packers add to), the
register tiles.  A change to gemm.py alone thus left linalg_grad's packers cached with the
old slot numbers, and linear_backward's next call read the wrong slots and crashed (SIGSEGV,
2026-12-03, after a change of the GEMM's block was reverted).  ``install()`` therefore adds a
stamp of every source file of the kernel packages (kernels_cpu, kernels_common,
kernels_cuda) to the stamp of each of their caches: any change to any of them makes every
kernel compile afresh (once), as a release upgrade must.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random

try:
    import fcntl
except ImportError:  # not POSIX: unique names alone
    fcntl = None

_random = random.SystemRandom()


@contextlib.contextmanager
def _locked(path):
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # a directory we may write data into but not create the lock in: unlocked
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _save(self, key, data):
    """IndexDataCacheFile.save without the cross-process race (module docstring)."""
    name = self._data_name(_random.getrandbits(48))
    self._save_data(name, data)
    with _locked(self._index_path):
        overloads = self._load_index()
        old = overloads.get(key)
        overloads[key] = name
        self._save_index(overloads)
    if old is not None and old != name:
        with contextlib.suppress(OSError):
            os.unlink(self._data_path(old))


# The kernel packages: this file's and its siblings'.  A cache belongs to them when its
# directory names one of them (numba's caches sit in <package>/__pycache__, or under
# NUMBA_CACHE_DIR in <package>_<hash of its path>).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("kernels_cpu", "kernels_common", "kernels_cuda")


def package_stamp() -> str:
    """A digest of the name, modification time and size of every .py file of PACKAGES."""
    h = hashlib.sha256()
    for pkg in PACKAGES:
        d = os.path.join(_ROOT, pkg)
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".py"))
        except OSError:
            continue
        for n in names:
            st = os.stat(os.path.join(d, n))
            h.update(f"{pkg}/{n}:{st.st_mtime_ns}:{st.st_size};".encode())
    return h.hexdigest()


def is_kernel_cache(cache_path: str) -> bool:
    """Whether numba's cache directory cache_path holds one of PACKAGES' kernels."""
    parts = os.path.normpath(cache_path).split(os.sep)
    return any(part == pkg or part.startswith(pkg + "_") for part in parts for pkg in PACKAGES)


_STAMP = [None]


def install() -> None:
    """Patch numba's cache file class once (idempotent): the save above, and the package
    stamp added to the source stamp of the kernel packages' caches."""
    from numba.core import caching

    cls = caching.IndexDataCacheFile
    if getattr(cls.save, "_nk_safe", False):
        return
    _STAMP[0] = package_stamp()
    init = cls.__init__

    def __init__(self, cache_path, filename_base, source_stamp):
        if is_kernel_cache(cache_path):
            source_stamp = (source_stamp, _STAMP[0])
        init(self, cache_path, filename_base, source_stamp)

    _save._nk_safe = True
    cls.save = _save
    cls.__init__ = __init__
