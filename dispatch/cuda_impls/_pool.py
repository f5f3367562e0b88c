"""Device memory of the CUDA ops' results and scratch: a buffer is reused once nothing
refers to it, as PyTorch's CUDA caching allocator does.

Why: every fresh device array costs a cuMemAlloc and, later, a cuMemFree.  On the lent H200
(bench.gpu_overhead --profile, 2026-11-26, relu of 128x3072 float32) they took 19-43 and
19-32 us a call, and ``dispatch.relu(x)`` took 178 us against 61 us with ``out=``; PyTorch's
whole relu took 6.7 us.

How: numba-cuda hands out an allocation as an OwnedPointer over an AutoFreePointer whose
``refct`` counts the OwnedPointers alive, and each view numba makes of it (a slice, a
reshape) takes one more.  The pool keeps the OwnedPointer that ``memalloc`` returned; a
result is a DeviceNDArray whose ``gpu_data`` is that very object, as is every kernel view of
it (``c_view``).  A buffer is idle again when nothing but the pool refers to it
(sys.getrefcount, as the CPU arena reads it) and no numba view of it is alive (``refct`` back
to 1).  Only then is it handed out again.

Ordering: the dispatcher issues every kernel and copy on the default stream, so a kernel
writing a reused buffer runs after the kernels that used it before.  With numba-cuda's
per-thread default streams on (NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM=1) each thread gets its
own buffers.  A result handed to PyTorch (``torch.as_tensor``) keeps its buffer through the
reference PyTorch holds; work queued on another PyTorch stream is the user's to order,
as with ``Tensor.record_stream``.

Limits: ``NK_CUDA_POOL_MB`` (MiB, default 4096; 0 turns the pool off) bounds the bytes kept,
in use or idle; past it idle buffers are dropped, and a result that still does not fit is a
plain ``cuda.device_array``.  ``dispatch.empty_cache()`` frees the idle buffers.  Under the
CUDA simulator the pool is off (its arrays are host arrays).
"""
from __future__ import annotations

import math
import threading

import numpy as np

from .. import devices
from ..ops import _arena

ENV = "NK_CUDA_POOL_MB"
PER_CLASS = 64   # buffers kept per size class (a training step holds many same-sized activations)
MIN_CLASS = 512  # bytes; cuMemAlloc's own granularity is coarser still
KEEP_BYTES = _arena.env_mib(ENV, 4096, "the CUDA result pool")
POISON = False  # tests: fill every buffer handed out with 0xFF bytes (NaN in every float dtype)

_LOCK = threading.Lock()
_BUFS: dict = {}  # (device id, size class, thread or None) -> OwnedPointers from memalloc
_KEPT = [0]
_STATE: dict = {}  # "on": whether the pool serves this process; "ptds": per-thread streams


def size_class(n: int) -> int:
    """Bytes reserved for a request of n: n rounded up to an eighth of its power of two
    (at most 12.5% more), at least MIN_CLASS."""
    step = max(MIN_CLASS, 1 << max(0, n.bit_length() - 4))
    return -(-n // step) * step


def _on() -> bool:
    on = _STATE.get("on")
    if on is None:
        from numba.cuda.core import config

        on = _STATE["on"] = KEEP_BYTES > 0 and not devices.simulator_enabled()
        _STATE["ptds"] = bool(config.CUDA_PER_THREAD_DEFAULT_STREAM)
    return on


def _idle(bufs, i, dead=False) -> bool:
    """Whether bufs[i] may be handed out: only the pool refers to it, and no numba view.  A
    buffer whose context was torn down (cuda.close()) is never handed out again; `dead` is
    what to answer for it (True when dropping: forgetting it is all there is to do)."""
    if not _arena.idle(bufs, i):
        return False
    try:
        return bufs[i]._mem.refct == 1
    except ReferenceError:
        return dead


def _droppable(bufs, i) -> bool:
    return _idle(bufs, i, dead=True)


def _drop_idle(need: int) -> int:
    """Drop idle buffers until `need` more bytes fit under KEEP_BYTES (need < 0: all of
    them); numba-cuda frees them (deferred cuMemFree).  Called with _LOCK held."""
    return _arena.drop_idle(_BUFS, _KEPT, need, KEEP_BYTES, _droppable, lambda key: key[1])


def _array(keep, shape, dtype):
    from ._common import typed_array

    if POISON:
        keep.memset(0xFF)
    return typed_array(shape, dtype, keep)


def empty(shape, dtype):
    """A new C-contiguous numba device array of shape and dtype on the current device
    (contents undefined), from the pool when it is on."""
    from numba import cuda

    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    n = dtype.itemsize * math.prod(shape)
    if n == 0 or not _on():
        return cuda.device_array(shape, dtype)
    cls = size_class(n)
    ctx = cuda.current_context()
    key = (ctx.device.id, cls, threading.get_ident() if _STATE["ptds"] else None)

    def allocate():
        try:
            return ctx.memalloc(cls)
        except Exception:  # noqa: BLE001 - out of memory: give the idle buffers back, once
            if not _drop_idle(-1):
                raise
            ctx.deallocations.clear()
            return ctx.memalloc(cls)

    with _LOCK:
        keep = _arena.take(_BUFS, _KEPT, key, cls, KEEP_BYTES, PER_CLASS, _idle, allocate, _drop_idle)
        if keep is not None:
            return _array(keep, shape, dtype)
    return cuda.device_array(shape, dtype)


def empty_cache() -> int:
    """Free the idle buffers; returns the bytes freed."""
    with _LOCK:
        return _drop_idle(-1)


def kept_bytes() -> int:
    """Bytes the pool holds, in use or idle (for tests and the report)."""
    return _KEPT[0]


_arena.add_cache(empty_cache)
