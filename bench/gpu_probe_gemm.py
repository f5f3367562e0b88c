"""GPU probe: the float16 tensor-core GEMM kernels timed directly (no dispatch), against
torch.matmul.

    python3 bench/gpu_probe_gemm.py            # on a machine with an H100/H200 and a CUDA torch
    DRY=1 NUMBA_ENABLE_CUDASIM=1 python bench/gpu_probe_gemm.py   # tiny shapes, the simulator

For each shape and B layout ("kn": matmul's (K, N) b; "nk": linear's (N, K) weight, trans_b)
it runs kernels_cuda.gemm.gemm_tc_wide_kernel ("wide": register-prefetched 32-bit loads) and
gemm_tc_async_kernel (cp.async pipeline + ldmatrix) in each build of
kernels_common.cuda_tiles.TC_ASYNC_TILES (block tile, warps, stages, blocks per SM, grouped
block order; dynamic shared memory above 48 KB) and, on Hopper, kernels_cuda.gemm_wgmma's
builds (cuda_tiles.WGMMA_TILES: wgmma from shared memory), checks each result against an fp32-accumulated
product (relative error: max |ours - ref| / max |ref|) and prints the median of REPS timed
launches (CUDA events around each launch, queued behind torch.cuda._sleep so the GPU runs
them back to back: GPU time, not the host's launch time), TFLOP/s and the speed relative to
torch.matmul (torch time / ours: 1.0 = as fast).  One JSON line per row on stdout and, when
$OUT is set, in $OUT/gpu_probe_gemm.json.

Environment: DRY=1 tiny shapes, 2 reps, numpy reference (torch if it has CUDA); REPS=n;
SHAPES="m,n,k,layout;..." to replace the list; VARIANTS="wide,128x128x32,..." to pick kernels
(default: wide, every TC_ASYNC_TILES build, and every WGMMA_TILES build on compute capability 9.0).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from bench import gpu_probe_common as common  # noqa: E402
from bench.gpu_probe_common import DRY, REPS, SIM  # noqa: E402,F401

if DRY:  # partial row, column and K tiles; K tiles past the 3 stages; both layouts
    SHAPES = [(70, 24, 136, "kn"), (33, 40, 72, "nk")]
else:
    SHAPES = [(4096, 4096, 4096, "kn"), (4096, 4096, 4096, "nk"), (2048, 2048, 2048, "kn"),
              (2048, 2048, 2048, "nk"), (8192, 4096, 4096, "kn"), (512, 11008, 4096, "nk"),
              (4096, 11008, 4096, "nk"), (2048, 4096, 11008, "nk"), (1000, 1000, 1000, "kn")]
if os.environ.get("SHAPES"):
    SHAPES = [(int(m), int(n), int(k), lay) for m, n, k, lay in (s.split(",") for s in os.environ["SHAPES"].split(";"))]
VARIANTS = os.environ.get("VARIANTS", "").split(",") if os.environ.get("VARIANTS") else None


def main():
    from numba import cuda

    torch, has_torch = common.setup()
    from dispatch.cuda_impls._common import words
    from kernels_common.cuda_tiles import TC_ASYNC_TILES, TC_WIDE_TILE, TC_WIDE_WARPS, WGMMA_TILES
    from kernels_cuda._jit import launch_dynamic
    from kernels_cuda.gemm import gemm_tc_async_kernel, gemm_tc_wide_kernel
    from kernels_cuda.gemm_wgmma import gemm_wgmma_kernel

    hopper = SIM or tuple(cuda.get_current_device().compute_capability) == (9, 0)
    variants = VARIANTS or ["wide"] + list(TC_ASYNC_TILES) + (list(WGMMA_TILES) if hopper else [])

    def kernels(trans_b):
        """name -> (kernel, (BM, BN, BK), threads, dynamic shared bytes)"""
        out = {}
        for v in variants:
            if v == "wide":
                out["wide"] = (gemm_tc_wide_kernel(trans_b), TC_WIDE_TILE, 32 * TC_WIDE_WARPS, 0)
            elif v in WGMMA_TILES:  # Hopper only (sm_90a)
                t = WGMMA_TILES[v]
                out[v] = (gemm_wgmma_kernel(trans_b, v), (t.bm, t.bn, t.bk), t.threads, t.shared_bytes)
            else:
                t = TC_ASYNC_TILES[v]
                out[v] = (gemm_tc_async_kernel(trans_b, v), (t.bm, t.bn, t.bk), t.threads,
                          t.shared_bytes if t.dynamic else 0)
        return out

    def time_it(launch, sync):
        return common.time_it(launch, sync, torch, has_torch)

    g = np.random.default_rng(0)
    rows = []
    hdr = f"{'M':>5s} {'N':>5s} {'K':>5s} {'b':2s} {'kernel':15s} {'us':>9s} {'TFLOP/s':>8s} {'x torch':>7s} {'rel err':>8s}"
    print(f"device: {torch.cuda.get_device_name() if has_torch else 'simulator' if SIM else '?'}; reps {REPS}", flush=True)
    print(hdr, flush=True)
    for m, n, k, lay in SHAPES:
        nk = lay == "nk"
        a_h = (g.standard_normal((m, k)) / 4).astype(np.float16)
        b_h = (g.standard_normal((n, k) if nk else (k, n)) / 4).astype(np.float16)
        if has_torch:
            ta, tb = torch.from_numpy(a_h).cuda(), torch.from_numpy(b_h).cuda()
            ref = (ta.float() @ (tb.float().T if nk else tb.float())).cpu().numpy()
            tf = (lambda: torch.matmul(ta, tb.T)) if nk else (lambda: torch.matmul(ta, tb))
            t_torch = time_it(tf, torch.cuda.synchronize)
            got_t = tf().float().cpu().numpy()
            err_t = float(np.abs(got_t - ref).max() / np.abs(ref).max())
            row = {"m": m, "n": n, "k": k, "b": lay, "kernel": "torch", "us": t_torch,
                   "tflops": 2 * m * n * k / t_torch / 1e6, "x_torch": 1.0, "rel_err": err_t}
            rows.append(row)
            print(f"{m:5d} {n:5d} {k:5d} {lay:2s} {'torch':15s} {t_torch:9.1f} {row['tflops']:8.1f} {1.0:7.2f} {err_t:8.1e}",
                  flush=True)
            a_d, b_d = cuda.as_cuda_array(ta), cuda.as_cuda_array(tb)
        else:
            ref = a_h.astype(np.float32) @ (b_h.astype(np.float32).T if nk else b_h.astype(np.float32))
            t_torch = None
            a_d, b_d = cuda.to_device(a_h), cuda.to_device(b_h)
        aw, bw = words(a_d), words(b_d)
        idx = cuda.to_device(np.zeros(1, np.int64))
        bias = cuda.to_device(np.zeros(1, np.float16))
        for name, (kern, (bm, bn, _), threads, dyn) in kernels(nk).items():
            c = cuda.to_device(np.full((1, m, n), np.nan, np.float16))
            grid = ((m + bm - 1) // bm) * ((n + bn - 1) // bn)
            args = (aw, bw, idx, idx, bias, c, k // 2, k, n // 2, 0, False)

            def launch(kern=kern, grid=grid, threads=threads, args=args, dyn=dyn):
                launch_dynamic(kern, grid, threads, dyn, *args)

            try:
                t = time_it(launch, cuda.synchronize)
                got = c.copy_to_host()[0].astype(np.float32)
                err = float(np.abs(got - ref).max() / np.abs(ref).max()) if np.isfinite(got).all() else float("nan")
            except Exception as exc:  # noqa: BLE001 - one kernel failing must not lose the others' rows
                print(f"{m:5d} {n:5d} {k:5d} {lay:2s} {name:15s} FAILED {type(exc).__name__}: {str(exc)[:300]}",
                      flush=True)
                continue
            row = {"m": m, "n": n, "k": k, "b": lay, "kernel": name, "us": t, "rel_err": err,
                   "tflops": None if t is None else 2 * m * n * k / t / 1e6,
                   "x_torch": None if t is None or t_torch is None else t_torch / t}
            rows.append(row)
            ts = "-" if t is None else f"{t:.1f}"
            tfs = "-" if t is None else f"{row['tflops']:.1f}"
            xs = "-" if row["x_torch"] is None else f"{row['x_torch']:.2f}"
            print(f"{m:5d} {n:5d} {k:5d} {lay:2s} {name:15s} {ts:>9s} {tfs:>8s} {xs:>7s} {err:8.1e}", flush=True)
            if not err <= 2e-3:
                print(f"   ^ WRONG: relative error {err} > 2e-3", flush=True)
    common.emit(rows, "gpu_probe_gemm")
    bad = [r for r in rows if not r["rel_err"] <= 2e-3]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
