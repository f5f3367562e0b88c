"""The one registry of ops and their implementations.

Everything that needs to know which kernels exist reads this module: the dispatcher
(`dispatch.select`), `explain`, the tests (every implementation is forced and compared
with the float64 reference), the performance report, the asv suite, the tuner and the PTX
report.  Adding a kernel is adding one `Implementation` record next to its op.

Vocabulary
----------
op              the public function's name, e.g. ``"softmax"``.
key             a small hashable description of one call, built by the op's ``describe``:
                ``(op, device, dtype, *bucketed shape facts, *flags)``.  Selection depends on
                the key only, so the choice for a key is cached.
Implementation  one kernel variant of one op ("cpu-serial", "cpu-parallel", "blas", ...):
                what it supports (a function of the key returning refusal reasons), how to
                run it on the prepared arguments, and its FLOP / byte model for the roofline.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def bucket(n: int) -> int:
    """Shape bucket of a size: exact up to 16, else the largest power of two <= n.

    Size rules use power-of-two thresholds T, and n >= T exactly when bucket(n) >= T,
    so a rule evaluated on the bucket gives the same answer as on the exact size."""
    if n <= 16:
        return n
    return 1 << (n.bit_length() - 1)


@dataclass
class Implementation:
    """One kernel variant of one op.

    run(params, *args) executes it on the arguments prepared by the op's ``describe``
    (validated, output allocated) and returns the public result.
    supports(key) -> list of refusal reasons (empty: it can run this call).
    flops(call) / bytes(call): the work and the fewest bytes moved, from the call's
    arguments (used by the report's roofline and the CUDA performance model).
    params: default tunable parameters; tunables: candidate values for the tuner.
    """

    op: str
    name: str
    device: str
    run: Callable[..., Any]
    dtypes: tuple = FLOAT_DTYPES
    supports: Callable[[tuple], list] | None = None
    notes: str = ""
    params: dict = field(default_factory=dict)
    tunables: dict = field(default_factory=dict)
    version: int = 1

    def refusals(self, key: tuple) -> list:
        """Why this implementation cannot take a call with this key (empty: it can)."""
        device, dtype = key[1], key[2]
        reasons = []
        if device != self.device:
            reasons.append(f"runs on {self.device}, inputs are on {device}")
        if dtype not in self.dtypes:
            names = ", ".join(str(d) for d in self.dtypes)
            reasons.append(f"dtype {dtype} not supported (supports {names})")
        if not reasons and self.supports is not None:
            reasons.extend(self.supports(key))
        return reasons


@dataclass
class Op:
    """An op: its public function, how a call is described, and its candidates.

    describe(*args, **kwargs) -> Call: validates and prepares the arguments (raising
        TypeError/ValueError before anything is written) and returns the key and the
        prepared arguments.
    order(key) -> (names, why): the candidates to try for this key, best first, and the
        shape rule that put them in that order (shown by `explain`).
    flops(call), bytes(call): the op's work model (shared by all its implementations).
    """

    name: str
    describe: Callable[..., "Call"]
    order: Callable[[tuple], tuple]
    flops: Callable[["Call"], float] | None = None
    bytes: Callable[["Call"], float] | None = None
    implementations: dict = field(default_factory=dict)
    family: str = ""


@dataclass
class Call:
    """A validated call: the selection key, the prepared positional arguments for
    ``Implementation.run`` and a note on what preparation did (copies, reshapes)."""

    key: tuple
    args: tuple
    prep_notes: tuple = ()


OPS: dict[str, Op] = {}


def register_op(op: Op) -> Op:
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} registered twice")
    OPS[op.name] = op
    return op


def register(impl: Implementation) -> Implementation:
    op = OPS[impl.op]
    if impl.name in op.implementations:
        raise ValueError(f"implementation {impl.name!r} of op {impl.op!r} registered twice")
    op.implementations[impl.name] = impl
    return impl


def implementations(op: str | None = None, device: str | None = None) -> list[Implementation]:
    """All registered implementations, optionally of one op and/or one device."""
    ops = [OPS[op]] if op is not None else list(OPS.values())
    return [
        impl
        for o in ops
        for impl in o.implementations.values()
        if device is None or impl.device == device
    ]
