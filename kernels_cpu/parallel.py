"""How the parallel CPU kernels hand out work.

Kernels split their rows into blocks and numba's prange hands the blocks out one at a
time (chunk size 1), set from Python because numba.get_num_threads /
set_parallel_chunksize inside a kernel make it uncacheable ("dynamic globals").
Kernels with a big worker (the GEMM) run it with run_workers: the worker is called by
address from one shared parallel driver, so its code is compiled once (see below).
"""
import threading

import numba
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

# Parallel kernels split the rows into TASKS_PER_THREAD contiguous blocks per thread, handed
# out dynamically (parallel chunk size 1): when another process takes a core, the other
# thread takes more blocks instead of waiting for a fixed half.  Measured on (4096, 1024)
# softmax with other jobs running: best of 15 9.9 ms for a static half per thread, 2.5-2.7
# ms for 8-32 dynamic blocks per thread (medians 28 vs 18-21 ms; the machine was loaded).
TASKS_PER_THREAD = 8


def tasks_for(n):
    """Number of row blocks for n rows (at least 1, at most n)."""
    return max(min(numba.get_num_threads() * TASKS_PER_THREAD, n), 1)


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

@intrinsic
def _call_address(typingctx, fn, w, params):
    """Call the C function at address fn as void(int64 w, int64 params)."""
    sig = types.void(types.int64, types.int64, types.int64)

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fnptr = builder.inttoptr(args[0], ir.FunctionType(ir.VoidType(), [i64, i64]).as_pointer())
        builder.call(fnptr, [args[1], args[2]])
        return context.get_dummy_value()

    return sig, codegen


@njit(parallel=True, cache=True)
def _run_workers(fn, params, n):
    for w in prange(n):
        _call_address(fn, w, params)


def run_workers(fn, params, n):
    """fn(w, params.ctypes.data) for w in range(n) on numba's threads (n <= the thread
    count: one worker per thread).  fn: a worker_address(); params: an int64 array the
    worker reads its arguments from (addresses and sizes), kept alive by the caller."""
    _run_workers(fn, params.ctypes.data, n)


@intrinsic
def ptr_as(typingctx, addr, like):
    """The int64 address addr as a pointer to like's type (for numba.carray)."""
    if not isinstance(like, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

    return types.CPointer(like)(addr, like), codegen


_ADDRESSES = {}
_ADDRESSES_LOCK = threading.Lock()


def worker_address(dispatcher, sig):
    """The address of the C entry point of dispatcher's specialization for sig (a tuple of
    numba types whose first two are int64, int64: the worker index and the params
    address), compiled, or loaded from numba's cache, on first use."""
    key = (dispatcher, sig)
    addr = _ADDRESSES.get(key)
    if addr is None:
        with _ADDRESSES_LOCK:
            addr = _ADDRESSES.get(key)
            if addr is None:
                dispatcher.compile(sig)
                cres = dispatcher.overloads[sig]
                addr = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
                _ADDRESSES[key] = addr
    return addr
