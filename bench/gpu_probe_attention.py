"""GPU probe: the float16 tensor-core flash attention kernels timed directly (no dispatch),
against torch.nn.functional.scaled_dot_product_attention.

    PYTHONPATH=$PWD/bench/gpu_shim:$PWD python3 bench/gpu_probe_attention.py   # an H100/H200, CUDA torch
    DRY=1 NUMBA_ENABLE_CUDASIM=1 python bench/gpu_probe_attention.py            # tiny shapes, the simulator

Kernels (VARIANTS, comma-separated; each a separate build):
  tc        kernels_cuda.attention.flash_tc_kernel: 64-row blocks, 32-bit K/V loads through
            registers, V transposed by the threads, two barriers per tile (the old default)
  async8    flash_tc_async_kernel, 8 warps (128-row blocks), 3 cp.async stages (the new default)
  async4    the same, 4 warps (64-row blocks: the dispatcher's choice for small grids)
  async8s2  8 warps, 2 stages (double buffering: 32 KB of shared memory)
  async4s2  4 warps, 2 stages
  async8k32 8 warps, 32-key tiles at d = 64 too (d = 128 already takes 32)
  async4b3  4 warps, launch bounds of 3 blocks per SM (168 registers at d = 128, 161 at 64, no
            spills, sm_90): 12 warps per SM instead of 8 (2 blocks per SM won the GEMM 1.27x,
            bench/gpu_results/2026-11-27c-h200)
  async4b4  4 warps, 4 blocks per SM (128 registers: spills at d = 128, none at d = 64)
  wg64      (Hopper only) kernels_cuda.attention_wgmma: wgmma for S = Q K^T (both from shared
            memory) and O += P V (P from registers), 64-key tiles, 3 stages, one warpgroup
  wg64s2    the same, 2 stages (2 blocks per SM at d = 128)
  wg128k    128-key tiles, 2 stages
  wg64x2    2 warpgroups (128 query rows) sharing each K/V tile, 2 stages
For each shape (B, H, S, D, causal; Sq = Skv, so PyTorch's top-left causal mask is the
kernels' bottom-right one) it checks each result against a float32 SDPA (relative error:
max |ours - ref| / max |ref|, limit 4e-3) and prints the median of REPS timed launches (CUDA
events around each launch, queued behind torch.cuda._sleep so the GPU runs them back to back:
GPU time, not the host's), TFLOP/s (4 B H S^2 D, half of it when causal) and the speed
relative to the float16 SDPA (torch time / ours: 1.0 = as fast).  One JSON line per row on
stdout and, when $OUT is set, in $OUT/gpu_probe_attention.json.

Environment: DRY=1 tiny shapes, 2 reps, numpy reference (torch if it has CUDA); REPS=n;
SHAPES="b,h,s,d,causal;..." (causal 0/1) to replace the list; VARIANTS as above.
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from bench import gpu_probe_common as common  # noqa: E402
from bench.gpu_probe_common import DRY, REPS, SIM  # noqa: E402,F401
TOL = 4e-3

if DRY:  # partial query and key tiles, more key tiles than stages, both head dims, causal or not
    SHAPES = [(1, 1, 150, 64, True), (1, 1, 100, 128, False)]
else:
    SHAPES = [(1, 32, 4096, 128, True), (1, 12, 512, 64, False), (1, 32, 512, 128, True), (1, 12, 2048, 64, True),
              (4, 16, 1024, 128, False)]
if os.environ.get("SHAPES"):
    SHAPES = [(int(b), int(h), int(s), int(d), c.strip() not in ("0", "", "False", "false"))
              for b, h, s, d, c in (x.split(",") for x in os.environ["SHAPES"].split(";"))]
VARIANTS = os.environ.get("VARIANTS", "tc,async8,async4,async8s2,async4s2,async8k32,async4b3,async4b4,"
                                      "wg64,wg64s2,wg128k,wg64x2").split(",")


def main():
    from numba import cuda

    torch, has_torch = common.setup()
    from dispatch.cuda_impls._common import words
    from kernels_common.cuda_tiles import TC_ATTN_BQ, TC_ATTN_WARPS
    from kernels_common.cuda_tiles import WGMMA_ATTN_BUILDS, wgmma_attention_shared_bytes
    from kernels_cuda._jit import launch_dynamic
    from kernels_cuda.attention import flash_tc_async_kernel, flash_tc_kernel
    from kernels_cuda.attention_wgmma import flash_wgmma_kernel

    hopper = SIM or tuple(cuda.get_current_device().compute_capability) == (9, 0)


    def kernels(d):
        """name -> (kernel, rows per block, threads, dynamic shared bytes)"""
        table = {"tc": lambda: (flash_tc_kernel(d), TC_ATTN_BQ, 32 * TC_ATTN_WARPS),
                 "async8": lambda: (flash_tc_async_kernel(d, 8), 128, 256),
                 "async4": lambda: (flash_tc_async_kernel(d, 4), 64, 128),
                 "async8s2": lambda: (flash_tc_async_kernel(d, 8, 0, 2), 128, 256),
                 "async4s2": lambda: (flash_tc_async_kernel(d, 4, 0, 2), 64, 128),
                 "async8k32": lambda: (flash_tc_async_kernel(d, 8, 32, 3), 128, 256),
                 "async4b3": lambda: (flash_tc_async_kernel(d, 4, 0, 0, 3), 64, 128),
                 "async4b4": lambda: (flash_tc_async_kernel(d, 4, 0, 0, 4), 64, 128)}
        table = {name: (lambda f: lambda: f() + (0,))(f) for name, f in table.items()}
        if hopper:  # wgmma: sm_90a
            table.update({name: (lambda bk, st, nwg: lambda: (flash_wgmma_kernel(d, bk, st, nwg), 64 * nwg, 128 * nwg,
                                                                wgmma_attention_shared_bytes(d, bk, st, nwg)))(*cfg)
                          for name, cfg in WGMMA_ATTN_BUILDS.items()})
        return {name: table[name]() for name in VARIANTS if name in table}

    def time_it(launch, sync):
        return common.time_it(launch, sync, torch, has_torch)

    def reference_np(q, k, v, causal, scale):
        s = np.einsum("bhid,bhjd->bhij", q.astype(np.float32), k.astype(np.float32)) * scale
        if causal:
            n = s.shape[-1]
            s = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p @ v.astype(np.float32)) / p.sum(-1, keepdims=True)

    g = np.random.default_rng(0)
    rows = []
    t_start = time.time()
    print(f"device: {torch.cuda.get_device_name() if has_torch else 'simulator' if SIM else '?'}; reps {REPS}; "
          f"variants {','.join(VARIANTS)}", flush=True)
    print(f"{'shape (B,H,S,D)':>20s} {'causal':6s} {'kernel':9s} {'us':>9s} {'TFLOP/s':>8s} {'x torch':>7s} {'rel err':>8s}",
          flush=True)
    for nb, h, s, d, causal in SHAPES:
        scale = 1 / math.sqrt(d)
        flops = 4 * nb * h * s * s * d * (0.5 if causal else 1.0)
        shape_s = f"({nb},{h},{s},{d})"
        if has_torch:
            gen = torch.Generator(device="cuda").manual_seed(0)
            tq, tk, tv = (torch.randn((nb, h, s, d), device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
            sdpa = torch.nn.functional.scaled_dot_product_attention
            ref = sdpa(tq.float(), tk.float(), tv.float(), is_causal=causal)
            ref_max = float(ref.abs().max())
            tf = lambda: sdpa(tq, tk, tv, is_causal=causal)  # noqa: E731
            t_torch = time_it(tf, torch.cuda.synchronize)
            err_t = float((tf().float() - ref).abs().max()) / ref_max
            row = {"shape": [nb, h, s, d], "causal": causal, "kernel": "torch", "us": t_torch,
                   "tflops": flops / t_torch / 1e6, "x_torch": 1.0, "rel_err": err_t}
            rows.append(row)
            print(f"{shape_s:>20s} {str(causal):6s} {'torch':9s} {t_torch:9.1f} {row['tflops']:8.1f} {1.0:7.2f} "
                  f"{err_t:8.1e}", flush=True)
            qd, kd, vd = cuda.as_cuda_array(tq), cuda.as_cuda_array(tk), cuda.as_cuda_array(tv)
        else:
            q_h, k_h, v_h = ((g.standard_normal((nb, h, s, d))).astype(np.float16) for _ in range(3))
            ref_np = reference_np(q_h, k_h, v_h, causal, scale)
            ref_max = float(np.abs(ref_np).max())
            t_torch = None
            qd, kd, vd = cuda.to_device(q_h), cuda.to_device(k_h), cuda.to_device(v_h)
        qw, kw, vw = words(qd), words(kd), words(vd)
        lse = cuda.to_device(np.zeros(1, np.float16))
        for name, (kern, bq, threads, dyn) in kernels(d).items():
            if has_torch:
                out_t = torch.full((nb * h * s * d,), float("nan"), device="cuda", dtype=torch.float16)
                out = cuda.as_cuda_array(out_t)
            else:
                out = cuda.to_device(np.full(nb * h * s * d, np.nan, np.float16))
            grid = max(1, (s + bq - 1) // bq) * nb * h
            args = (qw, kw, vw, nb, h, s, h, s, causal, scale, out, lse, False)

            def launch(kern=kern, grid=grid, threads=threads, args=args, dyn=dyn):
                launch_dynamic(kern, grid, threads, dyn, *args)

            try:
                t = time_it(launch, cuda.synchronize)
                if has_torch:
                    err = float((out_t.view(nb, h, s, d).float() - ref).abs().max()) / ref_max
                else:
                    got = out.copy_to_host().reshape(nb, h, s, d).astype(np.float32)
                    err = float(np.abs(got - ref_np).max()) / ref_max if np.isfinite(got).all() else float("nan")
            except Exception as exc:  # noqa: BLE001 - one kernel failing must not lose the others' rows
                print(f"{shape_s:>20s} {str(causal):6s} {name:9s} FAILED {type(exc).__name__}: {str(exc)[:300]}",
                      flush=True)
                rows.append({"shape": [nb, h, s, d], "causal": causal, "kernel": name, "us": None,
                             "rel_err": float("nan"), "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                continue
            row = {"shape": [nb, h, s, d], "causal": causal, "kernel": name, "us": t, "rel_err": err,
                   "tflops": None if t is None else flops / t / 1e6,
                   "x_torch": None if t is None or t_torch is None else t_torch / t}
            rows.append(row)
            ts = "-" if t is None else f"{t:.1f}"
            tfs = "-" if t is None else f"{row['tflops']:.1f}"
            xs = "-" if row["x_torch"] is None else f"{row['x_torch']:.2f}"
            print(f"{shape_s:>20s} {str(causal):6s} {name:9s} {ts:>9s} {tfs:>8s} {xs:>7s} {err:8.1e}", flush=True)
            if not err <= TOL:
                print(f"   ^ WRONG: relative error {err} > {TOL}", flush=True)
        if has_torch:
            del tq, tk, tv, ref
            torch.cuda.empty_cache()
    print(f"total {time.time() - t_start:.1f} s", flush=True)
    common.emit(rows, "gpu_probe_attention")
    bad = [r for r in rows if not r["rel_err"] <= TOL]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
