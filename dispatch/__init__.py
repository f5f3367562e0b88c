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

__all__ = [
    "Explanation", "NoImplementationError", "explain", "registry", "use",
    "gelu", "geglu", "relu", "silu", "swiglu",
]
