"""Compile the CPU kernels into numba's on-disk cache ahead of time.

    python -m dispatch.warmup [OP ...] [--dtypes float32 float64] [--quiet]

A first call compiles its kernel (seconds; see the report's first-call table) and numba
caches it on disk, so later processes load it in well under a second. Run this once
after installing, e.g. in a container build or on an edge device before it serves, so
that no user request pays for compilation. It calls every CPU implementation of each op
(all ops by default) on small example inputs (dispatch/examples.py), forced one at a
time with `dispatch.use`, for each dtype (default float32), and prints a progress line
per call.  An op may declare other calls that compile kernels of their own
(Op.variants: attention's fused-QKV views with a padding mask and a transposed out=, as
a BERT layer calls it; linear's and matmul's fused epilogues); those are compiled in
the same step.

Where the cache goes is numba's choice: a ``__pycache__`` beside the kernel modules when
that directory is writable, otherwise numba's per-user cache directory (a read-only
site-packages falls back there by itself), or ``NUMBA_CACHE_DIR`` when set. Warm up under
the same user, numba version and CPU as the later runs: the cache is keyed by them (a
different CPU model recompiles).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

SIZES = ("small", "large", "decode")


def plan(ops=None, dtypes=("float32",)):
    """[(op, implementation, dtype)] to compile: every CPU implementation of the ops."""
    from . import registry
    names = list(registry.OPS) if not ops else list(ops)
    unknown = [n for n in names if n not in registry.OPS]
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; registered: {sorted(registry.OPS)}")
    out = []
    dts = [_dtype(dt) for dt in dtypes]
    for name in names:
        for impl in registry.implementations(name, "cpu"):
            for dt in dts:
                if dt in impl.dtypes:
                    out.append((name, impl.name, dt))
    return out


def _dtype(name):
    """np.dtype of a --dtypes name; "bfloat16" is ml_dtypes' (imported here, on request only:
    the ops' bfloat16 paths)."""
    if str(name) == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ValueError("--dtypes bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def compile_one(op_name, impl_name, dtype):
    """Call op_name forced to impl_name on the first example size where it takes the example
    or one of the variants the op declares (Op.variants: linear's low-precision weights are
    what its weight-only kernels take), once per form it takes. Returns the size used, or
    raises LookupError when no example fits."""
    import dispatch
    from . import registry

    size, forms = forms_taken(op_name, impl_name, dtype)
    with dispatch.use(**{op_name: impl_name}):
        for args, kwargs in forms:
            registry.OPS[op_name].public(*args, **kwargs)
    return size


def forms_taken(op_name, impl_name, dtype):
    """(size, [(args, kwargs)]): the first example size (SIZES) at which impl_name, forced,
    takes the op's example or any of its Op.variants, and the forms it takes there.
    LookupError when it takes none at any size."""
    import dispatch
    from . import examples, registry
    from .explain import explain

    op = registry.OPS[op_name]
    for size in SIZES:
        try:
            named = examples.inputs(op, size, dtype, seed=0)
        except LookupError:
            continue
        args, kwargs = op.signature(named)
        forms = [(args, kwargs)] + [variant(args, kwargs) for variant in op.variants.values()]
        with dispatch.use(**{op_name: impl_name}):
            taken = [(a, kw) for a, kw in forms if explain(op_name, *a, **kw).chosen == impl_name]
        if taken:
            return size, taken
    raise LookupError(f"{op_name}: no example input that {impl_name} takes")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dispatch.warmup", description=__doc__.split("\n\n")[0])
    p.add_argument("ops", nargs="*", help="ops to compile (default: all registered)")
    p.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "float64", "bfloat16", "float16"],
                   help="bfloat16 / float16: the 16-bit kernels of the ops that have them (linear, matmul, conv2d, "
                        "the norms, activations, softmax, rope, attention; bfloat16 needs ml_dtypes)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    import dispatch  # noqa: F401 - registers the ops
    from kernels_cpu import keepwarm, runtime

    keepwarm.precompile()  # the heartbeat loop every CPU call arms (kernels_cpu/keepwarm.py)
    todo = plan(a.ops, a.dtypes)
    failed, elsewhere = [], []
    for i, (op, impl, dt) in enumerate(todo, 1):
        t = time.perf_counter()
        why_not = not_for_this_host(op, impl)
        if why_not is not None:
            elsewhere.append(impl)
            msg = f"not for this host: {why_not}"
        else:
            try:
                size = compile_one(op, impl, dt)
                msg = f"{time.perf_counter() - t:6.2f} s ({size} inputs)"
            except LookupError as exc:
                failed.append(str(exc))
                msg = f"skipped: {exc}"
        if not a.quiet:
            bar = "#" * (20 * i // len(todo))
            print(f"[{bar:<20}] {i}/{len(todo)} {op} {impl} {dt}: {msg}", flush=True)
    here = len(todo) - len(elsewhere)
    print(f"warmed {here - len(failed)} of {here} kernels in {time.perf_counter() - t0:.1f} s "
          + (f"({len(elsewhere)} more not for this host) " if elsewhere else "") + f"({runtime.describe()})")
    return 1 if failed else 0


def not_for_this_host(op_name, impl_name):
    """Why this host cannot run the implementation at all (Implementation.host: AMX, AVX-512
    BF16, VNNI kernels), or None: warmup does not compile what the host would never run."""
    from . import registry
    impl = next(i for i in registry.implementations(op_name, "cpu") if i.name == impl_name)
    return impl.host() if impl.host is not None else None


if __name__ == "__main__":
    sys.exit(main())
