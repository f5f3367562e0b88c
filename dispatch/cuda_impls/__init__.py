"""CUDA implementations: registry records and launch configuration per op family (kernels in kernels_cuda/)."""
