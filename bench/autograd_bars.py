"""Forward + backward through dispatch.autograd against PyTorch's autograd, side by side.

    python -m bench.autograd_bars [THREADS] [CASE-SUBSTRING ...] [--breakdown]

The issue #13 bars: layer_norm, rms_norm, softmax, cross_entropy (GPT-2 vocabulary),
attention (1x12x512x64, causal), linear + gelu (BERT-base FFN-up).  Each round builds
leaf tensors, runs the op and .backward(upstream); ours and PyTorch's are interleaved
(bench/timing.py), medians of 15 rounds.  THREADS sets numba's and torch's thread counts.
The ratio is PyTorch's time over ours (above 1: ours faster); "rounds" gives the quartiles
of the same ratio round by round (timing.paired_ratio): a bar is met robustly only where
both sit above 1.

--breakdown also says where our round's time goes, from a loop of rounds with every
registered dispatch op timed where dispatch.autograd calls it (median per round, each op's
calls together; "run": of that, in the implementation's run, the kernel and the Python
that makes its arrays, the rest of the call being dispatch's conversions, validation and
selection), the rest of the round being PyTorch's autograd machinery and our Python around
the calls; beside it, a torch.autograd.Function that does nothing (empty outputs and
gradients) on the same leaf tensors: the machinery's own cost, which PyTorch's native ops
pay too.
"""
import sys, time, numpy as np, torch, numba
import dispatch, dispatch.autograd as nka
from dispatch import registry
from bench import timing


class _Nothing(torch.autograd.Function):
    """Empty outputs and gradients: what a Function round costs with no work in it."""

    @staticmethod
    def forward(ctx, shape, *inputs):
        ctx.shapes = [a.shape for a in inputs]
        return inputs[0].new_empty(shape)

    @staticmethod
    def backward(ctx, g):
        return (None, *(g.new_empty(s) for s in ctx.shapes))


def _timed(fn, spent, key):
    def timed(*a, **k):
        t = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            spent[key] = spent.get(key, 0) + time.perf_counter_ns() - t
    return timed


def breakdown(run, rounds=1000):
    """(median round, {op: median per round}, {op: median per round in its implementation's
    run}) of run() in a loop, with every registered dispatch op timed where dispatch.autograd
    calls it (dispatch.<op>, looked up per call), and inside it the chosen implementation's
    run (the kernel and the Python around it: arrays made, the kernel called); the
    difference is dispatch's own front (conversions, validation, selection)."""
    spent, runs, originals, impl_runs = {}, {}, {}, []
    for name in registry.OPS:
        fn = getattr(dispatch, name, None)
        if fn is None:
            continue
        originals[name] = fn
        setattr(dispatch, name, _timed(fn, spent, name))
        for impl in registry.implementations(name, "cpu"):
            impl_runs.append((impl, impl.run))
            impl.run = _timed(impl.run, runs, name)
    try:
        for _ in range(rounds // 10):
            run()
        totals, per_op, per_run = [], {}, {}
        for _ in range(rounds):
            spent.clear()
            runs.clear()
            t = time.perf_counter_ns()
            run()
            totals.append(time.perf_counter_ns() - t)
            for k, v in spent.items():
                per_op.setdefault(k, []).append(v)
            for k, v in runs.items():
                per_run.setdefault(k, []).append(v)
    finally:
        for name, fn in originals.items():
            setattr(dispatch, name, fn)
        for impl, fn in impl_runs:
            impl.run = fn
    med = lambda d: {k: np.median(v) / 1e9 for k, v in d.items()}  # noqa: E731
    return np.median(totals) / 1e9, med(per_op), med(per_run)


def main():
    F = torch.nn.functional
    args = [a for a in sys.argv[1:] if a != "--breakdown"]
    show_breakdown = len(args) < len(sys.argv) - 1
    threads = int(args[0]) if args else 2
    which = args[1:] or None
    torch.set_num_threads(threads); numba.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    def R(*s): return torch.randn(*s, generator=g)
    cases = {}
    x = R(512, 768); w = R(768); b = R(768); gy = R(512, 768)
    cases["layer_norm 512x768"] = (lambda lib: (nka.layer_norm if lib == "ours" else (lambda x, w, b: F.layer_norm(x, (768,), w, b)))), [x, w, b], gy
    cases["rms_norm 512x768"] = (lambda lib: (nka.rms_norm if lib == "ours" else (lambda x, w: F.rms_norm(x, (768,), w, 1e-6)))), [x, w], gy
    xs = R(128, 50257); gs = R(128, 50257)
    cases["softmax 128x50257"] = (lambda lib: (nka.softmax if lib == "ours" else (lambda x: torch.softmax(x, -1)))), [xs], gs
    t = torch.randint(0, 50257, (512,), generator=g); lg = R(512, 50257)
    cases["cross_entropy 512x50257"] = (lambda lib: ((lambda z: nka.cross_entropy(z, t)) if lib == "ours" else (lambda z: F.cross_entropy(z, t)))), [lg], None
    q, k, v = R(1, 12, 512, 64), R(1, 12, 512, 64), R(1, 12, 512, 64); go = R(1, 12, 512, 64)
    cases["attention 1x12x512x64 causal"] = (lambda lib: ((lambda q, k, v: nka.attention(q, k, v, causal=True)) if lib == "ours" else (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)))), [q, k, v], go
    xl = R(128, 768); wl = R(3072, 768) / 28; bl = R(3072); gl = R(128, 3072)
    cases["linear+gelu 128x768x3072"] = (lambda lib: ((lambda x, w, b: nka.linear(x, w, b, activation="gelu")) if lib == "ours" else (lambda x, w, b: F.gelu(F.linear(x, w, b))))), [xl, wl, bl], gl
    def mk(fn, ins, up):
        def run():
            xs = [a.detach().requires_grad_() for a in ins]
            out = fn(*xs)
            if up is None: out.backward()
            else: out.backward(up)
            return xs[0].grad
        return run
    for name, (get, ins, up) in cases.items():
        if which and not any(w_ in name for w_ in which): continue
        c = {"ours": mk(get("ours"), ins, up), "torch": mk(get("torch"), ins, up)}
        for f in c.values(): f()
        st = timing.interleaved(c, rounds=15, warmup=2)
        o, p = st["ours"].median, st["torch"].median
        rr = timing.paired_ratio(st["torch"], st["ours"])
        print(f"{threads}T {name:32s} ours {o*1e3:8.3f} ms  torch {p*1e3:8.3f} ms  ratio {p/o:5.2f}x"
              f"  (rounds {rr['q25']:.2f}-{rr['q75']:.2f})", flush=True)
        if show_breakdown:
            total, per_op, per_run = breakdown(c["ours"])
            shape = () if up is None else tuple(up.shape)
            floor, _, _ = breakdown(mk(lambda *xs: _Nothing.apply(shape, *xs), ins, up))
            calls = sum(per_op.values())
            ops = ", ".join(f"{k} {v*1e6:.0f} (run {per_run.get(k, 0)*1e6:.0f})"
                            for k, v in sorted(per_op.items(), key=lambda kv: -kv[1]))
            print(f"    in a loop: ours {total*1e6:.0f} us = dispatch calls {calls*1e6:.0f} ({ops}) + the rest "
                  f"{(total - calls)*1e6:.0f}; a Function doing nothing on the same tensors: {floor*1e6:.0f} us",
                  flush=True)


if __name__ == "__main__":
    main()
