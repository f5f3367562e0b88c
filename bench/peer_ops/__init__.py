"""Peer versions (numpy, PyTorch, onnxruntime) of the op families added after the first
ones, one module per family, discovered here so that a new family touches only its own
files.  A module defines any of:

    NUMPY = {op: f(inputs) -> array}                     what a numpy-only user writes
    TORCH = {op: f(tensors, torch) -> tensor}            torch.nn.functional, eager
    ORT   = {op: f(inputs, g) -> (feeds, output name)}   nodes added to g (bench.peers._Graph);
                                                         weights as g.const (constants of the
                                                         model, as in an exported one)

`inputs` is the case's named inputs and parameters (bench/cases); `tensors` the same with
arrays wrapped by torch.from_numpy.  bench/peers.py reads these tables beside its own.
"""
from __future__ import annotations

import importlib
import pkgutil

NUMPY: dict = {}
TORCH: dict = {}
ORT: dict = {}


def _discover():
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        for table, name in ((NUMPY, "NUMPY"), (TORCH, "TORCH"), (ORT, "ORT")):
            for op, fn in getattr(mod, name, {}).items():
                if op in table:
                    raise ValueError(f"bench.peer_ops: {name} peer of {op!r} defined twice ({mod.__name__})")
                table[op] = fn


_discover()
