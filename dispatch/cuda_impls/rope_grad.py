"""CUDA implementation of rope_backward ("cuda-elementwise"): rope's, with the inverse
rotation (dispatch/cuda_impls/rope.py, kernels_cuda/rope_grad.py)."""
from __future__ import annotations

from .rope import register_rotation

register_rotation("rope_backward", "rope_grad", True, " (inverse rotation)")
