"""Input checks shared by every op and every target, with the error messages users see.

Each check raises TypeError (wrong kind or dtype) or ValueError (wrong shape, value or
aliasing) naming the argument, what was expected and what was given.  The op functions
call them before allocating or writing anything, so a failed call changes nothing.
Checks only use ``.shape``, ``.dtype`` and ``.ndim``, so they serve host and device arrays.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .registry import FLOAT_DTYPES
from . import devices


def device_of(**arrays) -> str:
    """'cpu' or 'cuda' for the named arrays (None entries skipped); mixing is an error."""
    found = None
    first = None
    for name, arr in arrays.items():
        if arr is None:
            continue
        if type(arr) is np.ndarray:
            dev = "cpu"
        elif isinstance(arr, np.ndarray):
            if isinstance(arr, (np.matrix, np.ma.MaskedArray)):
                raise TypeError(f"{name} must be a plain numpy array, got {type(arr).__name__} "
                                "(its semantics would be dropped silently): pass np.asarray(...)")
            dev = "cpu"  # np.ndarray and subclasses such as np.memmap
        else:
            dev = devices.device_kind(arr)
            if dev is None:
                raise TypeError(
                    f"{name} must be a numpy array or a CUDA device array, got {type(arr).__name__}"
                )
        if found is None:
            found, first = dev, name
        elif dev != found:
            raise ValueError(
                f"{name} is a {dev} array but {first} is a {found} array: "
                "all inputs and out= must be on the same device"
            )
    return found or "cpu"


def dtype_of(arr) -> np.dtype:
    """The numpy dtype of a host or device array (PyTorch CUDA tensors carry torch dtypes:
    their __cuda_array_interface__ typestr gives the numpy one)."""
    dt = arr.dtype
    if isinstance(dt, np.dtype):
        return dt
    return np.dtype(arr.__cuda_array_interface__["typestr"])


def is_bfloat16(dtype) -> bool:
    """ml_dtypes.bfloat16 (or any 2-byte dtype numpy calls bfloat16), recognised without
    importing ml_dtypes."""
    return getattr(dtype, "name", None) == "bfloat16" and getattr(dtype, "itemsize", 0) == 2


class _AnyBFloat16:
    """Equal to every bfloat16 numpy dtype (is_bfloat16): an entry of an Implementation's
    dtypes that names bfloat16 without importing ml_dtypes (an optional dependency)."""
    name = "bfloat16"

    def __eq__(self, other):
        return is_bfloat16(other)

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return self.name


BF16 = _AnyBFloat16()


def float_dtype(name: str, arr) -> np.dtype:
    dt = dtype_of(arr)
    if dt not in FLOAT_DTYPES and not (dt == np.float16 and not isinstance(arr, np.ndarray)):
        raise TypeError(f"{name} must have dtype float32 or float64, got {dt}")
    return dt


F16 = np.dtype(np.float16)
HALF_DTYPES = (BF16, F16)  # an Implementation's dtypes entry: the 16-bit formats of cpu_float_dtype


def is_half(dtype) -> bool:
    """bfloat16 or float16: a 16-bit format that the CPU kernels take as bits (half.py)."""
    return dtype == F16 or is_bfloat16(dtype)


def cpu_float_dtype(name: str, arr, device: str) -> np.dtype:
    """arr's dtype for an op that also takes 16-bit floats on the CPU (ml_dtypes.bfloat16 or
    float16, as PyTorch's bfloat16 / float16 ops: float32 inside, one rounding): float_dtype's
    float32 / float64 (and float16 on CUDA), or bfloat16 / float16 when device is "cpu"; a
    TypeError naming `name` and what it takes otherwise."""
    dt = dtype_of(arr)
    if device == "cpu" and is_half(dt):
        return dt
    try:
        return float_dtype(name, arr)
    except TypeError as e:
        raise TypeError(f"{e}{' (or bfloat16 / float16)' if device == 'cpu' else ''}") from None


def same_dtype(name: str, arr, ref_name: str, dtype) -> None:
    if arr.dtype != dtype and dtype_of(arr) != dtype:
        raise TypeError(
            f"{name} must have the same dtype as {ref_name} ({dtype}), got {dtype_of(arr)}; "
            "mixed dtypes are not cast silently"
        )


def rank(name: str, arr, expected, what: str = "") -> None:
    """expected: an int, or a (min, max) range."""
    lo, hi = (expected, expected) if isinstance(expected, int) else expected
    if not lo <= arr.ndim <= hi:
        want = f"{lo}" if lo == hi else (f"at least {lo}" if hi >= 64 else f"{lo} to {hi}")
        raise ValueError(f"{name} must have {want} dimensions{what}, got shape {tuple(arr.shape)}")


def shape(name: str, arr, expected: tuple, what: str = "") -> None:
    if tuple(arr.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}{what}, got {tuple(arr.shape)}")


def required(**arrays) -> None:
    """Array arguments that may not be None."""
    for name, arr in arrays.items():
        if arr is None:
            raise TypeError(f"{name} must be an array, got None")


def real(name: str, value) -> float:
    """A Python or numpy real number (not a bool, not a string, not a 0-d array) as float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number (int or float), got {type(value).__name__} {value!r}")
    return float(value)


def finite(name: str, value, positive: bool = False, dtype=None) -> float:
    """A finite real number (positive if asked); with dtype, also finite in that dtype
    (a float32 call cannot take a scale of 1e300: it would overflow to inf)."""
    v = real(name, value)
    if not math.isfinite(v) or (positive and v <= 0):
        raise ValueError(f"{name} must be a finite{' positive' if positive else ''} number, got {value!r}")
    if dtype is not None:
        largest = _LARGEST.get(dtype)
        if largest is None:
            dt = np.dtype(dtype)
            largest = _LARGEST[dtype] = float(np.finfo(dt).max) if dt.kind == "f" else math.inf
        if abs(v) > largest:
            raise ValueError(f"{name}={value!r} is not finite in {np.dtype(dtype)} (largest {largest:.3g})")
    return v


_LARGEST = {}  # dtype -> its largest finite value (np.finfo costs ~0.3 us a call)


_INT64_MIN, _INT64_MAX = -2 ** 63, 2 ** 63 - 1


def integer(name: str, value, dtype=np.int64) -> int:
    """A Python or numpy integer (not a bool) within dtype's range, as int."""
    if type(value) is int and dtype is np.int64 and _INT64_MIN <= value <= _INT64_MAX:
        return value  # the common case, without the dtype lookups (0.4 -> 0.1 us)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    lo, hi = _int_range(np.dtype(dtype))
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name}={value} is out of range: it must fit {np.dtype(dtype)} [{lo}, {hi}]")
    return int(value)


@functools.lru_cache(maxsize=None)
def _int_range(dtype):
    """(min, max) of an integer dtype: np.iinfo costs ~1.5 us a call, a tenth of a small routing call."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def flag(name: str, value) -> bool:
    """A Python or numpy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def choice(name: str, value, allowed) -> None:
    """value must be one of allowed, which are names (str) or None: anything else (a list
    passed by mistake) is a ValueError naming the argument, not 'unhashable type'."""
    if value is None or isinstance(value, str):
        ok = value in allowed
    else:  # choices are names (str) or None
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def axis(name: str, value, ndim: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not -ndim <= value < ndim:
        raise ValueError(f"{name}={value} is out of range for an array of {ndim} dimensions")
    return int(value) % ndim


def out(out, expected_shape: tuple, dtype, **inputs) -> None:
    """out= must have the result's shape and dtype, be writeable, and share no memory
    with any input (the kernel would read what it already overwrote)."""
    if out is None:
        return
    if tuple(out.shape) != tuple(expected_shape):
        raise ValueError(f"out must have shape {tuple(expected_shape)}, got {tuple(out.shape)}")
    if out.dtype != dtype and dtype_of(out) != dtype:
        raise TypeError(f"out must have dtype {dtype}, got {dtype_of(out)}")
    _written("out", out, "", "pass a separate output array", inputs)


def _written(name, arr, why, advice, inputs):
    """An array an op writes: writeable, and sharing no memory with any input (the kernel
    would read what it already overwrote)."""
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        raise ValueError(f"{name} must be writeable{why}, got a read-only array")
    for other, a in inputs.items():
        if a is None:
            continue
        if (np.may_share_memory(arr, a) and np.shares_memory(arr, a) if isinstance(arr, np.ndarray)
                else devices.overlaps(arr, a)):
            raise ValueError(f"{name} overlaps input {other}: {advice}")


def updated(name: str, arr, expected_shape: tuple, dtype, **inputs) -> None:
    """An input the op writes in place (a decode state: Op.updates) must have exactly this
    shape and dtype (it is not converted: the caller's array is the one updated), be
    writeable, and share no memory with any other input."""
    if tuple(arr.shape) != tuple(expected_shape):
        raise ValueError(f"{name} must have shape {tuple(expected_shape)}, got {tuple(arr.shape)}")
    if dtype_of(arr) != np.dtype(dtype):
        raise TypeError(f"{name} must have dtype {np.dtype(dtype)} (it is updated in place), got {dtype_of(arr)}")
    _written(name, arr, " (it is updated in place)", "it is updated in place, pass a separate array", inputs)


def broadcastable(name: str, arr_shape: tuple, target: tuple, target_desc: str) -> None:
    """arr_shape must broadcast to target (numpy rules, no new leading dims beyond target)."""
    if len(arr_shape) > len(target):
        raise ValueError(f"{name} of shape {tuple(arr_shape)} cannot broadcast to {target_desc} {tuple(target)}")
    for a, t in zip(arr_shape[::-1], target[::-1]):
        if a != 1 and a != t:
            raise ValueError(f"{name} of shape {tuple(arr_shape)} cannot broadcast to {target_desc} {tuple(target)}")
