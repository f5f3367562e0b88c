"""kernels_cpu/half.py's conversions, which every 16-bit CPU path uses: widening of every
bfloat16 and float16 bit pattern is exact, and rounding float32 to either format matches
ml_dtypes' / numpy's casts (nearest even) on ties and their neighbours, the largest finite
values and overflow to infinity, subnormals and the underflow to zero, infinities, and NaN
of both signs (kept NaN, sign kept), besides random bit patterns (a seed per run)."""
import numpy as np
import pytest

from kernels_cpu import half as KH
from tests.support import ON_CUDA, rng

pytestmark = pytest.mark.skipif(ON_CUDA, reason="CPU kernels")

# float32 bit patterns at each format's edges
EDGES = {
    # ties at 1 + 2^-8 (to even: down, up), their neighbours, max finite, overflow, subnormals
    "bfloat16": [0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                 0x00008000, 0x00018000, 0x807FFFFF, 0x00000001],
    # ties at 1 + 2^-11, 65504 (max), 65519.996 (still 65504), 65520 (to inf), the smallest
    # subnormal 2^-24 and the tie below it 2^-25 (to 0) and above, the normal / subnormal edge
    "float16": [0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001, 0x477FE000, 0x477FEFFF, 0x477FF000,
                0x33800000, 0x33000000, 0x33000001, 0x33C00000, 0x387FC000, 0x387FE000, 0x38800000,
                0xB3000001, 0xC77FF000],
}
COMMON = [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x00000000, 0x80000000]


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16), np.uint16
    return np.dtype(np.float16), np.int16


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_widening_is_exact_for_every_pattern(name):
    dt, bits = _dtype(name)
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(bits)
    got = np.full(patterns.size, np.nan, np.float32)
    KH.widen_into(patterns, got)
    want = patterns.view(dt).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))   # -0.0 too


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_rounding_to_nearest_even(name):
    dt, bits = _dtype(name)
    u = np.array(EDGES[name] + COMMON, np.uint32)
    rnd = rng().integers(0, 2**32, 1 << 14, dtype=np.uint64).astype(np.uint32)
    f = np.concatenate([u, rnd]).view(np.float32)
    got = np.empty(f.size, bits)
    KH.round_into(f, got)
    with np.errstate(invalid="ignore", over="ignore"):
        want = f.astype(dt).view(bits)
    nan = np.isnan(f)
    assert np.array_equal(got[~nan], want[~nan]), np.flatnonzero(got[~nan] != want[~nan])[:5]
    assert np.isnan(got[nan].view(dt).astype(np.float32)).all()
    assert np.array_equal(got[nan].view(np.uint16) >> 15, f[nan].view(np.uint32) >> 31), "NaN sign"
