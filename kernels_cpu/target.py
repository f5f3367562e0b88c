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


# The kernels that are x86-only by design, declared here and nowhere else: {module: {njit
# dispatcher name: the x86 instructions it is built on}}.  Their implementations refuse any
# other target in supports() (x86_only_refusal, through int8_gemm.host_paths), and
# tests/test_portability.py compiles every CPU kernel *not* listed here for AArch64 with
# llvmlite, so an x86 intrinsic anywhere else fails CI.  Every other kernel is portable LLVM
# IR (llvm.fma, llvm.prefetch, vector types that LLVM legalizes for NEON).
X86_ONLY = {
    "kernels_cpu.bf16_gemm": {"bf16_worker": "AMX-BF16 tiles (llvm.x86.tdpbf16ps) or AVX-512 BF16 vdpbf16ps "
                                             "(llvm.x86.avx512bf16.dpbf16ps.512), by its variant"},
    "kernels_cpu.attention_amx": {"flash_amx_worker": "AMX-BF16 tiles (llvm.x86.tdpbf16ps)"},
    "kernels_cpu.int8_gemm": {
        "gemm_packed": "AMX-INT8 tiles (llvm.x86.tdpbusd), AVX-512 VNNI vpdpbusd or AVX2 vpmaddwd, by its path",
    },
}


def x86_only_refusal(module: str, kernel: str) -> str | None:
    """Why X86_ONLY's `kernel` of `module` cannot run here (None on x86 or for a portable
    kernel): the refusal reason its implementation's supports() gives on aarch64."""
    why = X86_ONLY.get(module, {}).get(kernel)
    if why is None or is_x86():
        return None
    import platform
    return f"x86-only kernel ({why}); this target is {platform.machine()}"


def vector_bits() -> int:
    """The widest float vector the kernels use here: 512 with AVX-512 F, 256 with AVX2,
    128 otherwise (SSE, NEON: LLVM's portable vectors)."""
    if is_x86() and has("avx512f"):
        return 512
    if is_x86() and has("avx2", "fma"):
        return 256
    return 128


@functools.lru_cache(maxsize=None)
def cache_bytes(level: int) -> int:
    """The size in bytes of CPU 0's data / unified cache of this level as Linux reports it
    (sysfs; the last level's is the whole shared cache), 0 where unknown."""
    import glob
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{d}/level") as f:
                lev = int(f.read())
            with open(f"{d}/type") as f:
                kind = f.read().strip()
            with open(f"{d}/size") as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        if lev != level or kind == "Instruction":
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        try:
            return int(size.rstrip("KMG")) * mult
        except ValueError:
            return 0
    return 0
