"""Peers of quantize / dequantize (see bench/peer_ops/__init__.py).

    NUMPY  the formula as a numpy user writes it: scale from np.abs(x).max(axis) / 127 (or
           the min / max rule), np.rint(x / scale) + zp, np.clip, astype;
    TORCH  torch.quantize_per_channel / quantize_per_tensor with scales computed by torch
           (amax / 127, or aminmax), int_repr() as the values; dequantize: torch's
           dequantize() of a quantized tensor built from the same values (_make_per_*
           _quantized_tensor, not timed: a view);
    ORT    a graph computing the scales (ReduceMax of Abs, Div) feeding QuantizeLinear with
           axis; DynamicQuantizeLinear for the dynamic uint8 case; DequantizeLinear with the
           scales as constants of the model.
"""
import numpy as np

_Q = {"int8": (np.int8, -128, 127), "uint8": (np.uint8, 0, 255)}


def _params(i):
    qt = i.get("qtype", "int8")
    return qt, _Q[qt], i.get("axis"), i.get("symmetric", True)


def _reduce_axes(x, axis):
    return None if axis is None else tuple(a for a in range(x.ndim) if a != axis)


def _numpy_quantize(i):
    x = i["x"]
    qt, (dt, lo, hi), axis, sym = _params(i)
    ax = _reduce_axes(x, axis)
    if sym:
        s = (np.abs(x).max(axis=ax, keepdims=axis is not None) / np.float32(127)).astype(np.float32)
        z = np.float32(128 if qt == "uint8" else 0)
    else:
        rmin = np.minimum(x.min(axis=ax, keepdims=axis is not None), 0)
        rmax = np.maximum(x.max(axis=ax, keepdims=axis is not None), 0)
        s = ((rmax - rmin) / np.float32(hi - lo)).astype(np.float32)
        z = np.rint(np.clip(lo - rmin / s, lo, hi))
    s = np.where(s == 0, np.float32(1), s)
    return np.clip(np.rint(x / s) + z, lo, hi).astype(dt)


def _numpy_dequantize(i):
    v, s, z, axis = i["values"], i["scale"], i.get("zero_point"), i.get("axis")
    shape = [1] * v.ndim
    if axis is not None:
        shape[axis] = -1
    s = s.reshape(shape) if axis is not None else s
    if z is None:
        return v.astype(np.float32) * s
    z = z.reshape(shape) if axis is not None else z
    return (v.astype(np.float32) - z.astype(np.float32)) * s


def _torch_quantize(t, torch):
    x = t["x"]
    qt, (dt, lo, hi), axis, sym = _params(t)
    tdt = torch.qint8 if qt == "int8" else torch.quint8
    if axis is None:
        if sym:
            s = float(x.abs().max()) / 127 or 1.0
            return torch.quantize_per_tensor(x, s, 128 if qt == "uint8" else 0, tdt).int_repr()
        mn, mx = torch.aminmax(x)
        mn, mx = min(float(mn), 0.0), max(float(mx), 0.0)
        s = (mx - mn) / (hi - lo) or 1.0
        return torch.quantize_per_tensor(x, s, int(round(min(max(lo - mn / s, lo), hi))), tdt).int_repr()
    dims = tuple(a for a in range(x.dim()) if a != axis)
    s = (x.abs().amax(dim=dims) / 127).double()
    s = torch.where(s == 0, torch.ones_like(s), s)
    z = torch.full(s.shape, 128 if qt == "uint8" else 0, dtype=torch.int64)
    return torch.quantize_per_channel(x, s, z, axis, tdt).int_repr()


def _torch_dequantize(t, torch):
    v, s, z, axis = t["values"], t["scale"], t.get("zero_point"), t.get("axis")
    if "_q" not in t:  # the quantized tensor, built once (a view of the values)
        if axis is None:
            zp = 0 if z is None else int(z)
            t["_q"] = torch._make_per_tensor_quantized_tensor(v, float(s), zp)
        else:
            zz = torch.zeros(s.shape, dtype=torch.int64) if z is None else z.long()
            t["_q"] = torch._make_per_channel_quantized_tensor(v, s.double(), zz, axis)
    return t["_q"].dequantize()


def _ort_quantize(i, g):
    x = i["x"]
    qt, (dt, lo, hi), axis, sym = _params(i)
    if axis is None and not sym and qt == "uint8":
        y = g.op("DynamicQuantizeLinear", "x")
        g.nodes[-1].output.extend([g._name(), g._name()])  # its scale and zero point outputs
    else:
        c = 1 if axis is None else x.shape[axis]
        ax = _reduce_axes(x, axis)
        f32 = np.float32
        if sym:
            m = g.op("ReduceMax", g.op("Abs", "x"), keepdims=0, **({} if ax is None else {"axes": list(ax)}))
            s = g.op("Div", m, g.const(127.0, f32))
        else:
            kw = {} if ax is None else {"axes": list(ax)}
            mn = g.op("Min", g.op("ReduceMin", "x", keepdims=0, **kw), g.const(0.0, f32))
            mx = g.op("Max", g.op("ReduceMax", "x", keepdims=0, **kw), g.const(0.0, f32))
            s = g.op("Div", g.op("Sub", mx, mn), g.const(float(hi - lo), f32))
        zp = np.full(() if axis is None else (c,), 128 if (sym and qt == "uint8") else 0, dt)
        y = g.op("QuantizeLinear", "x", s, g.const(zp, dt), **({} if axis is None else {"axis": axis}))
    g.dtype = np.dtype(dt)  # the model's output is the quantized type
    return {"x": x}, y


def _ort_dequantize(i, g):
    v, s, z, axis = i["values"], i["scale"], i.get("zero_point"), i.get("axis")
    zp = np.zeros(s.shape, v.dtype) if z is None else z
    y = g.op("DequantizeLinear", "values", g.const(s, np.float32), g.const(zp, v.dtype),
             **({} if axis is None else {"axis": axis}))
    g.dtype = np.dtype(np.float32)
    return {"values": v}, y


NUMPY = {"quantize": _numpy_quantize, "dequantize": _numpy_dequantize}
TORCH = {"quantize": _torch_quantize, "dequantize": _torch_dequantize}
ORT = {"quantize": _ort_quantize, "dequantize": _ort_dequantize}
