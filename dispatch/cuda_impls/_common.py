"""Shared pieces of the CUDA implementations: the record type with its launch
configuration, device-array preparation, and lazy access to kernels_cuda.

Nothing here imports numba.cuda at import time: `kernels(name)` imports a kernels_cuda
module on first use (inside run), and device properties are read on first launch.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kernels_common import acc_dtype  # noqa: F401  (re-exported: the accumulation rule for launches)
from kernels_common.cuda_tiles import (VEC_BYTES, VEC_ROW_DTYPES, VEC_ROW_ELEMENTS, VEC_ROWS_MAX_THREADS,  # noqa: F401
                                       vec_width)

from .. import devices
from . import _pool
from ..registry import Implementation, register

CUDA_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
DEVICE_COPY_NOTE = "strided device inputs are copied to C order on the device first; a strided out= is filled by one device copy"


@dataclass
class CudaImplementation(Implementation):
    """An Implementation whose launch configuration depends on the call's shapes and the
    device: launch(params, *args) -> dict (what `explain` prints as "launch")."""

    launch: Callable[..., dict] | None = None

    def launch_config(self, call) -> dict:
        if self.launch is None:
            return {}
        return self.launch(self.params, *call.args)


def register_cuda(op: str, name: str, run, launch, *, kernels: tuple, notes="", params=None,
                  dtypes=CUDA_DTYPES, supports=None, tunables=None):
    """Register a CUDA implementation of op.  kernels: the kernels_cuda modules it launches
    (their sources version the implementation for the tuning cache).  An unknown op or a
    second registration of the same name raises (registry.RegistryError)."""
    mods = tuple(f"kernels_cuda.{k}" for k in kernels) + ("kernels_cuda._jit", "kernels_cuda.primitives")
    return register(CudaImplementation(op, name, "cuda", _in_one_context(run), dtypes=dtypes, supports=supports,
                                       notes=notes, params=dict(params or {}),
                                       tunables=dict(tunables or {}), kernel_modules=mods, launch=launch))


def _in_one_context(run):
    """run, called inside numba-cuda's context entered once (numba.cuda.require_context).
    Otherwise every numba-cuda call inside it (an allocation, a copy, each launch) looks the
    current context up again through the driver (cuCtxGetCurrent, cuCtxGetDevice) and its
    Python context managers.  On the lent H200 (bench.gpu_overhead, 2026-11-26, relu of
    128x3072 float32) dispatch.relu took 81.3 us a call without this and 77.9 us with it; one
    context held around many calls gave 68 us, but holding it would outlive the user's call.
    The decorator is looked up on the first call: numba.cuda loads only then."""
    wrapped = []

    @functools.wraps(run)  # the tuning cache versions an implementation by run.__module__
    def in_context(*args):
        if not wrapped:
            wrapped.append(devices.cuda_module().require_context(run))
        return wrapped[0](*args)

    return in_context


_mods: dict = {}
_TYPED_DIRECTLY: list = []  # non-empty once DeviceNDArray is registered with numba's typeof


def kernels(name: str):
    """kernels_cuda.<name>, imported on first use (this is where numba.cuda loads)."""
    mod = _mods.get(name)
    if mod is None:
        devices.cuda_module()  # clear error when no GPU and no simulator
        _type_device_arrays_directly()
        mod = _mods[name] = importlib.import_module(f"kernels_cuda.{name}")
    return mod


def _type_device_arrays_directly():
    """numba types a device-array launch argument through its generic path, which first tries
    the buffer protocol (an import and a raised TypeError) before it reads the array's
    ``_numba_type_``: 1.34 us an argument, 0.59 us with DeviceNDArray registered to read
    ``_numba_type_`` at once (numba.core.typing.typeof, this project's Xeon, 2026-11-26).  The
    type is the one the generic path returns; registered once, and not under the simulator
    (whose arrays are another class)."""
    if _TYPED_DIRECTLY or devices.simulator_enabled():
        return
    from numba.core.typing.typeof import typeof_impl
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    if DeviceNDArray not in typeof_impl.registry:
        typeof_impl.register(DeviceNDArray)(lambda val, c: val._numba_type_)
    _TYPED_DIRECTLY.append(True)


def props():
    return devices.props()


def as_input(a):
    """A C-contiguous numba device array with a's values (zero-copy when a is already
    contiguous; None stays None)."""
    if a is None:
        return None
    d = devices.as_device(a)
    if d.is_c_contiguous():
        return d
    return kernels("layout").copy(d, device_empty(tuple(d.shape), d.dtype))


_ARRAY_TYPES: dict = {}  # (dtype, ndim) -> numba's type of a C-contiguous device array


def c_view(d, *shape):
    """d, a C-contiguous device array (as as_input / output give them), viewed with `shape`
    (the same size) as a kernel argument.  A real numba device array's view is built directly
    and given its numba type (typed_array).  Anything else (the simulator's arrays, an empty
    or non-contiguous array) is reshaped by its own method."""
    cls = type(d)
    if cls.__name__ != "DeviceNDArray" or not hasattr(d, "gpu_data") or not d.size or not d.is_c_contiguous():
        return d.reshape(shape)
    n = 1
    for s in shape:
        n *= int(s)
    if n != d.size:
        raise ValueError(f"cannot view {d.size} elements as {shape}")
    return typed_array(shape, d.dtype, d.gpu_data, cls)


def typed_array(shape, dtype, gpu_data, cls=None):
    """A C-contiguous numba DeviceNDArray of shape and dtype over gpu_data, built directly and
    given its numba type, the one numba itself computes for a C-contiguous array (taken from
    the first such array): numba-cuda's reshape goes through its dummy-array layout code
    (4 us a view) and numba types every new array object again at launch (7 us against 1.7
    us for a typed one), on every call (bench.gpu_overhead --stub, this project's Xeon
    host, 2026-11-26)."""
    if cls is None:
        from numba.cuda.cudadrv.devicearray import DeviceNDArray as cls
    itemsize = dtype.itemsize
    strides, n = [], 1
    for s in reversed(shape):
        strides.append(n * itemsize)
        n *= int(s)
    v = cls(shape, tuple(reversed(strides)), dtype, gpu_data=gpu_data)
    key = (dtype, len(shape))
    t = _ARRAY_TYPES.get(key)
    if t is None:
        _ARRAY_TYPES.setdefault(key, v._numba_type_)  # numba's own answer, once per (dtype, ndim)
    else:
        v.__dict__["_numba_type_"] = t  # where functools.cached_property keeps it
    return v


def cp_async_refusal(params, p, switch: str, *arrays):
    """The refusals every cp.async / ldmatrix kernel shares (the GEMM's and attention's),
    None where none applies: switched off (params["tc_async"]; absent or None: the
    kernels_common.cuda_tiles constant named `switch`, read per call so a probe can flip
    it), a part before sm_80, or an array not on a 16-byte boundary (the copies move 16-byte
    chunks)."""
    from kernels_common import cuda_tiles

    on = params.get("tc_async")
    if on is None:
        on = getattr(cuda_tiles, switch)
    if not on:
        return f"it is switched off (params['tc_async'] / cuda_tiles.{switch})"
    if tuple(p.cc) < (8, 0):
        return f"compute capability {p.cc[0]}.{p.cc[1]} < 8.0 has no cp.async / ldmatrix"
    if not all(word_aligned(a, 16) for a in arrays):
        return "an input does not start on a 16-byte boundary"
    return None


def word_aligned(x, boundary: int = 4) -> bool:
    """Whether the array a kernel will read or write (as_input / output: x itself when it is a
    C-contiguous device array, else a new, aligned one) starts on a `boundary`-byte boundary:
    4 so that a float16 array reads as 32-bit words (pairs of halves), 16 for vector loads.
    Any device array (a PyTorch CUDA tensor too) is looked at as numba's; None passes."""
    if x is None or isinstance(x, np.ndarray):
        return True
    d = devices.as_device(x)
    if not hasattr(d, "device_ctypes_pointer") or not d.is_c_contiguous():  # the simulator's arrays; copies
        return True
    return (d.device_ctypes_pointer.value or 0) % boundary == 0


def vector_width(dtype, *arrays) -> tuple[int, str]:
    """(elements per 16-byte vector, "") when kernels may read and write these arrays of
    dtype in 16-byte vectors (kernels_cuda.primitives.vec_io: float16 / float32, each array
    starting on a 16-byte boundary), else (0, why not)."""
    dt = np.dtype(dtype)
    if dt.name not in VEC_ROW_DTYPES:
        return 0, f"{dt.name}: scalar loads (vectors: {', '.join(VEC_ROW_DTYPES)})"
    if not all(word_aligned(a, VEC_BYTES) for a in arrays):
        return 0, f"an input or out= does not start on a {VEC_BYTES}-byte boundary"
    return vec_width(dt.itemsize), ""


def row_vector(n: int, dtype, *arrays) -> tuple[int, str]:
    """vector_width() for the row kernels that hold a row in registers (kernels_cuda
    norm.make_vec / softmax.vec_rows), whose rows of n elements must each start on a 16-byte
    boundary too."""
    vec, why = vector_width(dtype, *arrays)
    if vec and n % vec:
        return 0, f"row length {n} is not a multiple of {vec} elements ({VEC_BYTES} bytes)"
    return vec, why


def words(d):
    """A flat uint32 view of a C-contiguous float16 device array of an even size: pairs of
    halves, the tensor-core kernels' operands."""
    if type(d).__name__ == "DeviceNDArray" and hasattr(d, "gpu_data"):
        return typed_array((d.size // 2,), np.dtype(np.uint32), d.gpu_data, type(d))
    return d.reshape(-1).view(np.uint32)  # the simulator's arrays


def device_empty(shape, dtype):
    """A new C-contiguous device array for a kernel's result or scratch (contents
    undefined), from the CUDA result pool (_pool.py)."""
    return _pool.empty(shape, dtype)


def device_copy(host):
    """A host array's values in a new C-contiguous device array from the result pool: the
    per-call tables and scalars the kernels read (cuda.to_device would allocate, and later
    free, device memory on every call: 45-75 us on the lent H200)."""
    host = np.ascontiguousarray(host)
    a = device_empty(host.shape, host.dtype)
    if host.size:
        a.copy_to_device(host)
    return a


def device_zeros(shape, dtype):
    """device_empty filled with zeros on the device (a memset; no host array copied over)."""
    a = device_empty(shape, dtype)
    mem = getattr(a, "gpu_data", None)
    if a.size and hasattr(mem, "memset"):
        mem.memset(0, a.size * a.dtype.itemsize)
    elif a.size:  # the simulator's arrays
        a.copy_to_device(np.zeros(a.shape, a.dtype))
    return a


def t_view(d):
    """The transpose of a 2-D device array as a zero-copy strided view.  numba-cuda's own
    DeviceNDArray.T copies through a transpose kernel that it compiles again on every call:
    about 100 ms a call on the lent H200 (2026-11-26), which made
    linear_cross_entropy_with_grad take 5.3 s for a GPT-2 LM head."""
    if type(d).__name__ != "DeviceNDArray" or not hasattr(d, "gpu_data"):
        return d.T  # the simulator's arrays: a numpy view
    n0, n1 = d.shape
    s0, s1 = d.strides
    return type(d)((n1, n0), (s1, s0), d.dtype, gpu_data=d.gpu_data)


def output(out, shape, dtype):
    """(buffer the kernel writes, out as a numba device array or None)."""
    o = devices.as_device(out) if out is not None else None
    if o is not None and o.is_c_contiguous():
        return o, o
    return device_empty(shape, dtype), o


def deliver(res, out_dev, out):
    """The public result: the numba device array written (res), or out= itself."""
    if out is None:
        return res
    if res is not out_dev:
        kernels("layout").copy(res, out_dev)
    return out


def size(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def occupancy_blocks(p, threads: int, smem: int = 0, regs: int = 32) -> int:
    """Resident blocks per SM for a block of `threads` threads, `smem` bytes of shared
    memory and `regs` registers per thread (the CUDA occupancy calculator, simplified)."""
    by_threads = p.max_threads_per_sm // threads
    by_smem = p.smem_per_sm // smem if smem else 32
    by_regs = p.regs_per_sm // max(1, regs * threads)
    return max(1, min(by_threads, by_smem, by_regs, 32))


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


_dummies: dict = {}


def dummy(dtype):
    """A 1-element device array standing for an absent optional input."""
    dt = np.dtype(dtype)
    d = _dummies.get(dt)
    if d is None:
        from numba import cuda

        d = _dummies.setdefault(dt, cuda.to_device(np.zeros(1, dt)))  # a racing thread keeps the first
    return d


def row_launch(params, rows: int, n: int, family: str, vector=None):
    """Warp-per-row or block-per-row launch for a row reduction of `rows` rows of `n`.
    vector: row_vector()'s answer for the call (None: a family without vector rows); a row
    that fits VEC_ROW_ELEMENTS a thread then runs on the kernel that holds it in registers
    ("<family>.warp_vec_rows" / ".block_vec_rows"), read and written 16 bytes at a time; the
    launch says which, and why not."""
    p = props()
    vec, why = vector or (0, "")
    if params.get("mode", "warp") == "warp":
        wpb = params["warps_per_block"]
        if vec and n > 32 * VEC_ROW_ELEMENTS:
            vec, why = 0, f"row length {n} > 32 lanes x {VEC_ROW_ELEMENTS}"
        cfg = {"kernel": f"{family}.warp_{'vec_' if vec else ''}rows", "grid": max(1, cdiv(rows, wpb)),
               "block": 32 * wpb, "rows_per_block": wpb, "elements_per_lane": cdiv(n, 32)}
    else:
        # block per row: about `per_thread` elements per thread, 32..1024 threads (one warp
        # for short rows: only when forced, the rule sends rows < 2048 to warp-per-row)
        block = min(p.max_threads_per_block, params["max_block"],
                    max(32, pow2_at_least(cdiv(n, params["per_thread"]))))
        if vec and not (block <= VEC_ROWS_MAX_THREADS and n <= block * VEC_ROW_ELEMENTS):
            vec, why = 0, f"row length {n} > {VEC_ROWS_MAX_THREADS} threads x {VEC_ROW_ELEMENTS}"
        cap = p.sm_count * occupancy_blocks(p, block) * params["waves"]
        cfg = {"kernel": f"{family}.block_{'vec_' if vec else ''}rows", "grid": max(1, min(rows, cap)), "block": block,
               "elements_per_thread": cdiv(n, block)}
    if vector is not None:
        cfg["vector"] = f"{vec} elements ({VEC_BYTES} bytes)" if vec else f"none: {why}"
    cfg["device"] = p.name
    return cfg
