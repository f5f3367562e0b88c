"""Peers: the same op written with numpy (always), PyTorch CPU and onnxruntime (when
installed), on the same named inputs as bench/cases.

``prepare(peer, case, inputs)`` returns a zero-argument callable that computes the op's
result (ready to be timed: sessions built, tensors wrapped zero-copy), or raises
`Unavailable` with the reason (an op without a version here simply has no such peer).
``reference(case, inputs)`` is the tests' float64 reference (tests/reference), used to
check that every implementation and peer agrees.

The numpy versions are what a user would write with numpy alone; the onnxruntime ones are
small ONNX graphs (opset 17, IR version 10: onnxruntime 1.31 rejects IR 14), so fusions are
up to onnxruntime's graph optimizer, as for a user exporting a model.
"""
from __future__ import annotations

import importlib
import math

import numpy as np

PEERS = ("numpy", "torch", "onnxruntime")


class Unavailable(Exception):
    """This peer cannot run this case (not installed, or no such op)."""


# ---- numpy -------------------------------------------------------------------------------

def _erf(x):
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf and scipy is not a
    # dependency.
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def _silu(x):
    return x / (1 + np.exp(-x))


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x * (1 / math.sqrt(2))))


_ACT = {None: lambda x: x, "relu": lambda x: np.maximum(x, 0), "silu": _silu,
        "gelu": _gelu, "gelu_tanh": lambda x: _gelu(x, "tanh")}


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _rope(x, cos, sin):
    # x (..., seq, d), tables (seq, d/2); rotate-half convention (GPT-NeoX / HF Llama).
    h = x.shape[-1] // 2
    c, s = cos, sin
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _attention(q, k, v, causal=False):
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        mask = np.triu(np.ones((sq, sk), bool), k=sk - sq + 1)
        s = np.where(mask, -np.inf, s)
    return _softmax(s) @ v


def _f32(a):
    """A bfloat16 (ml_dtypes) or float16 array as float32, for numpy to compute on (its
    arithmetic on 16-bit arrays rounds every step to 16 bits); other arrays as they are."""
    return a.astype(np.float32) if getattr(a.dtype, "name", "") in ("bfloat16", "float16") else a


def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _rms_norm(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _cross_entropy(logits, targets):
    ls = _log_softmax(logits)
    return -np.take_along_axis(ls, targets[..., None], axis=-1).mean()


def _linear(x, weight, bias=None, activation=None):
    if not (isinstance(weight, np.ndarray) and weight.dtype.kind == "f" and weight.dtype.itemsize >= 4):
        from .peer_ops.weight_only import numpy_linear  # a low-precision weight: convert, then matmul
        return numpy_linear(x, weight, bias, activation)
    y = x @ weight.T
    if bias is not None:
        y = y + bias
    return _ACT[activation](y)


NUMPY = {
    "relu": lambda i: np.maximum(_f32(i["x"]), 0),
    "silu": lambda i: _silu(_f32(i["x"])),
    "gelu": lambda i: _gelu(_f32(i["x"]), i.get("approximate", "none")),
    "swiglu": lambda i: _silu(_f32(i["gate"])) * _f32(i["up"]),
    "geglu": lambda i: _gelu(_f32(i["gate"]), i.get("approximate", "none")) * _f32(i["up"]),
    "matmul": lambda i: i["a"] @ i["b"],
    "linear": lambda i: _linear(i["x"], i["weight"], i.get("bias"), i.get("activation")),
    "softmax": lambda i: _softmax(_f32(i["x"])),
    "log_softmax": lambda i: _log_softmax(_f32(i["x"])),
    "cross_entropy": lambda i: _cross_entropy(i["logits"], i["targets"]),
    "layer_norm": lambda i: _layer_norm(_f32(i["x"]), _f32(i["weight"]), _f32(i["bias"])),
    "rms_norm": lambda i: _rms_norm(_f32(i["x"]), _f32(i["weight"])),
    "rope": lambda i: _rope(_f32(i["x"]), _f32(i["cos"]), _f32(i["sin"])),
    "attention": lambda i: _attention(_f32(i["q"]), _f32(i["k"]), _f32(i["v"]), i.get("causal", False)),
}


# The float64 copies the reference needs, at most: Mixtral's expert weights (5.6 GB in
# float32) would take 11 GB more on a 24 GiB machine.  Larger cases are not checked by the
# report (the tests check the same kernels at smaller sizes).
REFERENCE_MAX_BYTES = 2 << 30


def reference(case, inputs):
    """The float64 reference of the op: the same function the tests compare every kernel
    with (tests/reference/<family>.py, named like the op, with the public signature),
    called through the op's own signature on float64 copies of the inputs; None when those
    copies would exceed REFERENCE_MAX_BYTES."""
    from dispatch import registry

    op = registry.OPS[case.op]
    if sum(v.size * 8 for v in inputs.values() if isinstance(v, np.ndarray)) > REFERENCE_MAX_BYTES:
        return None
    fn = getattr(importlib.import_module(f"tests.reference.{op.family}"), op.name)
    # a reference that computes in float64 but follows the input precision where the op's
    # semantics name it (quantize divides in x's type, as ONNX) gets the inputs as they are
    keep = getattr(fn, "takes_input_precision", False)
    f64 = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" and not keep else v)
           for k, v in inputs.items()}
    args, kwargs = op.signature(f64)
    res = fn(*args, **kwargs)
    if isinstance(res, tuple):  # (result, extras) ops: the report compares the first, as it does the candidates'
        res = res[0]
    return np.asarray(res, dtype=np.float64)


# ---- PyTorch -----------------------------------------------------------------------------

def _torch():
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"PyTorch not installed ({exc.__class__.__name__})") from None
    import numba

    if torch.get_num_threads() != numba.config.NUMBA_NUM_THREADS:
        torch.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    return torch


def _torch_linear(torch, t):
    """F.linear, with x and bias cast to a low-precision weight's dtype (PyTorch's linear
    takes one dtype) and the result cast back; a no-op cast for a dense weight."""
    from .peer_ops.weight_only import torch_weight

    x, w, b = t["x"], torch_weight(t["weight"], torch), t.get("bias")
    return torch.nn.functional.linear(x.to(w.dtype), w, None if b is None else b.to(w.dtype)).to(x.dtype)


def _torch_fn(op, torch):
    F = torch.nn.functional
    act = {None: lambda y: y, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
           "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}

    def rope(t):
        x, c, s = t["x"], t["cos"], t["sin"]
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    def attention(t):
        q, k, v = t["q"], t["k"], t["v"]
        sq, sk = q.shape[-2], k.shape[-2]
        if not t.get("causal") or sq == sk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(t.get("causal", False)))
        # is_causal aligns the mask top-left; ours (and the KV-cache convention) bottom-right
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    table = {
        "relu": lambda t: F.relu(t["x"]),
        "silu": lambda t: F.silu(t["x"]),
        "gelu": lambda t: F.gelu(t["x"], approximate=t.get("approximate", "none")),
        "swiglu": lambda t: F.silu(t["gate"]) * t["up"],
        "geglu": lambda t: F.gelu(t["gate"], approximate=t.get("approximate", "none")) * t["up"],
        "matmul": lambda t: torch.matmul(t["a"], t["b"]),
        "linear": lambda t: act[t.get("activation")](_torch_linear(torch, t)),
        "softmax": lambda t: torch.softmax(t["x"], -1),
        "log_softmax": lambda t: torch.log_softmax(t["x"], -1),
        "cross_entropy": lambda t: F.cross_entropy(t["logits"], t["targets"]),
        "layer_norm": lambda t: F.layer_norm(t["x"], t["x"].shape[-1:], t["weight"], t["bias"], 1e-5),
        "rms_norm": lambda t: F.rms_norm(t["x"], t["x"].shape[-1:], t["weight"], 1e-6),
        "rope": rope,
        "attention": attention,
    }
    if op in table:
        return table[op]
    from . import peer_ops

    if op in peer_ops.TORCH:
        return lambda t: peer_ops.TORCH[op](t, torch)
    raise Unavailable(f"no PyTorch version of {op}")


def _prepare_torch(case, inputs):
    torch = _torch()
    fn = _torch_fn(case.op, torch)
    from .peer_ops.weight_only import to_torch  # low-precision weights (bfloat16, QuantizedArray)

    t = {k: to_torch(v, torch) for k, v in inputs.items()}

    def run():
        with torch.inference_mode():
            return fn(t)

    # numpy has no bfloat16 of its own: such a result (a bfloat16 linear) is read as float32 (exact)
    return run, lambda r: (r.float() if r.dtype == torch.bfloat16 else r).numpy()


# ---- onnxruntime -------------------------------------------------------------------------

def _ort():
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"onnxruntime/onnx not installed ({exc.__class__.__name__})") from None
    return onnxruntime


class _Graph:
    """A tiny builder over onnx.helper: nodes appended in order, constants as initializers."""

    def __init__(self, dtype):
        from onnx import TensorProto, helper, numpy_helper

        self.h, self.nh, self.TP = helper, numpy_helper, TensorProto
        self.dtype = np.dtype(dtype)
        self.nodes, self.inits, self.n = [], [], 0

    def _name(self):
        self.n += 1
        return f"t{self.n}"

    def op(self, kind, *inputs, **attrs):
        out = self._name()
        self.nodes.append(self.h.make_node(kind, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=None):
        name = self._name()
        self.inits.append(self.nh.from_array(np.asarray(value, dtype=dtype or self.dtype), name))
        return name

    def model(self, feeds: dict, out: str):
        h = self.h
        ins = [h.make_tensor_value_info(k, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
        y = h.make_tensor_value_info(out, h.np_dtype_to_tensor_dtype(self.dtype), None)
        g = h.make_graph(self.nodes, "peer", ins, [y], initializer=self.inits)
        # com.microsoft: onnxruntime's contrib ops (DynamicQuantizeMatMul), used by the int8 peers
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
        m.ir_version = 10
        return m


def _ort_gelu(g, x, approximate):
    if approximate == "tanh":
        inner = g.op("Mul", g.op("Add", x, g.op("Mul", g.const(0.044715), g.op("Mul", x, g.op("Mul", x, x)))),
                     g.const(math.sqrt(2 / math.pi)))
        return g.op("Mul", g.op("Mul", x, g.const(0.5)), g.op("Add", g.const(1.0), g.op("Tanh", inner)))
    e = g.op("Erf", g.op("Mul", x, g.const(1 / math.sqrt(2))))
    return g.op("Mul", g.op("Mul", x, g.const(0.5)), g.op("Add", g.const(1.0), e))


def _ort_silu(g, x):
    return g.op("Mul", x, g.op("Sigmoid", x))


def _ort_act(g, y, activation):
    if activation is None:
        return y
    if activation == "relu":
        return g.op("Relu", y)
    if activation == "silu":
        return _ort_silu(g, y)
    return _ort_gelu(g, y, "tanh" if activation == "gelu_tanh" else "none")


def _ort_graph(case, inputs, g):
    """(feeds, output name) for the case's op, nodes added to g."""
    op, i = case.op, inputs
    if any(getattr(getattr(v, "dtype", None), "name", "") == "bfloat16" for v in i.values()):
        raise Unavailable("onnxruntime's CPU kernels take no bfloat16")
    if op in ("relu", "silu", "gelu"):
        f = {"x": i["x"]}
        y = {"relu": lambda: g.op("Relu", "x"), "silu": lambda: _ort_silu(g, "x"),
             "gelu": lambda: _ort_gelu(g, "x", i.get("approximate", "none"))}[op]()
        return f, y
    if op in ("swiglu", "geglu"):
        a = _ort_silu(g, "gate") if op == "swiglu" else _ort_gelu(g, "gate", i.get("approximate", "none"))
        return {"gate": i["gate"], "up": i["up"]}, g.op("Mul", a, "up")
    if op == "matmul":
        if i["b"].ndim == 2:  # a weight: a constant of the model, which onnxruntime prepacks
            return {"a": i["a"]}, g.op("MatMul", "a", g.const(i["b"]))
        return {"a": i["a"], "b": i["b"]}, g.op("MatMul", "a", "b")
    if op == "linear":
        if i["x"].ndim != 2:
            raise Unavailable("onnxruntime peer of linear takes 2-D x only")
        w = g.const(i["weight"])  # weights are constants of the model, as in an exported one
        if i.get("bias") is not None:
            y = g.op("Gemm", "x", w, g.const(i["bias"]), transB=1)
        else:
            y = g.op("Gemm", "x", w, transB=1)
        return {"x": i["x"]}, _ort_act(g, y, i.get("activation"))
    if op == "softmax":
        return {"x": i["x"]}, g.op("Softmax", "x", axis=-1)
    if op == "log_softmax":
        return {"x": i["x"]}, g.op("LogSoftmax", "x", axis=-1)
    if op == "cross_entropy":
        return {"logits": i["logits"], "targets": i["targets"]}, g.op("SoftmaxCrossEntropyLoss", "logits", "targets", reduction="mean")
    if op == "layer_norm":
        return {"x": i["x"]}, g.op("LayerNormalization", "x", g.const(i["weight"]), g.const(i["bias"]), axis=-1, epsilon=1e-5)
    if op == "rms_norm":
        ms = g.op("ReduceMean", g.op("Mul", "x", "x"), axes=[-1], keepdims=1)
        r = g.op("Div", "x", g.op("Sqrt", g.op("Add", ms, g.const(1e-6))))
        return {"x": i["x"]}, g.op("Mul", r, g.const(i["weight"]))
    if op == "rope":
        x = i["x"]
        h = x.shape[-1] // 2
        c = g.const(i["cos"])
        s = g.const(i["sin"])
        ax = g.const([3], np.int64)
        x1 = g.op("Slice", "x", g.const([0], np.int64), g.const([h], np.int64), ax)
        x2 = g.op("Slice", "x", g.const([h], np.int64), g.const([2 * h], np.int64), ax)
        lo = g.op("Sub", g.op("Mul", x1, c), g.op("Mul", x2, s))
        hi = g.op("Add", g.op("Mul", x2, c), g.op("Mul", x1, s))
        return {"x": x}, g.op("Concat", lo, hi, axis=-1)
    if op == "attention":
        q = i["q"]
        scale = g.const(1.0 / math.sqrt(q.shape[-1]))
        s = g.op("Mul", g.op("MatMul", "q", g.op("Transpose", "k", perm=[0, 1, 3, 2])), scale)
        if i.get("causal"):
            sq, sk = q.shape[-2], i["k"].shape[-2]
            mask = np.where(np.triu(np.ones((sq, sk), bool), k=sk - sq + 1), -np.inf, 0).astype(q.dtype)
            s = g.op("Add", s, g.const(mask))
        return {"q": q, "k": i["k"], "v": i["v"]}, g.op("MatMul", g.op("Softmax", s, axis=-1), "v")
    from . import peer_ops

    if op in peer_ops.ORT:
        return peer_ops.ORT[op](i, g)
    raise Unavailable(f"no onnxruntime graph for {op}")


def _prepare_ort(case, inputs):
    ort = _ort()
    import numba

    # the output dtype: the first float input's (float32 for ops with only quantized inputs)
    dtype = next((v.dtype for v in inputs.values() if isinstance(v, np.ndarray) and v.dtype.kind == "f"), np.float32)
    g = _Graph(dtype)
    feeds, out = _ort_graph(case, inputs, g)
    so = ort.SessionOptions()
    so.intra_op_num_threads = numba.config.NUMBA_NUM_THREADS
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(g.model(feeds, out).SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
    names = [out]
    return (lambda: sess.run(names, feeds)[0]), (lambda r: r)


# ---- entry points ------------------------------------------------------------------------

def _prepare_numpy(case, inputs):
    from . import peer_ops

    fn = NUMPY.get(case.op) or peer_ops.NUMPY.get(case.op)
    if fn is None:
        raise Unavailable(f"no numpy version of {case.op}")
    return (lambda: fn(inputs)), (lambda r: r)


_PREPARE = {"numpy": _prepare_numpy, "torch": _prepare_torch, "onnxruntime": _prepare_ort}


def prepare(peer: str, case, inputs):
    """(run, to_numpy): run() computes the op with this peer; to_numpy(result) -> ndarray.
    Raises Unavailable with the reason when the peer cannot run the case."""
    return _PREPARE[peer](case, inputs)


def installed() -> dict:
    """{peer: version or None (not installed, with the reason in the notes)}."""
    out = {"numpy": np.__version__}
    try:
        out["torch"] = _torch().__version__
    except Unavailable:
        out["torch"] = None
    try:
        out["onnxruntime"] = _ort().__version__
    except Unavailable:
        out["onnxruntime"] = None
    return out
