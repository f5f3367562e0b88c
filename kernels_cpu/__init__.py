"""Numba CPU kernels, one module per op family (see README's layout).

Inlining the overloaded helpers of approx.py makes numba's SSA pass print a pedantic
NumbaIRAssumptionWarning ("variable ... is not in scope") while compiling; it is an
internal self-check that numba itself calls harmless, so it is silenced here for the
kernels' compilation only (that warning class and message).
"""
import warnings

from . import runtime  # noqa: F401 - picks the threading layer before any kernel runs
from . import cache_safety

cache_safety.install()  # before any kernel is compiled and saved: numba's save races across processes

from numba.core.errors import NumbaIRAssumptionWarning

warnings.filterwarnings("ignore", message=r"variable '.*' is not in scope", category=NumbaIRAssumptionWarning)
