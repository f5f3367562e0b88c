"""cuda.jit with the options the simulator does not know (launch_bounds, lineinfo)
dropped when it is on, and the accumulation type of each input dtype."""
import numpy as np
from numba import cuda, float32, float64

SIM = bool(getattr(cuda, "simulator_enabled", False)) or cuda.__name__.endswith("simulator")
try:  # numba-cuda exposes the flag as numba.cuda.config / numba.config
    from numba import config as _config

    SIM = SIM or bool(getattr(_config, "ENABLE_CUDASIM", 0))
except Exception:  # noqa: BLE001
    pass

FULL_MASK = 0xFFFFFFFF

# numba-cuda warns (NumbaPerformanceWarning, "Grid size N will likely result in GPU
# under-utilization") at every launch of fewer than 128 blocks.  The dispatcher's small grids
# are chosen (one block per row group of a small input; the launch rules say why), and on
# the H200 the warning filled the logs of every small op (2026-11-26) while switching its
# check off changed no timing (bench.gpu_overhead).  Off unless the user's environment sets
# NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS: their setting wins.
import os  # noqa: E402

if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:
    try:
        from numba.cuda.core import config as _cuda_config

        _cuda_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    except Exception:  # noqa: BLE001 - an older numba-cuda without the setting
        pass

# Largest blocks the dispatcher launches per kernel kind: one table with dispatch.cuda_impls.
from kernels_common.cuda_tiles import (BLOCK_ROWS_MAX_THREADS, ELEMENTWISE_THREADS, STATIC_SMEM,  # noqa: E402,F401
                                      VEC_ROW_DTYPES, VEC_ROW_ELEMENTS, VEC_ROWS_MAX_THREADS, WARP_ROWS_THREADS)
from kernels_common import acc_dtype  # noqa: E402

# Row kernels (softmax, norms) read ROW_UNROLL elements per thread at once, their loads in
# flight together: with one dependent load per element, (4096, 4096) rows took 95-147 us
# on the H200 in float16 and float32 alike (2026-11-26, bench/gpu_results/2026-11-26c-h200:
# 0.47-0.9 TB/s of 4.8), the time of load latencies, not of bytes.
ROW_UNROLL = 8


def row_unroll(acc_np):
    """Elements per thread per step of a row kernel: ROW_UNROLL, half for float64 (whose
    values take two registers each: the block-per-row softmax spilled 416 bytes at 8 under
    its 64-register cap, ptxas sm_90)."""
    return ROW_UNROLL if np.dtype(acc_np) != np.float64 else ROW_UNROLL // 2


def kernel(*args, **kw):
    """@cuda.jit for a kernel; drops options the simulator rejects."""
    if SIM:
        kw.pop("launch_bounds", None)
        kw.pop("lineinfo", None)
    return cuda.jit(*args, **kw)


def device(fn=None, **kw):
    """@cuda.jit(device=True, forceinline=True): compiled once per signature and inlined by
    NVVM (the alwaysinline attribute), not by numba.  numba's own inlining
    (inline="always") deep-copies and re-types the body at every call site: the PTX
    report's softmax kernels (72 builds) took 57 s with it and 48 s so, with the same
    registers within a few, no spills and the same hot-loop instruction counts (2026-12-02).
    A device function compiled on its own asks the driver for the compute capability
    (CUDADispatcher.compile_device); without a GPU, bench.ptx supplies the chip it builds
    for (bench/ptx.py _device_cc)."""
    kw.setdefault("forceinline", True)
    if SIM:
        kw.pop("forceinline")
        kw["inline"] = False
    if fn is None:
        return lambda f: cuda.jit(device=True, **kw)(f)
    return cuda.jit(device=True, **kw)(fn)


_OPTED_IN: set = set()


def launch_dynamic(kern, grid, block, shared_bytes, *args):
    """kern[grid, block, 0, shared_bytes](*args) for a kernel whose shared buffer is dynamic
    (cuda.shared.array(0, ...)).  A block may take more than 48 KB of it only after the
    compiled kernel opts in (cudaFuncAttributeMaxDynamicSharedMemorySize): done once per
    compiled kernel and size, from numba-cuda's pre-launch hook (it hands over the kernel
    compiled for these arguments).  The simulator needs no opt-in."""
    cfg = kern[grid, block, 0, shared_bytes]
    if shared_bytes > STATIC_SMEM and not SIM:
        cfg.pre_launch_callbacks.append(lambda compiled, _cfg: _opt_in(compiled, shared_bytes))
    cfg(*args)


def _opt_in(compiled, nbytes):
    f = compiled._codelibrary.get_cufunc()
    key = (f.handle, nbytes)
    if key in _OPTED_IN:  # a set's membership test and add are atomic under the GIL; a race sets it twice
        return
    from numba.cuda.cudadrv.driver import binding, driver

    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, f.handle, f.device.id)
    _OPTED_IN.add(key)


def acc_of(dtype):
    """(numba type, numpy type) the kernels accumulate in for an input dtype."""
    acc = acc_dtype(dtype)
    return (float64 if acc is np.float64 else float32), acc


class PtxBuild:
    """What `python -m bench.ptx` compiles one kernel with, declared beside the kernel (each
    kernels_cuda module lists its kernels in ``PTX``; the report discovers the modules).

    name      the kernel's name as the dispatcher's launch configurations give it
              ("softmax.warp_rows"); the PTX report fails if a launch names an undeclared one
    family    the op family (report grouping)
    get       numba type of the input dtype -> the cuda.jit dispatcher to compile
    argtypes  numba type of the input dtype -> the kernel's argument types
    threads   the largest block it may be launched with (its launch bound); the report's
              block size when no benchmark case's launch configuration names the kernel
    dtypes    the input dtypes it is built for
    requires  strings its PTX must contain (the tensor-core GEMM: its mma instruction), so
              that a kernel silently built without them fails the report
    fits      (smem_per_block_optin, smem_per_sm) of a chip -> whether the dispatcher may run
              the kernel there (None: everywhere); the report builds it for those chips only
              (the same rule the dispatcher applies, e.g. cuda_tiles.tc_async_fits)
    dynamic_shared  bytes of dynamic shared memory a block is launched with (the report's
              occupancy counts them beside the static arrays ptxas reports)
    archs     the chips it exists for (None: all); arch_specific: built for their "a" targets
              (sm_90a: wgmma), as numba-cuda builds it on such a device
    """

    def __init__(self, name, family, get, argtypes, threads=256, dtypes=("float32", "float16", "float64"),
                 requires=(), fits=None, dynamic_shared=0, archs=None, arch_specific=False):
        self.name, self.family, self.get, self.argtypes = name, family, get, argtypes
        self.threads, self.dtypes, self.requires = threads, tuple(dtypes), tuple(requires)
        self.fits, self.dynamic_shared = fits, dynamic_shared
        self.archs, self.arch_specific = archs, arch_specific


def acc_np(numba_dtype):
    """The numpy accumulation type for a numba input dtype (kernels_common.acc_dtype)."""
    return acc_dtype(np.dtype(str(numba_dtype)))


def arr(numba_dtype, ndim, layout="C"):
    """numba array type of that dtype and rank."""
    from numba import types

    return types.Array(numba_dtype, ndim, layout)


def acc_type(numba_dtype):
    """numba type of the accumulation dtype."""
    return float64 if acc_np(numba_dtype) is np.float64 else float32
