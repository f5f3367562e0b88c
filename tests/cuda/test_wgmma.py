"""kernels_cuda.wgmma (Hopper's wgmma from shared memory through matrix descriptors) and the
GEMM built on it (kernels_cuda.gemm_wgmma): on a compute capability 9.0 GPU the instructions,
under the simulator their Python twins, both against numpy and the PTX ISA's layouts (the
shared-memory images here are built from the ISA's formulas, independently of the kernels'
copy code).  Elsewhere (no Hopper GPU) skipped: wgmma exists on sm_90a only."""
import numpy as np
import pytest

from dispatch import devices
from tests.support import ON_CUDA, assert_close, rng

SIM = devices.simulator_enabled()
F16_TOL = 2e-3

if ON_CUDA:
    from numba import cuda


def _hopper():
    if not ON_CUDA:
        return False
    return SIM or tuple(cuda.get_current_device().compute_capability) == (9, 0)


pytestmark = pytest.mark.skipif(not _hopper(), reason="wgmma: Hopper (compute capability 9.0) or its simulator twin")


def _swz(a):
    return a ^ (((a >> 7) & 7) << 4)


def k_major_image(x):
    """x (rows, 64) float16 as a 128-byte-swizzled K-major operand: row r, k at byte
    r * 128 + 2 k before the swizzle (8-row atoms 1024 bytes apart)."""
    r, k = np.meshgrid(np.arange(x.shape[0]), np.arange(64), indexing="ij")
    img = np.zeros(x.shape[0] * 64, np.float16)
    img[_swz(r * 128 + 2 * k) // 2] = x
    return img


def n_major_image(b):
    """b (64, n) float16 (K rows of N) as an N-major operand: panels of 64 columns, each 64
    K rows of 128 bytes (panel p, row k, column c at p * 8192 + k * 128 + 2 c)."""
    k, n = np.meshgrid(np.arange(64), np.arange(b.shape[1]), indexing="ij")
    img = np.zeros(64 * b.shape[1], np.float16)
    img[_swz((n // 64) * 8192 + k * 128 + 2 * (n % 64)) // 2] = b
    return img


@pytest.mark.parametrize("n, trans_b", [(128, 0), (128, 1), (64, 1), (256, 0)])
def test_wgmma_fragment_layout(n, trans_b):
    """One warpgroup: A (64 x 64) and B from shared memory images in the ISA's swizzled
    layouts, 4 wgmma.m64n{n}k16 (K steps of 16 by descriptor advance), every accumulator
    out through the documented fragment layout, against A @ B."""
    from numba import float32, uint32

    from kernels_cuda._jit import kernel, launch_dynamic
    from kernels_cuda.wgmma import (fence_proxy_async, shared_address, smem_desc, wgmma_commit, wgmma_f16,
                                    wgmma_fence, wgmma_wait)

    g = rng()
    a = (g.standard_normal((64, 64)) / 4).astype(np.float16)
    b = (g.standard_normal((64, n)) / 4).astype(np.float16)  # (K, N)
    img = np.concatenate([k_major_image(a), n_major_image(b) if trans_b else k_major_image(b.T.copy())])
    words = img.view(np.uint32)
    NW, AW, NT8 = words.size, 64 * 32, n // 8
    PANEL_BYTES = 64 * 128

    @kernel
    def one(src, out):
        S = cuda.shared.array(0, uint32, alignment=1024)
        s0 = ((1024 - (shared_address(S, 0) & 1023)) & 1023) >> 2
        t = cuda.threadIdx.x
        for i in range(t, NW, 128):
            S[s0 + i] = src[i]
        acc = cuda.local.array((1, NT8, 4), float32)
        for j in range(NT8):
            for r in range(4):
                acc[0, j, r] = 0.0
        fence_proxy_async()
        cuda.syncthreads()
        wgmma_fence()
        for ks in range(4):
            da = smem_desc(S, s0 + ks * 8, 16, 1024)
            if trans_b:
                db = smem_desc(S, s0 + AW + ks * 16 * 32, PANEL_BYTES, 1024)
            else:
                db = smem_desc(S, s0 + AW + ks * 8, 16, 1024)
            wgmma_f16(acc, S, da, db, n, trans_b)
        wgmma_commit()
        wgmma_wait(0)
        for j in range(NT8):
            for r in range(4):
                out[t, 4 * j + r] = acc[0, j, r]

    out = cuda.to_device(np.full((128, n // 2), np.nan, np.float32))
    launch_dynamic(one, 1, 128, 4 * NW + 1024, cuda.to_device(words), out)
    got = out.copy_to_host()
    d = a.astype(np.float64) @ b.astype(np.float64)
    t = np.arange(128)[:, None]
    j = np.arange(n // 2)[None, :]
    w, lane = t >> 5, t & 31
    rows = 16 * w + (lane >> 2) + 8 * ((j >> 1) & 1)
    cols = 8 * (j >> 2) + 2 * (lane & 3) + (j & 1)
    assert_close(got, d[rows, cols], F16_TOL, f"m64n{n}k16 trans_b={trans_b}", cancel=True)


# under the simulator one build (the dispatched one) at one partial block per layout; on a
# GPU every build at several blocks
def _builds():
    from kernels_common.cuda_tiles import WGMMA_RUN, WGMMA_TILES

    names = WGMMA_RUN if SIM else tuple(WGMMA_TILES)
    return [(b, lay, k) for b in names for lay in ("kn", "nk") for k in ("tiles", "short")]


@pytest.mark.parametrize("tile, layout, depth", _builds())
def test_gemm_wgmma_builds(tile, layout, depth):
    """kernels_cuda.gemm_wgmma.gemm_wgmma_kernel launched as the probe does: partial row,
    column and last K tiles, more K tiles than stages (or K = 40: no whole K tile), bias +
    relu, against float64."""
    from dispatch.cuda_impls._common import words
    from kernels_common.cuda_tiles import WGMMA_TILES
    from kernels_cuda._jit import launch_dynamic
    from kernels_cuda.gemm_wgmma import gemm_wgmma_kernel

    cfg = WGMMA_TILES[tile]
    g = rng()
    nk = layout == "nk"
    k = cfg.bk * (cfg.stages + 1) + 24 if depth == "tiles" else 40
    m, n = (cfg.bm - 30, cfg.bn - 40) if SIM else (cfg.bm * 11 - 30, cfg.bn * 3 - 40)
    x = (g.standard_normal((m, k)) / 4).astype(np.float16)
    w = (g.standard_normal((n, k) if nk else (k, n)) / 4).astype(np.float16)
    bias = g.standard_normal(n).astype(np.float16)
    y = x.astype(np.float64) @ (w.astype(np.float64).T if nk else w.astype(np.float64)) + bias
    c = cuda.to_device(np.full((1, m, n), np.nan, np.float16))
    idx = cuda.to_device(np.zeros(1, np.int64))
    grid = -(-m // cfg.bm) * -(-n // cfg.bn)
    dev = lambda a: cuda.to_device(np.ascontiguousarray(a))  # noqa: E731
    launch_dynamic(gemm_wgmma_kernel(nk, tile), grid, cfg.threads, cfg.shared_bytes,
                   words(dev(x)), words(dev(w)), idx, idx, dev(bias), c, k // 2, k, n // 2, 1, True)
    assert_close(c.copy_to_host()[0], np.maximum(y, 0), F16_TOL, f"{tile} {layout}", cancel=True)


H100_LIKE = devices.DeviceProps("nominal 2-SM part, H100 shared memory", (9, 0), 2, 1024, 48 * 1024, 227 * 1024,
                                228 * 1024, 65536, 2048)
A100_LIKE = devices.DeviceProps("nominal 2-SM part, A100 shared memory", (8, 0), 2, 1024, 48 * 1024, 163 * 1024,
                                164 * 1024, 65536, 2048)


@pytest.mark.parametrize("case", ["linear", "matmul (K, N), broadcast batch"])
def test_dispatch_runs_wgmma_on_hopper(case, monkeypatch):
    """Through dispatch on a compute capability 9.0 part: the wgmma kernel runs (explain says
    so), partial tiles, bias + gelu_tanh, a broadcast batch; on an 8.0 part the cp.async
    kernel runs and explain says why not wgmma; switched off, explain says that."""
    import dispatch
    from kernels_common import cuda_tiles
    from kernels_common.cuda_tiles import TC_ASYNC_RUN, WGMMA_RUN, tc_async_kernel_name, wgmma_kernel_name

    monkeypatch.setattr(cuda_tiles, "TC_ASYNC_ENABLED", True)
    g = rng()
    nk = case == "linear"
    m, n, k = 70, 40, 64 * 5 + 24
    x = (g.standard_normal((m, k) if nk else (2, 1, m, k)) / 4).astype(np.float16)
    w = (g.standard_normal((n, k) if nk else (1, k, n)) / 4).astype(np.float16)
    bias = g.standard_normal(n).astype(np.float16)
    y = x.astype(np.float64) @ (w.astype(np.float64).T if nk else w.astype(np.float64)) + bias.astype(np.float64)
    want = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    dev = lambda a: cuda.to_device(np.ascontiguousarray(a))  # noqa: E731
    fn = dispatch.linear if nk else dispatch.matmul
    name = fn.__name__
    kw = {"bias": dev(bias), "activation": "gelu_tanh"}
    with devices.assume(H100_LIKE), dispatch.use(**{name: "cuda-gemm"}):
        e = str(dispatch.explain(name, dev(x), dev(w), **kw))
        assert f"'kernel': '{wgmma_kernel_name(WGMMA_RUN[0], nk)}'" in e and "wgmma from shared memory" in e, e
        got = fn(dev(x), dev(w), **kw).copy_to_host()
    assert got.shape == want.shape and got.dtype == np.float16
    assert_close(got, want, F16_TOL, case, cancel=True)
    with devices.assume(A100_LIKE), dispatch.use(**{name: "cuda-gemm"}):
        e = str(dispatch.explain(name, dev(x), dev(w), **kw))
        assert f"'kernel': '{tc_async_kernel_name(TC_ASYNC_RUN[-1], nk)}'" in e, e
        assert "not wgmma: compute capability 8.0 is not 9.0" in e, e
    monkeypatch.setattr(cuda_tiles, "WGMMA_ENABLED", False)
    with devices.assume(H100_LIKE), dispatch.use(**{name: "cuda-gemm"}):
        e = str(dispatch.explain(name, dev(x), dev(w), **kw))
        assert "not wgmma: it is switched off" in e, e


@pytest.mark.parametrize("n, trans_b", [(128, 1), (64, 0)])
def test_wgmma_register_a_fragment_layout(n, trans_b):
    """wgmma with A from registers (wgmma_f16_rs: mma.sync's A fragment per warp) and B from
    a shared image, 4 K steps, against A @ B."""
    from numba import float32, uint32

    from kernels_cuda._jit import kernel, launch_dynamic
    from kernels_cuda.wgmma import fence_proxy_async, shared_address, smem_desc, wgmma_commit, wgmma_f16_rs, wgmma_fence, wgmma_wait

    g = rng()
    a = (g.standard_normal((64, 64)) / 4).astype(np.float16)
    b = (g.standard_normal((64, n)) / 4).astype(np.float16)
    img = n_major_image(b) if trans_b else k_major_image(b.T.copy())
    words = img.view(np.uint32)
    NW, NT8 = words.size, n // 8
    PANEL_BYTES = 64 * 128

    @kernel
    def one(src, aw, out):
        S = cuda.shared.array(0, uint32, alignment=1024)
        s0 = ((1024 - (shared_address(S, 0) & 1023)) & 1023) >> 2
        t = cuda.threadIdx.x
        for i in range(t, NW, 128):
            S[s0 + i] = src[i]
        acc = cuda.local.array((1, NT8, 4), float32)
        for j in range(NT8):
            for r in range(4):
                acc[0, j, r] = 0.0
        fence_proxy_async()
        cuda.syncthreads()
        w, lane = t >> 5, t & 31
        row = 16 * w + (lane >> 2)
        c = lane & 3
        wgmma_fence()
        for ks in range(4):  # aw: A as words (64 rows x 32 words)
            a0 = aw[row * 32 + ks * 8 + c]
            a1 = aw[(row + 8) * 32 + ks * 8 + c]
            a2 = aw[row * 32 + ks * 8 + c + 4]
            a3 = aw[(row + 8) * 32 + ks * 8 + c + 4]
            if trans_b:
                db = smem_desc(S, s0 + ks * 16 * 32, PANEL_BYTES, 1024)
            else:
                db = smem_desc(S, s0 + ks * 8, 16, 1024)
            wgmma_f16_rs(acc, a0, a1, a2, a3, S, db, n, trans_b)
        wgmma_commit()
        wgmma_wait(0)
        for j in range(NT8):
            for r in range(4):
                out[t, 4 * j + r] = acc[0, j, r]

    out = cuda.to_device(np.full((128, n // 2), np.nan, np.float32))
    launch_dynamic(one, 1, 128, 4 * NW + 1024, cuda.to_device(words), cuda.to_device(a.view(np.uint32).ravel()), out)
    got = out.copy_to_host()
    d = a.astype(np.float64) @ b.astype(np.float64)
    t = np.arange(128)[:, None]
    j = np.arange(n // 2)[None, :]
    w, lane = t >> 5, t & 31
    rows = 16 * w + (lane >> 2) + 8 * ((j >> 1) & 1)
    cols = 8 * (j >> 2) + 2 * (lane & 3) + (j & 1)
    assert_close(got, d[rows, cols], F16_TOL, f"register A, m64n{n}k16 trans_b={trans_b}", cancel=True)


WG_ATTN_CASES = {  # (B, Hq, Hkv, Sq, Skv, D, causal, scale)
    "gqa": (1, 2, 1, 33, 70, 64, False, None),
    "causal sq < skv, several tiles": (1, 1, 1, 40, 200, 64, True, None),
    "causal sq > skv, a block that sees no key": (1, 1, 1, 100, 20, 64, True, None),
    "d128 negative scale": (1, 1, 1, 33, 90, 128, False, -0.2),
}


def _attention_reference(q, k, v, causal, scale):
    """float64 softmax(q k^T scale) v, causal bottom-right aligned (key j seen by query i when
    j <= i + Skv - Sq), rows that see no key 0; and their lse (-inf there)."""
    nb, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    k = np.repeat(k.astype(np.float64), hq // hkv, axis=1)
    v = np.repeat(v.astype(np.float64), hq // hkv, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k) * scale
    if causal:
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq), s, -np.inf)
    mx = s.max(-1, keepdims=True)
    seen = np.isfinite(mx)
    p = np.exp(s - np.where(seen, mx, 0))
    ssum = p.sum(-1, keepdims=True)
    o = np.where(seen, (p @ v) / np.where(seen, ssum, 1), 0)
    lse = np.where(seen[..., 0], (np.where(seen, mx, 0) + np.log(np.where(seen, ssum, 1)))[..., 0], -np.inf)
    return o, lse


@pytest.mark.parametrize("build", ["wg64", "wg128k", "wg64x2"])
@pytest.mark.parametrize("case", list(WG_ATTN_CASES))
def test_flash_wgmma_attention(case, build):
    """kernels_cuda.attention_wgmma (S = Q K^T from shared memory, O += P V with P from
    registers), launched as bench/gpu_probe_attention.py does: GQA, causal with Sq < Skv and
    Sq > Skv (rows and a whole block that see no key: 0 and lse -inf), key tiles past the
    stages, a partial last tile, d = 128 with a negative scale; output and lse against float64."""
    import math

    from dispatch.cuda_impls._common import words
    from kernels_common.cuda_tiles import WGMMA_ATTN_BUILDS, wgmma_attention_shared_bytes
    from kernels_cuda._jit import launch_dynamic
    from kernels_cuda.attention_wgmma import flash_wgmma_kernel

    nb, hq, hkv, sq, skv, d, causal, scale = WG_ATTN_CASES[case]
    scale = 1 / math.sqrt(d) if scale is None else scale
    bk, stages, nwg = WGMMA_ATTN_BUILDS[build]
    g = rng()
    q = g.standard_normal((nb, hq, sq, d)).astype(np.float16)
    k = g.standard_normal((nb, hkv, skv, d)).astype(np.float16)
    v = g.standard_normal((nb, hkv, skv, d)).astype(np.float16)
    out = cuda.to_device(np.full(nb * hq * sq * d, np.nan, np.float16))
    lse = cuda.to_device(np.full(nb * hq * sq, np.nan, np.float16))
    grid = -(-sq // (64 * nwg)) * nb * hq
    dev = lambda a: cuda.to_device(np.ascontiguousarray(a))  # noqa: E731
    launch_dynamic(flash_wgmma_kernel(d, bk, stages, nwg), grid, 128 * nwg, wgmma_attention_shared_bytes(d, bk, stages, nwg),
                   words(dev(q)), words(dev(k)), words(dev(v)), nb, hq, sq, hkv, skv, causal, scale, out, lse, True)
    want, want_lse = _attention_reference(q, k, v, causal, scale)
    assert_close(out.copy_to_host().reshape(want.shape), want, F16_TOL, f"{case} {build}", cancel=True)
    got_lse = lse.copy_to_host().reshape(want_lse.shape).astype(np.float64)
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse)), case
    fin = np.isfinite(want_lse)
    assert_close(got_lse[fin], want_lse[fin], 4e-3, f"{case} {build} lse")


def test_dispatch_runs_wgmma_attention_where_switched_on(monkeypatch):
    """Through dispatch on a compute capability 9.0 part: off by default (explain says so and
    why: not yet timed on a GPU); switched on, the wgmma kernel runs causal GQA attention with
    its lse; on an 8.0 part explain says why not."""
    import math

    import dispatch
    from kernels_common import cuda_tiles

    g = rng()
    nb, hq, hkv, sq, skv, d = 1, 2, 1, 40, 150, 64
    q = g.standard_normal((nb, hq, sq, d)).astype(np.float16)
    k = g.standard_normal((nb, hkv, skv, d)).astype(np.float16)
    v = g.standard_normal((nb, hkv, skv, d)).astype(np.float16)
    dev = lambda a: cuda.to_device(np.ascontiguousarray(a))  # noqa: E731
    args = (dev(q), dev(k), dev(v))
    with devices.assume(H100_LIKE), dispatch.use(attention="cuda-flash"):
        e = str(dispatch.explain("attention", *args, causal=True))
        assert "not wgmma: it is switched off" in e and "not yet timed on a GPU" in e, e
    monkeypatch.setattr(cuda_tiles, "TC_ATTN_WGMMA_ENABLED", True)
    with devices.assume(H100_LIKE), dispatch.use(attention="cuda-flash"):
        e = str(dispatch.explain("attention", *args, causal=True))
        assert "'kernel': 'attention.wgmma_d64_" in e and "wgmma (Hopper)" in e, e
        got, got_lse = dispatch.attention(*args, causal=True, return_lse=True)
    want, want_lse = _attention_reference(q, k, v, True, 1 / math.sqrt(d))
    assert_close(got.copy_to_host(), want, F16_TOL, "dispatched wgmma attention", cancel=True)
    assert_close(got_lse.copy_to_host().astype(np.float64), want_lse, 4e-3, "its lse")
    with devices.assume(A100_LIKE), dispatch.use(attention="cuda-flash"):
        e = str(dispatch.explain("attention", *args, causal=True))
        assert "not wgmma: compute capability 8.0 is not 9.0" in e, e


def test_wgmma_paths_propagate_nan(monkeypatch):
    """The wgmma GEMM and attention through dispatch on a 9.0 part: a NaN in x's row r makes
    row r of linear's output NaN and no other; a NaN in a key makes exactly the attention rows
    that see it (causal) NaN, the others still match float64."""
    import math

    import dispatch
    from kernels_common import cuda_tiles

    monkeypatch.setattr(cuda_tiles, "TC_ASYNC_ENABLED", True)
    monkeypatch.setattr(cuda_tiles, "TC_ATTN_WGMMA_ENABLED", True)
    g = rng()
    dev = lambda a: cuda.to_device(np.ascontiguousarray(a))  # noqa: E731
    x = (g.standard_normal((20, 72)) / 4).astype(np.float16)
    w = (g.standard_normal((24, 72)) / 4).astype(np.float16)
    x[3, 5] = np.nan
    q, kk, v = (g.standard_normal((1, 1, 70, 64)).astype(np.float16) for _ in range(3))
    kk[0, 0, 30, 7] = np.nan  # key 30: seen (causal, Sq = Skv) by queries 30..69
    with devices.assume(H100_LIKE), dispatch.use(linear="cuda-gemm", attention="cuda-flash"):
        assert "wgmma" in str(dispatch.explain("linear", dev(x), dev(w)))
        assert "wgmma" in str(dispatch.explain("attention", dev(q), dev(kk), dev(v), causal=True))
        y = dispatch.linear(dev(x), dev(w)).copy_to_host()
        o = dispatch.attention(dev(q), dev(kk), dev(v), causal=True).copy_to_host()
    bad = np.isnan(y).any(axis=1)
    assert bad[3] and bad.sum() == 1 and np.isnan(y[3]).all()
    rows_nan = np.isnan(o[0, 0]).any(axis=1)
    assert not rows_nan[:30].any() and rows_nan[30:].all()
    want_o, _ = _attention_reference(q, np.nan_to_num(kk), v, True, 1 / math.sqrt(64))
    assert_close(o[0, 0, :30], want_o[0, 0, :30], F16_TOL, "rows before the NaN key", cancel=True)


@pytest.mark.skipif(SIM, reason="the simulator cannot run launches from several threads at once")
def test_wgmma_paths_from_threads(monkeypatch):
    """4 Python threads calling the wgmma GEMM and attention at once with different inputs
    (each assuming the 9.0 part: per thread) get exactly their single-threaded results."""
    import threading

    import dispatch
    from kernels_common import cuda_tiles

    monkeypatch.setattr(cuda_tiles, "TC_ASYNC_ENABLED", True)
    monkeypatch.setattr(cuda_tiles, "TC_ATTN_WGMMA_ENABLED", True)
    g = rng()
    dev = lambda a: cuda.to_device(np.ascontiguousarray(a))  # noqa: E731
    w = (g.standard_normal((136, 200)) / 4).astype(np.float16)
    kt, vt = (g.standard_normal((1, 1, 300, 128)).astype(np.float16) for _ in range(2))
    inputs = [((g.standard_normal((150, 200)) / 4).astype(np.float16),
               g.standard_normal((1, 2, 170, 128)).astype(np.float16)) for _ in range(4)]

    def call(i):
        with devices.assume(H100_LIKE), dispatch.use(linear="cuda-gemm", attention="cuda-flash"):
            xi, qi = inputs[i]
            return (dispatch.linear(dev(xi), dev(w)).copy_to_host(),
                    dispatch.attention(dev(qi), dev(kt), dev(vt), causal=True).copy_to_host())

    alone = [call(i) for i in range(4)]
    got, errs = [None] * 4, []

    def run(i):
        try:
            for _ in range(5):
                got[i] = call(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errs, errs
    for i in range(4):
        assert np.array_equal(got[i][0], alone[i][0]) and np.array_equal(got[i][1], alone[i][1]), i
