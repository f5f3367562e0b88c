"""Test-only warp primitives for numba's CUDA simulator, and three fixes to it (a race in
its shared-memory allocation, host-side shapes, a block manager that busy-polls).

The simulator runs every thread of a block as a Python thread but has no warp-level
primitives (``shfl_*_sync``, ``syncwarp``, ``ballot_sync``, ``activemask`` raise
AttributeError).  ``install()`` adds them to the simulator's fake ``cuda`` module,
emulated lane by lane: the lanes named in the mask publish their value in a per-warp slot
table, meet at a per-warp barrier and read the source lane's slot (two tables used
alternately, so the slots of one primitive are never overwritten while being read).  Semantics follow the PTX ISA for width 32: a source lane outside
[0, 32) (shfl_up/down) returns the lane's own value.  Reading a lane that is not in the
mask, or naming lanes that do not exist in the block, raises (it is undefined on
hardware), so a kernel that shuffles with exited lanes fails here instead of passing.
"""
from __future__ import annotations

import threading

_lock = threading.Lock()
TIMEOUT_S = 120.0


class _Barrier:
    """threading.Barrier's wait for `parties` threads, at about half its cost under the GIL.

    threading.Barrier is a Condition: every woken waiter re-acquires the condition's lock
    (31 lanes queue on it, a futex hand-off each) and takes it again to leave.  Here each
    waiter blocks on a lock of its own, which the last arrival releases: one wake-up per
    waiter.  tests/test_norm.py's 72 block-per-row float32 cases under the simulator
    (2026-11-27, Zen 5): 33.3 s (13.6 user, 25.1 system) -> 24.4 s (11.6, 15.8); the whole
    simulator step with the per-thread syncthreads gate below, 2 workers: 477 -> 338 s.
    A lane left waiting TIMEOUT_S (a kernel whose lanes exited before the primitive) raises.
    """

    def __init__(self, parties):
        self.parties = parties
        self.count = 0
        self.lock = threading.Lock()
        self.waiters = []

    def wait(self):
        with self.lock:
            self.count += 1
            if self.count == self.parties:
                self.count = 0
                waiters, self.waiters = self.waiters, []
                for w in waiters:
                    w.release()
                return
            w = threading.Lock()
            w.acquire()
            self.waiters.append(w)
        if not w.acquire(timeout=TIMEOUT_S):
            raise RuntimeError(f"a warp primitive waited {TIMEOUT_S} s for lanes that never came")


class _Warp:
    """Per-warp barrier and two slot tables used alternately: a lane writes table p, meets
    the others, reads table p; the next primitive uses table 1 - p, so one barrier per
    primitive suffices (a lane can only overwrite table p after every lane has passed the
    next barrier, i.e. finished reading it)."""

    def __init__(self, parties):
        self.barrier = _Barrier(parties)
        self.slots = ([None] * 32, [None] * 32)
        self.phase = [0] * 32

    def table(self, lane):
        p = self.phase[lane]
        self.phase[lane] = 1 - p
        return self.slots[p]


def _lane_warp():
    t = threading.current_thread()
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
    key = (tuple(t.blockIdx), warp, mask)
    with _lock:
        owner = getattr(t, "_manager", None)  # one BlockManager per launched block
        holder = owner.__dict__ if owner is not None else mod.__dict__
        table = holder.setdefault("_nk_warps", {})
        st = table.get(key)
        if st is None:
            st = table[key] = _Warp(bin(mask).count("1"))
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


def _event_driven_blocks(simkernel):
    """The simulator's BlockManager.run without its busy loop.

    numba-cuda's block manager polls every thread of the block (is_alive, a flag per
    thread) in a loop that never sleeps: it competes for the GIL with the threads it
    waits for, so every barrier costs a GIL hand-off to the poller.  Profiled on
    test_norm's block-per-row view test: 7.2 million is_alive calls, 10 of its 12 s.  Here
    the last thread to reach a syncthreads releases the others itself (a lock and a count
    per launched block), and the manager sleeps until the block's threads have ended or
    one raised.  Same semantics:
    when every live thread of the block waits in syncthreads they are all released; a
    thread that raised aborts the others and its exception is re-raised with its
    traceback.  tests/test_softmax.py under the simulator, alone: 102 s before, 44 s with
    this (51 s if the earlier cure, a 0.5 ms GIL switch interval, is kept as well: dropped).
    A thread blocked in syncthreads waits on a lock of its own (``_nk_gate``), released by
    the last arrival or an abort, not on the simulator's Event (a Condition, whose wake-up
    re-takes a shared lock).  tests/cuda/test_cuda_backend.py checks the barrier semantics
    and the re-raise."""
    import numpy as np

    BlockThread, BlockManager = simkernel.BlockThread, simkernel.BlockManager
    if getattr(BlockManager, "_nk_event_driven", False):
        return
    thread_run = BlockThread.run

    def release(m):  # under m._nk_cond: every live thread waits in syncthreads
        for t in m._nk_threads:
            if t.syncthreads_blocked:
                t.syncthreads_blocked = False
                t._nk_gate.release()
        m._nk_blocked = 0

    def run_thread(self):
        try:
            thread_run(self)  # records an exception on self.exception, as before
        finally:
            m = self._manager
            with m._nk_cond:
                m._nk_live -= 1
                if m._nk_blocked and m._nk_blocked == m._nk_live:
                    release(m)  # the others wait in syncthreads for no one else
                if m._nk_live == 0 or self.exception is not None:
                    m._nk_cond.notify()

    def syncthreads(self):
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        m = self._manager
        with m._nk_cond:
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            m._nk_blocked += 1
            if m._nk_blocked == m._nk_live:  # the last to arrive releases the others
                release(m)
                return
            self.syncthreads_blocked = True
            gate = self._nk_gate = threading.Lock()
            gate.acquire()
        gate.acquire()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def run_block(self, grid_point, *args):
        self._nk_cond = threading.Condition()
        self._nk_blocked = 0
        threads = self._nk_threads = []
        for block_point in np.ndindex(*self._block_dim):
            def target():
                self._f(*args)

            threads.append(BlockThread(target, self, grid_point, block_point, self._debug))
        self._nk_live = len(threads)
        for t in threads:
            t.start()
        with self._nk_cond:
            while True:
                failed = next((t for t in threads if t.exception), None)
                if failed is not None:
                    # abort the others, do not join them (as the simulator does)
                    for t in threads:
                        t.abort = True
                        if t.syncthreads_blocked:
                            t.syncthreads_blocked = False
                            t._nk_gate.release()
                    raise failed.exception[0].with_traceback(failed.exception[1])
                if self._nk_live == 0:
                    break
                self._nk_cond.wait()

    BlockThread.run = run_thread
    BlockThread.syncthreads = syncthreads
    BlockManager.run = run_block
    BlockManager._nk_event_driven = True


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

    _event_driven_blocks(simkernel)
    return True
