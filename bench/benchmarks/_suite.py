"""Builds the asv benchmark classes of every registered op from the registry and bench/cases.

Parameters: ``impl`` x ``case``.
  impl: "dispatch" (the public function: whatever the dispatcher picks), every CPU
        implementation of the op in the registry (forced), "numpy" (bench/peers.py), and
        "cuda" (the public function on device arrays; skipped in setup without a GPU);
  case: the op's cases in bench/cases (model-derived shapes).
With NK_ASV_QUICK=1 (CI smoke), each op's case grid is its first quick case alone, impl
lists one CPU implementation besides "dispatch", and only relu has a FirstCall class.

Benchmarks:
  time_op                 run time; compilation happens in setup
  <Op>FirstCall.timeraw_cold / timeraw_warm (param: case): the first call of
                          dispatch.<op> in a fresh process, with an empty NUMBA_CACHE_DIR
                          (cold: every kernel compiles) or one filled beforehand (warm)
  track_ms_per_gflop / track_ms_per_gb
                          achieved throughput, inverted: 1000 / GFLOP/s for the ops whose
                          record says bound="compute", 1000 / GB/s for the memory-bound
                          ones.  asv has no "higher is better", so rates are tracked
                          inverted: lower is better, as for times, and `asv continuous`
                          flags slowdowns only.
  peakmem_op              peak resident memory of the call (attention: no Sq x Skv buffer)
  track_err_vs_fp32_normal / _outliers
                          low-precision cases only (bench/accuracy.py): the normwise max
                          relative error against the float32 op, per input distribution
"""
from __future__ import annotations

import os
import sys


def _root():
    return os.environ.get("ASV_CONF_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _add_repo_root():
    # bench/ is not installed with the package: find it from the asv config dir or this
    # file.  Appended, so that in an asv virtualenv the installed `dispatch` of the commit
    # under test wins over the working tree's.
    root = _root()
    if root not in sys.path:
        sys.path.append(root)


_add_repo_root()

import numpy as np  # noqa: E402

from bench import cases as C  # noqa: E402
from bench import peers as P  # noqa: E402
from bench import timing  # noqa: E402

QUICK = os.environ.get("NK_ASV_QUICK") == "1"
# In the quick (CI smoke) mode a fresh-process compile is timed for these ops only: each
# costs a Python start plus a full compile, and the report measures every family anyway.
QUICK_FIRST_CALL_OPS = {"relu"}


def _registry():
    import dispatch  # noqa: F401 - registers the ops
    from dispatch import registry

    return registry


def _impls(op):
    names = ["dispatch"]
    try:
        o = _registry().OPS.get(op)
    except Exception:  # noqa: BLE001 - a broken import: only the numpy peer remains
        o = None
    if o is not None:
        cpu = [n for n, impl in o.implementations.items() if impl.device == "cpu"]
        # quick (CI smoke): one forced implementation proves the forced path; the test
        # suite runs every implementation anyway
        names += cpu[:1] if QUICK else cpu
    # quick: no "cuda" column on a host without a driver (a fork per skipped combination);
    # the full grid keeps it, so results of GPU and CPU hosts share their parameters
    return names + (["numpy"] if QUICK and _no_gpu_here() else ["numpy", "cuda"])


def _no_gpu_here():
    """True where no NVIDIA driver is present, decided without importing numba.cuda: that
    import plus cuda.is_available() took 0.9 s in every forked child (2 cores, Zen 4,
    2026-12-02); without them the whole quick run took 94 s instead of 268 s.  The driver
    creates /dev/nvidiactl and /proc/driver/nvidia (also inside containers given a GPU)."""
    return not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia"))


def _cuda_available():
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or _no_gpu_here():
        return False
    try:
        from numba import cuda

        return cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


_FIRST_CALL = """
import os, sys, subprocess
sys.path.append({root!r})
cache = {cache!r}
if cache is None:
    import tempfile
    cache = tempfile.mkdtemp(prefix="nk-asv-cold-")
os.environ["NUMBA_CACHE_DIR"] = cache
import numpy as np
import dispatch
from bench import cases as C
case = C.by_id({case_id!r})
args, kwargs = case.call_args(case.inputs(np.random.default_rng(0)))
fn = getattr(dispatch, case.op)
"""

_FILL = """
import os, sys
sys.path.append({root!r})
import numpy as np
import dispatch
from bench import cases as C
case = C.by_id({case_id!r})
args, kwargs = case.call_args(case.inputs(np.random.default_rng(0)))
getattr(dispatch, case.op)(*args, **kwargs)
"""


def op_benchmark(op: str):
    """The asv class for one op (its name: the op in CamelCase)."""
    op_cases = [c for c in C.CASES if c.op == op]
    case_names = [c.name for c in op_cases]
    by_name = {c.name: c for c in op_cases}
    bound = _registry().OPS[op].bound
    first_quick = next((c.name for c in op_cases if c.quick), case_names[0] if case_names else None)

    class Bench:
        # quick: the one case as the whole grid (asv forks a child per parameter combination,
        # 30-40 ms each from the fork server: skipped combinations cost as much as run ones)
        params = [_impls(op), [first_quick] if QUICK and first_quick else case_names]
        param_names = ["impl", "case"]
        timeout = 300
        # time_op: a few samples are plenty for these run times
        repeat = (1, 5, 20.0)
        warmup_time = 0.05

        def setup(self, impl, case_name):
            case = by_name[case_name]
            registry = _registry()
            o = registry.OPS.get(op)
            if o is None:
                raise NotImplementedError(f"dispatch.{op} not registered at this commit")
            self.case = case
            inputs = case.inputs(np.random.default_rng(0))
            args, kwargs = case.call_args(inputs)
            call = o.describe(*args, **kwargs)
            self.flops = o.flops(call) if o.flops else None
            self.nbytes = o.bytes(call) if o.bytes else None
            if impl == "numpy":
                try:
                    self.fn, _ = P.prepare("numpy", case, inputs)
                except P.Unavailable as exc:   # an op with no numpy version: skipped, not failed
                    raise NotImplementedError(str(exc)) from None
            elif impl == "cuda":
                if not _cuda_available():
                    raise NotImplementedError("no CUDA GPU")
                from numba import cuda

                dev = lambda a: cuda.to_device(a) if isinstance(a, np.ndarray) else a  # noqa: E731
                dargs = tuple(dev(a) for a in args)
                dkw = {k: dev(v) for k, v in kwargs.items()}
                fn = getattr(__import__("dispatch"), op)

                def run():
                    r = fn(*dargs, **dkw)
                    cuda.synchronize()
                    return r

                self.fn = run
            elif impl == "dispatch":
                fn = getattr(__import__("dispatch"), op)
                self.fn = lambda: fn(*args, **kwargs)
            else:
                rec = o.implementations.get(impl)
                if rec is None:
                    raise NotImplementedError(f"{op} has no implementation {impl!r} at this commit")
                if rec.refusals(call.key):
                    raise NotImplementedError(f"{impl} refuses this case: {rec.refusals(call.key)}")
                params = dict(rec.params)
                self.fn = lambda: rec.run(params, *call.args)
            self.fn()  # compile (or load from numba's cache) outside the timing

        def time_op(self, impl, case_name):
            self.fn()

        def _rate(self, work):
            st = timing.time_one(self.fn, rounds=3, warmup=0, batch_s=0.02)
            return work / st.median / 1e9

    # Achieved rates, tracked inverted (ms per GFLOP = 1000 / GFLOP/s, ms per GB = 1000 / GB/s):
    # asv has no "higher is better", so a rising GFLOP/s would read as a regression and make
    # `asv continuous` fail on a speed-up.  Inverted, lower is better like every asv number.
    if bound == "compute":
        def track_ms_per_gflop(self, impl, case_name):
            """1000 / achieved GFLOP/s (lower is better)."""
            return 1e3 / self._rate(self.flops) if self.flops else float("nan")

        track_ms_per_gflop.unit = "ms/GFLOP"
        Bench.track_ms_per_gflop = track_ms_per_gflop
    else:
        def track_ms_per_gb(self, impl, case_name):
            """1000 / achieved GB/s (lower is better)."""
            return 1e3 / self._rate(self.nbytes) if self.nbytes else float("nan")

        track_ms_per_gb.unit = "ms/GB"
        Bench.track_ms_per_gb = track_ms_per_gb
    def peakmem_op(self, impl, case_name):
        self.fn()

    Bench.peakmem_op = peakmem_op
    Bench.first_quick = first_quick  # the case NK_ASV_QUICK=1 runs (and _preload compiles)

    if any(c.accuracy is not None for c in op_cases):
        # low-precision cases: the accuracy cost against the float32 op (bench/accuracy.py),
        # tracked per input distribution; measured through dispatch once, not per impl
        from bench import accuracy as A

        def _track_error(dist):
            def track(self, impl, case_name):
                case = by_name[case_name]
                if case.accuracy is None or impl != "dispatch":
                    return float("nan")  # not a low-precision case, or a forced impl (measured once, via dispatch)
                return A.measure(case, np.random.default_rng(0))[dist]["max_rel"]

            track.unit = "max rel err"
            track.__name__ = f"track_err_vs_fp32_{dist}"
            return track

        for dist in A.DISTRIBUTIONS:
            setattr(Bench, f"track_err_vs_fp32_{dist}", _track_error(dist))

    Bench.__name__ = Bench.__qualname__ = "".join(p.capitalize() for p in op.split("_"))
    return Bench


def first_call_benchmark(op: str):
    """The asv class timing the first call of dispatch.<op> in a fresh process."""
    op_cases = [c for c in C.CASES if c.op == op]
    by_name = {c.name: c for c in op_cases}
    first_quick = next((c.name for c in op_cases if c.quick), op_cases[0].name if op_cases else None)

    class FirstCall:
        params = [[first_quick] if QUICK and first_quick else [c.name for c in op_cases]]
        param_names = ["case"]
        timeout = 300
        repeat = 1
        number = 1

        def setup(self, case_name):
            if op not in _registry().OPS:
                raise NotImplementedError(f"dispatch.{op} not registered at this commit")

        def _code(self, case_name, warm):
            root = _root()
            case_id = by_name[case_name].id
            cache = None
            if warm:  # fill a cache in another fresh process first (not timed)
                import subprocess
                import tempfile

                cache = tempfile.mkdtemp(prefix="nk-asv-warm-")
                subprocess.run([sys.executable, "-c", _FILL.format(root=root, case_id=case_id)],
                               env=dict(os.environ, NUMBA_CACHE_DIR=cache), check=True, capture_output=True)
            return "fn(*args, **kwargs)", _FIRST_CALL.format(root=root, cache=cache, case_id=case_id)

        def timeraw_cold(self, case_name):
            """First call with an empty NUMBA_CACHE_DIR: every kernel compiles."""
            return self._code(case_name, warm=False)

        def timeraw_warm(self, case_name):
            """First call with numba's cache filled: kernels load from disk."""
            return self._code(case_name, warm=True)

    FirstCall.__name__ = FirstCall.__qualname__ = "".join(p.capitalize() for p in op.split("_")) + "FirstCall"
    return FirstCall


def _in_asv_forkserver() -> bool:
    """Whether this process is asv's fork server (asv.conf.json: launch_method forkserver):
    it imports the suite once and forks one child per benchmark (asv_runner/server.py; asv
    starts it as ``... run_server <dir> <socket>``).  asv's discovery imports the suite in a
    process of its own, which is not one."""
    return len(sys.argv) > 1 and sys.argv[1] == "run_server"


def _preload(classes) -> None:
    """Run each op benchmark's setup once, for its first quick case and every impl, so that
    the compiled kernels live in the fork server and every benchmark child inherits them.

    Why: each child otherwise loads the same kernels from numba's cache again (0.2-0.3 s an
    impl; GroupNorm's dispatch / forced / numpy setups took 0.23 / 0.30 / 0.05 s in a forked
    child, 2026-11-27), once per benchmark method (peakmem_op, time_op, track_*): the CI
    smoke run spent ~250 s on 244 benchmarks.  Forking after parallel kernels ran is safe
    with numba's tbb and workqueue layers, not with GNU OpenMP's (a child would hang in
    its first parallel region): with omp nothing is preloaded."""
    try:
        from kernels_cpu import runtime

        if runtime.layer() == "omp":
            return
    except Exception:  # noqa: BLE001 - an older commit (./run.sh history) without it: no preloading
        return
    for cls in classes:
        for impl in cls.params[0]:
            if impl in ("numpy", "cuda") or cls.first_quick is None:
                continue
            try:
                cls().setup(impl, cls.first_quick)
            except Exception:  # noqa: BLE001 - refused or skipped here: the child reports it
                pass


def op_classes() -> dict:
    """{ClassName: class} for every registered op that has benchmark cases."""
    ops = [name for name in _registry().OPS if any(c.op == name for c in C.CASES)]
    out = {}
    for op in ops:
        # quick: first-call classes only for the ops timed there (the others' would only skip)
        first = () if QUICK and op not in QUICK_FIRST_CALL_OPS else (first_call_benchmark(op),)
        for cls in (op_benchmark(op), *first):
            out[cls.__name__] = cls
    if _in_asv_forkserver():
        _preload([cls for name, cls in out.items() if not name.endswith("FirstCall")])
    return out
