"""Put on PYTHONPATH by bench/gpu_lease.sh only: numba-cuda 0.30 registers an overload of
np.row_stack, which numpy 2.5 removed, so its first kernel compile fails on an image with
both (the lent H200's, 2026-11-26: numpy 2.5.2, numba-cuda 0.30.4, "module 'numpy' has no
attribute 'row_stack'").  Gives numpy its old alias back before numba-cuda looks."""
import numpy

if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack
