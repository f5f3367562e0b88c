"""Peers of topk_softmax (see bench/peer_ops/__init__.py): softmax over the experts, the k
largest probabilities, divided by their sum when renormalizing (Mixtral's router as
Hugging Face writes it: torch.softmax + torch.topk; numpy: a stable argsort; onnxruntime:
Softmax, TopK, then ReduceSum + Div)."""
import numpy as np

from ..peers import _softmax


def _numpy_topk(i):
    k = i.get("k", 2)
    p = _softmax(i["logits"])
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, idx, axis=-1)
    if i.get("renormalize", True):
        w = w / w.sum(axis=-1, keepdims=True)
    return w, idx


def _torch_topk(t, torch):
    w, idx = torch.topk(torch.softmax(t["logits"], dim=-1), t.get("k", 2), dim=-1)
    if t.get("renormalize", True):
        w = w / w.sum(dim=-1, keepdim=True)
    return w, idx


def _ort_topk(i, g):
    p = g.op("Softmax", "logits", axis=-1)
    w, idx = g.op("TopK", p, g.const([i.get("k", 2)], np.int64), axis=-1), g._name()
    g.nodes[-1].output.append(idx)  # TopK's second output, the indices
    if i.get("renormalize", True):
        w = g.op("Div", w, g.op("ReduceSum", w, g.const([-1], np.int64), keepdims=1))
    return {"logits": i["logits"]}, w


NUMPY = {"topk_softmax": _numpy_topk}
TORCH = {"topk_softmax": _torch_topk}
ORT = {"topk_softmax": _ort_topk}
