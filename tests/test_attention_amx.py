"""bfloat16 attention on AMX tiles (cpu-flash-amx, hosts with AMX-BF16): forced and compared
with the float64 attention of the same bfloat16 values.  Its error beyond the output's
rounding: the probabilities rounded to bfloat16 for P V (as PyTorch's CPU flash kernel),
at most 2^-9 of each p, so 2^-9 of max |v| on an output (a weighted mean of v's rows), and
the float32 sums.  MHA and GQA, causal with Sq below, equal to and above Skv (rows that see
no key: zeros), head dims that are not multiples of a 32-value chunk (odd too), lengths
across the 32-query and 64-key blocks, a fused-QKV layout and a transposed out= view,
NaN propagation, threads, the rule and its refusals (a mask, return_lse, float16, a host
without AMX)."""
import ml_dtypes
import numpy as np
import pytest

import dispatch
from kernels_cpu import attention_amx as KA
from kernels_cpu import target
from tests.reference import attention as ref
from tests.support import ON_CUDA, SMALL_SHAPES, assert_half_close, concurrent_mismatches, poisoned, randn, rng, run

pytestmark = [pytest.mark.skipif(ON_CUDA, reason="bfloat16 q / k / v are CPU inputs here"),
              pytest.mark.skipif(KA.refusal() is not None, reason=f"no AMX: {KA.refusal()}")]

BF = ml_dtypes.bfloat16
IMPL = "cpu-flash-amx"
P_ROUNDING = 2.0 ** -9      # the probabilities rounded to bfloat16, relative
F32_SLACK = 1e-5

# (B, Hq, Sq, Hkv, Skv, D)
SHAPES = [(1, 2, 5, 1, 7, 32), (1, 2, 40, 2, 40, 64)] if SMALL_SHAPES else \
    [(1, 2, 5, 1, 7, 32), (2, 4, 70, 2, 70, 64), (1, 4, 33, 1, 130, 128), (1, 2, 100, 2, 40, 80),
     (1, 1, 64, 1, 64, 33), (1, 8, 129, 2, 129, 96)]


def _qkv(g, shape):
    B, Hq, Sq, Hkv, Skv, D = shape
    return (randn(g, (B, Hq, Sq, D), np.float32).astype(BF), randn(g, (B, Hkv, Skv, D), np.float32).astype(BF),
            randn(g, (B, Hkv, Skv, D), np.float32).astype(BF))


def check(got, q, k, v, what, **kw):
    vmax = np.abs(np.asarray(v, np.float64)).max() if v.size else 0.0
    assert_half_close(got, ref.attention(q, k, v, **kw), (P_ROUNDING + F32_SLACK) * vmax, what)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(shape, causal):
    g = rng()
    q, k, v = _qkv(g, shape)
    out = poisoned(q.shape, BF)
    got = run(IMPL, dispatch.attention, q, k, v, causal=causal, out=out)
    assert got is out
    check(got, q, k, v, f"{shape} causal={causal}", causal=causal)
    scale = 0.3
    check(run(IMPL, dispatch.attention, q, k, v, causal=causal, scale=scale), q, k, v, f"{shape} scale {scale}",
          causal=causal, scale=scale)


def test_views_and_out():
    """q / k / v sliced out of a fused QKV buffer (rows 3 H apart) and a transposed (B, S, H,
    D) out= buffer: read and written in place."""
    g = rng()
    B, S, H, D = 2, 45, 3, 64
    qkv = randn(g, (B, S, 3, H, D), np.float32).astype(BF)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    out = np.full((B, S, H, D), np.nan, BF).transpose(0, 2, 1, 3)
    got = run(IMPL, dispatch.attention, q, k, v, causal=True, out=out)
    assert got is out
    check(got, np.array(q), np.array(k), np.array(v), "fused QKV views", causal=True)


def test_nan_propagates():
    """NaN in a query row: that row NaN; NaN in a key: every row that sees it NaN; the
    other rows finite."""
    g = rng()
    q, k, v = _qkv(g, (1, 1, 40, 1, 40, 32))
    qn = np.asarray(q, np.float32)
    qn[0, 0, 3, 5] = np.nan
    kn = np.asarray(k, np.float32)
    kn[0, 0, 20, 0] = np.nan
    q, k = qn.astype(BF), kn.astype(BF)
    got = np.asarray(run(IMPL, dispatch.attention, q, k, v, causal=True), np.float32)
    nan_rows = np.isnan(got[0, 0]).any(-1)
    want = np.zeros(40, bool)
    want[3] = True
    want[20:] = True          # causal: rows >= 20 see key 20
    assert (nan_rows == want).all(), np.nonzero(nan_rows)
    check(got[:, :, :20].astype(BF), q[:, :, :20], k[:, :, :20], v[:, :, :20], "rows before the NaN key", causal=True)


def test_threads_bitwise():
    g = rng()
    cases = [_qkv(g, s) for s in [(1, 2, 40, 1, 40, 64), (1, 4, 70, 2, 90, 32), (2, 2, 33, 2, 33, 128)]]

    def call(case):
        with dispatch.use(attention=IMPL):
            return dispatch.attention(*case, causal=True).view(np.uint16).ravel()

    assert concurrent_mismatches(call, cases) == []


def test_rule_and_refusals(monkeypatch):
    q = np.ones((1, 2, 64, 32), BF)
    e = str(dispatch.explain("attention", q, q, q, causal=True))
    assert f"chosen: {IMPL}" in e and "AMX" in e, e
    e = str(dispatch.explain("attention", q, q, q, mask=np.ones((64, 64), bool)))
    assert f"{IMPL}: refused: a mask" in e and f"chosen: {IMPL}" not in e, e
    e = str(dispatch.explain("attention", q, q, q, return_lse=True))
    assert f"{IMPL}: refused: return_lse" in e, e
    h = np.ones((1, 2, 64, 32), np.float16)
    assert f"{IMPL}: refused: dtype float16" in str(dispatch.explain("attention", h, h, h))
    decode = str(dispatch.explain("attention", q[:, :, :1], q, q))
    assert "chosen: cpu-splitkv" in decode, decode
    from dispatch import select
    feats = target.features() - {"amx-bf16"}
    monkeypatch.setattr(target, "features", lambda: feats)
    select.clear_cache()
    try:
        e = str(dispatch.explain("attention", q, q, q, causal=True))
    finally:
        monkeypatch.undo()
        select.clear_cache()
    assert f"{IMPL}: refused: host" in e and "amx-bf16" in e and f"chosen: {IMPL}" not in e, e
