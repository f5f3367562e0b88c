"""Public API: ML ops on numpy arrays (CPU) or CUDA arrays, each dispatched to the best
registered kernel for the call's device, dtype and shape.

    import dispatch
    y = dispatch.softmax(x)
    print(dispatch.explain("softmax", x))      # which kernel, and why not the others
    with dispatch.use(softmax="cpu-serial"):   # force (or exclude=...) an implementation
        ...

See `dispatch.registry` for how ops and implementations are declared.
"""
from .explain import Explanation, explain
from .select import NoImplementationError, use
from . import registry

from .ops.activation import gelu, geglu, relu, silu, swiglu
from .ops.attention import attention
from .ops.linalg import linear, matmul
from .ops.norm import layer_norm, rms_norm
from .ops.rope import rope
from .ops.softmax import cross_entropy, log_softmax, softmax
from . import cuda_impls  # noqa: F401  (registers CUDA implementations; imports no CUDA)

__all__ = [
    "Explanation", "NoImplementationError", "explain", "registry", "use",
    "attention", "cross_entropy", "gelu", "geglu", "layer_norm", "linear", "log_softmax",
    "matmul", "relu", "rms_norm", "rope", "silu", "softmax", "swiglu",
]
