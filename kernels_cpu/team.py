"""Our own thread team: the threads that run the by-address workers (parallel.run_workers,
the GEMM, attention, conv, ...) and the row kernels (parallel.row_run: softmax, layer, RMS,
group and batch norm, rope, resampling, adaptive pooling, the activations and the backward
of softmax and the activations), the GEMV, the BLAS path's epilogue and cross-entropy.
The other prange kernels (the block-counting ones of parallel.run_dynamic: the norms'
backward when the team is busy, quantization) still run on numba's threading layer.

Why: numba's tbb layer builds a task arena and an observer on every parallel call and
tears them down after it.  A worker busy for 10 us on each of 2 threads (2 vCPUs, Xeon with
AVX-512, 2026-12-03, an rdtsc probe of each share's start and end): under tbb the caller's
share started 3.5 us after the call, the other thread's 5.4 us, and the call returned 1.4
us after the last share ended, 16.9 us in all; on the team both started 1.0-1.1 us after
the call, 11.3-11.5 us in all.  For a short memory-bound op that is most of the gap to
onnxruntime, whose pool spins the same way: relu 128x3072 (each thread's half in its own L2;
one half alone takes 22 us) 32.9-35.8 -> 27.6-28.9 us, onnxruntime 25.9 us.

How: size() - 1 daemon threads wait in a small loop (LLVM IR built here with llvmlite in
milliseconds, like keepwarm's heartbeat: nothing for numba to compile).  A call publishes
(worker address, argument block, count) and takes indices itself; each team thread takes
indices from the same counter.  The caller never waits for a thread that has not started:
whoever is there runs the indices, and the caller then waits only for indices already
taken.  Idle team threads spin (calling sched_yield) for the spin window (``NK_SPIN_US``,
default DEFAULT_SPIN_US) so that back-to-back calls find them running, then sleep on a
futex; a call wakes sleepers and does not wait for them.

A team thread that finds itself on the caller's CPU moves off it (one sched_setaffinity
call: allowed everywhere but that CPU) before it takes part, and stays off that CPU until it
finds itself on a caller's CPU again (a caller that moved).
Spinning, it always looked cache-hot, and the scheduler left it sharing the caller's CPU
for whole 20 ms batches once PyTorch or onnxruntime had run in the process (2026-12-03,
the report's timing: gelu 128x3072 batches of 121-276 us, median about 215, the team
thread taking 0.04-1.0 of the indices; attention_backward GPT-2 512 causal 6.3-6.9 ms,
then 13-14 ms from the ninth batch on).  Sleeping instead, to be placed again by the next
wake-up, fixed gelu (121-187 us) but not the long calls, whose wake-ups put it back on the
caller's CPU every time; moving: gelu 131-207 us with the team thread in 0.86-1.0 of the
calls, attention_backward 6.4-8.1 ms in every batch (numba's tbb threads: gelu 136-266,
attention_backward 5.8-6.5 ms).  Staying off: after a pause the caller's futex wake-up
put the sleeping thread on the caller's CPU in 8-11 of 24 calls (the other vCPU had halted,
which the guest scheduler takes for a CPU in use), and the move then came too late to help:
matmul 128x768x768 one call after 0.2 s idle (24 calls shuffled with numpy's, three
processes each, alternating; Zen 4, 2026-12-05), medians / upper quartiles 1.46-1.76 / 2.04-2.08 ms
when allowed everywhere again after each move, 1.29-1.46 / 1.37-1.67 ms staying off (0-2
moves in 24 calls), numpy 1.06-1.17 ms; 4 Python threads at once and loops unchanged.
One call at a time owns the team:
a call that finds it busy (another Python thread's) is told so, and runs on numba's threads
as before (the caller's fallback), so concurrent calls never wait for each other here.

The workers must not depend on which thread runs which index or on all indices running at
once: every worker takes its work from counters in its argument block and leaves nothing
to a barrier (the GEMM packs a panel it finds unpacked itself), so index 0 alone finishes
the call when no team thread joins.

``NK_SPIN_US=0`` turns the team off (numba's threads run every worker).  Linux on x86-64 or
aarch64 only (the futex call); elsewhere the team is off.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba.core.compiler_lock import global_compiler_lock

from .keepwarm import _CLOCK_MONOTONIC, FUTEX_CALL as _FUTEX, FUTEX_WAIT_PRIVATE as _FUTEX_WAIT_PRIVATE, \
    FUTEX_WAKE_PRIVATE as _FUTEX_WAKE_PRIVATE, amount_from_env

ENV = "NK_SPIN_US"
# Idle team threads spin this long after each call.  A probe of 10 us of work per thread
# after busy gaps (2026-12-03): numba's tbb threads were still awake after 300 us gaps (the
# second thread started 6 us into the call) and asleep after 2 ms (17 us before the caller's
# own share started: the wake-up's system call, the same for the team); the team at 300 us
# started both threads 1 us into the call after 300 us gaps.  Spinning calls sched_yield,
# so a thread of another pool (numba's tbb threads, PyTorch's OpenMP) that wants this CPU
# gets it: PyTorch's call beside ours ("peer in (c)" of python -m bench.runtime) took
# 1.94-1.99 ms with the team, 1.90-2.17 ms without.
DEFAULT_SPIN_US = 300

LINE = 8                # int64 per cache line: slots that different threads write sit apart
CLAIM = 0 * LINE        # (generation << 32) | next index; next == MARK while a job is written
FN, PARAMS, COUNT = 1 * LINE, 1 * LINE + 1, 1 * LINE + 2   # the job: worker, argument block, indices
DONE = 2 * LINE         # indices finished in this job
BUSY = 3 * LINE         # 1 while a call owns the team
SLEEPERS = 4 * LINE     # team threads asleep (or about to sleep) on the futex
WAKE = 5 * LINE         # the futex word (its low 32 bits), bumped to wake sleepers
STOP = 6 * LINE         # nonzero: team threads return
SPIN_NS = 7 * LINE      # the spin window
TAKEN = 8 * LINE        # indices run by team threads (not callers), for tests and describe
CALLER_CPU = 9 * LINE   # the CPU the caller ran on when it published the job
SHARED = 10 * LINE      # jobs a team thread found itself on the caller's CPU for
ALLOWED = 11 * LINE     # the process's CPUs at import as a bit mask (0 when any is >= 64: no moving)
N_SLOTS = 12 * LINE

MARK = 0xFFFFFFFF
_SETAFFINITY = {"x86_64": 203, "aarch64": 122}   # SYS_sched_setaffinity
TS_MASK = 2             # a team thread's scratch: a timespec, then a 1024-CPU mask
TS_WORDS = TS_MASK + 16


def _spin_from_env(value):
    """Spin window in us from the NK_SPIN_US string (unset or empty: the default); anything
    but a non-negative number is an error naming the variable."""
    return amount_from_env(ENV, value, DEFAULT_SPIN_US, "microseconds", "turns the thread team off")


def _unsupported():
    """Why the team cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return "needs Linux (futex)"
    arch = os.uname().machine
    if arch not in _FUTEX:
        return f"no futex call number known for {arch}"
    return None


_UNSUPPORTED = _unsupported()


def _team_ir(syscall_addr, clock_addr, yield_addr, getcpu_addr, x86):
    """LLVM IR of nk_team_run(state, fn, params, n) -> i64 and nk_team_worker(state, ts).
    state: the int64 slots above; ts: a team thread's own TS_WORDS int64 (clock_gettime's
    timespec, then the CPU mask for sched_setaffinity).  libc's functions are called at
    their addresses (the system calls through syscall())."""
    i64, i32 = ir.IntType(64), ir.IntType(32)
    mod = ir.Module(name="nk_team")
    p64 = i64.as_pointer()
    worker_ty = ir.FunctionType(ir.VoidType(), [i64, i64])

    def const(v):
        return ir.Constant(i64, v)

    def helpers(b, state):
        def slot(k):
            return b.gep(state, [const(k)])

        def load(k):
            return b.load_atomic(slot(k), "seq_cst", 8)

        def store(k, v):
            b.store_atomic(v, slot(k), "seq_cst", 8)

        def add(k, v):
            return b.atomic_rmw("add", slot(k), const(v), "seq_cst")

        def pause():
            if x86:
                fn = mod.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), []))
                b.call(fn, [])
            else:
                b.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "yield", "", side_effect=True), [])

        def futex(op, val):
            sc = b.inttoptr(const(syscall_addr), ir.FunctionType(i64, [i64], var_arg=True).as_pointer())
            b.call(sc, [const(_FUTEX[os.uname().machine]), b.ptrtoint(slot(WAKE), i64), const(op), val, const(0)])

        return slot, load, store, add, pause, futex

    # ---- the caller: nk_team_run ----
    run = ir.Function(mod, ir.FunctionType(i64, [p64, i64, i64, i64]), name="nk_team_run")
    state, fn, params, n = run.args
    blk = {k: run.append_basic_block(k) for k in ("entry", "go", "wake", "claim", "take", "ran", "wait", "nap", "out",
                                                 "busy")}
    b = ir.IRBuilder(blk["entry"])
    slot, load, store, add, pause, futex = helpers(b, state)
    got = b.cmpxchg(slot(BUSY), const(0), const(1), "seq_cst", "seq_cst")
    b.cbranch(b.extract_value(got, 1), blk["go"], blk["busy"])
    b.position_at_end(blk["busy"])
    b.ret(const(0))
    b.position_at_end(blk["go"])
    gen = b.and_(b.add(b.lshr(load(CLAIM), const(32)), const(1)), const(0x7FFFFFFF))
    gen = b.shl(gen, const(32))
    store(CLAIM, b.or_(gen, const(MARK)))   # a late thread of the last job cannot claim now
    getcpu = b.inttoptr(const(getcpu_addr), ir.FunctionType(i32, []).as_pointer())
    store(CALLER_CPU, b.sext(b.call(getcpu, []), i64))
    store(FN, fn)
    store(PARAMS, params)
    store(COUNT, n)
    store(DONE, const(0))
    store(CLAIM, gen)
    b.cbranch(b.icmp_signed(">", load(SLEEPERS), const(0)), blk["wake"], blk["claim"])
    b.position_at_end(blk["wake"])
    add(WAKE, 1)
    futex(_FUTEX_WAKE_PRIVATE, const(0x7FFFFFFF))
    b.branch(blk["claim"])
    b.position_at_end(blk["claim"])
    c = load(CLAIM)
    idx = b.and_(c, const(MARK))
    b.cbranch(b.icmp_unsigned(">=", idx, n), blk["wait"], blk["take"])
    b.position_at_end(blk["take"])
    ok = b.extract_value(b.cmpxchg(slot(CLAIM), c, b.add(c, const(1)), "seq_cst", "seq_cst"), 1)
    b.cbranch(ok, blk["ran"], blk["claim"])
    b.position_at_end(blk["ran"])
    b.call(b.inttoptr(fn, worker_ty.as_pointer()), [idx, params])
    add(DONE, 1)
    b.branch(blk["claim"])
    b.position_at_end(blk["wait"])   # for the indices team threads have taken
    b.cbranch(b.icmp_signed(">=", load(DONE), n), blk["out"], blk["nap"])
    b.position_at_end(blk["nap"])
    # a team thread that shares this CPU runs only when this one yields
    b.call(b.inttoptr(const(yield_addr), ir.FunctionType(i32, []).as_pointer()), [])
    b.branch(blk["wait"])
    b.position_at_end(blk["out"])
    store(BUSY, const(0))
    b.ret(const(1))

    # ---- a team thread: nk_team_worker ----
    wk = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p64, p64]), name="nk_team_worker")
    state, ts = wk.args
    names = ("entry", "idle", "spin", "check", "clock", "pause", "job", "read", "aside", "move", "pass", "read2",
             "seen", "try", "run", "sleep", "doze", "done")
    blk = {k: wk.append_basic_block(k) for k in names}
    b = ir.IRBuilder(blk["entry"])
    slot, load, store, add, pause, futex = helpers(b, state)
    clock = b.inttoptr(const(clock_addr), ir.FunctionType(i32, [i32, p64]).as_pointer())
    yield_ = b.inttoptr(const(yield_addr), ir.FunctionType(i32, []).as_pointer())
    seen = b.alloca(i64)     # the last generation this thread found nothing left in
    t0 = b.alloca(i64)
    it = b.alloca(i64)
    b.store(const(-1), seen)
    b.branch(blk["idle"])

    def now():
        b.call(clock, [ir.Constant(i32, _CLOCK_MONOTONIC), ts])
        return b.add(b.mul(b.load(ts), const(1_000_000_000)), b.load(b.gep(ts, [const(1)])))

    b.position_at_end(blk["idle"])   # (re)start the spin window
    b.store(now(), t0)
    b.store(const(0), it)
    b.branch(blk["spin"])
    b.position_at_end(blk["spin"])
    c = load(CLAIM)
    g = b.lshr(c, const(32))
    b.cbranch(b.icmp_signed("!=", g, b.load(seen)), blk["job"], blk["check"])
    b.position_at_end(blk["check"])
    k = b.add(b.load(it), const(1))
    b.store(k, it)
    b.cbranch(b.icmp_signed("!=", load(STOP), const(0)), blk["done"], blk["clock"])
    b.position_at_end(blk["clock"])   # the clock every 64 spins (a vDSO call, ~20 ns)
    b.cbranch(b.icmp_signed("==", b.and_(k, const(63)), const(0)), blk["sleep"], blk["pause"])
    b.position_at_end(blk["sleep"])
    late = b.icmp_signed(">", b.sub(now(), b.load(t0)), load(SPIN_NS))
    b.cbranch(late, blk["doze"], blk["pause"])
    b.position_at_end(blk["pause"])
    b.call(yield_, [])
    b.branch(blk["spin"])

    b.position_at_end(blk["job"])   # generation g is new to this thread
    idx = b.and_(c, const(MARK))
    b.cbranch(b.icmp_unsigned("==", idx, const(MARK)), blk["pause"], blk["read"])  # being written
    b.position_at_end(blk["read"])
    # on the caller's CPU a team thread only slows the call: it would run by taking the
    # CPU from the caller, and the scheduler did not move it off for whole 20 ms batches
    # (it spins, so it always looks cache-hot); see the module docstring
    getcpu = b.inttoptr(const(getcpu_addr), ir.FunctionType(i32, []).as_pointer())
    here = b.icmp_signed("==", b.sext(b.call(getcpu, []), i64), load(CALLER_CPU))
    b.cbranch(here, blk["aside"], blk["read2"])
    b.position_at_end(blk["aside"])
    # move off it: allowed everywhere but the caller's CPU (the kernel migrates the thread
    # before the call returns), and take part; the mask stays, so the next wake-up cannot
    # put this thread back on that CPU (see the module docstring)
    add(SHARED, 1)
    ccpu = load(CALLER_CPU)
    allowed = load(ALLOWED)
    others = b.and_(allowed, b.not_(b.shl(const(1), ccpu)))
    movable = b.and_(b.icmp_signed("<", ccpu, const(64)), b.icmp_signed("!=", others, const(0)))
    b.cbranch(movable, blk["move"], blk["pass"])
    b.position_at_end(blk["move"])
    mask = b.gep(ts, [const(TS_MASK)])
    sc = b.inttoptr(const(syscall_addr), ir.FunctionType(i64, [i64], var_arg=True).as_pointer())
    nr = const(_SETAFFINITY[os.uname().machine])
    b.store(others, mask)
    b.call(sc, [nr, const(0), const(8 * (TS_WORDS - TS_MASK)), b.ptrtoint(mask, i64)])
    b.branch(blk["read2"])
    b.position_at_end(blk["pass"])   # nowhere to go: pass the job up and sleep
    b.store(g, seen)
    b.branch(blk["doze"])
    b.position_at_end(blk["read2"])
    # the job is read before the claim: when the claim succeeds it was this generation's
    # (a new job is written only after CLAIM has moved on to the next generation's MARK)
    f = load(FN)
    prm = load(PARAMS)
    cnt = load(COUNT)
    b.cbranch(b.icmp_unsigned(">=", idx, cnt), blk["seen"], blk["try"])
    b.position_at_end(blk["seen"])
    b.store(g, seen)
    b.branch(blk["idle"])
    b.position_at_end(blk["try"])
    ok = b.extract_value(b.cmpxchg(slot(CLAIM), c, b.add(c, const(1)), "seq_cst", "seq_cst"), 1)
    b.cbranch(ok, blk["run"], blk["spin"])
    b.position_at_end(blk["run"])
    b.call(b.inttoptr(f, worker_ty.as_pointer()), [idx, prm])
    add(TAKEN, 1)
    add(DONE, 1)
    b.branch(blk["spin"])

    # sleep: register as a sleeper, then look once more; a caller publishes, then reads
    # SLEEPERS (both sequentially consistent), so either it sees this sleeper and wakes it
    # or this thread sees its job here
    b.position_at_end(blk["doze"])
    w = load(WAKE)
    add(SLEEPERS, 1)
    quiet = b.and_(b.icmp_signed("==", b.lshr(load(CLAIM), const(32)), b.load(seen)),
                   b.icmp_signed("==", load(STOP), const(0)))
    with b.if_then(quiet):
        futex(_FUTEX_WAIT_PRIVATE, b.and_(w, const(0xFFFFFFFF)))
    add(SLEEPERS, -1)
    b.branch(blk["idle"])

    b.position_at_end(blk["done"])
    b.ret_void()
    return str(mod)


_lock = threading.Lock()
_built = None       # (run, worker) ctypes functions once built; the engine rides on run
_build_error = None
_threads: list = []
_state = np.zeros(N_SLOTS, np.int64)
_state[SPIN_NS] = int(_spin_from_env(os.environ.get(ENV)) * 1000)


def _allowed_mask():
    """The process's CPUs as a 64-bit mask, or 0 when one is >= 64 (or unknown)."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return 0
    if not cpus or max(cpus) >= 64:
        return 0
    return sum(1 << c for c in cpus) - (1 << 64 if 63 in cpus else 0)  # as a signed int64


_state[ALLOWED] = _allowed_mask()


def _build():
    """Build the team's two functions with llvmlite's MCJIT (milliseconds, under numba's
    compile lock: LLVM's context is not thread-safe beside a numba compile)."""
    global _built
    with global_compiler_lock:
        if _built is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            libc = ctypes.CDLL(None, use_errno=True)
            addr = [ctypes.cast(f, ctypes.c_void_p).value for f in (libc.syscall, libc.clock_gettime, libc.sched_yield,
                                                                libc.sched_getcpu)]
            x86 = os.uname().machine == "x86_64"
            mod = llvm.parse_assembly(_team_ir(*addr, x86))
            mod.verify()
            engine = llvm.create_mcjit_compiler(mod, llvm.Target.from_default_triple().create_target_machine())
            engine.finalize_object()
            run = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(
                engine.get_function_address("nk_team_run"))
            worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
                engine.get_function_address("nk_team_worker"))
            run.engine = engine  # the engine owns the code: kept alive with the functions
            _built = (run, worker)
    return _built


def _thread(worker, state):
    ts = np.zeros(TS_WORDS, np.int64)
    worker(state.ctypes.data, ts.ctypes.data)  # returns only when STOP is set


def size() -> int:
    """Threads a call can use: the caller and size() - 1 team threads (numba's thread
    count, NUMBA_NUM_THREADS)."""
    return numba.config.NUMBA_NUM_THREADS


def enabled() -> bool:
    return _UNSUPPORTED is None and _state[SPIN_NS] > 0 and size() > 1 and _build_error is None


def _start():
    """Build the loop and start the team threads (first call); False where it cannot."""
    global _build_error, _run, _state_addr, _run_addr
    with _lock:
        if _run is not None:
            return True
        if not enabled():
            return False
        try:
            run, worker = _build()
        except Exception as e:  # noqa: BLE001 - numba's threads run the workers instead; describe() says why
            _build_error = f"the team's loop did not build: {type(e).__name__}: {e}"
            return False
        state = _state
        for i in range(size() - 1):
            t = threading.Thread(target=_thread, args=(worker, state), name=f"nk-team-{i + 1}", daemon=True)
            t.start()
            _threads.append(t)
        _state_addr = state.ctypes.data
        _run_addr = ctypes.cast(run, ctypes.c_void_p).value
        _run = run
        return True


_run = None
_state_addr = 0
_run_addr = 0
_on = bool(_state[SPIN_NS] > 0)


def run(fn: int, params: int, n: int) -> bool:
    """fn(i, params) for i in range(n) on the calling thread and the team (see the module
    docstring); returns after all of them.  False, having run nothing: the team is off, or
    busy with another thread's call (run them on numba's threads instead)."""
    if _run is None and not _start():
        return False
    return _on and _run(_state_addr, fn, params, n) != 0


def entry():
    """(run, state): nk_team_run's address and the team's state address, for compiled
    launchers (parallel.launch) that call the team without returning to Python; (0, 0)
    when the team is off (parallel.row_run then runs the workers on numba's threads)."""
    if _run is None and not _start():
        return 0, 0
    if not _on:
        return 0, 0
    return _run_addr, _state_addr


def taken() -> int:
    """Indices run by team threads so far (not by callers)."""
    return int(_state[TAKEN])


def set_spin_us(us) -> float:
    """Set the spin window (us) for the whole process and return the previous one.  0 stops
    new calls from using the team; its threads sleep after their current window."""
    if isinstance(us, bool) or not isinstance(us, (int, float)):
        raise TypeError(f"set_spin_us: us must be a number of microseconds, got {type(us).__name__}")
    if not (us >= 0 and us != float("inf")):
        raise ValueError(f"set_spin_us: expected a non-negative number of microseconds, got {us!r}")
    global _on
    old = _state[SPIN_NS] / 1000
    _state[SPIN_NS] = int(us * 1000)
    _on = us > 0
    return old


def describe() -> str:
    """One line for ``explain`` and the report's machine header."""
    if _UNSUPPORTED is not None:
        return f"thread team off ({_UNSUPPORTED}): numba's threads run every worker"
    if _state[SPIN_NS] <= 0:
        return f"thread team off ({ENV}=0): numba's threads run every worker"
    if size() <= 1:
        return "thread team off (one thread)"
    if _build_error is not None:
        return f"thread team off ({_build_error})"
    return (f"thread team of {size()} (the caller and {size() - 1} more, spinning {_state[SPIN_NS] / 1000:g} us "
            f"after each call, {ENV}; a call that finds it busy runs on numba's threads)")


def _after_fork_in_child():
    # the parent's team threads do not exist in the child, and a call in flight at the fork
    # left BUSY set: a fresh state, threads started on the child's first call
    global _run, _state, _lock
    spin = _state[SPIN_NS]
    _threads.clear()
    _run = None
    _state = np.zeros(N_SLOTS, np.int64)
    _state[SPIN_NS] = spin
    _state[ALLOWED] = _allowed_mask()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
