"""Which device an array lives on, access to CUDA arrays without copies, and the
properties of the current GPU that the CUDA launch configurations are chosen from.

Host arrays are numpy arrays.  Device arrays are numba device arrays (the simulator's
``FakeCUDAArray`` included) and anything that exposes ``__cuda_array_interface__`` (CuPy
arrays, PyTorch CUDA tensors); the latter are wrapped zero-copy with
``numba.cuda.as_cuda_array``.  numba-cuda is imported only when a device array is actually
seen, so the CPU side works without it.
"""
from __future__ import annotations

import contextvars

import os
from dataclasses import dataclass


def _numba_array(arr) -> bool:
    return bool(getattr(type(arr), "__cuda_ndarray__", False))


def device_kind(arr):
    """'cuda' for a CUDA array (numba device array, simulator array, or any object with
    __cuda_array_interface__), else None (not an array we know).  A numba device array is
    recognised by its class first: hasattr(arr, "__cuda_array_interface__") evaluates the
    property, which builds the whole interface dict (2-3 us, several times per CUDA call;
    bench.gpu_overhead's host floor)."""
    if _numba_array(arr) or hasattr(arr, "__cuda_array_interface__"):
        return "cuda"
    return None


def _span(arr):
    """[lo, hi) of the bytes arr's elements occupy on the device.  A real numba device array's
    span is kept in its __dict__ (its pointer, shape and strides never change): validation
    asks for the spans of the same arrays, weights and outputs, several times a call
    (stubbed layer_norm: 3 overlap checks, 6 spans)."""
    if _numba_array(arr) and hasattr(arr, "device_ctypes_pointer"):
        d = arr.__dict__
        span = d.get("_nk_span")
        if span is None:
            span = d["_nk_span"] = _numba_span(arr)
        return span
    iface = arr.__cuda_array_interface__
    ptr = iface["data"][0]
    shape = iface["shape"]
    itemsize = _itemsize(iface["typestr"])
    strides = iface.get("strides")
    return _extent(ptr, shape, strides, itemsize)


def _numba_span(arr):
    """A real numba device array's span, from its pointer and layout (without building the
    interface dict)."""
    ptr = arr.device_ctypes_pointer.value or 0
    if arr.size and arr.is_c_contiguous():  # the common case, without the stride sums
        return ptr, ptr + arr.size * arr.dtype.itemsize
    return _extent(ptr, arr.shape, arr.strides, arr.dtype.itemsize)


def _extent(ptr, shape, strides, itemsize):
    if not shape or 0 in shape:
        return ptr, ptr
    if strides is None:
        n = 1
        for s in shape:
            n *= s
        return ptr, ptr + n * itemsize
    lo = ptr + sum(min(0, (d - 1) * s) for d, s in zip(shape, strides))
    hi = ptr + sum(max(0, (d - 1) * s) for d, s in zip(shape, strides)) + itemsize
    return lo, hi


def _itemsize(typestr: str) -> int:
    return int(typestr[2:])


def _sim_host(arr):
    """The numpy array behind a simulator device array (None for real device arrays)."""
    ary = getattr(arr, "_ary", None)
    if ary is not None and not hasattr(arr, "__cuda_array_interface__"):
        return ary
    return None


def overlaps(a, b) -> bool:
    """Whether two device arrays' memory ranges intersect (conservative, like
    numpy.may_share_memory)."""
    if device_kind(a) != "cuda" or device_kind(b) != "cuda":
        return False
    ha, hb = _sim_host(a), _sim_host(b)
    if ha is not None or hb is not None:
        if ha is None or hb is None:
            return False
        import numpy as np

        return bool(np.may_share_memory(ha, hb))
    a0, a1 = _span(a)
    b0, b1 = _span(b)
    return a0 < b1 and b0 < a1


def simulator_enabled() -> bool:
    """Whether numba's CUDA simulator is (to be) used in this process."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def cuda_module():
    """numba.cuda, or a clear error when the CUDA target cannot be used here.  Never
    falls back to the CPU."""
    try:
        from numba import cuda
    except Exception as exc:  # noqa: BLE001 - ImportError or a missing libcudart
        raise RuntimeError(
            "CUDA arrays were given but numba-cuda is not usable here "
            f"({exc}); install the extra: pip install '.[cuda]'"
        ) from exc
    try:
        available = cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken driver install
        available = False
    if not available:
        raise RuntimeError(
            "CUDA arrays were given but no CUDA GPU is available (and the simulator, "
            "NUMBA_ENABLE_CUDASIM=1, is not enabled); nothing is run on the CPU instead"
        )
    return cuda


def to_device(arr):
    """A host array copied to the current GPU as a C-ordered numba device array.  A bfloat16
    array (ml_dtypes) goes through its bits and is viewed back as bfloat16 on the device:
    the buffer protocol numba-cuda copies through cannot export that dtype ("cannot include
    dtype 'E' in a buffer" on an H200, 2026-11-26; the simulator took it)."""
    import numpy as np

    cuda = cuda_module()
    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":
        return cuda.to_device(a.view(np.uint16)).view(a.dtype)
    return cuda.to_device(a)


def as_device(arr):
    """A numba device array viewing the same memory (no copy)."""
    if arr is None:
        return None
    if getattr(type(arr), "__cuda_ndarray__", False):
        return arr
    cuda = cuda_module()
    return cuda.as_cuda_array(arr)


# ---- device properties -------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceProps:
    """What the CUDA launch configurations depend on."""

    name: str
    cc: tuple
    sm_count: int
    max_threads_per_block: int
    smem_per_block: int        # bytes of static shared memory a block may use
    smem_per_block_optin: int  # with the dynamic opt-in (cudaFuncSetAttribute)
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_sm: int
    simulated: bool = False


# The simulator has no device attributes: the launch configurations are chosen as for a
# small nominal part with 2 SMs and at most 128 threads per block, so that grid-stride
# loops really loop, "one wave" grids still have several blocks on the tiny test shapes,
# and the simulator (one Python thread per GPU thread, barriers polled) stays fast.
SIMULATED = DeviceProps("CUDA simulator (nominal: 2 SMs, <= 128 threads/block)", (8, 0), 2, 128,
                        48 * 1024, 48 * 1024, 164 * 1024, 65536, 2048, True)

# Nominal properties of the chips the PTX report and the performance model target.
CHIPS = {
    "sm_80": DeviceProps("A100 SXM 80GB", (8, 0), 108, 1024, 48 * 1024, 163 * 1024, 164 * 1024, 65536, 2048),
    "sm_87": DeviceProps("Jetson AGX Orin", (8, 7), 16, 1024, 48 * 1024, 163 * 1024, 164 * 1024, 65536, 1536),
    "sm_90": DeviceProps("H100 SXM", (9, 0), 132, 1024, 48 * 1024, 227 * 1024, 228 * 1024, 65536, 2048),
}

_props = None
# Chips assumed by `assume`, innermost last: per thread (a ContextVar), so a tool assuming a
# chip in one thread never changes the launches of real calls in another.
_assumed: contextvars.ContextVar[tuple] = contextvars.ContextVar("nk_assumed_chips", default=())


class assume:
    """``with devices.assume(CHIPS["sm_90"]):`` launch configurations are chosen for that
    chip in this thread (the PTX report and the performance model, which run without a GPU)."""

    def __init__(self, p: DeviceProps):
        self.p = p
        self._tokens = []

    def __enter__(self):
        self._tokens.append(_assumed.set(_assumed.get() + (self.p,)))
        return self.p

    def __exit__(self, *exc):
        _assumed.reset(self._tokens.pop())


def props() -> DeviceProps:
    """Properties of the current CUDA device (cached; the nominal SIMULATED ones under
    the simulator)."""
    global _props
    assumed = _assumed.get()
    if assumed:
        return assumed[-1]
    if _props is not None:
        return _props
    cuda = cuda_module()
    dev = cuda.get_current_device()
    if not hasattr(dev, "MULTIPROCESSOR_COUNT"):  # the simulator's FakeCUDADevice
        _props = SIMULATED
        return _props

    def attr(name, default):
        try:
            return int(getattr(dev, name))
        except Exception:  # noqa: BLE001
            return default

    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    smem = attr("MAX_SHARED_MEMORY_PER_BLOCK", 48 * 1024)
    _props = DeviceProps(
        name, tuple(dev.compute_capability), attr("MULTIPROCESSOR_COUNT", 1),
        attr("MAX_THREADS_PER_BLOCK", 1024), smem,
        attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", smem),
        attr("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", smem),
        attr("MAX_REGISTERS_PER_MULTIPROCESSOR", 65536),
        attr("MAX_THREADS_PER_MULTI_PROCESSOR", 2048),
    )
    return _props
