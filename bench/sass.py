"""The machine code of a kernel: its hottest loop read from the SASS, counted per iteration.

``bench.ptx`` assembles each kernel's PTX with ``ptxas -c -o X.o`` (a relocatable cubin);
``analyze(X.o)`` disassembles it with ``nvdisasm`` (the ``nvidia-cuda-nvdisasm`` wheel,
found like ptxas) and returns the instruction mix of the kernel's hottest loop:

    {"scope": "loop" | "kernel", "ffma": n, "hmma": n, "ld_shared": n, "total": n, ...}

or ``{"error": reason}``; nothing here raises for a kernel it cannot read.

Which loop.  The kernel's code is split into basic blocks; a loop is a natural loop of its
control-flow graph (a back edge u -> h where h dominates u; back edges sharing a header are
one loop), branches being BRA and CALL.REL.NOINC to a label of the kernel (how ptxas leaves
a loop from inside a convergence region).  Code reachable only through BRA.DIV (the
out-of-line path a warp takes when its threads diverged at a shuffle) is left out: it runs
only on divergence, and its jump back is no loop.  Candidates are the innermost loops (no
other loop's header in their body): an outer loop's own instructions run once per sweep of
its inner loops.  Of those, a loop whose trip count is a compile-time constant (its exit
tests a counter started from an immediate against immediates) and which is not nested in
another loop runs a fixed number of times per thread - an epilogue over a thread's outputs
that LLVM did not unroll - and is dropped unless nothing else is left.  The hottest of the
rest: a loop nested in another first (the inner loop of a tiled kernel runs once per tile
step, an epilogue loop after the tile loop once), then a data-dependent trip count, then
the most arithmetic per iteration in FLOPs per warp (HMMA.16816 4096, HMMA.1688 2048, FFMA /
DFMA 64, HFMA2 128), then the larger body.  In a GEMM or attention kernel that is the loop
doing the product even when a staging or epilogue loop is longer (an epilogue whose exit
test the fixed-trip check cannot read, as in gemm.128x64x8/8x4 float16, loses by not being
nested); in a memory-bound kernel with several passes (softmax: online max and sum, write),
the pass with the exp's FFMAs.  Every innermost loop is also listed under ``loops`` (start
and end address, ``fixed_trips``, ``nested``, ``flops``, counts), so that a model can add up
the passes; when the hottest loop is nested, ``outer`` has the counts of its enclosing loop's
own instructions (its body less the loops in it: a GEMM's tile staging per k-step).  A
kernel without loops gets counts over its whole body, ``"scope": "kernel"``.

What is counted, per iteration of that loop, every instruction of the body once (both
sides of a branch inside the body, predicated-off instructions included: an upper bound
on what one iteration issues); NOPs are not counted.  Called subroutines (CALL: the 64-bit
division, slow-path float division) are counted as one ``call`` each, not their bodies.

    ffma       FFMA and FFMA32I (fp32 fused multiply-add, one per lane); FFMA2 (sm_100+, two
               per lane) is not emitted for sm_80/87/90 and would be counted here too
    dfma       DFMA (fp64, counted apart from ffma)
    hfma2      HFMA2 (two fp16 per lane), not the HFMA2.MMA Rd, -RZ, RZ, ... constant moves
    fp64       DFMA + DADD + DMUL (the fp64 pipe)
    hmma       HMMA.* (tensor-core mma.sync; HMMA.16816 = one m16n8k16 per warp)
    hgmma      HGMMA.* (Hopper's wgmma: each warp of the warpgroup issues it);
    hgmma_fma  the FMAs per thread those do: HGMMA.64xNx16 is 64 x N x 16 over 128 threads = 8 N
    mufu       MUFU.* (exp2, rcp, rsqrt, sin...: the quarter-rate special-function unit)
    ld_shared  LDS* (LDS, LDS.64/.128, LDSM = ldmatrix)     st_shared  STS*
    ld_global  LDG, LDGSTS (cp.async) and generic LD         st_global  STG and generic ST
               (numba emits generic loads where it cannot prove the address space; in
               these kernels they reach global memory)
    st         st_shared + st_global
    ld_local / st_local  LDL / STL (local memory: spills or local arrays not in registers)
    bar        BAR.*    bra   BRA*
    call       CALL* (subroutines, and CALL.REL.NOINC, which jumps out of a convergence region)
    total      every instruction except NOP
    ld_global_bytes / ld_shared_bytes / st_global_bytes / ld_local_bytes: bytes per
               thread per iteration, from the access width (.U8 1, .U16 2, default 4, .64 8,
               .128 16; LDSM .1/.2/.4 matrices: 4/8/16)
"""
from __future__ import annotations

import glob
import os
import re
import subprocess

_SECTION = re.compile(r"^//-+ \.text\.(\S+)\s+-+$")
_ENTRY = re.compile(r'^\s*\.other\s+([^,\s]+),@"STO_CUDA_ENTRY')
_LABEL = re.compile(r"^(\.L_\w+):")
# (an opcode's modifiers may hold lowercase: HGMMA.64x128x16.F32)
_INSTR = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s*(?:\{\s*)?(@!?U?P[T0-7]\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")
_TARGET = re.compile(r"`\((\.L_\w+)\)")

# FLOPs per warp of one instruction, for picking the hottest loop
_FLOPS = {"hmma16816": 16 * 8 * 16 * 2, "hmma1688": 16 * 8 * 8 * 2, "ffma": 64, "dfma": 64, "hfma2": 128}

_HGMMA_SHAPE = re.compile(r"\.(\d+)x(\d+)x(\d+)")


def _hgmma_fma(op: str) -> int:
    """FMAs per thread of one HGMMA.MxNxK (the warpgroup's 128 threads share M x N x K)."""
    m = _HGMMA_SHAPE.search(op)
    return int(m.group(1)) * int(m.group(2)) * int(m.group(3)) // 128 if m else 0


COUNTS = ("ffma", "dfma", "hfma2", "fp64", "hmma", "hgmma", "hgmma_fma", "mufu", "ld_shared", "st_shared", "ld_global", "st_global", "st",
          "ld_local", "st_local", "bar", "bra", "call", "total",
          "ld_global_bytes", "ld_shared_bytes", "st_global_bytes", "ld_local_bytes")


def cuda_tool(name: str, wheel: str) -> str:
    """A CUDA binary (ptxas, nvdisasm) from the nvidia-* wheels, else from PATH."""
    try:
        import nvidia

        for base in nvidia.__path__:
            hits = glob.glob(os.path.join(base, "**", "bin", name), recursive=True)
            if hits:
                return hits[0]
    except ImportError:
        pass
    from shutil import which

    p = which(name)
    if p:
        return p
    raise RuntimeError(f"{name} not found: install {wheel} (pip install '.[cuda]')")


def nvdisasm_path() -> str:
    return cuda_tool("nvdisasm", "nvidia-cuda-nvdisasm")


def disassemble(cubin: str, nvdisasm: str | None = None) -> str:
    """nvdisasm's listing of the code sections of a cubin (relocatable objects included)."""
    r = subprocess.run([nvdisasm or nvdisasm_path(), "-c", "-ndf", cubin], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvdisasm failed: {r.stderr.strip()[-500:]}")
    return r.stdout


class Instr:
    """One SASS instruction: address, opcode with modifiers ('LDG.E.128'), predicate,
    operands, and the label a branch goes to (else None)."""

    __slots__ = ("addr", "op", "pred", "args", "target")

    def __init__(self, addr, op, pred, args, target):
        self.addr, self.op, self.pred, self.args, self.target = addr, op, pred, args, target

    def __repr__(self):
        return f"Instr({self.addr:#x} {self.pred or ''}{self.op} {self.args})"


def parse(text: str) -> dict:
    """{function name: (instructions, {label: address}, is_entry)} of a listing."""
    funcs, entries = {}, set()
    cur = None
    pending = []  # labels waiting for the next instruction's address
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), ([], {}))
            pending = []
            continue
        m = _ENTRY.match(line)
        if m:
            entries.add(m.group(1))
            continue
        if cur is None:
            continue
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if m:
            addr = int(m.group(1), 16)
            for lab in pending:
                cur[1][lab] = addr
            pending = []
            t = _TARGET.search(m.group(4))
            cur[0].append(Instr(addr, m.group(3), (m.group(2) or "").strip(), m.group(4).strip(),
                                t.group(1) if t else None))
    return {name: (ins, labels, name in entries) for name, (ins, labels) in funcs.items()}


def _width(op: str) -> int:
    """Bytes per thread of a load or store from its modifiers."""
    mods = op.split(".")[1:]
    if op.startswith("LDSM"):  # ldmatrix: LDSM.16.M88.4 = four 8x8 b16 matrices per warp
        return {"2": 8, "4": 16}.get(mods[-1] if mods else "", 4)
    if "128" in mods:
        return 16
    if "64" in mods:
        return 8
    if "U16" in mods or "S16" in mods:
        return 2
    if "U8" in mods or "S8" in mods:
        return 1
    return 4


def count(instrs) -> dict:
    """The instruction mix of a list of instructions (the keys of COUNTS)."""
    c = dict.fromkeys(COUNTS, 0)
    for i in instrs:
        op = i.op
        base = op.split(".")[0]
        if base == "NOP":
            continue
        c["total"] += 1
        if base in ("FFMA", "FFMA32I", "FFMA2"):
            c["ffma"] += 1
        elif base == "DFMA":
            c["dfma"] += 1
        elif base == "HFMA2" and not _is_const_move(i):
            c["hfma2"] += 1
        elif base == "HMMA":
            c["hmma"] += 1
        elif base == "HGMMA":
            c["hgmma"] += 1
            c["hgmma_fma"] += _hgmma_fma(i.op)
        elif base == "MUFU":
            c["mufu"] += 1
        if base in ("DFMA", "DADD", "DMUL"):
            c["fp64"] += 1
        if base.startswith("LDS"):  # LDS, LDSM (ldmatrix)
            c["ld_shared"] += 1
            c["ld_shared_bytes"] += _width(op)
        elif base in ("LDG", "LDGSTS", "LD"):
            c["ld_global"] += 1
            c["ld_global_bytes"] += _width(op)
        elif base == "STS":
            c["st_shared"] += 1
        elif base in ("STG", "ST"):
            c["st_global"] += 1
            c["st_global_bytes"] += _width(op)
        elif base == "LDL":
            c["ld_local"] += 1
            c["ld_local_bytes"] += _width(op)
        elif base == "STL":
            c["st_local"] += 1
        elif base == "BAR":
            c["bar"] += 1
        elif base.startswith("BRA"):
            c["bra"] += 1
        elif base.startswith("CALL"):
            c["call"] += 1
    c["st"] = c["st_shared"] + c["st_global"]
    return c


def _is_const_move(i) -> bool:
    """HFMA2.MMA Rd, -RZ, RZ, a, b: how ptxas materializes a constant, not arithmetic."""
    return i.op.startswith("HFMA2.MMA") and i.args.split(",")[1:3] == [" -RZ", " RZ"]


def _flops(instrs) -> int:
    f = 0
    for i in instrs:
        base = i.op.split(".")[0]
        if base == "HMMA":
            f += _FLOPS["hmma16816"] if ".16816" in i.op else _FLOPS["hmma1688"]
        elif base == "HGMMA":
            f += 2 * 32 * _hgmma_fma(i.op)
        elif base in ("FFMA", "FFMA32I", "DFMA"):
            f += _FLOPS["ffma"]
        elif base == "HFMA2" and not _is_const_move(i):
            f += _FLOPS["hfma2"]
    return f


class _Graph:
    """Basic blocks of one function and their edges; `warm` = the blocks reachable from the
    entry without taking a BRA.DIV (the out-of-line path a warp runs only when its threads
    diverged at a warp-synchronous instruction)."""

    def __init__(self, instrs, labels):
        index = {i.addr: k for k, i in enumerate(instrs)}
        n = len(instrs)
        lead = {0}
        def local(i):  # a jump inside this function: BRA, or CALL.REL.NOINC to a label (a loop
            # exit out of a convergence region), not a call of a subroutine
            return i.op.split(".")[0] in ("BRA", "CALL") and i.target in labels and labels[i.target] in index

        for k, i in enumerate(instrs):
            base = i.op.split(".")[0]
            if local(i):
                lead.add(index[labels[i.target]])
                lead.add(k + 1)
            elif base in ("EXIT", "RET", "BRX", "JMX", "JMP"):
                lead.add(k + 1)
        starts = sorted(x for x in lead if x < n)
        self.instrs = instrs
        self.spans = [(a, b) for a, b in zip(starts, starts[1:] + [n])]
        block_of = {a: b for b, (a, _) in enumerate(self.spans)}
        self.succ = [[] for _ in self.spans]  # (block, is_div)
        for b, (a, e) in enumerate(self.spans):
            last = instrs[e - 1]
            base = last.op.split(".")[0]
            conditional = bool(last.pred and last.pred != "@PT") or bool(re.match(r"!?U?P[0-7T],", last.args))
            nxt = b + 1 if b + 1 < len(self.spans) else None
            if local(last):
                div = last.op.startswith("BRA.DIV")
                self.succ[b].append((block_of[index[labels[last.target]]], div))
                if (conditional or div) and nxt is not None:
                    self.succ[b].append((nxt, False))
            elif base in ("EXIT", "RET", "BRX", "JMX", "JMP", "BRA"):
                if conditional and nxt is not None:
                    self.succ[b].append((nxt, False))
            elif nxt is not None:
                self.succ[b].append((nxt, False))
        self.warm = self._reach()
        self.pred = [[] for _ in self.spans]
        for b in self.warm:
            for s, div in self.succ[b]:
                if not div and s in self.warm:
                    self.pred[s].append(b)

    def _reach(self):
        seen, stack = set(), [0] if self.spans else []
        while stack:
            b = stack.pop()
            if b in seen:
                continue
            seen.add(b)
            stack.extend(s for s, div in self.succ[b] if not div)
        return seen

    def body(self, blocks):
        """The instructions of a set of blocks, in address order."""
        return [i for b in sorted(blocks) for i in self.instrs[slice(*self.spans[b])]]

    def dominators(self):
        """Immediate dominator of each warm block (Cooper, Harvey and Kennedy's iteration
        over the reverse postorder)."""
        order, seen = [], set()
        stack = [(0, iter([s for s, d in self.succ[0] if not d]))]
        seen.add(0)
        while stack:  # iterative DFS: postorder
            b, it = stack[-1]
            for s in it:
                if s not in seen:
                    seen.add(s)
                    stack.append((s, iter([x for x, d in self.succ[s] if not d])))
                    break
            else:
                order.append(b)
                stack.pop()
        rpo = order[::-1]
        pos = {b: k for k, b in enumerate(rpo)}
        idom = {0: 0}
        changed = True
        while changed:
            changed = False
            for b in rpo[1:]:
                ps = [p for p in self.pred[b] if p in idom]
                if not ps:
                    continue
                new = ps[0]
                for p in ps[1:]:
                    a, c = p, new
                    while a != c:
                        while pos[a] > pos[c]:
                            a = idom[a]
                        while pos[c] > pos[a]:
                            c = idom[c]
                    new = a
                if idom.get(b) != new:
                    idom[b] = new
                    changed = True
        return idom

    def loops(self):
        """{header block: body blocks} of the natural loops (back edges u -> h where h
        dominates u; loops sharing a header are one)."""
        idom = self.dominators()

        def dominates(h, u):
            while True:
                if u == h:
                    return True
                if u == 0:
                    return False
                u = idom[u]

        out = {}
        for u in self.warm:
            if u not in idom:
                continue
            for h, div in self.succ[u]:
                if div or h not in idom or not dominates(h, u):
                    continue
                body = out.setdefault(h, {h})
                stack = [u]
                while stack:
                    x = stack.pop()
                    if x not in body:
                        body.add(x)
                        stack.extend(self.pred[x])
        return out


_IMM = re.compile(r"^-?(0x[0-9a-f]+|\d+(\.\d+)?(e[-+]\d+)?)$|^RZ$")


def _operands(args):
    return [a.strip() for a in args.split(",")]


def _fixed_trips(g, header, body):
    """Whether a loop's trip count is a compile-time constant: every exit branch tests a
    predicate set by ISETP (and its .EX half) from registers whose last definition before
    the loop is an immediate move, against immediates.  Anything else (a kernel argument,
    a uniform or constant-bank operand, a computed value) makes it data-dependent."""
    first = g.spans[header][0]
    exits = [b for b in body if any(s not in body for s, _ in g.succ[b])]
    if not exits:
        return False
    for b in exits:
        a, e = g.spans[b]
        last = g.instrs[e - 1]
        if last.op.split(".")[0] not in ("BRA", "CALL") or last.op.startswith("BRA.DIV") or not last.pred:
            return False
        want = [last.pred.lstrip("@!")]
        srcs = []
        k = e - 2
        while want and k >= a:
            i = g.instrs[k]
            ops = _operands(i.args)
            if ops and ops[0] in want:
                if not i.op.startswith("ISETP"):
                    return False
                want.remove(ops[0])
                srcs += ops[2:4]
                if ".EX" in i.op and len(ops) > 5:
                    want.append(ops[5].lstrip("!"))
            k -= 1
        if want:
            return False
        for r in srcs:
            if _IMM.match(r):
                continue
            if not re.match(r"^R\d+$", r):
                return False
            k = first - 1
            while k >= 0 and _operands(g.instrs[k].args)[0] != r:
                k -= 1
            if k < 0:
                return False
            d = g.instrs[k]
            move = d.op.split(".")[0] in ("MOV", "MOV32I", "CS2R") or d.op.startswith("IMAD.MOV") or _is_const_move(d)
            if d.pred or not move or not _IMM.match(_operands(d.args)[-1]):
                return False
    return True


def hottest(instrs, labels) -> dict:
    """The counts of the hottest loop of one function (see the module docstring)."""
    g = _Graph(instrs, labels)
    loops = g.loops()
    inner = {h: b for h, b in loops.items() if not any(o != h and o in b for o in loops)}
    if not inner:
        out = count(g.body(g.warm))
        out.update(scope="kernel", loops=[])
        return out
    nested = {h for h in inner if any(o != h and h in b for o, b in loops.items())}
    listed = []
    for h, blocks in sorted(inner.items()):
        body = g.body(blocks)
        fixed = _fixed_trips(g, h, blocks)
        c = count(body)
        listed.append(dict(header=h, start=body[0].addr, end=body[-1].addr, fixed_trips=fixed, nested=h in nested,
                           flops=_flops(body), **{k: v for k, v in c.items() if v}))
    hot = [r for r in listed if r["nested"] or not r["fixed_trips"]] or listed
    best = max(hot, key=lambda r: (r["nested"], not r["fixed_trips"], r["flops"], r["total"]))
    out = {k: best.get(k, 0) for k in COUNTS}
    out.update(scope="loop", start=best["start"], end=best["end"], fixed_trips=best["fixed_trips"])
    parents = [h for h, b in loops.items() if h != best["header"] and best["header"] in b]
    if parents:
        # the enclosing loop's own instructions per iteration (a GEMM's tile staging per
        # k-step): its body less the loops nested in it
        p = min(parents, key=lambda h: len(loops[h]))
        own = loops[p] - set().union(*(b for h, b in loops.items() if h != p and h in loops[p]))
        c = count(g.body(own))
        out["outer"] = {k: v for k, v in c.items() if v}
    for r in listed:
        del r["header"]
    out["loops"] = listed
    return out


def kernel_function(funcs: dict):
    """(name, instructions, labels) of the kernel entry in a parsed listing: the entry
    function (STO_CUDA_ENTRY), else the largest function that is not a CUDA runtime helper."""
    entries = [n for n, f in funcs.items() if f[2]]
    if not entries:
        entries = sorted((n for n in funcs if not n.startswith("__cuda")), key=lambda n: -len(funcs[n][0]))[:1]
    if not entries:
        return None
    name = entries[0]
    return name, funcs[name][0], funcs[name][1]


def inner_loop(text: str) -> dict:
    """The hottest-loop counts of the kernel in an nvdisasm listing, or {"error": reason}."""
    k = kernel_function(parse(text))
    if k is None:
        return {"error": "no kernel function in the disassembly"}
    if not k[1]:
        return {"error": f"no instructions parsed for {k[0][:60]}"}
    return hottest(k[1], k[2])


_PTX_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)", re.M)


def ptx_entry(ptx: str) -> str | None:
    """The (first) kernel entry name a PTX module declares."""
    m = _PTX_ENTRY.search(ptx)
    return m.group(1) if m else None


# Objects disassembled per nvdisasm call by analyze_many.  nvdisasm's cost is mostly fixed
# (0.19-0.21 s of CPU for a 22 KB object, 0.25-0.36 s for a 114 KB one, Zen 5): 20 sm_90
# objects took 3.83 s of CPU one by one and 0.49 s linked into one cubin (2026-11-27).
BATCH = 32


def analyze_many(objects: dict, arch: str, nvdisasm: str | None = None, nvlink: str | None = None,
                 tmpdir: str | None = None) -> dict:
    """analyze() of many relocatable objects of one arch: {key: (object path, kernel entry
    name)} -> {key: inner-loop counts or {"error": ...}}.  The objects are linked (nvlink)
    into one cubin per BATCH and disassembled once; linking does not change a function's
    code (no link-time optimization), and each kernel is found by its entry name.  A batch
    that does not link (two objects defining one symbol), or a kernel missing from the
    listing, is analyzed on its own."""
    import tempfile

    out, keys = {}, list(objects)
    for b0 in range(0, len(keys), BATCH):
        batch = keys[b0:b0 + BATCH]
        funcs = None
        if len(batch) > 1:
            try:
                with tempfile.TemporaryDirectory(dir=tmpdir) as d:
                    linked = os.path.join(d, "linked.cubin")
                    r = subprocess.run([nvlink or cuda_tool("nvlink", "nvidia-cuda-nvcc"), f"-arch={arch}",
                                        *(objects[k][0] for k in batch), "-o", linked], capture_output=True, text=True)
                    if r.returncode == 0:
                        funcs = parse(disassemble(linked, nvdisasm))
            except Exception:  # noqa: BLE001 - the objects are then read one by one
                funcs = None
        for k in batch:
            path, entry = objects[k]
            f = funcs.get(entry) if funcs is not None and entry else None
            if f is None or not f[2]:
                out[k] = analyze(path, nvdisasm)
            elif not f[0]:
                out[k] = {"error": f"no instructions parsed for {entry[:60]}"}
            else:
                out[k] = hottest(f[0], f[1])
    return out


def analyze(cubin: str, nvdisasm: str | None = None) -> dict:
    """inner_loop() of a cubin; {"error": reason} when it cannot be disassembled or read."""
    try:
        return inner_loop(disassemble(cubin, nvdisasm))
    except Exception as exc:  # noqa: BLE001 - a report entry, never a crash of bench.ptx
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
