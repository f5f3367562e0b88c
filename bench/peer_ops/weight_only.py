"""Peers of linear with a low-precision weight (dispatch/ops/weight_only.py), and the
decode-bandwidth benchmark of issue #12.

Peers (what a user without a weight-only kernel writes):
    numpy   convert the weight to float32, then x @ w.T (+ bias, activation): the
            conversion writes a float32 copy of the whole weight on every call;
    torch   F.linear with a bfloat16 (or float16) weight: x cast to the weight's dtype
            (PyTorch's linear needs one dtype), the product in that dtype on its CPU kernels,
            cast back; an int8 weight is dequantized to float32 first (no weight-only int8
            linear in eager PyTorch on the CPU).
They are not entries of this module's NUMPY / TORCH tables: those are keyed by op, and
linear's peers live in bench/peers.py, whose numpy linear calls `numpy_linear` below for a
low-precision weight and whose PyTorch inputs go through `to_torch` (its linear casts x to
the weight's dtype), so the report's linear rows take these weights too.

    python -m bench.peer_ops.weight_only [--rounds N] [--m 1] [--k 4096] [--n 11008] [--copies-mib 1200]

prints interleaved medians (bench.timing) of dispatch.linear with a float32, bfloat16,
float16 and int8 per-channel weight, the peers above, and a numpy copy of 256 MiB and of
1 GiB (bytes read + written over the time: the copy bandwidth), the floor of each weight
format (its bytes / the copy bandwidth), a prange sum over each low-precision weight's
bytes (the read floor: streaming the same bytes with no arithmetic, for M <= 8), and the
accuracy against the float32 linear on normal weights and on normal weights with outliers
(bench/accuracy.py's distributions).
Each candidate cycles through enough copies of its weight (--copies-mib in all) that no
call finds its weight in the last-level cache (480 MiB reported on the Xeon host of
2026-11-25): a decode step reads every layer's weights once, from DRAM.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit, prange

from ..peers import _ACT


def dequantize(weight, dtype=np.float32):
    """A low-precision linear weight (float16, ml_dtypes.bfloat16, int8 QuantizedArray) as a
    dtype array (the numpy peer's conversion)."""
    if hasattr(weight, "scale") and hasattr(weight, "values"):
        q = np.asarray(weight.values, np.float32)
        sc, zp = np.asarray(weight.scale, np.float32), np.asarray(weight.zero_point, np.float32)
        if weight.axis is not None:
            shape = [1] * q.ndim
            shape[weight.axis] = -1
            sc, zp = sc.reshape(shape), zp.reshape(shape)
        return ((q - zp) * sc).astype(dtype, copy=False)
    return np.asarray(weight).astype(dtype)


def numpy_linear(x, weight, bias=None, activation=None):
    """bfloat16 x (numpy has no bfloat16 arithmetic of its own): computed in float32, the
    result cast back to bfloat16."""
    dt = np.dtype(np.float32) if x.dtype.name == "bfloat16" else x.dtype
    y = x.astype(dt, copy=False) @ dequantize(weight, dt).T
    if bias is not None:
        y = y + bias.astype(dt, copy=False)
    return _ACT[activation](y).astype(x.dtype, copy=False)


def torch_linear(torch):
    """f(x, weight) -> numpy: the PyTorch peer (see the module docstring); the weight is
    converted to a tensor once, outside the timing (by the returned prepare)."""
    F = torch.nn.functional

    def prepare(weight):
        if hasattr(weight, "scale"):
            return torch.from_numpy(dequantize(weight)), torch.float32
        if weight.dtype.name == "bfloat16":
            bits = np.ascontiguousarray(weight).view(np.int16)
            return torch.from_numpy(bits).view(torch.bfloat16), torch.bfloat16
        return torch.from_numpy(np.ascontiguousarray(weight)), torch.from_numpy(np.zeros(1, weight.dtype)).dtype

    def run(xt, wt, dt):
        with torch.inference_mode():
            return F.linear(xt.to(dt), wt).float()

    return prepare, run


@njit(parallel=True, cache=True)
def read_all(words):
    """Sum of a weight's bytes as uint64 words on all threads: the time to stream the weight
    once from memory with almost no arithmetic (the read floor, timed beside the kernels;
    bench.peer_ops.moe's floor too)."""
    s = np.uint64(0)
    for i in prange(words.shape[0]):
        s += words[i]
    return s


def to_torch(v, torch):
    """A case input as bench/peers.py hands it to PyTorch: numpy arrays through
    torch.from_numpy, a bfloat16 array as a torch.bfloat16 tensor on the same memory;
    anything else (a QuantizedArray included: dynamic_quant_linear's peer builds a
    torch.ao quantized Linear from it, linear's dequantizes it, torch_weight) as it is."""
    if isinstance(v, np.ndarray):
        if v.dtype.name == "bfloat16":
            return torch.from_numpy(np.ascontiguousarray(v).view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(v)
    return v


def torch_weight(w, torch):
    """A linear weight for eager PyTorch: a QuantizedArray dequantized to float32 (eager
    PyTorch has no int8 weight-only linear on the CPU), made once and cached on it so the
    timed calls do not pay for it; a tensor as it is."""
    if hasattr(w, "scale") and hasattr(w, "values"):
        return w.cached(("peer-torch-dequantized",), lambda: torch.from_numpy(dequantize(w)))
    return w


def as_words(w):
    """A weight's bytes (a QuantizedArray's values) as the uint64 words read_all streams (a
    tail of fewer than 8 bytes left out)."""
    v = w.values if hasattr(w, "values") else w
    return np.ascontiguousarray(v).reshape(-1).view(np.uint8)[: v.nbytes // 8 * 8].view(np.uint64)


def _weights(w32, fmt):
    from dispatch.ops.weight_only import low_precision_weight

    return w32 if fmt == "float32" else low_precision_weight(w32, fmt)


def _nbytes(w):
    return w.values.nbytes if hasattr(w, "values") else w.nbytes


def main(argv=None):
    import dispatch
    from bench import accuracy, timing

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=11008)
    ap.add_argument("--copies-mib", type=int, default=1200, help="total MiB of weight copies per format")
    ap.add_argument("--formats", default="float32,bfloat16,float16,int8")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args(argv)
    m, k, n = args.m, args.k, args.n
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w32 = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    formats = args.formats.split(",")
    cands, lib, nbytes = {}, {}, {}

    def cycler(fn, items):
        state = [0]

        def call():
            i = state[0]
            state[0] = (i + 1) % len(items)
            return fn(items[i])
        return call

    pool = {}
    for fmt in formats:
        one = _weights(w32, fmt)
        copies = max(1, -(-(args.copies_mib << 20) // _nbytes(one)))
        pool[fmt] = [one] + [_weights(w32 + np.float32(1e-3 * (i + 1)), fmt) for i in range(copies - 1)]
        nbytes[fmt] = _nbytes(one)
        cands[f"ours {fmt}"] = cycler(lambda w: dispatch.linear(x, w), pool[fmt])
        # a float32 decode product runs on OpenBLAS (the dense rule): its spinning threads
        # must not share the cores with the next numba candidate (bench.timing pauses
        # between libraries)
        lib[f"ours {fmt}"] = "numba" if fmt != "float32" else str(dispatch.explain("linear", x, one).chosen)
        if fmt != "float32" and m <= 8:
            words = [as_words(w) for w in pool[fmt]]
            read_all(words[0])
            cands[f"read {fmt} weight (prange sum)"] = cycler(read_all, words)
            lib[f"read {fmt} weight (prange sum)"] = "numba"
    if not args.no_peers:
        cands["numpy float32 (OpenBLAS)"] = cycler(lambda w: x @ w.T, pool.get("float32", [w32]))
        lib["numpy float32 (OpenBLAS)"] = "numpy"
        for fmt in formats:
            if fmt != "float32":
                cands[f"numpy {fmt} convert+matmul"] = cycler(lambda w: numpy_linear(x, w), pool[fmt])
                lib[f"numpy {fmt} convert+matmul"] = "numpy"
        try:
            import torch

            torch.set_num_threads(2)
            prep, trun = torch_linear(torch)
            xt = torch.from_numpy(x)
            for fmt in ("bfloat16", "float16"):
                if fmt in formats:
                    tw = [prep(w) for w in pool[fmt]]
                    cands[f"torch {fmt} F.linear"] = cycler(lambda p: trun(xt, *p), tw)
                    lib[f"torch {fmt} F.linear"] = "torch"
        except ImportError:
            print("torch not importable: no torch peer")
    src = {mib: np.ones(mib << 18, np.float32) for mib in (256, 1024)}
    dst = {mib: np.empty_like(a) for mib, a in src.items()}
    for mib in src:
        cands[f"numpy copy {mib} MiB"] = (lambda s, d: lambda: np.copyto(d, s))(src[mib], dst[mib])
        lib[f"numpy copy {mib} MiB"] = "numpy"
    load = open("/proc/loadavg").read().split()[:3]
    t0 = time.time()
    stats = timing.interleaved(cands, rounds=args.rounds, warmup=1, batch_s=0.05, pause_s=0.2, library=lib)
    print(f"linear M={m} K={k} N={n}; {args.rounds} interleaved rounds, {time.time() - t0:.0f} s; load average "
          f"before {' '.join(load)}, after {' '.join(open('/proc/loadavg').read().split()[:3])}")
    bw = {mib: 2 * (mib << 20) / stats[f"numpy copy {mib} MiB"].median for mib in src}
    print(f"copy bandwidth (read + write): 256 MiB {bw[256] / 1e9:.1f} GB/s, 1 GiB {bw[1024] / 1e9:.1f} GB/s")
    ref32 = stats.get("ours float32")
    for name, st in stats.items():
        line = f"  {name:34s} median {st.median * 1e3:8.3f} ms  (min {st.min * 1e3:.3f}, max {st.max * 1e3:.3f})"
        fmt = name.split()[1] if name.startswith("ours ") else None
        read = stats.get(f"read {fmt} weight (prange sum)")
        if read is not None:
            line += f"  / read floor {st.median / read.median:.2f}"
        if fmt in nbytes:
            floor = {mib: nbytes[fmt] / b for mib, b in bw.items()}
            line += (f"  {nbytes[fmt] / st.median / 1e9:5.1f} GB/s of weight; / floor(256 MiB copy) "
                     f"{st.median / floor[256]:.2f}, / floor(1 GiB copy) {st.median / floor[1024]:.2f}")
            if ref32 is not None and fmt != "float32":
                line += f"; fp32 / this {ref32.median / st.median:.2f}x"
        print(line)
    print("accuracy vs the float32 linear (normwise max / mean relative error):")
    arng = np.random.default_rng(1)
    for dist in accuracy.DISTRIBUTIONS:
        d = accuracy.draw({"x": (max(m, 4), k), "weight": (min(n, 2048), k)}, arng, dist)
        d["weight"] /= np.float32(np.sqrt(k))
        want = dispatch.linear(d["x"], d["weight"])
        for fmt in formats:
            if fmt != "float32":
                e = accuracy.errors(dispatch.linear(d["x"], _weights(d["weight"], fmt)), want)
                print(f"  {dist:9s} {fmt:9s} max {e['max_rel']:.2e} mean {e['mean_rel']:.2e}")


if __name__ == "__main__":
    main()
