"""Facts both kernel sides and the dispatcher need, in one place, with no numba import.

kernels_cpu, kernels_cuda and dispatch all read these modules instead of keeping copies in
sync by comment: the activation codes and their FLOP counts (`activation`), the CUDA tile
and launch shapes the kernels are compiled for and the dispatcher launches (`cuda_tiles`),
the attention mask kinds (`attention`), the cache-line alignment of the buffers the CPU
micro-kernels stream (`memory`), and the accumulation-dtype rule below.  Importing
this package never imports numba, so the dispatcher can decide launches without loading
numba.cuda.
"""
import numpy as np


def acc_dtype(dtype) -> type:
    """The numpy scalar type a kernel accumulates in for an input dtype: float64 inputs in
    float64, everything narrower (float32, float16) in float32."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32
