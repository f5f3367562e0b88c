"""PyTorch tensors in and out of the plain ops, with no copies.

Every public op (and `explain`) passes its arguments through `from_torch` first: a PyTorch
CPU tensor becomes the numpy array over the same memory (``Tensor.numpy()``, zero-copy,
strides kept), a PyTorch CUDA tensor is left as it is (it already exposes
``__cuda_array_interface__``, which `devices.as_device` wraps without a copy).  When any
argument was a tensor, `Converted.back` turns the result into tensors again: numpy arrays
through ``torch.from_numpy`` and CUDA arrays through ``torch.as_tensor`` (both share the
memory), and an ``out=`` tensor comes back as the very tensor the caller passed.

torch is never imported here: a tensor can only exist once the caller imported torch, so
``sys.modules`` tells whether to look at all, and a call with no tensor costs one dict
lookup.  The plain ops record no gradients (a tensor that requires grad is read through
``detach()``); `dispatch.autograd` is the differentiable namespace.

bfloat16 tensors (no numpy dtype) are viewed as ``ml_dtypes.bfloat16`` arrays, which the
weight-only linear accepts, when ml_dtypes is installed; otherwise they are a TypeError
naming the argument.
"""
from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np


class Converted(NamedTuple):
    args: tuple
    kwargs: dict
    originals: dict    # id(converted array) -> the tensor it came from (out= round trips)
    torch: Any         # the torch module when a tensor was seen, else None

    def back(self, result):
        """The op's result, as tensors when the call had tensors."""
        if self.torch is None:
            return result
        return _to_torch(self.torch, result, self.originals)


def has_tensor(args: tuple, kwargs: dict) -> bool:
    """Whether any argument is a PyTorch tensor (False at once when torch is not imported):
    the check every op call makes before converting anything."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    tensor_type = getattr(torch, "Tensor", None)
    if tensor_type is None:
        return False
    # plain loops: with torch imported, any() over generators took 763-787 ns a call, these
    # loops 351-373 ns (relu's arguments, one process, 15 alternations; 2 cores, Zen 4,
    # 2026-12-02), of dispatch.relu(1 element)'s ~8 us
    for a in args:
        if isinstance(a, tensor_type):
            return True
    for v in kwargs.values():
        if isinstance(v, tensor_type):
            return True
    return False


def from_torch(args: tuple, kwargs: dict) -> Converted:
    """args and kwargs with every PyTorch CPU tensor replaced by its numpy view."""
    if not has_tensor(args, kwargs):
        return Converted(args, kwargs, {}, None)
    return convert(args, kwargs)


def convert(args: tuple, kwargs: dict) -> Converted:
    """from_torch for a call that has_tensor already found a tensor in (Op.__call__)."""
    torch = sys.modules["torch"]
    tensor = torch.Tensor
    originals = {}
    # plain loops that touch only the tensors (an argument's name is formatted only for an
    # error), and _to_torch's array case first: layer_norm_backward's arguments (4 tensors,
    # 2 other keywords) and 3 results, convert + back 29.8 / 33.3 -> 25.5 / 27.6 us (one
    # process each, old and new alternating, medians of 15; a slow Zen 3 VM, 2026-12-02)
    new_args = list(args)
    for i, a in enumerate(args):
        if isinstance(a, tensor):
            new_args[i] = _to_array(torch, i, a, originals)
    new_kwargs = dict(kwargs)
    for k, v in kwargs.items():
        if isinstance(v, tensor):
            new_kwargs[k] = _to_array(torch, k, v, originals)
    return Converted(tuple(new_args), new_kwargs, originals, torch)


def as_array(name: str, v):
    """v itself, or the numpy view of a PyTorch CPU tensor (for containers such as
    QuantizedArray that take arrays outside an op call)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(v, torch.Tensor):
        return v
    return _to_array(torch, name, v, {})


def _name(name):
    """An argument's name for an error: a keyword, or "argument i" for a position."""
    return f"argument {name}" if isinstance(name, int) else name


def _to_array(torch, name, t, originals):
    """The numpy view of tensor t (argument `name`: a keyword or a position), or t itself
    when it is not a tensor or is a CUDA tensor."""
    # (is_cpu / is_cuda and requires_grad are plain attribute reads; Tensor.device builds a
    # device object and detach() a new tensor: 1.9 -> 1.1 us a tensor, this Xeon)
    if not isinstance(t, torch.Tensor):
        return t
    if not t.is_cpu:
        if t.is_cuda:
            originals[id(t)] = t
            return t
        raise TypeError(f"{_name(name)}: tensors on {t.device.type} are not supported (CPU or CUDA tensors)")
    given = t
    if t.requires_grad:
        t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.dtype is torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(f"{_name(name)}: a bfloat16 tensor needs ml_dtypes installed (pip install ml_dtypes) "
                            "to be viewed as a numpy array") from None
        arr = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        try:
            arr = t.numpy()
        except TypeError as e:
            raise TypeError(f"{_name(name)}: tensor of dtype {t.dtype} has no numpy equivalent ({e})") from None
    originals[id(arr)] = given
    return arr


def to_torch(torch, result):
    """result (an array, or a tuple or list of them) as tensors over the same memory."""
    return _to_torch(torch, result, {})


def _to_torch(torch, res, originals):
    if type(res) is np.ndarray:  # the common case first: one type test, not four
        orig = originals.get(id(res))
        if orig is not None:
            return orig
        if res.dtype.kind != "V" and res.flags.writeable:
            return torch.from_numpy(res)
    if type(res) is tuple:
        return tuple([_to_torch(torch, r, originals) for r in res])
    if isinstance(res, tuple):
        vals = [_to_torch(torch, r, originals) for r in res]
        return type(res)(*vals) if hasattr(res, "_fields") else tuple(vals)
    if isinstance(res, list):
        return [_to_torch(torch, r, originals) for r in res]
    orig = originals.get(id(res))
    if orig is not None:
        return orig
    if isinstance(res, np.ndarray):
        if res.dtype.kind == "V" and res.dtype.name == "bfloat16":   # (dtype.name is slow Python)
            return torch.from_numpy(res.view(np.int16)).view(torch.bfloat16)
        if not res.flags.writeable:
            res = res.copy()       # torch.from_numpy warns on read-only memory
        return torch.from_numpy(res)
    if isinstance(res, np.generic):
        return torch.from_numpy(np.asarray(res))
    if hasattr(res, "__cuda_array_interface__") and not isinstance(res, torch.Tensor):
        return torch.as_tensor(res, device="cuda")
    return res
