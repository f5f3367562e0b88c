"""First-call time of ops in a fresh process (what `python -m bench` runs per op family).

    NUMBA_CACHE_DIR=<dir> python -m bench.compile_time CASE_ID [CASE_ID ...]

prints one JSON object: {"import_s": ..., "first_call_s": {case_id: seconds}, "errors": {...},
"compiles": {case_id: {"compile_s": ..., "top": [...]}}, "helpers": {case_id: n}}.  The report runs it twice per
family with the same NUMBA_CACHE_DIR: first with the directory empty (cold: every kernel
compiles) and then again (warm: kernels load from numba's cache).

"compiles" says where a cold first call's time goes, from numba's compile events: compile_s
is the time inside numba's compiler (the rest of the first call is Python, the thread team's
start and the kernel itself), and "top" the functions that cost most of it, each
{"fn", "sig", "own_s", "total_s"}: total_s from the start to the end of its compilation,
own_s without the functions it compiled on the way (its callees: numba compiles a callee
while it types the caller); this process's part only, where "helpers" says how many helper
processes compiled other kernels of the call meanwhile (kernels_cpu/compile_helper.py).  The cold-start bar's profile (issue #8): which function to make
smaller, split, or call by address.
"""
from __future__ import annotations

import json
import sys
import time

# functions listed per case, by own time
TOP = 6


class CompileLog:
    """Records numba's compile events (numba.core.event "numba:compile") as a tree while
    installed: `with CompileLog() as log: ...`, then log.summary()."""

    def __init__(self):
        self.roots = []
        self._stack = []

    def __enter__(self):
        from numba.core import event

        log = self

        class _Listener(event.Listener):
            def on_start(self, ev):
                log.start(_name(ev.data["dispatcher"]), str(ev.data["args"]))

            def on_end(self, ev):
                log.end()

        self._listener = _Listener()
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc):
        from numba.core import event

        event.unregister("numba:compile", self._listener)
        return False

    def start(self, fn, sig, now=None):
        node = {"fn": fn, "sig": sig, "t0": time.perf_counter() if now is None else now, "kids": []}
        (self._stack[-1]["kids"] if self._stack else self.roots).append(node)
        self._stack.append(node)

    def end(self, now=None):
        node = self._stack.pop()
        node["total_s"] = (time.perf_counter() if now is None else now) - node["t0"]

    def summary(self, top=TOP) -> dict:
        """{"compile_s": seconds in the compiler, "top": the `top` functions by own time}."""
        flat = []

        def walk(nodes):
            for n in nodes:
                if "total_s" not in n:  # still open (an exception in the compiler)
                    continue
                kids = [k for k in n["kids"] if "total_s" in k]
                flat.append({"fn": n["fn"], "sig": n["sig"], "total_s": n["total_s"],
                             "own_s": max(n["total_s"] - sum(k["total_s"] for k in kids), 0.0)})
                walk(kids)

        walk(self.roots)
        flat.sort(key=lambda r: -r["own_s"])
        return {"compile_s": sum(n["total_s"] for n in self.roots if "total_s" in n), "top": flat[:top]}


def _name(dispatcher):
    f = getattr(dispatcher, "py_func", None)
    if f is None:
        return repr(dispatcher)
    return f"{f.__module__}.{f.__qualname__}".replace(".<locals>.", ":")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    t0 = time.perf_counter()
    import numpy as np

    import dispatch
    from bench import cases

    from kernels_cpu import compile_helper

    out = {"import_s": time.perf_counter() - t0, "first_call_s": {}, "errors": {}, "compiles": {}, "helpers": {}}
    for cid in argv:
        case = cases.by_id(cid)
        args, kwargs = case.call_args(case.inputs(np.random.default_rng(0)))
        fn = getattr(dispatch, case.op)
        started = compile_helper.STATS["started"]
        with CompileLog() as log:
            t0 = time.perf_counter()
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - reported, the report goes on
                out["errors"][cid] = f"{exc.__class__.__name__}: {exc}"
                continue
            out["first_call_s"][cid] = time.perf_counter() - t0
        out["compiles"][cid] = log.summary()
        out["helpers"][cid] = compile_helper.STATS["started"] - started
    print(json.dumps(out))


if __name__ == "__main__":
    main()
