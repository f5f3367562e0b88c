"""Peak memory of one call: how far the process's resident set rose above where it stood
when the call began (results included), read from Linux's VmHWM after resetting it.

Writing "5" to /proc/self/clear_refs resets the peak-RSS mark (VmHWM) to the current RSS
(Linux >= 4.0), so one process can measure several calls in turn, ours and PyTorch's alike
(tracemalloc sees numpy's allocations but not PyTorch's or numba's).  glibc keeps freed
blocks in its heap (after a large free its mmap threshold rises, so the next large arrays
come from the heap), which would let an earlier call's pages hide this call's peak:
malloc_trim(0) hands them back first.  Elsewhere (no /proc) `peak_extra_bytes` is None.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim():
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_extra_bytes(fn) -> int | None:
    """Bytes by which the peak RSS during fn() exceeded the RSS before it (results kept
    until the peak is read, so they count).  Our result arena's idle buffers are dropped
    first (dispatch.empty_cache): kept from earlier calls they are resident already, and
    the call's own use of them would not show."""
    d = sys.modules.get("dispatch")
    if d is not None and hasattr(d, "empty_cache"):
        d.empty_cache()
    gc.collect()
    _trim()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = _status_kib("VmRSS")
    res = fn()
    peak = _status_kib("VmHWM")
    del res
    if before is None or peak is None:
        return None
    return max(0, peak - before) * 1024
