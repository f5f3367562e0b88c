"""conv2d of bfloat16 x and weight on AMX tiles or AVX-512 BF16 (issue #12): float32 sums
of the exact products, the bias one more product in them, the activation, one rounding to
bfloat16 -- PyTorch's bfloat16 convolution on the CPU, without float32 copies.

This module registers the implementations "cpu-bf16-amx" and "cpu-bf16-dot" of the existing
op "conv2d" (dispatch/ops/conv.py describes it and asks `order` for bfloat16 keys):
  cpu-bf16-amx  dense convolutions (groups 1), any kernel, stride, padding, dilation, by
                kernels_cpu/conv_bf16.py in one of two forms (_direct says which): at stride
                1 the direct form (x copied once into channels-last rows that the A tiles
                read in place for every tap, the weight packed into B panels), else per
                image out (Cout, OH*OW) = [weight | bias] (Cout, Kc + 1) @ [col; 1] by
                kernels_cpu.bf16_gemm.run_amx, the im2col matrix col formed straight in the
                tiles' B panels by its packing tasks.
  cpu-bf16-dot  dense convolutions on hosts with AVX-512 BF16 but no AMX (Zen 4, Cooper
                Lake), by vdpbf16ps: at stride 1 the direct form (direct_worker's dot
                variant: register tiles of 6 pixels, their channel pairs read in place from
                the channels-last rows as broadcast words, x 64 output channels of the
                weight's panels, the bias added in float32); other strides per image
                [weight | bias] @ [col; 1] by kernels_cpu.bf16_gemm.run_kn, the im2col
                matrix formed by its packing tasks straight in its panels of 64 pixels.
Elsewhere (and grouped / depthwise), bfloat16 conv2d runs the float32 kernels on widened
copies (conv._half).
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from kernels_common.memory import aligned_empty
from kernels_cpu import bf16_gemm as KB
from kernels_cpu import conv_bf16 as KC
from kernels_common.activation import ACT_NONE
from kernels_cpu.parallel import only_if, worker_address

from ..registry import Implementation, register
from ..validate import BF16, is_bfloat16
from . import linalg as L
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer, supports_of, thread_buffer
from .bf16_matmul import _b_panels, _zeros
from .weight_only import _x_panels


def _direct(stride, c, cout, kh, kw) -> bool:
    """Whether a convolution runs the direct form (kernels_cpu/conv_bf16.py) rather than the
    im2col panels: stride 1, and a kernel of several taps (im2col copies x once per tap) or
    a 1x1 with at least as many input as output channels.  The direct form pays a transpose
    of x into channels-last rows and of the output tiles into channel rows; the im2col
    panels of a 1x1 are x's channel planes interleaved in pairs, and its tiles are already
    channel rows.  2 threads, + bias + relu, medians of 9 x 10 calls alternating in one
    process (Xeon with AMX, 2026-12-07, /tmp/w/cab.py), ms, direct / im2col: 3x3 64ch 56x56
    0.299 / 0.826, 3x3 256ch 14x14 0.411 / 0.709, 1x1 256->64 56x56 0.391 / 0.436, 1x1
    1024->256 14x14 0.303 / 0.341, 1x1 64->256 56x56 0.67 / 0.425."""
    return stride == (1, 1) and (kh * kw > 1 or c >= cout)


def _run(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed, dot):
    """Both bfloat16 implementations: AMX tiles, or (dot) vdpbf16ps."""
    x4 = contiguous(x if x.ndim == 4 else x[None])
    n, c, h, w = x4.shape
    cout, _, kh, kw = weight.shape
    oh, ow = out_hw
    out_shape = (n, cout, oh, ow)
    res = result_buffer(out, out_shape if x.ndim == 4 else out_shape[1:], x.dtype)
    direct = stride == (1, 1) if dot else _direct(stride, c, cout, kh, kw)
    if res.size:
        KC.compile_kernels(direct, act, dot)
    if res.size and direct:
        nxq, nwq = KC.direct_shapes(n, c, h, w, cout, kh, kw, pad, dilation, out_hw, dot)[:2]
        b32 = _zeros(cout) if bias is None else np.asarray(bias, np.float32)
        ready = packed is not None and packed.tile == _FORMS[dot]   # prepack_bf16's panels: not packed again
        wq = packed.panels if ready else thread_buffer(_WORKSPACE, "wq", nwq, np.uint32, L.WORKSPACE_KEEP // 4)
        KC.run_direct(x4.view(np.uint16), contiguous(weight).view(np.uint16), b32, bias is not None, act, pad, dilation,
                      out_hw, res.reshape(n, cout, oh * ow).view(np.uint16),
                      thread_buffer(_WORKSPACE, "xq", nxq, np.uint16, L.WORKSPACE_KEEP // 2), wq, dot, ready)
    elif res.size:
        kc = c * kh * kw
        k = kc + (bias is not None)
        k += dot and k % 2   # vdpbf16ps reads the A rows in pairs: a zero column (times col's row of ones)
        wb = np.zeros((1, cout, k), np.uint16)   # the A rows: the weight, then the bias's column
        wb[0, :, :kc] = np.asarray(weight).reshape(cout, kc).view(np.uint16)
        if bias is not None:
            wb[0, :, kc] = np.asarray(bias).view(np.uint16)
        npix = oh * ow
        packer = (worker_address(KC.im2col_pairs, (only_if(dot),)),
                  KC.geometry(c, h, w, kh, kw, stride, pad, dilation, out_hw, kc), npix, KC.pack_tasks(k, dot))
        a_of, b_of = _images(n)
        out3 = res.reshape(n, cout, npix).view(np.uint16)
        if dot:
            KB.run_kn(wb, x4.view(np.uint16), _zeros(npix), act, out3, _b_panels(KB.kn_dot_panels_size(n, k, npix)),
                      False, a_of, b_of, packer)
        else:
            KB.run_amx(wb, x4.view(np.uint16), True, _zeros(npix), act, out3, _x_panels(cout, k, True, 1), False, a_of,
                       b_of, _b_panels(KB.kn_panels_size(n, k, npix)), packer)
    return deliver(res, out)


def _run_amx(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
    return _run(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed, False)


def _run_dot(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed):
    return _run(params, x, weight, bias, stride, pad, dilation, groups, act, out_hw, out, packed, True)


_WORKSPACE = threading.local()
_FORMS = {False: "bf16-amx", True: "bf16-dot"}   # PackedWeight.tile of each form's panels (by dot)


def host_form():
    """The PackedWeight.tile of the bfloat16 panels this host's dense convolutions run on
    ("bf16-amx", "bf16-dot"), or None where bfloat16 convolutions are widened to float32."""
    if KB.amx_refusal() is None:
        return _FORMS[False]
    return _FORMS[True] if KB.host_refusal() is None else None


def prepack_bf16(src):
    """prepack(weight, op="conv2d") of a bfloat16 weight (Cout, C, KH, KW), groups 1, on a
    host with a bfloat16 form: the direct form's panels, packed by its own packing tasks
    (kernels_cpu.conv_bf16.pack_direct_weight), which stride-1 calls then skip; strided
    calls (and the AMX form's 1x1 with Cin < Cout) read the source as they do unpacked.
    None on other hosts (the caller packs the widened values for the float32 kernels)."""
    form = host_form()
    if form is None:
        return None
    dot = form == _FORMS[True]
    w16 = contiguous(src).view(np.uint16)
    wq = aligned_empty(KC.direct_weight_words(src.shape, dot), np.uint32)
    KC.compile_kernels(True, ACT_NONE, dot)
    KC.pack_direct_weight(w16, wq, dot)
    return L.PackedWeight("conv2d", src, wq, KB.NR if dot else KB.AMX_NR, 1, tile=form)


@functools.lru_cache(maxsize=64)
def _images(n):
    """run_amx's (a_of, b_of) for n images: the one weight matrix, image e's panels."""
    return np.zeros(n, np.int64), np.arange(n, dtype=np.int64)


def _refusal_on(host_refusal):
    """A conv2d key's refusal for a bfloat16 kernel whose host check is host_refusal()."""
    def refusal(key):
        if not is_bfloat16(key.dtype):
            return f"{key.dtype} x (bfloat16 only)"
        if key.kind != "dense":
            return f"{key.kind} convolution (groups 1 only)"
        return host_refusal()
    return refusal


refusal = _refusal_on(KB.amx_refusal)
refusal.__doc__ = "Why cpu-bf16-amx cannot take this conv2d key (None: it can)."
dot_refusal = _refusal_on(KB.host_refusal)
dot_refusal.__doc__ = "Why cpu-bf16-dot cannot take this conv2d key (None: it can)."


def order(key, names, reason):
    """The CPU candidates for a bfloat16 conv2d key, best first, and why: AMX tiles where the
    host has them (dense convolutions), else vdpbf16ps where it has AVX-512 BF16 (dense, stride
    1), else conv's float32 kernels on widened copies in their own order (names, reason)."""
    why = refusal(key)
    if why is not None:   # (a float16 key is refused by both: widened)
        dot_why = dot_refusal(key)
        if dot_why is None:
            return (("cpu-bf16-dot",) + tuple(names) + ("cpu-bf16-amx",),
                    f"bfloat16 x and weight, dense, no AMX ({why}): AVX-512 BF16 (vdpbf16ps), no float32 copies; "
                    + ("stride 1: the direct form (x copied once into channels-last rows the tiles read at every tap)"
                       if key.stride == (1, 1) else "stride > 1: the im2col matrix formed in the tiles' panels"))
        return (tuple(names) + ("cpu-bf16-amx", "cpu-bf16-dot"),
                f"bfloat16 widened to float32 ({why}; {dot_why}); {reason}")
    return (("cpu-bf16-amx",) + tuple(names) + ("cpu-bf16-dot",),
                "bfloat16 x and weight, dense, on an AMX host: AMX-BF16 tiles (tdpbf16ps), no float32 copies; "
                + ("stride 1: the direct form (x copied once into channels-last rows the tiles read at every tap)"
                   if key.stride == (1, 1) and key.kernel != (1, 1) else
                   "the direct form where Cin >= Cout, else the im2col matrix in the tiles' panels (1x1, stride 1)"
                   if key.stride == (1, 1) else "stride > 1: the im2col matrix formed in the tiles' panels"))


_NOTES = (HOST_COPY_NOTE + "; bfloat16 x and weight on AMX-BF16 tiles (tdpbf16ps), float32 sums of exact products, "
          "bias and activation on them, one rounding to bfloat16.  Stride 1 (a 1x1 only with Cin >= Cout): the direct "
          "form, x copied once into zero-padded channels-last rows (2 x Cin x (H + pads) x (W + pads) bytes per image) "
          "that the tiles read in place for every tap, the weight packed per call into B panels (once by "
          "dispatch.prepack), pixels x channels "
          "tiles transposed into the output's rows; else per image the weight (with the bias as one more column) "
          "times the im2col matrix, formed by the GEMM's packing tasks straight in the tiles' B panels (2 x Cin x KH "
          "x KW x OH x OW bytes per image)")

_KERNELS = ("kernels_cpu.conv_bf16", "kernels_cpu.bf16_gemm", "kernels_cpu.half", "kernels_cpu.gemm",
            "kernels_cpu.approx", "kernels_cpu.parallel")
register(Implementation("conv2d", "cpu-bf16-amx", "cpu", _run_amx, dtypes=(BF16,), supports=supports_of(refusal),
                        notes=_NOTES, kernel_modules=_KERNELS + ("kernels_cpu.amx",), host=KB.amx_refusal))
_NOTES_DOT = (HOST_COPY_NOTE + "; bfloat16 x and weight by AVX-512 BF16 (vdpbf16ps), float32 sums of exact products, "
              "bias and activation on them, one rounding to bfloat16.  Stride 1: the direct form, x copied once into "
              "zero-padded channels-last rows (2 x Cin x (H + pads) x (W + pads) bytes per image) whose channel pairs "
              "are the broadcast words of register tiles of 6 output pixels (the output's own, each row addressed apart) x "
              "64 output channels (the weight packed per call into panels of 64 channels, once by dispatch.prepack), "
              "a kernel row's taps one K run, pixels x channels tiles transposed into the "
              "output's rows; other strides per image the weight (with the bias as one more column) times the im2col "
              "matrix, formed by the packing tasks straight in panels of 64 pixels (2 x Cin x KH x KW x OH x OW bytes "
              "per image), 6 output channels x 64 pixels per tile")
register(Implementation("conv2d", "cpu-bf16-dot", "cpu", _run_dot, dtypes=(BF16,), supports=supports_of(dot_refusal),
                        notes=_NOTES_DOT, kernel_modules=_KERNELS, host=KB.host_refusal))
