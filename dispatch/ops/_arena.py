"""Result memory of the CPU ops: large result buffers are reused once freed (as
onnxruntime's CPU arena and PyTorch's CUDA caching allocator do).

Why: a transformer forward frees and allocates tens of MB of results per layer.  glibc
gives the freed top of its heap back to the kernel (trim), and the next layer's results
fault it in again, zeroed page by page.  MiniLM-L6 forward (bench.model: B=16, S=198,
2026-11-26, Sapphire Rapids, 2 threads), three alternating processes each:
  malloc'd results:  2995-3629 page faults and 26-54 ms of system time per forward,
                     303-321 ms a forward;
  this arena:        0 page faults, 5-9 ms of system time, 283-297 ms a forward,
                     93 MB kept.

How: a result of at least MIN_BYTES is a view of a raw uint8 buffer that the arena keeps.
The result, and every view of it, holds a reference to that buffer (numpy points a view's
``base`` at the array owning the memory), so a buffer whose only reference is the arena's
own is free to be handed out again; until then it is never reused.  At most KEEP_BYTES of
buffers are kept (``NK_ARENA_MB``, in MiB, default 256; 0 turns the arena off): past that,
idle buffers are dropped, and a result that still does not fit is a plain ``np.empty``.
``dispatch.empty_cache()`` drops every idle buffer.

What a user sees: a large result's ``base`` is a uint8 buffer and ``flags.owndata`` is
False, as for any view; its memory stays with the arena after the result is gone.
"""
from __future__ import annotations

import math
import os
import sys
import threading
from sys import getrefcount

import numpy as np


__public__ = ("empty_cache",)

# Results from 128 KiB (glibc's initial mmap threshold) up: below that malloc's bins serve
# them without faults.  A 1 MiB floor left conv2d's 784 KiB result to malloc, where with the
# op's 841 KiB padded copy freed beside it the heap top was trimmed and faulted in again on
# every call: ResNet-50 3x3 64ch 56x56, 2 threads, 2026-11-26, 394 -> 0 page faults and
# 1.53 -> 1.09 ms a call; layer_norm 128x768, softmax 1x12x128x128, attention 1x12x128x64 and
# geglu 128x3072 had no faults either way and did not change beyond noise.
MIN_BYTES = 1 << 17
ALIGN = 1 << 16       # size classes: byte counts rounded up to 64 KiB
# Where in its 4 KiB page a result starts.  A kernel that streams an input and writes a
# result a little ahead of it in the page (the result's page offset 64-320 bytes past the
# input's) loses 5-25%: its loads share low address bits with the stores just issued
# before them (4K aliasing).  numpy's large arrays start 16 bytes into a page and
# PyTorch's 64, which is where the results used to start too (their buffers' first cache
# line): layer_norm 4096x768 from a numpy array took 332 us writing at page offset 64,
# 286 at 2112; from a 64-aligned one 261 at 64 (the same offset), 292 at 128 (2 threads,
# kernel alone, Zen 4, 2026-12-05).  Half a page away from both; results that feed each
# other sit at the same offset, which costs nothing.
PAGE = 4096
PAGE_OFFSET = 2048
PER_CLASS = 16        # buffers kept per size class (more live results: plain np.empty)
ENV = "NK_ARENA_MB"


def env_mib(env: str, default_mib: int, what: str) -> int:
    """Bytes from the environment variable `env`, a whole number of MiB >= 0 (unset or empty:
    default_mib); anything else raises ValueError naming the variable.  `what`: what 0 turns
    off, for the message."""
    raw = os.environ.get(env)
    if raw is None or raw.strip() == "":
        return default_mib << 20
    try:
        mb = int(raw)
    except ValueError:
        mb = -1
    if mb < 0:
        raise ValueError(f"{env}={raw!r}: expected a whole number of MiB >= 0 (0 turns {what} off)")
    return mb << 20


KEEP_BYTES = env_mib(ENV, 256, "the result arena")

_LOCK = threading.Lock()
_BUFS: dict = {}      # size class (bytes) -> list of raw uint8 buffers
_KEPT = [0]           # bytes of all kept buffers, in use or idle


def _idle_refs() -> int:
    """sys.getrefcount of a list element that nothing else refers to, read as _idle reads
    it (the count depends on the interpreter's calling convention)."""
    probe = [np.empty(1, np.uint8)]
    return sys.getrefcount(probe[0])


_IDLE = _idle_refs()


def idle(bufs, i) -> bool:
    """Whether nothing but the list `bufs` refers to bufs[i] (read by index: a local name
    would be one more reference)."""
    return sys.getrefcount(bufs[i]) == _IDLE


def drop_idle(store: dict, kept: list, need: int, limit: int, is_idle, size_of) -> int:
    """Drop idle buffers from store (key -> list of buffers; size_of(key) -> bytes of each)
    until `need` more bytes fit under `limit` (need < 0: all of them), keeping kept[0] (the
    bytes held) up to date and removing emptied keys; returns the bytes dropped.  is_idle(bufs,
    i) says whether bufs[i] may go.  Called with the owner's lock held."""
    freed = 0
    for key in list(store):
        bufs, size = store[key], size_of(key)
        i = 0
        while i < len(bufs):
            if need >= 0 and kept[0] + need <= limit:
                return freed
            if is_idle(bufs, i):
                del bufs[i]
                kept[0] -= size
                freed += size
            else:
                i += 1
        if not bufs:
            del store[key]
    return freed


def _drop_idle(need: int) -> int:
    return drop_idle(_BUFS, _KEPT, need, KEEP_BYTES, idle, int)


_CLASSES: dict = {}  # (shape, dtype) -> (dtype, size class in bytes, or 0 below MIN_BYTES)


def _size_class(shape, dtype):
    dt = np.dtype(dtype)
    n = dt.itemsize * math.prod(shape)
    cls = 0 if n < MIN_BYTES else -(-n // ALIGN) * ALIGN
    if len(_CLASSES) >= 1024:  # shapes seen are few in a model; a shape sweep must not grow it
        _CLASSES.clear()
    _CLASSES[(shape, dtype)] = hit = (dt, cls)
    return hit


def empty(shape, dtype) -> np.ndarray:
    """A new C-contiguous array of shape (a tuple) and dtype (contents undefined), from the
    arena when it is large enough to be worth it.

    The common case (a shape seen before, an idle buffer of its class) is inline: the size
    class looked up, the class's list scanned here, the offset read with item(); take()
    with its allocator closure, np.dtype and math.prod cost 1.1-1.5 of the 2.35-3.3 us a
    result took (2026-12-04, Zen 4)."""
    if type(shape) is not tuple:
        shape = tuple(shape)
    hit = _CLASSES.get((shape, dtype))
    dt, cls = hit if hit is not None else _size_class(shape, dtype)
    if not cls or KEEP_BYTES == 0:
        return np.empty(shape, dt)
    raw = None
    with _LOCK:
        bufs = _BUFS.get(cls)
        if bufs:
            for i in range(len(bufs)):
                if getrefcount(bufs[i]) == _IDLE:  # idle(), inline
                    raw = bufs[i]
                    break
        if raw is None:
            raw = take(_BUFS, _KEPT, cls, cls, KEEP_BYTES, PER_CLASS, idle, lambda: _offset_buffer(cls), _drop_idle)
    if raw is None:
        return np.empty(shape, dt)
    # the result starts at PAGE_OFFSET of a page (a cache line: vector stores not split),
    # an array on the kept buffer (numpy makes the buffer its base), whose reference count
    # is the idle test
    return np.ndarray(shape, dt, buffer=raw, offset=raw.item(-1) | raw.item(-2) << 8)


def _offset_buffer(nbytes):
    """A uint8 buffer for results of up to nbytes from byte PAGE_OFFSET of a page, whose
    offset it keeps in its last two bytes (never part of a result: offset + nbytes < its
    size - 2).  Reading the address back (raw.ctypes.data) and slicing and viewing cost 1.3
    of the 2.35 us of a result from the arena (2026-12-03); the bytes and np.ndarray(buffer=)
    0.4."""
    raw = np.empty(nbytes + PAGE + 2, np.uint8)
    off = (PAGE_OFFSET - raw.ctypes.data) % PAGE
    raw[-1], raw[-2] = off & 255, off >> 8
    return raw


def take(store: dict, kept: list, key, size: int, limit: int, per_key: int, is_idle, allocate, drop):
    """An idle buffer of store[key], else a new one from allocate() (size bytes) when at most
    per_key are kept under the key and the bytes kept stay under `limit` (after drop(size)
    has dropped idle ones of other keys); None when neither (the caller then makes a plain
    one).  Called with the owner's lock held: the caller takes its reference to the buffer
    before the lock is released."""
    bufs = store.get(key)
    if bufs is None:
        bufs = store[key] = []
    for i in range(len(bufs)):
        if is_idle(bufs, i):
            return bufs[i]
    if len(bufs) >= per_key:
        return None
    if kept[0] + size > limit:
        drop(size)
        if kept[0] + size > limit:
            return None
    buf = allocate()
    store.setdefault(key, []).append(buf)  # drop (or allocate) may have removed an emptied key
    kept[0] += size
    return buf


_OTHER_CACHES: list = []  # the CUDA result pool's empty_cache, once it is loaded


def add_cache(fn) -> None:
    """Have empty_cache() call fn() too (-> bytes freed): the CUDA result pool registers
    itself here when it loads, so the CPU side never imports numba.cuda."""
    _OTHER_CACHES.append(fn)


def empty_cache() -> int:
    """Free the idle buffers of the result memory: the CPU arena's and, once CUDA ops have
    run, the CUDA pool's (results still referenced keep theirs); returns the bytes freed.
    See dispatch/ops/_arena.py and dispatch/cuda_impls/_pool.py."""
    with _LOCK:
        freed = _drop_idle(-1)
    return freed + sum(fn() for fn in _OTHER_CACHES)


def kept_bytes() -> int:
    """Bytes the arena holds, in use or idle (for tests and the report)."""
    return _KEPT[0]
