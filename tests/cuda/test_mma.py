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
