"""The one registry of ops and their implementations.

Everything that needs to know which ops and kernels exist reads this module: the public
namespace (`dispatch/__init__` exports every op's public function), the dispatcher
(`dispatch.select`), `explain`, the tests (every implementation is forced and compared with
the float64 reference), the performance report, the asv suite, the tuner, the PTX report
and the CUDA model.  Adding an op is writing its own files (see README "Adding an op");
nothing else keeps a list of ops.

Vocabulary
----------
op              the public function's name, e.g. ``"softmax"``; one `Op` record.
key             a small hashable description of one call, built by the op's ``describe``:
                a NamedTuple whose first three fields are ``op``, ``device``, ``dtype``
                followed by the op's bucketed shape facts and flags (``key.row_len``, not
                ``key[4]``).  Selection depends on the key only, so the choice is cached.
args            the prepared arguments of a call, a NamedTuple per op (``call.args.x``).
Rule            one op's shape rule on one device: the candidate names it may return
                (checked against the registered implementations) and the function
                key -> (names best first, why).
Implementation  one kernel variant of one op ("cpu-serial", "cpu-parallel", "blas", ...):
                what it supports (a function of the key returning refusal reasons), how to
                run it on the prepared arguments, and the kernel modules whose source
                versions it (the tuning cache's staleness check).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

from kernels_cpu import runtime as cpu_runtime
from kernels_cpu import keepwarm

from . import interop, memo

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
DEVICES = ("cpu", "cuda")
BOUNDS = ("compute", "memory")


def bucket(n: int) -> int:
    """Shape bucket of a size: exact up to 16, else the largest power of two <= n.

    Size rules use power-of-two thresholds T, and n >= T exactly when bucket(n) >= T,
    so a rule evaluated on the bucket gives the same answer as on the exact size."""
    if n <= 16:
        return n
    return 1 << (n.bit_length() - 1)


def bucket_half(n: int) -> int:
    """Shape bucket in half octaves: exact up to 16, else the largest of 2^j and 3 * 2^(j-1)
    that is <= n.  bucket(bucket_half(n)) == bucket(n), and n >= T exactly when
    bucket_half(n) >= T for T a power of two or three times one, so the power-of-two rules
    read the same on it; it also tells 384 (MiniLM's hidden size, 8 whole panels of the
    48-column GEMM tile) from 256.  Sizes in a bucket b lie in [b, bucket_half_end(b))."""
    if n <= 16:
        return n
    p = 1 << (n.bit_length() - 1)
    return p + (p >> 1) if n >= p + (p >> 1) else p


def bucket_half_end(b: int) -> int:
    """The first size above half-octave bucket b's range (bucket_half)."""
    if b < 16:
        return b + 1
    p = 1 << (b.bit_length() - 1)
    return p + (p >> 1) if b == p else 2 * p


def bucket_up(n: int) -> int:
    """Shape bucket rounding up: exact up to 16, else the smallest power of two >= n.

    For limits of the form n <= T (T a power of two): n <= T exactly when bucket_up(n) <= T
    (a head dim that fits a 128-wide tile), which bucket() cannot tell (bucket(200) = 128)."""
    if n <= 16:
        return n
    return 1 << (n - 1).bit_length()


def shape_only(rng) -> bool:
    """Whether rng is a shape-only generator (bench.cases.ShapeOnlyRng): the CUDA model
    describes calls without running them, so only the inputs' shapes, dtypes and layouts
    matter, not their values."""
    return getattr(rng, "shape_only", False)


def draw_normal(rng, shape, dtype):
    """rng.standard_normal(shape) as dtype: the benchmark inputs' usual draw.  From a
    shape-only generator, zeros: contiguous as a real draw is (layouts are part of the
    dispatch key), and free to make (calloc'd pages nothing touches); drawing and casting
    full arrays took 12.5 of the CUDA model's 22 s (2026-11-27)."""
    if shape_only(rng):
        return np.zeros(shape, dtype)
    return rng.standard_normal(shape).astype(dtype)


class RegistryError(ValueError):
    """An op or implementation declared inconsistently (raised at import)."""


@functools.lru_cache(maxsize=None)
def source_version(*modules: str) -> str:
    """A short hash of the named modules' source files (found without importing them, so
    hashing a CUDA kernel module does not load numba.cuda).  It changes whenever one of
    the sources changes: the tuning cache's kernel version."""
    h = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = getattr(spec, "origin", None) if spec is not None else None
        if origin is None:
            raise RegistryError(f"kernel module {name!r} not found")
        with open(origin, "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Rule:
    """An op's shape rule on one device.

    names: every implementation name `choose` can return (checked at import against the
        registered implementations of the op on that device);
    choose(key) -> (names best first, why): the order to try for this key and the
        measurement-backed reason `explain` prints.
    """

    names: tuple
    choose: Callable[[Any], tuple]

    def __call__(self, key):
        names, why = self.choose(key)
        stray = [n for n in names if n not in self.names]
        if stray:
            raise RegistryError(f"rule returned {stray}, which it does not declare in names={self.names}")
        return tuple(names), why


def fixed_rule(names, why: str) -> Rule:
    """A rule that gives the same order for every key."""
    names = tuple(names)
    return Rule(names, lambda key: (names, why))


@dataclass
class Implementation:
    """One kernel variant of one op.

    run(params, *args) executes it on the arguments prepared by the op's ``describe``
    (validated, output allocated) and returns the public result.
    supports(key) -> list of refusal reasons (empty: it can run this call).
    kernel_modules: the modules holding its kernels (and the helpers they inline); their
        source hash is `version`, so a tuning entry made before a kernel edit is stale.
    params: default tunable parameters; tunables: candidate values for the tuner.
    composes: the ops a composite implementation calls through their public functions
        (linear_cross_entropy runs linear and cross_entropy_with_grad per chunk): their
        kernels are its kernels (the contract tests follow them).
    host() -> why this host (numba's target) cannot run it at all, for any call, or None
        when it can: the kernels built on instructions some x86 hosts lack (AMX, AVX-512
        BF16, VNNI).  supports() names the same reason per key; warmup skips such an
        implementation as "not for this host" instead of failing on it.
    """

    op: str
    name: str
    device: str
    run: Callable[..., Any]
    dtypes: tuple = FLOAT_DTYPES
    supports: Callable[[Any], list] | None = None
    notes: str = ""
    params: dict = field(default_factory=dict)
    tunables: dict = field(default_factory=dict)
    kernel_modules: tuple = ()
    composes: tuple = ()
    host: Callable[[], str | None] | None = None

    @property
    def version(self) -> str:
        mods = tuple(self.kernel_modules) + (self.run.__module__,)
        return source_version(*mods)

    def refusals(self, key) -> list:
        """Why this implementation cannot take a call with this key (empty: it can)."""
        reasons = []
        if key.device != self.device:
            reasons.append(f"runs on {self.device}, inputs are on {key.device}")
        if key.dtype not in self.dtypes:
            names = ", ".join(str(d) for d in self.dtypes)
            reasons.append(f"dtype {key.dtype} not supported (supports {names})")
        if not reasons and self.supports is not None:
            reasons.extend(self.supports(key))
        return reasons


class Call(NamedTuple):
    """A validated call: the selection key, the prepared arguments for
    ``Implementation.run`` (a NamedTuple of the op) and notes on what preparation did (a
    tuple of strings, or a function returning one, called only by explain)."""

    key: Any
    args: Any
    prep_notes: tuple = ()


@dataclass
class Op:
    """An op and everything other parts need to know about it.

    describe(*args, **kwargs) -> Call: validates and prepares the arguments (raising
        TypeError/ValueError before anything is written) and returns the named key and
        the named prepared arguments.
    rules: device -> Rule, the shape rule ordering the candidates for keys on that device.
        The CPU rule is given here; the CUDA implementations' module adds the CUDA rule
        with `set_rule` (one rule per op and device, never replaced).
    flops(call), bytes(call): the work model (FLOPs, fewest bytes moved) shared by all
        implementations: the report's roofline, asv's throughput and the CUDA model.
    family: the module family ("softmax", "norm", ...): report grouping, asv classes.
    bound: "compute" or "memory": which roofline limit the report and asv track.
    signature(inputs: dict) -> (args, kwargs): how the named benchmark inputs (bench/cases)
        map onto the public function.
    synthesize(shapes, params, rng, dtype) -> dict: the named benchmark inputs of a case
        (None: every shape drawn from a standard normal in `dtype`).
    public: the public function (exported as ``dispatch.<name>``).
    variants: {name: f(args, kwargs) -> (args, kwargs)}: the same call made another way
        that compiles kernels of its own, which `python -m dispatch.warmup` compiles too:
        another memory layout (attention's fused-QKV views), another fused epilogue
        (linear's activations: the GEMM's epilogue is compiled per activation), or the
        inputs an implementation takes where the examples are of another kind (linear's
        low-precision weights, conv2d's dense 3x3): warmup runs every form an
        implementation takes.
    updates: names of inputs the op writes in place (the decode states of
        selective_state_update / causal_conv1d_update).  Whoever calls the op repeatedly on
        the same named inputs and wants the same result (the contract and thread tests)
        passes fresh copies of these (`fresh_inputs`); benchmarks let the state evolve, as a
        decode loop does.
    memo: describe depends only on what dispatch.memo's contract names (the arguments'
        shapes, strides, dtypes and scalar values, never array values or overlap), so a
        call whose signature was seen is rebuilt without running it (dispatch/memo.py).
    """

    name: str
    describe: Callable[..., Call]
    family: str
    bound: str
    signature: Callable[[dict], tuple]
    flops: Callable[[Call], float]
    bytes: Callable[[Call], float]
    rules: dict = field(default_factory=dict)
    synthesize: Callable[..., dict] | None = None
    public: Callable[..., Any] | None = None
    implementations: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)
    updates: tuple = ()
    memo: bool = False
    _described: dict = field(default_factory=dict, repr=False, compare=False)  # memo.described's table

    def __post_init__(self):
        if self.bound not in BOUNDS:
            raise RegistryError(f"op {self.name!r}: bound must be one of {BOUNDS}, got {self.bound!r}")
        for device, rule in self.rules.items():
            _check_rule_type(self.name, device, rule)

    def __call__(self, *args, **kwargs):
        """Validate, select and run: what every public function does.  PyTorch tensors
        are taken and given back without copies (dispatch.interop)."""
        if interop.has_tensor(args, kwargs):
            conv = interop.convert(args, kwargs)
            return conv.back(self._run(conv.args, conv.kwargs))
        return self._run(args, kwargs)

    def _run(self, args, kwargs):
        if self.memo and not self.updates:
            call = memo.described(self._described, self.describe, args, kwargs)
        else:
            call = self.describe(*args, **kwargs)
        impl, params = _select(call.key)
        if impl.device != "cpu":
            return impl.run(params, *call.args)
        if cpu_runtime.needs_guard():  # a user-chosen workqueue layer
            with cpu_runtime.guard():
                result = impl.run(params, *call.args)
        else:
            result = impl.run(params, *call.args)
        keepwarm.touch()  # the cores stay awake for the next call (kernels_cpu/keepwarm.py)
        return result

    def expose(self, fn):
        """Decorator: `fn` is this op's public function (docstring and signature)."""
        if fn.__name__ != self.name:
            raise RegistryError(f"public function {fn.__name__!r} of op {self.name!r}: names must match")
        self.public = fn
        return fn

    def inputs(self, shapes: dict, params: dict, rng, dtype) -> dict:
        """Named benchmark inputs of one case: drawn arrays plus the case's parameters."""
        if self.synthesize is not None:
            out = self.synthesize(shapes, params, rng, dtype)
        else:
            out = {n: draw_normal(rng, s, dtype) for n, s in shapes.items()}
        return {**out, **params}

    def fresh_inputs(self, named: dict) -> dict:
        """named with a private copy of every host array the op updates in place."""
        if not self.updates:
            return named
        return {k: (v.copy() if k in self.updates and isinstance(v, np.ndarray) else v) for k, v in named.items()}

    def rule(self, device: str) -> Rule | None:
        return self.rules.get(device)


OPS: dict[str, Op] = {}
_select = None  # dispatch.select.select, installed by that module (it imports this one)


def _check_rule_type(op, device, rule):
    if device not in DEVICES:
        raise RegistryError(f"op {op!r}: rule for unknown device {device!r} (known: {DEVICES})")
    if not isinstance(rule, Rule):
        raise RegistryError(f"op {op!r}: the {device} rule must be a registry.Rule, got {type(rule).__name__}")


def register_op(op: Op) -> Op:
    if op.name in OPS:
        raise RegistryError(f"op {op.name!r} registered twice")
    OPS[op.name] = op
    return op


def set_rule(op: str, device: str, rule: Rule) -> None:
    """Declare op's shape rule for one device (the CUDA implementations' module does this
    for "cuda"); a second rule for the same op and device is an error, not a replacement."""
    o = _op(op, "a rule")
    _check_rule_type(op, device, rule)
    if device in o.rules:
        raise RegistryError(f"op {op!r} already has a {device} rule")
    o.rules[device] = rule


def _op(name: str, what: str) -> Op:
    o = OPS.get(name)
    if o is None:
        raise RegistryError(f"{what} for unknown op {name!r}; registered ops: {sorted(OPS)}")
    return o


def register(impl: Implementation) -> Implementation:
    op = _op(impl.op, f"implementation {impl.name!r}")
    if impl.device not in DEVICES:
        raise RegistryError(f"implementation {impl.name!r} of {impl.op!r}: unknown device {impl.device!r}")
    if impl.name in op.implementations:
        raise RegistryError(f"implementation {impl.name!r} of op {impl.op!r} registered twice")
    op.implementations[impl.name] = impl
    return impl


def check() -> None:
    """Every op is complete and consistent: a public function, a rule for each device it
    has implementations on, rules that name only registered implementations of that device.
    Called once all op and CUDA modules are imported (dispatch/__init__)."""
    problems = []
    for op in OPS.values():
        if op.public is None:
            problems.append(f"{op.name}: no public function (decorate it with @op.expose)")
        devices = {impl.device for impl in op.implementations.values()}
        for device in devices:
            if device not in op.rules:
                problems.append(f"{op.name}: implementations on {device} but no {device} rule")
        for device, rule in op.rules.items():
            for name in rule.names:
                impl = op.implementations.get(name)
                if impl is None:
                    problems.append(f"{op.name}: the {device} rule names {name!r}, which is not registered")
                elif impl.device != device:
                    problems.append(f"{op.name}: the {device} rule names {name!r}, which runs on {impl.device}")
        if not op.implementations:
            problems.append(f"{op.name}: no implementation")
    if problems:
        raise RegistryError("inconsistent registry:\n  " + "\n  ".join(problems))


def implementations(op: str | None = None, device: str | None = None) -> list[Implementation]:
    """All registered implementations, optionally of one op and/or one device."""
    ops = [OPS[op]] if op is not None else list(OPS.values())
    return [
        impl
        for o in ops
        for impl in o.implementations.values()
        if device is None or impl.device == device
    ]


def families() -> list[str]:
    """The op families, in registration order."""
    return list(dict.fromkeys(op.family for op in OPS.values()))
