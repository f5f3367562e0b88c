"""The CPU kernels' threading runtime: which numba threading layer runs the parallel kernels.

Imported by ``kernels_cpu/__init__`` before any kernel is compiled, so it decides for the
whole process when the user sets nothing.

Why TBB (the A/B behind it is in README's "Threading" section and the issue notes):
- numba's default ``omp`` layer loads the system libgomp beside PyTorch's own OpenMP
  runtime. After one parallel numba kernel, PyTorch's attention on (16, 12, 198, 32) took
  440-616 ms instead of 14-28 ms, and its workers wake slowly after an idle pause
  (layer_norm 128x768 forced parallel after 0.2 s idle: 7.8 ms omp, 0.13 ms tbb).
  Re-measured 2026-11-26 on an Intel host (PyTorch 2.13, ``python -m bench.runtime --ab``),
  neither held: PyTorch's attention after our omp kernels 1.02x its time alone (tbb 1.00x),
  and omp ran small kernels faster than tbb right after a PyTorch call and in paced
  bursts (softmax 1x12x128x128 paced 0.101 vs 0.226 ms, layer_norm 512x768 bursts after
  idle 93 vs 250 us, attention 1x12x128x64 mixed 0.53 vs 0.94 ms), tbb faster from 4
  Python threads (geglu 0.61 vs 1.29 ms).  tbb stays until the A/B holds on more hosts and
  omp's fork hazard is handled (GNU OpenMP terminates a forked child that uses it).
- ``workqueue`` aborts the process ("Concurrent access has been detected", exit 134) when
  two Python threads call parallel kernels at once.
- ``tbb`` has neither problem. numba already ranks it first (its default priority is tbb,
  omp, workqueue) but finds ``libtbb.so.12`` only on the loader path, and pip's ``tbb``
  wheel puts it in ``<prefix>/lib``, which is not on it. So the library is loaded here by
  its absolute path (RTLD_GLOBAL) before numba starts its threads: the dynamic loader then
  resolves numba's ``tbbpool`` extension against the copy already in the process (glibc
  matches a needed library by its soname), and numba's own default choice becomes tbb.

The user's settings win: ``NUMBA_THREADING_LAYER`` / ``NUMBA_THREADING_LAYER_PRIORITY`` are
numba's and are left alone (``layer()`` reports what actually runs). If the user picks
``workqueue``, ``guard()`` serializes our parallel kernels across Python threads so that
concurrent calls cannot abort the process (numba's other parallel code in the process is
the user's to guard).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading

import numba
from numba.core import config

TBB_SONAME = "libtbb.so.12"


def _tbb_library_path() -> str | None:
    """Absolute path of the pip ``tbb`` wheel's libtbb.so.12, or None (not installed, or not
    a Linux ELF platform)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        from importlib import metadata
        dist = metadata.distribution("tbb")
    except Exception:  # noqa: BLE001 - not installed: numba falls back to its own search
        return None
    for f in dist.files or ():
        if f.name == TBB_SONAME:
            path = os.path.realpath(str(dist.locate_file(f)))
            if os.path.isfile(path):
                return path
    return None


def _preload_tbb() -> str:
    """Load libtbb.so.12 by path so that numba's tbb layer can start. Returns a short note
    of what happened (shown by ``describe``)."""
    path = _tbb_library_path()
    if path is None:
        return "pip tbb not found"
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        return f"could not load {path}: {e}"
    return f"loaded {path}"


TBB_NOTE = _preload_tbb()
_LAUNCH_LOCK = threading.Lock()
_WORKQUEUE_LOCK = threading.RLock()
_LAYER = None  # fixed once numba has started its threads


def layer() -> str:
    """The threading layer numba runs our parallel kernels on ("tbb", "omp" or
    "workqueue"). Starts numba's thread pool if no parallel kernel has run yet (a few ms,
    once per process)."""
    global _LAYER
    if _LAYER is None:
        with _LAUNCH_LOCK:
            from numba.np.ufunc import parallel
            parallel._launch_threads()  # returns at once when already started
            _LAYER = numba.threading_layer()
    return _LAYER


def requested() -> str:
    """The user's numba setting: "default" unless NUMBA_THREADING_LAYER names a layer."""
    return str(config.THREADING_LAYER)


def needs_guard() -> bool:
    """Whether our kernel calls must be serialized (the user chose numba's workqueue layer,
    which aborts on concurrent use): callers skip guard() when not, saving the context's
    cost on every op call."""
    return (_LAYER if _LAYER is not None else layer()) == "workqueue"


def guard():
    """A context for running a parallel kernel: a process-wide lock when the layer is
    workqueue (which aborts on concurrent use), otherwise nothing."""
    if needs_guard():
        return _WORKQUEUE_LOCK
    return contextlib.nullcontext()


def describe() -> str:
    """One line for ``explain`` and the report's machine header."""
    req = requested()
    how = "numba default" if req == "default" else f"NUMBA_THREADING_LAYER={req}"
    from . import keepwarm, team
    return (f"{team.describe()}; numba's {layer()} layer for the rest, {numba.get_num_threads()} threads ({how}; "
            f"tbb: {TBB_NOTE}); {keepwarm.describe()}")


def vectors() -> str:
    """One line for ``explain`` and the report's machine header: the vector width and the
    GEMM register tile that run (kernels_cpu.gemm.active_tile(): chosen from the target's
    features at import, NK_GEMM_TILE overrides), and whether the host has AVX-512.
    conv2d's implicit GEMM runs the same tile.  On AVX-512 targets a kernel's loops run 16
    float32 lanes where that measured faster (the kernel calls approx.wide_loops, its figures
    beside it) and LLVM's 8 in the others; LLVM's choice on other targets."""
    from . import gemm, target
    cpu = target.cpu_name()
    tile = gemm.active_tile()
    avx512 = gemm.host_has_avx512()
    bits = tile.lanes32 * 32
    host = "AVX-512" if avx512 else "no AVX-512"
    forced = f" ({gemm.TILE_ENV} or use_tile)" if tile.name != gemm.TILES[gemm.HOST_WIDE if avx512 else
                                                                         gemm.NARROW].name else ""
    acts = "16 x float32 where measured faster, 8 elsewhere" if avx512 else "8 x float32"
    if not target.is_x86():
        # aarch64: LLVM legalizes the IR's 8-lane float32 vectors as pairs of 4-lane NEON
        # registers (the 6x16 tile: 24 of NEON's 32 as accumulators); the loops are its choice
        acts, host = "4 x float32 (LLVM's choice)", f"{target.vector_bits()}-bit NEON vectors, LLVM splits wider IR vectors"
    return (f"{bits}-bit GEMM: {tile.name} tile{forced} ({tile.describe()}, {tile.mr}x{tile.nr64} float64; "
            f"conv2d too), elementwise loops {acts}; host {cpu}: {host}")
