"""Peers of moe_ffn (see bench/peer_ops/__init__.py), and the baseline the issue measures it
against: every one loops over the experts, gathers each expert's tokens and runs its FFN on
them (what a framework without a grouped kernel does).

    NUMPY     the loop in numpy: x_e @ w.T per projection, np.add.at into the output;
    TORCH     Hugging Face's MixtralSparseMoeBlock loop (torch.where over the one-hot expert
              mask, F.linear, index_add_);
    baseline  the same loop on this project's own ops: dispatch.linear for the three
              projections, dispatch.swiglu / geglu for act(g) * u.

    python -m bench.peer_ops.moe [--mixtral] [--rounds N] [--only TEXT]

prints interleaved medians (bench.timing) of dispatch.moe_ffn, the baseline and the peers at
the benchmark shapes (bench/cases/moe.py; --mixtral adds the 5.6 GB Mixtral-8x7B cases), and
at T = 1 two estimates of the floor of a decode step, the time to read the chosen experts'
weights once: a parallel sum over them on all threads (timed beside the others), and their
bytes over bench.roofline's best copy bandwidth.  (Run as a module, Python warns that
bench.peer_ops imported this module before running it: harmless.)
"""
import numpy as np

from ..peers import _ACT
from .weight_only import as_words, read_all


def _routes(indices, num_experts):
    """(expert, tokens, slots) for every expert that receives a token."""
    for e in range(num_experts):
        tok, slot = np.nonzero(indices == e)
        if tok.size:
            yield e, tok, slot


def _numpy_moe(i):
    x, w, idx = i["x"], i["weights"], i["indices"]
    act = _ACT[i.get("activation", "silu")]
    out = np.zeros_like(x)
    for e, tok, slot in _routes(idx, i["w_gate"].shape[0]):
        xe = x[tok]
        h = act(xe @ i["w_gate"][e].T) * (xe @ i["w_up"][e].T)
        np.add.at(out, tok, (h @ i["w_down"][e].T) * w[tok, slot, None])
    return out


def _torch_moe(t, torch):
    F = torch.nn.functional
    act = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[
        t.get("activation", "silu")]
    x, w, idx = t["x"], t["weights"], t["indices"].long()
    num_experts = t["w_gate"].shape[0]
    out = torch.zeros_like(x)
    mask = F.one_hot(idx, num_classes=num_experts).permute(2, 1, 0)
    for e in range(num_experts):
        slot, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        xe = x[tok]
        h = act(F.linear(xe, t["w_gate"][e])) * F.linear(xe, t["w_up"][e])
        out.index_add_(0, tok, F.linear(h, t["w_down"][e]) * w[tok, slot, None])
    return out


def baseline(x, weights, indices, w_gate, w_up, w_down, activation="silu"):
    """moe_ffn as a per-expert loop of dispatch.linear calls: gather the expert's tokens with
    numpy, gate and up projections, act(g) * u (dispatch.swiglu / geglu), down projection,
    scale by the routing weights, np.add.at into the output."""
    import dispatch

    if activation == "silu":
        gated = dispatch.swiglu
    else:
        def gated(g, u):
            return dispatch.geglu(g, u, approximate="tanh" if activation == "gelu_tanh" else "none")
    out = np.zeros_like(x)
    for e, tok, slot in _routes(indices, w_gate.shape[0]):
        xe = x[tok]
        h = gated(dispatch.linear(xe, w_gate[e]), dispatch.linear(xe, w_up[e]))
        np.add.at(out, tok, dispatch.linear(h, w_down[e]) * weights[tok, slot, None])
    return out


NUMPY = {"moe_ffn": _numpy_moe}
TORCH = {"moe_ffn": _torch_moe}


def weight_read_floor(inputs):
    """A callable reading the weights of each expert the call routes to, once."""
    experts = np.unique(inputs["indices"])
    words = [as_words(m[e]) for e in experts for m in (inputs["w_gate"], inputs["w_up"], inputs["w_down"])]
    return lambda: [read_all(w) for w in words]


def _main(argv=None):
    import argparse

    import dispatch
    from bench import cases as C
    from bench import peers as P
    from bench import timing

    ap = argparse.ArgumentParser(prog="python -m bench.peer_ops.moe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixtral", action="store_true", help="add the Mixtral-8x7B cases (5.6 GB of weights)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default="", help="only the cases whose name contains this text (e.g. 'T=64')")
    a = ap.parse_args(argv)
    from bench import roofline

    copy = roofline.bandwidth_ceiling()
    print(f"machine memory bandwidth (bench.roofline, {copy['what']}): best {copy['best_gbs']:.1f} GB/s, "
          f"median {copy['median_gbs']:.1f} GB/s")
    rng = np.random.default_rng(0)
    for case in C.cases(["moe_ffn"]):
        if ("mixtral" in case.name and not a.mixtral) or a.only not in case.name:
            continue
        inputs = case.inputs(rng)
        args, kwargs = case.call_args(inputs)
        cands = {"moe_ffn": lambda: dispatch.moe_ffn(*args, **kwargs),
                 "baseline (dispatch.linear loop)": lambda: baseline(*args, **kwargs)}
        library = {"moe_ffn": "numba", "baseline (dispatch.linear loop)": "numba+blas"}
        for peer in ("numpy", "torch"):
            try:
                cands[peer], _ = P.prepare(peer, case, inputs)
                library[peer] = peer
            except P.Unavailable as exc:
                print(f"  {peer}: {exc}")
        if inputs["x"].shape[0] == 1:
            cands["floor: read the chosen experts' weights"] = weight_read_floor(inputs)
            library["floor: read the chosen experts' weights"] = "numba"
            weight_bytes = sum(m[e].nbytes for e in np.unique(inputs["indices"])
                               for m in (inputs["w_gate"], inputs["w_up"], inputs["w_down"]))
            print(f"  those weights ({weight_bytes / 1e6:.0f} MB) at bench.roofline's best bandwidth: "
                  f"{weight_bytes / copy['best_gbs'] / 1e6:.2f} ms")
        ref = cands["moe_ffn"]()
        for name in ("baseline (dispatch.linear loop)", "numpy"):
            got = cands[name]()
            err = np.abs(got - ref).max() / np.abs(ref).max()
            print(f"  {name} vs moe_ffn: max relative difference {err:.1e}")
        st = timing.interleaved(cands, rounds=a.rounds, warmup=1, batch_s=0.05, library=library)
        ours = st["moe_ffn"].median
        nbytes = dispatch.registry.OPS["moe_ffn"].bytes(dispatch.registry.OPS["moe_ffn"].describe(*args, **kwargs))
        print(f"{case.id} ({case.label}), {a.rounds} interleaved rounds, medians:")
        for name, s in st.items():
            print(f"  {name:42s} {s.median * 1e3:9.2f} ms  (spread {s.spread:.2f})  {s.median / ours:5.2f}x "
                  f"moe_ffn's time  {nbytes / s.median / 1e9:5.1f} GB/s of the call's bytes")


if __name__ == "__main__":
    from bench.peer_ops import moe  # the package's module (bench.peer_ops imports it before this runs)

    moe._main()
