"""Model-level row: a MiniLM-L6-sized BERT encoder forward through our ops vs PyTorch eager.

    python -m bench.model [--rounds N] [--processes P] [--json PATH]

The encoder (all-MiniLM-L6-v2's shapes: 6 post-LN layers, hidden 384, 12 heads of 32,
FFN 1536 with exact GELU) runs on a batch of 16 sequences of 198 tokens with a padding
mask (the last sequences shorter), float32, random weights from a fixed seed.  Each layer:

    qkv = linear(x, Wqkv, bqkv)             (16*198, 1152)
    a   = attention(q, k, v, mask=pad)      (16, 12, 198, 32)
    h   = layer_norm(linear(a, Wo, bo), residual=x)
    x   = layer_norm(linear(gelu(linear(h, W1, b1)), W2, b2), residual=h)

PyTorch runs the same forward with torch.nn.functional (linear, scaled_dot_product_attention,
layer_norm, gelu) in a process of its own (see kernels_cpu/runtime.py on why libraries
sharing a process must be measured apart); our forward runs in another, P times each,
alternating (torch, ours, ours, torch, ...).  Each process times `rounds` forwards after
two warm-up forwards and returns its output, so the two are compared (max relative error
normwise); a side's time is the median over all its forwards.  Our forward writes the
attention output through the transposed view of a (B, S, H, D) buffer, which the output
projection then reads as (B*S, H) with no transpose copy.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from . import ROOT, timing, tool_parser, write_json

B, S, H, HEADS, FFN, LAYERS = 16, 198, 384, 12, 1536, 6
EPS = 1e-12  # BERT's layer-norm epsilon


def weights(seed=0):
    """{name: float32 array} for the 6 layers, and the input x and the padding mask."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=None):
        scale = (1.0 / np.sqrt(shape[-1])) if scale is None else scale
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    p = {"x": w(B, S, H, scale=1.0)}
    lengths = np.full(B, S)
    lengths[B // 2:] = rng.integers(S // 4, S, B - B // 2)  # half the batch padded
    p["mask"] = (np.arange(S)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S) True = attend
    for i in range(LAYERS):
        p[f"{i}.wqkv"], p[f"{i}.bqkv"] = w(3 * H, H), w(3 * H, scale=0.02)
        p[f"{i}.wo"], p[f"{i}.bo"] = w(H, H), w(H, scale=0.02)
        p[f"{i}.w1"], p[f"{i}.b1"] = w(FFN, H), w(FFN, scale=0.02)
        p[f"{i}.w2"], p[f"{i}.b2"] = w(H, FFN), w(H, scale=0.02)
        for n in ("ln1", "ln2"):
            p[f"{i}.{n}.g"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
            p[f"{i}.{n}.b"] = w(H, scale=0.1)
    return p


def forward_ours(p):
    import dispatch as d
    x = p["x"].reshape(B * S, H)
    for i in range(LAYERS):
        qkv = d.linear(x, p[f"{i}.wqkv"], p[f"{i}.bqkv"])
        q, k, v = (qkv.reshape(B, S, 3, HEADS, H // HEADS)[:, :, j].transpose(0, 2, 1, 3) for j in range(3))
        a = np.empty((B, S, HEADS, H // HEADS), np.float32)  # written through its transposed view
        d.attention(q, k, v, mask=p["mask"], out=a.transpose(0, 2, 1, 3))
        a = a.reshape(B * S, H)
        h, _ = d.layer_norm(d.linear(a, p[f"{i}.wo"], p[f"{i}.bo"]), p[f"{i}.ln1.g"], p[f"{i}.ln1.b"],
                            eps=EPS, residual=x)
        f = d.linear(h, p[f"{i}.w1"], p[f"{i}.b1"], activation="gelu")
        x, _ = d.layer_norm(d.linear(f, p[f"{i}.w2"], p[f"{i}.b2"]), p[f"{i}.ln2.g"], p[f"{i}.ln2.b"],
                            eps=EPS, residual=h)
    return x.reshape(B, S, H)


def forward_torch(p):
    import torch
    import torch.nn.functional as F
    t = {k: torch.from_numpy(v) for k, v in p.items()}
    with torch.inference_mode():
        x = t["x"].reshape(B * S, H)
        for i in range(LAYERS):
            qkv = F.linear(x, t[f"{i}.wqkv"], t[f"{i}.bqkv"])
            q, k, v = (qkv.reshape(B, S, 3, HEADS, H // HEADS)[:, :, j].transpose(1, 2) for j in range(3))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=t["mask"])
            a = a.transpose(1, 2).reshape(B * S, H)
            h = F.layer_norm(F.linear(a, t[f"{i}.wo"], t[f"{i}.bo"]) + x, (H,), t[f"{i}.ln1.g"], t[f"{i}.ln1.b"], EPS)
            f = F.gelu(F.linear(h, t[f"{i}.w1"], t[f"{i}.b1"]))
            x = F.layer_norm(F.linear(f, t[f"{i}.w2"], t[f"{i}.b2"]) + h, (H,), t[f"{i}.ln2.g"], t[f"{i}.ln2.b"], EPS)
        return x.reshape(B, S, H).numpy()


FORWARDS = {"ours": forward_ours, "torch": forward_torch}


def _child(which, out, rounds):
    p = weights()
    fwd = FORWARDS[which]
    t0 = timing.clock()
    y = fwd(p)
    first = timing.clock() - t0
    fwd(p)
    times = []
    for _ in range(rounds):
        t0 = timing.clock()
        y = fwd(p)
        times.append(timing.clock() - t0)
    np.save(out + ".npy", y)
    with open(out, "w") as f:
        json.dump({"first_s": first, "stats": timing.summarize(times).as_dict(), "times_s": times}, f)


def _one_process(which, rounds):
    """One child process of `which`: ({first_s, stats}, output) or (None, error line)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, which)
        r = subprocess.run([sys.executable, "-m", "bench.model", "--child", which, "--out", out,
                            "--rounds", str(rounds)], cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            return None, (r.stderr.strip().splitlines() or ["?"])[-1]
        with open(out) as f:
            return json.load(f), np.load(out + ".npy")


def run(rounds=7, progress=None, processes=3) -> dict:
    """Both forwards, each in processes of its own, alternating torch / ours / ours /
    torch ... `processes` times per side: this shared 2-core machine drifts by 20-30%
    within minutes (one torch-then-ours pair read 1.16x, the next 0.85x), so a single
    pair measures the drift more than the code.  Each side's time is the median over all
    its forwards; the ratio is that of the two medians.  Returns the model row (None
    values where a side could not run, e.g. PyTorch not installed)."""
    res = {"model": f"MiniLM-L6 encoder forward B={B} S={S} H={H}", "flops": flops(), "processes": processes}
    outs, times, firsts, per_process = {}, {"torch": [], "ours": []}, {}, {"torch": [], "ours": []}
    order = []
    for i in range(processes):
        order += ["torch", "ours"] if i % 2 == 0 else ["ours", "torch"]
    for which in order:
        if f"{which}_error" in res:
            continue
        got, y = _one_process(which, rounds)
        if got is None:
            res[which] = None
            res[f"{which}_error"] = y
            continue
        times[which] += got["times_s"]
        per_process[which].append(got["stats"]["median_s"])
        firsts.setdefault(which, got["first_s"])
        outs[which] = y
        if progress is not None:
            progress(f"model forward: {which} (process {len(per_process[which])} of {processes})")
    for which in ("torch", "ours"):
        if times[which]:
            res[which] = {"first_s": firsts[which], "stats": timing.summarize(times[which]).as_dict(),
                          "process_medians_s": per_process[which]}
    if len(outs) == 2:
        a, b = outs["ours"].astype(np.float64), outs["torch"].astype(np.float64)
        res["max_rel_err_vs_torch"] = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
    if res.get("ours") and res.get("torch"):
        res["speedup_vs_torch"] = res["torch"]["stats"]["median_s"] / res["ours"]["stats"]["median_s"]
    return res


def flops() -> float:
    """Multiply-adds x2 of the linears and the attention (masking not subtracted)."""
    T = B * S
    lin = 2 * T * H * (3 * H + H + 2 * FFN)
    attn = 2 * 2 * B * HEADS * S * S * (H // HEADS)
    return float(LAYERS * (lin + attn))


def format_row(r) -> str:
    def t(side):
        s = r.get(side)
        return "n/a" if not s else f"{s['stats']['median_s'] * 1e3:.1f} ms (first call {s['first_s']:.2f} s)"
    lines = [f"{r['model']}: ours {t('ours')}, PyTorch eager {t('torch')}"
             f" (medians over {r.get('processes', 1)} alternating processes per side)"]
    if "speedup_vs_torch" in r:
        ours = r["ours"]["stats"]["median_s"]
        lines.append(f"  ratio to PyTorch {r['speedup_vs_torch']:.2f}x ({r['flops'] / ours / 1e9:.0f} GFLOP/s ours), "
                     f"max relative error vs PyTorch {r.get('max_rel_err_vs_torch', float('nan')):.1e}")
    for side in ("ours", "torch"):
        if f"{side}_error" in r:
            lines.append(f"  {side} failed: {r[side + '_error']}")
    return "\n".join(lines)



def main(argv=None):
    p = tool_parser("python -m bench.model", __doc__, 7, FORWARDS)
    p.add_argument("--processes", type=int, default=3, help="child processes per side, alternating (default 3)")
    a = p.parse_args(argv)
    if a.child:
        _child(a.child, a.out, a.rounds)
        return 0
    r = run(a.rounds, processes=a.processes)
    print(format_row(r))
    if a.json:
        write_json(a.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
