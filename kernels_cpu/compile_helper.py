"""A second process that compiles part of a cold first call's kernels while this one
compiles the rest.

A cold first call (empty numba cache) of attention, its backward or a GEMM backward spent
about 3 s compiling a few large functions that reach each other only by address
(parallel.worker_address: a worker and the item, packers or epilogue it calls).  numba
compiles one function at a time in a process (its compiler lock, and the GIL), so the
second core of this machine kind sat idle.  parallel.worker_addresses shares a call's cold
kernels (compiled neither in this process nor in numba's cache) with a helper,
``python -m kernels_cpu.compile_helper``, which compiles its share into numba's on-disk
cache while this process compiles the rest; this process then loads the helper's from
the cache.  The two take kernels in orders of their own (main_order, helper_order) and
claim each before compiling it (claim), so whichever is faster compiles more.

parallel.compile_ahead hands a helper the kernels a call will need after others it compiles
first (linear_cross_entropy_with_grad's GEMM, while its first chunk compiles the
cross-entropy gradient); the later call takes over those the helper has not started on.

Cold first calls as the report measures them (bench/compile_time.py, a fresh process and
an empty cache per op; Zen 4, 2026-12-05), without / with helpers: attention bert-base
seq 128 3.39 / 2.15-2.45 s, attention_backward GPT-2 512 causal 3.09 / 2.44, linear_backward
bert-base ffn-up + gelu 3.38 / 2.44-2.63, linear_cross_entropy_with_grad GPT-2 lm head
2.58-2.83 / 1.98-2.20.

``NK_COMPILE_HELPER`` says when: ``auto`` (the default) when numba caches the kernels and a
core is free (Linux: fewer threads of other processes running or ready to run than usable
CPUs less one, at the moment of the call), since on a machine whose cores are busy (a test
run with a worker per core) the helper would only add its start-up (about 0.4 s of
imports) to the work; ``on`` whenever numba caches the kernels; ``off`` never.  A helper
that fails or outlives TIMEOUT_S changes nothing but the time: this process compiles what
the cache lacks itself, and starts no helper again (whatever failed, such as a Python that
cannot import the kernels, would fail again).  The helper's results are numba cache
entries like any, keyed by function, signature and CPU, and made by the same compiler from
the same sources and environment: the machine code this process would have made.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ENV = "NK_COMPILE_HELPER"
MODES = ("auto", "on", "off")
# A helper given more than this to compile is stuck (or the machine is): this process then
# compiles the kernels itself.  The largest batch takes about 2 s.
TIMEOUT_S = 120.0
SAMPLES = 5  # looks at the machine's running threads (wanted), 1 ms apart

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LOCK = threading.Lock()
# counts for tests and diagnostics: helpers started, finished with every kernel compiled,
# failed (the last one's error)
STATS = {"started": 0, "succeeded": 0, "failed": 0, "last_error": ""}


def mode_from_env(value):
    """The mode from the NK_COMPILE_HELPER string (unset or empty: auto); anything else is a
    ValueError naming the variable and the choices."""
    if value is None or not value.strip():
        return "auto"
    mode = value.strip().lower()
    if mode not in MODES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(MODES)} (default auto)")
    return mode


MODE = mode_from_env(os.environ.get(ENV))


def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _others_running():
    """Threads of other processes running or ready to run now (Linux: /proc/loadavg's
    count, less this process's threads in state R: its thread team may be spinning), or
    None where that is not known."""
    try:
        with open("/proc/loadavg") as f:
            total = int(f.read().split()[3].split("/")[0])
        own = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    own += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except (OSError, IndexError):
                pass  # a thread that ended meanwhile
        return max(total - own, 0)
    except (OSError, ValueError, IndexError):
        return None


def wanted(mode=None):
    """Whether a cold first call should start a helper now (see the module docstring)."""
    mode = MODE if mode is None else mode
    if mode == "off" or not sys.executable or STATS["failed"]:
        return False
    if mode == "on":
        return True
    cpus = _usable_cpus()
    if cpus < 2:
        return False
    # the least of a few looks: the count is of one instant, and this process's own threads
    # may change state between reading the machine's count and their own
    for _ in range(SAMPLES):
        others = _others_running()
        if others is None:
            return False
        if others < cpus - 1:
            return True
        time.sleep(0.001)
    return False


def start(kernels, order=None):
    """A running helper for kernels (a list of (module, function name, variant values,
    nargs), each a parallel.worker_address call), or None (nothing to describe in JSON, or
    the process did not start).  The helper and this process share the list through
    claims (see claim), each taking kernels in an order of its own (the helper's: order,
    default helper_order), so whichever is faster compiles more; the helper marks each
    kernel it has compiled (wait_for)."""
    order = helper_order(len(kernels)) if order is None else list(order)
    try:
        payload = json.dumps([[m, f, list(v), n] for m, f, v, n in kernels])
    except (TypeError, ValueError):
        return None
    claims = tempfile.mkdtemp(prefix="nk-compile-")
    # The helper runs in the package's parent directory, which `-m` puts first on its path:
    # it imports these kernel modules, not others that its working directory might hold
    # (another checkout), and paths relative to this process's directory are made absolute
    env = dict(os.environ)
    env[ENV] = "off"  # the helper compiles what it is given, one kernel at a time
    paths = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_PARENT] + paths)
    import numba
    if getattr(numba.config, "CACHE_DIR", ""):
        env["NUMBA_CACHE_DIR"] = os.path.abspath(numba.config.CACHE_DIR)  # also when set after import
    # its errors go to a file beside the claims, not a pipe: a helper whose starter has
    # ended (compile_ahead's, at exit) must not die writing a warning into a closed pipe
    try:
        with open(os.path.join(claims, "stderr"), "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "kernels_cpu.compile_helper", claims, payload,
                                     json.dumps(order)], env=env, cwd=_PACKAGE_PARENT,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    except OSError as e:
        shutil.rmtree(claims, ignore_errors=True)
        _count("failed", f"could not start: {e}")
        return None
    proc.claims = claims
    with _LOCK:
        _LIVE.add(proc)
    _count("started")
    return proc


# helpers started and not yet reaped by finish (compile_ahead's are reaped on a daemon
# thread, which dies at exit)
_LIVE = set()


@atexit.register
def _tidy():
    """At exit: the claims of helpers that have ended (one that failed leaves them for
    finish, which compile_ahead's daemon thread may not reach)."""
    for proc in list(_LIVE):
        if proc.poll() is not None:
            shutil.rmtree(proc.claims, ignore_errors=True)


def main_order(n):
    """The order in which the calling process claims the n kernels of a helper's list (the
    longest compile first): the first, then from the third on."""
    return [0] + list(range(2, n))


def helper_order(n):
    """The helper's order: the second (the next longest: both long ones run at once), then
    from the back (the short ones, while the calling process is still at the first)."""
    return [1] + list(range(n - 1, 1, -1)) if n > 1 else []


def claim(claims, i):
    """Whether this process got kernel i of a helper's list (the first to create its claim
    file, atomically); False once the other process has, or the helper is finished (finish
    removed the directory)."""
    return _create(claims, str(i))


def _create(claims, name):
    try:
        os.close(os.open(os.path.join(claims, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except (FileExistsError, FileNotFoundError):
        return False
    return True


def wait_for(proc, i):
    """Return once the helper proc has compiled kernel i of its list (its mark), or has
    ended (the cache then has the kernel, or this process compiles it), or TIMEOUT_S has
    passed."""
    mark = os.path.join(proc.claims, f"done{i}")
    deadline = time.monotonic() + TIMEOUT_S
    while not os.path.exists(mark) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)


def finish(proc):
    """Wait for the helper (at most TIMEOUT_S: then it is killed) and remove its claims;
    True when it compiled every kernel it claimed."""
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        shutil.rmtree(proc.claims, ignore_errors=True)
        with _LOCK:
            _LIVE.discard(proc)
        _count("failed", f"still compiling after {TIMEOUT_S:.0f} s: killed")
        return False
    try:
        with open(os.path.join(proc.claims, "stderr"), "rb") as f:
            err = f.read()[-2000:].decode(errors="replace")
    except OSError:
        err = ""
    shutil.rmtree(proc.claims, ignore_errors=True)
    with _LOCK:
        _LIVE.discard(proc)
    if proc.returncode != 0:
        _count("failed", f"exit {proc.returncode}: {err}")
        return False
    _count("succeeded")
    return True


def _count(what, error=None):
    with _LOCK:
        STATS[what] += 1
        if error is not None:
            STATS["last_error"] = error


def main(argv):
    """The helper: compiles each kernel of its list that it claims, in its order, and marks
    each one done; then removes the claims (on an error they stay, with its stderr, for
    finish to read and remove)."""
    import importlib

    from .parallel import worker_address
    claims, kernels, order = argv[0], json.loads(argv[1]), json.loads(argv[2])
    for i in order:
        if claim(claims, i):
            module, name, variant, nargs = kernels[i]
            worker_address(getattr(importlib.import_module(module), name), tuple(variant), nargs)
            _create(claims, f"done{i}")
    # every kernel is claimed now, and this helper's are in the cache: the claims are of no
    # more use (a claim or wait_for that finds them gone treats the kernel as the helper's,
    # then loads it from the cache), and the process that started it may have exited
    shutil.rmtree(claims, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
