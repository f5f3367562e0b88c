"""CUDA implementations: registry records and launch configuration per op family (kernels
in kernels_cuda/, imported lazily inside run: importing this package never imports
numba.cuda).  Families whose op is not registered yet are skipped."""
from . import activation, attention, linalg, norm, rope, softmax  # noqa: F401
