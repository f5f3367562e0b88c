"""CUDA implementations: registry records, CUDA shape rules and launch configuration per op
family (kernels in kernels_cuda/, imported lazily inside run: importing this package never
imports numba.cuda).  dispatch/__init__ imports every module here after the op modules."""
