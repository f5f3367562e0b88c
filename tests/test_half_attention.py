"""attention of bfloat16 / float16 q / k / v (PyTorch's 16-bit scaled_dot_product_attention;
CPU), each test once per format (the `half` fixture): widened to float32 copies (an additive
mask too), the float32 kernels, the result rounded once to q's dtype.  Every CPU
implementation is forced and compared with the float64 attention of the same values: MHA
and GQA, causal, bool and additive masks, decode (one query), return_lse, a strided
(fused-QKV) layout, NaN-poisoned out=, threads, bad input."""
import numpy as np
import pytest

import dispatch
from tests.reference import attention as ref
from tests.support import (ON_CUDA, SMALL_SHAPES, as_half, assert_half_close, concurrent_mismatches, impl_params,
                           poisoned, randn, rng, run)

pytestmark = pytest.mark.skipif(ON_CUDA, reason="bfloat16 / float16 q / k / v are CPU inputs here")

F32_SLACK = 1e-5        # the float32 kernels, relative to max |v| (an output is a weighted mean of v rows)
# (cpu-flash-amx, bfloat16 without a mask or lse on AMX hosts: tests/test_attention_amx.py)
IMPLS = [p for p in impl_params("attention", "cpu") if p.values[0] != "cpu-flash-amx"]

# (B, Hq, Sq, Hkv, Skv, D)
SHAPES = [(1, 2, 3, 1, 5, 8), (1, 2, 1, 2, 9, 8)] if SMALL_SHAPES else \
    [(1, 2, 3, 1, 5, 8), (2, 4, 17, 2, 40, 16), (1, 4, 1, 2, 300, 64), (1, 2, 70, 2, 70, 32)]


def _qkv(g, shape, half):
    B, Hq, Sq, Hkv, Skv, D = shape
    return (as_half(half, randn(g, (B, Hq, Sq, D), np.float32)), as_half(half, randn(g, (B, Hkv, Skv, D), np.float32)),
            as_half(half, randn(g, (B, Hkv, Skv, D), np.float32)))


def check(got, q, k, v, what, **kw):
    """assert_half_close against the float64 attention, the float32 error relative to
    max |v| (an output is a weighted mean of v's rows)."""
    vmax = np.abs(np.asarray(v, np.float64)).max() if v.size else 0.0
    assert_half_close(got, ref.attention(q, k, v, **kw), F32_SLACK * vmax, what)


@pytest.mark.parametrize("mask_kind", [None, "bool", "additive"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_reference(impl, shape, causal, mask_kind, half):
    g = rng()
    q, k, v = _qkv(g, shape, half)
    B, Hq, Sq, Hkv, Skv, D = shape
    mask = None
    if mask_kind == "bool":
        mask = g.random((B, 1, Sq, Skv)) > 0.3
        mask[..., -1] = True
    elif mask_kind == "additive":
        mask = as_half(half, np.where(g.random((B, 1, 1, Skv)) > 0.3, 0.0, -3.0))
    out = poisoned(q.shape, half)
    got = run(impl, dispatch.attention, q, k, v, causal=causal, mask=mask, out=out)
    assert got is out
    check(got, q, k, v, f"{impl} {shape} causal={causal} mask={mask_kind}", causal=causal, mask=mask)


@pytest.mark.parametrize("impl", IMPLS)
def test_lse_layout_and_out(impl, half):
    """return_lse (float32 for 16-bit inputs), q / k / v as views of a fused QKV buffer, a
    non-contiguous out= (the (B, S, H, D) buffer's transposed view)."""
    g = rng()
    B, H, S, D = (1, 2, 5, 8) if SMALL_SHAPES else (2, 3, 33, 32)
    qkv = as_half(half, randn(g, (B, S, 3 * H, D), np.float32))
    q, k, v = (qkv[:, :, i * H:(i + 1) * H].transpose(0, 2, 1, 3) for i in range(3))
    out = np.full((B, S, H, D), np.nan, half).transpose(0, 2, 1, 3)
    got, lse = run(impl, dispatch.attention, q, k, v, causal=True, out=out, return_lse=True)
    assert got is out
    check(got, q, k, v, f"{impl} fused QKV views", causal=True)
    assert lse.dtype == np.float32 and lse.shape == (B, H, S)
    q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
    s = q64 @ k64.transpose(0, 1, 3, 2) / np.sqrt(D)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    m = s.max(-1)
    want = m + np.log(np.exp(s - m[..., None]).sum(-1))
    np.testing.assert_allclose(lse, want, rtol=1e-5, atol=1e-5)


def test_bad_input_changes_nothing(half):
    g = rng()
    q, k, v = _qkv(g, (1, 2, 3, 1, 5, 8), half)
    out = np.full(q.shape, np.nan, half)
    with pytest.raises(TypeError, match="k must have the same dtype as q"):
        dispatch.attention(q, k.astype(np.float32), v, out=out)
    with pytest.raises(TypeError, match=f"mask must have dtype bool or {half}"):
        dispatch.attention(q, k, v, mask=np.zeros((1, 1, 3, 5), np.float32), out=out)
    with pytest.raises(TypeError, match=r"q must have dtype float32 or float64.*bfloat16 / float16"):
        dispatch.attention(q.astype(np.int16), k, v, out=out)
    with pytest.raises((TypeError, ValueError), match="out"):
        dispatch.attention(q, k, v, out=np.full(q.shape, np.nan, np.float32))
    assert np.isnan(out.astype(np.float32)).all(), "out= was written"


def test_threads_bitwise(half):
    g = rng()
    shapes = SHAPES if not SMALL_SHAPES else SHAPES * 2
    cases = [_qkv(g, s, half) for s in shapes]

    def call(case):
        return dispatch.attention(*case, causal=True).view(np.uint16)

    assert concurrent_mismatches(call, cases) == []
