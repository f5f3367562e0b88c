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

# Largest blocks the dispatcher launches per kernel kind: one table with dispatch.cuda_impls.
from kernels_common.cuda_tiles import BLOCK_ROWS_MAX_THREADS, ELEMENTWISE_THREADS, WARP_ROWS_THREADS  # noqa: E402,F401
from kernels_common import acc_dtype  # noqa: E402


def kernel(*args, **kw):
    """@cuda.jit for a kernel; drops options the simulator rejects."""
    if SIM:
        kw.pop("launch_bounds", None)
        kw.pop("lineinfo", None)
    return cuda.jit(*args, **kw)


def device(fn=None, **kw):
    """@cuda.jit(device=True, inline="always"): inlined, so compile_ptx never needs the
    driver to compile it lazily for an unknown compute capability."""
    kw.setdefault("inline", "always")
    if SIM:
        kw["inline"] = False
    if fn is None:
        return lambda f: cuda.jit(device=True, **kw)(f)
    return cuda.jit(device=True, **kw)(fn)


def acc_of(dtype):
    """(numba type, numpy type) the kernels accumulate in for an input dtype."""
    acc = acc_dtype(dtype)
    return (float64 if acc is np.float64 else float32), acc
