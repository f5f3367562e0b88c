"""Every CPU kernel compiles for AArch64 (issue #14): the fast, emulator-free check of CI.

A child process (numba's cache loads disabled, so every kernel is compiled and its LLVM IR
can be inspected: numba refuses to show the IR of a cache-loaded kernel; its saves are kept,
so the child also fills the cache for the tests after it) runs every registered CPU
implementation of every op once, forced, on the smallest inputs it takes
(tests/edge_run.py's search), float32 and float64; then, for every compiled signature of
every numba dispatcher defined in kernels_cpu (found with the garbage collector, so kernels
built by factories count), it takes ``inspect_llvm()``, removes what ties the IR to this
host ("target-cpu", "target-features", "tune-cpu", the vector-width hints, the triple and
the data layout) and has llvmlite's AArch64 target machine emit an object file from it.
A call to an ``llvm.x86.*`` intrinsic is reported without handing it to LLVM (its
instruction selection would abort the process).  Kernels that are x86-only by design are
declared in kernels_cpu/target.py's X86_ONLY (the int8 AMX / VNNI / AVX2 paths) and
skipped; their implementations refuse non-x86 targets (checked below with a simulated
aarch64 host).  New ops and kernels are included without an edit.  The same IR is
scanned for loops whose floating-point sums depend on where the arrays lie in memory
(tests/ir_checks.py).

    python -m tests.test_portability      # the child's work, printable on its own
"""
from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.support import ON_CUDA

# the CPU kernels only: the simulator step of CI runs the same files with NK_TEST_DEVICE=cuda
pytestmark = pytest.mark.skipif(ON_CUDA, reason="CPU kernels' portability (the CPU step runs it)")

AARCH64 = "aarch64-unknown-linux-gnu"
# function attributes naming the compiling host's CPU, its features and x86 tuning
_HOST_ATTRS = re.compile(r'\s*"(target-cpu|target-features|tune-cpu|prefer-vector-width|min-legal-vector-width)"="[^"]*"')
_MODULE_LINES = re.compile(r'^target (triple|datalayout) = "[^"]*"\n', re.M)
_X86_INTRINSIC = re.compile(r"@llvm\.x86\.[\w.]+")


# LLVM's x86 middle end (AtomicExpand, run by numba's optimizer for the host) turns an
# atomicrmw whose result is only compared with zero into llvm.x86.atomic.<op>.cc (lock sub +
# a flag): every kernel's NRT reference-count decrement looks like that after optimization.
# It is the host's lowering of portable IR, not a kernel's choice, so it is turned back into
# the atomicrmw it came from.  Condition codes (X86::CondCode): 4 E, 5 NE, 8 S, 9 NS.
_X86_ATOMIC_CC = re.compile(
    r"^(\s*)(%[\w.]+) = (?:tail )?call i8 @llvm\.x86\.atomic\.(add|sub|and|or|xor)\.cc\.(i\d+)"
    r"\((?:ptr|i\d+\*)(?: nonnull)? (%[\w.]+), i\d+ ([^,]+), i32 (4|5|8|9)\)$", re.M)
_X86_ATOMIC_DECL = re.compile(r"^declare i8 @llvm\.x86\.atomic\.\w+\.cc\.i\d+\(.*\n", re.M)
_CC = {"4": "eq", "5": "ne", "8": "slt", "9": "sge"}


_N = iter(range(1 << 62))


def _atomic_cc(m):
    ind, res, op, ty, ptr, val, cc = m.groups()
    new = {"add": "add", "sub": "sub", "and": "and", "or": "or", "xor": "xor"}[op]
    t = f"%x86cc.{next(_N)}"  # named values: a numbered result (%0) keeps its number
    return (f"{ind}{t}.old = atomicrmw {op} ptr {ptr}, {ty} {val} seq_cst\n"
            f"{ind}{t}.new = {new} {ty} {t}.old, {val}\n"
            f"{ind}{t}.cmp = icmp {_CC[cc]} {ty} {t}.new, 0\n"
            f"{ind}{res} = zext i1 {t}.cmp to i8")


def portable_ir(ir: str) -> str:
    """The IR with the host-specific attributes and module target lines removed, and the
    x86 optimizer's flag-setting atomics turned back into portable atomicrmw."""
    ir = _X86_ATOMIC_DECL.sub("", _X86_ATOMIC_CC.sub(_atomic_cc, ir))
    ir = _MODULE_LINES.sub("", _HOST_ATTRS.sub("", ir))
    # attribute groups left empty (LLVM's parser refuses "{ }"): dropped with their uses
    for g in re.findall(r"^attributes #(\d+) = \{\s*\}\n", ir, re.M):
        ir = re.sub(rf"^attributes #{g} = \{{\s*\}}\n", "", ir, flags=re.M)
        ir = re.sub(rf" #{g}(?!\d)", "", ir)
    return ir


_TM = None


def aarch64_machine():
    global _TM
    if _TM is None:
        import llvmlite.binding as ll
        ll.initialize_all_targets()
        ll.initialize_all_asmprinters()
        _TM = ll.Target.from_triple(AARCH64).create_target_machine(opt=2, codemodel="default")
    return _TM


def compile_aarch64(ir: str, asm: bool = False):
    """An AArch64 object (or assembly text) from host IR; ValueError for an x86 intrinsic."""
    import llvmlite.binding as ll
    ir = portable_ir(ir)
    x86 = sorted(set(_X86_INTRINSIC.findall(ir)))
    if x86:
        raise ValueError(f"x86-only intrinsics: {', '.join(x86)}")
    tm = aarch64_machine()
    mod = ll.parse_assembly(ir)
    mod.triple = AARCH64
    mod.data_layout = str(tm.target_data)
    mod.verify()
    return tm.emit_assembly(mod) if asm else tm.emit_object(mod)


def _kernel_dispatchers():
    """Every numba CPU dispatcher whose Python function lives in kernels_cpu."""
    from numba.core.registry import CPUDispatcher
    seen = {}
    for obj in gc.get_objects():
        if isinstance(obj, CPUDispatcher):
            mod = getattr(obj.py_func, "__module__", "") or ""
            if mod.split(".")[0] == "kernels_cpu":
                seen[id(obj)] = obj
    return list(seen.values())


def _compile_fresh_and_save():
    """Compile every kernel even where numba's cache has it (inspect_llvm needs the library
    of a compile in this process), still saving each to the cache.  So this child fills the
    cache that later tests load from: CI runs this file first, alone beside the PTX step,
    then the other CPU tests (with a warm cache: 168 s for the whole CPU step against 310 s
    cold, 2026-11-25)."""
    from numba.core import caching

    caching.Cache.load_overload = lambda self, sig, target_context: None


def _readable(symbol: str) -> str:
    """module.function of a numba symbol (_ZN11kernels_cpu9norm_grad21layer_norm_grad_blockB2v1...)."""
    parts, i = [], symbol.find("_ZN") + 3
    while 0 < i < len(symbol) and symbol[i].isdigit():
        j = i
        while symbol[j].isdigit():
            j += 1
        n = int(symbol[i:j])
        parts.append(symbol[j:j + n])
        i = j + n
    return ".".join(parts) or symbol


def check(dtypes=("float32", "float64")) -> dict:
    """Run every CPU implementation once, then compile every kernel signature for AArch64."""
    _compile_fresh_and_save()
    import dispatch  # noqa: F401
    from kernels_cpu import target
    from tests import edge_run, ir_checks

    t0 = time.process_time()
    runs = [edge_run.run_one(*t, compare=False) for t in edge_run.plan(None, dtypes)]
    not_run = [f"{r['op']} {r['impl']} {r['dtype']}: {r['status']} {r['note']}" for r in runs
               if r["status"] == "FAIL"]  # a refusal: the host lacks the path (AMX on a non-AMX CI host)
    t_run = time.process_time() - t0
    compiled, skipped, failures, neon, address_dependent = 0, [], [], {}, {}
    for disp in _kernel_dispatchers():
        mod, name = disp.py_func.__module__, disp.py_func.__name__
        if name in target.X86_ONLY.get(mod, {}):
            skipped.append(f"{mod}.{name}")
            continue
        for sig in list(disp.overloads):
            what = f"{mod}.{name}{tuple(str(t) for t in sig)}"
            try:
                ir = disp.inspect_llvm(sig)
            except Exception as exc:  # noqa: BLE001 - a cache-loaded kernel hides its IR
                failures.append(f"{what}: no IR ({exc.__class__.__name__}: {exc})")
                continue
            for fn, block in ir_checks.address_dependent_reductions(ir):
                address_dependent.setdefault(_readable(fn), set()).add(f"{mod}.{name}")
            try:
                if name == "gemm_worker":  # (w, params, is64, tile): the float32 ones use .4s
                    text = compile_aarch64(ir, asm=True)
                    n4s = len(re.findall(r"\bfmla\s+v\d+\.4s", text))
                    neon["gemm_worker float32"] = max(neon.get("gemm_worker float32", 0), n4s)
                else:
                    compile_aarch64(ir)
                compiled += 1
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{what}: {exc.__class__.__name__}: {str(exc)[:400]}")
    return {"runs": len(runs), "not_run": not_run, "compiled": compiled, "skipped_x86_only": sorted(set(skipped)),
            "failures": failures, "neon_fmla": neon, "run_cpu_s": t_run,
            "address_dependent": {k: sorted(v) for k, v in sorted(address_dependent.items())},
            "compile_cpu_s": time.process_time() - t0 - t_run}


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """The result of check() in a child process (the module doc)."""
    env = dict(os.environ)  # numba's own cache: the child compiles everything and saves it
    env.pop("NK_USE", None)
    env.pop("NK_EXCLUDE", None)
    env["NK_TUNING_CACHE"] = str(tmp_path_factory.mktemp("port") / "no-tuning.json")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-m", "tests.test_portability"], cwd=root, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, f"child failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_every_cpu_kernel_compiles_for_aarch64(child):
    res = child
    print(f"{res['runs']} runs, {res['compiled']} kernel signatures compiled for AArch64, x86-only skipped: "
          f"{res['skipped_x86_only']}, NEON: {res['neon_fmla']}, CPU s: run {res['run_cpu_s']:.0f}, "
          f"compile {res['compile_cpu_s']:.0f}")
    assert not res["not_run"], "implementations that did not run:\n  " + "\n  ".join(res["not_run"])
    assert not res["failures"], "kernels that do not compile for AArch64:\n  " + "\n  ".join(res["failures"])
    assert res["compiled"] > 50, res  # the search found the kernels
    # the GEMM's 8-lane float32 IR vectors become 4-lane NEON fused multiply-adds: the 6x16
    # tile's 6 x 4 accumulators at least
    assert res["neon_fmla"].get("gemm_worker float32", 0) >= 24, res["neon_fmla"]


def test_no_reduction_depends_on_where_arrays_lie(child):
    """No kernel has a vectorized floating-point sum whose loop also stores, guarded by a
    diff check (tests/ir_checks.py): its bits would change with the arrays' placement, so
    serial / parallel / threaded results that should be identical could differ."""
    found = child["address_dependent"]
    assert not found, ("loops that sum and store, vectorized behind a run-time alias check "
                       "(function: the kernels whose IR holds it):\n  "
                       + "\n  ".join(f"{k}: {v}" for k, v in found.items()))


def test_the_ir_check_finds_a_summing_loop_that_stores():
    """ir_checks finds the pattern in IR that LLVM's vectorizer wrote for the layer_norm
    backward before its fix (abridged), and not once the branch tests only range overlaps."""
    from tests import ir_checks
    ir = """define void @f(ptr %a) {
entry:
  %diff.check = icmp ult i64 %d, 256
  br label %iter.check
iter.check:
  %or.cond = select i1 %small, i1 true, i1 %diff.check
  br i1 %or.cond, label %scalar, label %vector.ph
vector.ph:
  br label %vector.body
vector.body:
  %vec.phi = phi reassoc nsz arcp contract <16 x float> [ zeroinitializer, %vector.ph ], [ %s, %vector.body ]
  br i1 %done, label %middle.block, label %vector.body
middle.block:
  br label %scalar
scalar:
  ret void
}
"""
    assert ir_checks.address_dependent_reductions(ir) == [("f", "iter.check")]
    overlap = ir.replace("%diff.check = icmp ult i64 %d, 256", "%found.conflict = and i1 %b0, %b1") \
                .replace("i1 %diff.check", "i1 %found.conflict")
    assert ir_checks.address_dependent_reductions(overlap) == []
    no_sum = ir.replace("<16 x float>", "<16 x i32>")
    assert ir_checks.address_dependent_reductions(no_sum) == []


def test_an_x86_intrinsic_is_caught():
    ir = """
declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)
define <16 x i32> @f(<16 x i32> %a) "target-cpu"="sapphirerapids" "target-features"="+avx512f" {
  %r = call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> %a, <16 x i32> %a, <16 x i32> %a)
  ret <16 x i32> %r
}"""
    with pytest.raises(ValueError, match="vpdpbusd"):
        compile_aarch64(ir)
    plain = ir.replace("@llvm.x86.avx512.vpdpbusd.512(<16 x i32> %a, <16 x i32> %a, <16 x i32> %a)",
                       "@g(<16 x i32> %a)").replace("declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, "
                                                    "<16 x i32>, <16 x i32>)", "declare <16 x i32> @g(<16 x i32>)")
    assert "target-cpu" not in portable_ir(plain)
    assert "bl\tg" in compile_aarch64(plain, asm=True)


def test_aarch64_target_choices(monkeypatch):
    """On an aarch64 host (simulated: platform.machine and LLVM's feature list) the
    x86-only int8 paths refuse with a reason, the portable one runs, and the vector-width
    choices are NEON's: no AVX-512 tiles, no 512-bit loop hint, 128-bit vectors."""
    import platform

    from kernels_cpu import approx, gemm, int8_gemm, runtime, target

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(target, "features", lambda: frozenset({"neon", "fp-armv8", "crc", "lse", "dotprod"}))
    monkeypatch.setattr(target, "cpu_name", lambda: "neoverse-n1")
    paths = int8_gemm.host_paths()
    assert paths[int8_gemm.PATH_PORTABLE] is None
    for path, name in int8_gemm._KERNEL_NAMES.items():
        assert paths[path] and "x86-only" in paths[path] and "aarch64" in paths[path], paths[path]
        assert name in target.X86_ONLY["kernels_cpu.int8_gemm"]
        assert getattr(int8_gemm, name).py_func.__name__ == name
    assert target.vector_bits() == 128
    assert not approx._target_has_avx512() and not gemm.host_has_avx512()
    monkeypatch.delenv(gemm.TILE_ENV, raising=False)
    assert gemm._tile_from_env() == gemm.NARROW  # 6x16: 24 of NEON's 32 registers accumulate
    assert "NEON" in runtime.vectors()


if __name__ == "__main__":
    out = check()
    print(json.dumps(out))
