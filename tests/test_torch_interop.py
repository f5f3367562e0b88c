"""PyTorch CPU tensors in the plain ops (dispatch/interop.py): every op, found from the
registry, called with tensors gives the same values as with numpy arrays, as tensors; the
inputs are read without copies; an out= tensor is written in place and is the result;
`import dispatch` never imports torch."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import dispatch
from dispatch import registry
from dispatch.quantized import QuantizedArray
from tests import small_inputs as S

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(__import__("tests.support", fromlist=["ON_CUDA"]).ON_CUDA, reason="PyTorch CPU tensors (the CPU test step runs it)")

OPS = list(registry.OPS.values())


def _tensor(v):
    return torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v   # a writeable copy: torch warns on read-only memory


def _leaves(res):
    if isinstance(res, (tuple, list)):
        return [x for r in res for x in _leaves(r)]
    return [res]


@pytest.mark.parametrize("op_name", [op.name for op in OPS])
def test_tensors_in_tensors_out(op_name):
    op = registry.OPS[op_name]
    named = S.inputs(op, "small", seed=31)
    expected = S.call(op, named)
    tnamed = {k: _tensor(v) for k, v in named.items()}
    args, kwargs = S.call_args(op, tnamed)
    # the rule: tensors come back when an argument of the call is a tensor (dequantize takes
    # a QuantizedArray, our container, which keeps its parts as numpy views)
    gives_tensors = any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values()))
    got = op.public(*args, **kwargs)
    if isinstance(expected, QuantizedArray):   # quantize: its result is a QuantizedArray as with numpy
        assert isinstance(got, QuantizedArray) and S.same(got, expected)
        return
    exp_leaves, got_leaves = _leaves(expected), _leaves(got)
    assert len(exp_leaves) == len(got_leaves)
    for e, g in zip(exp_leaves, got_leaves):
        if isinstance(e, np.ndarray):
            want = torch.Tensor if gives_tensors else np.ndarray
            assert isinstance(g, want), f"{op_name}: result is a {type(g).__name__}, not a {want.__name__}"
            assert S.same(np.asarray(g), e), f"{op_name}: the result differs from the numpy call's"


@pytest.mark.parametrize("op_name", [op.name for op in OPS if S.has_out(op)])
def test_out_tensor_written_in_place(op_name):
    op = registry.OPS[op_name]
    named = S.inputs(op, "small", seed=32)
    expected = S.call(op, named)
    out = torch.full(expected.shape, float("nan"), dtype=getattr(torch, expected.dtype.name))
    got = S.call(op, {k: _tensor(v) for k, v in named.items()}, out=out)   # out= alone makes a tensor call
    assert got is out
    assert S.same(out.numpy(), expected)


def test_inputs_not_copied_and_strided_views_work():
    x = torch.randn(6, 10, dtype=torch.float64)
    seen = []
    orig = dispatch.interop._to_array

    def spy(torch_mod, name, t, originals):
        arr = orig(torch_mod, name, t, originals)
        if isinstance(t, torch.Tensor):
            seen.append((t.data_ptr(), arr.__array_interface__["data"][0]))
        return arr

    dispatch.interop._to_array = spy
    try:
        y = dispatch.softmax(x)
        z = dispatch.softmax(x.t(), axis=0)     # a transposed view: strides kept, no copy on entry
    finally:
        dispatch.interop._to_array = orig
    assert all(a == b for a, b in seen) and len(seen) == 2
    assert torch.allclose(y, torch.softmax(x, -1), rtol=1e-12, atol=0)
    assert torch.allclose(z, torch.softmax(x.t(), 0), rtol=1e-12, atol=0)


def test_requires_grad_is_read_not_recorded():
    w = torch.randn(8, requires_grad=True)
    x = torch.randn(3, 8)
    y = dispatch.layer_norm(x, w)
    assert not y.requires_grad
    ref = torch.nn.functional.layer_norm(x, (8,), w.detach())
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_mixed_numpy_and_tensor_gives_tensor():
    x = torch.randn(4, 8)
    w = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    y = dispatch.linear(x, w)
    assert isinstance(y, torch.Tensor)
    assert np.allclose(y.numpy(), x.numpy() @ w.T, rtol=1e-5, atol=1e-5)


def test_bfloat16_weight_tensor():
    pytest.importorskip("ml_dtypes")
    x = torch.randn(4, 8)
    w = torch.randn(6, 8).bfloat16()
    y = dispatch.linear(x, w)
    ref = x @ w.float().T
    assert isinstance(y, torch.Tensor) and torch.allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_bad_tensor_still_names_argument():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="x"):
        dispatch.softmax(x.to(torch.int32))
    with pytest.raises(ValueError, match="out"):
        dispatch.softmax(x, out=torch.empty(3, 8))


def test_explain_takes_tensors():
    e = dispatch.explain("softmax", torch.randn(4, 8))
    assert "chosen" in str(e)


def test_import_dispatch_does_not_import_torch():
    code = "import sys, dispatch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
