"""The machine's ceilings, measured in the same run as the ops, and the roofline plot.

* compute: the faster of the fp32 FMA rate (the GEMM micro-kernel on L1-resident panels,
  all threads) and the fastest fp32 GEMM (n x n x n, 2 n^3 FLOPs) of numpy's BLAS, PyTorch's
  and ours, all threads;
* memory: copying a 256 MiB float32 array (bytes read + bytes written), once with numpy
  (one thread) and once with a numba prange loop (all threads); the faster counts.

The ceiling is the best sample (what the machine can do), the median is reported beside it.
The roofline floor of a call is max(FLOPs / peak, bytes / bandwidth): no implementation can
beat it, so time / floor says how far from the machine's limit we are.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from kernels_cpu.gemm import micro_tile

from . import timing

MIB = 1 << 20


@njit(parallel=True, cache=True)
def _parallel_copy(src, dst):
    """dst[:] = src[:] on all threads, in chunks.  Each chunk is copied as slices indexed over
    range(their length): indexed over range(lo, hi), numba's negative-index wraparound
    stays in the loop and LLVM copied element by element (11.6 GB/s on 2 threads, where
    numpy's one-thread copy ran 25.4 and this 34.8: the memory ceiling came from numpy's
    copy and was 1.3x low; Zen 4, 2026-12-05)."""
    n = src.shape[0]
    chunk = 1 << 16
    for c in prange((n + chunk - 1) // chunk):
        lo = c * chunk
        hi = min(lo + chunk, n)
        s = src[lo:hi]
        d = dst[lo:hi]
        for i in range(s.shape[0]):
            d[i] = s[i]


def gemm_ceiling(n: int = 1024, rounds: int = 5) -> dict:
    """The fastest fp32 n^3 GEMM this machine runs, all threads: numpy's BLAS, PyTorch's
    (when installed) and ours (prepacked, kernels_cpu/gemm.py), interleaved; the best
    sample of the fastest counts.  numpy's BLAS alone is no ceiling where it runs older
    kernels than the host has (OpenBLAS 0.3.31 on Zen 5 runs its Haswell AVX2 kernels:
    251 GFLOP/s at 2048^3 where our AVX-512 GEMM ran 395, 2026-11-26)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    cands = {"numpy BLAS": lambda: np.matmul(a, b, out=c)}
    try:
        import torch
        ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)
        cands["PyTorch"] = lambda: torch.mm(ta, tb, out=tc)
    except ImportError:
        pass
    import dispatch
    pb = dispatch.prepack(b, op="matmul")

    def ours():
        with dispatch.use(matmul="cpu-gemm"):
            dispatch.matmul(a, pb, out=c)
    cands["ours (dispatch cpu-gemm, prepacked)"] = ours
    res = timing.interleaved(cands, rounds=rounds, warmup=1, batch_s=0.05, pause_s=0.05)
    flops = 2.0 * n ** 3
    best = min(res, key=lambda k: res[k].min)
    st = res[best]
    return {"what": f"fp32 GEMM {n}^3 via {best}", "best_gflops": flops / st.min / 1e9,
            "median_gflops": flops / st.median / 1e9, "spread": st.spread,
            "per_method_best_gflops": {k: flops / v.min / 1e9 for k, v in res.items()}}


def bandwidth_ceiling(mib: int = 256, rounds: int = 5) -> dict:
    n = mib * MIB // 4
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    _parallel_copy(src[:16], dst[:16])  # compile (or load from cache) outside the timing
    res = timing.interleaved(
        {"numpy copy": lambda: np.copyto(dst, src), "numba prange copy": lambda: _parallel_copy(src, dst)},
        rounds=rounds, warmup=1, batch_s=0.0, pause_s=0.05,
    )
    nbytes = 2.0 * n * 4
    best_name = min(res, key=lambda k: res[k].min)
    st = res[best_name]
    return {"what": f"copy of {mib} MiB float32 (read + write) via {best_name}",
            "best_gbs": nbytes / st.min / 1e9, "median_gbs": nbytes / st.median / 1e9, "spread": st.spread,
            "per_method_best_gbs": {k: nbytes / v.min / 1e9 for k, v in res.items()}}


@njit(parallel=True, cache=True)
def _fma_loop(ap, bp, c, kc, reps, nthreads, ti):
    """Each of nthreads threads runs the register tile TILES[ti] (float32) reps times over
    its own kc-step panels (L1-resident): FMAs from registers, no memory traffic."""
    mr, nr = 16, 48  # room for every tile's panels (gemm.TILES: MR <= 12, NR <= 48)
    for t in prange(nthreads):
        for _ in range(reps):
            if ti == 0:
                micro_tile(0, kc, ap, t * kc * mr, bp, t * kc * nr, nr, c, t * mr * nr, nr, False)
            elif ti == 1:
                micro_tile(1, kc, ap, t * kc * mr, bp, t * kc * nr, nr, c, t * mr * nr, nr, False)
            else:
                micro_tile(2, kc, ap, t * kc * mr, bp, t * kc * nr, nr, c, t * mr * nr, nr, False)


def fma_peak(rounds: int = 5, kc: int = 128) -> dict:
    """The machine's fp32 FMA rate: the GEMM micro-kernel (the active register tile) on
    L1-resident panels, one per thread, all threads.  GEMMs fall short of it by their
    memory traffic; no kernel here beats it (Zen 5, 2 threads, 2026-11-26: 528 GFLOP/s,
    the fastest GEMM 477 at 2048^3, the SD U-Net convolution 486)."""
    import numba

    from kernels_cpu import gemm as G
    ti = G._tile_index(None)
    tile = G.TILES[ti]
    nt = numba.get_num_threads()
    ap = np.ones(nt * kc * 16, np.float32)
    bp = np.ones(nt * kc * 48, np.float32)
    c = np.zeros(nt * 16 * 48, np.float32)
    reps = 20000
    _fma_loop(ap, bp, c, kc, 1, nt, ti)  # compile (or load from cache) outside the timing
    st = timing.time_one(lambda: _fma_loop(ap, bp, c, kc, reps, nt, ti), rounds=rounds, warmup=1, batch_s=0.0)
    flops = 2.0 * tile.mr * tile.nr32 * kc * reps * nt
    return {"what": f"fp32 FMA rate of the {tile.name} micro-kernel on L1-resident panels, {nt} threads",
            "best_gflops": flops / st.min / 1e9, "median_gflops": flops / st.median / 1e9, "spread": st.spread}


def measure(quick: bool = True) -> dict:
    """{'gflops': peak, 'gbs': bandwidth, 'gemm': {...}, 'fma': {...}, 'copy': {...}}: the
    compute ceiling is the faster of the FMA rate and the fastest GEMM."""
    gemm = gemm_ceiling(1024 if quick else 2048, rounds=5 if quick else 9)
    fma = fma_peak(rounds=5 if quick else 9)
    copy = bandwidth_ceiling(256, rounds=5 if quick else 9)
    return {"gflops": max(gemm["best_gflops"], fma["best_gflops"]), "gbs": copy["best_gbs"], "gemm": gemm,
            "fma": fma, "copy": copy}


def floor_seconds(flops, nbytes, ceilings) -> float | None:
    """Roofline floor: the time the faster of the two limits allows at best."""
    if flops is None and nbytes is None:
        return None
    t_c = (flops or 0) / (ceilings["gflops"] * 1e9)
    t_m = (nbytes or 0) / (ceilings["gbs"] * 1e9)
    return max(t_c, t_m)


def plot(rows: list[dict], ceilings: dict, path: str, title: str = "") -> str:
    """Arithmetic intensity (FLOP/byte) vs achieved GFLOP/s on log axes; the two ceilings
    as lines; one point per op and shape for ours (filled) and each peer (other markers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if r.get("intensity") and r.get("gflops")]
    fig, ax = plt.subplots(figsize=(10, 6.5))
    peak, bw = ceilings["gflops"], ceilings["gbs"]
    xs = [r["intensity"] for r in pts] or [0.1, 100]
    lo, hi = min(min(xs) / 2, 0.05), max(max(xs) * 2, 2 * peak / bw)
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(grid, np.minimum(peak, bw * grid), "k-", lw=2, label=f"roofline: {peak:.0f} GFLOP/s, {bw:.1f} GB/s")
    ax.axhline(peak, color="grey", ls=":", lw=1)
    ax.plot(grid, bw * grid, color="grey", ls=":", lw=1)
    markers = {"ours": ("o", None), "numpy": ("s", "none"), "torch": ("^", "none"), "onnxruntime": ("D", "none")}
    ops = sorted({r["op"] for r in pts})
    colors = {op: plt.cm.tab20(i % 20) for i, op in enumerate(ops)}
    seen = set()
    for r in pts:
        m, face = markers.get(r["impl_kind"], ("x", None))
        label = None
        if (r["op"], "ours") not in seen and r["impl_kind"] == "ours":
            label = r["op"]
            seen.add((r["op"], "ours"))
        ax.scatter(r["intensity"], r["gflops"], marker=m, s=50 if r["impl_kind"] == "ours" else 35,
                   facecolors=face if face else colors[r["op"]], edgecolors=colors[r["op"]], label=label, zorder=3)
    for kind, (m, _) in markers.items():
        if kind != "ours" and any(r["impl_kind"] == kind for r in pts):
            ax.scatter([], [], marker=m, facecolors="none", edgecolors="k", label=f"peer: {kind}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(title or "roofline: ours (filled) vs peers (open)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
