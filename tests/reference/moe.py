"""float64 numpy reference for dispatch.moe_ffn, same signature (written from the definition:
a plain loop over tokens and their k slots, no grouping by expert)."""
import math

import numpy as np

_ACT = {
    "silu": lambda g: g / (1 + np.exp(-g)),
    "gelu": lambda g: 0.5 * g * (1 + np.vectorize(math.erf)(g / math.sqrt(2))) if g.size else g,
    "gelu_tanh": lambda g: 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))),
}


def moe_ffn(x, weights, indices, w_gate, w_up, w_down, *, activation="silu", out=None):
    x = np.asarray(x, np.float64)
    weights = np.asarray(weights, np.float64)
    indices = np.asarray(indices)
    w_gate, w_up, w_down = (np.asarray(w, np.float64) for w in (w_gate, w_up, w_down))
    act = _ACT[activation]
    y = np.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(indices.shape[1]):
            e = int(indices[t, j])
            hidden = act(w_gate[e] @ x[t]) * (w_up[e] @ x[t])
            y[t] += weights[t, j] * (w_down[e] @ hidden)
    return y
