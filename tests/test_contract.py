"""The public contract under odd inputs and a hostile environment (issue #7).

* Bad arguments raise TypeError / ValueError naming the argument, before anything is
  written: out= (poisoned with NaN) is untouched afterwards.
* np.memmap inputs and out= work like ndarrays; np.matrix and masked arrays are refused.
* Read-only inputs (writeable=False, np.broadcast_to views) give the writeable result,
  with no warning and no new kernel specialization.
* NK_USE / NK_EXCLUDE: a malformed entry is a ValueError naming the variable and the
  entry on the next op call; a valid one forces / excludes.
* The tuning cache (NK_TUNING_CACHE): FIFOs, devices, directories and huge files are
  refused with a warning, without blocking or reading them; entries with bad parameters or
  a stale kernel version are ignored with a warning; the kernel version is a hash of the
  kernel sources.

Every op comes from the registry; inputs from tests/small_inputs.py.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import types as pytypes
import warnings

import numba
import numpy as np
import pytest
from numba.core.dispatcher import Dispatcher

import dispatch
from dispatch import registry, select, tuning
from dispatch.quantized import QuantizedArray
from tests import small_inputs as S
from tests.small_inputs import DEFAULT
from tests.support import ON_CUDA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = list(registry.OPS.values())
OP_IDS = [op.name for op in OPS]


def _forget_decisions():
    tuning.reload()
    for state in (select._current.get(), select._env_state):
        if state is not None:
            state.cache.clear()


@pytest.fixture(autouse=True)
def _no_tuning_cache(tmp_path, monkeypatch):
    """No tuning file of this machine's user interferes; tests that want one point
    NK_TUNING_CACHE elsewhere (and reload).  (Decisions are forgotten without
    select.clear_cache(), which parses NK_USE and would raise in the tests that break it.)"""
    monkeypatch.setenv("NK_TUNING_CACHE", str(tmp_path / "no-tuning.json"))
    _forget_decisions()
    yield
    _forget_decisions()


def _rng(seed=0):
    return np.random.default_rng(seed)


def _f32(*shape, seed=0):
    return _rng(seed).standard_normal(shape).astype(np.float32)


# ---- bad arguments ---------------------------------------------------------------------------

def _norm_args():
    return (_f32(4, 8), _f32(8), _f32(8, seed=1)), {}


def _rms_args():
    return (_f32(4, 8), _f32(8)), {}


def _attn_args():
    return (_f32(1, 2, 3, 8), _f32(1, 2, 5, 8, seed=1), _f32(1, 2, 5, 8, seed=2)), {}


def _matmul_args():
    return (_f32(3, 6), _f32(6, 5, seed=1)), {"bias": _f32(5, seed=2)}


def _linear_args():
    return (_f32(3, 6), _f32(5, 6, seed=1), _f32(5, seed=2)), {}


def _ce_args():
    return (_f32(4, 7), np.array([0, 6, 3, 1])), {}


def _rope_args():
    x = _f32(2, 3, 8)
    return (x, np.cos(_f32(3, 4, seed=1)), np.sin(_f32(3, 4, seed=2))), {}


def _x_args():
    return (_f32(4, 8),), {}


def _kw(**kw):
    return lambda args, kwargs: (args, {**kwargs, **kw})


def _pos(i, value):
    def change(args, kwargs):
        args = list(args)
        args[i] = value
        return tuple(args), kwargs

    return change


BAD = [
    # (op, valid call, change to it, exception, argument named in the message, regex the
    # message must match too, or "RUN": raised when the implementation runs, not by explain)
    ("layer_norm", _norm_args, _kw(eps="1e-5"), TypeError, "eps", None),
    ("layer_norm", _norm_args, _kw(eps=True), TypeError, "eps", None),
    ("layer_norm", _norm_args, _kw(eps=1e300), ValueError, "eps", "float32"),
    ("layer_norm", _norm_args, _kw(eps=float("nan")), ValueError, "eps", None),
    ("layer_norm", _norm_args, _kw(eps=0.0), ValueError, "eps", None),
    ("layer_norm", _norm_args, _kw(eps=np.array(1e-5)), TypeError, "eps", None),
    ("rms_norm", _rms_args, _kw(eps="1e-5"), TypeError, "eps", None),
    ("rms_norm", _rms_args, _kw(eps=True), TypeError, "eps", None),
    ("rms_norm", _rms_args, _kw(eps=1e300), ValueError, "eps", "float32"),
    ("rms_norm", _rms_args, _kw(eps=-1e-6), ValueError, "eps", None),
    ("attention", _attn_args, _kw(scale="0.5"), TypeError, "scale", None),
    ("attention", _attn_args, _kw(scale=True), TypeError, "scale", None),
    ("attention", _attn_args, _kw(scale=1e300), ValueError, "scale", "not finite in float32"),
    ("attention", _attn_args, _kw(scale=float("inf")), ValueError, "scale", None),
    ("attention", _attn_args, _kw(causal=1), TypeError, "causal", None),
    ("attention", _attn_args, _kw(causal="yes"), TypeError, "causal", None),
    ("attention", _attn_args, _kw(causal=None), TypeError, "causal", None),
    ("matmul", _matmul_args, _kw(activation=["relu"]), ValueError, "activation", None),
    ("matmul", _matmul_args, _kw(activation="tanh"), ValueError, "activation", None),
    ("matmul", _matmul_args, _kw(activation=1), ValueError, "activation", None),
    ("linear", _linear_args, _kw(activation=["relu"]), ValueError, "activation", None),
    ("linear", _linear_args, _kw(activation={"relu": 1}), ValueError, "activation", None),
    ("cross_entropy", _ce_args, _kw(ignore_index=2**70), ValueError, "ignore_index", None),
    ("cross_entropy", _ce_args, _kw(ignore_index=1.5), TypeError, "ignore_index", None),
    ("cross_entropy", _ce_args, _kw(ignore_index=True), TypeError, "ignore_index", None),
    ("cross_entropy", _ce_args, _kw(reduction=["mean"]), ValueError, "reduction", None),
    ("cross_entropy", _ce_args, _pos(1, None), TypeError, "targets", None),
    ("cross_entropy", _ce_args, _pos(1, np.zeros(4, np.float32)), TypeError, "targets", None),
    # target values are checked by the implementation (documented), so explain() accepts them
    ("cross_entropy", _ce_args, _pos(1, np.array([0, 7, 0, 0])), ValueError, "targets", "RUN"),
    ("rope", _rope_args, _kw(interleaved="yes"), TypeError, "interleaved", None),
    ("rope", _rope_args, _kw(interleaved=1), TypeError, "interleaved", None),
    ("gelu", _x_args, _kw(approximate=["tanh"]), ValueError, "approximate", None),
    ("geglu", lambda: ((_f32(4, 8), _f32(4, 8, seed=1)), {}), _kw(approximate=None), ValueError,
     "approximate", None),
    ("softmax", _x_args, _kw(axis=1.0), TypeError, "axis", None),
    ("softmax", _x_args, _kw(axis=True), TypeError, "axis", None),
    ("softmax", _x_args, _kw(axis=2), ValueError, "axis", None),
    ("log_softmax", _x_args, _kw(axis="-1"), TypeError, "axis", None),
]


def _bad_id(case):
    op, _, _, exc, name, _ = case
    return f"{op}-{name}-{exc.__name__}"


def _bad_params():
    seen = {}
    out = []
    for case in BAD:
        base = _bad_id(case)
        seen[base] = seen.get(base, 0) + 1
        out.append(pytest.param(*case, id=f"{base}-{seen[base]}"))
    return out


# host inputs (tests/small_inputs.py), so dispatch runs the CPU implementations under the
# simulator too: there these two only repeated the CPU step's work (59 s and 23 s of the
# simulator step, compiling read-only specializations of CPU kernels; 2026-12-02)
_HOST_ONLY = pytest.mark.skipif(ON_CUDA, reason="host inputs run the CPU implementations (the CPU step runs it)")


@_HOST_ONLY
@pytest.mark.parametrize("op_name, valid, change, exc, name, extra", _bad_params())
def test_bad_argument_raises_naming_it_and_writes_nothing(op_name, valid, change, exc, name, extra):
    op = registry.OPS[op_name]
    args, kwargs = valid()
    good = op.public(*args, **kwargs)  # the unchanged call is valid
    bad_args, bad_kwargs = change(args, kwargs)
    out = None
    if S.has_out(op):
        out = np.full(np.shape(good), np.nan, np.asarray(good).dtype)
        bad_kwargs = {**bad_kwargs, "out": out}
    with pytest.raises(exc) as info:
        op.public(*bad_args, **bad_kwargs)
    msg = str(info.value)
    assert re.search(rf"\b{re.escape(name)}\b", msg), f"message does not name {name!r}: {msg}"
    assert "unhashable" not in msg
    if extra not in (None, "RUN"):
        assert re.search(extra, msg), f"message lacks {extra!r}: {msg}"
    if out is not None:
        assert np.isnan(out).all(), "out= was written by a call that raised"
    if extra != "RUN":  # explain validates the same way (it never runs a kernel)
        with pytest.raises(exc):
            dispatch.explain(op_name, *bad_args, **bad_kwargs)


NUMPY_SCALARS = [
    ("layer_norm", _norm_args, {"eps": np.float32(1e-5)}, {"eps": 1e-5}),
    ("rms_norm", _rms_args, {"eps": np.float64(1e-6)}, {"eps": 1e-6}),
    ("attention", _attn_args, {"scale": np.float32(0.25), "causal": np.bool_(True)}, {"scale": 0.25, "causal": True}),
    ("cross_entropy", _ce_args, {"ignore_index": np.int32(6)}, {"ignore_index": 6}),
    ("rope", _rope_args, {"interleaved": np.bool_(True)}, {"interleaved": True}),
    ("softmax", _x_args, {"axis": np.int64(0)}, {"axis": 0}),
]


@pytest.mark.parametrize("op_name, valid, np_kw, py_kw", NUMPY_SCALARS, ids=[c[0] for c in NUMPY_SCALARS])
def test_numpy_scalar_arguments_accepted(op_name, valid, np_kw, py_kw):
    """numpy scalars are the Python numbers they hold (not refused as 'not a real number')."""
    op = registry.OPS[op_name]
    args, kwargs = valid()
    assert S.same(op.public(*args, **kwargs, **np_kw), op.public(*args, **kwargs, **py_kw))


# ---- memmap, matrix, masked arrays -----------------------------------------------------------

def _to_memmap(tmp_path, name, a, mode):
    path = tmp_path / f"{name}.bin"
    m = np.memmap(path, dtype=a.dtype, mode="w+", shape=a.shape)
    m[...] = a
    m.flush()
    del m
    return np.memmap(path, dtype=a.dtype, mode=mode, shape=a.shape)


@_HOST_ONLY
@pytest.mark.parametrize("mode", ["r+", "r"])
@pytest.mark.parametrize("op_name", OP_IDS)
def test_memmap_inputs_accepted(op_name, mode, tmp_path):
    op = registry.OPS[op_name]
    named = S.inputs(op, "small", seed=11)
    expected = S.call(op, named)
    mm = {k: (_to_memmap(tmp_path, k, v, mode) if isinstance(v, np.ndarray) else v) for k, v in named.items()}
    assert all(isinstance(v, np.memmap) for k, v in mm.items() if isinstance(named[k], np.ndarray))
    got = S.call(op, mm)
    if isinstance(got, QuantizedArray):  # quantize: compare its fields, its values an ndarray
        assert S.same(got, expected) and type(got.values) is np.ndarray
        return
    if isinstance(got, tuple):  # (result, gradient) ops: S.same compares tuples elementwise
        assert S.same(got, expected)
    else:
        assert S.same(np.asarray(got), np.asarray(expected))
    assert type(got) is np.ndarray or isinstance(got, tuple), f"result is a {type(got).__name__}"


@pytest.mark.parametrize("op_name", [op.name for op in OPS if S.has_out(op)])
def test_memmap_out_is_written(op_name, tmp_path):
    op = registry.OPS[op_name]
    named = S.inputs(op, "small", seed=12)
    expected = S.call(op, named)
    out = np.memmap(tmp_path / "out.bin", dtype=expected.dtype, mode="w+", shape=expected.shape)
    out[...] = np.nan
    got = S.call(op, named, out=out)
    assert got is out
    assert S.same(np.asarray(out), expected)
    out.flush()
    back = np.fromfile(tmp_path / "out.bin", dtype=expected.dtype).reshape(expected.shape)
    assert S.same(back, expected)
    # a read-only memmap out= is refused before anything is written
    ro_out = np.memmap(tmp_path / "out.bin", dtype=expected.dtype, mode="r", shape=expected.shape)
    with pytest.raises(ValueError, match="out must be writeable"):
        S.call(op, named, out=ro_out)


def _refused_cases():
    out = []
    for op in OPS:
        named = S.inputs(op, "small", seed=13)
        for name in S.array_names(named):
            out.append(pytest.param(op.name, name, "masked", id=f"{op.name}-{name}-masked"))
            if named[name].ndim == 2:
                out.append(pytest.param(op.name, name, "matrix", id=f"{op.name}-{name}-matrix"))
        if S.has_out(op):
            out.append(pytest.param(op.name, "out", "masked", id=f"{op.name}-out-masked"))
    return out


def _wrap(kind, a):
    if kind == "masked":
        return np.ma.masked_array(a, mask=np.zeros(a.shape, bool))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # numpy's advice against np.matrix
        return np.asmatrix(a)


@pytest.mark.parametrize("op_name, name, kind", _refused_cases())
def test_matrix_and_masked_arrays_refused(op_name, name, kind):
    op = registry.OPS[op_name]
    named = S.inputs(op, "small", seed=13)
    param = S.public_names(op, named).get(name, name)
    extra = {}
    if name == "out":
        good = S.call(op, named)
        extra["out"] = _wrap(kind, np.full(np.shape(good), np.nan, good.dtype))
    else:
        named = {**named, name: _wrap(kind, named[name])}
    with pytest.raises(TypeError, match=rf"\b{re.escape(param)}\b"):
        S.call(op, named, **extra)


# ---- read-only inputs ------------------------------------------------------------------------

def _kernel_dispatchers_by_name():
    """({name: numba dispatchers}, {name: plain Python functions}) of the kernels_cpu
    modules: the second are the Python glue some kernels have (attention's flash, the
    GEMM's gemm_parallel, parallel.run_workers), which call the compiled workers."""
    by_name, glue = {}, {}
    for modname, mod in list(sys.modules.items()):
        if mod is None or not modname.startswith("kernels_cpu"):
            continue
        for name, v in vars(mod).items():
            if isinstance(v, Dispatcher):
                by_name.setdefault(name, set()).add(v)
            elif isinstance(v, pytypes.FunctionType) and v.__module__ == modname:
                glue.setdefault(name, []).append(v)
    return by_name, glue


def _kernels_of(impl):
    """The numba kernels an implementation's run calls from Python: kernels held in its
    closures, and kernels_cpu functions it names, followed through the dispatch helpers
    it calls (by name, so approximate, but never another op's kernels)."""
    by_name, glue = _kernel_dispatchers_by_name()
    found, seen, todo = set(), set(), [impl.run]
    for op_name in impl.composes:   # a composite: the kernels of the ops it calls
        for other in registry.OPS[op_name].implementations.values():
            if other.device == impl.device:
                found |= _kernels_of(other)
    while todo:
        f = todo.pop()
        code = getattr(f, "__code__", None)
        if code is None or id(f) in seen:
            continue
        seen.add(id(f))
        for cell in f.__closure__ or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if isinstance(v, Dispatcher):
                found.add(v)
            elif isinstance(v, pytypes.FunctionType):
                todo.append(v)
        for name in code.co_names:
            found |= by_name.get(name, set())
            todo.extend(glue.get(name, ()))
            g = f.__globals__.get(name)
            if isinstance(g, pytypes.FunctionType) and g.__module__.startswith("dispatch"):
                todo.append(g)
            elif hasattr(g, "__wrapped__") and isinstance(g.__wrapped__, pytypes.FunctionType):
                todo.append(g.__wrapped__)  # functools.lru_cache helpers
    return found


def _specializations(kernels):
    """The compiled (kernel, signature) pairs of some kernels."""
    return {(d.py_func.__qualname__, str(sig)) for d in kernels for sig in d.signatures}


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _repeat_first_row(v, writeable):
    """A stride-0 view repeating v[:1] along the first axis (read-only as np.broadcast_to
    makes it, or the same layout writeable)."""
    if not writeable:
        return np.broadcast_to(v[:1], v.shape)
    return np.lib.stride_tricks.as_strided(v[:1], shape=v.shape, strides=(0,) + v.strides[1:], writeable=True)


def _values(v):
    """The array of an input: itself, or a QuantizedArray's values (the int8 ops' operands)."""
    from dispatch.quantized import QuantizedArray
    return v.values if isinstance(v, QuantizedArray) else v


def _with_values(v, f):
    """f(v) for an array input; for a QuantizedArray, the same scales around f(values)."""
    from dispatch.quantized import QuantizedArray
    if isinstance(v, QuantizedArray):
        return QuantizedArray(f(v.values), v.scale, v.zero_point, v.axis)
    return f(v)


def _variants(named):
    """(description, read-only inputs, writeable inputs of the same values and layout)."""
    arrays = [k for k, v in named.items() if isinstance(_values(v), np.ndarray)]
    yield "writeable=False", {k: (_with_values(v, _readonly) if k in arrays else v) for k, v in named.items()}, named
    yield "broadcast_to same shape", {k: (_with_values(v, lambda a: np.broadcast_to(a, a.shape)) if k in arrays else v)
                                      for k, v in named.items()}, named
    rows = [k for k in arrays if _values(named[k]).ndim >= 2]
    yield ("broadcast_to first row",
           {k: (_with_values(v, lambda a: _repeat_first_row(a, False)) if k in rows else v) for k, v in named.items()},
           {k: (_with_values(v, lambda a: _repeat_first_row(a, True)) if k in rows else v) for k, v in named.items()})


def _readonly_cases(with_default=True):
    out = []
    for op in OPS:
        for impl in S.cpu_impls(op):
            out.append(pytest.param(op.name, impl, id=f"{op.name}-{impl}"))
        if with_default:
            out.append(pytest.param(op.name, DEFAULT, id=f"{op.name}-default"))
    return out


@pytest.mark.skipif(ON_CUDA, reason="CPU implementations (the cpu job runs them)")
@pytest.mark.parametrize("op_name, impl", _readonly_cases())
def test_readonly_inputs_same_result_no_warning(op_name, impl):
    """Read-only inputs give bitwise the result of writeable inputs of the same values and
    layout, and emit no warning."""
    op = registry.OPS[op_name]
    named = S.inputs(op, "small", seed=14)
    ctx = dispatch.use(**{op_name: impl}) if impl != DEFAULT else dispatch.use()
    with ctx:
        for what, ro, rw in _variants(named):
            expected = S.call(op, rw)      # warm-up: compiled here, for writeable inputs
            assert any(not _values(v).flags.writeable for v in ro.values() if isinstance(_values(v), np.ndarray)), what
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = S.call(op, ro)
            msgs = [f"{w.category.__name__}: {w.message}" for w in caught]
            assert not msgs, f"{op_name} ({impl or 'default'}), {what}: warnings {msgs}"
            assert S.same(got, expected), f"{op_name} ({impl or 'default'}), {what}: result differs"


_COMPILES_PROBE = textwrap.dedent("""
    import json, sys
    import dispatch
    from dispatch import registry
    from tests import small_inputs as S
    from tests.test_contract import _kernels_of, _specializations, _variants
    report = {}
    for op in registry.OPS.values():
        named = S.inputs(op, "small", seed=14)
        for impl in S.cpu_impls(op):
            kernels = _kernels_of(op.implementations[impl])
            with dispatch.use(**{op.name: impl}):
                for what, ro, rw in _variants(named):
                    S.call(op, rw)
                before = _specializations(kernels)
                for what, ro, rw in _variants(named):
                    S.call(op, ro)
                after = _specializations(kernels)
            report[op.name + "|" + impl] = {"kernels": sorted(d.py_func.__qualname__ for d in kernels),
                                            "new": sorted(map(list, after - before))}
    print("REPORT", json.dumps(report))
""")


@pytest.fixture(scope="module")
def readonly_compiles():
    """In a fresh process (so that what earlier tests compiled does not hide anything): for
    every op and CPU implementation, the kernel specializations that read-only inputs added
    after the same calls with writeable inputs."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    for var in ("NK_USE", "NK_EXCLUDE", "NK_TUNING_CACHE"):
        env.pop(var, None)
    r = subprocess.run([sys.executable, "-c", _COMPILES_PROBE], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


@pytest.mark.skipif(ON_CUDA, reason="CPU implementations (the cpu job runs them)")
@pytest.mark.parametrize("op_name, impl", _readonly_cases(with_default=False))
def test_readonly_inputs_compile_nothing_new(readonly_compiles, op_name, impl):
    """Read-only inputs reach the kernels as writeable-typed aliases (kernel_input): numba
    would otherwise compile (seconds, per kernel) a second specialization of every kernel."""
    got = readonly_compiles[f"{op_name}|{impl}"]
    assert got["kernels"], f"found no kernels of {op_name} {impl} (the test's kernel discovery needs updating)"
    assert not got["new"], f"{op_name} ({impl}): read-only inputs compiled {got['new']}"


def test_gemm_index_arrays_compile_one_specialization():
    """matmul's batch broadcasting (no batch, batch on a, on b, on both) must not change the
    kernels' argument types: the batch index arrays are sometimes read-only views
    (np.broadcast_to(...).ravel()) and sometimes fresh arrays, and each combination is a
    separate compile of the GEMM kernels (tens of seconds for gemm_parallel)."""
    rng = np.random.default_rng(3)

    def f(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def t(b):  # a (..., K, N) view of a (..., N, K) array: the (N, K) weight layout of gemv_nk
        return np.swapaxes(b, -1, -2)

    layouts = [(f(5, 24), f(24, 19)), (f(2, 5, 24), f(24, 19)), (f(5, 24), f(2, 24, 19)),
               (f(2, 5, 24), f(2, 24, 19)), (f(2, 1, 5, 24), f(3, 24, 19))]
    layouts += [(a, t(np.ascontiguousarray(np.swapaxes(b, -1, -2)))) for a, b in layouts]
    for a, b in layouts:
        with dispatch.use(matmul="cpu-gemv"):
            dispatch.matmul(a, b)
    # both GEMV forms are workers called by address (one compiled function per dtype); the
    # helper filling their argument block (parallel.addresses) is the one kernel typed on
    # the arrays, and both forms fill it from the same types: one float32 specialization
    from kernels_cpu import parallel
    sigs = {str(s) for s in parallel.addresses.signatures
            if str(s).count("Array(float32, 3") == 3 and str(s).count("Array(int64, 1") == 3}
    assert len(sigs) == 1, f"parallel.addresses compiled {len(sigs)} GEMV specializations:\n  " + "\n  ".join(
        sorted(sigs))


# ---- NK_USE / NK_EXCLUDE ---------------------------------------------------------------------

@pytest.fixture
def fresh_env(monkeypatch):
    """Forget the parsed NK_USE / NK_EXCLUDE (restored afterwards by monkeypatch)."""
    monkeypatch.delenv("NK_USE", raising=False)
    monkeypatch.delenv("NK_EXCLUDE", raising=False)
    monkeypatch.setattr(select, "_env_state", None)
    monkeypatch.setattr(select, "_env_error", None)
    return monkeypatch


BAD_ENV = [
    ("NK_USE", "softmax=garbage", "garbage"),
    ("NK_USE", "garbage", "garbage"),
    ("NK_USE", "notanop=cpu-serial", "notanop"),
    ("NK_USE", "softmax=cpu-serial,softmax=cpu-parallel", "softmax"),
    ("NK_USE", "=x", "=x"),
    ("NK_USE", "softmax=", "softmax="),
    ("NK_USE", "softmax=cpu-serial=x", "softmax=cpu-serial=x"),
    ("NK_USE", "softmax=blas", "blas"),
    ("NK_EXCLUDE", "garbage", "garbage"),
    ("NK_EXCLUDE", "softmax=garbage", "garbage"),
    ("NK_EXCLUDE", "=x", "=x"),
]


@pytest.mark.parametrize("var, value, entry", BAD_ENV, ids=[f"{v}={s}" for v, s, _ in BAD_ENV])
def test_malformed_environment_raises_naming_variable_and_entry(fresh_env, var, value, entry):
    fresh_env.setenv(var, value)
    x = _f32(3, 5)
    for attempt in range(2):  # raised on every call, not only the first
        with pytest.raises(ValueError) as info:
            dispatch.softmax(x)
        msg = str(info.value)
        assert var in msg and entry in msg, f"{var}={value!r}: {msg}"
    with pytest.raises(ValueError, match=var):
        dispatch.explain("softmax", x)


def test_valid_nk_use_forces(fresh_env):
    x = S.inputs(registry.OPS["softmax"], "large", seed=1)["x"]
    rule_choice = dispatch.explain("softmax", x).chosen
    other = next(n for n in S.cpu_impls(registry.OPS["softmax"]) if n != rule_choice)
    fresh_env.setattr(select, "_env_state", None)
    fresh_env.setenv("NK_USE", f"softmax={other}")
    e = dispatch.explain("softmax", x)
    assert (e.chosen, e.source) == (other, "forced")
    assert dispatch.explain("log_softmax", x).chosen == rule_choice  # other ops untouched
    with dispatch.use(softmax=rule_choice):  # a use() block overrides the environment
        assert dispatch.explain("softmax", x).chosen == rule_choice
    assert S.same(dispatch.softmax(x), S.call(registry.OPS["softmax"], {"x": x}))


def test_valid_nk_exclude_excludes(fresh_env):
    x = S.inputs(registry.OPS["softmax"], "large", seed=1)["x"]
    rule_choice = dispatch.explain("softmax", x).chosen
    fresh_env.setattr(select, "_env_state", None)
    fresh_env.setenv("NK_EXCLUDE", f"softmax={rule_choice}")
    e = dispatch.explain("softmax", x)
    assert e.chosen != rule_choice and e.chosen is not None
    assert dict((n, v) for n, v, _ in e.candidates)[rule_choice] == "excluded"
    assert dispatch.explain("log_softmax", x).chosen == rule_choice


# ---- tuning cache ----------------------------------------------------------------------------

@pytest.fixture
def cache_at(monkeypatch):
    """cache_at(path): NK_TUNING_CACHE = path, the loaded cache and decisions forgotten."""

    def point(path):
        monkeypatch.setenv("NK_TUNING_CACHE", str(path))
        tuning.reload()
        select.clear_cache()

    return point


_PROBE = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    import dispatch
    x = np.ones((2, 3), np.float32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        e = dispatch.explain("softmax", x)
        y = dispatch.softmax(x)
    print("SOURCE", e.source)
    for m in w:
        print("WARNING", m.category.__name__, m.message)
""")


def _probe_subprocess(cache_path, timeout=240):
    env = {**os.environ, "NK_TUNING_CACHE": str(cache_path), "PYTHONPATH": ROOT}
    env.pop("NK_USE", None)
    env.pop("NK_EXCLUDE", None)
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_tuning_cache_special_file_does_not_block(kind, tmp_path):
    """A FIFO with no writer (opening it for reading would block) and /dev/zero (endless)
    are refused with a warning, in a subprocess so that a hang fails instead of freezing
    the suite."""
    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        path = tmp_path / "tuning.fifo"
        os.mkfifo(path)
    else:
        path = "/dev/zero"
        if not os.path.exists(path):
            pytest.skip("no /dev/zero")
    try:
        r = _probe_subprocess(path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a tuning cache that is {kind} made the call hang")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SOURCE rule" in r.stdout
    assert re.search(r"WARNING RuntimeWarning ignoring unreadable tuning cache .*not a regular file", r.stdout), \
        r.stdout + r.stderr[-2000:]


def _warns_unreadable(match):
    return pytest.warns(RuntimeWarning, match=f"ignoring unreadable tuning cache.*({match})")


def test_tuning_cache_directory_warns(tmp_path, cache_at):
    d = tmp_path / "a-directory"
    d.mkdir()
    cache_at(d)
    with _warns_unreadable("not a regular file|Is a directory"):
        e = dispatch.explain("softmax", _f32(2, 3))
    assert e.source == "rule"


def test_tuning_cache_too_large_warns_without_reading_it(tmp_path, cache_at, monkeypatch):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(tuning.MAX_BYTES + 1)  # sparse: nothing is written
    cache_at(big)
    reads = []
    real_read = os.read

    def counting_read(fd, n):  # noqa: ANN001
        reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counting_read)
    with _warns_unreadable(str(tuning.MAX_BYTES)):
        e = dispatch.explain("softmax", _f32(2, 3))
    assert e.source == "rule"
    assert sum(reads) <= tuning.MAX_BYTES


@pytest.mark.parametrize("content, match", [
    (b"{not json", "Expecting|JSON|property"),
    (b"[1, 2, 3]", "format"),
    (json.dumps({"format": 1, "entries": {}}).encode(), "format"),
    (json.dumps({"format": tuning.FORMAT, "entries": []}).encode(), "format"),
    (b"\xff\xfe\x00garbage", "codec|decode"),
], ids=["bad-json", "a-list", "old-format", "entries-not-object", "not-utf8"])
def test_tuning_cache_malformed_file_warns(tmp_path, cache_at, content, match):
    p = tmp_path / "tuning.json"
    p.write_bytes(content)
    cache_at(p)
    with _warns_unreadable(match):
        e = dispatch.explain("softmax", _f32(2, 3))
    assert e.source == "rule"


def _decode_call():
    """An attention call that cpu-splitkv can run, and whose rule choice is not it."""
    rng = _rng(21)
    q = rng.standard_normal((1, 4, 40, 16)).astype(np.float32)
    k = rng.standard_normal((1, 4, 70, 16)).astype(np.float32)
    v = rng.standard_normal((1, 4, 70, 16)).astype(np.float32)
    return q, k, v


def _write_entry(path, op_name, key, **entry):
    impl = registry.OPS[op_name].implementations.get(entry.get("impl"))
    full = {"impl": entry.get("impl"), "params": {}, "time_s": 1e-4,
            "kernel_version": impl.version if impl is not None else "0" * 16,
            "numba_version": numba.__version__}
    full.update(entry)
    path.write_text(json.dumps({"format": tuning.FORMAT, "entries": {tuning.entry_key(op_name, key): full}}))


@pytest.fixture
def attention_entry(tmp_path, cache_at):
    q, k, v = _decode_call()
    key = registry.OPS["attention"].describe(q, k, v).key
    with dispatch.use(tuned=False):
        rule_choice = dispatch.explain("attention", q, k, v).chosen
    assert rule_choice != "cpu-splitkv", "pick a call whose rule choice is not cpu-splitkv"
    path = tmp_path / "tuning.json"

    def write(**entry):
        _write_entry(path, "attention", key, **entry)
        cache_at(path)

    return (q, k, v), rule_choice, write


def test_tuning_entry_valid_is_used(attention_entry):
    (q, k, v), rule_choice, write = attention_entry
    write(impl="cpu-splitkv", params={"items_per_thread": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = dispatch.explain("attention", q, k, v)
    assert (e.chosen, e.source, e.params) == ("cpu-splitkv", "tuned", {"items_per_thread": 2})
    got = dispatch.attention(q, k, v)
    with dispatch.use(attention=rule_choice):
        ref = dispatch.attention(q, k, v)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("params", [
    {"items_per_thread": "4"}, {"items_per_thread": 4.0}, {"items_per_thread": True}, {"items_per_thread": 3},
    {"items_per_thread": None}, {"items_per_thread": [4]}, {"bogus": 1}, [4], "4",
], ids=["str", "float", "bool", "not-tunable", "none", "list", "unknown-name", "params-list", "params-str"])
def test_tuning_entry_bad_parameter_ignored_with_warning(attention_entry, params):
    (q, k, v), rule_choice, write = attention_entry
    write(impl="cpu-splitkv", params=params)
    with pytest.warns(RuntimeWarning, match="ignoring malformed tuning entry"):
        e = dispatch.explain("attention", q, k, v)
    assert (e.chosen, e.source) == (rule_choice, "rule")
    with pytest.warns(RuntimeWarning, match="ignoring malformed tuning entry"):
        got = dispatch.attention(q, k, v)  # no TypeError from inside a kernel
    with dispatch.use(attention=rule_choice):
        assert S.same(got, dispatch.attention(q, k, v))


@pytest.mark.parametrize("change, match", [
    ({"kernel_version": "0123456789abcdef"}, "kernel sources changed"),
    ({"numba_version": "0.0.1"}, "numba"),
    ({"impl": "cpu-no-such-kernel"}, "no longer exists"),
], ids=["kernel-version", "numba-version", "unknown-impl"])
def test_tuning_entry_stale_ignored_with_warning(attention_entry, change, match):
    (q, k, v), rule_choice, write = attention_entry
    write(**{"impl": "cpu-splitkv", **change})
    with pytest.warns(RuntimeWarning, match=f"ignoring stale tuning entry.*{match}"):
        e = dispatch.explain("attention", q, k, v)
    assert (e.chosen, e.source) == (rule_choice, "rule")
    with pytest.warns(RuntimeWarning, match="ignoring stale tuning entry"):
        dispatch.attention(q, k, v)


@pytest.mark.parametrize("entry", [
    "cpu-splitkv",
    None,
    3, ["cpu-splitkv"]], ids=["str", "null", "int", "list"])
def test_tuning_entry_malformed_ignored_with_warning(tmp_path, cache_at, entry):
    q, k, v = _decode_call()
    key = registry.OPS["attention"].describe(q, k, v).key
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"format": tuning.FORMAT, "entries": {tuning.entry_key("attention", key): entry}}))
    cache_at(path)
    with pytest.warns(RuntimeWarning, match="ignoring malformed tuning entry"):
        e = dispatch.explain("attention", q, k, v)
    assert e.source == "rule"


def test_tuning_entry_of_another_device_ignored(attention_entry):
    """An entry for a CPU key that names a CUDA implementation (a hand-edited or
    mixed-up file) is ignored with a warning, and the shape rule decides."""
    (q, k, v), rule_choice, write = attention_entry
    cuda = [i.name for i in registry.OPS["attention"].implementations.values() if i.device == "cuda"]
    if not cuda:
        pytest.skip("no CUDA implementation of attention registered")
    write(impl=cuda[0])
    with pytest.warns(RuntimeWarning, match="tuning entry"):
        e = dispatch.explain("attention", q, k, v)
    assert (e.chosen, e.source) == (rule_choice, "rule")


# ---- kernel versions -------------------------------------------------------------------------

def test_source_version_changes_with_the_source(tmp_path, monkeypatch):
    """registry.source_version hashes the module files (found, not imported): an edit
    changes it, the same text under another module name differs too, and an
    Implementation's version follows its kernel modules and its run function's module."""
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = tmp_path / "nk_tmp_kernel_a.py", tmp_path / "nk_tmp_kernel_b.py"
    a.write_text("def kernel(x):\n    return x + 1\n")
    b.write_text("def kernel(x):\n    return x + 1\n")
    (tmp_path / "nk_tmp_run.py").write_text("def run(params, *args):\n    return None\n")
    importlib.invalidate_caches()
    registry.source_version.cache_clear()
    va = registry.source_version("nk_tmp_kernel_a")
    vb = registry.source_version("nk_tmp_kernel_b")
    assert re.fullmatch(r"[0-9a-f]{16}", va)
    assert va != vb, "the module name is part of the hash"
    assert registry.source_version("nk_tmp_kernel_a") == va  # stable
    assert "nk_tmp_kernel_a" not in sys.modules, "hashing must not import the module"

    run_mod = importlib.import_module("nk_tmp_run")
    try:
        impl = registry.Implementation("nk-op", "cpu-x", "cpu", run_mod.run, kernel_modules=("nk_tmp_kernel_a",))
        v_impl = impl.version
        a.write_text("def kernel(x):\n    return x + 2\n")  # a kernel edit
        registry.source_version.cache_clear()               # (a new process)
        assert registry.source_version("nk_tmp_kernel_a") != va
        assert impl.version != v_impl
        v_impl2 = impl.version
        (tmp_path / "nk_tmp_run.py").write_text("def run(params, *args):\n    return 1\n")
        registry.source_version.cache_clear()
        assert impl.version != v_impl2, "an edit of the run function's module changes the version too"
    finally:
        sys.modules.pop("nk_tmp_run", None)
        registry.source_version.cache_clear()

    with pytest.raises(registry.RegistryError, match="nk_tmp_no_such_module"):
        registry.source_version("nk_tmp_no_such_module")


def test_every_implementation_has_a_version():
    """Every registered implementation's kernel sources are found and hashed (a typo in
    kernel_modules would only show when the tuner runs)."""
    for impl in registry.implementations():
        assert re.fullmatch(r"[0-9a-f]{16}", impl.version), (impl.op, impl.name)


@pytest.mark.skipif(ON_CUDA, reason="the CPU kernels' compiled variants (the simulator job tests the CUDA side)")
def test_workers_compile_per_variant_not_per_layout():
    """The address-called workers (kernels_cpu/parallel.py) are compiled per variant only:
    attention with contiguous inputs, fused-QKV views, a transposed out= and a read-only
    mask share one flash_worker; linear with a prepacked and an unpacked weight, with and
    without a bias, share one gemm_worker, its packers and epilogue, and another
    activation adds only its epilogue (the worker is compiled per dtype)."""
    from kernels_cpu import attention as KA
    from kernels_cpu import gemm as KG

    g = np.random.default_rng(4)
    B, S, H, D = 2, 9, 2, 16
    qkv = g.standard_normal((B, S, 3, H, D)).astype(np.float32)
    views = [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    contiguous = [np.ascontiguousarray(a) for a in views]
    mask = np.broadcast_to(g.random((B, 1, 1, S)) < 0.8, (B, 1, 1, S))
    with dispatch.use(attention="cpu-flash"):
        dispatch.attention(*contiguous, mask=mask)
        before = {str(s) for s in KA.flash_worker.signatures}
        dispatch.attention(*views, mask=mask, out=np.empty((B, S, H, D), np.float32).transpose(0, 2, 1, 3))
        dispatch.attention(*views, mask=mask.copy())
    assert {str(s) for s in KA.flash_worker.signatures} == before

    x = g.standard_normal((16, 24)).astype(np.float32)
    w = g.standard_normal((19, 24)).astype(np.float32)
    gemm_parts = (KG.gemm_worker, KG.gemm_epilogue, KG._pack_a_n, KG._pack_a_t, KG._pack_b_n, KG._pack_b_t)

    def compiled():
        return {(f.py_func.__name__, str(s)) for f in gemm_parts for s in f.signatures}

    with dispatch.use(linear="cpu-gemm"):
        dispatch.linear(x, w, np.ones(19, np.float32), activation="relu")
        before = compiled()
        dispatch.linear(x, dispatch.prepack(w), np.ones(19, np.float32), activation="relu")
        dispatch.linear(x, dispatch.prepack(w), None, activation="relu")
        assert compiled() == before
        # another activation adds (at most: another test may have compiled it) its
        # epilogue: the worker and the packers are compiled per dtype
        dispatch.linear(x, w, None, activation="silu")
    assert {name for name, _ in compiled() - before} <= {"gemm_epilogue"}
