"""The on-disk tuning cache written by ``python -m bench tune`` and read by the dispatcher.

One JSON file (``$NK_TUNING_CACHE``, else ``$XDG_CACHE_HOME/numba-ml-kernels/tuning.json``,
else ``~/.cache/numba-ml-kernels/tuning.json``) maps a call key on a device to the winning
implementation and its parameters.  An entry counts only if its device name, kernel version
(a hash of the implementation's kernel sources, `Implementation.version`) and numba version
match this process, and its parameters are ones the implementation declares, of the
declared type and among its tunable values; anything stale, malformed or unreadable is
ignored with a warning, never a crash.

The file is read once per process (under a lock: threads calling at once read it once),
and only when it is a regular file of at most MAX_BYTES: a FIFO, a device or a directory
named by NK_TUNING_CACHE is refused with a warning instead of blocking or exhausting memory.
Tuning never runs implicitly: this module only reads (and the tuner writes through `store`).
"""
from __future__ import annotations

import json
import os
import platform
import stat
import threading
import warnings
from functools import lru_cache

import numba

FORMAT = 2          # 2: named keys, source-hash kernel versions
MAX_BYTES = 16 << 20  # a cache of every op x bucket x dtype is a few hundred KiB


def cache_path() -> str:
    explicit = os.environ.get("NK_TUNING_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "numba-ml-kernels", "tuning.json")


@lru_cache(maxsize=None)
def device_name(device: str = "cpu") -> str:
    """A stable name of the machine a tuning result belongs to."""
    if device == "cpu":
        model = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        model = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        return f"{model} x{numba.config.NUMBA_NUM_THREADS}"
    try:
        from numba import cuda

        name = cuda.get_current_device().name
        return name.decode() if hasattr(name, "decode") else str(name)
    except Exception:  # noqa: BLE001 - any failure means "no named GPU"
        return device


def entry_key(op: str, key) -> str:
    """The JSON key of a call key: the op, its device's name and the key's named fields."""
    fields = {name: str(value) for name, value in key._asdict().items() if name != "op"}
    return json.dumps([op, device_name(key.device), fields], sort_keys=True)


_lock = threading.Lock()
_entries: dict | None = None


def _read_bounded(path: str) -> str | None:
    """The file's text, or None when there is no file; ValueError for anything that is
    not a regular file of at most MAX_BYTES (checked on the opened descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_BYTES:
            raise ValueError(f"{st.st_size} bytes > {MAX_BYTES}")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES} bytes")
    return data.decode("utf-8")


def _load() -> dict:
    path = cache_path()
    try:
        text = _read_bounded(path)
        if text is None:
            return {}
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            fmt = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"unknown format {fmt!r} (this version reads format {FORMAT})")
        return data["entries"]
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        warnings.warn(f"ignoring unreadable tuning cache {path}: {exc}", RuntimeWarning, stacklevel=4)
        return {}


def _entries_once() -> dict:
    global _entries
    entries = _entries
    if entries is None:
        with _lock:
            if _entries is None:
                _entries = _load()
            entries = _entries
    return entries


def reload():
    """Forget the loaded cache (the next lookup reads the file again)."""
    global _entries
    with _lock:
        _entries = None


def param_problem(impl, params) -> str | None:
    """Why `params` are not valid parameters of impl (None: they are): every name must be
    one of impl.params, of the default's type, and among impl.tunables' values if listed."""
    if not isinstance(params, dict):
        return f"params must be an object, got {type(params).__name__}"
    for name, value in params.items():
        if name not in impl.params:
            return f"unknown parameter {name!r} (known: {sorted(impl.params)})"
        default = impl.params[name]
        if type(value) is not type(default):
            return f"parameter {name!r} must be a {type(default).__name__}, got {value!r}"
        allowed = impl.tunables.get(name)
        if allowed is not None and value not in allowed:
            return f"parameter {name!r} = {value!r} is not one of the tunable values {allowed}"
    return None


def lookup(op, key):
    """(names, params_by_name, rule) from the tuning cache for this key, or None."""
    entries = _entries_once()
    if not entries:
        return None
    k = entry_key(op.name, key)
    if k not in entries:
        return None
    entry = entries[k]
    if not isinstance(entry, dict) or not isinstance(entry.get("impl"), str) \
            or not isinstance(entry.get("params") or {}, dict):
        warnings.warn(f"ignoring malformed tuning entry for {op.name} {key} in {cache_path()}: {entry!r:.80}",
                      RuntimeWarning, stacklevel=3)
        return None
    name = entry["impl"]
    impl = op.implementations.get(name)
    stale = None
    if impl is None:
        stale = f"implementation {name!r} no longer exists"
    elif entry.get("kernel_version") != impl.version:
        stale = f"kernel sources changed (version {entry.get('kernel_version')!r} != {impl.version!r})"
    elif entry.get("numba_version") != numba.__version__:
        stale = f"tuned with numba {entry.get('numba_version')}, running {numba.__version__}"
    elif impl.refusals(key):
        stale = f"{name!r} cannot run this call ({'; '.join(impl.refusals(key))})"
    if stale:
        warnings.warn(f"ignoring stale tuning entry for {op.name} {key}: {stale}", RuntimeWarning, stacklevel=3)
        return None
    params = entry.get("params") or {}
    problem = param_problem(impl, params)
    if problem:
        warnings.warn(f"ignoring malformed tuning entry for {op.name} {key} in {cache_path()}: {problem}",
                      RuntimeWarning, stacklevel=3)
        return None
    return [name], {name: params}, f"tuning cache {cache_path()} (measured {entry.get('time_s', '?')} s)"


def store(results: list[dict], path: str | None = None) -> str:
    """Merge tuner results ({op, key, impl, params, time_s}; key the call's named key)
    into the cache file."""
    from . import registry

    path = path or cache_path()
    entries = {}
    try:
        text = _read_bounded(path)
        if text is not None:
            old = json.loads(text)
            if isinstance(old, dict) and old.get("format") == FORMAT and isinstance(old.get("entries"), dict):
                entries = dict(old["entries"])
    except (OSError, ValueError, UnicodeDecodeError):
        warnings.warn(f"overwriting unreadable tuning cache {path}", RuntimeWarning, stacklevel=2)
    for r in results:
        impl = registry.OPS[r["op"]].implementations[r["impl"]]
        params = r.get("params", {})
        problem = param_problem(impl, params)
        if problem:
            raise ValueError(f"tuning result for {r['op']} {r['impl']}: {problem}")
        entries[entry_key(r["op"], r["key"])] = {
            "impl": r["impl"],
            "params": params,
            "time_s": r.get("time_s"),
            "kernel_version": impl.version,
            "numba_version": numba.__version__,
        }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)  # readers never see a half-written file
    reload()
    return path
