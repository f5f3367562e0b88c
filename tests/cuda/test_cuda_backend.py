"""CUDA-only tests: the simulator's warp-primitive emulation, the shuffle reductions, every
GEMM tile configuration, float16 inputs, device-array plumbing (strided views, out=,
results on the device, mixed host/device errors), launch rules and explain.

Run with NK_TEST_DEVICE=cuda (under NUMBA_ENABLE_CUDASIM=1 without a GPU); skipped on the
CPU target by tests/conftest.py.  Shapes are tiny (simulator: ~0.1 ms per GPU thread)
but still cover partial tiles, several blocks and several warps per block.
"""
import math
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

import dispatch
from dispatch import devices
from kernels_common.cuda_tiles import GEMM_TILES, gemm_threads
from tests.support import ON_CUDA, assert_close, current_seed, product_scale, rng

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="CUDA target only")
SIM = devices.simulator_enabled()


if ON_CUDA:
    # a module global named `cuda`: the simulator swaps it for its fake module in kernels
    from numba import cuda


def _dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


# ---- warp primitives (emulated under the simulator, real on a GPU) ------------------------

def test_warp_shuffles_match_ptx_semantics():
    from numba import int32

    @cuda.jit
    def k(out):
        lane = cuda.threadIdx.x & 31
        v = int32(cuda.threadIdx.x * 10)
        out[0, cuda.threadIdx.x] = cuda.shfl_xor_sync(0xFFFFFFFF, v, 5)
        out[1, cuda.threadIdx.x] = cuda.shfl_down_sync(0xFFFFFFFF, v, 3)
        out[2, cuda.threadIdx.x] = cuda.shfl_up_sync(0xFFFFFFFF, v, 2)
        out[3, cuda.threadIdx.x] = cuda.shfl_sync(0xFFFFFFFF, v, 7)
        out[4, cuda.threadIdx.x] = cuda.ballot_sync(0xFFFFFFFF, lane % 3 == 0)
        cuda.syncwarp(0xFFFFFFFF)

    out = np.zeros((5, 64), np.int64)
    k[1, 64](out)
    t = np.arange(64)
    lane, base = t % 32, t - t % 32
    assert np.array_equal(out[0], (base + (lane ^ 5)) * 10)
    assert np.array_equal(out[1], np.where(lane + 3 < 32, t + 3, t) * 10)
    assert np.array_equal(out[2], np.where(lane >= 2, t - 2, t) * 10)
    assert np.array_equal(out[3], (base + 7) * 10)
    assert np.all(out[4] == sum(1 << i for i in range(32) if i % 3 == 0))


@pytest.mark.skipif(not SIM, reason="checks the emulation's error on undefined use")
def test_emulation_rejects_lanes_outside_mask():

    @cuda.jit
    def k(out):
        if cuda.threadIdx.x < 16:
            out[cuda.threadIdx.x] = cuda.shfl_down_sync(0xFFFF, cuda.threadIdx.x, 8)

    with pytest.raises(RuntimeError, match="not in mask"):
        k[1, 32](np.zeros(32, np.int64))


def test_syncthreads_with_early_exits_and_repeated_barriers():
    """Barrier semantics the simulator's greenlet block manager (tests/cuda/simwarp.py)
    must keep: every phase sees all writes of the one before; threads that return early
    do not hold the others at later barriers; syncthreads_count counts the live threads."""
    from numba import int32

    @cuda.jit
    def k(out, counts):
        s = cuda.shared.array(64, int32)
        t = cuda.threadIdx.x
        s[t] = t
        cuda.syncthreads()
        for phase in range(5):  # rotate the shared values one place per phase
            v = s[(t + 1) % 64]
            cuda.syncthreads()
            s[t] = v
            cuda.syncthreads()
        out[t] = s[t]
        if t >= 40:
            return
        # an int32 predicate: numba-cuda types syncthreads_count(i4) only (a bool was refused
        # at compile time on an H200, 2026-11-26; the simulator took it)
        counts[t] = cuda.syncthreads_count(numba.int32(1) if t < 10 else numba.int32(0))
        cuda.syncthreads()
        out[t] += 1000

    out = np.zeros(64, np.int64)
    counts = np.zeros(40, np.int64)
    k[1, 64](out, counts)
    t = np.arange(64)
    assert np.array_equal(out, (t + 5) % 64 + np.where(t < 40, 1000, 0))
    assert np.all(counts == 10)


@pytest.mark.skipif(not SIM, reason="the simulator re-raises a thread's exception")
def test_simulator_reraises_a_failing_thread_and_releases_the_block():
    @cuda.jit
    def k(out):
        t = cuda.threadIdx.x
        cuda.syncthreads()
        if t == 7:
            out[1000] = 1.0  # out of bounds: the simulator raises IndexError in this thread
        cuda.syncthreads()
        out[t] = t

    with pytest.raises(IndexError, match=r"tid=\[7, 0, 0\]"):
        k[2, 32](np.zeros(64))
    out = np.zeros(64)
    k2 = cuda.jit(lambda o: o.__setitem__(cuda.threadIdx.x, 1.0))  # the simulator is usable after it
    k2[1, 64](out)
    assert np.all(out == 1.0)


@pytest.mark.skipif(not SIM, reason="the simulator's deadlock report (tests/cuda/simwarp.py)")
def test_simulator_reports_lanes_waiting_for_exited_lanes():
    """Lanes that shuffle with lanes which have returned wait forever on hardware (undefined
    behaviour); the simulator's greenlet blocks report it at once, and the simulator
    works after it (the aborted threads' module swaps were undone)."""

    @cuda.jit
    def k(out):
        t = cuda.threadIdx.x
        if t >= 16:
            return
        out[t] = cuda.shfl_down_sync(0xFFFFFFFF, t, 1)

    with pytest.raises(RuntimeError, match="deadlock in block"):
        k[1, 32](np.zeros(32, np.int64))
    out = np.zeros(64)
    k2 = cuda.jit(lambda o: o.__setitem__(cuda.threadIdx.x, 1.0))
    k2[1, 64](out)
    assert np.all(out == 1.0)


@pytest.mark.skipif(not SIM, reason="checks the simulator fix (tests/cuda/simwarp.py)")
def test_simulator_shared_array_is_one_array_per_block():
    """Every thread of a block that reaches a cuda.shared.array line at the same moment
    gets the same array.  The simulator's own allocation checks and fills a dict without
    a lock; before simwarp's fix this harness saw several distinct arrays (the cause of
    the intermittent wrong rows in the flash attention tests)."""
    import threading

    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    n = 64

    def one_launch():
        shared = FakeCUDAShared(0)
        start = threading.Barrier(n)
        got = [None] * n

        def thread(i):
            start.wait()
            got[i] = shared.array((8,), np.float32)  # one line: one array for every thread

        ts = [threading.Thread(target=thread, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return len({id(a) for a in got})

    # A GIL switch every microsecond makes the race window likely: the upstream function
    # gave distinct arrays in 4 of 20 launches this way (about 1e-5 to pass 50 by chance).
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        counts = [one_launch() for _ in range(50)]
    finally:
        sys.setswitchinterval(old)
    assert counts == [1] * 50, f"distinct shared arrays per launch: {counts}"


@pytest.mark.parametrize("threads", [32, 96])
def test_block_reductions(threads):
    from numba import float32

    from kernels_cuda import primitives as P

    @cuda.jit
    def k(x, out):
        s1 = cuda.shared.array(32, float32)
        s2 = cuda.shared.array(32, float32)
        t = cuda.threadIdx.x
        v = x[cuda.blockIdx.x, t]
        out[cuda.blockIdx.x, 0, t] = P.block_sum(v, s1, float32(0))
        out[cuda.blockIdx.x, 1, t] = P.block_max(v, s1, float32(-np.inf))
        m, s = P.block_max_sumexp(v, float32(1), s1, s2, float32(-np.inf), float32(0))
        out[cuda.blockIdx.x, 2, t] = m
        out[cuda.blockIdx.x, 3, t] = s
        a, b = P.block_sum2(v, v * v, s1, s2, float32(0))
        out[cuda.blockIdx.x, 4, t] = b

    x = rng().standard_normal((2, threads)).astype(np.float32)
    out = np.zeros((2, 5, threads), np.float32)
    k[2, threads](x, out)
    x64 = x.astype(np.float64)
    for b in range(2):
        # a sum of signed terms can cancel to ~0: bound its error by the sum of |terms|
        err = np.abs(out[b, 0] - x64[b].sum()).max()
        assert err <= 1e-5 * np.abs(x64[b]).sum(), f"block_sum error {err:.3e} (seed {current_seed()})"
        assert np.all(out[b, 1] == x[b].max())
        assert np.all(out[b, 2] == x[b].max())
        assert_close(out[b, 3], np.full(threads, np.exp(x64[b] - x64[b].max()).sum()), 1e-5)
        assert_close(out[b, 4], np.full(threads, (x64[b] ** 2).sum()), 1e-5)


# ---- GEMM: every tile configuration, forced ------------------------------------------------

@pytest.mark.parametrize("tile", sorted(GEMM_TILES))
def test_gemm_tile(tile):
    from kernels_cuda import gemm

    g = rng()
    bm, bn = gemm.CONFIGS[tile][:2]
    m, n, k = (bm + 5, bn + 3, 21) if bm <= 32 else (bm - 27, bn + 2, 19)
    a = g.standard_normal((2, m, k)).astype(np.float32)
    bt = g.standard_normal((1, n, k)).astype(np.float32)  # (N, K): trans_b
    bias = g.standard_normal(n).astype(np.float32)
    c = np.full((2, m, n), np.nan, np.float32)
    ai, bi = np.arange(2, dtype=np.int64), np.zeros(2, np.int64)
    grid = -(-n // bn) * -(-m // bm) * 2  # (column block, row block, batch) folded into x
    dc = _dev(c)
    gemm.gemm_kernel(np.float32, tile)[grid, gemm_threads(tile)](
        _dev(a), _dev(bt), _dev(ai), _dev(bi), _dev(bias), dc, 1, True, True)
    ref = np.maximum(a.astype(np.float64) @ bt[0].T.astype(np.float64) + bias, 0)
    assert_close(dc.copy_to_host(), ref, 1e-5, tile, cancel=True)


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_gemm_vector_tile(layout):
    """The float32 128 x 128 x 8 tile in 16-byte vectors (gemm.gemm_vec_kernel), through
    dispatch on a nominal 1-SM part (so that its grid fills the part): partial row, column
    and K tiles (K = 20: tiles of 8, 8 and 4), a broadcast batch, bias + gelu, both B
    layouts; K = 21 takes the register-tiled kernel and the launch says why."""
    from kernels_common.cuda_tiles import GEMM_VEC_KERNEL

    g = rng()
    part = devices.DeviceProps("nominal 1-SM part", (8, 0), 1, 1024, 48 * 1024, 48 * 1024, 164 * 1024, 65536, 2048)
    m, n, k = 133, 132, 20
    a = g.standard_normal((2, m, k)).astype(np.float32)
    w = g.standard_normal((n, k) if layout == "nk" else (k, n)).astype(np.float32)
    bias = g.standard_normal(n).astype(np.float32)
    w64 = w.astype(np.float64).T if layout == "nk" else w.astype(np.float64)
    z = a.astype(np.float64) @ w64 + bias
    erf = np.vectorize(math.erf)
    want = 0.5 * z * (1 + erf(z / np.sqrt(2)))
    fn = dispatch.linear if layout == "nk" else dispatch.matmul
    with devices.assume(part), dispatch.use(**{fn.__name__: "cuda-gemm"}):
        if layout == "nk":
            cfg = _launch_of("linear", _dev(a), _dev(w), _dev(bias), activation="gelu")
            got = dispatch.linear(_dev(a), _dev(w), _dev(bias), activation="gelu")
        else:
            cfg = _launch_of("matmul", _dev(a), _dev(w), bias=_dev(bias), activation="gelu")
            got = dispatch.matmul(_dev(a), _dev(w), bias=_dev(bias), activation="gelu")
        assert cfg["kernel"].startswith(GEMM_VEC_KERNEL), cfg
        assert_close(got.copy_to_host(), want, 1e-5, f"vector tile {layout}", cancel=True)
        a21 = g.standard_normal((1, 5, 21)).astype(np.float32)
        w21 = g.standard_normal((7, 21) if layout == "nk" else (21, 8)).astype(np.float32)
        cfg = _launch_of(fn.__name__, _dev(a21), _dev(w21))
        assert cfg["kernel"].startswith("gemm.") and "not a multiple of 4" in cfg["path"], cfg


# ---- float16 inputs (float32 accumulation) ------------------------------------------------

F16_TOL = 2e-3


def test_float16_elementwise_softmax_norm_gemm():
    g = rng()
    x = g.standard_normal((5, 70)).astype(np.float16)
    up = g.standard_normal((5, 70)).astype(np.float16)
    x64, up64 = x.astype(np.float64), up.astype(np.float64)
    y = dispatch.swiglu(_dev(x), _dev(up)).copy_to_host()
    assert y.dtype == np.float16
    assert_close(y, x64 / (1 + np.exp(-x64)) * up64, F16_TOL, "swiglu fp16")
    for impl in ("cuda-warp-row", "cuda-block-row"):
        with dispatch.use(softmax=impl, rms_norm=impl):
            s = dispatch.softmax(_dev(x)).copy_to_host()
            e = np.exp(x64 - x64.max(-1, keepdims=True))
            assert_close(s, e / e.sum(-1, keepdims=True), F16_TOL, "softmax fp16 " + impl)
            r = dispatch.rms_norm(_dev(x)).copy_to_host()
            assert_close(r, x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6), F16_TOL, "rms fp16 " + impl)
    w = g.standard_normal((70, 33)).astype(np.float16)
    c = dispatch.matmul(_dev(x), _dev(w)).copy_to_host()
    assert c.dtype == np.float16
    assert_close(c, x64 @ w.astype(np.float64), F16_TOL, "matmul fp16", cancel=True)


@pytest.mark.parametrize("case", ["linear bias gelu", "batched broadcast", "two row blocks", "k below 16"])
def test_float16_gemm_runs_on_tensor_cores(case):
    """float16 matmul / linear go to the tensor-core kernel (mma.m16n8k16, float32
    accumulation): edges of the 64 x 64 tile and of the 16-wide K step, batches, the (N, K)
    weight, bias + activation.  Under the simulator the mma is its Python twin."""
    from kernels_common.cuda_tiles import TC_KERNEL

    g = rng()

    def h(*shape):
        return g.standard_normal(shape).astype(np.float16)

    if case == "linear bias gelu":
        x, w, b = h(2, 3, 37), h(20, 37), h(20)
        args, kw, fn = (_dev(x), _dev(w), _dev(b)), {"activation": "gelu"}, dispatch.linear
        y = x.astype(np.float64) @ w.T.astype(np.float64) + b
        want = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    else:
        a, bm = {"batched broadcast": (h(2, 1, 17, 24), h(3, 24, 9)), "two row blocks": (h(70, 8), h(8, 9)),
                 "k below 16": (h(5, 3), h(3, 6))}[case]
        args, kw, fn = (_dev(a), _dev(bm)), {}, dispatch.matmul
        want = a.astype(np.float64) @ bm.astype(np.float64)
    with dispatch.use(**{fn.__name__: "cuda-gemm"}):  # few rows would go to cuda-gemv
        assert f"'kernel': '{TC_KERNEL}'" in str(dispatch.explain(fn.__name__, *args, **kw))
        got = fn(*args, **kw).copy_to_host()
    assert got.dtype == np.float16
    assert_close(got, want, F16_TOL, case, cancel=True)


def test_decode_rows_go_to_the_gemv_kernel():
    """M <= 8 (decode) runs cuda-gemv: no 64-row tile of mostly zero rows; forced on more
    rows it takes them 8 at a time.  Both B layouts, bias + activation."""
    g = rng()
    x, w, b = g.standard_normal((1, 64)), g.standard_normal((200, 64)), g.standard_normal(200)
    x, w, b = (v.astype(np.float32) for v in (x, w, b))
    e = dispatch.explain("linear", _dev(x), _dev(w), _dev(b))
    assert e.chosen == "cuda-gemv" and "'column_per': 'warp'" in str(e), str(e)
    got = dispatch.linear(_dev(x), _dev(w), _dev(b), activation="relu").copy_to_host()
    want = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    assert_close(got, want, 1e-5, "linear decode", cancel=True)
    a, bm = g.standard_normal((11, 33)).astype(np.float32), g.standard_normal((33, 9)).astype(np.float32)
    with dispatch.use(matmul="cuda-gemv"):
        got = dispatch.matmul(_dev(a), _dev(bm)).copy_to_host()
    assert_close(got, a.astype(np.float64) @ bm.astype(np.float64), 1e-5, "matmul 11 rows", cancel=True)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemv_unrolled_steps_and_remainders(layout, dtype):
    """K long enough that each warp runs a step of GEMV_UNROLL loads and then the remainder
    loop (one step and a partial one, per dtype's lanes per column), 1, 3 and 9 rows (two
    row groups), columns not a multiple of a block's group; a (K, N) b also batched."""
    from kernels_common.cuda_tiles import GEMV_KN_WARPS, GEMV_UNROLL, gemv_kn_columns

    warps = min(GEMV_KN_WARPS, devices.props().max_threads_per_block // 32)  # as the launch

    g = rng()
    isz = np.dtype(dtype).itemsize
    step = 32 if layout == "nk" else (32 // gemv_kn_columns(isz)) * warps
    k = step * GEMV_UNROLL + step // 2 + 3
    n = 5 if layout == "nk" else gemv_kn_columns(isz) + 3
    tol = {np.float16: 2e-2, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    for m in (1, 3, 9):
        x = g.standard_normal((m, k)).astype(dtype)
        bias = g.standard_normal(n).astype(dtype)
        if layout == "nk":
            w = g.standard_normal((n, k)).astype(dtype)
            with dispatch.use(linear="cuda-gemv"):
                got = dispatch.linear(_dev(x), _dev(w), _dev(bias), activation="relu").copy_to_host()
            want = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + bias, 0)
        else:
            w = g.standard_normal((2, k, n)).astype(dtype)
            with dispatch.use(matmul="cuda-gemv"):
                got = dispatch.matmul(_dev(x), _dev(w), bias=_dev(bias), activation="relu").copy_to_host()
            want = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + bias, 0)
        assert got.dtype == dtype
        # scale: the terms' size (a sum of 275 products of N(0, 1) values can cancel to
        # 0.064 after the bias, its float32 rounding 1.5e-5 of that: NK_TEST_SEED=874619152)
        scale = product_scale(x, w, bias, transpose_b=layout == "nk")
        assert_close(got, want, tol, f"gemv {layout} m={m} k={k}", cancel=True, scale=scale)


# ---- device-array plumbing ------------------------------------------------------------------

def test_results_stay_on_device_and_out_is_returned():
    x = rng().standard_normal((3, 40)).astype(np.float32)
    y = dispatch.relu(_dev(x))
    assert devices.device_kind(y) == "cuda" and not isinstance(y, np.ndarray)
    out = _dev(np.full((3, 40), np.nan, np.float32))
    assert dispatch.relu(_dev(x), out=out) is out
    assert np.array_equal(out.copy_to_host(), np.maximum(x, 0))


def test_strided_device_views_in_and_out():
    g = rng()
    big = g.standard_normal((4, 2, 50)).astype(np.float32)
    dbig = _dev(big)
    view = dbig[:, 1, ::2]  # non-contiguous device view
    out_big = _dev(np.full((4, 2, 25), np.nan, np.float32))
    out_view = out_big[:, 0, :]
    res = dispatch.softmax(view, out=out_view)
    assert res is out_view
    v = big[:, 1, ::2].astype(np.float64)
    e = np.exp(v - v.max(-1, keepdims=True))
    host = out_big.copy_to_host()
    assert_close(host[:, 0, :], e / e.sum(-1, keepdims=True), 1e-5)
    assert np.isnan(host[:, 1, :]).all()  # the other half untouched


def test_mixed_host_and_device_is_an_error_naming_the_argument():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="out is a cuda array but x is a cpu array"):
        dispatch.relu(x, out=_dev(x))
    with pytest.raises(ValueError, match="b is a cpu array but a is a cuda array"):
        dispatch.matmul(_dev(x), np.ones((3, 2), np.float32))


def test_device_out_overlapping_input_rejected():
    d = _dev(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="out overlaps input x"):
        dispatch.relu(d[:4], out=d[2:6])


def test_cross_entropy_bad_target_names_targets():
    logits = rng().standard_normal((4, 6)).astype(np.float32)
    with pytest.raises(ValueError, match=r"targets\[2\] = 6 is out of range"):
        dispatch.cross_entropy(_dev(logits), _dev(np.array([0, 1, 6, -100])))


def test_explain_shows_launch_configuration():
    e = str(dispatch.explain("softmax", _dev(np.ones((3, 3000), np.float32))))
    assert "chosen: cuda-block-row" in e and "launch: {'kernel': 'softmax.block_vec_rows'" in e
    assert "'vector': '4 elements (16 bytes)'" in e
    e = str(dispatch.explain("matmul", _dev(np.ones((3, 5), np.float32)), _dev(np.ones((5, 7), np.float32))))
    assert "launch: {'kernel': 'gemm." in e


# ---- launch rules on real chips' properties (pure Python) -----------------------------------

def test_launch_rules_follow_device_properties():
    from dispatch.cuda_impls import linalg
    from dispatch.cuda_impls._common import row_launch

    h100, orin = devices.CHIPS["sm_90"], devices.CHIPS["sm_87"]
    assert linalg.choose_tile(h100, 1, 4096, 4096)[0] == "128x64x8/8x4"
    assert linalg.choose_tile(h100, 1, 128, 768)[0] == "32x32x16/4x2"  # 48 64x64 tiles < 132 SMs
    assert linalg.choose_tile(orin, 1, 128, 768)[0] == "64x64x16/4x4"  # 24 tiles >= 16 SMs
    with devices.assume(h100):
        cfg = row_launch({"mode": "block", "per_thread": 8, "max_block": 1024, "waves": 1}, 128, 50257, "softmax")
        assert cfg["block"] == 1024 and cfg["grid"] == 128
        cfg = row_launch({"mode": "warp", "warps_per_block": 4}, 1000, 768, "softmax")
        assert cfg["block"] == 128 and cfg["grid"] == 250


# ---- without a GPU or without numba-cuda ---------------------------------------------------

def _subprocess(code, **env):
    e = dict(os.environ, **env)
    e.pop("NUMBA_ENABLE_CUDASIM", None)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_cuda_request_without_gpu_or_simulator_is_a_clear_error():
    code = """
import numpy as np
from numba import cuda
if cuda.is_available():
    print("HAS-GPU")
else:
    import dispatch
    class Fake:
        shape, dtype, ndim = (4,), np.dtype(np.float32), 1
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}
    try:
        dispatch.relu(Fake())
    except RuntimeError as e:
        print("ERR", e)
"""
    r = _subprocess(code, NUMBA_ENABLE_CUDASIM="0")
    if "HAS-GPU" in r.stdout:
        pytest.skip("a GPU is present")
    assert "ERR" in r.stdout and "no CUDA GPU is available" in r.stdout, r.stdout + r.stderr


def test_cpu_side_works_without_numba_cuda():
    code = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "numba.cuda" or name.startswith("numba.cuda.") or name.startswith("numba_cuda"):
            raise ImportError("blocked for the test")
sys.meta_path.insert(0, Block())
import numpy as np, dispatch
print(float(dispatch.relu(np.array([-1.0, 2.0], np.float32))[1]), "numba.cuda" in sys.modules)
"""
    r = _subprocess(code, NUMBA_ENABLE_CUDASIM="0")
    assert r.stdout.split() == ["2.0", "False"], r.stdout + r.stderr


@pytest.mark.parametrize("impl", ["cuda-warp-row", "cuda-block-row"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_both_kernels(impl, reduction):
    g = rng()
    logits = g.standard_normal((5, 90)).astype(np.float32) * 3
    t = g.integers(0, 90, 5)
    t[1] = -100
    with dispatch.use(cross_entropy=impl):
        got = dispatch.cross_entropy(_dev(logits), _dev(t), reduction=reduction).copy_to_host()
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    loss = np.where(t == -100, 0.0, lse - x[np.arange(5), np.where(t == -100, 0, t)])
    want = loss if reduction == "none" else loss.sum() / 4
    assert_close(got, want, 1e-5, cancel=True)


def test_float16_rope_attention_cross_entropy():
    g = rng()
    x = g.standard_normal((1, 2, 5, 8)).astype(np.float16)
    ang = g.random((5, 4))
    cos, sin = np.cos(ang).astype(np.float16), np.sin(ang).astype(np.float16)
    got = dispatch.rope(_dev(x), _dev(cos), _dev(sin)).copy_to_host()
    assert got.dtype == np.float16
    want = dispatch.rope(x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64))
    assert_close(got, want, F16_TOL, "rope fp16", cancel=True)
    q = g.standard_normal((1, 2, 3, 8)).astype(np.float16)
    k = g.standard_normal((1, 1, 9, 8)).astype(np.float16)
    v = g.standard_normal((1, 1, 9, 8)).astype(np.float16)
    from tests.reference import attention as R

    for impl in ("cuda-flash", "cuda-splitkv"):
        with dispatch.use(attention=impl):
            got = dispatch.attention(_dev(q), _dev(k), _dev(v), causal=True).copy_to_host()
        assert got.dtype == np.float16
        want = R.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal=True)
        assert_close(got, want, F16_TOL, "attention fp16 " + impl, cancel=True)
    logits = g.standard_normal((4, 30)).astype(np.float16)
    t = g.integers(0, 30, 4)
    got = float(dispatch.cross_entropy(_dev(logits), _dev(t)).copy_to_host())
    x = logits.astype(np.float64)
    want = np.mean(np.log(np.exp(x).sum(1)) - x[np.arange(4), t])
    assert abs(got - want) <= F16_TOL * abs(want) + 1e-3


def test_split_kv_really_splits_and_matches_flash():
    g = rng()
    q = g.standard_normal((1, 4, 1, 16)).astype(np.float32)
    k = g.standard_normal((1, 2, 100, 16)).astype(np.float32)
    v = g.standard_normal((1, 2, 100, 16)).astype(np.float32)
    e = dispatch.explain("attention", _dev(q), _dev(k), _dev(v))
    assert e.chosen == "cuda-splitkv"
    assert e.decision.chosen.launch_config(e.call)["grid"][2] >= 2
    from tests.reference import attention as R

    got = dispatch.attention(_dev(q), _dev(k), _dev(v)).copy_to_host()
    assert_close(got, R.attention(q, k, v), 1e-5, cancel=True)


def test_block_per_row_kernels_with_several_warps():
    """Rows long enough for 2- and 4-warp blocks (the op tests' short rows get one warp)."""
    g = rng()
    # 2501 / 32 elements a thread (softmax, norms; cross_entropy 8) -> 128 threads (the
    # simulator's cap), 4 warps; odd, so that the streaming kernels run (test_vector_row_kernels
    # covers the vector ones; softmax streams float32 in vectors, float64 element by element)
    x = g.standard_normal((2, 2501)).astype(np.float32)
    r = g.standard_normal((2, 2501)).astype(np.float32)
    w = g.standard_normal(2501).astype(np.float32)
    x64 = x.astype(np.float64)
    with dispatch.use(softmax="cuda-block-row", layer_norm="cuda-block-row", cross_entropy="cuda-block-row"):
        cfg = _launch_of("softmax", _dev(x64))
        assert cfg["block"] == 128 and cfg["kernel"] == "softmax.block_rows"
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        assert_close(dispatch.softmax(_dev(x64)).copy_to_host(), e / e.sum(-1, keepdims=True), 1e-12)
        y, h = dispatch.layer_norm(_dev(x), _dev(w), residual=_dev(r))
        hh = x64 + r
        ref = (hh - hh.mean(-1, keepdims=True)) / np.sqrt(hh.var(-1, keepdims=True) + 1e-5) * w
        assert_close(y.copy_to_host(), ref, 1e-5, cancel=True)
        assert_close(h.copy_to_host(), hh, 1e-6)
        t = np.array([3, 2400])
        got = dispatch.cross_entropy(_dev(x), _dev(t), reduction="none").copy_to_host()
        lse = np.log(e.sum(-1)) + x64.max(-1)
        assert_close(got, lse - x64[[0, 1], t], 1e-5, cancel=True)


def _launch_of(op, *args, **kw):
    e = dispatch.explain(op, *args, **kw)
    return e.decision.chosen.launch_config(e.call)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("impl,d", [("cuda-warp-row", 72), ("cuda-warp-row", 1024), ("cuda-block-row", 72),
                                    ("cuda-block-row", 2056), ("cuda-block-row", 4096)])
def test_vector_row_kernels(impl, d, dt):
    """The row-in-registers kernels (16-byte loads and stores: norm.make_vec,
    softmax.vec_rows) on rows where a thread holds 0..VEC_ROW_ELEMENTS elements (72: most
    lanes idle; 2056: 2 or 3 vectors a thread, 1024 and 4096 all of them), against float64:
    softmax and log_softmax with -inf entries, a row of -inf (NaN) and a NaN; layer_norm
    with residual, weight and bias; rms_norm with weight."""
    g = rng()
    tol = 1e-5 if dt == np.float32 else 2e-3
    x = (g.standard_normal((3, d)) * 3).astype(dt)
    x[0, 5] = -np.inf
    x[1, :] = -np.inf
    x[2, 7] = np.nan
    x64 = x.astype(np.float64)
    with dispatch.use(softmax=impl, log_softmax=impl, layer_norm=impl, rms_norm=impl):
        cfg = _launch_of("softmax", _dev(x))
        assert "_vec_rows" in cfg["kernel"] and cfg["vector"].startswith(f"{16 // np.dtype(dt).itemsize} elements"), cfg
        m = x64[0].max()
        e = np.exp(x64[0] - m)
        got = dispatch.softmax(_dev(x)).copy_to_host()
        assert_close(got[0], e / e.sum(), tol)
        assert np.isnan(got[1:]).all()  # all -inf, and a NaN
        got = dispatch.log_softmax(_dev(x)).copy_to_host()
        want = (x64[0] - m) - np.log(e.sum())
        assert got[0, 5] == -np.inf
        fin = np.isfinite(want)
        assert_close(got[0][fin], want[fin], tol, cancel=True)
        x = (g.standard_normal((3, d)) + 5).astype(dt)
        r = g.standard_normal((3, d)).astype(dt)
        w = g.standard_normal(d).astype(dt)
        b = g.standard_normal(d).astype(dt)
        assert "_vec_rows" in _launch_of("layer_norm", _dev(x), _dev(w), _dev(b), residual=_dev(r))["kernel"]
        y, h = dispatch.layer_norm(_dev(x), _dev(w), _dev(b), residual=_dev(r))
        hh = (x.astype(np.float64) + r).astype(dt).astype(np.float64)  # h as stored, in x's dtype
        assert_close(h.copy_to_host(), hh, tol)
        ref = (hh - hh.mean(-1, keepdims=True)) / np.sqrt(hh.var(-1, keepdims=True) + 1e-5) * w + b
        assert_close(y.copy_to_host(), ref, tol, cancel=True)
        got = dispatch.rms_norm(_dev(x), _dev(w)).copy_to_host()
        xx = x.astype(np.float64)
        assert_close(got, xx / np.sqrt((xx ** 2).mean(-1, keepdims=True) + 1e-6) * w, tol)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_vector_elementwise_kernels(dt):
    """activation.vec_kernel: 16-byte vectors, two a thread per step, and the n % vec tail
    one element a thread; several blocks of a grid-stride loop (n = 2 * 256 * 2 vectors + a
    partial step + a tail); NaN passes, in the vectors and in the tail."""
    g = rng()
    tol = 1e-6 if dt == np.float32 else 1e-3
    vec = 16 // np.dtype(dt).itemsize
    n = (2 * 256 * 2 + 37) * vec + vec - 3
    x = (g.standard_normal(n) * 4).astype(dt)
    up = g.standard_normal(n).astype(dt)
    x[[3, n - 1]] = np.nan
    x64, up64 = x.astype(np.float64), up.astype(np.float64)
    erf = np.vectorize(math.erf)
    sig = 1 / (1 + np.exp(-x64))
    gelu = 0.5 * x64 * (1 + erf(x64 / np.sqrt(2)))
    cfg = _launch_of("silu", _dev(x))
    assert cfg["kernel"] == "activation.unary_vec" and cfg["grid"] >= 2, cfg
    cfg = _launch_of("gelu", _dev(x))  # the exact gelu stays scalar (measured faster)
    assert cfg["kernel"] == "activation.unary" and "erfc" in cfg["vector"], cfg
    assert _launch_of("swiglu", _dev(x), _dev(up))["kernel"] == "activation.gated_vec"
    with np.errstate(invalid="ignore"):
        for name, got, want in (("relu", dispatch.relu(_dev(x)), np.where(x64 < 0, 0, x64)),
                                ("silu", dispatch.silu(_dev(x)), x64 * sig),
                                ("gelu", dispatch.gelu(_dev(x)), gelu),
                                ("swiglu", dispatch.swiglu(_dev(x), _dev(up)), x64 * sig * up64)):
            got = got.copy_to_host()
            assert got.dtype == dt
            nan = np.isnan(want)
            assert (np.isnan(got) == nan).all(), name
            assert_close(got[~nan], want[~nan], tol, name, cancel=True)


@pytest.mark.parametrize("case", ["mha fp16 d128", "gqa causal fp32 d64", "three rows fp16 d64", "no key seen",
                                  "gqa 8 fp16 d128", "six rows causal fp32 d64"])
def test_decode_kernel(case):
    """attention.decode_kernel (16-byte K/V loads, a split of the KV length per block, the
    combine pass): on a nominal 64-SM part, so the KV length splits several ways; rows
    1, 4 and 3 (padded to 4) per kv head, and 8 and 6 (two row groups, the second partial);
    a NaN key; causal rows that see no key (zeros, lse -inf); lse against float64."""
    from tests.reference import attention as R

    g = rng()
    nb, hq, hkv, sq, skv, d, dt, causal = {
        "mha fp16 d128": (2, 2, 2, 1, 161, 128, np.float16, False),
        "gqa causal fp32 d64": (1, 4, 2, 2, 203, 64, np.float32, True),
        "three rows fp16 d64": (1, 3, 1, 1, 97, 64, np.float16, True),
        "no key seen": (1, 2, 1, 2, 1, 64, np.float32, True),
        "gqa 8 fp16 d128": (1, 16, 2, 1, 70, 128, np.float16, False),
        "six rows causal fp32 d64": (1, 3, 1, 2, 77, 64, np.float32, True),
    }[case]
    q = g.standard_normal((nb, hq, sq, d)).astype(dt)
    k = g.standard_normal((nb, hkv, skv, d)).astype(dt)
    v = g.standard_normal((nb, hkv, skv, d)).astype(dt)
    if case == "mha fp16 d128":
        k[1, 1, 150, 3] = np.nan  # batch 1, head 1: NaN (in the last of 6 splits)
    part = devices.DeviceProps("nominal 64-SM part", (8, 0), 64, 1024, 48 * 1024, 48 * 1024, 164 * 1024, 65536, 2048)
    with devices.assume(part), dispatch.use(attention="cuda-splitkv"):
        cfg = _launch_of("attention", _dev(q), _dev(k), _dev(v), causal=causal)
        assert cfg["kernel"] == f"attention.decode_d{d}", cfg
        groups = -(-(hq // hkv) * sq // 4)
        assert cfg["row_groups"] == groups and cfg["grid"][0] == nb * hkv * groups * cfg["splits"], cfg
        assert cfg["splits"] == min(-(-skv // 32), -(-64 * 4 // (nb * hkv * groups))), cfg
        out, lse = dispatch.attention(_dev(q), _dev(k), _dev(v), causal=causal, return_lse=True)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    want, want_lse = R.attention(q64, k64, v64, causal=causal), None
    s = np.einsum("bhqd,bhkd->bhqk", q64, np.repeat(k64, hq // hkv, 1)) / np.sqrt(d)
    if causal:
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None] + skv - sq, s, -np.inf)
    with np.errstate(invalid="ignore"):
        mx = s.max(-1, keepdims=True)
        want_lse = np.where(np.isneginf(mx[..., 0]), -np.inf, np.log(np.exp(s - mx).sum(-1)) + mx[..., 0])
    tol = 2e-3 if dt == np.float16 else 1e-5
    assert_close(out.copy_to_host(), want, tol, "decode out", cancel=True)
    assert_close(lse.copy_to_host(), want_lse, tol, "decode lse", cancel=True)
    if case == "no key seen":
        assert (out.copy_to_host()[0, :, 0] == 0).all() and np.isneginf(lse.copy_to_host()[0, :, 0]).all()


@pytest.mark.parametrize("dt,d", [(np.float16, 2501), (np.float32, 4099), (np.float32, 16392)])
def test_streamed_vector_softmax_rows(dt, d):
    """softmax.stream_vec_rows: rows of an odd length (each row starts at another offset from
    a 16-byte boundary: a head of 0..vec-1 elements, vectors, a tail) and rows too long to
    hold in registers, one block a row in two passes; -inf entries, a row of -inf and a NaN."""
    g = rng()
    tol = 1e-5 if dt == np.float32 else 2e-3
    rows = 5 if d < 10000 else 2
    x = (g.standard_normal((rows, d)) * 3).astype(dt)
    x[0, [0, d - 1]] = -np.inf
    x[1, :] = -np.inf
    x[rows - 1, d // 2] = np.nan
    x64 = x.astype(np.float64)
    with dispatch.use(softmax="cuda-block-row", log_softmax="cuda-block-row"):
        cfg = _launch_of("softmax", _dev(x))
        assert cfg["kernel"] == "softmax.block_stream_vec_rows" and "streamed" in cfg["vector"], cfg
        got = dispatch.softmax(_dev(x)).copy_to_host()
        lgot = dispatch.log_softmax(_dev(x)).copy_to_host()
    assert np.isnan(got[1]).all() and np.isnan(got[rows - 1]).all() and np.isnan(lgot[1]).all()
    for r in [0] + list(range(2, rows - 1)):
        m = x64[r].max()
        e = np.exp(x64[r] - m)
        assert_close(got[r], e / e.sum(), tol, f"softmax row {r}")
        want = (x64[r] - m) - np.log(e.sum())
        fin = np.isfinite(want)
        assert (lgot[r][~fin] == -np.inf).all()
        assert_close(lgot[r][fin], want[fin], tol, f"log_softmax row {r}", cancel=True)


def test_vector_rows_refused_with_reasons():
    """Rows that cannot be read as aligned 16-byte vectors stream, and the launch says why:
    a row length that is not a multiple of the vector, float64, and (on a GPU, where device
    pointers are real) an input that starts off a 16-byte boundary."""
    x = np.ones((2, 70), np.float32)
    cfg = _launch_of("softmax", _dev(x))
    assert cfg["kernel"] == "softmax.warp_rows" and "not a multiple of 4" in cfg["vector"]
    cfg = _launch_of("rms_norm", _dev(np.ones((2, 64))))
    assert cfg["kernel"] == "rms_norm.warp_rows" and "float64" in cfg["vector"]
    if SIM:
        return
    flat = cuda.to_device(np.arange(2 * 64 + 1, dtype=np.float32))
    x = flat[1:].reshape(2, 64)  # contiguous, 4 bytes past the allocation's start
    cfg = _launch_of("softmax", x)
    assert cfg["kernel"] == "softmax.warp_rows" and "16-byte boundary" in cfg["vector"], cfg
    e = np.exp(np.arange(1, 129, dtype=np.float64).reshape(2, 64))
    assert_close(dispatch.softmax(x).copy_to_host(), e / e.sum(-1, keepdims=True), 1e-5)


def test_launches_stay_inside_the_grid_limits():
    """What grows with the data (rows, batches, batch x heads) goes on grid x (2^31 - 1
    blocks): y and z stop at 65,535, which attention with B = 4096 and 16 kv heads, a
    batch of 70,000 products and a 9M-row linear would pass.  Launch rules only (pure
    Python, on zero-stride inputs: nothing is allocated or run)."""
    from dispatch import registry
    from kernels_common.cuda_tiles import GRID_X_MAX, GRID_YZ_MAX

    def z(*shape, dt=np.float32):
        return np.broadcast_to(np.zeros((), dt), shape)

    calls = [("attention", (z(4096, 16, 1, 64), z(4096, 16, 300, 64), z(4096, 16, 300, 64))),
             ("attention", (z(4096, 16, 128, 64), z(4096, 16, 128, 64), z(4096, 16, 128, 64))),
             ("matmul", (z(70000, 8, 8), z(70000, 8, 8))),
             ("linear", (z(9_000_000, 64), z(64, 64)))]
    seen = 0
    with devices.assume(devices.CHIPS["sm_90"]):
        for op, args in calls:
            call = registry.OPS[op].describe(*args)
            for impl in registry.OPS[op].implementations.values():
                if impl.device != "cuda":
                    continue
                grid = impl.launch_config(call)["grid"]
                grid = grid if isinstance(grid, tuple) else (grid,)
                assert grid[0] <= GRID_X_MAX and all(g <= GRID_YZ_MAX for g in grid[1:]), (op, impl.name, grid)
                seen += 1
    assert seen >= 5


def test_float64_attention_with_a_wide_head_is_refused_not_run():
    """float64 tiles of 128 columns would need 86 KB of static shared memory: D > 64 in
    float64 is refused with the reason (explain) and a clear error, never launched; D <= 64
    runs."""
    q = _dev(np.zeros((1, 2, 3, 96)))
    e = dispatch.explain("attention", q, q, q)
    assert e.chosen is None and "shared memory" in str(e), str(e)
    with pytest.raises((TypeError, ValueError, RuntimeError), match="shared memory"):
        dispatch.attention(q, q, q)
    g = rng()
    q, k, v = (g.standard_normal((1, 2, 3, 64)) for _ in range(3))
    got = dispatch.attention(_dev(q), _dev(k), _dev(v)).copy_to_host()
    from tests.reference import attention as ref

    assert_close(got, ref.attention(q, k, v), 1e-12, cancel=True)


@pytest.mark.parametrize("env", [None, "1"], ids=["unset", "user-set-1"])
def test_low_occupancy_warning_is_off_unless_the_user_sets_it(env):
    """kernels_cuda switches off numba-cuda's per-launch low-occupancy warning (our small
    grids are chosen) but leaves a user's NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS alone."""
    code = """
import kernels_cuda._jit
from numba.cuda.core import config
print("FLAG", config.CUDA_LOW_OCCUPANCY_WARNINGS)
"""
    extra = {"NUMBA_ENABLE_CUDASIM": "1"}
    if env is not None:
        extra["NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS"] = env
    e = dict(os.environ, **extra)
    if env is None:
        e.pop("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert f"FLAG {0 if env is None else int(env)}" in r.stdout, r.stdout + r.stderr
