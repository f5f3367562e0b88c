"""Test-only warp primitives for numba's CUDA simulator, and three changes to it (a race in
its shared-memory allocation, host-side shapes, a block's threads as greenlets).

The simulator runs every thread of a block as a Python thread but has no warp-level
primitives (``shfl_*_sync``, ``syncwarp``, ``ballot_sync``, ``activemask`` raise
AttributeError).  ``install()`` adds them to the simulator's fake ``cuda`` module,
emulated lane by lane: the lanes named in the mask publish their value in a per-warp slot
table, meet at a per-warp barrier and read the source lane's slot (two tables used
alternately, so the slots of one primitive are never overwritten while being read).
Semantics follow the PTX ISA for width 32: a source lane outside [0, 32) (shfl_up/down)
returns the lane's own value.  Reading a lane that is not in the mask, or naming lanes
that do not exist in the block, raises (it is undefined on hardware), so a kernel that
shuffles with exited lanes fails here instead of passing; lanes waiting for lanes that
have exited are reported as a deadlock.

``install()`` also runs each block's threads as greenlets in one OS thread
(``_greenlet_blocks``): the barriers' GIL hand-offs gone, CI's simulator step went from
958 to 324 CPU seconds (2026-11-28, Zen 4-class EPYC, with mma_16816's twin vectorized).  greenlet is a test dependency (pyproject's `test`
extra) for this alone.
"""
from __future__ import annotations

import collections
import threading

import greenlet
import numpy as np


class _Barrier:
    """A barrier for `parties` simulated threads of one block (a warp primitive's lanes).

    The block's threads are greenlets run by one scheduler (``_greenlet_blocks``): a lane
    that arrives early goes back to the scheduler; the last arrival puts the others back
    on the block's ready queue and goes on.  A barrier whose lanes never all come (lanes
    that exited before a warp primitive) leaves the block with nothing to run, which the
    scheduler reports as a deadlock."""

    def __init__(self, parties, manager):
        self.parties = parties
        self.manager = manager
        self.waiters = []

    def wait(self):
        waiters = self.waiters
        if len(waiters) + 1 == self.parties:
            self.waiters = []
            self.manager._nk_ready.extend(waiters)
            return
        me = greenlet.getcurrent()
        waiters.append(me)
        me.parent.switch()
        if self.manager._nk_abort:
            raise RuntimeError("abort flag set on a warp barrier")


class _Warp:
    """Per-warp barrier and two slot tables used alternately: a lane writes table p, meets
    the others, reads table p; the next primitive uses table 1 - p, so one barrier per
    primitive suffices (a lane can only overwrite table p after every lane has passed the
    next barrier, i.e. finished reading it)."""

    def __init__(self, parties, manager):
        self.barrier = _Barrier(parties, manager)
        self.slots = ([None] * 32, [None] * 32)
        self.phase = [0] * 32

    def table(self, lane):
        p = self.phase[lane]
        self.phase[lane] = 1 - p
        return self.slots[p]


def _lane_warp():
    t = greenlet.getcurrent()
    tid = t.thread_id
    return t, tid & 31, tid >> 5


def _state(mod, mask):
    t, lane, warp = _lane_warp()
    bdim = mod.blockDim
    nthreads = bdim.x * bdim.y * bdim.z
    lanes_here = min(32, nthreads - 32 * warp)
    existing = (1 << lanes_here) - 1
    mask = int(mask) & 0xFFFFFFFF
    if mask & ~existing:
        raise RuntimeError(
            f"warp primitive with mask {mask:#x} names lanes that do not exist "
            f"(warp {warp} has {lanes_here} lanes)")
    if not (mask >> lane) & 1:
        raise RuntimeError(f"lane {lane} calls a warp primitive with mask {mask:#x} that excludes it")
    # State per block launch (kept on the simulator's block manager, which every thread of
    # one launched block shares): a table kept across launches leaked a lane-phase or
    # barrier left inconsistent by an earlier launch that raised midway, and later kernels
    # with the same blockIdx then read stale slots (a wrong result seen once in CI).
    key = (warp, mask)
    table = t._manager._nk_warps  # one BlockManager per launched block, one OS thread
    st = table.get(key)
    if st is None:
        st = table[key] = _Warp(bin(mask).count("1"), t._manager)
    return st, lane, mask


def _exchange(mod, mask, value, src_of):
    st, lane, mask = _state(mod, mask)
    slots = st.table(lane)
    slots[lane] = value
    st.barrier.wait()
    src = src_of(lane)
    if src is None:
        return value
    if not (mask >> src) & 1:
        raise RuntimeError(f"lane {lane} reads lane {src}, which is not in mask {mask:#x}")
    return slots[src]


def shfl_sync(self, mask, value, src_lane):
    return _exchange(self, mask, value, lambda lane: int(src_lane) & 31)


def shfl_up_sync(self, mask, value, delta):
    return _exchange(self, mask, value, lambda lane: lane - int(delta) if lane - int(delta) >= 0 else None)


def shfl_down_sync(self, mask, value, delta):
    return _exchange(self, mask, value, lambda lane: lane + int(delta) if lane + int(delta) < 32 else None)


def shfl_xor_sync(self, mask, value, lane_mask):
    return _exchange(self, mask, value, lambda lane: (lane ^ int(lane_mask)) & 31)


def syncwarp(self, mask=0xFFFFFFFF):
    st, _, _ = _state(self, mask)
    st.barrier.wait()


def ballot_sync(self, mask, predicate):
    st, lane, mask = _state(self, mask)
    slots = st.table(lane)
    slots[lane] = bool(predicate)
    st.barrier.wait()
    bits = 0
    for i in range(32):
        if (mask >> i) & 1 and slots[i]:
            bits |= 1 << i
    return bits


def activemask(self):
    _, _, warp = _lane_warp()
    bdim = self.blockDim
    lanes_here = min(32, bdim.x * bdim.y * bdim.z - 32 * warp)
    return (1 << lanes_here) - 1


_shared_lock = threading.Lock()


def _shared_array(self, shape, dtype, alignment=None):
    """numba-cuda's FakeCUDAShared.array with its first-allocation race closed.

    The simulator gives every thread of a block the same array for one
    ``cuda.shared.array`` line by looking the caller's (file, line) up in a dict and
    creating the array when missing - without a lock.  Two threads that reach the line
    together both miss, both create an array, and the one whose array is replaced in the
    dict runs the whole kernel on a private "shared" array: its writes are invisible to
    the block and it reads uninitialized memory.  That is the intermittent wrong/NaN row
    of attention's flash kernel seen in CI (3 different tests, about 1 full run in 2; a
    stress loop of the attention file reproduced it once in 7 runs).  Same semantics
    otherwise (per-launch allocations keyed by the calling line, dynamic shared memory for
    shape 0), except that an alignment is honoured instead of refused."""
    import sys

    import numpy as np
    from numba.cuda.simulator.kernelapi import numpy_support, types  # the simulator's own

    if alignment is not None and (not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1)):
        raise ValueError(f"alignment {alignment!r} is not a positive power of two")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _shared_lock:
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = _aligned_empty(shape, np.dtype(dtype), alignment or 1)
    return res


def _aligned_empty(shape, dtype, alignment):
    """np.empty whose data starts on a multiple of alignment bytes (the simulator's own
    shared.array refuses an alignment; kernels that ask for one, for cp.async and ldmatrix,
    run here unchanged)."""
    import numpy as np

    count = int(np.prod(shape, dtype=np.int64))
    buf = np.empty(count * dtype.itemsize + alignment, np.uint8)
    skip = (-buf.ctypes.data) % alignment
    return buf[skip:skip + count * dtype.itemsize].view(dtype).reshape(shape)


class _SimThread(greenlet.greenlet):
    """One simulated CUDA thread: a greenlet carrying what the simulator's BlockThread
    carries (threadIdx, blockIdx, thread_id, its block's manager, syncthreads*)."""

    def syncthreads(self):
        self._manager._nk_sync(self)

    def _reduce(self, value, fold):
        m = self._manager
        m.block_state[self.threadIdx.x, self.threadIdx.y, self.threadIdx.z] = value
        self.syncthreads()
        r = fold(m.block_state)
        self.syncthreads()
        return r

    def syncthreads_count(self, value):
        return self._reduce(value, np.count_nonzero)

    def syncthreads_and(self, value):
        return self._reduce(value, lambda s: 1 if np.all(s) else 0)

    def syncthreads_or(self, value):
        return self._reduce(value, lambda s: 1 if np.any(s) else 0)

    def __str__(self):
        return "Thread <<<%s, %s>>>" % (self.blockIdx, self.threadIdx)


def current_thread():
    """The simulated thread running now (inside a simulated block), else the OS thread."""
    g = greenlet.getcurrent()
    return g if isinstance(g, _SimThread) else threading.current_thread()


class _ThreadingForSimulator:
    """The `threading` module as the simulator's kernel API sees it: the same, except that
    current_thread() is the simulated thread (it reads threadIdx, blockIdx and syncthreads
    from there)."""

    current_thread = staticmethod(current_thread)

    def __getattr__(self, name):
        return getattr(threading, name)


def _greenlet_blocks(simkernel, kernelapi):
    """The simulator's BlockManager.run with the block's threads as greenlets in one OS
    thread, switched at barriers, instead of one OS thread each.

    numba-cuda runs every CUDA thread as a Python thread: each barrier is a GIL hand-off
    and a futex wake-up per thread, and the threads' GIL contention cost more than the
    kernels' own Python code.  Profiled (py-spy --gil, 2026-11-28, Zen 4-class EPYC):
    test_tensor_core_paths' cp.async tile test held the GIL for 37 s of its 82 s wall (65 s
    user, 26 s system).  Here a scheduler switches to each ready thread in turn; a thread
    runs until it reaches a barrier (syncthreads, or a warp primitive's ``_Barrier``) or
    ends; the last arrival at a barrier puts the others back on the ready queue.

    Same semantics as the simulator's manager: every phase sees all writes of the one
    before; threads that return early do not hold the others at later barriers (a
    syncthreads completes when every live thread waits in it); a thread that raises aborts
    the others (they unwind, so the simulator's module swaps are undone) and its exception
    is re-raised with the thread and block named, and its traceback.  A block with live
    threads and none ready (a barrier that can never complete) raises at once, where the
    threaded simulator hung.  Threads run in order of thread index to the next barrier,
    deterministically: a missing barrier shows on every run (a thread reading what a later
    thread writes gets the old value), not by chance.  tests/cuda/test_cuda_backend.py
    checks the barrier semantics, the deadlock report and the re-raise."""
    BlockManager = simkernel.BlockManager
    if getattr(BlockManager, "_nk_greenlets", False):
        return

    def sync(self, t):  # syncthreads of simulated thread t
        if self._nk_abort:
            raise RuntimeError("abort flag set on syncthreads call")
        blocked = self._nk_blocked
        blocked.append(t)
        if len(blocked) == self._nk_live:  # the last to arrive releases the others
            blocked.pop()
            self._nk_ready.extend(blocked)
            self._nk_blocked = []
            return
        t.parent.switch()
        if self._nk_abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def run_block(self, grid_point, *args):
        f = self._f
        bdim = self._block_dim
        block_idx = kernelapi.Dim3(*grid_point)
        self._nk_abort = False
        self._nk_blocked = []
        self._nk_warps = {}
        threads = []
        for block_point in np.ndindex(*bdim):
            t = _SimThread(run=lambda: f(*args))
            t._manager = self
            t.blockIdx = block_idx
            t.threadIdx = kernelapi.Dim3(*block_point)
            t.thread_id = block_point[0] + bdim[0] * (block_point[1] + bdim[1] * block_point[2])
            threads.append(t)
        self._nk_live = len(threads)
        ready = self._nk_ready = collections.deque(threads)
        while ready:
            t = ready.popleft()
            try:
                t.switch()
            except BaseException as e:
                self._nk_abort = True
                for other in threads:  # unwind the others (their finally blocks run)
                    if not other.dead:
                        other.throw()
                msg = f"tid={list(t.threadIdx)} ctaid={list(t.blockIdx)}" + (f": {e}" if str(e) else "")
                try:
                    err = type(e)(msg)
                except Exception:  # an exception type that takes other arguments
                    raise e
                raise err.with_traceback(e.__traceback__) from None
            if t.dead:
                self._nk_live -= 1
                blocked = self._nk_blocked
                if blocked and len(blocked) == self._nk_live:  # they wait for no one else
                    ready.extend(blocked)
                    self._nk_blocked = []
        if self._nk_live:
            waiting = [t for t in threads if not t.dead]
            self._nk_abort = True
            for t in waiting:
                t.throw()
            raise RuntimeError(
                f"deadlock in block {list(block_idx)}: {len(waiting)} threads wait at barriers that "
                f"can never complete (threads exited before a syncthreads or warp primitive "
                f"they were named in?), first {list(waiting[0].threadIdx)}")

    BlockManager._nk_sync = sync
    BlockManager.run = run_block
    BlockManager._nk_greenlets = True
    kernelapi.threading = _ThreadingForSimulator()


_NAMES = ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "syncwarp",
          "ballot_sync", "activemask")


def install() -> bool:
    """Add the emulated primitives to the simulator (no-op without the simulator, where
    the real ones exist).  Returns whether it installed them."""
    from numba import cuda

    if not getattr(cuda, "simulator_enabled", False) and "simulator" not in cuda.__name__:
        from numba import config

        if not getattr(config, "ENABLE_CUDASIM", 0):
            return False
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator import kernelapi
    from numba.cuda.simulator.cudadrv import devicearray

    for name in _NAMES:
        setattr(kernelapi.FakeCUDAModule, name, globals()[name])
    kernelapi.FakeCUDAShared.array = _shared_array

    # Host-side shapes: a real numba device array's .shape is a plain tuple (x.shape[-1]
    # works, and the op describes use it); the simulator returns its FakeShape, which
    # rejects negative indices, everywhere.  Keep FakeShape inside kernels (as on the GPU)
    # and give host code a plain tuple.
    def shape(self):
        if simkernel._kernel_context is None:
            return tuple(self._ary.shape)
        return devicearray.FakeShape(self._ary.shape)

    devicearray.FakeCUDAArray.shape = property(shape)

    _greenlet_blocks(simkernel, kernelapi)
    return True
