"""CUDA kernels (numba-cuda), one module per op family, mirroring kernels_cpu.

Importing any module here imports ``numba.cuda``; the dispatcher imports them lazily (in
the CUDA implementations' run), so the CPU side never needs numba-cuda.  Kernels are
compiled on first launch for the launch's argument types; ``kernels_cuda.catalog``
lists every kernel with the signatures and launch configurations that ``python -m
bench.ptx`` compiles for real chips.

Conventions shared by all kernels:
- arrays are C-contiguous (the run wrappers copy strided device inputs with
  ``layout.contiguous``); float32/float16 inputs are computed in float32, float64 in
  float64 (``acc`` below);
- block sizes are multiples of 32 and every lane of a warp stays alive through a warp
  shuffle (the shuffles use the full mask);
- no kernel reads or writes outside its arrays (the simulator tests check it).
"""
