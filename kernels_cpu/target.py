"""The CPU that numba compiles for: its name and features, read in one place.

Every kernel that picks a vector width or an instruction path (the GEMM tile, the int8
dot-product path, the weight-only GEMV, the loop width hint) asks here.  The answer is
numba's target, not merely the host: NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, when set, are what
numba generates code for (a portable cache, or an AVX2-only build tested on an AVX-512
host), so a path chosen from them never emits an instruction the target lacks.  numba keys
its cache on the same name and features, so a choice never travels to another host.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    """LLVM's name of the target CPU ("sapphirerapids", "znver3", "generic", ...)."""
    from numba.core import config
    if config.CPU_NAME:
        return config.CPU_NAME
    try:
        import llvmlite.binding as ll
        return ll.get_host_cpu_name()
    except Exception:  # noqa: BLE001
        return "?"


@functools.lru_cache(maxsize=None)
def features() -> frozenset:
    """The enabled features of the target CPU, without their "+" ("avx2", "avx512f", ...).
    Empty when neither numba's setting nor LLVM gives a list (only portable paths run)."""
    from numba.core import config
    try:
        if config.CPU_FEATURES:
            feats = config.CPU_FEATURES
        else:
            import llvmlite.binding as ll
            feats = ll.get_host_cpu_features().flatten()
    except Exception:  # noqa: BLE001
        return frozenset()
    return frozenset(f[1:] for f in feats.split(",") if f.startswith("+"))


def has(*names: str) -> bool:
    """Whether the target has every one of these features."""
    f = features()
    return all(n in f for n in names)


def missing(*names: str) -> list:
    """The features of `names` the target lacks (for refusal reasons)."""
    f = features()
    return [n for n in names if n not in f]


def is_x86() -> bool:
    import platform
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def vector_bits() -> int:
    """The widest float vector the kernels use here: 512 with AVX-512 F, 256 with AVX2,
    128 otherwise (SSE, NEON: LLVM's portable vectors)."""
    if is_x86() and has("avx512f"):
        return 512
    if is_x86() and has("avx2", "fma"):
        return 256
    return 128
