"""float64 numpy reference for dispatch.rope_backward, same signature: the inverse rotation,
rope with sin negated (rope is x -> R x with R orthogonal, so dx = R^T grad_out)."""
import numpy as np

from . import rope as _rope


def rope_backward(grad_out, cos, sin, *, interleaved=False, out=None):
    return _rope.rope(grad_out, cos, -np.asarray(sin, dtype=np.float64), interleaved=interleaved)
