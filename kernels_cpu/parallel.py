"""How the parallel CPU kernels hand out work.

Row kernels run one prange iteration per thread, and each iteration claims rows from a
range of its own, then from the others' (claim()).  Kernels whose blocks
need their own index split the rows into blocks that numba's prange hands out one at a
time (run_dynamic: chunk size 1), set from Python because numba.get_num_threads /
set_parallel_chunksize inside a kernel make it uncacheable ("dynamic globals").
Kernels with a big worker (the GEMM, attention) run it with run_workers: the worker is
called by address from one shared parallel driver, so its code is compiled once (see
below).
"""
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import literal_unroll, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numba.np.ufunc import parallel as _numba_parallel

from . import compile_helper, team
from .approx import HELPER, JIT_BY_ADDRESS, OVERLOAD, bits_to_float, float_to_bits
from .llvm_ir import arg_readers, prefetch as llvm_prefetch

# Kernels that hand out blocks (run_dynamic, and the workers' counters of the conv, pool,
# routing, SSM and causal-conv workers) split the rows into TASKS_PER_THREAD contiguous
# blocks per thread, handed out dynamically: when another process takes a core, the other
# thread takes more blocks instead of waiting for a fixed half (the row kernels' claims do
# the same with MIN_SHARES, below).  Measured on (4096, 1024)
# softmax with other jobs running: best of 15 9.9 ms for a static half per thread, 2.5-2.7
# ms for 8-32 dynamic blocks per thread (medians 28 vs 18-21 ms; the machine was loaded).
TASKS_PER_THREAD = 8


def num_threads():
    """numba.get_num_threads(): the calling thread's thread count (numba.set_num_threads),
    read without the process-wide lock that numba takes on every call: 0.08 us instead of
    0.59 (Sapphire Rapids, 2026-12-03), paid on every parallel kernel call.  The public call
    until numba's pool has started, or where numba's internals differ."""
    if getattr(_numba_parallel, "_is_initialized", False) is True:
        get = getattr(_numba_parallel, "_get_num_threads", None)
        if get is not None:
            return get()
    return numba.get_num_threads()


def tasks_for(n):
    """Number of row blocks for n rows (at least 1, at most n)."""
    return max(min(num_threads() * TASKS_PER_THREAD, n), 1)


# Claims (claims_for / claim): prange iteration `me` of `workers` owns the range
# [me * n / workers, (me + 1) * n / workers) and claims it front to back, each claim half of
# what is left of the range (at least `least` rows), then claims what is left of the other
# ranges the same way.  Each row goes to one claim whichever thread runs which iteration
# (numba may run two on one thread), a thread slowed by another process leaves the others
# little to wait for, and the claims shrink towards the end so the threads finish
# together.  Owning a range means a thread reads the same rows on every call of the same
# shape, which stay in its core's L2 between calls.  Each claim costs two atomics, not a
# task of numba's scheduler.  2 threads, loop medians (Sapphire Rapids, 2026-12-03), against
# TASKS_PER_THREAD blocks handed out by prange (chunk size 1), which the row kernels used
# before: softmax rows of 128, 384 rows 22.0-23.2 -> 18.9-19.7 us, 1536 rows 49.4-50.1 ->
# 46.9-47.2; layer_norm 128x768 37.6-37.9 -> 34.8-35.1.  One shared counter (no ranges)
# lost what a static half per thread had kept in each core's L2: relu 128x3072 34 -> 47
# us; with ranges 35 (static halves 31.6-32.5, which a busy core would hold up).
MIN_SHARES = 16
LINE_INT64 = 8  # int64 per cache line: each range's counter, and each worker's claim, on lines of their own
CLAIM_LO, CLAIM_HI, CLAIM_STEP = 0, 1, 2  # a worker's claim, on its second line (_claim_next)


@njit(**HELPER)
def claims_for(n, nw, least):
    """(least, workers) of a row kernel over n rows on nw threads (see claim); least: the
    fewest rows a claim takes.  Worked out inside the kernel: in Python, with the
    counters, it cost 0.8 us a call."""
    least = max(least, n // (nw * MIN_SHARES), 1)
    return least, max(min(nw, (n + least - 1) // least), 1)


@njit(**JIT_BY_ADDRESS)
def _claim_next(addr, n, workers, least, me):
    """Worker me's next claim, written to its claim line of the counters at addr (see
    claim): lo >= hi when none is left.  Called by address, so its code is compiled once,
    not again into every row kernel's parfor (which cost 0.35-0.5 s of each kernel's cold
    compile, softmax 0.69 -> 1.07-1.24 s)."""
    counters = c_array_at(addr, np.int64(0), (workers * 2 * LINE_INT64,))
    mine = (2 * me + 1) * LINE_INT64
    step = counters[mine + CLAIM_STEP]  # how many ranges past its own it has emptied
    while step < workers:
        pos = me + step if me + step < workers else me + step - workers
        r0 = pos * n // workers
        r1 = (pos + 1) * n // workers
        left = r1 - r0 - fetch_add(counters, 2 * pos * LINE_INT64, 0)
        # another's range: its last `least` rows are left to its owner (whose iteration
        # claims its own range to the end before it ends), which has them in its L2
        if step == 0 or left > least:
            chunk = max(least, left // 2)
            lo = r0 + fetch_add(counters, 2 * pos * LINE_INT64, chunk)
            if lo < r1:
                counters[mine + CLAIM_LO] = lo
                counters[mine + CLAIM_HI] = min(lo + chunk, r1)
                counters[mine + CLAIM_STEP] = step
                return
        step += 1
    counters[mine + CLAIM_LO] = n
    counters[mine + CLAIM_HI] = n
    counters[mine + CLAIM_STEP] = step


def claim_address():
    """_claim_next's address (the fn argument of claim), compiled or loaded on first use."""
    global _claim_fn
    if _claim_fn == 0:
        _claim_fn = worker_address(_claim_next, (), nargs=5)
    return _claim_fn


_claim_fn = 0  # _claim_next's address, once compiled or loaded (any thread may set it: the same value)


@njit(**HELPER)
def claim(fn, counters, n, workers, least, me):
    """(lo, hi): the next rows [lo, hi) of n for prange iteration `me` (lo >= hi: none
    left).  A row worker (row_claim) or a prange kernel given nw, fn = claim_address() and
    zeroed counters works out (least, workers) = claims_for(n, nw, least), then runs
    iterations me in range(workers), claiming until none is left: its own range first,
    then the others'.  The counters: workers * 2 * LINE_INT64 int64, zero (allocated by the
    caller: np.zeros inside a parallel kernel is made a parfor of its own, 0.2 s more of
    its cold compile)."""
    # a prange index may be typed uint64 in numba's parfor gufunc, and uint64 with int64
    # arithmetic gives float64 in numba
    me = np.int64(me)
    call_address(fn, (counters.ctypes.data, n, workers, least, me))
    mine = (2 * me + 1) * LINE_INT64
    return counters[mine + CLAIM_LO], counters[mine + CLAIM_HI]


# ---- row kernels on the thread team -------------------------------------------------------
#
# A row kernel is a worker called by address, worker(me, block), running the claim loop over
# its rows, and a small compiled launcher that fills the int64 argument block (RW_*) and runs
# the worker on the thread team (launch).  Python calls it through row_run(launcher, worker,
# *arrays and scalars).  Against the same claim loop in a prange kernel on numba's tbb
# threads, 2 threads, loop medians (2026-12-03, Xeon with AVX-512, 2 MiB L2 a core): relu
# 128x3072 32.9-35.8 -> 27.6-28.9 us (onnxruntime 25.9 us).
RW_ARRAYS = 6   # slots 0..5: the kernel's arrays' addresses
RW_N, RW_D, RW_F, RW_I, RW_I2, RW_I3, RW_CLAIM, RW_COUNTERS, RW_WORKERS, RW_LEAST = range(RW_ARRAYS, RW_ARRAYS + 10)
RW_I4 = RW_LEAST + 1        # one more int (group_norm's channel count)
RW_MORE = RW_I4 + 1         # slots RW_MORE..RW_BLOCK-1: more arrays' addresses (resample's tables)
RW_BLOCK = 3 * LINE_INT64   # the block's slots, then the claim counters (claim) on lines of their own


def row_buffer(nw):
    """A row kernel's argument block and claim counters for nw threads, zeroed (per call:
    concurrent calls each own theirs)."""
    return np.zeros(RW_BLOCK + nw * 2 * LINE_INT64, np.int64)


def row_run(launcher, worker, *args):
    """launcher(*args, worker, nw, claim_fn, buf, team_run, team_state): a row kernel on the
    team; buf holds its argument block and claim counters.  A launcher that could not use
    the team (off, or busy with another Python thread's call) returns its worker count, and
    numba's threads run the workers instead."""
    nw = num_threads()
    buf = row_buffer(nw)
    rest = launcher(*args, worker, nw, claim_address(), buf, *team.entry())
    if rest:
        _run_workers(worker, buf.ctypes.data, rest)


@njit(**HELPER)
def row_block(buf, n, d, f, i, i2, i3, least, nw, fn):
    """The workers of a row kernel claiming over n units (rows, or chunks) on nw threads, at
    least `least` a claim, having written its argument block into buf's first RW_BLOCK
    slots: d, f (a float: eps) and i, i2, i3 (ints or bool flags) are the kernel's; the launcher
    writes its arrays' addresses into slots 0..5.  (The float goes in as its bits: numba's
    array.view cost 0.24 s of a cold first call.)"""
    least, workers = claims_for(n, nw, least)
    buf[RW_N], buf[RW_D], buf[RW_I], buf[RW_I2], buf[RW_I3] = n, d, i, i2, i3
    buf[RW_F] = float_to_bits(np.float64(f))
    buf[RW_CLAIM], buf[RW_COUNTERS] = fn, buf.ctypes.data + RW_BLOCK * 8
    buf[RW_WORKERS], buf[RW_LEAST] = workers, least
    return workers


@njit(**HELPER)
def row_args(params):
    """A row worker's view of its block, and its float parameter (float64)."""
    p = c_array_at(params, np.int64(0), (RW_BLOCK,))
    return p, bits_to_float(p[RW_F])


@njit(**JIT_BY_ADDRESS)
def blocks_worker(me, params):
    """A row worker over blocks: slot 0 of its block holds a block function's address, slot
    1 that function's argument block; it claims ranges of block indices (row_block's n) and
    calls fn(k, args) for each.  Compiled once for every such kernel (the layer and RMS norm
    backward): claimed ranges keep each thread's blocks contiguous, where the team's own
    index counter dealt them out alternately (layer_norm_backward 4096x768, 2 threads:
    1514 us so, against 1128 us on numba's threads, 2026-12-03)."""
    p = c_array_at(params, np.int64(0), (RW_BLOCK,))
    lo, hi = row_claim(p, me)
    while lo < hi:
        for k in range(lo, hi):
            call_address(p[0], (k, p[1]))
        lo, hi = row_claim(p, me)


@njit(**HELPER)
def row_claim(p, me):
    """claim() for a row worker, from its block."""
    workers = p[RW_WORKERS]
    counters = c_array_at(p[RW_COUNTERS], np.int64(0), (workers * 2 * LINE_INT64,))
    return claim(p[RW_CLAIM], counters, p[RW_N], workers, p[RW_LEAST], me)


def run_dynamic(kernel, tasks, *args):
    """kernel(*args, tasks) with prange iterations handed out one at a time.  Set here, in
    Python: numba.get_num_threads / set_parallel_chunksize inside a kernel make it
    uncacheable (they are "dynamic globals"), so it would recompile in every process."""
    old = numba.set_parallel_chunksize(1)
    try:
        return kernel(*args, tasks)
    finally:
        numba.set_parallel_chunksize(old)


# ---- workers called by address ------------------------------------------------------------
#
# A parallel kernel written as prange over a call to a big worker function compiles that
# worker's code three times: numba links the callee's LLVM IR into every caller, so the
# worker is optimized and turned into machine code in its own library, again in the
# gufunc that parfor lowering makes of the loop body, and again in the kernel.  Measured
# on attention (1x12x128x64, empty cache): flash_parallel took 5.5 s on top of its
# already compiled worker (LLVM re-optimization 2.75 s, machine code 1.9 s, parfor passes);
# the GEMM's gemm_parallel 4.7 s on top of its worker.  run_workers instead calls a
# worker through its C entry point's address: one small parallel driver, compiled once for
# every kernel that uses it, and each worker compiled once, alone.

def _address_call(ret):
    """The codegen of a call to the C function at an int64 address, with the integers of a
    tuple as int64 arguments, returning ret (types.void or types.int64)."""
    def codegen(context, builder, sig, llargs):
        i64 = ir.IntType(64)
        tup = sig.args[1]
        vals = [context.cast(builder, builder.extract_value(llargs[1], i), tup[i], types.int64)
                for i in range(len(tup))]
        lret = ir.VoidType() if ret == types.void else i64
        fnptr = builder.inttoptr(llargs[0], ir.FunctionType(lret, [i64] * len(vals)).as_pointer())
        out = builder.call(fnptr, vals)
        return context.get_dummy_value() if ret == types.void else out

    return codegen


@intrinsic
def call_address(typingctx, fn, args):
    """Call the C function at address fn as void(int64, ...) with the integers of the tuple
    args (a worker's (w, params), a packer's (panel, params), an epilogue's pointers and
    sizes).  The callee is not linked into the caller: its code is compiled once, alone."""
    if not (isinstance(args, types.BaseTuple) and all(isinstance(t, types.Integer) for t in args)):
        return None
    return types.void(types.int64, args), _address_call(types.void)


@intrinsic
def call_address_i64(typingctx, fn, args):
    """call_address for a C function returning int64 (the team's nk_team_run)."""
    if not (isinstance(args, types.BaseTuple) and all(isinstance(t, types.Integer) for t in args)):
        return None
    return types.int64(types.int64, args), _address_call(types.int64)


@njit(**HELPER)
def launch(worker, params, n, team_run, team_state):
    """worker(i, params) for i in range(n), from compiled code: on the calling thread when n
    is 1, on the thread team when team_run (team.entry()) is not 0 and the team is free;
    returns 0 then, else n (the caller runs them on numba's threads: row_run)."""
    if n <= 1:
        call_address(worker, (0, params))
        return 0
    if team_run != 0 and call_address_i64(team_run, (team_state, worker, params, n)) != 0:
        return 0
    return n


@njit(parallel=True, cache=True, nogil=True)  # the GIL released as in approx.JIT
def _run_workers(fn, params, n):
    for w in prange(n):
        call_address(fn, (w, params))


def require_c_arrays(who, specs):
    """ValueError naming `who` and the array unless each (name, array, dtype) of specs is a
    C-contiguous array of that dtype: a by-address worker reads its arrays' raw memory."""
    for name, a, dt in specs:
        if a.dtype != dt or not a.flags.c_contiguous:
            raise ValueError(f"{who}: {name} must be C-contiguous {np.dtype(dt)}, got {a.dtype} "
                             f"(C-contiguous: {a.flags.c_contiguous})")


def run_workers(fn, params, n):
    """fn(w, params.ctypes.data) for w in range(n) on our thread team (kernels_cpu/team.py),
    or numba's threads when the team is off or busy with another Python thread's call: n
    workers that take their work from counters in params (n <= the thread count), or n
    tasks (packing panels), split between the threads.  Any one thread may run them all
    (team threads that have not started by then get none), so a worker never waits for
    another.  fn: a worker_address(); params: an int64 array the worker reads its arguments
    from (addresses and sizes), kept alive by the caller."""
    rest = _run_block(fn, params, n, *_team_for(n))
    if rest:
        _run_workers(fn, params.ctypes.data, rest)


def _team_for(n):
    """launch's team arguments: the team's entry for n > 1 workers, (0, 0) for one (it runs
    on the calling thread, and a serial-only process never starts the team)."""
    return team.entry() if n > 1 else (0, 0)


# The block's address is taken in compiled code (ctypes.data costs ~1 us in Python) and the
# team is called from there as parallel.launch does (team.run is a ctypes call): an empty
# worker, 2 threads, Zen 4 (2026-12-04), run_workers 2.0 -> 0.55-0.72 us a call, run_serial
# 1.6-1.8 -> 0.25-0.29 us.  One function for both (n = 1 runs on the calling thread): each
# compiled entry point costs ~0.08 s of an empty cache's first call.
@njit(cache=True, nogil=True)
def _run_block(fn, params, n, team_run, team_state):
    return launch(fn, params.ctypes.data, n, team_run, team_state)


@njit(cache=True, nogil=True)
def _run_addr(fn, addr, n, team_run, team_state):
    return launch(fn, addr, n, team_run, team_state)


def run_serial(fn, params):
    """fn(0, params.ctypes.data) on the calling thread (no thread pool hand-off)."""
    _run_block(fn, params, 1, 0, 0)


def run_at(fn, addr, n):
    """run_workers (n > 1) or run_serial (n <= 1) for an argument block given by its address
    (taken inside numba, where it costs nothing; ctypes.data costs 1.6-1.9 us in Python),
    through the same compiled launch."""
    rest = _run_addr(fn, addr, n, *_team_for(n))
    if rest:
        _run_workers(fn, addr, rest)


@intrinsic
def ptr_as(typingctx, addr, like):
    """The int64 address addr as a pointer to like's type (for numba.carray)."""
    if not isinstance(like, (types.Float, types.Integer, types.Boolean)):
        return None

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

    return types.CPointer(like)(addr, like), codegen


def _array_at(context, builder, rty, addr, shape, shape_ty, strides=None, strides_ty=None):
    """An owner-less array struct of type rty at the address addr (an int64 value)."""
    out = context.make_array(rty)(context, builder)
    data = builder.inttoptr(addr, context.get_data_type(rty.dtype).as_pointer())
    shp = [context.cast(builder, builder.extract_value(shape, i), shape_ty[i], types.intp) for i in range(rty.ndim)]
    itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(rty.dtype)))
    if strides is None:  # C order
        std = [itemsize]
        for n in reversed(shp[1:]):
            std.insert(0, builder.mul(std[0], n))
    else:
        std = [context.cast(builder, builder.extract_value(strides, i), strides_ty[i], types.intp)
               for i in range(rty.ndim)]
    context.populate_array(out, data=data, shape=cgutils.pack_array(builder, shp),
                           strides=cgutils.pack_array(builder, std), itemsize=itemsize, meminfo=None)
    return out._getvalue()


def _int_tuple(t):
    return isinstance(t, types.BaseTuple) and all(isinstance(e, types.Integer) for e in t)


_ELEMENT = (types.Float, types.Integer, types.Boolean)


@intrinsic
def view_at(typingctx, addr, like, shape, strides):
    """The array of like's type at the int64 address addr with that shape and those byte
    strides (tuples of integers): layout "A", no owner, nothing checked.  For rebuilding a
    worker's views from the addresses in its argument block: numba's carray and
    as_strided are compiled functions that every caller links, optimizes and turns into
    machine code again (with np.empty, 0.5 s of LLVM of attention's cold worker, Zen 5,
    2026-11-27); this is a few instructions in place."""
    if not (isinstance(like, _ELEMENT) and _int_tuple(shape) and _int_tuple(strides) and len(shape) == len(strides)):
        return None
    rty = types.Array(like, len(shape), "A")

    def codegen(context, builder, sig, args):
        return _array_at(context, builder, rty, args[0], args[2], sig.args[2], args[3], sig.args[3])

    return rty(addr, like, shape, strides), codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Prefetch the cache line of arr[idx] into L1 (a hint: no bounds check, no fault)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        i64_of, data = arg_readers(context, builder, sig, args)
        llvm_prefetch(builder, builder.gep(data(0), [i64_of(1)]), 3)
        return context.get_dummy_value()

    return types.none(arr, idx), codegen


@intrinsic
def c_array_at(typingctx, addr, like, shape):
    """view_at for a C-contiguous array (layout "C": strides from the shape), as
    numba.carray(ptr_as(addr, like), shape) but in place (see view_at)."""
    if not (isinstance(like, _ELEMENT) and _int_tuple(shape)):
        return None
    rty = types.Array(like, len(shape), "C")

    def codegen(context, builder, sig, args):
        return _array_at(context, builder, rty, args[0], args[2], sig.args[2])

    return rty(addr, like, shape), codegen


@intrinsic
def row_of(typingctx, arr, i):
    """Row i of a C-contiguous 2-D array as a 1-D C-contiguous array on the same memory,
    with no reference count (nothing is checked: i must be in range).

    numba's arr[i] makes a view that increments the array's reference count and
    decrements it when the view dies: two locked instructions per row (about 20 cycles
    each), and in a parallel kernel both threads write that one counter, so its cache
    line moves between the cores for every row.  At 128-float rows that is most of a
    softmax row's time."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C" and isinstance(i, types.Integer)):
        return None
    rty = types.Array(arr.dtype, 1, "C")

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], sig.args[1], types.intp)
        rows_stride = cgutils.unpack_tuple(builder, src.strides)[0]
        ncols = cgutils.unpack_tuple(builder, src.shape)[1]
        raw = builder.bitcast(src.data, ir.IntType(8).as_pointer())
        data = builder.bitcast(builder.gep(raw, [builder.mul(idx, rows_stride)]), src.data.type)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(arr.dtype)))
        out = context.make_array(rty)(context, builder)
        context.populate_array(out, data=data, shape=cgutils.pack_array(builder, [ncols]),
                               strides=cgutils.pack_array(builder, [itemsize]), itemsize=itemsize, meminfo=None)
        return out._getvalue()

    return rty(arr, i), codegen


@intrinsic
def borrow(typingctx, arr):
    """arr as a view with no owner (meminfo NULL): views and rows taken from it later do
    not touch a reference count.  numba increments and decrements the owner's count with
    a locked instruction for every view (arr[i], passing a row on), about 20 cycles each;
    a worker's scratch buffers are indexed per row in its inner loops.  The caller keeps
    arr itself alive (uses it after the last use of the borrowed view)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        out = context.make_array(sig.return_type)(context, builder)
        context.populate_array(out, data=src.data, shape=src.shape, strides=src.strides,
                               itemsize=src.itemsize, meminfo=None)
        return out._getvalue()

    return arr(arr), codegen


@intrinsic
def keep_alive(typingctx, arrays):
    """A use of arrays (a tuple) that emits no code: numba frees an array after its last
    use, so a worker calls this after the loops that use borrowed views of them."""
    def codegen(context, builder, sig, args):
        return context.get_dummy_value()

    return types.none(arrays), codegen


_ADDRESSES = {}
_ADDRESSES_LOCK = threading.Lock()


def only_if(flag):
    """A worker's variant value that selects a code path at compile time: True, or None for
    False.  The worker tests it as `if x is not None:` (or `is None`), which numba's
    dead-branch pruning resolves before typing (for an argument typed none or a literal),
    so the path not taken is never typed, lowered nor optimized; `if x:` on a literal bool
    is not pruned, so each variant compiled both paths.  Cold first calls, empty cache (Zen
    4, 2026-12-04): batch_norm's worker compiled group_norm's rows too (1.09 of 3.35 s),
    gelu_backward's the gated gradients (0.71 of 2.05 s)."""
    return True if flag else None


def worker_address(dispatcher, variant, nargs=2):
    """The address of the C entry point of dispatcher(a_1, ..., a_nargs, *variant), the
    a_i int64 (a worker's w and params), for the tuple of plain Python values variant
    (passed as numba literals, None as numba's none: one compiled function per variant;
    see only_if), compiled, or loaded from numba's cache, on first use.  Keyed on the plain
    values: numba literal types are slow to make (~10 us each), so they are made once per
    variant, not per call."""
    key = (dispatcher, variant, nargs)
    addr = _ADDRESSES.get(key)
    if addr is None:
        with _ADDRESSES_LOCK:
            addr = _address_locked(key)
    return addr


def worker_addresses(requests):
    """[worker_address(*r) for r in requests], each r (dispatcher, variant) or (dispatcher,
    variant, nargs), with the cold ones (compiled neither here nor in numba's cache) compiled
    in two processes at once when the first and at least one other are cold: this process
    and a helper process that saves them to numba's cache, from which this process then
    loads them, each take them in an order of their own (kernels_cpu/compile_helper.py says
    when a helper runs, and the orders).  Put the longest to compile first and the next
    longest second: this process starts on the first while the helper starts up (about
    0.4 s), then the helper on the second; the short ones fill in."""
    keys = _keys(requests)
    if keys[0] not in _ADDRESSES and sum(k not in _ADDRESSES for k in keys) >= 2 and compile_helper.wanted():
        with _ADDRESSES_LOCK:
            cold = [k for k in dict.fromkeys(keys) if k not in _ADDRESSES and k not in _AHEAD and _is_cold(k)]
            helper = None
            # only with the first (the longest) among them: the helper's start-up (0.4 s)
            # is as long as a small kernel's compile
            if len(cold) >= 2 and cold[0] == keys[0]:
                helper = compile_helper.start(_described(cold))
            if helper is not None:
                for i in compile_helper.main_order(len(cold)):
                    if compile_helper.claim(helper.claims, i):
                        _address_locked(cold[i])
                compile_helper.finish(helper)
    # kernels that compile_ahead gave a helper: those it has not started on are compiled
    # here, from the back of the list while it works from the front
    for k in reversed(keys):
        if k in _AHEAD:
            worker_address(*k)
    return [worker_address(*k) for k in keys]


# kernels given to a helper by compile_ahead: key -> (the helper, the kernel's index in its list)
_AHEAD = {}


def compile_ahead(requests):
    """Start compiling the cold ones of these by-address kernels (as worker_addresses takes
    them) in a helper process, in their order, and return at once: for kernels that a call
    will need after others it compiles first (kernels_cpu/compile_helper.py says when a
    helper runs).  A later worker_address(es) of one of them compiles it here if the helper
    has not started on it, else waits for the helper's copy and loads it from numba's
    cache.  Advisory: a kernel never asked for costs only the helper's time."""
    keys = _keys(requests)
    if all(k in _ADDRESSES or k in _AHEAD for k in keys) or not compile_helper.wanted():
        return  # (the first test is all a warm call pays: about 1 us)
    with _ADDRESSES_LOCK:
        cold = [k for k in dict.fromkeys(keys) if k not in _ADDRESSES and k not in _AHEAD and _is_cold(k)]
        if not cold:
            return
        helper = compile_helper.start(_described(cold), order=range(len(cold)))
        if helper is None:
            return
        for i, k in enumerate(cold):
            _AHEAD[k] = (helper, i)
    threading.Thread(target=compile_helper.finish, args=(helper,), daemon=True, name="nk-compile-helper").start()


def _keys(requests):
    """worker_address's keys (dispatcher, variant, nargs) of requests (nargs optional)."""
    return [(r[0], r[1], r[2] if len(r) > 2 else 2) for r in requests]


def _described(keys):
    """keys as compile_helper.start takes them: (module, function name, variant, nargs)."""
    return [(k[0].py_func.__module__, k[0].py_func.__name__, k[1], k[2]) for k in keys]


def _signature(variant, nargs):
    return (types.int64,) * nargs + tuple(types.none if v is None else types.literal(v) for v in variant)


def _address_locked(key):
    """worker_address's work, with _ADDRESSES_LOCK held."""
    addr = _ADDRESSES.get(key)
    if addr is None:
        dispatcher, variant, nargs = key
        if dispatcher.targetoptions.get("no_cfunc_wrapper"):
            raise ValueError(f"worker_address: {dispatcher.py_func.__qualname__} has no C entry point "
                             "(compile it with approx.JIT_BY_ADDRESS)")
        sig = _signature(variant, nargs)
        ahead = _AHEAD.pop(key, None)
        if ahead is not None and not compile_helper.claim(ahead[0].claims, ahead[1]):
            compile_helper.wait_for(*ahead)  # the helper has it: loaded from the cache below
        dispatcher.compile(sig)
        cres = dispatcher.overloads[sig]
        addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
        _ADDRESSES[key] = addr
    return addr


def _is_cold(key):
    """Whether worker_address(*key) would compile: not compiled in this process, and not in
    numba's on-disk cache (its index, read without loading the code).  False where numba
    keeps no cache for the function or its cache is not the kind this reads (a helper could
    not hand its work over)."""
    dispatcher, variant, nargs = key
    sig = _signature(variant, nargs)
    if sig in dispatcher.overloads:
        return False
    try:
        cache = dispatcher._cache
        return cache._index_key(sig, dispatcher.targetctx.codegen()) not in cache._cache_file._load_index()
    except Exception:  # noqa: BLE001 - numba internals (NullCache has no index): no helper
        return False


_ENTRIES = {}
_LITERAL_AT = {}
_ENTRIES_LOCK = threading.Lock()


def _arg_key(a):
    """What numba's typeof of a kernel argument depends on, cheaply (about 1 us an array
    against several for numba.typeof): an array's dtype, rank, layout, writability and
    alignment; a scalar's Python type."""
    if isinstance(a, np.ndarray):
        f = a.flags
        return a.dtype.str, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned
    return type(a)


def call_literal(dispatcher, literal, *args):
    """dispatcher(*args) compiled with the parameters named in literal (plain Python ints /
    bools there) as numba literals: one machine code per value, so a kernel whose flags
    choose among many inlined variants compiles only the variant a call takes (numba's own
    `literally` re-types the function on every call with a non-literal int: 13 ms a call of
    the portable int8 GEMM, 2026-11-28).  The compiled entry point is kept per (values,
    argument types); it is saved to and loaded from numba's cache like any signature."""
    at = _LITERAL_AT.get((dispatcher, literal))
    if at is None:
        code = dispatcher.py_func.__code__
        names = code.co_varnames[:code.co_argcount]
        at = _LITERAL_AT.setdefault((dispatcher, literal), tuple(names.index(n) for n in literal))
    key = (dispatcher, tuple(args[i] for i in at), tuple(_arg_key(a) for a in args))
    entry = _ENTRIES.get(key)
    if entry is None:
        with _ENTRIES_LOCK:
            entry = _ENTRIES.get(key)
            if entry is None:
                sig = tuple(types.literal(a) if i in at else dispatcher.typeof_pyval(a) for i, a in enumerate(args))
                dispatcher.compile(sig)
                entry = dispatcher.overloads[sig].entry_point
                _ENTRIES[key] = entry
    return entry(*args)


@intrinsic
def fetch_add(typingctx, arr, idx, val):
    """Atomically arr[idx] += val and return the old value (int64 array, no bounds check);
    val = 0 is an atomic read.  Sequentially consistent: a full barrier on x86, so data
    written before a fetch_add is visible to a thread that sees its result."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.gep(data, [context.cast(builder, args[1], sig.args[1], types.int64)])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, v, "seq_cst")

    return types.int64(arr, idx, val), codegen


def like_dtype(is64):
    return np.float64(0)


@overload(like_dtype, **OVERLOAD)
def _like_dtype_overload(is64):
    """A zero of the element type that the literal is64 (a worker argument) chooses."""
    if not isinstance(is64, types.Literal):
        return None
    if is64.literal_value:
        return lambda is64: np.float64(0)
    return lambda is64: np.float32(0)


_ZEROS = {"H": np.uint16(0), "h": np.int16(0), "f": np.float32(0), "d": np.float64(0)}


def zero_of(char):
    return _ZEROS[char]


@overload(zero_of, **OVERLOAD)
def _zero_of_overload(char):
    """A zero of the element type named by the literal numpy type character char (a
    worker's variant value, dtype.char: "H" uint16, "h" int16, "f" float32, "d" float64;
    dtype.char costs 0.04 us, dtype.name 1.8): the type of the arrays c_array_at makes."""
    if not isinstance(char, types.StringLiteral) or char.literal_value not in _ZEROS:
        return None
    z = _ZEROS[char.literal_value]
    return lambda char: z


@njit(cache=True)
def addresses(p, arrays):
    """p[i] = the data address of arrays[i] (a tuple of arrays: the first slots of a worker's
    argument block; in Python, a.ctypes.data costs ~3 us per array)."""
    i = 0
    for a in literal_unroll(arrays):
        p[i] = a.ctypes.data
        i += 1
