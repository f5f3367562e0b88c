"""How the parallel CPU kernels hand out work.

Kernels split their rows into blocks and numba's prange hands the blocks out one at a
time (chunk size 1), set from Python because numba.get_num_threads /
set_parallel_chunksize inside a kernel make it uncacheable ("dynamic globals").
"""
import numba

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
