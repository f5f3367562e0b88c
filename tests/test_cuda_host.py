"""The host side of the CUDA implementations, checked without a GPU where possible.

The result pool (dispatch/cuda_impls/_pool.py): a buffer is handed out again only once
nothing refers to it (no result, no kernel view, no numba view), from any thread; its size
classes, limit and switch.  Zero-copy transposed views, and no numba-cuda ``.T`` (which
compiles a transpose kernel on every call) anywhere in the CUDA implementations.

Without a GPU the pool runs over numba-cuda's own pointer classes (AutoFreePointer /
OwnedPointer, whose reference counting the pool reads) backed by host memory; on a real GPU
the same checks run on dispatch's results."""
import ast
import ctypes
import os
import pathlib
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

import dispatch
from dispatch.cuda_impls import _pool
from tests.support import ON_CUDA, SIMULATOR, TOL, assert_close, rng, to_host, to_target

drv = pytest.importorskip("numba.cuda.cudadrv.driver", reason="numba-cuda is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL_GPU = ON_CUDA and not SIMULATOR
# the simulator replaces numba-cuda's driver module (no AutoFreePointer to build on)
needs_driver_classes = pytest.mark.skipif(not hasattr(drv, "AutoFreePointer"),
                                          reason="numba-cuda's pointer classes (absent under the simulator)")


class _HostContext:
    """A numba-cuda context stand-in: memalloc returns what numba's does (an OwnedPointer over
    an AutoFreePointer, freed by finalizer when its last OwnedPointer goes), over host bytes."""

    def __init__(self):
        self.device = types.SimpleNamespace(id=0)
        self.deallocations = types.SimpleNamespace(clear=lambda: None)
        self.allocations = {}
        self.frees = 0

    def memalloc(self, n):
        buf = np.empty(n, np.uint8)
        ptr = buf.ctypes.data

        def free():
            self.allocations.pop(ptr, None)  # (cleared already when the context was torn down)
            self.frees += 1

        mem = drv.AutoFreePointer(None, ctypes.c_void_p(ptr), n, finalizer=free)
        self.allocations[ptr] = (mem, buf)  # numba's context keeps the AutoFreePointer alive so
        return mem.own()


def _plain(ctx, shape, dtype):
    """What cuda.device_array makes: an array owning its own allocation."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    dtype = np.dtype(dtype)
    strides = np.empty(shape, dtype).strides
    return DeviceNDArray(shape, strides, dtype, gpu_data=ctx.memalloc(max(1, dtype.itemsize * int(np.prod(shape)))))


@pytest.fixture
def host_pool(monkeypatch):
    """The pool, empty and on, over a _HostContext."""
    from numba import cuda

    ctx = _HostContext()
    monkeypatch.setattr(cuda, "current_context", lambda: ctx)
    monkeypatch.setattr(cuda, "device_array", lambda shape, dtype: _plain(ctx, shape, dtype))
    monkeypatch.setattr(_pool, "_STATE", {"on": True, "ptds": False})
    monkeypatch.setattr(_pool, "_BUFS", {})
    monkeypatch.setattr(_pool, "_KEPT", [0])
    monkeypatch.setattr(_pool, "KEEP_BYTES", 64 << 20)
    monkeypatch.setattr(_pool, "POISON", False)
    return ctx


def _ptr(a):
    return a.device_ctypes_pointer.value


def test_size_classes():
    for n in [1, 511, 512, 513, 4096, 4097, 1 << 20, (1 << 20) + 1, 3 * 10**7, 2**31 + 5]:
        c = _pool.size_class(n)
        assert n <= c <= max(n + _pool.MIN_CLASS - 1, n * 1.125), (n, c)
        assert _pool.size_class(c) == c, (n, c)  # a class is its own class


@needs_driver_classes
def test_reused_only_when_unreferenced(host_pool):
    from dispatch.cuda_impls._common import c_view

    a = _pool.empty((64, 32), np.float32)
    assert a.shape == (64, 32) and a.dtype == np.float32 and a.is_c_contiguous()
    b = _pool.empty((64, 32), np.float32)  # a is alive: another buffer
    assert _ptr(a) != _ptr(b)
    kv = c_view(a, 2048)                    # a kernel view shares a's gpu_data
    nv = b.gpu_data.view(1024)              # numba's own view (what slicing makes) holds no
    pa, pb = _ptr(a), _ptr(b)               # reference to the array, only to the allocation
    del a, b
    c = _pool.empty((64, 32), np.float32)
    assert _ptr(c) not in (pa, pb)
    del kv
    d = _pool.empty((2048,), np.float32)    # the same class: a's buffer is free now
    assert _ptr(d) == pa
    e = _pool.empty((2048,), np.float32)    # b's is still held by nv
    assert _ptr(e) not in (pa, pb, _ptr(c))
    del nv
    f = _pool.empty((2048,), np.float32)    # now b's buffer is the idle one
    assert _ptr(f) == pb
    assert len(host_pool.allocations) == 4 and host_pool.frees == 0


@needs_driver_classes
def test_limit_drops_idle_buffers_and_empty_cache(host_pool, monkeypatch):
    monkeypatch.setattr(_pool, "KEEP_BYTES", 3 << 20)
    a = _pool.empty((1 << 18,), np.float32)       # 1 MiB each
    b = _pool.empty((1 << 18,), np.float32)
    c = _pool.empty((1 << 18,), np.float32)
    assert _pool.kept_bytes() == 3 << 20
    d = _pool.empty((1 << 18,), np.float32)       # over the limit, none idle: a plain allocation
    assert _pool.kept_bytes() == 3 << 20 and len(host_pool.allocations) == 4
    del a, d
    e = _pool.empty((1 << 17,), np.float32)       # another class: a's idle buffer is dropped for it
    assert host_pool.frees == 2 and _pool.kept_bytes() == (2 << 20) + (512 << 10)
    del b, c, e
    assert dispatch.empty_cache() >= (2 << 20) + (512 << 10)
    assert _pool.kept_bytes() == 0 and not host_pool.allocations


@needs_driver_classes
def test_live_buffers_never_shared_across_threads(host_pool):
    errors = []
    barrier = threading.Barrier(4)

    def work(seed):
        g = np.random.default_rng(seed)
        try:
            barrier.wait()
            live = []
            for _ in range(200):
                if live and g.random() < 0.5:
                    live.pop(int(g.integers(len(live))))
                live.append(_pool.empty((int(g.integers(1, 4)) * 256,), np.float32))
                mine = [_ptr(x) for x in live]
                if len(set(mine)) != len(mine):
                    errors.append("one thread's live arrays share a buffer")
            all_live.append(live)
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    all_live = []
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    ptrs = [_ptr(x) for live in all_live for x in live]
    assert len(set(ptrs)) == len(ptrs)  # no two live arrays of any threads share a buffer


@pytest.mark.skipif(ON_CUDA, reason="read when dispatch is imported, whatever the device (the CPU step runs it)")
def test_garbage_limit_is_a_clear_error():
    env = dict(os.environ, NK_CUDA_POOL_MB="lots")
    r = subprocess.run([sys.executable, "-c", "import dispatch"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "NK_CUDA_POOL_MB='lots'" in r.stderr and "MiB" in r.stderr
    env["NK_CUDA_POOL_MB"] = "0"
    r = subprocess.run([sys.executable, "-c", "from dispatch.cuda_impls import _pool; print(_pool.KEEP_BYTES)"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr


@pytest.mark.skipif(not REAL_GPU, reason="the pool serves real GPUs only (off under the simulator)")
def test_results_on_a_gpu_reuse_memory_only_when_free():
    x = to_target(rng().standard_normal((256, 1024)).astype(np.float32))
    ref = to_host(x).astype(np.float64)
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    dispatch.empty_cache()
    y = dispatch.softmax(x)
    y2 = dispatch.softmax(x)
    assert _ptr(y) != _ptr(y2)
    part = y[3:]                            # numba's slice keeps y's buffer
    py, seen = _ptr(y), {_ptr(y), _ptr(y2)}
    del y, y2
    y3 = dispatch.softmax(x)                # y2's buffer is free, y's is not
    assert _ptr(y3) != py
    assert_close(to_host(part), ref[3:], TOL[np.dtype(np.float32)], "softmax held by a slice")
    seen.add(_ptr(y3))
    del part, y3
    y4 = dispatch.softmax(x)
    assert _ptr(y4) in seen
    assert_close(to_host(y4), ref, TOL[np.dtype(np.float32)], "softmax in a reused buffer")


@needs_driver_classes
def test_t_view_is_the_zero_copy_transpose(host_pool):
    from dispatch.cuda_impls._common import t_view

    a = _pool.empty((6, 10), np.float32)
    s = a.gpu_data.view(8)  # columns 2.. of every row, as numba's slice a[:, 2:] would be
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    part = DeviceNDArray((6, 8), (40, 4), np.float32, gpu_data=s)
    t = t_view(part)
    host = np.lib.stride_tricks.as_strided(np.empty(1, np.float32), (6, 8), (40, 4)).T
    assert t.shape == (8, 6) and t.strides == host.strides
    assert _ptr(t) == _ptr(part) and not t.is_c_contiguous()


def test_no_numba_transpose_in_the_cuda_implementations():
    """numba-cuda's DeviceNDArray.T / .transpose() compiles a transpose kernel on every call
    (about 100 ms on the lent H200, 2026-11-26): the CUDA implementations use t_view.  A
    line that transposes a host (numpy) or simulator array says so in its comment."""
    root = pathlib.Path(ROOT) / "dispatch" / "cuda_impls"
    found = []
    for path in sorted(root.glob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Attribute) and node.attr in ("T", "transpose", "swapaxes"):
                line = lines[node.lineno - 1]
                comment = line.split("#", 1)[1] if "#" in line else ""
                if "host" not in comment and "simulator" not in comment:
                    found.append(f"{path.name}:{node.lineno}: {line.strip()}")
    assert not found, found


@needs_driver_classes
def test_device_arrays_typed_as_numba_types_them(host_pool):
    """_type_device_arrays_directly registers DeviceNDArray with numba's typeof; the types it
    gives are the ones numba's generic path gives (C, F and strided layouts, 1-4 dims)."""
    from numba.core.typing.typeof import Purpose, _TypeofContext, typeof, typeof_impl
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    from dispatch.cuda_impls import _common as C

    base = _pool.empty((4, 6, 8, 2), np.float32)
    arrays = [base, C.c_view(base, 384), C.c_view(base, 48, 8), C.t_view(C.c_view(base, 48, 8)),
              DeviceNDArray((4, 3), (192, 8), np.float32, gpu_data=base.gpu_data)]
    generic = typeof_impl.dispatch(object)  # numba's own path for a class it has no entry for
    want = []
    for a in arrays:
        a.__dict__.pop("_numba_type_", None)  # typed afresh, not from a cached attribute
        want.append(generic(a, _TypeofContext(Purpose.argument)))
        a.__dict__.pop("_numba_type_", None)
    C._type_device_arrays_directly()
    assert typeof_impl.dispatch(DeviceNDArray) is not generic
    assert [typeof(a, Purpose.argument) for a in arrays] == want
    assert [str(t.layout) for t in want] == ["C", "C", "C", "F", "A"]


@needs_driver_classes
def test_buffers_of_a_torn_down_context_are_never_handed_out(host_pool):
    a = _pool.empty((256,), np.float32)
    del a
    host_pool.allocations.clear()   # what cuda.close() does to numba's context: the pointers die
    b = _pool.empty((256,), np.float32)
    (bufs,) = _pool._BUFS.values()
    assert len(bufs) == 2 and bufs[1] is b.gpu_data  # a new buffer, not the dead one
    del b
    assert dispatch.empty_cache() == 2 * 1024  # the dead one is forgotten, b's freed
    assert not _pool._BUFS and _pool.kept_bytes() == 0
