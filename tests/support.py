"""What every op test shares: the implementations to test, forcing one, moving data to
its device, poisoned outputs, random inputs and the error measure.

The target device of a test run is NK_TEST_DEVICE ("cpu", the default, or "cuda": the
CUDA implementations, on a GPU or under NUMBA_ENABLE_CUDASIM=1 set before numba loads).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import dispatch
from dispatch import registry

TARGET = os.environ.get("NK_TEST_DEVICE", "cpu")
ON_CUDA = TARGET == "cuda"

# Normwise relative error bounds: max|got - ref| / max|ref|.
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def reduction_tol(dtype, k: int) -> float:
    """Bound for results that are reductions over k terms (matmul, softmax denominators)."""
    if np.dtype(dtype) == np.float64:
        return 1e-12
    return max(1e-5, k * 2e-7)


def impl_params(op: str):
    """pytest params: every implementation of op on the target device, by name."""
    impls = registry.implementations(op, device=TARGET)
    return [pytest.param(impl.name, id=impl.name) for impl in impls] or [
        pytest.param(None, marks=pytest.mark.skip(reason=f"no {TARGET} implementation of {op}"))
    ]


def rng(seed=None):
    """A fresh generator; tests pass no seed so every run draws new inputs (the seed is
    printed on failure by hypothesis / pytest's -p randomly if installed)."""
    return np.random.default_rng(seed)


def randn(gen, shape, dtype):
    return gen.standard_normal(shape).astype(dtype)


def to_target(a):
    """Host array -> an array on the target device (identity on the CPU)."""
    if not ON_CUDA or not isinstance(a, np.ndarray):
        return a
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a)) if a.flags.c_contiguous or a.ndim == 0 else cuda.to_device(a.copy())


def to_host(a):
    if isinstance(a, tuple):
        return tuple(to_host(x) for x in a)
    if isinstance(a, np.ndarray) or a is None or np.isscalar(a):
        return a
    return a.copy_to_host()


def poisoned(shape, dtype):
    """An out= array full of NaN on the target device, so an unwritten element fails."""
    return to_target(np.full(shape, np.nan, dtype=dtype))


def run(impl: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) with implementation `impl` forced for fn's op, arrays moved to
    the target device and the result brought back to the host."""
    op = kwargs.pop("_op", fn.__name__)
    args = tuple(to_target(a) for a in args)
    kwargs = {k: to_target(v) for k, v in kwargs.items()}
    with dispatch.use(**{op: impl}):
        return to_host(fn(*args, **kwargs))


def rel_err(got, ref) -> float:
    """max|got - ref| / max|ref| (0/0 -> 0); NaN anywhere in got gives inf."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != reference {ref.shape}"
    if np.isnan(got).any() and not np.isnan(ref).any():
        return np.inf
    scale = np.max(np.abs(ref)) if ref.size else 0.0
    diff = np.max(np.abs(got - ref)) if ref.size else 0.0
    if scale == 0.0:
        return float(diff)
    return float(diff / scale)


def assert_close(got, ref, tol, what=""):
    err = rel_err(got, ref)
    assert err <= tol, f"{what} relative error {err:.3e} > {tol:.1e}"


def strided(a):
    """A non-contiguous view with the values of a (every other element of a bigger array)."""
    big = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype) if a.ndim else np.empty((2,), a.dtype)
    if a.ndim == 0:
        return a
    big[..., ::2] = a
    big[..., 1::2] = np.nan
    return big[..., ::2]
