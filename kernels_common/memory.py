"""Buffers the kernels stream, placed on cache lines (no numba import: kernels_cpu and
dispatch both allocate them)."""
import math

import numpy as np

# Byte alignment of the buffers the micro-kernels stream: a 64-byte vector (zmm) or AMX
# tile row that starts off a cache line is split across two lines.  numpy's buffers
# start 16, 32 or 48 bytes past a line (malloc's header).  The AMX int8 micro-kernel alone
# (one thread, 32-row A and 32-column B panels, K = 768 / 3072, Sapphire Rapids-class Xeon,
# 2026-12-02): 6.4-9.9 ns per tdpbusd with both operands on lines (16 ns: B from L2),
# 23-26 ns with both 16 bytes off.
ALIGN = 64


def aligned_empty(shape, dtype, align=ALIGN):
    """np.empty(shape, dtype) whose data starts on an `align`-byte boundary (a view of a
    slightly larger buffer, which it keeps alive as its base)."""
    dtype = np.dtype(dtype)
    n = math.prod(shape if isinstance(shape, (tuple, list)) else (shape,)) * dtype.itemsize  # (np.prod: 2.5 us)
    return on_line(np.empty(n + align, np.uint8), n, align).view(dtype).reshape(shape)


def on_line(raw, nbytes, align=ALIGN):
    """The first `nbytes` of the uint8 buffer raw (of at least nbytes + align - 1 bytes) from
    its first `align`-byte boundary: a view whose base is raw (the result arena counts
    references to raw to know when a buffer is free again)."""
    off = -raw.ctypes.data % align
    return raw[off:off + nbytes]
