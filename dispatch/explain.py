"""`explain`: which implementation the dispatcher picks for a call, and why the others
were not picked.  It runs the op's validation and selection, never a kernel."""
from __future__ import annotations

import numpy as np

from kernels_cpu import runtime as cpu_runtime

from . import interop, registry
from .select import decide


class Explanation:
    """The decision for one call.  ``chosen`` is the implementation's name (None when no
    implementation can run it); ``str()`` gives the readable account."""

    def __init__(self, decision, call):
        self.decision = decision
        self.call = call
        self.op = decision.op
        self.key = decision.key
        self.chosen = decision.chosen.name if decision.chosen is not None else None
        self.params = decision.params
        self.source = decision.source
        self.candidates = decision.candidates

    def _layout_notes(self):
        notes = []
        for name, a in self.call.args._asdict().items():
            if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
                notes.append(f"argument {name} (shape {a.shape}) is not C-contiguous: it is copied before the kernel")
        return notes

    def __str__(self):
        lines = [f"{self.op}: key {self._key_text()}"]
        if self.chosen is None:
            lines.append("  no implementation can run this call")
        else:
            impl = self.decision.chosen
            lines.append(f"  chosen: {self.chosen} ({impl.device}) by {self.source}: {self.decision.rule}")
            if self.params:
                lines.append(f"  parameters: {self.params}")
            launch = getattr(impl, "launch_config", None)  # CUDA: grid/block/tiles for this call
            if launch is not None:
                lines.append(f"  launch: {launch(self.call)}")
            if impl.device == "cpu":
                lines.append(f"  threading: {cpu_runtime.describe()}")
                lines.append(f"  vectors: {cpu_runtime.vectors()}")
            if impl.notes:
                lines.append(f"  notes: {impl.notes}")
        lines += [f"  layout: {n}" for n in self._layout_notes()]
        notes = getattr(self.call, "prep_notes", ())
        lines += [f"  prepared: {n}" for n in (notes() if callable(notes) else notes)]
        for name, verdict, reasons in self.candidates:
            if verdict != "chosen":
                lines.append(f"  {name}: {verdict}: {'; '.join(reasons)}")
        return "\n".join(lines)

    def _key_text(self):
        return ", ".join(f"{k}={v}" for k, v in self.key._asdict().items() if k != "op")

    __repr__ = __str__


def explain(op, *args, **kwargs) -> Explanation:
    """Which implementation `op` (a name like "softmax", or the public function) would
    run for these arguments, and why each other candidate was not chosen."""
    name = op if isinstance(op, str) else getattr(op, "__name__", None)
    if name not in registry.OPS:
        raise ValueError(f"explain: unknown op {op!r}; known ops: {sorted(registry.OPS)}")
    conv = interop.from_torch(args, kwargs)
    call = registry.OPS[name].describe(*conv.args, **conv.kwargs)
    return Explanation(decide(call.key), call)
