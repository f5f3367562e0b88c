"""Peers of matmul_int8 and dynamic_quant_linear (see bench/peer_ops/__init__.py), and the
issue #12 bars.

    NUMPY  matmul_int8: dequantize to float32, then a float32 matmul (what a numpy-only user
           writes); dynamic_quant_linear: the same per-row uint8 quantization of x, then the
           dequantized float32 product.
    TORCH  dynamic_quant_linear: torch.ao.nn.quantized.dynamic.Linear holding the per-channel
           int8 weight (packed once, cached on the QuantizedArray like ours; PyTorch
           quantizes x per tensor).
    ORT    matmul_int8: MatMulInteger (u8 x s8, the weight an initializer, so onnxruntime
           prepacks it) + Cast + Mul by the scales (+ bias, activation): onnxruntime's
           optimizer fuses these into MatMulIntegerToFloat; dynamic_quant_linear: the
           com.microsoft DynamicQuantizeMatMul contrib op (per-tensor uint8 x, per-column
           weight scales, bias) + activation.

    python -m bench.peer_ops.int8_linalg [--rounds N]

prints interleaved medians (bench.timing, 0.2 s pauses between libraries) of the bars at
128 x 768 x 768 and one decode row: matmul_int8 against our own float32 dispatch.matmul and
onnxruntime's prepacked MatMulInteger (int32 out, and with the float scaling), and
dynamic_quant_linear against dispatch.linear, DynamicQuantizeMatMul and PyTorch's dynamic
quantized Linear; then the accuracy of dynamic_quant_linear against the float32 linear on
normal data and on normal data with a few large outliers.
"""
import numpy as np

from ..peers import _ACT


def _dequant(q):
    v = np.asarray(q.values).astype(np.float32)
    s, z = q.scale, q.zero_point.astype(np.float32)
    if q.axis is not None:
        shape = [1] * q.ndim
        shape[q.axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return (v - z) * s


def _quant_rows(x):
    """dynamic_quant_linear's per-row uint8 quantization in float32 numpy: (q, scale, zp)."""
    f = np.float32
    lo = np.minimum(x.min(axis=-1), f(0))
    hi = np.maximum(x.max(axis=-1), f(0))
    scale = (hi - lo) / f(255)
    scale = np.where(scale > 0, scale, f(1)).astype(np.float32)
    zp = np.clip(np.rint(f(0) - lo / scale), 0, 255).astype(np.float32)
    q = np.clip(np.rint(x / scale[..., None]) + zp[..., None], 0, 255)
    return q, scale, zp


def _numpy_matmul_int8(i):
    y = _dequant(i["a_q"]) @ _dequant(i["b_q"])
    if i.get("bias") is not None:
        y = y + i["bias"]
    return _ACT[i.get("activation")](y)


def _numpy_dql(i):
    q, s, z = _quant_rows(i["x"])
    y = ((q - z[..., None]) * s[..., None]) @ _dequant(i["w_q"]).T
    if i.get("bias") is not None:
        y = y + i["bias"]
    return _ACT[i.get("activation")](y)


def _torch_linear(w_q, bias, torch):
    """torch.ao dynamic quantized Linear with w_q's int8 values and scales (made once per
    QuantizedArray and bias, cached on the QuantizedArray)."""
    def make():
        import torch.ao.nn.quantized.dynamic as nnqd

        n, k = w_q.shape
        vals = torch.from_numpy(np.ascontiguousarray(w_q.values))
        if w_q.axis is None:
            wq = torch._make_per_tensor_quantized_tensor(vals, float(w_q.scale), int(w_q.zero_point))
        else:
            wq = torch._make_per_channel_quantized_tensor(
                vals, torch.from_numpy(w_q.scale.astype(np.float64)),
                torch.from_numpy(w_q.zero_point.astype(np.int64)), 0)
        lin = nnqd.Linear(k, n, dtype=torch.qint8)
        lin.set_weight_bias(wq, None if bias is None else torch.from_numpy(np.asarray(bias)))
        return lin

    return w_q.cached(("peer-torch", id(bias)), make)


def _torch_dql(t, torch):
    F = torch.nn.functional
    act = {None: lambda y: y, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
           "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[t.get("activation")]
    lin = _torch_linear(t["w_q"], t.get("bias"), torch)
    return act(lin(t["x"]))


def _ort_scaled(g, y_int, a_q, b_q):
    """float32 scale_a * scale_b * y_int (Cast + Mul: onnxruntime fuses MatMulInteger with
    them into MatMulIntegerToFloat)."""
    y = g.op("Cast", y_int, to=1)
    if a_q.axis is None:
        y = g.op("Mul", y, g.const(np.asarray(b_q.scale * a_q.scale, np.float32)))
    else:
        y = g.op("Mul", g.op("Mul", y, g.const(a_q.scale.reshape(-1, 1))), g.const(np.asarray(b_q.scale)))
    return y


def _ort_matmul_int8(i, g):
    from ..peers import _ort_act

    a_q, b_q = i["a_q"], i["b_q"]
    if a_q.axis is not None and a_q.symmetric is False:
        from ..peers import Unavailable
        raise Unavailable("onnxruntime's MatMulInteger takes a scalar a zero point")
    ins = ["a", g.const(np.asarray(b_q.values), np.int8), g.const(a_q.zero_point.reshape(()), a_q.dtype)]
    if not b_q.symmetric:
        ins.append(g.const(b_q.zero_point, np.int8))
    y = _ort_scaled(g, g.op("MatMulInteger", *ins), a_q, b_q)
    if i.get("bias") is not None:
        y = g.op("Add", y, g.const(i["bias"]))
    return {"a": np.asarray(a_q.values)}, _ort_act(g, y, i.get("activation"))


def _ort_dql(i, g):
    from ..peers import _ort_act

    w_q = i["w_q"]
    if i["x"].ndim != 2:
        from ..peers import Unavailable
        raise Unavailable("onnxruntime peer of dynamic_quant_linear takes 2-D x only")
    n = w_q.shape[0]
    ins = ["x", g.const(np.ascontiguousarray(np.asarray(w_q.values).T), np.int8),
           g.const(np.broadcast_to(w_q.scale, (n,)).astype(np.float32))]
    ins.append(g.const(np.broadcast_to(w_q.zero_point, (n,)), np.int8) if not w_q.symmetric else "")
    if i.get("bias") is not None:
        ins.append(g.const(i["bias"]))
    y = g.op("DynamicQuantizeMatMul", *ins, domain="com.microsoft")
    return {"x": i["x"]}, _ort_act(g, y, i.get("activation"))


NUMPY = {"matmul_int8": _numpy_matmul_int8, "dynamic_quant_linear": _numpy_dql}
TORCH = {"dynamic_quant_linear": _torch_dql}
ORT = {"matmul_int8": _ort_matmul_int8, "dynamic_quant_linear": _ort_dql}


# ---- the issue #12 bars -------------------------------------------------------------------------

def _ort_session(model):
    import numba
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = numba.config.NUMBA_NUM_THREADS
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ort_int32_only(a_q, b_q):
    """A bare MatMulInteger (int32 out), the weight an initializer."""
    from ..peers import _Graph

    g = _Graph(np.int32)
    y = g.op("MatMulInteger", "a", g.const(np.asarray(b_q.values), np.int8),
             g.const(a_q.zero_point.reshape(()), a_q.dtype))
    sess = _ort_session(g.model({"a": np.asarray(a_q.values)}, y))
    feeds = {"a": np.ascontiguousarray(a_q.values)}
    return lambda: sess.run([y], feeds)[0]


def _ort_run(fn, inputs):
    from ..peers import _Graph

    g = _Graph(np.float32)
    feeds, y = fn(inputs, g)
    sess = _ort_session(g.model(feeds, y))
    feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
    return lambda: sess.run([y], feeds)[0]


def _quantize_weight(w):
    """Symmetric per-output-channel int8 of a float (N, K) weight ([-127, 127])."""
    from dispatch.quantized import QuantizedArray

    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / 127, 1).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return QuantizedArray(q, scale, None, axis=0)


def _accuracy(rng, torch):
    """dynamic_quant_linear (and PyTorch's per-tensor dynamic Linear) against the float32
    linear: (max |diff| / max |y|, mean |diff| / mean |y|) on 128 x 768 x 768."""
    import dispatch

    m, k, n = 128, 768, 768
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    w_q = _quantize_weight(w)
    rows = []
    for label in ("normal", "normal + outliers"):
        x = rng.standard_normal((m, k)).astype(np.float32)
        if label != "normal":  # a few large activations, as LLM hidden states have (6 columns of 20-60 sigma)
            cols = rng.choice(k, 6, replace=False)
            x[:, cols] *= rng.uniform(20, 60, size=6).astype(np.float32)
        y = dispatch.linear(x, w).astype(np.float64)
        outs = {"ours (per-row uint8 x)": dispatch.dynamic_quant_linear(x, w_q)}
        if torch is not None:
            outs["torch dynamic (per-tensor x)"] = _torch_dql({"x": torch.from_numpy(x), "w_q": w_q}, torch).numpy()
        for name, got in outs.items():
            d = np.abs(got.astype(np.float64) - y)
            rows.append((label, name, d.max() / np.abs(y).max(), d.mean() / np.abs(y).mean()))
    return rows


def _main():
    import argparse
    import time

    import dispatch
    from dispatch.ops.int8_linalg import _synthesize

    from .. import timing

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    try:
        import torch
        torch.set_num_threads(2)
    except Exception:  # noqa: BLE001
        torch = None
    rng = np.random.default_rng(0)
    print(f"{time.strftime('%Y-%m-%d %H:%M')} host load {open('/proc/loadavg').read().split()[:3]}")
    for m, k, n in ((128, 768, 768), (1, 768, 768)):
        i = _synthesize({"a_q": (m, k), "b_q": (k, n)}, {}, rng, np.float32)
        a_q, b_q = i["a_q"], i["b_q"]
        af = _dequant(a_q)
        bf = _dequant(b_q)
        x = rng.standard_normal((m, k)).astype(np.float32)
        w_q = _synthesize({"w_q": (n, k)}, {}, rng, np.float32)["w_q"]
        wf = _dequant(w_q)
        bias = rng.standard_normal(n).astype(np.float32)
        cands = {
            "matmul_int8": lambda: dispatch.matmul_int8(a_q, b_q),
            "matmul_int8 [avx2 path]": lambda: dispatch.matmul_int8(a_q, b_q),
            "fp32 dispatch.matmul": lambda: dispatch.matmul(af, bf),
            "fp32 dispatch.matmul [cpu-gemm]": lambda: dispatch.matmul(af, bf),
            "ort MatMulInteger (int32 out)": _ort_int32_only(a_q, b_q),
            "ort MatMulInteger+scale (float out)": _ort_run(_ort_matmul_int8, {"a_q": a_q, "b_q": b_q}),
            "dynamic_quant_linear": lambda: dispatch.dynamic_quant_linear(x, w_q, bias),
            "fp32 dispatch.linear": lambda: dispatch.linear(x, wf, bias),
            "ort DynamicQuantizeMatMul": _ort_run(_ort_dql, {"x": x, "w_q": w_q, "bias": bias}),
        }
        forced = {"matmul_int8 [avx2 path]": ("matmul_int8", "cpu-avx2"),
                  "fp32 dispatch.matmul [cpu-gemm]": ("matmul", "cpu-gemm")}
        for name in list(cands):
            if name in forced:
                fn, (op, impl) = cands[name], forced[name]
                cands[name] = (lambda fn=fn, op=op, impl=impl: _forced(dispatch, op, impl, fn))
        if torch is not None:
            tx = torch.from_numpy(x)
            cands["torch dynamic quantized Linear"] = lambda: _torch_dql({"x": tx, "w_q": w_q, "bias": bias}, torch)
        lib = {nm: nm.split()[0] for nm in cands}
        res = timing.interleaved(cands, rounds=args.rounds, warmup=3, library=lib)
        print(f"\n{m} x {k} x {n}: interleaved medians of {args.rounds} rounds (2 threads; host shared with other jobs)")
        for nm, st in res.items():
            print(f"  {nm:38s} {st.median * 1e6:9.1f} us   (min {st.min * 1e6:8.1f}, spread {st.spread:.2f})")
        t = {nm: st.median for nm, st in res.items()}
        print(f"  matmul_int8 vs fp32 dispatch.matmul: {t['fp32 dispatch.matmul'] / t['matmul_int8']:.2f}x "
              f"(its own GEMM forced: {t['fp32 dispatch.matmul [cpu-gemm]'] / t['matmul_int8']:.2f}x); "
              f"vs ort MatMulInteger int32: {t['ort MatMulInteger (int32 out)'] / t['matmul_int8']:.2f}x, "
              f"+scale: {t['ort MatMulInteger+scale (float out)'] / t['matmul_int8']:.2f}x")
        print(f"  dynamic_quant_linear vs fp32 dispatch.linear: {t['fp32 dispatch.linear'] / t['dynamic_quant_linear']:.2f}x; "
              f"vs ort DynamicQuantizeMatMul: {t['ort DynamicQuantizeMatMul'] / t['dynamic_quant_linear']:.2f}x"
              + (f"; vs torch: {t['torch dynamic quantized Linear'] / t['dynamic_quant_linear']:.2f}x" if torch else ""))
    print("\naccuracy against the float32 linear, 128 x 768 x 768, weight N(0, 1/K) per-channel int8:")
    for label, name, mx, mean in _accuracy(rng, torch):
        print(f"  {label:18s} {name:30s} max|diff|/max|y| {mx:.4f}   mean|diff|/mean|y| {mean:.4f}")


def _forced(dispatch, op, impl, fn):
    with dispatch.use(**{op: impl}):
        return fn()


if __name__ == "__main__":
    from bench.peer_ops import int8_linalg  # the package's module (bench.peer_ops imports it before this runs)

    int8_linalg._main()
