"""Public API: ML ops on numpy arrays (CPU) or CUDA arrays, each dispatched to the best
registered kernel for the call's device, dtype and shape.

    import dispatch
    y = dispatch.softmax(x)
    print(dispatch.explain("softmax", x))      # which kernel, and why not the others
    with dispatch.use(softmax="cpu-serial"):   # force (or exclude=...) an implementation
        ...

The ops are discovered, not listed: every module of `dispatch.ops` registers its ops (with
their CPU implementations and rules), then every module of `dispatch.cuda_impls` adds the
CUDA implementations and rules, and `registry.check()` verifies the whole registry.  Each
op's public function is exported here under its name; `python -m dispatch` lists them.
"""
import importlib
import pkgutil

from . import registry
from .explain import Explanation, explain
from .select import NoImplementationError, use


def _import_all(package):
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")


from . import ops as _ops, cuda_impls as _cuda_impls  # noqa: E402

_import_all(_ops)         # op records, CPU implementations and rules
_import_all(_cuda_impls)  # CUDA implementations and rules (imports no numba.cuda)
registry.check()

globals().update({name: op.public for name, op in registry.OPS.items()})
OPS = tuple(registry.OPS)  # the public op names

# Helpers an op module offers beside its ops (linalg: prepack, PackedWeight), named in its
# __public__; discovered like the ops, so a new family's helpers need no edit here.
_EXTRA = {}
for _info in pkgutil.iter_modules(_ops.__path__):
    _mod = importlib.import_module(f"{_ops.__name__}.{_info.name}")
    for _name in getattr(_mod, "__public__", ()):
        if _name in _EXTRA or _name in registry.OPS or _name in globals():
            raise registry.RegistryError(f"dispatch.{_name} of {_mod.__name__} is already taken")
        _EXTRA[_name] = getattr(_mod, _name)
globals().update(_EXTRA)

__all__ = ["Explanation", "NoImplementationError", "explain", "registry", "use", *OPS, *_EXTRA]
