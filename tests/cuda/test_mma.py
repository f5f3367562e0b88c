"""kernels_cuda/mma.py: the m16n8k16 tensor-core product against numpy, through the PTX
ISA's fragment layout (the module docstring).  Under the simulator this runs the Python
twin, on a GPU the HMMA instruction: the same test holds both to one layout."""
import numpy as np
import pytest
from numba import cuda, uint32  # cuda a module global: the simulator swaps it for its own inside kernels

from tests.support import ON_CUDA, rng

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="CUDA target only")


def _kernel():
    from kernels_cuda._jit import kernel
    from kernels_cuda.mma import mma_16816

    @kernel
    def one_mma(a, b, c, d):
        """a (16, 16), b (16, 8): uint16 views of float16 matrices."""
        lane = cuda.threadIdx.x
        g = lane >> 2
        t = lane & 3
        k = 2 * t
        a0 = uint32(a[g, k]) | (uint32(a[g, k + 1]) << 16)
        a1 = uint32(a[g + 8, k]) | (uint32(a[g + 8, k + 1]) << 16)
        a2 = uint32(a[g, k + 8]) | (uint32(a[g, k + 9]) << 16)
        a3 = uint32(a[g + 8, k + 8]) | (uint32(a[g + 8, k + 9]) << 16)
        b0 = uint32(b[k, g]) | (uint32(b[k + 1, g]) << 16)
        b1 = uint32(b[k + 8, g]) | (uint32(b[k + 9, g]) << 16)
        d0, d1, d2, d3 = mma_16816(a0, a1, a2, a3, b0, b1, c[g, k], c[g, k + 1], c[g + 8, k], c[g + 8, k + 1])
        d[g, k] = d0
        d[g, k + 1] = d1
        d[g + 8, k] = d2
        d[g + 8, k + 1] = d3

    return one_mma


def test_mma_16816_is_a_times_b_plus_c_in_the_ptx_layout():
    g = rng()
    a = g.standard_normal((16, 16)).astype(np.float16)
    b = g.standard_normal((16, 8)).astype(np.float16)
    c = g.standard_normal((16, 8)).astype(np.float32)
    d = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    _kernel()[1, 32](cuda.to_device(a.view(np.uint16)), cuda.to_device(b.view(np.uint16)), cuda.to_device(c), d)
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    got = d.copy_to_host()
    # float16 products are exact in float32; only the float32 accumulation rounds
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pack_f16x2_and_ex2_approx_match_numpy():
    """pack_f16x2 (cvt.rn.f16x2.f32: low half = first value, round to nearest even) and
    ex2_approx (ex2.approx.f32) against numpy, special values included: what the
    tensor-core attention builds P's mma operands and its exponentials with."""
    from kernels_cuda._jit import kernel
    from kernels_cuda.mma import ex2_approx, pack_f16x2

    @kernel
    def both(x, y, packed, p2):
        i = cuda.grid(1)
        if i < x.size:
            packed[i] = pack_f16x2(x[i], y[i])
            p2[i] = ex2_approx(x[i])

    g = rng()
    x = np.concatenate([g.standard_normal(27) * 8, [0.0, -0.0, 1e-8, 70000.0, -np.inf, np.inf, np.nan, -126.5, 20.25]])
    y = np.concatenate([g.standard_normal(27), [1.0, 2.0, -3.0, 0.5, 1.0, -np.inf, 0.0, 65504.0, np.nan]])
    x, y = x.astype(np.float32), y.astype(np.float32)
    packed, p2 = cuda.to_device(np.zeros(x.size, np.uint32)), cuda.to_device(np.zeros(x.size, np.float32))
    both[1, 64](cuda.to_device(x), cuda.to_device(y), packed, p2)
    got = packed.copy_to_host()
    with np.errstate(over="ignore"):
        lo, hi = x.astype(np.float16), y.astype(np.float16)
    got_lo = (got & 0xFFFF).astype(np.uint16).view(np.float16)
    got_hi = (got >> 16).astype(np.uint16).view(np.float16)
    for a, b in ((got_lo, lo), (got_hi, hi)):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        assert same.all(), (a[~same], b[~same])
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64))
    e = p2.copy_to_host().astype(np.float64)
    assert (np.isnan(e) == np.isnan(want)).all() and (e[np.isinf(want)] == want[np.isinf(want)]).all()
    fin = np.isfinite(want) & (want > 1e-30)
    assert np.all(np.abs(e[fin] - want[fin]) <= 4e-7 * want[fin]), np.max(np.abs(e[fin] - want[fin]) / want[fin])
    assert e[x == -np.inf][0] == 0.0


def test_ex2_approx_ftz_and_max_skip_nan_match_numpy():
    """ex2_approx_ftz (ex2.approx.ftz.f32: results below 2^-126 are +0) and max_skip_nan
    (max.f32: a NaN operand ignored), what the pipelined attention's softmax uses."""
    from kernels_cuda._jit import kernel
    from kernels_cuda.mma import ex2_approx_ftz, max_skip_nan

    @kernel
    def both(x, y, p2, mx):
        i = cuda.grid(1)
        if i < x.size:
            p2[i] = ex2_approx_ftz(x[i])
            mx[i] = max_skip_nan(x[i], y[i])

    g = rng()
    x = np.concatenate([g.standard_normal(20) * 8, [0.0, -0.0, -126.5, -130.0, -149.0, -np.inf, np.inf, np.nan, 1.0,
                                                    np.nan, -np.inf, 3.0]]).astype(np.float32)
    y = np.concatenate([g.standard_normal(20) * 8, [1.0, 0.0, 2.0, -np.inf, np.nan, -np.inf, 1.0, 2.0, np.nan,
                                                    np.nan, 5.0, np.inf]]).astype(np.float32)
    p2, mx = cuda.to_device(np.zeros(x.size, np.float32)), cuda.to_device(np.zeros(x.size, np.float32))
    both[1, 64](cuda.to_device(x), cuda.to_device(y), p2, mx)
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64))
    e = p2.copy_to_host().astype(np.float64)
    assert (np.isnan(e) == np.isnan(want)).all() and (e[np.isinf(want)] == want[np.isinf(want)]).all()
    assert (e[want < 2.0 ** -126] == 0).all()  # flushed, -inf included
    fin = np.isfinite(want) & (want >= 2.0 ** -126)
    assert np.all(np.abs(e[fin] - want[fin]) <= 4e-7 * want[fin]), np.max(np.abs(e[fin] - want[fin]) / want[fin])
    got, want_mx = mx.copy_to_host(), np.fmax(x, y)
    assert ((got == want_mx) | (np.isnan(got) & np.isnan(want_mx))).all(), (x, y, got)


def test_cp_async16_and_ldmatrix_x4_in_the_ptx_layout():
    """cp_async16 (16 bytes global -> shared, nbytes = 0 zero-fills; commit + wait_group 0,
    then a barrier) and ldmatrix_x4 / ldmatrix_x4_trans against the PTX ISA layout (the
    module docstring of kernels_cuda/mma.py): lane 8m + r gives the address of row r of
    matrix m, here rows scattered over a 64-row table; plain: register m of lane l is the
    word at row l >> 2, column pair l & 3 of matrix m; .trans: rows 2(l & 3), 2(l & 3) + 1 of
    column l >> 2.  The twins under the simulator, LDGSTS and LDSM on a GPU."""
    from kernels_cuda._jit import kernel
    from kernels_cuda.mma import cp_async16, cp_async_commit, cp_async_wait, ldmatrix_x4, ldmatrix_x4_trans

    ROWS = 64  # rows of 16 bytes (4 words) in the shared table
    WORDS = 4 * ROWS
    PER_LANE = WORDS // 32

    @kernel
    def stage_and_load(src, nbytes, rowpos, staged, plain, trans):
        lane = cuda.threadIdx.x
        s = cuda.shared.array(WORDS, uint32, alignment=16)
        for h in range(2):  # two groups of copies, one row per lane each
            row = lane + 32 * h
            cp_async16(s, 4 * row, src, 4 * row, nbytes[row])
            cp_async_commit()
        cp_async_wait(1)  # the first group is complete (the second may be too)
        cp_async_wait(0)
        cuda.syncthreads()
        for e in range(PER_LANE):
            staged[lane * PER_LANE + e] = s[lane * PER_LANE + e]
        r0, r1, r2, r3 = ldmatrix_x4(s, 4 * rowpos[lane])
        plain[lane, 0] = r0
        plain[lane, 1] = r1
        plain[lane, 2] = r2
        plain[lane, 3] = r3
        t0, t1, t2, t3 = ldmatrix_x4_trans(s, 4 * rowpos[lane])
        trans[lane, 0] = t0
        trans[lane, 1] = t1
        trans[lane, 2] = t2
        trans[lane, 3] = t3

    g = rng()
    src = g.integers(0, 2**32, size=4 * ROWS, dtype=np.uint64).astype(np.uint32)
    nbytes = np.where(g.random(ROWS) < 0.25, 0, 16).astype(np.int64)
    rowpos = g.permutation(ROWS)[:32].astype(np.int64)
    staged = cuda.to_device(np.full(4 * ROWS, 0xDEADBEEF, np.uint32))
    plain = cuda.to_device(np.zeros((32, 4), np.uint32))
    trans = cuda.to_device(np.zeros((32, 4), np.uint32))
    stage_and_load[1, 32](cuda.to_device(src), cuda.to_device(nbytes), cuda.to_device(rowpos), staged, plain, trans)

    table = src.reshape(ROWS, 4).copy()
    table[nbytes == 0] = 0
    np.testing.assert_array_equal(staged.copy_to_host().reshape(ROWS, 4), table)
    halves = table.view(np.uint16).reshape(ROWS, 8)             # row of 8 halves, low half first
    mats = halves[rowpos].reshape(4, 8, 8).astype(np.uint32)    # [matrix][row][column]
    lanes = np.arange(32)
    gq, tq = lanes >> 2, lanes & 3
    want_plain = np.stack([mats[m, gq, 2 * tq] | (mats[m, gq, 2 * tq + 1] << 16) for m in range(4)], axis=1)
    want_trans = np.stack([mats[m, 2 * tq, gq] | (mats[m, 2 * tq + 1, gq] << 16) for m in range(4)], axis=1)
    np.testing.assert_array_equal(plain.copy_to_host(), want_plain.astype(np.uint32))
    np.testing.assert_array_equal(trans.copy_to_host(), want_trans.astype(np.uint32))
