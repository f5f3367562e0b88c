"""bfloat16 attention on AMX tiles (issue #12): the implementation "cpu-flash-amx" of the
existing op "attention" (dispatch/ops/attention.py describes it and asks `first` whether
it leads for a key).

  cpu-flash-amx  kernels_cpu.attention_amx.flash_amx: q K^T and P V on AMX-BF16 tiles, the
                 online softmax in float32; bfloat16 q / k / v, causal or no mask (a mask
                 goes to the float32 kernels on widened copies, as does return_lse, whose
                 log-sum-exp the backward reads); any head dim (zero-padded to 32), GQA.
Where it cannot run (no AMX, a mask, return_lse) explain names why and the float32
kernels run on widened copies.
"""
from __future__ import annotations

import threading

import numpy as np

from kernels_common.attention import MASK_NONE
from kernels_cpu import attention_amx as KA

from ..registry import Implementation, register
from ..validate import BF16
from ._common import deliver, result_buffer, rows_input, supports_of, thread_buffer

_WORKSPACE = threading.local()
# K / V panels up to this many uint32 words per thread are kept for the next call (32 MiB)
KEEP_WORDS = 1 << 23


def _panels(name, words):
    """The calling thread's uint32 buffer `name` of `words`, on a cache line."""
    return thread_buffer(_WORKSPACE, name, words, np.uint32, KEEP_WORDS)


def _run(params, q, k, v, mask, causal, scale, out, return_lse=False):
    qc, kc, vc = rows_input(q), rows_input(k), rows_input(v)
    res = result_buffer(out, q.shape, q.dtype, rows=True)
    if res.size:
        B, Hkv, Skv, D = k.shape
        _, kw, vw = KA.sizes(Skv, D)
        KA.flash_amx(qc.view(np.uint16), kc.view(np.uint16), vc.view(np.uint16), causal, scale, res.view(np.uint16),
                     _panels("kp", B * Hkv * kw), _panels("vp", B * Hkv * vw))
    return deliver(res, out)


def refusal(key):
    """Why cpu-flash-amx cannot take this key (None: it can)."""
    if key.mask_kind != MASK_NONE:
        return "a mask: the AMX kernel takes causal or no mask"
    if key.lse:
        return "return_lse: the AMX kernel does not keep the rows' log-sum-exp"
    return KA.refusal()


def first(key):
    """The reason cpu-flash-amx leads for this key, or None when it does not."""
    if key.dtype != BF16 or refusal(key) is not None:
        return None
    return ("bfloat16 q / k / v on an AMX host: q K^T and P V on AMX-BF16 tiles (tdpbf16ps), no float32 copies")


register(Implementation(
    "attention", "cpu-flash-amx", "cpu", _run, dtypes=(BF16,), supports=supports_of(refusal), host=KA.refusal,
    kernel_modules=("kernels_cpu.attention_amx", "kernels_cpu.attention", "kernels_cpu.bf16_gemm", "kernels_cpu.amx",
                    "kernels_cpu.half", "kernels_cpu.approx", "kernels_cpu.parallel"),
    notes=("bfloat16 q / k / v on AMX-BF16 tiles: K and V of each (batch, kv head) packed once into the tiles' B "
           f"panels by packing tasks, then items of (batch, query head, {KA.AMX_ROWS} queries): S = q K^T on 2 x 2 "
           f"tiles per {KA.BKA} keys, the scaled online softmax in float32, P rounded to bfloat16, O += P V on tiles "
           "(float32 rows, rescaled between key blocks); causal blocks past the diagonal skipped; GQA; q/k/v/out "
           "views with unit-stride rows read and written in place")))
