"""The on-disk tuning cache written by ``python -m bench tune`` and read by the dispatcher.

One JSON file (``$NK_TUNING_CACHE``, else ``$XDG_CACHE_HOME/numba-ml-kernels/tuning.json``,
else ``~/.cache/numba-ml-kernels/tuning.json``) maps a call key on a device to the winning
implementation and its parameters.  An entry counts only if its device name, kernel version
and numba version match this process; anything stale or unreadable is ignored with a
warning, never a crash.  Tuning never runs implicitly: this module only reads (and the
tuner writes through `store`).
"""
from __future__ import annotations

import json
import os
import platform
import warnings
from functools import lru_cache

import numba

FORMAT = 1


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

        return cuda.get_current_device().name.decode() if hasattr(cuda.get_current_device().name, "decode") else str(cuda.get_current_device().name)
    except Exception:  # noqa: BLE001 - any failure means "no named GPU"
        return device


def entry_key(op: str, key: tuple) -> str:
    """The JSON key of a call key: the op, its device's name and the rest of the key."""
    return json.dumps([op, device_name(key[1]), [str(k) for k in key[1:]]])


_entries: dict | None = None


def _load() -> dict:
    path = cache_path()
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError(f"unknown format {data.get('format')!r}")
        return data["entries"]
    except (OSError, ValueError, AttributeError) as exc:
        warnings.warn(f"ignoring unreadable tuning cache {path}: {exc}", RuntimeWarning, stacklevel=3)
        return {}


def reload():
    """Forget the loaded cache (the next lookup reads the file again)."""
    global _entries
    _entries = None


def lookup(op, key: tuple):
    """(names, params_by_name, rule) from the tuning cache for this key, or None."""
    global _entries
    if _entries is None:
        _entries = _load()
    if not _entries:
        return None
    entry = _entries.get(entry_key(op.name, key))
    if entry is None:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("impl"), str) \
            or not isinstance(entry.get("params") or {}, dict):
        warnings.warn(f"ignoring malformed tuning entry for {op.name} {key} in {cache_path()}: {entry!r:.80}",
                      RuntimeWarning, stacklevel=3)
        return None
    name = entry.get("impl")
    impl = op.implementations.get(name)
    stale = None
    if impl is None:
        stale = f"implementation {name!r} no longer exists"
    elif entry.get("kernel_version") != impl.version:
        stale = f"kernel version {entry.get('kernel_version')} != {impl.version}"
    elif entry.get("numba_version") != numba.__version__:
        stale = f"tuned with numba {entry.get('numba_version')}, running {numba.__version__}"
    if stale:
        warnings.warn(f"ignoring stale tuning entry for {op.name} {key}: {stale}", RuntimeWarning, stacklevel=3)
        return None
    params = entry.get("params") or {}
    return [name], {name: params}, f"tuning cache {cache_path()} (measured {entry.get('time_s', '?')} s)"


def store(results: list[dict], path: str | None = None) -> str:
    """Merge tuner results ({op, key, impl, params, time_s}) into the cache file."""
    from . import registry

    path = path or cache_path()
    entries = {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                old = json.load(f)
            if old.get("format") == FORMAT:
                entries = dict(old.get("entries", {}))
        except (OSError, ValueError):
            warnings.warn(f"overwriting unreadable tuning cache {path}", RuntimeWarning, stacklevel=2)
    for r in results:
        impl = registry.OPS[r["op"]].implementations[r["impl"]]
        entries[entry_key(r["op"], tuple(r["key"]))] = {
            "impl": r["impl"],
            "params": r.get("params", {}),
            "time_s": r.get("time_s"),
            "kernel_version": impl.version,
            "numba_version": numba.__version__,
        }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
    reload()
    return path
