"""First-call time of ops in a fresh process (what `python -m bench` runs per op family).

    NUMBA_CACHE_DIR=<dir> python -m bench.compile_time CASE_ID [CASE_ID ...]

prints one JSON object: {"import_s": ..., "first_call_s": {case_id: seconds}}.  The report
runs it twice per family with the same NUMBA_CACHE_DIR: first with the directory empty
(cold: every kernel compiles) and then again (warm: kernels load from numba's cache).
"""
from __future__ import annotations

import json
import sys
import time


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    t0 = time.perf_counter()
    import numpy as np

    import dispatch
    from bench import cases

    out = {"import_s": time.perf_counter() - t0, "first_call_s": {}, "errors": {}}
    for cid in argv:
        case = cases.by_id(cid)
        args, kwargs = case.call_args(case.inputs(np.random.default_rng(0)))
        fn = getattr(dispatch, case.op)
        t0 = time.perf_counter()
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - reported, the report goes on
            out["errors"][cid] = f"{exc.__class__.__name__}: {exc}"
            continue
        out["first_call_s"][cid] = time.perf_counter() - t0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
