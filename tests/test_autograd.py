"""dispatch.autograd: our forward and backward kernels under PyTorch's autograd.

Each op's gradients against PyTorch's own autograd of the same composition in torch ops:
float64 to 1e-9 relative (normwise, and elementwise where the values are not tiny) plus
torch.autograd.gradcheck on tiny shapes; float32 to 2e-4.  Every option: bias, each
activation, fused residual, axis, each reduction, ignore_index.  A 30-step SGD run of a
small pre-norm MLP matches PyTorch's losses to 1e-3; a Llama-style block on bfloat16 tensors
matches PyTorch's float64 autograd of it; bad inputs raise naming the argument.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(__import__("tests.support", fromlist=["ON_CUDA"]).ON_CUDA, reason="dispatch.autograd on CPU tensors (the CPU test step runs it)")
F = torch.nn.functional

import dispatch  # noqa: E402
import dispatch.autograd as nka  # noqa: E402
from tests import support  # noqa: E402

# bfloat16 (linear only): results and gradients rounded to 8 bits, twice where an activation follows
TOL = {torch.float64: 1e-9, torch.float32: 2e-4, torch.bfloat16: 2.0 ** -6}


@pytest.fixture
def gen():
    """A torch generator seeded from the test's seed (tests/support.py: a failure prints it
    and NK_TEST_SEED replays it)."""
    seed = int(support.rng().integers(2 ** 62))
    return torch.Generator().manual_seed(seed)


def _randn(gen, *shape, dtype=torch.float64, grad=True):
    t = torch.randn(*shape, generator=gen, dtype=dtype)
    return t.requires_grad_(grad)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def _compare(ours_fn, ref_fn, inputs, dtype, gen, tol=None):
    """Run both on clones of the inputs with the same random upstream gradient; compare the
    outputs and every input's gradient (within tol, by default TOL[dtype])."""
    def run(fn):
        xs = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
              for x in inputs]
        out = fn(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        return xs, outs

    xs_o, outs_o = run(ours_fn)
    xs_r, outs_r = run(ref_fn)
    upstream = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs_r]
    torch.autograd.backward([o for o in outs_o], upstream)
    torch.autograd.backward([o for o in outs_r], upstream)
    tol = TOL[dtype] if tol is None else tol
    for i, (a, b) in enumerate(zip(outs_o, outs_r)):
        assert _rel(a, b) <= tol, f"output {i}: rel err {_rel(a, b):.3g} > {tol}"
    for i, (a, b) in enumerate(zip(xs_o, xs_r)):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            assert a.grad is not None, f"input {i} got no gradient"
            assert _rel(a.grad, b.grad) <= tol, (
                f"input {i}: grad rel err {_rel(a.grad, b.grad):.3g} > {tol}")


DTYPES = [torch.float64, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(gen, dtype, axis, log):
    x = _randn(gen, 5, 13, dtype=dtype)
    ours = (lambda t: nka.log_softmax(t, axis)) if log else (lambda t: nka.softmax(t, axis))
    ref = (lambda t: torch.log_softmax(t, axis)) if log else (lambda t: torch.softmax(t, axis))
    _compare(ours, ref, [x], dtype, gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy(gen, dtype, reduction, ignore):
    logits = _randn(gen, 9, 11, dtype=dtype)
    t = torch.randint(0, 11, (9,), generator=gen)
    if ignore:
        t[::3] = -100
    _compare(lambda z: nka.cross_entropy(z, t, reduction=reduction),
             lambda z: F.cross_entropy(z, t, reduction=reduction), [logits], dtype, gen)


def test_cross_entropy_target_out_of_range_names_targets():
    logits = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="targets"):
        nka.cross_entropy(logits, torch.tensor([0, 1, 5, 2]))


def _ln_ref(x, w, b, res, eps=1e-5):
    h = x if res is None else x + res
    y = F.layer_norm(h, (x.shape[-1],), w, b, eps)
    return y if res is None else (y, h)


def _rms_ref(x, w, res, eps=1e-6):
    h = x if res is None else x + res
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    y = y if w is None else y * w
    return y if res is None else (y, h)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm(gen, dtype, weight, bias, residual):
    d = 24
    x = _randn(gen, 2, 3, d, dtype=dtype)
    w = _randn(gen, d, dtype=dtype) if weight else None
    b = _randn(gen, d, dtype=dtype) if bias else None
    r = _randn(gen, 2, 3, d, dtype=dtype) if residual else None
    _compare(lambda x, w, b, r: nka.layer_norm(x, w, b, residual=r), _ln_ref, [x, w, b, r], dtype, gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(gen, dtype, weight, residual):
    d = 24
    x = _randn(gen, 7, d, dtype=dtype)
    w = _randn(gen, d, dtype=dtype) if weight else None
    r = _randn(gen, 7, d, dtype=dtype) if residual else None
    _compare(lambda x, w, r: nka.rms_norm(x, w, residual=r), _rms_ref, [x, w, r], dtype, gen)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_bfloat16(gen, op, residual):
    """bfloat16 x, weight, bias and residual (PyTorch's bfloat16 norms): against PyTorch's
    autograd of the same bfloat16 values in float64, outputs and gradients rounded to
    bfloat16 once; ours normalize h rounded to bfloat16 and run the float32 backward on the
    widened tensors: within 2^-6 normwise."""
    d = 40
    x = _randn(gen, 3, 5, d, dtype=torch.bfloat16)
    w = _randn(gen, d, dtype=torch.bfloat16)
    r = _randn(gen, 3, 5, d, dtype=torch.bfloat16) if residual else None

    def rounded(out):
        return tuple(o.bfloat16() for o in out) if isinstance(out, tuple) else out.bfloat16()

    if op == "layer_norm":
        b = _randn(gen, d, dtype=torch.bfloat16)
        _compare(lambda x, w, b, r: nka.layer_norm(x, w, b, residual=r),
                 lambda x, w, b, r: rounded(_ln_ref(x.double(), w.double(), b.double(),
                                                    None if r is None else r.double())),
                 [x, w, b, r], torch.bfloat16, gen)
    else:
        _compare(lambda x, w, r: nka.rms_norm(x, w, residual=r),
                 lambda x, w, r: rounded(_rms_ref(x.double(), w.double(), None if r is None else r.double())),
                 [x, w, r], torch.bfloat16, gen)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_bfloat16(gen, causal):
    """bfloat16 q / k / v with GQA and a bool mask: against PyTorch's autograd of the float64
    attention of the same values, rounded to bfloat16 once: within 2^-6."""
    q = _randn(gen, 2, 4, 9, 16, dtype=torch.bfloat16)
    k = _randn(gen, 2, 2, 11, 16, dtype=torch.bfloat16)
    v = _randn(gen, 2, 2, 11, 16, dtype=torch.bfloat16)
    mask = torch.rand(2, 1, 1, 11, generator=gen) > 0.2
    # every query sees a key: the first one (under the bottom-right causal diagonal too; a
    # row that sees none is zero here and NaN in the reference: CI's NK_TEST_SEED=3664095752
    # masked keys 0-2, all that query 0 sees causally)
    mask[..., 0] = True
    mask[..., -1] = True
    _compare(lambda q, k, v: nka.attention(q, k, v, causal=causal, mask=mask),
             lambda q, k, v: _attn_ref(q.double(), k.double(), v.double(), causal, mask).bfloat16(),
             [q, k, v], torch.bfloat16, gen)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_bfloat16(gen, interleaved):
    """bfloat16 x with float32 tables (as a bfloat16 model keeps them): against PyTorch's
    autograd of the rotation in float64, rounded to bfloat16 once: within 2^-6."""
    from dispatch.ops.rope import tables
    x = _randn(gen, 2, 3, 6, 16, dtype=torch.bfloat16)
    t = tables(6, 16, np.float32)
    cos, sin = torch.from_numpy(t["cos"]), torch.from_numpy(t["sin"])

    def ref(x):
        x = x.double()
        c, s = cos.double(), sin.double()
        if interleaved:
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2).bfloat16()
        a, b = x[..., :8], x[..., 8:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1).bfloat16()

    _compare(lambda x: nka.rope(x, cos, sin, interleaved=interleaved), ref, [x], torch.bfloat16, gen)


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_bfloat16(gen, log, axis):
    """bfloat16 x: against PyTorch's autograd of the same values in float64, rounded to
    bfloat16 once (ours: the float32 backward on the widened tensors): within 2^-6."""
    x = _randn(gen, 6, 40, dtype=torch.bfloat16)
    ours, ref = (nka.log_softmax, torch.log_softmax) if log else (nka.softmax, torch.softmax)
    _compare(lambda x: ours(x, axis), lambda x: ref(x.double(), axis).bfloat16(), [x], torch.bfloat16, gen)


@pytest.mark.parametrize("op", ["relu", "silu", "gelu", "gelu_tanh", "swiglu", "geglu"])
def test_activation_bfloat16(gen, op):
    """bfloat16 inputs (PyTorch's bfloat16 activations): against PyTorch's autograd of the
    same bfloat16 values in float64, the output and the gradients rounded to bfloat16 once;
    ours run the float32 backward on the widened tensors: within 2^-6 normwise."""
    x = _randn(gen, 4, 50, dtype=torch.bfloat16)
    up = _randn(gen, 4, 50, dtype=torch.bfloat16)
    ours, ref = {"relu": (nka.relu, F.relu), "silu": (nka.silu, F.silu), "gelu": (nka.gelu, F.gelu),
                 "gelu_tanh": (lambda t: nka.gelu(t, "tanh"), lambda t: F.gelu(t, approximate="tanh")),
                 "swiglu": (nka.swiglu, lambda g, u: F.silu(g) * u),
                 "geglu": (nka.geglu, lambda g, u: F.gelu(g) * u)}[op]
    inputs = [x, up] if op in ("swiglu", "geglu") else [x]
    _compare(ours, lambda *a: ref(*(t.double() for t in a)).bfloat16(), inputs, torch.bfloat16, gen)


ACTS = {
    "relu": (nka.relu, F.relu),
    "silu": (nka.silu, F.silu),
    "gelu": (nka.gelu, F.gelu),
    "gelu_tanh": (lambda x: nka.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", sorted(ACTS))
def test_activation(gen, dtype, act):
    ours, ref = ACTS[act]
    x = _randn(gen, 3, 37, dtype=dtype)
    _compare(ours, ref, [x], dtype, gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", ["swiglu", "geglu", "geglu_tanh"])
def test_gated(gen, dtype, gated):
    g, u = _randn(gen, 4, 19, dtype=dtype), _randn(gen, 4, 19, dtype=dtype)
    if gated == "swiglu":
        ours, ref = nka.swiglu, (lambda g, u: F.silu(g) * u)
    else:
        approx = "tanh" if gated == "geglu_tanh" else "none"
        ours, ref = (lambda g, u: nka.geglu(g, u, approx)), (lambda g, u: F.gelu(g, approximate=approx) * u)
    _compare(ours, ref, [g, u], dtype, gen)


def _rope_ref(x, cos, sin, interleaved):
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope(gen, dtype, interleaved):
    s, d = 5, 8
    x = _randn(gen, 2, 3, s, d, dtype=dtype)
    tab = dispatch.ops.rope.tables(s, d, np.float64 if dtype == torch.float64 else np.float32)
    cos, sin = torch.from_numpy(tab["cos"]), torch.from_numpy(tab["sin"])
    _compare(lambda x: nka.rope(x, cos, sin, interleaved=interleaved),
             lambda x: _rope_ref(x, cos, sin, interleaved), [x], dtype, gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_linear(gen, dtype, bias, activation):
    x = _randn(gen, 2, 5, 12, dtype=dtype)
    w = _randn(gen, 7, 12, dtype=dtype)
    b = _randn(gen, 7, dtype=dtype) if bias else None
    act = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
           "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
    _compare(lambda x, w, b: nka.linear(x, w, b, activation=activation),
             lambda x, w, b: act(F.linear(x, w, b)), [x, w, b], dtype, gen)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_linear_bfloat16(gen, bias, activation):
    """bfloat16 x, weight and bias (PyTorch's bfloat16 linear): against PyTorch's autograd of
    the same bfloat16 values in float64, whose gradients are rounded to bfloat16 once.  Ours
    round the pre-activation to bfloat16 before the activation (as PyTorch's bfloat16
    activation) and the result again: within 2^-6 normwise (bfloat16 keeps 8 bits); a
    float32-grade comparison would fail on the roundings alone."""
    shape = (2, 40, 70) if activation is None else (3, 24)   # 80 rows: cpu-bf16-dot where the host has it
    x = _randn(gen, *shape, dtype=torch.bfloat16)
    w = _randn(gen, 33, shape[-1], dtype=torch.bfloat16)
    b = _randn(gen, 33, dtype=torch.bfloat16) if bias else None
    act = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
           "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
    _compare(lambda x, w, b: nka.linear(x, w, b, activation=activation),
             lambda x, w, b: act(F.linear(x.double(), w.double(), None if b is None else b.double())).bfloat16(),
             [x, w, b], torch.bfloat16, gen)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul(gen, dtype):
    a, b = _randn(gen, 6, 10, dtype=dtype), _randn(gen, 10, 4, dtype=dtype)
    bias = _randn(gen, 4, dtype=dtype)
    _compare(lambda a, b, c: nka.matmul(a, b, bias=c, activation="silu"),
             lambda a, b, c: F.silu(a @ b + c), [a, b, bias], dtype, gen)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_batched_broadcast(gen, dtype):
    a, b = _randn(gen, 3, 6, 10, dtype=dtype), _randn(gen, 10, 4, dtype=dtype)
    _compare(lambda a, b: nka.matmul(a, b, activation="gelu"), lambda a, b: F.gelu(a @ b), [a, b], dtype, gen)


def _attn_ref(q, k, v, causal, mask, scale=None):
    hq, hkv = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    sq, skv = q.shape[2], k.shape[2]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(skv)[None, :]
        s = s.masked_fill(j > i + skv - sq, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, "bool", "add"])
@pytest.mark.parametrize("heads, sq, skv", [((2, 2), 5, 5), ((4, 2), 3, 7), ((4, 1), 1, 9)])
def test_attention(gen, dtype, causal, mask, heads, sq, skv):
    hq, hkv = heads
    d = 12
    q = _randn(gen, 2, hq, sq, d, dtype=dtype)
    k, v = _randn(gen, 2, hkv, skv, d, dtype=dtype), _randn(gen, 2, hkv, skv, d, dtype=dtype)
    m = None
    if mask == "bool":
        m = torch.rand(1, 1, sq, skv, generator=gen) > 0.3
        m[..., 0] = True        # every query sees a key (a row that sees none has zero output)
    elif mask == "add":
        m = torch.randn(1, hq, sq, skv, generator=gen, dtype=dtype)
    _compare(lambda q, k, v: nka.attention(q, k, v, causal=causal, mask=m),
             lambda q, k, v: _attn_ref(q, k, v, causal, m), [q, k, v], dtype, gen)


GRADCHECK = {
    "softmax": (lambda x: nka.softmax(x), [(3, 5)]),
    "log_softmax": (lambda x: nka.log_softmax(x, 0), [(3, 5)]),
    "layer_norm": (lambda x, w, b, r: nka.layer_norm(x, w, b, residual=r), [(3, 6), (6,), (6,), (3, 6)]),
    "rms_norm": (lambda x, w: nka.rms_norm(x, w), [(3, 6), (6,)]),
    "gelu": (lambda x: nka.gelu(x), [(9,)]),
    "silu": (lambda x: nka.silu(x), [(9,)]),
    "swiglu": (nka.swiglu, [(2, 4), (2, 4)]),
    "linear": (lambda x, w, b: nka.linear(x, w, b, activation="gelu_tanh"), [(3, 4), (5, 4), (5,)]),
    "matmul": (lambda a, b: nka.matmul(a, b, activation="silu"), [(2, 3, 4), (4, 5)]),
    "attention": (lambda q, k, v: nka.attention(q, k, v, causal=True), [(1, 2, 3, 4), (1, 1, 5, 4), (1, 1, 5, 4)]),
}


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradcheck(gen, name):
    fn, shapes = GRADCHECK[name]
    inputs = [_randn(gen, *s) for s in shapes]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_llama_block(gen, dtype):
    """A Llama-style pre-norm block on bfloat16 / float16 tensors, every op ours (rms_norm with
    the fused residual, linear, rope, GQA causal attention, swiglu): output and every gradient
    against PyTorch's autograd of the same block in float64 on the same 16-bit values, within
    2^-5 normwise (a dozen 16-bit roundings along the way)."""
    from dispatch.ops.rope import tables
    B, S, d, hq, hkv, hd, f = 2, 12, 32, 4, 2, 8, 48
    x = _randn(gen, B, S, d, dtype=dtype)
    ws = [(_randn(gen, *shape, dtype=torch.float32) / shape[-1] ** 0.5).to(dtype).requires_grad_()
          for shape in ((hq * hd, d), (hkv * hd, d), (hkv * hd, d), (d, hq * hd), (f, d), (f, d), (d, f))]
    n1, n2 = (1 + 0.1 * _randn(gen, d, grad=False)).to(dtype).requires_grad_(), \
        (1 + 0.1 * _randn(gen, d, grad=False)).to(dtype).requires_grad_()
    t = tables(S, hd, np.float32)
    cos, sin = torch.from_numpy(t["cos"]), torch.from_numpy(t["sin"])

    def block(ops, x, wq, wk, wv, wo, wg, wu, wd, n1, n2):
        h = ops["rms_norm"](x, n1)
        q = ops["rope"](ops["linear"](h, wq).view(B, S, hq, hd).transpose(1, 2))
        k = ops["rope"](ops["linear"](h, wk).view(B, S, hkv, hd).transpose(1, 2))
        v = ops["linear"](h, wv).view(B, S, hkv, hd).transpose(1, 2)
        a = ops["attention"](q, k, v).transpose(1, 2).reshape(B, S, hq * hd)
        y, r = ops["rms_norm_res"](ops["linear"](a, wo), n2, x)
        return r + ops["linear"](ops["swiglu"](ops["linear"](y, wg), ops["linear"](y, wu)), wd)

    def ref_rope(x):
        c, s = cos.to(x.dtype), sin.to(x.dtype)
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    def ref_rms(x, w, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    ours = {"rms_norm": lambda x, w: nka.rms_norm(x, w),
            "rms_norm_res": lambda x, w, r: nka.rms_norm(x, w, residual=r),
            "linear": lambda x, w: nka.linear(x, w),
            "rope": lambda x: nka.rope(x.contiguous(), cos, sin),
            "attention": lambda q, k, v: nka.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True),
            "swiglu": nka.swiglu}
    ref = {"rms_norm": ref_rms,
           "rms_norm_res": lambda x, w, r: (ref_rms(x + r, w), x + r),
           "linear": F.linear, "rope": ref_rope,
           "attention": lambda q, k, v: _attn_ref(q, k, v, True, None),
           "swiglu": lambda g, u: F.silu(g) * u}
    inputs = [x, *ws, n1, n2]
    _compare(lambda *a: block(ours, *a),
             lambda *a: block(ref, *(t.double() for t in a)).to(dtype), inputs, dtype, gen,
             tol=2.0 ** -5)


def test_sgd_prenorm_mlp_matches_pytorch():
    """30 SGD steps of a pre-norm MLP classifier (rms_norm -> linear+gelu -> linear ->
    cross_entropy, with a residual): the loss curve matches PyTorch's to 1e-3."""
    g = torch.Generator().manual_seed(1234)
    d, hdim, classes, n = 16, 32, 5, 24
    x = torch.randn(n, d, generator=g)
    t = torch.randint(0, classes, (n,), generator=g)
    init = [torch.randn(d, generator=g) * 0.1 + 1, torch.randn(hdim, d, generator=g) / d ** 0.5,
            torch.zeros(hdim), torch.randn(d, hdim, generator=g) / hdim ** 0.5,
            torch.randn(classes, d, generator=g) / d ** 0.5]

    def train(lib):
        params = [p.clone().requires_grad_() for p in init]
        gain, w1, b1, w2, wo = params
        losses = []
        for _ in range(30):
            if lib == "ours":
                h = nka.rms_norm(x, gain)
                h = x + nka.linear(nka.linear(h, w1, b1, activation="gelu"), w2)
                loss = nka.cross_entropy(nka.linear(h, wo), t)
            else:
                h = _rms_ref(x, gain, None)
                h = x + F.linear(F.gelu(F.linear(h, w1, b1)), w2)
                loss = F.cross_entropy(F.linear(h, wo), t)
            for p in params:
                p.grad = None
            loss.backward()
            with torch.no_grad():
                for p in params:
                    p -= 0.5 * p.grad
            losses.append(loss.item())
        return np.array(losses)

    ours, ref = train("ours"), train("torch")
    assert ref[-1] < 0.8 * ref[0], "the reference run does not learn: the test would prove nothing"
    assert np.max(np.abs(ours - ref)) <= 1e-3, f"losses differ: {np.abs(ours - ref).max():.3g}"


@pytest.mark.parametrize("view", ["transposed", "sliced", "negative"])
@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_views_of_tensors(gen, view, op):
    """The ops read tensors through numpy views made once per call (_Op.eager): a
    transposed, a sliced and a lazily negated tensor (torch's neg bit, which numpy cannot
    see: resolved by a copy) give PyTorch's outputs and gradients, and the output does
    not share the input's memory."""
    base = torch.randn(6, 10, generator=gen, dtype=torch.float64)
    make = {"transposed": lambda t: t.t(), "sliced": lambda t: t[1:5, ::3],
            "negative": lambda t: t._neg_view()}[view]
    ours = {"softmax": nka.softmax, "layer_norm": nka.layer_norm}[op]
    ref = {"softmax": lambda t: torch.softmax(t, -1),
           "layer_norm": lambda t: F.layer_norm(t, t.shape[-1:])}[op]
    leaf, leaf_ref = base.clone().requires_grad_(), base.clone().requires_grad_()
    x, x_ref = make(leaf), make(leaf_ref)
    assert x.is_neg() if view == "negative" else not x.is_contiguous()
    y, y_ref = ours(x), ref(x_ref)
    up = torch.randn(y.shape, generator=gen, dtype=y.dtype)
    y.backward(up)
    y_ref.backward(up)
    assert _rel(y, y_ref) <= 1e-12
    assert _rel(leaf.grad, leaf_ref.grad) <= 1e-12
    assert y.data_ptr() != leaf.data_ptr()


def test_no_grad_uses_plain_ops():
    x = torch.randn(3, 4)
    w = torch.randn(5, 4, requires_grad=True)
    with torch.no_grad():
        y = nka.linear(x, w, activation="gelu")
    assert not y.requires_grad
    assert torch.allclose(y, F.gelu(F.linear(x, w)), rtol=1e-5, atol=1e-5)


def test_empty_outputs_stay_tensors_absent_ones_become_none():
    """An output that does not exist comes back from the eager path as None (a shared
    placeholder array, told apart by identity), one that is merely empty as an empty
    tensor: layer_norm of 0 rows with a residual returns both y and h, with and without
    autograd, and the gradients reach the leaves."""
    r = torch.empty(0, 8)
    for grad in (True, False):
        x = torch.empty(0, 8, requires_grad=grad)
        w = torch.ones(8, requires_grad=grad)
        y, h = nka.layer_norm(x, w, residual=r)
        assert isinstance(y, torch.Tensor) and isinstance(h, torch.Tensor)
        assert y.shape == h.shape == (0, 8)
    y = nka.layer_norm(torch.randn(3, 8, requires_grad=True), torch.ones(8))   # no residual: h absent
    assert isinstance(y, torch.Tensor) and y.shape == (3, 8)
    lin = nka.linear(torch.randn(3, 8, requires_grad=True), torch.randn(5, 8, requires_grad=True))
    lin.sum().backward()   # no bias, no activation: the kept pre-activation and dbias are absent


def test_bad_grad_shape_names_argument():
    y = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="grad_out"):
        dispatch.softmax_backward(torch.randn(3, 5, dtype=torch.float64), y)


def test_custom_ops_visible_to_torch():
    assert hasattr(torch.ops.nk, "softmax") and hasattr(torch.ops.nk, "layer_norm_backward")
    x = torch.randn(2, 3, device="meta")
    assert torch.ops.nk.softmax(x, -1).shape == (2, 3)    # the fake implementation


def test_readme_training_step_runs():
    """README's training example, run as written (so the README stays true)."""
    import pathlib
    text = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = text.split("### Training: `dispatch.autograd`", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    scope = {}
    exec(compile(block, "README.md (training example)", "exec"), scope)
    assert torch.isfinite(scope["loss"]).item()
    assert all(p.grad is None for p in (scope["gain"], scope["w1"], scope["head"]))


def test_torch_compile_sees_the_ops_without_graph_breaks():
    """fullgraph=True fails on a graph break: the custom ops (forward, fake and backward)
    are traced as opaque nodes, and the compiled gradient equals eager's."""
    def step(x, w, g):
        return nka.cross_entropy(nka.linear(nka.rms_norm(x, g), w, activation="silu"), t).sum()

    t = torch.tensor([0, 2, 1, 3])
    x = torch.randn(4, 8, dtype=torch.float64)
    w = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(8, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    loss_c = compiled(x, w, g)
    grads_c = torch.autograd.grad(loss_c, (w, g))
    loss_e = step(x, w, g)
    grads_e = torch.autograd.grad(loss_e, (w, g))
    assert torch.allclose(loss_c, loss_e, rtol=1e-12, atol=0)
    for a, b in zip(grads_c, grads_e):
        assert torch.allclose(a, b, rtol=1e-12, atol=0)


def test_bench_breakdown_times_the_dispatch_calls_and_puts_them_back(gen):
    """bench.autograd_bars --breakdown: each dispatch op an autograd round calls is timed
    (layer_norm's forward and backward here, nothing else), and inside it the
    implementation's run; dispatch's functions and the implementations' runs are the
    originals again afterwards."""
    from bench.autograd_bars import breakdown
    from dispatch import registry

    before = (dispatch.layer_norm, dispatch.layer_norm_backward)
    runs = [(i, i.run) for op in before for i in registry.implementations(op.__name__, "cpu")]
    x, w, b = (_randn(gen, *s, dtype=torch.float32) for s in ((3, 5), (5,), (5,)))

    def run():
        nka.layer_norm(x, w, b).sum().backward()

    total, per_op, per_run = breakdown(run, rounds=20)
    assert set(per_op) == set(per_run) == {"layer_norm", "layer_norm_backward"}
    assert 0 < sum(per_op.values()) < total
    assert all(0 < per_run[k] < per_op[k] for k in per_op)
    assert (dispatch.layer_norm, dispatch.layer_norm_backward) == before
    assert all(i.run is r for i, r in runs)
