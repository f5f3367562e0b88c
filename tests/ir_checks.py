"""Checks on a CPU kernel's optimized LLVM IR (text only: no numba, no llvmlite).

address_dependent_reductions(ir) finds the loops whose floating-point result depends on
where the arrays lie in memory.  LLVM's loop vectorizer, given a loop that both sums into
a scalar and stores to memory through a pointer it cannot prove distinct from the loads
(numba's arrays, and every view made from an address, carry no alias information), puts
a run-time check in front of the vector loop.  A range-overlap check (found.conflict)
fails only for arrays that overlap, which the dispatcher refuses; a diff check
(diff.check: the distance between a store's and a load's addresses under one vector
step, VF x unroll x element size, 256 bytes for 16 x 4 floats) also fails for disjoint arrays that happen to lie
close together, and then the scalar loop runs instead.  Under fastmath the vector loop sums
in lanes and the scalar loop in order, so the same inputs give results that differ in the
last bits depending on the allocator's placement of the arrays.  Seen 2026-12-02: the
layer_norm backward of a (5, 37) float32 array gave a different last row of dx when the
weight vector lay within 64 floats of that row (CI's thread test, which compares results
bitwise, failed; 166 of 3000 random placements of the arrays in one buffer differed).  A loop that sums must not
store (split the stores into a loop of their own: an elementwise loop gives the same bits
on both paths).
"""
from __future__ import annotations

import re

_DEFINE = re.compile(r'^define [^@]*@"?([^"(]+)"?\(')
_LABEL = re.compile(r"^([\w.$-]+):", re.M)
_VALUE = re.compile(r"^\s*(%[\w.$-]+) = (.*)$", re.M)
_OPERAND = re.compile(r"%[\w.$-]+")
_BRANCH = re.compile(r"br i1 (%[\w.$-]+), label %([\w.$-]+), label %([\w.$-]+)")
# a floating-point reduction's accumulator in a vector loop
_FLOAT_VEC_PHI = re.compile(r"%vec\.phi[\w.]* = phi (?:[a-z]+ )*<\d+ x (?:float|double|half|bfloat)>")


def _blocks(body: str) -> dict:
    """label -> (the block's text, its successor labels); the entry block is "entry"."""
    parts = _LABEL.split(body)
    names = ["entry", *parts[1::2]]
    texts = [parts[0], *parts[2::2]]
    return {n: (t, re.findall(r"label %([\w.$-]+)", t)) for n, t in zip(names, texts)}


def _vectorized(label: str) -> bool:
    return label.startswith(("vector.", "vec.")) and "middle.block" not in label


def _reduces(blocks: dict, start: str) -> bool:
    """Whether the vector blocks reached from start hold a floating-point reduction."""
    seen, todo = set(), [start]
    while todo:
        b = todo.pop()
        if b in seen or b not in blocks or not _vectorized(b):
            continue
        seen.add(b)
        text, nxt = blocks[b]
        if _FLOAT_VEC_PHI.search(text):
            return True
        todo += nxt
    return False


def _uses_diff_check(defs: dict, value: str, depth: int = 8) -> bool:
    """Whether value is, or is computed (through or / and / select) from, a diff check: the
    vectorizer's test that a store lies within one vector step after a load.  Range-overlap
    checks (found.conflict) fail only for arrays that overlap, which the dispatcher refuses."""
    if value.lstrip("%").startswith("diff.check"):
        return True
    d = defs.get(value)
    if depth == 0 or d is None or not d.startswith(("or ", "and ", "select ")):
        return False
    return any(_uses_diff_check(defs, v, depth - 1) for v in _OPERAND.findall(d))


def address_dependent_reductions(ir: str) -> list:
    """[(function, block)] for each branch that picks between a vector loop with a
    floating-point reduction and its scalar loop on a diff check (module doc)."""
    found = []
    for m in re.finditer(r"^define .*?^}", ir, re.M | re.S):
        head, _, body = m.group(0).partition("\n")
        name = _DEFINE.match(head)
        blocks = _blocks(body)
        defs = dict(_VALUE.findall(body))
        for label, (text, _) in blocks.items():
            for cond, a, b in _BRANCH.findall(text):
                if (_reduces(blocks, a) or _reduces(blocks, b)) and _uses_diff_check(defs, cond):
                    found.append((name.group(1) if name else "?", label))
    return found
