"""CUDA implementations of selective_scan ("cuda-chunked-scan") and selective_state_update
("cuda-update"), kernels_cuda/ssm.py.

selective_scan launch: one block per (batch, channel) row, a warp per 256 steps of the
sequence up to WARP_ROWS_THREADS (4 warps; the kernel's threads own ITEMS = 8 steps each
per pass, so one pass covers Mamba's 1024-step prefill and a short sequence does not
leave warps idle).  Mamba-130M's 1,536 channels (1.4B: 4,096) fill an H100's 132 SMs 11
(31) blocks deep.  selective_state_update launch: S = the power of two >= N (at most 32)
lanes per row, blocks of up to ELEMENTWISE_THREADS.  Neither is measured on a GPU (none
lent to this work): mamba-ssm's choices (128 threads per block for the scan) and the
usual elementwise block.
"""
from __future__ import annotations

import numpy as np

from kernels_common.cuda_tiles import ELEMENTWISE_THREADS, WARP_ROWS_THREADS

from .. import devices
from ..registry import fixed_rule, set_rule
from ._common import (DEVICE_COPY_NOTE, acc_dtype, as_input, c_view, cdiv, deliver, device_empty, dummy, kernels,
                      output, pow2_at_least, props, register_cuda)

# a warp per 256 steps: 32 threads of the kernel's ITEMS = 8 steps each (float32: one pass)
SCAN_PARAMS = {"block": WARP_ROWS_THREADS, "steps_per_warp": 256}
UPDATE_PARAMS = {"block": ELEMENTWISE_THREADS}


def _flags(K, softplus, **given):
    f = K.SOFTPLUS if softplus else 0
    for name, bit in (("D", K.HAS_D), ("z", K.HAS_Z), ("bias", K.HAS_BIAS), ("init", K.HAS_INIT)):
        if given.get(name) is not None:
            f |= bit
    return f


def scan_launch(params, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, return_last_state,
                out):
    batch, dim, L = (int(s) for s in u.shape)
    p = props()
    block = min(params["block"], p.max_threads_per_block, 32 * max(1, cdiv(L, params["steps_per_warp"])))
    return {"kernel": "ssm.chunked_scan", "grid": max(1, batch * dim), "block": block, "device": p.name}


def _run_scan(params, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, return_last_state, out):
    K = kernels("ssm")
    from numba import cuda

    ud = as_input(u)
    dt = np.dtype(ud.dtype)
    batch, dim, L = (int(s) for s in u.shape)
    N = int(A.shape[1])
    G = int(B.shape[1]) if len(B.shape) == 4 else 1
    acc = acc_dtype(dt)
    res, od = output(out, u.shape, dt)
    rows = batch * dim
    if L == 0:  # no step: the state is the initial one
        hs = cuda.to_device(np.zeros((batch, dim, N), acc)) if initial_state is None else \
            kernels("layout").copy(as_input(initial_state), device_empty((batch, dim, N), acc))
    else:
        hs = device_empty((batch, dim, N), acc)
        if rows:
            cfg = scan_launch(params, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state,
                              return_last_state, out)
            d1 = dummy(dt)
            K.scan_kernel(acc)[cfg["grid"], cfg["block"]](
                c_view(ud, rows, L), c_view(as_input(delta), rows, L), as_input(A),
                c_view(as_input(B), batch * G, N, L), c_view(as_input(C), batch * G, N, L),
                as_input(D) if D is not None else d1,
                c_view(as_input(z), rows, L) if z is not None else c_view(d1, 1, 1),
                as_input(delta_bias) if delta_bias is not None else d1,
                c_view(as_input(initial_state), rows, N) if initial_state is not None else c_view(dummy(acc), 1, 1),
                c_view(hs, rows, N), c_view(res, rows, L), dim, G,
                _flags(K, delta_softplus, D=D, z=z, bias=delta_bias, init=initial_state))
    y = deliver(res, od, out)
    return (y, hs) if return_last_state else y


def update_launch(params, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out):
    rows = int(x.shape[0]) * int(x.shape[1])
    lanes = min(32, pow2_at_least(max(1, int(A.shape[1]))))
    p = props()
    block = min(params["block"], p.max_threads_per_block, max(32, pow2_at_least(rows * lanes)))
    return {"kernel": "ssm.state_update", "grid": max(1, cdiv(rows * lanes, block)), "block": block,
            "lanes_per_row": lanes, "device": p.name}


def _run_update(params, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out):
    K = kernels("ssm")
    xd = as_input(x)
    dty = np.dtype(xd.dtype)
    batch, dim = (int(s) for s in x.shape)
    N = int(A.shape[1])
    G = int(B.shape[1]) if len(B.shape) == 3 else 1
    res, od = output(out, x.shape, dty)
    rows = batch * dim
    if rows:
        sdev = devices.as_device(state)
        sd = sdev if sdev.is_c_contiguous() else kernels("layout").contiguous(sdev)  # written back below
        cfg = update_launch(params, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out)
        d1 = dummy(dty)
        K.update_kernel(acc_dtype(dty))[cfg["grid"], cfg["block"]](
            c_view(sd, rows, N), c_view(xd, rows), c_view(as_input(dt), rows), as_input(A),
            c_view(as_input(B), batch * G, N), c_view(as_input(C), batch * G, N),
            as_input(D) if D is not None else d1, c_view(as_input(z), rows) if z is not None else d1,
            as_input(dt_bias) if dt_bias is not None else d1, c_view(res, rows), dim, G, cfg["lanes_per_row"],
            _flags(K, dt_softplus, D=D, z=z, bias=dt_bias))
        if sd is not sdev:
            kernels("layout").copy(sd, sdev)
    return deliver(res, od, out)


register_cuda("selective_scan", "cuda-chunked-scan", _run_scan, scan_launch, kernels=("ssm", "layout"),
              params=SCAN_PARAMS,
              notes="one block per (batch, channel), threads owning 8 consecutive steps each; per state a block scan "
                    "of the (prod exp(dt A), partial state) pairs, y in registers; float16 in float32; "
                    + DEVICE_COPY_NOTE)
set_rule("selective_scan", "cuda", fixed_rule(("cuda-chunked-scan",), "one kernel (chunked scan over the sequence)"))

register_cuda("selective_state_update", "cuda-update", _run_update, update_launch, kernels=("ssm", "layout"),
              params=UPDATE_PARAMS,
              notes="S = pow2(N) <= 32 lanes per (batch, channel), state updated in place, y reduced by shuffles; "
                    "float16 inputs with a float32 state; " + DEVICE_COPY_NOTE)
set_rule("selective_state_update", "cuda", fixed_rule(("cuda-update",), "one kernel (lanes per channel row)"))
