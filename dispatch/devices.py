"""Which device an array lives on, and access to CUDA arrays without copies.

Host arrays are numpy arrays.  Device arrays are numba device arrays and anything that
exposes ``__cuda_array_interface__`` (CuPy arrays, PyTorch CUDA tensors); they are wrapped
zero-copy with ``numba.cuda.as_cuda_array``.  numba-cuda is imported only when a device
array is actually seen, so the CPU side works without it.
"""
from __future__ import annotations


def device_kind(arr):
    """'cuda' for an object with __cuda_array_interface__, else None (not an array we know)."""
    if hasattr(arr, "__cuda_array_interface__"):
        return "cuda"
    return None


def _span(arr):
    iface = arr.__cuda_array_interface__
    ptr = iface["data"][0]
    shape = iface["shape"]
    itemsize = _itemsize(iface["typestr"])
    strides = iface.get("strides")
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


def overlaps(a, b) -> bool:
    """Whether two device arrays' memory ranges intersect (conservative, like
    numpy.may_share_memory)."""
    if device_kind(a) != "cuda" or device_kind(b) != "cuda":
        return False
    a0, a1 = _span(a)
    b0, b1 = _span(b)
    return a0 < b1 and b0 < a1


def cuda_module():
    """numba.cuda, or a clear error when the CUDA target cannot be used here."""
    try:
        from numba import cuda
    except Exception as exc:  # noqa: BLE001 - ImportError or a missing libcudart
        raise RuntimeError(
            "CUDA arrays were given but numba-cuda is not usable here "
            f"({exc}); install the extra: pip install '.[cuda]'"
        ) from exc
    if not cuda.is_available():
        raise RuntimeError(
            "CUDA arrays were given but no CUDA GPU is available (and the simulator, "
            "NUMBA_ENABLE_CUDASIM=1, is not enabled)"
        )
    return cuda


def as_device(arr):
    """A numba device array viewing the same memory (no copy)."""
    if arr is None:
        return None
    cuda = cuda_module()
    if cuda.is_cuda_array(arr) and hasattr(arr, "copy_to_host"):
        return arr
    return cuda.as_cuda_array(arr)
