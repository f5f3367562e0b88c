"""kernels_cpu/parallel.py: the pieces the parallel kernels are built from (row views
without reference counts, functions called by address, the shared worker driver)."""
import threading

import numba
import numpy as np
import pytest
from numba import carray, njit, prange, types
from numba.extending import overload

from kernels_cpu.parallel import (c_array_at, call_address, call_literal, claim, claim_address, claims_for, fetch_add,
                                  num_threads, only_if, ptr_as, row_of, run_serial, run_workers, view_at,
                                  worker_address)
from tests.support import ON_CUDA, compile_events, rng

pytestmark = pytest.mark.skipif(ON_CUDA, reason="numba CPU helpers (the simulator job tests the CUDA side)")


@njit
def _rows_sum_and_scale(a, out):
    """out[i] = sum of row i; then every row of a is doubled in place through row_of."""
    for i in range(a.shape[0]):
        r = row_of(a, i)
        s = 0.0
        for j in range(r.shape[0]):
            s += r[j]
            r[j] *= 2
        out[i] = s


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 128)])
def test_row_of_is_the_row_itself(shape):
    g = rng()
    a = g.standard_normal(shape)
    before = a.copy()
    out = np.full(shape[0], np.nan)
    _rows_sum_and_scale(a, out)
    # the sums in the kernel's order, left to right: numpy's pairwise sum differs by a few
    # roundings, which a row summing to nearly 0 makes large relative errors
    # (NK_TEST_SEED=3694957015: 1.1e-12 at a sum of 0.003)
    want = np.empty(shape[0])
    for i, row in enumerate(before.tolist()):
        s = 0.0
        for v in row:
            s += v
        want[i] = s
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(a, 2 * before)  # writes went to a's memory


def test_row_of_refuses_arrays_without_unit_stride_rows():
    a = np.zeros((4, 6))[:, ::2]  # typed 'A': its rows may not be contiguous
    with pytest.raises(Exception, match="row_of"):
        _rows_sum_and_scale(a, np.zeros(4))


@njit
def _strided_copy(addr, like, shape, strides, out):
    """out[...] = the view_at array (through its own indexing), and its layout's strides."""
    v = view_at(addr, like, shape, strides)
    for i in range(shape[0]):
        for j in range(shape[1]):
            for k in range(shape[2]):
                out[i, j, k] = v[i, j, k]
    return v.strides


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
def test_view_at_is_the_strided_view(dtype):
    """Any element type (bool arrays store bytes), negative-free strides that skip
    elements, and a zero stride (broadcast), as the attention workers rebuild views."""
    g = rng()
    base = (g.standard_normal((5, 7, 9)) > 0) if dtype == np.bool_ else g.standard_normal((5, 7, 9)).astype(dtype)
    for view in (base[1:4, ::2, 3:], base[:, 2:3, ::3], np.broadcast_to(base[:1, :1, :], (3, 4, 9))):
        out = np.zeros(view.shape, dtype)
        strides = _strided_copy(view.ctypes.data, dtype(0) if dtype != np.bool_ else False, view.shape, view.strides,
                                out)
        np.testing.assert_array_equal(out, view)
        assert strides == view.strides


@njit
def _c_fill(addr, like, shape):
    """Writes i into element i of the C-order array at addr; returns its strides."""
    a = c_array_at(addr, like, shape)
    f = a.ravel()  # a view: c_array_at's array is C-contiguous
    for i in range(f.size):
        f[i] = i
    return a.strides


def test_c_array_at_is_c_order():
    buf = np.full(2 * 3 * 4 + 1, np.nan)
    strides = _c_fill(buf.ctypes.data, 0.0, (2, 3, 4))
    assert strides == (96, 32, 8)
    np.testing.assert_array_equal(buf[:-1], np.arange(24.0))
    assert np.isnan(buf[-1])  # nothing past the shape


@njit(no_cpython_wrapper=True)
def _record(w, params, a, b, c):
    """Writes (w, a + b + c) into the int64 block: slot 2w and 2w + 1."""
    p = carray(ptr_as(params, np.int64(0)), 64)
    p[2 * w] = w
    p[2 * w + 1] = a + b + c


@njit(no_cpython_wrapper=True)
def _count(w, params):
    """Task w of run_workers: p[1 + w] += 1 (atomically: a task run twice would show)."""
    p = carray(ptr_as(params, np.int64(0)), 64)
    fetch_add(p, 1 + w, 1)
    fetch_add(p, 0, 1)


@njit
def _call(fn, params, w, a, b, c):
    call_address(fn, (w, params, a, b, c))


def test_call_address_passes_every_argument():
    p = np.zeros(64, np.int64)
    fn = worker_address(_record, (), nargs=5)
    for w, (a, b, c) in enumerate([(1, 2, 3), (-5, 0, 7), (2**40, 1, 1)]):
        _call(fn, p.ctypes.data, w, a, b, c)
        assert (p[2 * w], p[2 * w + 1]) == (w, a + b + c)


@pytest.mark.parametrize("n", [1, 2, 37])
def test_run_workers_runs_each_task_once(n):
    """n workers, or n tasks (more than the threads, as pack_b hands out panels)."""
    p = np.zeros(64, np.int64)
    run_workers(worker_address(_count, ()), p, n)
    assert p[0] == n
    np.testing.assert_array_equal(p[1:1 + n], 1)
    assert not p[1 + n:].any()


@njit(parallel=True)
def _claim_rows(hits, nw, fn, counters, least):
    """hits[i] += 1 for every row a claim hands out (as a row kernel does); the claims'
    (least, workers) are returned."""
    n = hits.shape[0]
    least, workers = claims_for(n, nw, least)
    for me in prange(workers):
        lo, hi = claim(fn, counters, n, workers, least, me)
        while lo < hi:
            for i in range(lo, hi):
                hits[i] += 1
            lo, hi = claim(fn, counters, n, workers, least, me)
    return least, workers


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 1000, 100003])
@pytest.mark.parametrize("least", [1, 7, 64])
@pytest.mark.parametrize("nw", [1, 2, 3, 8])
def test_claims_hand_out_every_row_once(n, least, nw):
    """Whichever thread runs which prange iteration (numba may run several on one thread,
    and more iterations than threads here), each row goes to exactly one claim, and the
    claims stop at n."""
    hits = np.zeros(n, np.int64)
    fn = claim_address()
    got_least, workers = _claim_rows(hits, nw, fn, np.zeros(nw * 16, np.int64), least)
    assert got_least >= least and 1 <= workers <= nw
    np.testing.assert_array_equal(hits, 1)


def test_claims_take_the_own_range_first_then_the_others():
    """Iteration 0 first (iteration 1 late): its own range front to back in halving claims
    (never under least but for the last), then iteration 1's range but for its last
    `least` rows, which iteration 1 takes when it runs."""
    fn = claim_address()
    assert _claims_for(1000, 2, 10) == (31, 2)  # at least 1000 / (2 * MIN_SHARES)
    counters, workers = np.zeros(2 * 16, np.int64), 2

    def claims_of(me):
        out = []
        lo, hi = _claim_one(fn, counters, 1000, workers, 10, me)
        while lo < hi:
            out.append((lo, hi))
            lo, hi = _claim_one(fn, counters, 1000, workers, 10, me)
        return out

    first, late = claims_of(0), claims_of(1)
    assert all(a[1] == b[0] for a, b in zip(first, first[1:])) and first[0][0] == 0  # in order, contiguous
    own = [h - lo for lo, h in first if h <= 500]
    assert own[0] == 250 and sum(own) == 500 and min(own[:-1]) >= 10
    assert all(a >= b for a, b in zip(own, own[1:]))
    assert len(late) == 1 and late[0][1] == 1000 and 0 < late[0][1] - late[0][0] <= 10  # the owner's tail
    assert first[-1][1] == late[0][0]


@njit
def _claims_for(n, nw, least):
    return claims_for(n, nw, least)


@njit
def _claim_one(fn, counters, n, workers, least, me):
    return claim(fn, counters, n, workers, least, me)


def test_num_threads_is_numbas_per_thread_count():
    """num_threads() reads numba's count without its lock: the same answer, per thread."""
    nw = num_threads()
    _claim_rows(np.zeros(4, np.int64), nw, claim_address(), np.zeros(nw * 16, np.int64), 1)  # starts numba's pool
    assert num_threads() == numba.get_num_threads()
    seen = []

    def one_thread():
        numba.set_num_threads(1)
        seen.append((num_threads(), numba.get_num_threads()))

    t = threading.Thread(target=one_thread)
    t.start()
    t.join()
    assert seen == [(1, 1)]
    assert num_threads() == numba.get_num_threads()


def test_run_serial_runs_worker_zero():
    p = np.zeros(64, np.int64)
    run_serial(worker_address(_count, ()), p)
    assert p[0] == 1 and p[1] == 1 and not p[2:].any()


@njit(no_cpython_wrapper=True)
def _only_in_the_true_path(w):
    return w + 100


@njit(no_cpython_wrapper=True)
def _two_paths(w, params, flag):
    p = carray(ptr_as(params, np.int64(0)), 64)
    if flag is not None:
        p[0] = _only_in_the_true_path(w)
    else:
        p[0] = -1


def test_only_if_compiles_only_the_path_taken():
    """A worker variant only_if(False) (None) never types its `flag is not None` branch:
    the function called only there stays uncompiled; only_if(True) compiles and runs it."""
    p = np.zeros(64, np.int64)
    run_serial(worker_address(_two_paths, (only_if(False),)), p)
    assert p[0] == -1 and not _only_in_the_true_path.signatures
    run_serial(worker_address(_two_paths, (only_if(True),)), p)
    assert p[0] == 100 and len(_only_in_the_true_path.signatures) == 1


def _typed_literal(x):
    return x


@overload(_typed_literal)
def _typed_literal_overload(x):
    """Compiles only for a literal int: its value, baked into the machine code."""
    if isinstance(x, types.IntegerLiteral):
        v = x.literal_value
        return lambda x: v
    return None


@njit
def _scaled(a, out, k):
    for i in range(a.shape[0]):
        out[i] = a[i] * _typed_literal(k)


def test_call_literal_compiles_once_per_value_and_never_retypes():
    """call_literal passes `k` as a numba literal: one signature per value; a repeat call
    with a value or argument types already seen compiles (and types) nothing, where numba's
    literally() re-typed the function on every call (13 ms a call of the portable int8 GEMM)."""
    g = rng()
    a = g.standard_normal(17)
    outs = {k: np.full(17, np.nan) for k in (2, 3)}
    for k, out in outs.items():
        call_literal(_scaled, ("k",), a, out, k)
        np.testing.assert_array_equal(out, a * k)
    assert sorted(str(sig[-1]) for sig in _scaled.overloads) == ["Literal[int](2)", "Literal[int](3)"]
    with compile_events() as seen:
        for k, out in outs.items():
            out[:] = np.nan
            call_literal(_scaled, ("k",), a, out, k)
            np.testing.assert_array_equal(out, a * k)
    assert not seen, f"{len(seen)} compile events on calls already compiled"
    # other argument types: a signature of their own (a float32 array here), still literal
    a32 = a.astype(np.float32)
    out32 = np.full(17, np.nan, np.float32)
    call_literal(_scaled, ("k",), a32, out32, 3)
    np.testing.assert_array_equal(out32, a32 * 3)
    assert len(_scaled.overloads) == 3
