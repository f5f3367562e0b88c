"""Helpers shared by the op modules: preparing host arrays for kernels and the
serial/parallel shape rule.  Kernels take C-contiguous arrays; these helpers make the
copies (stated in `explain`) and route results into ``out=``."""
from __future__ import annotations

import numpy as np

from ..registry import bucket

HOST_COPY_NOTE = "non-contiguous host inputs are copied to C order first; a non-contiguous out= is filled by one copy"


def contiguous(x):
    """x itself when C-contiguous, else a C-contiguous copy (None stays None)."""
    if x is None or x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(x)


def result_buffer(out, shape, dtype):
    """Where the kernel writes: out itself when it is C-contiguous, else a fresh array."""
    if out is not None and out.flags.c_contiguous:
        return out
    return np.empty(shape, dtype)


def deliver(res, out):
    """The public result: res, copied into out= when the kernel could not write there."""
    if out is None or res is out:
        return res
    out[...] = res
    return out


def serial_parallel_order(size_index: int, threshold: int, measured: str):
    """Shape rule for ops with a serial and a parallel CPU kernel: serial below
    ``threshold`` elements (key[size_index] is the bucketed size), parallel at or above."""

    def order(key):
        n = key[size_index]
        if key[1] == "cuda":
            return ("cuda",), "inputs are CUDA arrays"
        if n < threshold:
            return ("cpu-serial", "cpu-parallel"), f"size bucket {n} < {threshold}: threads cost more than they give ({measured})"
        return ("cpu-parallel", "cpu-serial"), f"size bucket {n} >= {threshold}: threads pay off ({measured})"

    return order


def size_bucket(*shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return bucket(n)
