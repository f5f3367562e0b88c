"""Attention facts shared by the CPU and CUDA kernels and the dispatcher."""

# Kind of the `mask` argument, passed to the kernels as an int.
MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
