"""Public conv2d (NCHW) with the per-channel bias and an activation fused into the output pass.

    conv2d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1,
           activation=None, out=None)
        x (N, C, H, W) or unbatched (C, H, W); weight (Cout, C / groups, KH, KW) or a
        PackedWeight from prepack(weight, op="conv2d", groups=...); bias (Cout,) or None;
        result (N, Cout, OH, OW) (or (Cout, OH, OW)), as torch.nn.functional.conv2d.

stride, dilation: an int or a pair (>= 1); padding: an int or a pair (>= 0), or "valid"
(none) or "same" (stride 1 only; when the total padding d*(k-1) is odd the extra row /
column goes to the bottom / right, as PyTorch).  activation: None, "relu", "gelu",
"gelu_tanh" or "silu", applied after the bias.  float32 or float64 on the CPU (float16
too on CUDA); every argument of one dtype.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common.activation import ACTIVATION_CODES, FLOPS_PER_ELEMENT
from kernels_cpu import conv as K
from kernels_cpu.parallel import num_threads
from kernels_cpu import conv_winograd as KW
from kernels_cpu import half as KH
from kernels_cpu.gemm import active_tile

from .. import validate as V
from ..registry import FLOAT_DTYPES, Call, Implementation, Op, Rule, bucket, register, register_op
from ._common import HOST_COPY_NOTE, case_dtype, contiguous, deliver, half_bits, result_buffer, widened
from ._spatial import out_size, pair
from .linalg import PackedWeight, _readonly_source, _zeros, register_prepacker

_KERNELS = ("kernels_cpu.conv", "kernels_cpu.gemm", "kernels_cpu.approx", "kernels_cpu.parallel", "kernels_cpu.half")
_WINOGRAD_KERNELS = _KERNELS + ("kernels_cpu.conv_winograd",)

# Winograd F(2x2, 3x3) (kernels_cpu/conv_winograd.py) for 3x3 stride-1 dense convolutions
# from these channel and output-pixel buckets; the implicit GEMM below them.  Measured
# 2026-12-02 (Sapphire Rapids, 2 threads, C -> C channels, pad 1, prepacked + bias + relu,
# medians of 7 interleaved batches; direct / Winograd us): 64 at 112x112 3126 / 2099, 64 at
# 56x56 922 / 736, 128 at 28x28 1030 / 879, 64 at 28x28 310 / 302, 32 at 112x112 975 / 911,
# 32 at 56x56 293 / 276, 256 at 14x14 1232 / 968; Winograd slower: 16 at 56x56 138 / 171, 16
# at 112x112 327 / 438, 32 at 28x28 143 / 154, 64 at 14x14 150 / 164, 128 at 14x14 364 / 399,
# 32 at 16x16 102 / 111, 512 at 7x7 1613 / 4277 (16 tiles: one task, one thread).  The rule
# keeps the clear wins; small images wait for tasks split over output channels.
WINOGRAD_MIN_CHANNELS = 64
WINOGRAD_MIN_PIXELS = 512

# Depthwise planes: serial below this many output elements (compared as the bucket, a power
# of two <= the size).  2^17 came from 2026-11-26 (Sapphire Rapids, numba's threads: 1x384x14x14
# serial / parallel 43 / 47 us back to back, 51 / 53 after 0.2 s idle).  Since the thread team
# and the compiled run_at hand-off (parallel.py), re-measured 2026-12-04 (Zen 4, 2 vCPUs, 3x3 +
# bias, float32, forced through dispatch; medians of 11-15 rounds, serial / parallel /
# onnxruntime us) in the report's own timing (bench.timing.interleaved, 0.2 s pauses):
# 1x32x14x14 (2^12.6) 31.9 / 32.4 / 18.0, 1x64x7x7 31.0 / 32.3 / 16.0, 1x320x7x7 (2^13.9) 49.0 /
# 44.7 / 34.9, 1x96x14x14 (2^14.2) 37.8 / 33.3 / 26.0, 1x144x14x14 41.0 / 38.8 / 33.2,
# 1x960x7x7 (2^15.5) 86.2 / 72.1 / 42.7, 1x384x14x14 (2^16.2, three runs) 69.8-73.2 / 53.4-55.8
# / 53.2-64.1, 1x576x14x14 97.7 / 76.0 / 94.2, 1x144x28x28 78.9 / 58.8 / 64.4; back to back
# (medians of 9 x 500 calls): 2^12.6 13.7 / 15.0, 2^13.9 21.5 / 21.0, 2^14.2 17.5 / 17.2, 2^16.2
# 36.2 / 29.5.  Parallel wins from 2^13.9 after a pause and ties from there in a loop.
DEPTHWISE_PARALLEL_THRESHOLD = 1 << 14


class ConvKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    batch: int          # bucket of N
    cin: int            # bucket of C
    cout: int           # bucket of Cout
    kind: str           # "dense" (groups 1), "grouped", "depthwise" (groups == C > 1)
    kernel: tuple       # (KH, KW)
    stride: tuple       # (sh, sw)
    dilation: tuple     # (dh, dw)
    pixels: int         # bucket of OH * OW
    size: int           # bucket of the output's element count
    act: int            # kernels_common.activation.ACT_*
    has_bias: bool
    prepacked: bool


class ConvArgs(NamedTuple):
    x: object           # (N, C, H, W) as given (or (C, H, W))
    weight: object      # (Cout, C / groups, KH, KW), the source array of a PackedWeight too
    bias: object        # (Cout,) or None
    stride: tuple       # (sh, sw)
    pad: tuple          # (top, left) padding; bottom / right follow from out_hw
    dilation: tuple     # (dh, dw)
    groups: int
    act: int
    out_hw: tuple       # (OH, OW)
    out: object
    packed: object      # the PackedWeight, or None


def _padding(padding, kh, kw, dil, stride):
    """(top, left, bottom, right) padding from the padding argument."""
    if isinstance(padding, str):
        V.choice("padding", padding, ["same", "valid"])
        if padding == "valid":
            return 0, 0, 0, 0
        if stride != (1, 1):
            raise ValueError(f"padding='same' needs stride 1 (as PyTorch), got stride={stride}")
        th, tw = dil[0] * (kh - 1), dil[1] * (kw - 1)
        return th // 2, tw // 2, th - th // 2, tw - tw // 2
    ph, pw = pair("padding", padding)
    return ph, pw, ph, pw


def _unpack(weight, groups):
    if not isinstance(weight, PackedWeight):
        return weight, None
    if weight.op != "conv2d":
        raise TypeError(f"weight is a PackedWeight packed for op={weight.op!r}; conv2d needs "
                        "prepack(..., op='conv2d')")
    if weight.groups != groups:
        raise ValueError(f"weight was packed with groups={weight.groups}, the call has groups={groups}")
    if weight.bf16_panels:   # conv_bf16.prepack_bf16's
        from .conv_bf16 import host_form   # (conv_bf16 imports this module's neighbours only)
        if weight.tile != host_form():
            raise ValueError(f"weight: PackedWeight holds panels of the {weight.tile} bfloat16 kernel; this host "
                             f"runs {host_form() or 'no bfloat16 convolution kernel'}: prepack it again")
        return weight.kernel_weight, weight
    tile = active_tile()
    if weight.tile != tile.name or weight._nr != tile.mr:  # packed for another register tile
        raise ValueError(f"weight: PackedWeight was packed for the {weight.tile} GEMM tile ({weight._nr}-row "
                         f"panels); the active tile is {tile.name}: prepack it again")
    return weight.kernel_weight, weight


def describe(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, activation=None, out=None):
    """Validate a conv2d call: Call.args = ConvArgs, key ConvKey."""
    groups = V.integer("groups", groups)
    if groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups}")
    weight, packed = _unpack(weight, groups)
    V.required(x=x, weight=weight)
    dev = V.device_of(x=x, weight=weight, bias=bias, out=out)
    dt = V.cpu_float_dtype("x", x, dev)
    V.same_dtype("weight", weight, "x", dt)
    if bias is not None:
        V.same_dtype("bias", bias, "x", dt)
    V.rank("x", x, (3, 4), " (N, C, H, W) or (C, H, W)")
    V.rank("weight", weight, 4, " (Cout, C / groups, KH, KW)")
    n, c, h, w = (1,) + tuple(x.shape) if x.ndim == 3 else tuple(x.shape)
    cout, cin_g, kh, kw = (int(s) for s in weight.shape)
    if c % groups:
        raise ValueError(f"groups={groups} must divide x's channels C={c}")
    if cout % groups:
        raise ValueError(f"groups={groups} must divide weight's output channels Cout={cout}")
    if cin_g * groups != c:
        raise ValueError(f"weight must have C / groups = {c // groups} input channels (x has C={c}, "
                         f"groups={groups}), got shape {tuple(weight.shape)}")
    if kh < 1 or kw < 1:
        raise ValueError(f"weight must have a kernel of at least 1x1, got shape {tuple(weight.shape)}")
    if bias is not None:
        V.shape("bias", bias, (cout,), " (Cout,) for weight's output channels")
    st = pair("stride", stride, minimum=1)
    dil = pair("dilation", dilation, minimum=1)
    pt, pl, pb, pr = _padding(padding, kh, kw, dil, st)
    oh = out_size(h + pb - pt, kh, st[0], pt, dil[0])
    ow = out_size(w + pr - pl, kw, st[1], pl, dil[1])
    if oh < 1 or ow < 1:
        raise ValueError(f"weight's kernel {kh}x{kw} (dilation {dil}) is larger than the padded input "
                         f"{h + pt + pb}x{w + pl + pr}")
    V.choice("activation", activation, list(ACTIVATION_CODES))
    code = ACTIVATION_CODES[activation]
    out_shape = ((n,) if x.ndim == 4 else ()) + (cout, oh, ow)
    V.out(out, out_shape, dt, x=x, weight=weight, bias=bias)
    kind = "dense" if groups == 1 else ("depthwise" if groups == c else "grouped")
    key = ConvKey("conv2d", dev, dt, bucket(n), bucket(c), bucket(cout), kind, (kh, kw), st, dil, bucket(oh * ow),
                  bucket(n * cout * oh * ow), code, bias is not None, packed is not None)
    return Call(key, ConvArgs(x, weight, bias, st, (pt, pl), dil, groups, code, (oh, ow), out, packed))


# ---- CPU ---------------------------------------------------------------------------------------

def _host_arrays(x, bias, out, cout, out_hw, dt):
    x4 = contiguous(x if x.ndim == 4 else x[None])
    out_shape = tuple(x4.shape[:1]) + (cout,) + tuple(out_hw)
    res = result_buffer(out, out_shape if x.ndim == 4 else out_shape[1:], dt)
    b = _zeros(cout, dt) if bias is None else contiguous(bias)  # shared, read-only
    return x4, res, res.reshape(out_shape), b


def _run_gemm(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
    dt = x.dtype
    cout, _, kh, kw = weight.shape
    x4, res, res4, b = _host_arrays(x, bias, out, cout, out_hw, dt)
    ap = packed.panels if packed is not None else K.pack_weight(contiguous(weight), groups)
    epi = bias is not None or act != 0
    K.conv_direct(x4, ap, b, res4, groups, kh, kw, stride, pad, dilation, epi, act, num_threads())
    return deliver(res, out)


def _depthwise(parallel):
    def run(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
        dt = x.dtype
        x4, res, res4, b = _host_arrays(x, bias, out, weight.shape[0], out_hw, dt)
        K.depthwise(x4, contiguous(weight), b, res4, stride, pad, dilation, bias is not None or act != 0, act,
                    num_threads() if parallel else 1)
        return deliver(res, out)

    return run


def _run_winograd(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
    dt = x.dtype
    x4, res, res4, b = _host_arrays(x, bias, out, weight.shape[0], out_hw, dt)
    up = packed.winograd if packed is not None else None
    if up is None:
        up = KW.pack_winograd(contiguous(weight))
    KW.conv_winograd(x4, up, b, res4, pad, act, num_threads())
    return deliver(res, out)


def _half(run32):
    """run32 for bfloat16 / float16 x, weight and bias as well (PyTorch's 16-bit conv2d on
    the CPU): x, weight and bias widened to float32 copies (O(input + weight) beside the
    O(output x C x KH x KW) work), the float32 kernel, the result rounded once to x's dtype."""
    def run(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
        if x.dtype.itemsize != 2:
            return run32(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed)
        # a PackedWeight's float32 panels (prepack of a 16-bit weight: its widened values) serve
        # a kernel that reads panels as they are, and the weight is not widened for it
        panels = packed is not None and not packed.bf16_panels and run32 in _READS_PANELS
        res32 = run32(params, widened(x), weight if panels else widened(weight),
                      None if bias is None else widened(bias), stride, pad, dilation, groups, act, out_hw, None,
                      packed if panels else None)
        res = result_buffer(out, res32.shape, x.dtype)   # C-contiguous: out itself, or copied into it
        KH.round_into(res32.reshape(-1), half_bits(res.reshape(-1)))
        return deliver(res, out)

    return run


# the float32 runs that take a PackedWeight's panels (and then read only the weight's shape)
_READS_PANELS = (_run_gemm, _run_winograd)


def _winograd_refusals(key):
    """Why cpu-winograd cannot run a call (empty: it can)."""
    why = []
    if key.kind != "dense":
        why.append(f"{key.kind} convolution (Winograd here: groups 1)")
    if key.kernel != (3, 3):
        why.append(f"kernel {key.kernel[0]}x{key.kernel[1]} (F(2x2, 3x3): 3x3 only)")
    if key.stride != (1, 1) or key.dilation != (1, 1):
        why.append(f"stride {key.stride}, dilation {key.dilation} (1 only)")
    return why


def _depthwise_only(key):
    return [] if key.kind == "depthwise" else [f"groups is not the channel count ({key.kind} convolution)"]


def _choose(key):
    names, reason = _choose_float(key)
    if V.is_bfloat16(key.dtype):
        from .conv_bf16 import order  # it imports this module's neighbours only
        return order(key, names, reason)
    return names, reason


def _choose_float(key):
    """The order of the float kernels (16-bit x widened to float32 first)."""
    if key.kind != "depthwise":
        if not _winograd_refusals(key) and min(key.cin, key.cout) >= WINOGRAD_MIN_CHANNELS \
                and key.pixels >= WINOGRAD_MIN_PIXELS:
            return (("cpu-winograd", "cpu-gemm"),
                    f"3x3 stride 1, channels bucket {min(key.cin, key.cout)} >= {WINOGRAD_MIN_CHANNELS}, output "
                    f"pixels bucket {key.pixels} >= {WINOGRAD_MIN_PIXELS}: Winograd F(2x2, 3x3) (2.25x fewer "
                    "multiply-adds)")
        return ("cpu-gemm", "cpu-winograd"), f"{key.kind} convolution: the implicit GEMM"
    if key.size < DEPTHWISE_PARALLEL_THRESHOLD:
        return (("cpu-depthwise-serial", "cpu-depthwise", "cpu-gemm"),
                f"depthwise, output size bucket {key.size} < {DEPTHWISE_PARALLEL_THRESHOLD}: one thread "
                "(measured crossover 2^14)")
    return (("cpu-depthwise", "cpu-depthwise-serial", "cpu-gemm"),
            f"depthwise, output size bucket {key.size} >= {DEPTHWISE_PARALLEL_THRESHOLD}: planes over threads")


def _flops(call):
    # the direct form's multiply-adds whatever runs it: cpu-winograd does 2.25x fewer, so its
    # GFLOP/s are effective ones (as cuDNN's for its Winograd algorithms)
    a = call.args
    cout, cin_g, kh, kw = a.weight.shape
    n = a.x.shape[0] if a.x.ndim == 4 else 1
    outs = n * cout * a.out_hw[0] * a.out_hw[1]
    return outs * (2 * cin_g * kh * kw + (a.bias is not None) + FLOPS_PER_ELEMENT[a.act])


def _bytes(call):
    a = call.args
    n = a.x.shape[0] if a.x.ndim == 4 else 1
    outs = n * a.weight.shape[0] * a.out_hw[0] * a.out_hw[1]
    return (a.x.size + a.weight.size + outs + (0 if a.bias is None else a.bias.size)) * a.x.dtype.itemsize


def _signature(i):
    """Benchmark / example inputs -> the call; without a "groups" parameter, groups is what
    the shapes imply (C / the weight's input channels)."""
    x, w = i["x"], i["weight"]
    kw = {k: i[k] for k in ("stride", "padding", "dilation", "groups", "activation") if k in i}
    if "groups" not in kw and hasattr(x, "shape") and hasattr(w, "shape"):
        kw["groups"] = max(1, x.shape[-3] // max(1, w.shape[1]))
    return (x, w, i.get("bias")), kw


def _synthesize(shapes, params, rng, dtype):
    """Benchmark inputs: x standard normal, weight scaled by 1/sqrt(fan-in) (He-like, so
    activations stay O(1) through the layer), bias small; all in the 16-bit dtype of a case
    with activations="bfloat16" / "float16"."""
    dtype = case_dtype(params, dtype)
    out = {}
    for name, shape in shapes.items():
        v = rng.standard_normal(shape)
        if name == "weight":
            v = v / np.sqrt(max(1, int(np.prod(shape[1:]))))
        elif name == "bias":
            v = 0.1 * v
        out[name] = v.astype(dtype)
    return out


# Warm-up / contract-test shapes (dispatch/examples.py): a new input pattern.  Depthwise
# (groups = C, multiplier 2), so that every CPU implementation takes them (the contract
# and thread tests force each one); the dense GEMM path is covered by "decode" (1x1) and
# by tests/test_conv.py.
EXAMPLE_SHAPES = {"conv2d": {
    "small": {"x": (2, 3, 9, 11), "weight": (6, 1, 3, 3), "bias": (6,)},
    "large": {"x": (1, 16, 40, 40), "weight": (32, 1, 3, 3), "bias": (32,)},
    "decode": {"x": (1, 8, 5, 5), "weight": (4, 8, 1, 1), "bias": (4,)},
}}


def _prepack_conv(weight, dt, op, groups):
    if groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups}")
    V.rank("weight", weight, 4, " (Cout, C / groups, KH, KW)")
    if weight.shape[0] % groups:
        raise ValueError(f"groups={groups} must divide weight's output channels Cout={weight.shape[0]}")
    src = _readonly_source(weight)
    if V.is_bfloat16(dt) and groups == 1:
        from .conv_bf16 import prepack_bf16   # (conv_bf16 imports this module's neighbours only)
        packed = prepack_bf16(src)
        if packed is not None:
            return packed
    # float32 / float64 panels; a 16-bit weight's widened values (the kernels that widen x run on them)
    w = np.ascontiguousarray(weight, dtype=np.float32 if V.is_half(dt) else dt)
    tile = active_tile()
    wino = KW.pack_winograd(w, tile) if groups == 1 and w.shape[2:] == (3, 3) else None
    return PackedWeight(op, src, K.pack_weight(w, groups, tile), tile.mr, groups, tile=tile.name, winograd=wino)


register_prepacker("conv2d", _prepack_conv, options=("groups",), half=True)
_DTYPES = FLOAT_DTYPES + V.HALF_DTYPES
_HALF_NOTE = ("; bfloat16 / float16 x, weight, bias: widened to float32 copies, the result rounded once to x's "
              "dtype")

def _dense_variants():
    """Op.variants for warmup: dense 3x3 convolutions (the examples above are depthwise),
    which cpu-winograd takes at stride 1 and cpu-gemm at any stride, each with the bias and
    the fused ReLU of a CNN layer."""
    def dense(stride):
        def make(args, kwargs):
            dt = args[0].dtype
            x, w, b = np.zeros((1, 8, 10, 10), dt), np.zeros((8, 8, 3, 3), dt), np.zeros(8, dt)
            return (x, w, b), dict(kwargs, stride=stride, padding=1, dilation=1, groups=1, activation="relu")
        return make

    return {"dense 3x3": dense(1), "dense 3x3 stride 2": dense(2)}


_conv2d = register_op(Op("conv2d", describe, family="conv", bound="compute", signature=_signature, flops=_flops,
                         memo=True, bytes=_bytes, variants=_dense_variants(),
                         # (+ bfloat16 on AMX tiles, which dispatch/ops/conv_bf16.py registers)
                         rules={"cpu": Rule(("cpu-gemm", "cpu-winograd", "cpu-depthwise", "cpu-depthwise-serial",
                                             "cpu-bf16-amx", "cpu-bf16-dot"), _choose)},
                         synthesize=_synthesize))
register(Implementation("conv2d", "cpu-gemm", "cpu", _half(_run_gemm), kernel_modules=_KERNELS, dtypes=_DTYPES,
                        notes=HOST_COPY_NOTE + "; implicit GEMM on the register-tiled micro-kernel, bias + activation "
                        "fused; each task (a run of output tiles) copies the input rows it reads, zero-padded and "
                        "phase-split (stride), and reads B from there through a k -> offset table (an unpadded "
                        "stride-1 1x1 packs each tile's B rows from x's channel planes instead); extra memory per "
                        "thread: a task's input rows and 4 tiles of output; the weight's panels packed per call, or "
                        "once when given as a PackedWeight" + _HALF_NOTE))
register(Implementation("conv2d", "cpu-winograd", "cpu", _half(_run_winograd), kernel_modules=_WINOGRAD_KERNELS,
                        dtypes=_DTYPES,
                        supports=_winograd_refusals,
                        notes=HOST_COPY_NOTE + "; 3x3 stride 1 by Winograd F(2x2, 3x3): 16 GEMMs of the transformed "
                        "filters and input tiles on the register-tiled micro-kernel, bias + activation fused into the "
                        "output transform; extra memory per thread: a task's input rows, 16 x C x NR transformed "
                        "tiles, 16 x MR x NR products; the filters transformed per call, or once by prepack"
                        + _HALF_NOTE))
register(Implementation("conv2d", "cpu-depthwise", "cpu", _half(_depthwise(True)), kernel_modules=_KERNELS,
                        dtypes=_DTYPES,
                        supports=_depthwise_only,
                        notes=HOST_COPY_NOTE + "; blocks of planes over threads; per plane register tiles of 7 rows x one "
                              "vector read with masked loads (column stride 1), else the stride phases" + _HALF_NOTE))
register(Implementation("conv2d", "cpu-depthwise-serial", "cpu", _half(_depthwise(False)), dtypes=_DTYPES,
                        kernel_modules=_KERNELS, supports=_depthwise_only,
                        notes=HOST_COPY_NOTE + "; one thread; per plane register tiles of 7 rows x one vector read with "
                              "masked loads (column stride 1), else the stride phases" + _HALF_NOTE))


@_conv2d.expose
def conv2d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, activation=None, out=None):
    """2-D convolution (cross-correlation, as torch.nn.functional.conv2d) of x (N, C, H, W)
    or (C, H, W) with weight (Cout, C / groups, KH, KW) (or a PackedWeight from
    prepack(weight, op="conv2d", groups=groups)), + bias (Cout,), then the activation.

    stride, dilation: int or pair >= 1; padding: int or pair >= 0, "valid" or "same"
    (stride 1); groups divides C and Cout.  Returns (N, Cout, OH, OW) with
    OH = (H + 2 ph - dh (KH - 1) - 1) // sh + 1 (likewise OW); out= receives it.
    float32 / float64; on the CPU also bfloat16 (ml_dtypes) or float16 x with weight and
    bias of its dtype (as PyTorch): widened to float32, the result rounded once to x's
    dtype (a PackedWeight takes float32 / float64 only)."""
    return _conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
                   activation=activation, out=out)
