"""Intel AMX (Advanced Matrix Extensions) as the CPU kernels reach it: the operating
system's permission, the tile configuration and the tile instructions' LLVM intrinsics,
in one place for every kernel that multiplies on tiles (kernels_cpu/int8_gemm.py's
tdpbusd, kernels_cpu/bf16_gemm.py's tdpbf16ps).

Eight tile registers tmm0-7 of up to 16 rows x 64 bytes; every kernel here configures
all eight as 16 x 64 bytes (palette 1), which is a C tile of 16 x 16 float32 / int32, an A
tile of 16 rows x 64 bytes of K (32 bfloat16 or 64 int8) and a B tile of 16 rows of K
groups (pairs of bfloat16, quads of int8) x 16 columns.  The tile registers are named by
immediates (the intrinsics LLVM keeps for _tile_loadd(0, ...)-style code), so one kernel's
tile code must sit in one LLVM function without calls between its instructions: the
registers are caller-saved.  The configuration is per thread: each worker loads it before
its first tile instruction and releases it after its last (`config`, fns()["release"]).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import target

TILE_ROWS, TILE_BYTES = 16, 64

_PERMISSION = None


def permission():
    """Ask Linux for the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA),
    once per process; None when granted, else the reason.  Without it the first tile
    instruction kills the process (SIGILL)."""
    global _PERMISSION
    if _PERMISSION is None:
        try:
            import ctypes
            import sys
            if not sys.platform.startswith("linux"):
                _PERMISSION = "AMX permission is requested through Linux's arch_prctl only"
            else:
                libc = ctypes.CDLL(None, use_errno=True)
                sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
                rc = libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)
                _PERMISSION = "" if rc == 0 else f"the kernel refused AMX tile state (errno {ctypes.get_errno()})"
        except Exception as exc:  # noqa: BLE001
            _PERMISSION = f"could not request AMX permission ({exc.__class__.__name__})"
    return _PERMISSION or None


def refusal(*kinds: str):
    """None when the target has AMX tiles with these kinds ("amx-int8", "amx-bf16") and Linux
    grants the tile state, else why not."""
    miss = target.missing("amx-tile", *kinds)
    if miss:
        return f"host {target.cpu_name()} lacks {', '.join(miss)}"
    return permission()


def config(builder):
    """ldtilecfg: palette 1, tiles 0-7 all TILE_ROWS rows x TILE_BYTES bytes."""
    i8 = ir.IntType(8)
    cfg = [0] * 64
    cfg[0] = 1
    for tile in range(8):
        cfg[16 + 2 * tile] = TILE_BYTES
        cfg[48 + tile] = TILE_ROWS
    arrty = ir.ArrayType(i8, 64)
    slot = cgutils.alloca_once(builder, arrty)
    builder.store(ir.Constant(arrty, [ir.Constant(i8, v) for v in cfg]), slot)
    builder.call(fns(builder)["cfg"], [builder.bitcast(slot, i8.as_pointer())])


def fns(builder):
    """The tile intrinsics, declared in builder's module: load / store (tile, address,
    stride in bytes), zero (tile), the dot products (c, a, b tiles) dpbusd (u8 x s8 into
    int32) and dpbf16ps (bfloat16 pairs into float32), cfg (ldtilecfg) and release."""
    i8, i64 = ir.IntType(8), ir.IntType(64)
    p8 = i8.as_pointer()
    mod = builder.module
    void = ir.VoidType()

    def fn(args, name):
        return cgutils.get_or_insert_function(mod, ir.FunctionType(void, args), name)

    return {"load": fn([i8, p8, i64], "llvm.x86.tileloadd64"),
            "store": fn([i8, p8, i64], "llvm.x86.tilestored64"),
            "dpbusd": fn([i8, i8, i8], "llvm.x86.tdpbusd"),
            "dpbf16ps": fn([i8, i8, i8], "llvm.x86.tdpbf16ps"),
            "zero": fn([i8], "llvm.x86.tilezero"),
            "cfg": fn([p8], "llvm.x86.ldtilecfg"),
            "release": fn([], "llvm.x86.tilerelease")}


def tiles_switch(begin, active):
    """An intrinsic f(flag): this thread's ldtilecfg (config; begin) or tilerelease (not
    begin), emitted when active(flag's numba type) is True, nothing when False; it does
    not type (numba tries the next form, the literal) when active gives None.  A kernel
    compiles one variant per literal, so only the AMX variant holds tile instructions."""
    def typer(typingctx, flag):
        on = active(flag)
        if on is None:
            return None

        def codegen(context, builder, sig, args):
            if on and begin:
                config(builder)
            elif on:
                builder.call(fns(builder)["release"], [])
            return context.get_dummy_value()

        return types.none(flag), codegen

    return intrinsic(typer)
