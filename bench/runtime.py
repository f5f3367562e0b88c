"""Our CPU kernels where users run them: four settings, and the threading-layer A/B.

    python -m bench.runtime              the four settings for this process's threading layer
    python -m bench.runtime --ab         the same in one fresh process per layer (tbb, omp,
                                         workqueue; and tbb with NK_KEEP_WARM_MS=0) plus
                                         PyTorch / numpy alone, and the table
    python -m bench.runtime --json PATH  also write the rows
    python -m bench.runtime --keepwarm   the keep-warm heartbeat on / off in one process,
                                         alternating: our calls after idle, PyTorch beside it
    python -m bench.runtime --wake       how long numba's second thread takes to start a
                                         parallel region after idle (this process's layer;
                                         NUMBA_THREADING_LAYER=omp ... to compare)

The settings (per case, medians of per-call seconds):
  (a) loop:   the call back to back (what a microbenchmark sees);
  (b) idle:   one call after 0.2 s of sleep (a request arriving at a server; the thread
              pool's wake-up is paid here);
  (c) mixed:  one call right after a PyTorch call (numpy's BLAS when PyTorch is absent), as
              in a model mixing both libraries; the peer's own time in the same alternation
              is recorded too (composability: it must not slow down because we ran);
  (d) threads: 4 Python threads calling at once, each its own inputs; the median latency
              of one call (4 threads share 2 cores, so twice the loop time is par); every
              result is checked bit for bit against the same call made alone (a wrong or
              crashed call fails the run);
  (e) paced:  batches of PACED_CALLS calls back to back, each batch after a PACED_PAUSE_S
              sleep, the median per-call time of a batch (a training or serving loop: work
              between steps).  Added for numba's tbb layer: once its pool has lived ~0.2 s,
              a parallel layer_norm 512x768 in this pattern runs at serial speed (154-178 us
              against 69-73 back to back; omp 76-98 us), 2026-11-25 notes.
Each case is timed as dispatched and, where the op has one, with its serial kernel forced
(the serial/parallel thresholds must hold in (b) and (c), not only in (a)).
The report (python -m bench) runs the same settings on its runtime cases; see report.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from . import ROOT, timing, tool_parser, write_json

IDLE_S = timing.PAUSE_S
PACED_CALLS = 10
PACED_PAUSE_S = 0.01
LAYERS = ("tbb", "omp", "workqueue")
# --ab's fresh processes: each threading layer, and tbb without the keep-warm heartbeat
# (kernels_cpu/keepwarm.py), so that every A/B also shows what the heartbeat buys
AB_MODES = {"tbb": {"NUMBA_THREADING_LAYER": "tbb"},
            "tbb-nowarm": {"NUMBA_THREADING_LAYER": "tbb", "NK_KEEP_WARM_MS": "0"},
            "omp": {"NUMBA_THREADING_LAYER": "omp"},
            "workqueue": {"NUMBA_THREADING_LAYER": "workqueue"}}


@dataclass(frozen=True)
class RuntimeCase:
    """One public call at a real-time shape. ``build(rng)`` -> (args, kwargs)."""

    name: str
    op: str
    build: object


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _cases():
    def ln(rng):
        return (_f32(rng, 128, 768), _f32(rng, 768), _f32(rng, 768)), {}

    def sm_small(rng):
        return (_f32(rng, 1, 12, 128, 128),), {}

    def sm_big(rng):
        return (_f32(rng, 4096, 1024),), {}

    def attn(rng):
        q = _f32(rng, 1, 12, 128, 64)
        return (q, _f32(rng, 1, 12, 128, 64), _f32(rng, 1, 12, 128, 64)), {}

    def geglu(rng):
        return (_f32(rng, 128, 3072), _f32(rng, 128, 3072)), {}

    def lin(rng):
        return (_f32(rng, 128, 768), _f32(rng, 3072, 768)), {"bias": _f32(rng, 3072), "activation": "gelu_tanh"}

    def mm(rng):
        return (_f32(rng, 128, 768), _f32(rng, 768, 768)), {}

    return [
        RuntimeCase("layer_norm 128x768", "layer_norm", ln),
        RuntimeCase("softmax 1x12x128x128", "softmax", sm_small),
        RuntimeCase("softmax 4096x1024", "softmax", sm_big),
        RuntimeCase("attention 1x12x128x64", "attention", attn),
        RuntimeCase("geglu 128x3072", "geglu", geglu),
        RuntimeCase("linear+bias+gelu_tanh 128x768x3072", "linear", lin),
        RuntimeCase("matmul 128x768x768", "matmul", mm),
    ]


CASES = _cases()


def _peer():
    """(name, fn) of the other library's call for setting (c): a PyTorch linear
    128x768x3072 (numpy's BLAS matmul of the same shape without PyTorch)."""
    rng = np.random.default_rng(1)
    a, w = _f32(rng, 128, 768), _f32(rng, 3072, 768)
    try:
        import torch
        ta, tw = torch.from_numpy(a), torch.from_numpy(w)
        return "torch linear 128x768x3072", lambda: torch.nn.functional.linear(ta, tw)
    except ImportError:
        wt = np.ascontiguousarray(w.T)
        return "numpy matmul 128x768x3072", lambda: a @ wt


def _median_of(fn, n, before=None):
    out = []
    for _ in range(n):
        if before is not None:
            before()
        t0 = timing.clock()
        fn()
        out.append(timing.clock() - t0)
    return statistics.median(out)


def _paced(fn, n):
    """Median per-call seconds of n batches of PACED_CALLS calls, each after a pause."""
    out = []
    for _ in range(n):
        time.sleep(PACED_PAUSE_S)
        t0 = timing.clock()
        for _ in range(PACED_CALLS):
            fn()
        out.append((timing.clock() - t0) / PACED_CALLS)
    return statistics.median(out)


def _threads(fn_for, nthreads=4, calls=12, context=contextlib.nullcontext):
    """Run fn_for(i)() `calls` times in each of nthreads threads at once, each thread inside
    context() (dispatch.use overrides are per thread). Returns (median
    latency of one call while the others run, mismatches): each result is compared with
    thread i's result computed alone right after its timed call, then dropped.  (Keeping
    all 4 x 12 results for a comparison at the end made every call fault in fresh pages:
    softmax 4096x1024 measured 83 ms per call that way, 2.2-2.8 ms with results dropped,
    2026-11-25.  The comparison holds the GIL, which the kernels do not need.)"""
    alone = [np.array(fn_for(i)(), copy=True) for i in range(nthreads)]
    bad = [0] * nthreads
    lat = [[] for _ in range(nthreads)]
    barrier = threading.Barrier(nthreads)

    def work(i):
        with context():
            f = fn_for(i)
            barrier.wait()
            for _ in range(calls):
                t0 = timing.clock()
                r = f()
                lat[i].append(timing.clock() - t0)
                bad[i] += not np.array_equal(np.asarray(r), alone[i], equal_nan=True)
                del r

    ts = [threading.Thread(target=work, args=(i,)) for i in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return statistics.median(x for per in lat for x in per), sum(bad)


def _variants(case):
    """{label: force-name or None}: as dispatched, and the serial kernel where the op has one."""
    from dispatch import registry
    names = [i.name for i in registry.implementations(case.op, "cpu")]
    out = {"dispatched": None}
    if "cpu-serial" in names:
        out["serial"] = "cpu-serial"
    return out


def measure(cases=None, *, rounds=9, progress=None) -> list[dict]:
    """Settings (a)-(e) for each case in this process. Returns one row per case and variant."""
    import dispatch
    from kernels_cpu import runtime as rt

    cases = CASES if cases is None else cases
    peer_name, peer = _peer()
    rows = []
    for case in cases:
        fn_pub = getattr(dispatch, case.op)
        args, kwargs = case.build(np.random.default_rng(0))
        for label, force in _variants(case).items():
            # the override is entered once around the measurement (and once in each thread
            # of (d)), not per call: dispatch.use cost ~20 us a call before its states were
            # shared (select._STATES; ~3 us since), which made the forced serial kernel look
            # slower than the same kernel chosen by the rules
            ctx = (lambda f=force, op=case.op: dispatch.use(**{op: f})) if force else contextlib.nullcontext

            def call(a=args, k=kwargs):
                return fn_pub(*a, **k)

            def fn_for(i, c=case):
                a, k = c.build(np.random.default_rng(100 + i))
                return lambda: fn_pub(*a, **k)

            with ctx():
                call()
                call()
                a_loop = timing.time_one(call, rounds=rounds).median
                b_idle = _median_of(call, rounds, before=lambda: time.sleep(IDLE_S))
                peer()
                c_mixed = _median_of(call, rounds, before=peer)
                c_peer = _median_of(peer, rounds, before=call)
                e_paced = _paced(call, rounds)
                d_threads, bad = _threads(fn_for, context=ctx)
            rows.append({"case": case.name, "op": case.op, "variant": label, "layer": rt.layer(),
                         "loop_s": a_loop, "idle_s": b_idle, "mixed_s": c_mixed, "threads_s": d_threads,
                         "thread_mismatches": bad, "peer": peer_name, "peer_mixed_s": c_peer,
                         "paced_s": e_paced})
            if progress is not None:
                progress(f"{case.name} [{label}]")
            if bad:
                raise AssertionError(f"{case.name} [{label}]: {bad} results from 4 threads differ "
                                     f"from the same call made alone ({rt.describe()})")
    return rows


def peer_alone(rounds=9) -> dict:
    """The peer's call and PyTorch's masked attention in a process where our package is not
    imported: the baseline of composability."""
    name, peer = _peer()
    peer()
    out = {"peer": name, "peer_loop_s": timing.time_one(peer, rounds=rounds).median,
           "peer_idle_s": _median_of(peer, rounds, before=lambda: time.sleep(IDLE_S))}
    out.update(_torch_sdpa(rounds))
    return out


def _torch_sdpa(rounds):
    """PyTorch's scaled_dot_product_attention on (16, 12, 198, 32) with a boolean mask: the
    call that slowed down 20-40x next to numba's omp layer (see kernels_cpu/runtime.py)."""
    f = _torch_sdpa_call()
    if f is None:
        return {}
    f()
    return {"sdpa_s": timing.time_one(f, rounds=rounds).median}


def format_rows(rows) -> str:
    head = (f"{'case':36} {'variant':10} {'layer':9} {'(a) loop':>10} {'(b) idle':>10} {'(c) mixed':>10} "
            f"{'(d) 4 thr':>10} {'(e) paced':>10} {'peer in (c)':>12}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:36} {r['variant']:10} {r['layer']:9} {_ms(r['loop_s'])} {_ms(r['idle_s'])} "
                     f"{_ms(r['mixed_s'])} {_ms(r['threads_s'])} {_ms(r['paced_s'])} "
                     f"{_ms(r['peer_mixed_s'], 12)}")
    return "\n".join(lines)


def _ms(s, w=10):
    return f"{s * 1e3:{w - 3}.3f} ms"


def _child(mode, out_path, rounds):
    if mode == "alone":
        res = {"alone": peer_alone(rounds)}
    else:
        import dispatch  # noqa: F401 - our package imported and used first, as a user's script does
        rows = measure(rounds=rounds, progress=lambda m: print(f"  {mode}: {m}", file=sys.stderr, flush=True))
        res = {"rows": rows, "after_ours": peer_alone(rounds)}
    with open(out_path, "w") as f:
        json.dump(res, f)


def ab(rounds=9, layers=tuple(AB_MODES), json_path=None) -> dict:
    """One fresh process per entry of AB_MODES (its environment set for it), and one with
    PyTorch / numpy alone; prints the table and returns the results."""
    import tempfile
    results = {}
    for mode in ("alone",) + tuple(layers):
        env = dict(os.environ)
        env.pop("NK_KEEP_WARM_MS", None)
        env.update(AB_MODES.get(mode, {}))
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = tmp.name
        p = subprocess.run([sys.executable, "-m", "bench.runtime", "--child", mode, "--out", path,
                            "--rounds", str(rounds)], env=env, cwd=ROOT)
        if p.returncode != 0:
            results[mode] = {"crashed": p.returncode}
            print(f"{mode}: child exited with {p.returncode}")
            continue
        with open(path) as f:
            results[mode] = json.load(f)
        os.unlink(path)
    alone = results.get("alone", {}).get("alone", {})
    for mode in layers:
        r = results.get(mode, {})
        if "rows" not in r:
            continue
        print(f"\n== {' '.join(f'{k}={v}' for k, v in AB_MODES[mode].items())} ==")
        print(format_rows(r["rows"]))
        after = r["after_ours"]
        for k in ("peer_loop_s", "peer_idle_s", "sdpa_s"):
            if k in after and k in alone:
                print(f"  {k[:-2]:10} alone {alone[k] * 1e3:8.3f} ms, after our kernels {after[k] * 1e3:8.3f} ms "
                      f"({after[k] / alone[k]:.2f}x)")
    if json_path:
        write_json(json_path, results)
    return results



WAKE_IDLES_S = (0.0, 0.001, 0.01, 0.05, 0.2)


def wake_delays(rounds=11, idles=WAKE_IDLES_S, cap=50_000_000):
    """{idle seconds: (median, max) seconds} of a two-iteration parallel region after that
    much sleep, in which iteration 0 spins (atomic reads) until iteration 1 has run: the
    time until a second thread takes up work.  (A layer that lets the caller run both
    iterations would spin to `cap`, about 0.5 s: the region then never got a second thread.)
    On the 2-core VMs of this project (haltpoll, guest_halt_poll_ns=0: an idle vCPU halts at
    once), medians after 0 / 1 / 10 / 50 / 200 ms of idle (2026-11-27, AMD EPYC Zen 5):
    tbb 5 us / 28 us / 94 us / 1.8 ms / 3.8 ms, omp 1.5 us / 1.7 us / 54 us / 5.8 ms /
    7.8 ms.  A parallel kernel shorter than that, called after a pause, runs on the calling
    thread alone (ours hand out work dynamically, so none waits for the late thread).
    Each probe call arms the keep-warm heartbeat as a dispatched call does
    (kernels_cpu/keepwarm.py); with it (medians of 4 runs, same host): 50 ms 88, 141, 190,
    1872 us; 200 ms 149, 156, 157, 1179 us.  NK_KEEP_WARM_MS=0 gives the figures above."""
    import numba
    from numba import njit, prange
    from kernels_cpu import keepwarm
    from kernels_cpu.parallel import fetch_add

    @njit(parallel=True, nogil=True)
    def probe(flag, cap):
        for w in prange(2):
            if w == 1:
                fetch_add(flag, 0, 1)
            else:
                n = 0
                while fetch_add(flag, 0, 0) == 0 and n < cap:
                    n += 1
                flag[1] = n

    flag = np.zeros(2, np.int64)
    probe(flag, 10)
    out = {}
    for idle in idles:
        ts = []
        for _ in range(rounds):
            if idle:
                time.sleep(idle)
            flag[:] = 0
            t0 = time.perf_counter()
            probe(flag, cap)
            ts.append(time.perf_counter() - t0)
            keepwarm.touch()  # what dispatch does after every CPU kernel
        out[idle] = (statistics.median(ts), max(ts))
    return out, numba.threading_layer(), numba.get_num_threads()


def keepwarm_ab(rounds=8, cases=None) -> dict:
    """The keep-warm heartbeat (kernels_cpu/keepwarm.py) on and off in this process,
    alternating each round: (b) one call of each runtime case after 0.2 s idle, and the
    peer's call plus PyTorch's masked attention timed while the heartbeat beats (the window
    held open) and while it is off: what it buys us and what it costs the others.
    {"ours": {case: {"on": s, "off": s}}, "peers": {name: {"on": s, "off": s}}} (medians)."""
    import dispatch
    from kernels_cpu import keepwarm
    if not keepwarm.enabled():
        return {"skipped": keepwarm.describe()}
    calls = {}
    for case in cases or CASES:
        a, k = case.build(np.random.default_rng(0))
        calls[case.name] = (lambda f=getattr(dispatch, case.op), a=a, k=k: f(*a, **k))
    peer_name, peer = _peer()
    peers = {peer_name: peer}
    sdpa = _torch_sdpa_call()
    if sdpa is not None:
        peers["torch sdpa 16x12x198x32 masked"] = sdpa
    for f in list(calls.values()) + list(peers.values()):
        f()
    ours = {n: {"on": [], "off": []} for n in calls}
    others = {n: {"on": [], "off": []} for n in peers}
    old = keepwarm.window_ms()
    try:
        for r in range(rounds):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                keepwarm.set_window_ms(old if mode == "on" else 0)
                for n, f in calls.items():
                    f()
                    time.sleep(IDLE_S)
                    t0 = timing.clock()
                    f()
                    ours[n][mode].append(timing.clock() - t0)
                keepwarm.set_window_ms(3_600_000 if mode == "on" else 0)
                next(iter(calls.values()))()   # arms it (or not), as our call before theirs would
                for n, f in peers.items():
                    others[n][mode].append(timing.time_one(f, rounds=3, batch_s=0.03).median)
    finally:
        keepwarm.set_window_ms(old)
    med = lambda d: {n: {m: statistics.median(v) for m, v in x.items()} for n, x in d.items()}  # noqa: E731
    return {"ours": med(ours), "peers": med(others)}


def _torch_sdpa_call():
    """The call of _torch_sdpa (None without PyTorch)."""
    try:
        import torch
    except ImportError:
        return None
    g = torch.Generator().manual_seed(0)
    q = torch.randn(16, 12, 198, 32, generator=g)
    mask = torch.ones(16, 1, 198, 198, dtype=torch.bool)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def main(argv=None):
    p = tool_parser("python -m bench.runtime", __doc__, 9, ("alone",) + tuple(AB_MODES))
    p.add_argument("--ab", action="store_true", help="one fresh process per threading layer")
    p.add_argument("--wake", action="store_true", help="the second thread's start delay after idle")
    p.add_argument("--keepwarm", action="store_true",
                   help="the keep-warm heartbeat on / off, alternating: our calls after idle, PyTorch beside it")
    a = p.parse_args(argv)
    if a.child:
        _child(a.child, a.out, a.rounds)
        return 0
    if a.wake:
        import dispatch  # noqa: F401  (the package's threading-layer set-up: tbb's loader path)
        delays, layer, threads = wake_delays(a.rounds)
        print(f"threading layer {layer}, {threads} threads: second thread's start after idle (median / max)")
        for idle, (med, mx) in delays.items():
            print(f"  idle {idle * 1e3:6.1f} ms: {med * 1e6:9.1f} us / {mx * 1e6:9.1f} us")
        if a.json:
            write_json(a.json, {"layer": layer, "threads": threads,
                                "delays": [{"idle_s": i, "median_s": m, "max_s": x} for i, (m, x) in delays.items()]})
        return 0
    if a.ab:
        ab(a.rounds, json_path=a.json)
        return 0
    if a.keepwarm:
        from kernels_cpu import keepwarm
        res = keepwarm_ab(a.rounds)
        print(keepwarm.describe())
        if "skipped" not in res:
            print("(b) one call after 0.2 s idle          heartbeat off    on")
            for n, v in res["ours"].items():
                print(f"  {n:36} {_ms(v['off'])} {_ms(v['on'])}  ({v['on'] / v['off']:.2f}x)")
            print("their calls while it beats               off    on")
            for n, v in res["peers"].items():
                print(f"  {n:36} {_ms(v['off'])} {_ms(v['on'])}  ({v['on'] / v['off']:.3f}x)")
        if a.json:
            write_json(a.json, res)
        return 0
    from kernels_cpu import runtime as rt
    rows = measure(rounds=a.rounds, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    print(rt.describe())
    print(format_rows(rows))
    if a.json:
        write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
