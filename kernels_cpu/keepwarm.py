"""Keep the cores awake for a short window after our kernels run, so that a parallel kernel
called after a pause gets its second thread in microseconds, not milliseconds.

Why (2-core VMs of this project, haltpoll with guest_halt_poll_ns=0, tbb layer; medians,
``python -m bench.runtime --wake``): after 50 / 200 ms of idle, numba's second thread
took 1.8 / 3.8 ms to start work (5 us back to back).  An idle vCPU halts at once and the
host takes it away; the guest scheduler then treats it as preempted and queues the woken
worker behind the caller.  A parallel kernel shorter than that runs on the calling thread
alone, so every burst after a pause (a request, a frame, the report's 0.2 s pauses
between libraries) starts at half speed.  OpenBLAS and GNU OpenMP (PyTorch) avoid this by
spinning their workers for a while after each call, at the cost of whole cores.

How: one daemon thread per CPU this process may run on, pinned to it and scheduled
SCHED_IDLE (it runs only when that CPU has nothing else to run, and never preempts real
work), sleeps PERIOD_US at a time from QUIET_US after our last kernel call until the
window (NK_KEEP_WARM_MS, default DEFAULT_WINDOW_MS) has passed, then parks on a futex
until the next call.  Each wake-up keeps the vCPU from being taken away.

Measured 2026-11-27 on AMD EPYC Zen 5 (2 vCPUs, tbb), heartbeat threads on both CPUs:
- second thread's start after 50 / 200 ms idle (medians of 9-11, one per run): off 1.8 /
  3.8 ms in every run; 200 us period (SCHED_IDLE) 55, 88, 141, 148, 190, 1872, 1910 / 115,
  129, 139, 149, 156, 157, 186, 1179 us; 100 us 50, 63 / 96, 112 us (21% of a core, below);
  500 us 95-140 / 460-710 us; 1 ms 0.9-1.9 / 0.7-1.9 ms.
- cost while beating, idle machine: 18 us of CPU per beat (the VM's timer and halt exits),
  13% of one core in all at 200 us (a beat every ~275 us per CPU).
- cost to concurrent work while beating (SCHED_IDLE, 200 us): numpy and PyTorch 1024^3
  GEMMs 1.007x / 1.008x their time without it; at normal priority 1.10x / 1.12x, which is
  why the threads are SCHED_IDLE (and do not run at all where that cannot be set).
  ``python -m bench.runtime --keepwarm`` (on / off alternating in one process, 8 rounds):
  PyTorch linear 128x768x3072 0.97x, masked SDPA 16x12x198x32 1.005x; our real-time cases
  after 0.2 s idle 0.70x (linear+gelu 128x768x3072, 3.60 -> 2.52 ms) to 0.95x (geglu).
- what it cannot fix: a serial layer_norm 128x768 still takes ~150-250 us after 0.2 s
  idle instead of 30 us (the kernel alone 39-91 us instead of 12, even when the caller
  busy-waits through the pause): the caches and predictors are cold after a pause, which
  every library pays.

- cold start: the loop is a small C function built with llvmlite (about 10 ms, on the
  first call), not a numba function: that compiled in the first heartbeat thread under
  numba's global compile lock, between the caller's own compiles (see _beat).

``NK_KEEP_WARM_MS=0`` turns it off; ``set_window_ms`` changes it for the whole process
(the heartbeat threads are the process's, like numba's thread pool).
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import llvmlite.binding as llvm
import numba
from llvmlite import ir
from numba.core.compiler_lock import global_compiler_lock

ENV = "NK_KEEP_WARM_MS"
DEFAULT_WINDOW_MS = 300   # covers the 0.2 s pauses of the report and the settings
PERIOD_US = 200           # measured above: 200 us holds the start near 0.1 ms, 1 ms does not
# No beats while calls come closer than this: each wake-up of a heartbeat thread while our
# kernels run costs them far more than its own 10 us (the VM's timer exits, a thread switch
# when the team's spin yields to it).  Checking back every QUIET_US, prepacked matmul
# 128x768x768 back to back (2 threads, Xeon with AVX-512, 2026-12-03, one process per row,
# two each, medians of 6 rounds alternating window 0 / 300 ms): QUIET_US 1000 490 -> 537 and
# 497 -> 550 us (40-90 wake-ups per 50 calls), 3000 +3-4%, 5000 504 -> 513 and 487 -> 493,
# 10000 +1.6-2%.  What it risks: a call 5-10 ms after the last one may find a vCPU the host
# took away (numba's second thread started 1.9 ms late after 10 ms idle with no beats, 74-80
# us after 5 ms); the wake probe (bench.runtime.wake_delays, 21 rounds) at 2-12 ms idle gave
# medians of 0.05-3.9 ms with QUIET_US 1000 and 0.06-1.0 ms with 5000: no worse.
QUIET_US = 5000

# slots of the shared state array (int64): read by the heartbeat loop without the GIL
LAST_NS = 0      # time.monotonic_ns() of the last touch()
WINDOW_NS = 1    # beat until LAST_NS + WINDOW_NS
STOP = 2         # nonzero: every heartbeat loop returns at its next wake-up
BEATS = 3        # beats so far (all threads): for tests and measurements
PARKED = 4       # heartbeat loops asleep on the futex at GEN (the window passed)
GEN = 5          # futex word (its low 32 bits): touch() bumps it to wake parked loops
N_SLOTS = 6

# Linux's futex call (also the thread team's, team.py)
FUTEX_CALL = {"x86_64": 202, "aarch64": 98}   # SYS_futex
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129

_CLOCK_MONOTONIC = 1  # Linux's clockid for CLOCK_MONOTONIC (time.monotonic_ns reads the same)


def _usable_ms(ms) -> bool:
    """A window both settings accept: a non-negative, finite number (of milliseconds here)."""
    return ms >= 0.0 and ms != float("inf")


def amount_from_env(env, value, default, unit, zero):
    """A non-negative, finite number from the environment variable env's string value
    (unset or empty: default); anything else is a ValueError naming the variable, the unit
    and what 0 does (`zero`).  Shared with team.NK_SPIN_US."""
    if value is None or not value.strip():
        return float(default)
    try:
        amount = float(value)
    except ValueError:
        amount = float("nan")
    if not _usable_ms(amount):
        raise ValueError(f"{env}={value!r}: expected a non-negative number of {unit} "
                         f"(0 {zero}; default {default})")
    return amount


def _window_from_env(value):
    """Window in ms from the NK_KEEP_WARM_MS string (see amount_from_env)."""
    return amount_from_env(ENV, value, DEFAULT_WINDOW_MS, "milliseconds", "turns the heartbeat off")


def _unsupported():
    """Why the heartbeat cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return "needs Linux (per-thread CPU pinning and SCHED_IDLE)"
    if not hasattr(os, "SCHED_IDLE"):
        return "this Python has no os.SCHED_IDLE"
    if os.uname().machine not in FUTEX_CALL:
        return f"no futex call number known for {os.uname().machine}"
    return None


_UNSUPPORTED = _unsupported()


def _beat_ir(usleep_addr: int, clock_gettime_addr: int, syscall_addr: int, futex_call: int) -> str:
    """LLVM IR of
    - nk_beat(state, ts, period_us, quiet_ns): sleep in period_us steps while the window
      after the last touch lasts, waiting out the first quiet_ns without beats; when it
      has passed, park on the futex at GEN until touch() wakes it (nk_wake); return only
      when STOP is set.  state: the int64 slots above (read and counted atomically); ts:
      two int64 for clock_gettime's timespec.
    - nk_wake(state): bump GEN and wake every loop parked on it.
    libc's functions are called at their addresses."""
    i64, i32 = ir.IntType(64), ir.IntType(32)
    mod = ir.Module(name="nk_keepwarm")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64.as_pointer(), i64.as_pointer(), i64, i64]),
                     name="nk_beat")
    state, ts, period, quiet = fn.args
    blocks = {n: fn.append_basic_block(n) for n in ("entry", "loop", "awake", "wait", "quiet", "beat", "park",
                                                   "recheck", "unpark", "sleep", "done")}
    b = ir.IRBuilder(blocks["entry"])
    usleep = b.inttoptr(ir.Constant(i64, usleep_addr), ir.FunctionType(i32, [i32]).as_pointer())
    clock = b.inttoptr(ir.Constant(i64, clock_gettime_addr),
                       ir.FunctionType(i32, [i32, i64.as_pointer()]).as_pointer())
    sc_ty = ir.FunctionType(i64, [i64], var_arg=True).as_pointer()

    def slot(k, add=0):
        return b.atomic_rmw("add", b.gep(state, [ir.Constant(i64, k)]), ir.Constant(i64, add), "seq_cst")

    def futex(op, val):
        sc = b.inttoptr(ir.Constant(i64, syscall_addr), sc_ty)
        word = b.ptrtoint(b.gep(state, [ir.Constant(i64, GEN)]), i64)  # its low 32 bits (little-endian)
        b.call(sc, [ir.Constant(i64, futex_call), word, ir.Constant(i64, op), val, ir.Constant(i64, 0)])

    def idle_ns():
        b.call(clock, [ir.Constant(i32, _CLOCK_MONOTONIC), ts])
        now = b.add(b.mul(b.load(ts), ir.Constant(i64, 1_000_000_000)), b.load(b.gep(ts, [ir.Constant(i64, 1)])))
        return b.sub(now, slot(LAST_NS))

    b.branch(blocks["loop"])
    b.position_at_end(blocks["loop"])
    b.cbranch(b.icmp_signed("!=", slot(STOP), ir.Constant(i64, 0)), blocks["done"], blocks["awake"])
    b.position_at_end(blocks["awake"])
    idle = idle_ns()
    b.cbranch(b.icmp_signed(">=", idle, slot(WINDOW_NS)), blocks["park"], blocks["wait"])
    b.position_at_end(blocks["wait"])
    b.cbranch(b.icmp_signed("<", idle, quiet), blocks["quiet"], blocks["beat"])
    b.position_at_end(blocks["quiet"])
    us = b.add(b.sdiv(b.sub(quiet, idle), ir.Constant(i64, 1000)), ir.Constant(i64, 1))
    b.call(usleep, [b.trunc(us, i32)])
    b.branch(blocks["loop"])
    b.position_at_end(blocks["beat"])
    b.call(usleep, [b.trunc(period, i32)])
    slot(BEATS, 1)
    b.branch(blocks["loop"])
    # park: note GEN, count this loop parked, then look at the window again, so that a
    # touch() between the first look and the count is not slept through (touch writes
    # LAST_NS, then reads PARKED)
    b.position_at_end(blocks["park"])
    gen = slot(GEN)
    slot(PARKED, 1)
    b.branch(blocks["recheck"])
    b.position_at_end(blocks["recheck"])
    b.cbranch(b.icmp_signed("<", idle_ns(), slot(WINDOW_NS)), blocks["unpark"], blocks["sleep"])
    b.position_at_end(blocks["sleep"])
    futex(FUTEX_WAIT_PRIVATE, b.and_(gen, ir.Constant(i64, 0xFFFFFFFF)))  # returns at once if GEN moved
    b.branch(blocks["unpark"])
    b.position_at_end(blocks["unpark"])
    slot(PARKED, -1)
    b.branch(blocks["loop"])
    b.position_at_end(blocks["done"])
    b.ret_void()

    wake = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64.as_pointer()]), name="nk_wake")
    b = ir.IRBuilder(wake.append_basic_block("entry"))
    state = wake.args[0]
    slot(GEN, 1)
    futex(FUTEX_WAKE_PRIVATE, ir.Constant(i64, 0x7FFFFFFF))
    b.ret_void()
    return str(mod)


_beat_fn = None
_wake_fn = None
_beat_lock = threading.Lock()


def _beat():
    """The heartbeat loop as a C function called through ctypes, which releases the GIL for
    the call.  Built (by touch(), on the first call) with llvmlite's MCJIT in about 10 ms,
    not compiled by numba: numba compiled it (0.1-0.2 s with an empty cache) in the first
    heartbeat thread, under numba's global compile lock, between the caller's own
    compiles, so the cold first call of an op running several kernels waited for it
    (linear_cross_entropy on Zen 5: 0.09-0.18 s of its first call, 2026-11-27)."""
    global _beat_fn, _wake_fn
    if _beat_fn is not None:
        return _beat_fn
    with _beat_lock, global_compiler_lock:  # LLVM's context is not thread-safe: not beside a numba compile
        if _beat_fn is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            libc = ctypes.CDLL(None)
            addr = [ctypes.cast(f, ctypes.c_void_p).value for f in (libc.usleep, libc.clock_gettime, libc.syscall)]
            mod = llvm.parse_assembly(_beat_ir(*addr, FUTEX_CALL[os.uname().machine]))
            mod.verify()
            engine = llvm.create_mcjit_compiler(mod, llvm.Target.from_default_triple().create_target_machine())
            engine.finalize_object()
            proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
            fn = proto(engine.get_function_address("nk_beat"))
            fn.engine = engine  # the engine owns the code: kept alive with the function
            # a system call of a few us: made holding the GIL (PYFUNCTYPE), not giving it up
            wake = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(engine.get_function_address("nk_wake"))
            wake.engine = engine
            _wake_fn = wake
            _beat_fn = fn
        return _beat_fn


# A ctypes array, not numpy's: touch() reads and writes it on every kernel call, and its
# item access is plain C (0.125 us for touch's three against 0.2 through numpy scalars)
_state = (ctypes.c_int64 * N_SLOTS)()
_state[WINDOW_NS] = int(_window_from_env(os.environ.get(ENV)) * 1e6)
_state_addr = ctypes.addressof(_state)
_started = False    # touch() has started the heartbeat threads (or found it cannot)
_lock = threading.Lock()
_threads: list = []
_notes: dict = {}   # cpu -> why its heartbeat thread stopped (e.g. SCHED_IDLE refused)


def _cpus():
    return sorted(os.sched_getaffinity(0))


def _heart(cpu):
    """A heartbeat thread: pinned to `cpu`, SCHED_IDLE, beating while the window lasts and
    parked on a futex in between (nk_beat), so that waking it needs no GIL."""
    try:
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as e:  # a container that forbids it: better no heartbeat than one that preempts
        _notes[cpu] = f"cpu {cpu}: {e.strerror or e}"
        return
    ts = (ctypes.c_int64 * 2)()
    state = _state  # the loop gets raw addresses: the arrays stay referenced while it runs
    while not state[STOP]:
        try:
            _beat()(ctypes.addressof(state), ctypes.addressof(ts), PERIOD_US, QUIET_US * 1000)
        except Exception as e:  # noqa: BLE001 - e.g. the loop failed to build: stop, say why
            _notes[cpu] = f"cpu {cpu}: {type(e).__name__}: {e}"
            return


def _start():
    with _lock:
        if _threads:
            return
        for cpu in _cpus():
            t = threading.Thread(target=_heart, args=(cpu,), name=f"nk-keepwarm-{cpu}", daemon=True)
            t.start()
            _threads.append(t)


def precompile() -> None:
    """Build the heartbeat loop now (``python -m dispatch.warmup``); otherwise the first
    CPU call builds it (about 10 ms, see _beat)."""
    if _UNSUPPORTED is None:
        _beat()


def enabled() -> bool:
    """Whether touch() beats at all: a window > 0, a supported OS and more than one thread."""
    return _UNSUPPORTED is None and _state[WINDOW_NS] > 0 and numba.config.NUMBA_NUM_THREADS > 1


def _built() -> bool:
    """Whether the heartbeat loop is built, building it on the first call.  Built here, by
    the caller, not in a heartbeat thread: a process that exits right after its first call
    (asv's first-call benchmarks) then never exits in the middle of the build, which
    segfaulted in 5 of 72 such exits on a loaded host (0 of 80 built here).  A failed build
    leaves the heartbeat off and says why in describe(); the call itself goes on."""
    if _beat_fn is None and "build" not in _notes:
        try:
            _beat()
        except Exception as e:  # noqa: BLE001 - no heartbeat rather than a failed kernel call
            _notes["build"] = f"any CPU: the loop did not build: {type(e).__name__}: {e}"
    return _beat_fn is not None


def touch() -> None:
    """Called by the dispatcher on every CPU kernel call: restarts the window (~0.2 us), and
    wakes the heartbeat loops parked since the last window passed.  They park in nk_beat
    on a futex, not on a Python event: woken through an event, each heartbeat thread took
    the GIL to leave its wait, and the one pinned to the caller's CPU, SCHED_IDLE, got no
    CPU to give it back while the caller's kernel ran, so the caller's next Python waited
    for it.  The second call after 0.8 s idle (softmax 1x12x128x128, 2 threads, Sapphire
    Rapids, 2026-12-07, per-call medians of 20 rounds, three runs each): window 300 ms
    445-728 us, window 0 187-277, a window covering the idle time 168-305; parked on the
    futex, old / new processes alternating, three pairs: 436-639 -> 169-191 us, the third
    call 158-195 -> 72-79, the first 1168-2265 -> 1067-1578 (onnxruntime: 1060-1327,
    105-123, 49-58); attention 1x12x128x64's second call 665-683 -> 511-517 us.
    A touch that reads PARKED while a loop is between its own check of the window and its
    count (the store of LAST_NS not yet visible to it) lets that loop sleep until the next
    touch: one call's warmth, nothing more."""
    if _state[WINDOW_NS] <= 0 or _UNSUPPORTED is not None:
        return
    _state[LAST_NS] = time.monotonic_ns()
    if _state[PARKED]:
        _wake_fn(_state_addr)
    elif not _started:
        _start_once()


def _start_once():
    """The first touch(): start the heartbeat threads where it beats at all."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    if enabled() and _built():
        _start()


def set_window_ms(ms) -> float:
    """Set the window (ms; 0 turns the heartbeat off) for the whole process and return the
    previous one.  Beating threads see the new window at their next wake-up."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise TypeError(f"set_window_ms: ms must be a number of milliseconds, got {type(ms).__name__}")
    if not _usable_ms(ms):
        raise ValueError(f"set_window_ms: expected a non-negative number of milliseconds, got {ms!r}")
    old = _state[WINDOW_NS] / 1e6
    _state[WINDOW_NS] = int(ms * 1e6)
    return old


def window_ms() -> float:
    return _state[WINDOW_NS] / 1e6


def beats() -> int:
    """Heartbeats so far in this process (all threads)."""
    return int(_state[BEATS])


def describe() -> str:
    """One line for ``explain`` and the report's machine header."""
    if _UNSUPPORTED is not None:
        return f"keep-warm off ({_UNSUPPORTED})"
    if _state[WINDOW_NS] <= 0:
        return f"keep-warm off ({ENV}=0)"
    if numba.config.NUMBA_NUM_THREADS <= 1:
        return "keep-warm off (one thread)"
    refused = f"; not running on {'; '.join(_notes.values())}" if _notes else ""
    return (f"keep-warm {window_ms():g} ms after each call ({ENV}), a SCHED_IDLE heartbeat every "
            f"{PERIOD_US} us on each of {len(_cpus())} CPUs{refused}")


def _after_fork_in_child():
    # the parent's heartbeat threads do not exist in the child: start afresh on its first call
    global _lock, _started, _state_addr
    _threads.clear()
    _notes.clear()
    _lock = threading.Lock()
    _started = False
    _state[PARKED] = 0   # the parent's parked loops are not the child's
    _state_addr = ctypes.addressof(_state)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
