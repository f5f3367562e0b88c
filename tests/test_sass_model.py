"""bench/sass.py (the hot loop of a kernel's SASS, counted) and bench/cuda_model.py (memory and
issue bounds).  The listings are nvdisasm output (``nvdisasm -c -ndf``, section directives
trimmed) of small kernels written in PTX and assembled with ptxas -arch=sm_80 (CUDA 13.5
wheels), except BREAK_OUT, shaped after gemm.gemv_kn's sm_80 code (a loop left by
CALL.REL.NOINC).  No GPU needed; the one real build skips without ptxas / nvdisasm."""
import math
import os

import numpy as np
import pytest

from bench import cuda_model as M
from bench import sass
from tests.support import ON_CUDA

pytestmark = pytest.mark.skipif(ON_CUDA, reason="static tools, no device")

# for (i = 0; i < n; i++) acc += s[i & 1023]^2 after staging a float4 per thread in shared memory
LOOP = """
//--------------------- .text.dot                 --------------------------
        .other          dot,@"STO_CUDA_ENTRY STV_DEFAULT"
dot:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R8, SR_TID.X ;
        /*0020*/                   HFMA2.MMA R3, -RZ, RZ, 0, 9.5367431640625e-07 ;
        /*0030*/                   ULDC.64 UR4, c[0x0][0x118] ;
        /*0040*/                   IMAD.WIDE.U32 R2, R8, R3, c[0x0][0x160] ;
        /*0050*/                   LDG.E.128 R4, [R2.64] ;
        /*0060*/                   HFMA2.MMA R9, -RZ, RZ, 0, 0 ;
        /*0070*/                   MOV R0, RZ ;
        /*0080*/                   STS.128 [R8.X16+`($__sm__10)], R4 ;
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_0:
        /*00a0*/                   IMAD.SHL.U32 R2, R0.reuse, 0x4, RZ ;
        /*00b0*/                   IADD3 R0, R0, 0x1, RZ ;
        /*00c0*/                   LOP3.LUT R2, R2, 0xffc, RZ, 0xe2, !PT ;
        /*00d0*/                   ISETP.GE.U32.AND P0, PT, R0, c[0x0][0x170], PT ;
        /*00e0*/                   LDS R2, [R2+`($__sm__10)] ;
        /*00f0*/                   FFMA R9, R2, R2, R9 ;
        /*0100*/              @!P0 BRA `(.L_x_0) ;
        /*0110*/                   HFMA2.MMA R3, -RZ, RZ, 0, 2.384185791015625e-07 ;
        /*0120*/                   IMAD.WIDE.U32 R2, R8, R3, c[0x0][0x168] ;
        /*0130*/                   STG.E [R2.64], R9 ;
.L_x_2:
        /*0140*/                   EXIT ;
.L_x_1:
        /*0150*/                   BRA `(.L_x_1);
        /*0160*/                   NOP;
.L_x_3:
"""

# an outer loop over n (global load, shared store, barriers) around an 8-trip inner loop
# (2 LDS, 2 FFMA; .pragma "nounroll"), then a 4-trip epilogue loop of 3 FFMA outside it
NEST = """
//--------------------- .text.__cuda_sm70_shflsync_bfly --------------------------
        .weak           __cuda_sm70_shflsync_bfly
__cuda_sm70_shflsync_bfly:
        /*0000*/                   WARPSYNC R7 ;
        /*0010*/                   SHFL.BFLY PT, R4, R4, R5, R6 ;
        /*0020*/                   RET.ABS.NODEC R20 0x0 ;
.L_x_0:
        /*0030*/                   BRA `(.L_x_0);
.L_x_6:
//--------------------- .text.nest                --------------------------
        .other          nest,@"STO_CUDA_ENTRY STV_DEFAULT"
nest:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R7, SR_TID.X ;
        /*0020*/                   HFMA2.MMA R5, -RZ, RZ, 0, 0 ;
        /*0030*/                   MOV R0, RZ ;
        /*0040*/                   ULDC.64 UR4, c[0x0][0x118] ;
.L_x_2:
        /*0050*/                   IMAD.MOV.U32 R8, RZ, RZ, 0x4 ;
        /*0060*/                   IMAD.WIDE.U32 R2, R0, R8, c[0x0][0x160] ;
        /*0070*/                   LDG.E R2, [R2.64] ;
        /*0080*/                   IADD3 R0, R0, 0x1, RZ ;
        /*0090*/                   MOV R4, RZ ;
        /*00a0*/                   ISETP.GE.U32.AND P1, PT, R0, c[0x0][0x170], PT ;
        /*00b0*/                   STS [R7.X4+`($__sm__10)], R2 ;
        /*00c0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_1:
        /*00d0*/                   IMAD.IADD R2, R7, 0x1, R4 ;
        /*00e0*/                   IADD3 R4, R4, 0x1, RZ ;
        /*00f0*/                   SHF.L.U32 R2, R2, 0x2, RZ ;
        /*0100*/                   ISETP.GE.U32.AND P0, PT, R4, 0x8, PT ;
        /*0110*/                   LOP3.LUT R2, R2, 0xffc, RZ, 0xe2, !PT ;
        /*0120*/                   LDS R6, [R2+`($__sm__10)] ;
        /*0130*/                   LDS R3, [R2+`(($__sm__10 + 0x4))] ;
        /*0140*/                   FFMA R6, R6, R3, R5 ;
        /*0150*/                   FFMA R5, R3, R3, R6 ;
        /*0160*/              @!P0 BRA `(.L_x_1) ;
        /*0170*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0180*/              @!P1 BRA `(.L_x_2) ;
        /*0190*/                   HFMA2.MMA R0, -RZ, RZ, 0, 0 ;
.L_x_3:
        /*01a0*/                   IADD3 R0, R0, 0x1, RZ ;
        /*01b0*/                   FFMA R5, R5, R5, R5 ;
        /*01c0*/                   ISETP.GE.U32.AND P0, PT, R0, 0x4, PT ;
        /*01d0*/                   FFMA R5, R5, R5, R5 ;
        /*01e0*/                   FFMA R5, R5, R5, R5 ;
        /*01f0*/              @!P0 BRA `(.L_x_3) ;
        /*0200*/                   IMAD.WIDE.U32 R2, R7, R8, c[0x0][0x168] ;
        /*0210*/                   STG.E [R2.64], R5 ;
.L_x_5:
        /*0220*/                   EXIT ;
.L_x_4:
        /*0230*/                   BRA `(.L_x_4);
.L_x_7:
"""

# a grid-stride loop with a shuffle: ptxas puts the diverged-warp path (the shfl helper call)
# out of line after EXIT, jumping back into the loop
DIVERGE = """
//--------------------- .text.__cuda_sm70_shflsync_bfly --------------------------
        .weak           __cuda_sm70_shflsync_bfly
__cuda_sm70_shflsync_bfly:
        /*0000*/                   WARPSYNC R7 ;
        /*0010*/                   SHFL.BFLY PT, R4, R4, R5, R6 ;
        /*0020*/                   RET.ABS.NODEC R20 0x0 ;
.L_x_1:
        /*0030*/                   BRA `(.L_x_1);
.L_x_11:
//--------------------- .text.div                 --------------------------
        .other          div,@"STO_CUDA_ENTRY STV_DEFAULT"
div:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R18, SR_TID.X ;
        /*0020*/                   ULDC.64 UR36, c[0x0][0x118] ;
        /*0030*/                   BSSY B6, `(.L_x_2) ;
        /*0040*/                   HFMA2.MMA R3, -RZ, RZ, 0, 0 ;
        /*0050*/                   ISETP.GE.U32.AND P0, PT, R18, c[0x0][0x170], PT ;
        /*0060*/               @P0 BRA `(.L_x_3) ;
        /*0070*/                   MOV R16, R18 ;
.L_x_5:
        /*0080*/                   HFMA2.MMA R5, -RZ, RZ, 0, 2.384185791015625e-07 ;
        /*0090*/                   IMAD.WIDE.U32 R4, R16, R5, c[0x0][0x160] ;
        /*00a0*/                   LDG.E R4, [R4.64] ;
        /*00b0*/                   IADD3 R16, R16, 0x20, RZ ;
        /*00c0*/                   ISETP.GE.U32.AND P0, PT, R16, c[0x0][0x170], PT ;
        /*00d0*/                   P2R R17, PR, RZ, 0x1 ;
        /*00e0*/                   FFMA R2, R4, R4, R3 ;
        /*00f0*/                   BRA.DIV ~URZ, `(.L_x_4) ;
.L_x_8:
        /*0100*/                   SHFL.BFLY PT, R4, R2, 0x1, 0x1f ;
.L_x_6:
        /*0110*/                   ISETP.NE.AND P0, PT, R17, RZ, PT ;
        /*0120*/                   FADD R3, R2, R4 ;
        /*0130*/              @!P0 BRA `(.L_x_5) ;
.L_x_3:
        /*0140*/                   BSYNC B6 ;
.L_x_2:
        /*0150*/                   MOV R19, 0x4 ;
        /*0160*/                   IMAD.WIDE.U32 R18, R18, R19, c[0x0][0x168] ;
        /*0170*/                   STG.E [R18.64], R3 ;
.L_x_10:
        /*0180*/                   EXIT ;
.L_x_4:
        /*0190*/                   IMAD.MOV.U32 R4, RZ, RZ, R2 ;
        /*01a0*/                   MOV R6, 0x1f ;
        /*01b0*/                   IMAD.MOV.U32 R5, RZ, RZ, 0x1 ;
        /*01c0*/                   MOV R20, 32@lo((div + .L_x_0@srel)) ;
        /*01d0*/                   IMAD.MOV.U32 R7, RZ, RZ, -0x1 ;
        /*01e0*/                   MOV R21, 32@hi((div + .L_x_0@srel)) ;
.L_x_9:
        /*01f0*/                   CALL.ABS.NOINC `(__cuda_sm70_shflsync_bfly) ;
.L_x_0:
        /*0200*/                   BRA `(.L_x_6) ;
.L_x_7:
        /*0210*/                   BRA `(.L_x_7);
.L_x_12:
"""

# an inner loop left by a predicated CALL.REL.NOINC (out of the BSSY region), nested in an
# outer loop
BREAK_OUT = """
//--------------------- .text.brk                 --------------------------
        .other          brk,@"STO_CUDA_ENTRY STV_DEFAULT"
brk:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   MOV R0, RZ ;
.L_x_3:
        /*0020*/                   IMAD.MOV.U32 R4, RZ, RZ, RZ ;
        /*0030*/                   BSSY B0, `(.L_x_1) ;
.L_x_0:
        /*0040*/                   LDG.E.64 R2, [R6.64] ;
        /*0050*/                   IADD3 R4, R4, 0x1, RZ ;
        /*0060*/                   ISETP.GE.U32.AND P1, PT, R4, c[0x0][0x170], PT ;
        /*0070*/                   FFMA R5, R2, R3, R5 ;
        /*0080*/               @P1 CALL.REL.NOINC `(.L_x_1) ;
        /*0090*/                   BRA `(.L_x_0) ;
.L_x_1:
        /*00a0*/                   BSYNC B0 ;
        /*00b0*/                   IADD3 R0, R0, 0x1, RZ ;
        /*00c0*/                   ISETP.GE.U32.AND P0, PT, R0, c[0x0][0x174], PT ;
        /*00d0*/              @!P0 BRA `(.L_x_3) ;
        /*00e0*/                   STG.E [R8.64], R5 ;
        /*00f0*/                   EXIT ;
.L_x_2:
        /*0100*/                   BRA `(.L_x_2);
"""

NO_LOOP = """
//--------------------- .text.axpy                --------------------------
        .other          axpy,@"STO_CUDA_ENTRY STV_DEFAULT"
axpy:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.U16 R2, [R4.64] ;
        /*0020*/                   HADD2.F32 R2, -RZ, R2.H0_H0 ;
        /*0030*/                   FFMA R2, R2, 2, R3 ;
        /*0040*/                   STG.E [R6.64], R2 ;
        /*0050*/                   EXIT ;
.L_x_0:
        /*0060*/                   BRA `(.L_x_0);
        /*0070*/                   NOP;
"""


def _pick(d, keys):
    return {k: d[k] for k in keys}


KEYS = ("scope", "ffma", "hmma", "ld_shared", "ld_global", "st", "bra", "call", "total")


def test_single_loop_counts():
    r = sass.inner_loop(LOOP)
    assert _pick(r, KEYS) == dict(scope="loop", ffma=1, hmma=0, ld_shared=1, ld_global=0, st=0, bra=1, call=0, total=7)
    assert (r["start"], r["end"], r["ld_shared_bytes"], r["fixed_trips"]) == (0xA0, 0x100, 4, False)
    assert r["hfma2"] == 0  # the HFMA2.MMA constant moves are no arithmetic


def test_nested_loop_beats_a_fixed_trip_epilogue():
    r = sass.inner_loop(NEST)
    # the 8-trip inner loop, not the outer loop and not the epilogue with more FFMAs
    assert _pick(r, KEYS) == dict(scope="loop", ffma=2, hmma=0, ld_shared=2, ld_global=0, st=0, bra=1, call=0, total=10)
    assert (r["start"], r["end"], r["ld_shared_bytes"]) == (0xD0, 0x160, 8)
    inner, epilogue = r["loops"]
    assert (inner["nested"], inner["fixed_trips"]) == (True, True)
    assert (epilogue["start"], epilogue["nested"], epilogue["fixed_trips"], epilogue["ffma"]) == (0x1A0, False, True, 3)


def test_nested_loop_beats_a_runtime_epilogue():
    # NEST with the epilogue's exit test against a kernel argument instead of 4: a loop after
    # the tile loop whose trip count the SASS does not show; the nested loop still wins
    text = NEST.replace("ISETP.GE.U32.AND P0, PT, R0, 0x4, PT", "ISETP.GE.U32.AND P0, PT, R0, c[0x0][0x174], PT")
    r = sass.inner_loop(text)
    assert (r["start"], r["ffma"], r["total"]) == (0xD0, 2, 10)
    assert [(lp["nested"], lp["fixed_trips"]) for lp in r["loops"]] == [(True, True), (False, False)]


def test_divergent_path_is_no_loop():
    r = sass.inner_loop(DIVERGE)
    assert _pick(r, KEYS) == dict(scope="loop", ffma=1, hmma=0, ld_shared=0, ld_global=1, st=0, bra=2, call=0, total=12)
    assert (r["start"], r["end"], r["ld_global_bytes"]) == (0x80, 0x130, 4)
    assert len(r["loops"]) == 1


def test_call_rel_noinc_leaves_the_loop():
    r = sass.inner_loop(BREAK_OUT)
    assert _pick(r, KEYS) == dict(scope="loop", ffma=1, hmma=0, ld_shared=0, ld_global=1, st=0, bra=1, call=1, total=6)
    assert (r["start"], r["end"], r["ld_global_bytes"], r["fixed_trips"]) == (0x40, 0x90, 8, False)
    assert r["loops"][0]["nested"]


def test_kernel_without_loops_counts_the_whole_body():
    r = sass.inner_loop(NO_LOOP)
    assert _pick(r, KEYS) == dict(scope="kernel", ffma=1, hmma=0, ld_shared=0, ld_global=1, st=1, bra=0, call=0, total=6)
    assert (r["ld_global_bytes"], r["st_global_bytes"]) == (2, 4)


def test_unreadable_input_degrades_to_an_error():
    assert "error" in sass.inner_loop("")
    assert "error" in sass.analyze("/nonexistent/kernel.o", nvdisasm="/nonexistent/nvdisasm")


# ---- the model's bounds on synthetic kernels ---------------------------------------------------

def _launch(chip):
    from dispatch import devices

    props = devices.CHIPS[M.SPECS[chip].arch]
    return M.SPECS[chip], props, {"grid": props.sm_count * 8, "block": 256}  # 8 blocks of 8 warps per SM


def test_memory_bound_is_bandwidth_or_littles_law():
    chip, props, cfg = _launch("H100 SXM")
    nbytes = 2.0**30
    # 16 B in flight per thread x 32 lanes x 64 warps x 132 SMs / 600 ns = 7.2 TB/s > 3.35 TB/s
    b = M.bounds(chip, props, cfg, 1.0, nbytes, None, None, 16)
    assert b["bandwidth"] == 3.35e12 and b["memory_s"] == pytest.approx(nbytes / 3.35e12)
    assert M.combine(b) == (pytest.approx(nbytes / 3.35e12), "memory")
    # 4 B: 132 x 64 x 32 x 4 = 1,081,344 B in flight / 600 ns = 1.802 TB/s
    b = M.bounds(chip, props, cfg, 1.0, nbytes, None, None, 4)
    assert b["bandwidth"] == pytest.approx(1_081_344 / 600e-9)
    assert b["memory_s"] == pytest.approx(2**30 / 1.80224e12)
    # a quarter of the warps resident: a quarter of the bytes in flight
    assert M.bounds(chip, props, cfg, 0.25, nbytes, None, None, 4)["bandwidth"] == pytest.approx(1_081_344 / 4 / 600e-9)


def test_issue_bound_of_a_pure_ffma_loop():
    ffma_only = dict.fromkeys(M._MIX, 0.0)
    ffma_only.update(total=1.0, ffma=1.0)
    fmas = 2.0**30
    # A100: 2 FFMA warp-instructions per SM clock (19.5 TFLOPS = 108 x 64 lanes x 2 x 1.41 GHz), half
    # the issue rate: the FP32 pipe bounds it, 2^30 x 2 / 19.5e12 s
    chip, props, cfg = _launch("A100 80GB SXM")
    b = M.bounds(chip, props, cfg, 1.0, 0.0, ffma_only, fmas, 4)
    assert b["issue_pipe"] == "fp32" and b["issue_s"] == pytest.approx(2 * fmas / 19.5e12)
    assert b["pipes_s"]["issue"] == pytest.approx(fmas / 32 / 108 / (4 * 1.41e9))
    assert b["warp_instructions"]["ffma"] == fmas / 32
    assert M.combine(b)[1] == "issue"
    # H100, 3 instructions per FFMA: issue-bound at 3 x 2^30 / 32 warp-instructions / (132 x 4 x 1.98 GHz)
    chip, props, cfg = _launch("H100 SXM")
    mix = dict(ffma_only, total=3.0)
    b = M.bounds(chip, props, cfg, 1.0, 0.0, mix, fmas, 4)
    assert b["issue_pipe"] == "issue" and b["issue_s"] == pytest.approx(3 * fmas / 32 / 132 / (4 * 1.98e9))
    # one block of one warp: one SM, one instruction per clock
    b = M.bounds(chip, props, {"grid": 1, "block": 32}, 1.0, 0.0, mix, 32 * 1000.0, 4)
    assert b["issue_s"] == pytest.approx(3 * 1000 / 1.98e9)


def test_tiny_kernels_are_launch_bound():
    chip, props, cfg = _launch("H100 SXM")
    b = M.bounds(chip, props, cfg, 1.0, 1024.0, None, None, 4)
    assert M.combine(b, 2) == (pytest.approx(2 * M.LAUNCH_S), "launch")


def test_gemm_work_from_the_tile_and_k():
    from bench.cases import case
    from dispatch import registry

    c = case("matmul", "t", "test", {"a": (300, 200), "b": (200, 100)})
    op, call = registry.OPS["matmul"], M.describe(c, np.float32)
    cfg = {"kernel": "gemm.64x64x16/4x4", "tile": "64x64x16/4x4", "grid": (2 * 5, 1, 1), "block": 256}
    loop = {"ffma": 16, "ld_shared": 8, "total": 59,
            "loops": [{"ffma": 16, "ld_shared": 8, "total": 59, "nested": True, "fixed_trips": False},
                      {"ffma": 300, "total": 900, "nested": False, "fixed_trips": True}]}  # the epilogue: left out
    w = M.work(cfg["kernel"], cfg, call, op, loop, 4)
    assert (w["kind"], w["units"]) == ("fma", 10 * 64 * 64 * 208)  # K = 200 rounded up to BK = 16
    assert w["per_unit"]["total"] == pytest.approx(59 / 16) and w["per_unit"]["ffma"] == 1.0
    assert w["inflight"] == M.MIN_INFLIGHT  # no loop loads from global memory
    # with the k-step's staging (the enclosing loop: 417 instructions, 12 global loads of 4 B per
    # 4 x 4 x 16 FMAs per thread)
    w = M.work(cfg["kernel"], cfg, call, op, dict(loop, outer={"total": 417, "ld_global": 12, "ld_global_bytes": 48}), 4)
    assert w["per_unit"]["total"] == pytest.approx(59 / 16 + 417 / 256) and w["inflight"] == 48


def test_stream_work_averages_the_full_width_loops():
    from bench.cases import case
    from dispatch import registry

    c = case("softmax", "t", "test", {"x": (64, 1000)})
    op, call = registry.OPS["softmax"], M.describe(c, np.float16)
    assert call.key.dtype == np.float16 and call.args.x.dtype == np.float16
    loop = {"loops": [{"ld_global_bytes": 8, "total": 200},                       # 4 fp16 per iteration
                      {"ld_global_bytes": 2, "total": 60},                        # its remainder loop
                      {"ld_global_bytes": 8, "st_global_bytes": 8, "total": 160}]}
    w = M.work("softmax.block_rows", {}, call, op, loop, 2)
    assert (w["kind"], w["units"]) == ("stream", 2 * 64 * 1000)  # two passes
    assert w["per_unit"]["total"] == pytest.approx((200 / 4 + 160 / 4) / 2) and w["inflight"] == 8


def _toolchain():
    """bench.ptx, or a skip where this machine cannot build PTX and read SASS (no numba-cuda,
    the simulator, no ptxas / nvdisasm)."""
    pytest.importorskip("numba.cuda")
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        pytest.skip("compile_ptx needs the real CUDA target")
    from bench import ptx

    try:
        ptx.ptxas_path()
        sass.nvdisasm_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    return ptx


def test_a_real_build_has_hot_loop_counts():
    ptx = _toolchain()
    rows = ptx.run(("sm_80",), ("float32",), only=["gemm.32x32x16/4x2"], verbose=False)
    (row,) = [r for r in rows if r["kernel"] == "gemm.32x32x16/4x2"]
    loop = row["inner_loop"]
    assert row["ok"] and "error" not in loop, row
    assert loop["scope"] == "loop" and loop["ffma"] > 0 and loop["ld_shared"] > 0 and loop["total"] > loop["ffma"]
    assert row["registers"] == row["regs"] and row["shared_bytes"] >= 4224 and row["spill_bytes"] == 0
    assert 0 < row["occupancy"] <= 1 and math.isfinite(row["compile_s"])


def test_a_chip_named_twice_is_built_once(tmp_path):
    """bench.cuda_model asks for sm_90 twice (the H100 and the H200): the second was
    'retargeted' onto its own .target line, raised, and its exception replaced the first
    chip's result, so every sm_90 prediction fell back to the bare memory bound (the GEMM
    bar at 124% of the tensor-core peak, until 2026-12-06)."""
    ptx = _toolchain()
    ptxas = ptx.ptxas_path()
    build = ptx.kernels()["layer_norm.warp_rows"]
    infos = ptx.compile_many("layer_norm.warp_rows", build.get, build.argtypes, "float32", ["sm_80", "sm_80"], ptxas,
                             str(tmp_path))
    assert list(infos) == ["sm_80"] and not isinstance(infos["sm_80"], Exception), infos
    rows = ptx.run(("sm_80", "sm_80"), ("float32",), only=["layer_norm.warp_rows"], verbose=False)
    mine = [r for r in rows if r["kernel"] == "layer_norm.warp_rows"]
    assert len(mine) == 1 and mine[0]["ok"], mine


def test_bar_predictions_rest_on_sass_counts_on_every_chip(monkeypatch, tmp_path):
    """Each GPU's prediction of a bar row reads its kernel's hot loop from the SASS (the
    H100 and the H200 share sm_90): a prediction without it falls back to the memory bound
    and says nothing wrong in the table."""
    _toolchain()
    monkeypatch.setattr(M, "PTX_CACHE", str(tmp_path / "none.json"))  # compiled now, not a stale file
    (case,) = [c for c in M.bar_cases() if c.op == "layer_norm"]
    rows = M.predictions([case], dtype=np.float16)
    assert {r["gpu"] for r in rows} == set(M.SPECS)
    for r in rows:
        assert r["inner_loop"].get("total", 0) > 0 and r["issue_s"], (r["gpu"], r["inner_loop"])


def test_batched_reading_gives_each_objects_own_counts(tmp_path):
    """analyze_many (objects linked into one cubin per batch, disassembled once) gives each
    kernel the counts analyze gives its object alone, finds each by its entry name, and
    falls back to one by one for a batch that does not link (a kernel given twice)."""
    pytest.importorskip("numba.cuda")
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        pytest.skip("compile_ptx needs the real CUDA target")
    from bench import ptx

    try:
        ptxas, nvdisasm = ptx.ptxas_path(), sass.nvdisasm_path()
        sass.cuda_tool("nvlink", "nvidia-cuda-nvcc")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    table = ptx.kernels()
    objects = {}
    for name in ("gemm.32x32x16/4x2", "layer_norm.warp_rows", "softmax.warp_rows"):
        build = table[name]
        info = ptx.compile_many(name, build.get, build.argtypes, "float32", ["sm_80"], ptxas, str(tmp_path))["sm_80"]
        assert not isinstance(info, Exception), info
        objects[name] = (info["object"], info["entry"])
    alone = {k: sass.analyze(o, nvdisasm) for k, (o, _) in objects.items()}
    assert all("error" not in v for v in alone.values()), alone
    assert len({e for _, e in objects.values()}) == len(objects)
    assert sass.analyze_many(objects, "sm_80", nvdisasm, tmpdir=str(tmp_path)) == alone
    twice = {**objects, "again": objects["gemm.32x32x16/4x2"]}
    assert sass.analyze_many(twice, "sm_80", nvdisasm, tmpdir=str(tmp_path)) == {**alone, "again": alone["gemm.32x32x16/4x2"]}
