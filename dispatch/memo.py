"""Validated calls remembered by their arguments' signature, so that a repeated call shape
skips the op's Python validation (describe).

Why: describe costs 1.6-12 us of Python per call, 2.4-7 for most ops (validators, the
key and argument NamedTuples; Zen 4, 2026-12-04); at the real-time shapes that is a tenth
to a third of the whole call (layer_norm 128x768: 6.9 of 35 us, topk_softmax decode: 2.4
of 6, causal_conv1d_update: 6.4 of 18).
A model calls each op with the same shapes and options every step, and describe's answer
depends only on those for the ops that opt in (`Op.memo`).

The contract an op opts into: describe's result (the key, and the prepared arguments apart
from the caller's arrays) is a function of
- each array argument's type, shape, strides and dtype (never its values, its address, or
  memory shared between two arguments),
- the other arguments' types and values (ints, floats, strings, None, classes and numpy
  dtypes -- a dtype argument is either --, tuples and lists of those), and
- objects that declare ``__memo_key__``: what describe reads of them.  A PackedWeight's
  is its identity and the register tile it was packed for (which describe checks against
  the active one); a QuantizedArray's is structural (its values' type, shape, strides and
  dtype, its axis, the keys of the layouts cached on it), because an activation is a new
  QuantizedArray on every call (matmul_int8's a_q, dequantize's q) and describe reads no
  more of it.  A class sets ``__memo_identity__ = False`` when its key is structural: a
  remembered call then takes whichever object of that key it is given, where an
  identity key's call is rebuilt only for the very object it was made with.
What stays outside it is not remembered: an op that updates inputs in place, a 0-d array
(its value may be read as a scalar), an ndarray subclass or device array, the same array
passed twice, any other object.  ``out=`` is part of the signature like any array; a
remembered call is used only when out is writeable and no other argument's memory bounds
reach it (np.may_share_memory, 0.46 us a pair), the arrays a memo object names in
``__memo_arrays__()`` included (a QuantizedArray's values, a PackedWeight's source: describe
checks out= against them too), else describe runs and decides (an op may allow an overlap,
or raise naming it).

A remembered call is rebuilt from a template of the first call's prepared arguments: each
is the caller's array at some argument position, an attribute of a ``__memo_key__`` object
(looked up again on the current object), or a constant (an immutable scalar or tuple).  A
first call whose prepared arguments hold anything else (an array describe derived, as a
reshape of x) is marked not rememberable for its signature, and describe runs every time.

Per op at most MAX_ENTRIES signatures are kept (the table is emptied when full); lookups
and inserts are single dict operations, safe from several Python threads.
"""
from __future__ import annotations

import math
import weakref

import numpy as np

MAX_ENTRIES = 256

_SCALARS = frozenset((int, float, bool, str, type(None), complex, np.float32, np.float64, np.int32, np.int64,
                      np.bool_, np.float16, np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64))
_FLOATS = frozenset((float, np.float16, np.float32, np.float64))
_NOT_REMEMBERED = object()  # the entry of a signature whose call cannot be rebuilt


class _Skip(Exception):
    """An argument outside the contract: run describe."""


def _sig(v, arrays, objs):
    """v's part of the signature (arrays and memo objects collected in order); raises _Skip."""
    t = type(v)
    if t is np.ndarray:
        if not v.ndim:
            raise _Skip
        arrays.append(v)
        return v.shape, v.strides, v.dtype
    if t in _SCALARS:
        if t in _FLOATS and v == 0.0:  # -0.0 == 0.0 as keys, not as arguments
            return t, v, math.copysign(1.0, v)
        return t, v
    if t is tuple or t is list:
        return t, tuple([_sig(e, arrays, objs) for e in v])
    if t is type or isinstance(v, np.dtype):  # a dtype argument: np.float32 (a class), np.dtype("float32")
        return t, v
    mk = getattr(t, "__memo_key__", None)
    if mk is not None:
        objs.append(v)
        return t, mk(v)
    raise _Skip


def signature(args, kwargs):
    """(signature, arrays, memo objects) of a call, or None when it is outside the contract.
    Arrays and scalars inline (a function call per argument cost 1 us of the 2.3 of a
    conv2d's five arguments)."""
    arrays, objs = [], []
    sig = []
    try:
        for v in args:
            t = type(v)
            if t is np.ndarray and v.ndim:
                arrays.append(v)
                sig.append((v.shape, v.strides, v.dtype))
            elif t is int or t is str or v is None or (t is float and v):  # (a float 0 is _sig's: -0.0)
                sig.append((t, v))
            else:
                sig.append(_sig(v, arrays, objs))
        for k, v in kwargs.items():
            t = type(v)
            if t is np.ndarray and v.ndim:
                arrays.append(v)
                sig.append((k, v.shape, v.strides, v.dtype))
            elif t is int or t is str or v is None or (t is float and v):
                sig.append((k, t, v))
            else:
                sig.append((k, _sig(v, arrays, objs)))
    except _Skip:
        return None
    n = len(arrays)
    if n > 1:  # the same array twice: the template could not tell the positions apart
        for i in range(1, n):
            a = arrays[i]
            for j in range(i):
                if arrays[j] is a:
                    return None
    return tuple(sig), arrays, objs


def _constant(v) -> bool:
    t = type(v)
    if t in _SCALARS or isinstance(v, np.dtype):
        return True
    if isinstance(v, tuple):  # NamedTuple keys too
        return all(_constant(e) for e in v)
    return False


def _rebuilder(call, fields, identity):
    """A function (arrays, objs, refs) -> the Call of a new call of this signature, or None
    when a memo object whose key is its identity (at the positions `identity`) is not the
    one the template was made with; generated once per signature (a loop over the fields
    and NamedTuple._make cost 1.5 us a call, this 0.4)."""
    consts = {}
    parts = []
    for i, (kind, a, b) in enumerate(fields):
        if kind == 0:
            consts[f"c{i}"] = a
            parts.append(f"c{i}")
        elif kind == 1:
            parts.append(f"arrays[{a}]")
        elif kind == 2:
            parts.append(f"objs[{a}]")
        else:
            parts.append(f"objs[{a}].{b}")
    checks = "".join(f"    if refs[{j}]() is not objs[{j}]:\n        return None\n" for j in identity)
    src = (f"def rebuild(arrays, objs, refs):\n{checks}"
           f"    return new(Call, (key, new(Args, ({', '.join(parts)},)), notes))\n")
    ns = {"new": tuple.__new__, "Call": type(call), "Args": type(call.args), "key": call.key,
          "notes": call.prep_notes, **consts}
    exec(compile(src, "<dispatch.memo rebuild>", "exec"), ns)  # noqa: S102 - source built above from indices
    return ns["rebuild"]


class Template:
    """How to rebuild a call's prepared arguments from another call of the same signature:
    rebuild(arrays, objs) with the new call's arrays and memo objects (signature's order)."""

    __slots__ = ("_rebuild", "refs")

    def __init__(self, rebuild, refs):
        self._rebuild, self.refs = rebuild, refs

    def rebuild(self, arrays, objs):
        return self._rebuild(arrays, objs, self.refs)


def template(call, arrays, objs):
    """call's Template, or _NOT_REMEMBERED when an argument is none of: an input array, a memo
    object, an array attribute of one, a constant."""
    if not _constant(call.key) or not _constant(call.prep_notes):  # a function may hold arrays
        return _NOT_REMEMBERED
    at = {id(a): i for i, a in enumerate(arrays)}
    ob = {id(o): j for j, o in enumerate(objs)}
    attrs = {}
    for j, o in enumerate(objs):
        for name in getattr(type(o), "__slots__", ()) or tuple(getattr(o, "__dict__", {})):
            val = getattr(o, name, None)
            if type(val) is np.ndarray and name.isidentifier():
                attrs[id(val)] = (j, name)
    fields = []
    for v in call.args:
        if type(v) is np.ndarray:
            if id(v) in at:
                fields.append((1, at[id(v)], None))
            elif id(v) in attrs:
                fields.append((3,) + attrs[id(v)])
            else:
                return _NOT_REMEMBERED  # derived by describe from an argument
        elif id(v) in ob:
            fields.append((2, ob[id(v)], None))
        elif _constant(v):
            fields.append((0, v, None))
        else:
            return _NOT_REMEMBERED
    identity = [j for j, o in enumerate(objs) if getattr(type(o), "__memo_identity__", True)]
    try:
        refs = tuple(weakref.ref(o) if j in identity else None for j, o in enumerate(objs))
    except TypeError:
        return _NOT_REMEMBERED
    return Template(_rebuilder(call, fields, identity), refs)


def _out_is_clear(out, arrays, objs) -> bool:
    """Whether out= is a writeable host array whose memory no other argument's bounds reach
    (nor the arrays the memo objects name): then describe's out checks (writeable, no
    overlap with an input) would pass; shape and dtype are part of the signature.  Anything
    else goes to describe, which decides."""
    if type(out) is not np.ndarray or not out.flags.writeable:
        return False
    for a in arrays:
        if a is not out and np.may_share_memory(a, out):
            return False
    for o in objs:
        held = getattr(o, "__memo_arrays__", None)
        for a in (held() if held is not None else ()):
            if np.may_share_memory(a, out):
                return False
    return True


def described(table: dict, describe, args, kwargs):
    """describe(*args, **kwargs), from table when a call of the same signature was seen."""
    out = kwargs.get("out")
    s = signature(args, kwargs)
    if s is None:
        return describe(*args, **kwargs)
    sig, arrays, objs = s
    entry = table.get(sig)
    if entry is _NOT_REMEMBERED or (entry is not None and out is not None and not _out_is_clear(out, arrays, objs)):
        return describe(*args, **kwargs)
    if entry is not None:
        call = entry.rebuild(arrays, objs)
        if call is not None:
            return call
        # None: a memo object at the id of a dead one; the template is made again for it below
    call = describe(*args, **kwargs)
    if len(table) >= MAX_ENTRIES:
        table.clear()
    table[sig] = template(call, arrays, objs)
    return call
