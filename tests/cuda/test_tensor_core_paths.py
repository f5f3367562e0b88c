"""The tensor-core paths (kernels_cuda/mma.py's mma.sync): the float16 GEMM's wide tile and
float16 attention.  Under the simulator the mma is its Python twin (one file of its own so
that xdist runs these slower simulator tests beside the other CUDA tests); on a GPU, HMMA.
Run with NK_TEST_DEVICE=cuda (under NUMBA_ENABLE_CUDASIM=1 without a GPU)."""
import math

import numpy as np
import pytest

import dispatch
from dispatch import devices
from kernels_common.cuda_tiles import TC_ASYNC_DEFAULT, TC_ASYNC_TILES
from tests.support import ON_CUDA, assert_close, rng

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="CUDA target only")
SIM = devices.simulator_enabled()
F16_TOL = 2e-3

if ON_CUDA:
    from numba import cuda


def _dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_float16_wide_tensor_core_tile(layout, monkeypatch):
    """The 128 x 128 x 32 tensor-core tile (chosen where its grid fills the SMs: here a
    nominal 2-SM part that takes 256-thread blocks): a partial row and column block, a
    partial last K tile, both B layouts, bias + activation, the next K tile loaded while
    the current one is multiplied; an odd K and a misaligned view take the 64 x 64 tile."""
    from kernels_common import cuda_tiles
    from kernels_common.cuda_tiles import TC_KERNEL, TC_WIDE_KERNEL

    monkeypatch.setattr(cuda_tiles, "TC_ASYNC_ENABLED", False)  # the cp.async tile has its own test
    g = rng()
    part = devices.DeviceProps("nominal 2-SM part", (8, 0), 2, 1024, 48 * 1024, 48 * 1024, 164 * 1024, 65536, 2048)

    def h(*shape):
        return g.standard_normal(shape).astype(np.float16)

    x, bias = h(70, 40), h(24)
    w = h(24, 40) if layout == "nk" else h(40, 24)
    w64 = w.astype(np.float64).T if layout == "nk" else w.astype(np.float64)
    y = x.astype(np.float64) @ w64 + bias
    fn = dispatch.linear if layout == "nk" else dispatch.matmul
    kw = {"activation": "relu"}

    def call(xd, wd):
        return fn(xd, wd, _dev(bias), **kw) if layout == "nk" else fn(xd, wd, bias=_dev(bias), **kw)

    with devices.assume(part), dispatch.use(**{fn.__name__: "cuda-gemm"}):
        e = str(dispatch.explain(fn.__name__, _dev(x), _dev(w), **({"bias": _dev(bias)} if layout == "kn" else {})))
        assert f"'kernel': '{TC_WIDE_KERNEL}" in e, e
        got = call(_dev(x), _dev(w)).copy_to_host()
        assert got.dtype == np.float16
        assert_close(got, np.maximum(y, 0), F16_TOL, f"wide tile {layout}", cancel=True)
        # odd K: pairs of halves would straddle rows, so the 64 x 64 tile
        xo = h(70, 39)
        wo = h(24, 39) if layout == "nk" else h(39, 24)
        assert f"'kernel': '{TC_KERNEL}'" in str(dispatch.explain(fn.__name__, _dev(xo), _dev(wo)))
        # a view starting one half into its buffer is not 4-byte aligned
        if not SIM:
            big = _dev(np.concatenate([h(1), x.ravel()]))
            xv = big[1:].reshape(70, 40)
            assert f"'kernel': '{TC_KERNEL}'" in str(dispatch.explain(fn.__name__, xv, _dev(w)))
            assert_close(call(xv, _dev(w)).copy_to_host(), np.maximum(y, 0), F16_TOL, "misaligned", cancel=True)



@pytest.mark.parametrize("case", ["linear", "linear, N % 8 != 0", "matmul (K, N)", "batched matmul", "matmul, no bias"])
def test_float16_cp_async_tensor_core_tile(case, monkeypatch):
    """The cp.async + ldmatrix tile (gemm_tc_async_kernel, switched on here: TC_ASYNC_ENABLED
    is False until a GPU has timed it): partial row, column and last K tiles (M, N, K not
    multiples of 128 / 32, K % 8 == 0), K tiles past the 3 stages (the buffers reused),
    both B layouts (ldmatrix and ldmatrix.trans), broadcast batches, bias + activation;
    K % 8 != 0, or a (K, N) b's N % 8 != 0, falls back to the wide tile and explain says why."""
    from kernels_common import cuda_tiles
    from kernels_common.cuda_tiles import TC_ASYNC_KERNEL, TC_WIDE_KERNEL

    monkeypatch.setattr(cuda_tiles, "TC_ASYNC_ENABLED", True)
    g = rng()
    part = devices.DeviceProps("nominal 2-SM part", (8, 0), 2, 1024, 48 * 1024, 48 * 1024, 164 * 1024, 65536, 2048)

    def h(*shape):
        return g.standard_normal(shape).astype(np.float16)

    nk = case.startswith("linear")
    m, n, k = {"linear": (70, 24, 104), "linear, N % 8 != 0": (33, 20, 40), "matmul (K, N)": (70, 24, 104),
               "batched matmul": (20, 16, 48), "matmul, no bias": (9, 136, 40)}[case]
    if case == "batched matmul":  # a's batch of 2 against b's one, broadcast
        x, w = h(2, 1, m, k), h(1, k, n)
    else:
        x, w = h(m, k), (h(n, k) if nk else h(k, n))
    bias = None if case == "matmul, no bias" else h(n)
    act = "gelu_tanh" if case == "batched matmul" else "relu"
    w64 = w.astype(np.float64).T if nk else w.astype(np.float64)
    y = x.astype(np.float64) @ w64 + (0 if bias is None else bias.astype(np.float64))
    want = np.maximum(y, 0) if act == "relu" else 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    fn = dispatch.linear if nk else dispatch.matmul
    kw = {"activation": act, **({} if bias is None else {"bias": _dev(bias)})}
    name = fn.__name__
    with devices.assume(part), dispatch.use(**{name: "cuda-gemm"}):
        e = str(dispatch.explain(name, _dev(x), _dev(w), **kw))
        assert f"'kernel': '{TC_ASYNC_KERNEL}{'.nk' if nk else ''}'" in e and "cp.async pipeline" in e, e
        got = fn(_dev(x), _dev(w), **kw).copy_to_host()
        assert got.dtype == np.float16 and got.shape == want.shape
        assert_close(got, want, F16_TOL, case, cancel=True)
        if case in ("linear", "matmul (K, N)"):  # K % 8 != 0 (even): the wide tile, and why
            xo, wo = h(m, 42), (h(n, 42) if nk else h(42, n))
            e = str(dispatch.explain(name, _dev(xo), _dev(wo)))
            assert f"'kernel': '{TC_WIDE_KERNEL}" in e and "K = 42 is not a multiple of 8" in e, e
            yo = xo.astype(np.float64) @ (wo.astype(np.float64).T if nk else wo.astype(np.float64))
            assert_close(fn(_dev(xo), _dev(wo)).copy_to_host(), yo, F16_TOL, "K % 8 != 0", cancel=True)
        if case == "matmul (K, N)":  # a (K, N) b's N % 8 != 0: the wide tile
            e = str(dispatch.explain(name, _dev(x), _dev(h(k, 26))))
            assert f"'kernel': '{TC_WIDE_KERNEL}'" in e and "N = 26 of a (K, N) b is not a multiple of 8" in e, e
        if not SIM:  # a view starting 4 bytes into its buffer: aligned for the wide tile only
            big = _dev(np.concatenate([h(2), x.ravel()]))
            xv = big[2:].reshape(x.shape)
            e = str(dispatch.explain(name, xv, _dev(w), **kw))
            assert f"'kernel': '{TC_WIDE_KERNEL}" in e and "16-byte boundary" in e, e
            assert_close(fn(xv, _dev(w), **kw).copy_to_host(), want, F16_TOL, "4-byte aligned", cancel=True)
    monkeypatch.setattr(cuda_tiles, "TC_ASYNC_ENABLED", False)
    with devices.assume(part), dispatch.use(**{name: "cuda-gemm"}):
        e = str(dispatch.explain(name, _dev(x), _dev(w), **kw))
        assert f"'kernel': '{TC_WIDE_KERNEL}" in e and "switched off" in e, e


def test_float16_cp_async_k64_tiles_where_shared_memory_holds_them(monkeypatch):
    """The first build of cuda_tiles.TC_ASYNC_RUN (K tiles of 64, 2 blocks of 96 KB of dynamic
    shared memory per SM) on a part with an H100's shared memory, through dispatch: more K
    tiles than stages, a partial last one, partial row and column blocks, bias + gelu_tanh;
    explain names it, and on a part of 164 KB per SM says why the 48 KB build runs instead."""
    from kernels_common import cuda_tiles
    from kernels_common.cuda_tiles import TC_ASYNC_RUN, tc_async_kernel_name

    monkeypatch.setattr(cuda_tiles, "TC_ASYNC_ENABLED", True)
    monkeypatch.setattr(cuda_tiles, "WGMMA_ENABLED", False)  # else wgmma runs there (tests/cuda/test_wgmma.py)
    g = rng()
    big = devices.DeviceProps("nominal 2-SM part, H100 shared memory", (9, 0), 2, 1024, 48 * 1024, 227 * 1024,
                              228 * 1024, 65536, 2048)
    small = devices.DeviceProps("nominal 2-SM part", (8, 0), 2, 1024, 48 * 1024, 163 * 1024, 164 * 1024, 65536, 2048)
    first = TC_ASYNC_RUN[0]
    t = cuda_tiles.TC_ASYNC_TILES[first]
    m, n, k = 70, 40, t.bk * (t.stages + 1) + 24
    x = g.standard_normal((m, k)).astype(np.float16)
    w = g.standard_normal((n, k)).astype(np.float16)
    bias = g.standard_normal(n).astype(np.float16)
    y = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    want = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    kw = {"bias": _dev(bias), "activation": "gelu_tanh"}
    with devices.assume(big), dispatch.use(linear="cuda-gemm"):
        e = str(dispatch.explain("linear", _dev(x), _dev(w), **kw))
        assert f"'kernel': '{tc_async_kernel_name(first, True)}'" in e and "2 blocks per SM" in e, e
        got = dispatch.linear(_dev(x), _dev(w), **kw).copy_to_host()
    assert_close(got, want, F16_TOL, first, cancel=True)
    with devices.assume(small), dispatch.use(linear="cuda-gemm"):
        e = str(dispatch.explain("linear", _dev(x), _dev(w), **kw))
        assert f"'kernel': '{tc_async_kernel_name(TC_ASYNC_RUN[-1], True)}'" in e and "exceed the device's 164 KB" in e, e


ATTN_CASES = {  # (B, Hq, Hkv, Sq, Skv, D, causal, scale)
    "gqa": (1, 2, 1, 33, 70, 64, False, None), "causal": (1, 1, 1, 70, 90, 64, True, None),
    "causal sq > skv": (1, 1, 1, 40, 20, 64, True, None), "d128 scaled": (1, 1, 1, 33, 40, 128, False, 0.3),
    # the first 64-row block's rows see no key: it reads no tile at all
    "causal, a block that sees no key": (1, 1, 1, 100, 20, 64, True, None),
    # more key tiles than stage buffers (flash_tc_async_kernel reuses them): 4 tiles of 32 keys
    # at d = 128, causal with Sq < Skv, GQA; 4 tiles of 64 at d = 64, a negative scale
    "d128 several tiles, causal sq < skv, gqa": (1, 2, 1, 40, 110, 128, True, None),
    "d64 several tiles, negative scale": (1, 1, 1, 40, 200, 64, False, -0.2),
    # 128-row blocks (8 warps: the part below takes 256-thread blocks), partial in rows and keys
    # (one head, two key tiles: the simulator runs 256-thread blocks slowly)
    "128-row blocks": (1, 1, 1, 150, 70, 64, True, None),
}
ASYNC_ONLY = ("d128 several tiles, causal sq < skv, gqa", "d64 several tiles, negative scale", "128-row blocks")
# a nominal 2-SM sm_80 part that takes 1024-thread blocks (the simulator's nominal device takes 128)
WIDE_PART = (8, 0), 2, 1024, 48 * 1024, 48 * 1024, 164 * 1024, 65536, 2048


def _expect_tc(e, d, kernel, bq=64):
    s = str(e)
    assert e.chosen == "cuda-flash", s
    if kernel == "async":
        assert f"'kernel': 'attention.tc_async_d{d}_bq{bq}'" in s and "cp.async K/V pipeline" in s, s
    else:
        assert f"'kernel': 'attention.tc_d{d}'" in s, s


# every build of cuda_tiles.TC_ASYNC_TILES but the default (its dispatch test is above); on a
# GPU at shapes of several blocks per dimension, under the simulator one partial block
# On a GPU only: the simulator takes 40-50 s a build, and the code paths the dispatcher runs
# are its dispatch tests' (above and test_float16_cp_async_k64_tiles_where_shared_memory_holds_them;
# a (K, N) b in K tiles of 64: tests/cuda/test_probes.py's DRY probe run)
_TILE_BUILDS = [(n, lay) for n in TC_ASYNC_TILES if n != TC_ASYNC_DEFAULT for lay in ("kn", "nk")]


@pytest.mark.skipif(SIM, reason="GPU only (the probe builds; the simulator runs the dispatched ones)")
@pytest.mark.parametrize("tile, layout", _TILE_BUILDS)
def test_float16_cp_async_tile_builds(tile, layout):
    """Each build bench/gpu_probe_gemm.py compares (kernels_cuda.gemm.gemm_tc_async_kernel
    over cuda_tiles.TC_ASYNC_TILES), launched directly as the probe does (dynamic shared
    memory through _jit.launch_dynamic above 48 KB): partial row, column and last K tiles,
    K tiles past the stages, bias + relu, grouped block order, against float64."""
    from dispatch.cuda_impls._common import words
    from kernels_cuda._jit import launch_dynamic
    from kernels_cuda.gemm import gemm_tc_async_kernel

    cfg = TC_ASYNC_TILES[tile]
    g = rng()
    nk = layout == "nk"
    # K: a partial last tile and more tiles than stages; M, N: partial blocks (and on a GPU,
    # enough row blocks for two groups of group_m, the last one short)
    k = cfg.bk * (cfg.stages + 1) + 24
    m, n = (cfg.bm - 30, cfg.bn - 40) if SIM else (cfg.bm * 11 - 30, cfg.bn * 3 - 40)
    x = (g.standard_normal((m, k)) / 4).astype(np.float16)
    w = (g.standard_normal((n, k) if nk else (k, n)) / 4).astype(np.float16)
    bias = g.standard_normal(n).astype(np.float16)
    y = x.astype(np.float64) @ (w.astype(np.float64).T if nk else w.astype(np.float64)) + bias
    c = cuda.to_device(np.full((1, m, n), np.nan, np.float16))
    idx = cuda.to_device(np.zeros(1, np.int64))
    grid = -(-m // cfg.bm) * -(-n // cfg.bn)
    launch_dynamic(gemm_tc_async_kernel(nk, tile), grid, cfg.threads, cfg.shared_bytes if cfg.dynamic else 0,
                   words(_dev(x)), words(_dev(w)), idx, idx, _dev(bias), c, k // 2, k, n // 2, 1, True)
    assert_close(c.copy_to_host()[0], np.maximum(y, 0), F16_TOL, f"{tile} {layout}", cancel=True)


@pytest.mark.parametrize("group", [1, 3, 8])
def test_grouped_tile_order_covers_every_tile_once(group):
    """kernels_cuda.gemm._grouped_tile_at: every (batch, row block, column block) exactly
    once, group row blocks per column sweep (the last group short), batches in order."""
    from kernels_cuda._jit import kernel
    from kernels_cuda.gemm import _grouped_tile_at

    tile_at = _grouped_tile_at(16, 8, group)

    @kernel
    def where(m_total, n_total, out):
        bz, m0, n0 = tile_at(cuda.blockIdx.x, m_total, n_total)
        out[cuda.blockIdx.x, 0] = bz
        out[cuda.blockIdx.x, 1] = m0
        out[cuda.blockIdx.x, 2] = n0

    m, n, batch = 16 * 7 - 3, 8 * 5, 2
    nbm, nbn = 7, 5
    out = cuda.to_device(np.full((batch * nbm * nbn, 3), -1, np.int64))
    where[batch * nbm * nbn, 1](m, n, out)
    got = [tuple(r) for r in out.copy_to_host()]
    assert sorted(got) == sorted((b, 16 * i, 8 * j) for b in range(batch) for i in range(nbm) for j in range(nbn))
    first = got[:min(group, nbm) * 2]  # the first two column steps of batch 0's first group
    rows = min(group, nbm)
    assert [r[1] // 16 for r in first] == list(range(rows)) * 2 and [r[2] // 8 for r in first] == [0] * rows + [1] * rows
    assert all(r[0] == 0 for r in got[:nbm * nbn]) and all(r[0] == 1 for r in got[nbm * nbn:])


@pytest.mark.parametrize("kernel", ["async", "flash_tc_kernel"])
@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_float16_attention_on_tensor_cores(case, kernel, monkeypatch):
    """float16 attention without a mask at head dim 64 / 128 runs on tensor cores (QK^T and
    PV on mma.sync, P in registers): flash_tc_async_kernel (cp.async K/V stages, ldmatrix)
    by default, flash_tc_kernel when it is switched off: partial query and key tiles, more key
    tiles than stage buffers, GQA, bottom-right causal with Sq > Skv and Sq < Skv, rows and a
    whole block that see no key (zeros, lse -inf), an explicit and a negative scale, 64- and
    128-row blocks, the row log-sum-exp; a NaN in one query row gives that row NaN and leaves
    the others; a mask takes the scalar kernel."""
    from kernels_common import cuda_tiles
    from tests.reference import attention as R

    if kernel != "async" and case in ASYNC_ONLY:
        pytest.skip("the pipelined kernel's cases")
    monkeypatch.setattr(cuda_tiles, "TC_ATTN_ASYNC_ENABLED", kernel == "async")
    if case == "128-row blocks":  # the 8-warp build (the default block is 4 warps: measured faster)
        monkeypatch.setattr(cuda_tiles, "TC_ATTN_ASYNC_WARPS", 8)
    g = rng()
    nb, hq, hkv, sq, skv, d, causal, scale = ATTN_CASES[case]
    q = g.standard_normal((nb, hq, sq, d)).astype(np.float16)
    k = g.standard_normal((nb, hkv, skv, d)).astype(np.float16)
    v = g.standard_normal((nb, hkv, skv, d)).astype(np.float16)
    if case == "gqa":
        q[0, 1, 3, 5] = np.nan
    args = (_dev(q), _dev(k), _dev(v))
    kw = {"causal": causal, "scale": scale}
    wide = case == "128-row blocks"
    with devices.assume(devices.DeviceProps("nominal 2-SM part, 1024 threads", *WIDE_PART)) if wide else _nothing():
        e = dispatch.explain("attention", *args, **kw)
        _expect_tc(e, d, kernel, 128 if wide else 64)
        if kernel != "async":
            assert "switched off" in str(e), str(e)
        out, lse = dispatch.attention(*args, **kw, return_lse=True)
    got, got_lse = out.copy_to_host(), lse.copy_to_host()
    assert got.dtype == np.float16
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    want = R.attention(q64, k64, v64, causal=causal, scale=scale)
    sc = 1 / math.sqrt(d) if scale is None else scale
    s = np.einsum("bhid,bhjd->bhij", q64, np.repeat(k64, hq // hkv, axis=1)) * sc
    if causal:
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None] + skv - sq, s, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = s.max(-1)
        want_lse = np.where(np.isneginf(m), -np.inf, m + np.log(np.exp(s - np.where(np.isneginf(m), 0, m)[..., None]).sum(-1)))
    if case == "gqa":
        assert np.isnan(got[0, 1, 3]).all() and np.isnan(got_lse[0, 1, 3])
        got[0, 1, 3], want[0, 1, 3], got_lse[0, 1, 3], want_lse[0, 1, 3] = 0, 0, 0, 0
        assert np.isfinite(got).all()
    if case == "causal sq > skv":  # query i sees keys <= i - 20: none for the first 20 rows
        assert (got[:, :, :20] == 0).all() and np.isneginf(got_lse[:, :, :20]).all()
    if case == "causal, a block that sees no key":  # query i sees keys <= i - 80
        assert (got[:, :, :80] == 0).all() and np.isneginf(got_lse[:, :, :80]).all()
    assert_close(got, want, F16_TOL, case, cancel=True)
    fin = np.isfinite(want_lse)
    assert (np.isneginf(got_lse) == ~fin).all()
    assert np.abs(got_lse[fin] - want_lse[fin]).max() <= 4e-3 * max(1.0, np.abs(want_lse[fin]).max())
    mask = np.ones((sq, skv), bool)
    assert "attention.flash_d" in str(dispatch.explain("attention", *args, mask=_dev(mask)))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("kernel", ["async", "flash_tc_kernel"])
def test_float16_attention_on_tensor_cores_without_keys(kernel, monkeypatch):
    """Skv = 0: no tile to read; every query sees no key: zeros, lse -inf."""
    from kernels_common import cuda_tiles

    monkeypatch.setattr(cuda_tiles, "TC_ATTN_ASYNC_ENABLED", kernel == "async")
    q = rng().standard_normal((1, 1, 40, 64)).astype(np.float16)  # Sq > 16: not a decode shape
    k = np.zeros((1, 1, 0, 64), np.float16)
    args = (_dev(q), _dev(k), _dev(k))
    _expect_tc(dispatch.explain("attention", *args), 64, kernel)
    out, lse = dispatch.attention(*args, return_lse=True)
    assert (out.copy_to_host() == 0).all() and np.isneginf(lse.copy_to_host()).all()


def test_float16_attention_cp_async_fallbacks(monkeypatch):
    """flash_tc_kernel where flash_tc_async_kernel may not run, and the launch's path says why:
    q, k or v not on a 16-byte boundary (under the simulator, whose arrays have no address,
    the alignment check is made to refuse; on a GPU a real view 4 bytes into its buffer), a
    part before sm_80; the results are the same."""
    from dispatch.cuda_impls import _common as C
    from tests.reference import attention as R

    g = rng()
    q = g.standard_normal((1, 2, 33, 128)).astype(np.float16)
    k = g.standard_normal((1, 1, 40, 128)).astype(np.float16)
    v = g.standard_normal((1, 1, 40, 128)).astype(np.float16)
    want = R.attention(*(a.astype(np.float64) for a in (q, k, v)), causal=True)
    args = (_dev(q), _dev(k), _dev(v))
    _expect_tc(dispatch.explain("attention", *args, causal=True), 128, "async")
    if SIM:
        real = C.word_aligned  # the 16-byte check of the shared cp.async refusals (C.cp_async_refusal)
        monkeypatch.setattr(C, "word_aligned", lambda x, boundary=4: boundary < 16 and real(x, boundary))
        e = dispatch.explain("attention", *args, causal=True)
        _expect_tc(e, 128, "flash_tc_kernel")
        assert "16-byte boundary" in str(e), str(e)
        assert_close(dispatch.attention(*args, causal=True).copy_to_host(), want, F16_TOL, "unaligned", cancel=True)
        monkeypatch.setattr(C, "word_aligned", real)
    else:
        big = _dev(np.concatenate([np.zeros(2, np.float16), k.ravel()]))
        kv = big[2:].reshape(k.shape)  # 4-byte aligned: 32-bit words, not 16-byte chunks
        e = dispatch.explain("attention", args[0], kv, args[2], causal=True)
        _expect_tc(e, 128, "flash_tc_kernel")
        assert "16-byte boundary" in str(e), str(e)
        assert_close(dispatch.attention(args[0], kv, args[2], causal=True).copy_to_host(), want, F16_TOL, "unaligned",
                     cancel=True)
    old = devices.DeviceProps("nominal sm_75 part", (7, 5), 2, 1024, 48 * 1024, 48 * 1024, 64 * 1024, 65536, 1024)
    with devices.assume(old):
        e = dispatch.explain("attention", *args, causal=True)
        _expect_tc(e, 128, "flash_tc_kernel")
        assert "compute capability 7.5 < 8.0" in str(e), str(e)
