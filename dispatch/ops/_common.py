"""Helpers shared by the op modules: preparing host arrays for kernels, the serial/parallel
shape rule, and the default benchmark signature.  Kernels take C-contiguous, writeable-typed
arrays; these helpers make the copies (stated in `explain`) and route results into ``out=``."""
from __future__ import annotations

import functools

import numpy as np

from ..registry import Rule, bucket, draw_normal
from . import _arena

HOST_COPY_NOTE = "non-contiguous host inputs are copied to C order first; a non-contiguous out= is filled by one copy"


class _Alias:
    """Exposes a read-only array's memory through the array interface with the read-only
    flag cleared (see `kernel_input`).  Holds the array, so the memory stays alive."""

    __slots__ = ("__array_interface__", "_keep")

    def __init__(self, a):
        iface = dict(a.__array_interface__)
        iface["data"] = (iface["data"][0], False)
        self.__array_interface__ = iface
        self._keep = a


def kernel_input(x, *, rows=False):
    """x as a C-contiguous base-class ndarray for a kernel (None stays None).

    A non-contiguous x is copied, unless ``rows`` and its rows are in place already (see
    rows_input).  A read-only x (np.broadcast_to views, arrays with writeable=False,
    read-only memmaps) is passed as a writeable-typed alias of the same memory: numba
    types read-only arrays differently, so they would compile a second specialization of
    every kernel on first use (seconds, and a warning), and a kernel signature that ties
    an input to an output buffer would not type at all.  Kernels never write their
    inputs, so the alias is only a typing device."""
    if x is None:
        return x
    if type(x) is not np.ndarray:
        x = x.view(np.ndarray)       # np.memmap and other ndarray subclasses: same memory
    if not x.flags.c_contiguous and not (rows and _unit_stride_rows(x)):
        return np.ascontiguousarray(x)
    if not x.flags.writeable:
        alias = np.asarray(_Alias(x))
        # the array interface spells ml_dtypes' bfloat16 as void ("|V2"): its dtype restored
        return alias if alias.dtype == x.dtype else alias.view(x.dtype)
    return x


contiguous = kernel_input


def kernel_rows(x, d):
    """kernel_input(x) as a 2-D array of rows of d (a view; no reshape when it is 2-D
    already): what the row kernels over the last axis (norms and their backward) take."""
    x = kernel_input(x)
    return x if x.ndim == 2 else x.reshape(-1, d)


@functools.lru_cache(maxsize=64)
def const_vector(n, dtype, value):
    """A length-n vector of value (a norm's absent weight or bias), made once per (n, dtype,
    value) and shared: read-only, passed as a writeable-typed alias so that the kernel
    compiled for a user's weight serves it too (the kernels never write their weight)."""
    v = np.full(n, value, dtype)
    v.flags.writeable = False
    return contiguous(v)


def _unit_stride_rows(x):
    it = x.itemsize
    return x.ndim > 0 and x.strides[-1] == it and all(s > 0 and s % it == 0 for s in x.strides[:-1])


def rows_input(x):
    """x for a kernel that reads it row by row (its last axis) through numba indexing, so
    that any positive strides work: a view whose last axis has unit stride and whose other
    strides are positive multiples of the item size (a transposed or sliced view of a
    (B, S, H, D) projection: attention's q/k/v) is passed as it is, with no copy; anything
    else as kernel_input (broadcast, zero-stride views are copied)."""
    return kernel_input(x, rows=True)


def result_buffer(out, shape, dtype, *, rows=False):
    """Where the kernel writes: out itself when it is C-contiguous, or with ``rows`` (a
    kernel that writes row by row through numba indexing, as rows_input reads) when its
    rows have unit stride and no two elements share memory (the (B, Hq, Sq, D) transposed
    view of a (B, Sq, Hq, D) buffer, which a transformer layer reshapes to (B*Sq, Hq*D)
    for free); else a fresh array (from the result arena, _arena.py) that deliver() copies
    into out."""
    if out is not None and out.flags.c_contiguous:
        return out
    if (rows and out is not None and type(out) is np.ndarray and _unit_stride_rows(out)
            and _no_self_overlap(out)):
        return out
    return _arena.empty(shape, dtype)


def _no_self_overlap(x):
    """True when no two elements of x share memory: with the axes ordered by stride, each
    stride is at least the extent (stride x (size - 1) + item) spanned by the smaller ones
    (sufficient, and exact for the views that slicing and transposing make)."""
    span = x.itemsize
    for st, n in sorted((st, n) for st, n in zip(x.strides, x.shape) if n > 1):
        if st < span:
            return False
        span = st * (n - 1) + span
    return True


def deliver(res, out):
    """The public result: res, copied into out= when the kernel could not write there."""
    if out is None or res is out:
        return res
    out[...] = res
    return out


def serial_parallel_rule(size_field: str, threshold: int, measured: str) -> Rule:
    """CPU rule for ops with a serial and a parallel kernel: serial below ``threshold``
    elements (the key's ``size_field`` holds the bucketed size), parallel at or above."""

    def choose(key):
        n = getattr(key, size_field)
        if n < threshold:
            return ("cpu-serial", "cpu-parallel"), f"size bucket {n} < {threshold}: threads cost more than they give ({measured})"
        return ("cpu-parallel", "cpu-serial"), f"size bucket {n} >= {threshold}: threads pay off ({measured})"

    return Rule(("cpu-serial", "cpu-parallel"), choose)


def size_bucket(*shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return bucket(n)


def case_dtype(params, dtype):
    """A benchmark case's input dtype: the run's, or the 16-bit format of a case with
    activations="bfloat16" (ml_dtypes.bfloat16: a bfloat16 model's tensors; ml_dtypes is a
    test and benchmark dependency, imported only then) or activations="float16"."""
    act = params.get("activations")
    if act == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    if act == "float16":
        return np.dtype(np.float16)
    return dtype


def supports_of(refusal):
    """An implementation's supports(key) from its refusal(key) (a reason, or None when it can
    take the key)."""
    def supports(key) -> list:
        why = refusal(key)
        return [] if why is None else [why]

    return supports


def thread_buffer(local, name, size, dtype, keep):
    """The first `size` elements of the calling thread's buffer `name` (an attribute of the
    threading.local `local`), on a cache line (kernels_common.memory.aligned_empty: AMX
    tile rows, zmm loads), grown when short and kept for the thread's next call when it has
    at most `keep` elements (a fresh buffer pays its page faults on every call).  Per
    Python thread: the kernels release the GIL."""
    buf = getattr(local, name, None)
    if buf is None or buf.size < size:
        from kernels_common.memory import aligned_empty
        buf = aligned_empty(size, dtype)
        if size <= keep:
            setattr(local, name, buf)
    return buf[:size]


def half_bits(a):
    """The bit patterns of a bfloat16 / float16 array as the CPU kernels take them (a view:
    uint16 for bfloat16, int16 for float16; kernels_cpu/half.py)."""
    return a.view(np.int16 if a.dtype.kind == "f" else np.uint16)


def widened(a):
    """A bfloat16 / float16 array as a new C-contiguous float32 one (exact), from the result
    arena (the inputs a 16-bit call hands a float32 kernel: fresh pages on every call would
    fault them in again)."""
    from kernels_cpu.half import widen_into

    ac = np.ascontiguousarray(a)
    w = _arena.empty(ac.shape, np.float32)
    widen_into(half_bits(ac.reshape(-1)), w.reshape(-1))
    return w


def draw_case(shapes, params, rng, dtype):
    """Op.synthesize for ops whose inputs are all standard-normal arrays: draw_normal of
    case_dtype."""
    dt = case_dtype(params, dtype)
    return {n: draw_normal(rng, s, dt) for n, s in shapes.items()}
