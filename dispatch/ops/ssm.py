"""Public selective_scan and selective_state_update: the selective state-space recurrence
of Mamba (S6), with mamba-ssm's selective_scan_fn / selective_state_update semantics.

    selective_scan(u, delta, A, B, C, D=None, z=None, *, delta_bias=None, delta_softplus=False,
                   initial_state=None, return_last_state=False, out=None)
    selective_state_update(state, x, dt, A, B, C, D=None, z=None, *, dt_bias=None,
                           dt_softplus=False, out=None)

Per batch b, channel d (of dim) and state n (of N), with g = d // (dim / G) the channel's
group of B and C:

    dt_t   = softplus?(delta[b, d, t] + delta_bias[d])        (PyTorch's softplus: x above 20)
    h_t[n] = exp(dt_t * A[d, n]) * h_{t-1}[n] + dt_t * u[b, d, t] * B[b, g, n, t]
    y_t    = (sum_n h_t[n] * C[b, g, n, t] + D[d] * u[b, d, t]) * silu(z[b, d, t])

The state accumulates in float32 (float32 and float16 inputs) or float64 (float64 inputs);
initial_state / last_state and selective_state_update's state have that dtype.  Every
other array has u's (x's) dtype: float32 or float64 on the host, also float16 on CUDA.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels_common import acc_dtype
from kernels_cpu import ssm as K
from kernels_cpu.parallel import num_threads

from .. import validate as V
from ..registry import Call, Implementation, Op, Rule, bucket, register, register_op
from ._common import HOST_COPY_NOTE, contiguous, deliver, result_buffer

_KERNELS = ("kernels_cpu.ssm", "kernels_cpu.gemm", "kernels_cpu.approx", "kernels_cpu.parallel")

# Threads from this many state updates (batch * dim * L * N; selective_state_update: batch *
# dim * N) and more than one task.  Measured 2026-11-23 (AMD znver3, 2 cores shared with
# other jobs: one was busy through most runs; cpu-serial vs cpu-parallel, medians of 7
# interleaved rounds back to back, and after 0.2 s idle, float32, Mamba-like inputs):
# threads cost 15-20 us back to back and 35-120 us after idle; a state update costs 0.6
# ns (scan, one thread) or about 1.1 ns (update), so a second core saves 0.3 / 0.55 ns per
# update: even at about 2^16 back to back, 2^17-2^18 after idle.  selective_scan, 64
# channels: 2^16 serial 126 / parallel 145 us, 2^19 402 / 515 us with the other core busy;
# at Mamba-130M's 2^24.6 one thread 15.0 ms, two 7.4 ms.  selective_state_update: 2^16
# 201 / 185 us, 2^18 585 / 541 us back to back, behind after idle up to 2^20.  Both from
# 2^17.
PARALLEL_THRESHOLD = {"selective_scan": 1 << 17, "selective_state_update": 1 << 17}
_MEASURED = {"selective_scan": "threads cost 15-120 us, save 0.3 ns per update (measured, 2 cores)",
             "selective_state_update": "threads cost 15-120 us, save 0.55 ns per update (measured, 2 cores)"}

# FLOPs per (batch, channel, step, state) update, as the issue counts them ("about 9", the
# exp as one: dt*A, exp, exp*h, (dt*u)*B, the add, h*C, the add into y, and the step's dt*u
# and bias shares).  Per (batch, channel, step) on top: D*u and its add (2), the silu gate
# (exp, add, divide, multiply: 4), softplus (exp, log1p, add: 3), the bias add (1).
FLOPS_PER_UPDATE = 9
FLOPS_D, FLOPS_Z, FLOPS_SOFTPLUS = 2, 4, 3

# The contract tests, warmup and explain examples (shapes of a pattern no other op has):
# odd sizes on the serial side, a Mamba-like block past the parallel threshold, and decode.
def _scan_shapes(batch, dim, L, N, G=None):
    bc = (batch, N, L) if G is None else (batch, G, N, L)
    return {"u": (batch, dim, L), "delta": (batch, dim, L), "A": (dim, N), "B": bc, "C": bc, "D": (dim,),
            "z": (batch, dim, L), "delta_bias": (dim,), "initial_state": (batch, dim, N)}


def _update_shapes(batch, dim, N, G=None):
    bc = (batch, N) if G is None else (batch, G, N)
    return {"state": (batch, dim, N), "x": (batch, dim), "dt": (batch, dim), "A": (dim, N), "B": bc, "C": bc,
            "D": (dim,), "z": (batch, dim), "dt_bias": (dim,)}


EXAMPLE_SHAPES = {
    "selective_scan": {"small": _scan_shapes(2, 6, 7, 3, G=2), "large": _scan_shapes(1, 64, 128, 16),
                       "decode": _scan_shapes(1, 24, 1, 16)},
    "selective_state_update": {"small": _update_shapes(2, 6, 3, G=2), "large": _update_shapes(16, 512, 16),
                               "decode": _update_shapes(1, 1536, 16)},
}


class SsmKey(NamedTuple):
    op: str
    device: str
    dtype: np.dtype
    work: int           # bucket of the state updates: batch * dim * L * N (update: L = 1)
    tasks: int          # bucket of the tasks the CPU workers split the call into
    length: int         # bucket of L (1 for selective_state_update)
    states: int         # bucket of N
    grouped: bool       # B, C given per group (G >= 1 axis present)
    softplus: bool


class ScanArgs(NamedTuple):
    u: object                   # (batch, dim, L)
    delta: object               # (batch, dim, L)
    A: object                   # (dim, N)
    B: object                   # (batch, N, L) or (batch, G, N, L)
    C: object                   # B's shape
    D: object                   # (dim,) or None
    z: object                   # (batch, dim, L) or None
    delta_bias: object          # (dim,) or None
    delta_softplus: bool
    initial_state: object       # (batch, dim, N) of the accumulation dtype, or None
    return_last_state: bool
    out: object                 # y's buffer (batch, dim, L) or None


class UpdateArgs(NamedTuple):
    state: object               # (batch, dim, N), accumulation dtype, updated in place
    x: object                   # (batch, dim)
    dt: object                  # (batch, dim)
    A: object                   # (dim, N)
    B: object                   # (batch, N) or (batch, G, N)
    C: object                   # B's shape
    D: object                   # (dim,) or None
    z: object                   # (batch, dim) or None
    dt_bias: object             # (dim,) or None
    dt_softplus: bool
    out: object                 # y's buffer (batch, dim) or None


def _check_bc(B, C, dt, batch, dim, N, L, ref):
    """B and C: (batch, N[, L]) or grouped (batch, G, N[, L]), G dividing dim; C has B's
    shape.  Returns (G, grouped).  L None: selective_state_update (no step axis).  ref:
    the name of the argument whose dtype they share."""
    tail = () if L is None else (L,)
    names = "batch, N" + (", L" if L is not None else "")
    gnames = "batch, G, N" + (", L" if L is not None else "")
    V.same_dtype("B", B, ref, dt)
    V.rank("B", B, (2 + len(tail), 3 + len(tail)), f" ({names}) or grouped ({gnames})")
    grouped = B.ndim == 3 + len(tail)
    G = int(B.shape[1]) if grouped else 1
    if G < 1 or dim % G:
        raise ValueError(f"B's group count G (B.shape[1] = {G}) must be at least 1 and divide dim = {dim}")
    want = ((batch, G, N) if grouped else (batch, N)) + tail
    V.shape("B", B, want, f" ({gnames if grouped else names})")
    V.same_dtype("C", C, ref, dt)
    V.shape("C", C, want, " (B's shape)")
    return G, grouped


def _check_inputs(xname, x, dname, delta, A, B, C, D, z, bname, bias, steps):
    """The arguments both ops take: x (batch, dim[, L]) (steps: whether the L axis is
    there), delta of x's shape, A (dim, N), B and C (_check_bc), D and the bias (dim,), z of
    x's shape; all of x's dtype.  Returns (dtype, batch, dim, N, grouped)."""
    dt = V.float_dtype(xname, x)
    V.rank(xname, x, 3 if steps else 2, " (batch, dim, L)" if steps else " (batch, dim)")
    batch, dim = int(x.shape[0]), int(x.shape[1])
    for name, arr in ((dname, delta), ("z", z)):
        if arr is not None:
            V.same_dtype(name, arr, xname, dt)
            V.shape(name, arr, x.shape, f" ({xname}'s shape)")
    V.same_dtype("A", A, xname, dt)
    V.rank("A", A, 2, " (dim, N)")
    if A.shape[0] != dim:
        raise ValueError(f"A must have shape (dim, N) with dim = {dim} ({xname}'s dimension 1), got {tuple(A.shape)}")
    N = int(A.shape[1])
    _, grouped = _check_bc(B, C, dt, batch, dim, N, int(x.shape[2]) if steps else None, xname)
    for name, p in (("D", D), (bname, bias)):
        if p is not None:
            V.same_dtype(name, p, xname, dt)
            V.shape(name, p, (dim,), " (dim,)")
    return dt, batch, dim, N, grouped


def _describe_scan(u, delta, A, B, C, D=None, z=None, *, delta_bias=None, delta_softplus=False, initial_state=None,
                   return_last_state=False, out=None):
    """Call.args = ScanArgs, key SsmKey.  run() returns y, or (y, last_state)."""
    dev = V.device_of(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias, initial_state=initial_state,
                      out=out)
    V.required(delta=delta, A=A, B=B, C=C)
    dt, batch, dim, N, grouped = _check_inputs("u", u, "delta", delta, A, B, C, D, z, "delta_bias", delta_bias, True)
    L = int(u.shape[2])
    softplus = V.flag("delta_softplus", delta_softplus)
    ret = V.flag("return_last_state", return_last_state)
    acc = np.dtype(acc_dtype(dt))
    if initial_state is not None:
        if V.dtype_of(initial_state) != acc:
            raise TypeError(f"initial_state must have dtype {acc} (the state's accumulation dtype for {dt} inputs), "
                            f"got {V.dtype_of(initial_state)}")
        V.shape("initial_state", initial_state, (batch, dim, N), " (batch, dim, N)")
    V.out(out, u.shape, dt, u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias,
          initial_state=initial_state)
    G = int(B.shape[1]) if grouped else 1
    key = SsmKey("selective_scan", dev, dt, bucket(batch * dim * L * N), bucket(K.scan_tasks(batch, dim, G, dt)),
                 bucket(L), bucket(N), grouped, softplus)
    return Call(key, ScanArgs(u, delta, A, B, C, D, z, delta_bias, softplus, initial_state, ret, out))


def _describe_update(state, x, dt, A, B, C, D=None, z=None, *, dt_bias=None, dt_softplus=False, out=None):
    """Call.args = UpdateArgs, key SsmKey (length 1).  run() updates state, returns y."""
    dev = V.device_of(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, out=out)
    V.required(state=state, dt=dt, A=A, B=B, C=C)
    dty, batch, dim, N, grouped = _check_inputs("x", x, "dt", dt, A, B, C, D, z, "dt_bias", dt_bias, False)
    softplus = V.flag("dt_softplus", dt_softplus)
    inputs = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)
    V.updated("state", state, (batch, dim, N), acc_dtype(dty), **inputs)
    V.out(out, x.shape, dty, state=state, **inputs)
    key = SsmKey("selective_state_update", dev, dty, bucket(batch * dim * N), bucket(K.update_tasks(batch, dim)), 1,
                 bucket(N), grouped, softplus)
    return Call(key, UpdateArgs(state, x, dt, A, B, C, D, z, dt_bias, softplus, out))


# ---- CPU implementations -------------------------------------------------------------------

def _transposed(M, grouped):
    """B or C as (batch, G, L, N) C-contiguous: the step's N values side by side."""
    M4 = M if grouped else M[:, None]
    return contiguous(np.swapaxes(M4, 2, 3))


def _scan_host(parallel):
    def run(params, u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, return_last_state, out):
        batch, dim, L = u.shape
        N = A.shape[1]
        y = result_buffer(out, u.shape, u.dtype)
        last = np.empty((batch, dim, N), u.dtype) if return_last_state else None
        grouped = B.ndim == 4
        K.selective_scan(contiguous(u), contiguous(delta), contiguous(A), _transposed(B, grouped),
                         _transposed(C, grouped), contiguous(D), contiguous(z), contiguous(delta_bias),
                         contiguous(initial_state), y, last, delta_softplus,
                         num_threads() if parallel else 1)
        y = deliver(y, out)
        return (y, last) if return_last_state else y

    return run


def _update_host(parallel):
    def run(params, state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out):
        batch, dim = x.shape
        y = result_buffer(out, x.shape, x.dtype)
        s = contiguous(state)
        N = A.shape[1]
        G = B.shape[1] if B.ndim == 3 else 1
        K.selective_state_update(s, contiguous(x), contiguous(dt), contiguous(A),
                                 contiguous(B).reshape(batch, G, N), contiguous(C).reshape(batch, G, N),
                                 contiguous(D), contiguous(z), contiguous(dt_bias), y, dt_softplus,
                                 num_threads() if parallel else 1)
        if not np.may_share_memory(s, state):  # a non-contiguous state was updated as a copy
            state[...] = s
        return deliver(y, out)

    return run


# ---- work model ----------------------------------------------------------------------------

def _per_step(N, D, z, bias, softplus):
    """FLOPs per (batch, channel, step)."""
    return (FLOPS_PER_UPDATE * N + (FLOPS_D if D is not None else 0) + (FLOPS_Z if z is not None else 0)
            + (FLOPS_SOFTPLUS if softplus else 0) + (bias is not None))


def _flops_scan(call):
    a = call.args
    batch, dim, L = a.u.shape
    return batch * dim * L * _per_step(a.A.shape[1], a.D, a.z, a.delta_bias, a.delta_softplus)


def _flops_update(call):
    a = call.args
    batch, dim = a.x.shape
    return batch * dim * _per_step(a.A.shape[1], a.D, a.z, a.dt_bias, a.dt_softplus)


def _size(a):
    return 0 if a is None else int(np.prod(a.shape))


def _bytes_scan(call):
    """u, delta (and z) read once, y written once, B, C, A and the per-channel vectors read
    once; initial_state read and last_state written (accumulation dtype) when given."""
    a = call.args
    isz = np.dtype(V.dtype_of(a.u)).itemsize
    acc = np.dtype(acc_dtype(V.dtype_of(a.u))).itemsize
    batch, dim, L = a.u.shape
    n = 3 * batch * dim * L + _size(a.z) + _size(a.B) + _size(a.C) + _size(a.A) + _size(a.D) + _size(a.delta_bias)
    states = batch * dim * a.A.shape[1]
    return n * isz + ((a.initial_state is not None) + a.return_last_state) * states * acc


def _bytes_update(call):
    """The state read and written (accumulation dtype); x, dt (and z) read, y written; A,
    B, C and the per-channel vectors read once."""
    a = call.args
    isz = np.dtype(V.dtype_of(a.x)).itemsize
    acc = np.dtype(acc_dtype(V.dtype_of(a.x))).itemsize
    n = 3 * _size(a.x) + _size(a.z) + _size(a.A) + _size(a.B) + _size(a.C) + _size(a.D) + _size(a.dt_bias)
    return n * isz + 2 * _size(a.state) * acc


# ---- benchmark inputs ------------------------------------------------------------------------

def _synthesize(shapes, params, rng, dtype):
    """Mamba-like inputs: A = -(n + 1) * exp(0.1 e) (S4D-real initialization, A = -exp(A_log),
    slightly perturbed); delta / dt small and the bias softplus^-1 of a step near 0.01
    (Mamba's dt initialization spans 0.001..0.1); D near 1; the states and everything else
    standard normal; the states in the accumulation dtype.  Only rng.standard_normal is
    drawn (the CUDA model passes a shape-only generator)."""
    acc = acc_dtype(dtype)
    out = {}
    for name, shape in shapes.items():
        v = np.asarray(rng.standard_normal(shape))
        if name == "A":
            v = -np.arange(1, shape[1] + 1) * np.exp(0.1 * v)
        elif name in ("delta", "dt"):
            v = 0.1 * v
        elif name in ("delta_bias", "dt_bias"):
            v = np.log(np.expm1(0.01 * np.exp(0.5 * v)))
        elif name == "D":
            v = 1.0 + 0.1 * v
        out[name] = v.astype(acc if name in ("state", "initial_state") else dtype)
    return out


def _sig_scan(i):
    return ((i["u"], i["delta"], i["A"], i["B"], i["C"], i.get("D"), i.get("z")),
            {"delta_bias": i.get("delta_bias"), "delta_softplus": i.get("delta_softplus", True),
             "initial_state": i.get("initial_state"), "return_last_state": i.get("return_last_state", False)})


def _sig_update(i):
    return ((i["state"], i["x"], i["dt"], i["A"], i["B"], i["C"], i.get("D"), i.get("z")),
            {"dt_bias": i.get("dt_bias"), "dt_softplus": i.get("dt_softplus", True)})


# ---- registration ----------------------------------------------------------------------------

def _rule(op):
    threshold, measured = PARALLEL_THRESHOLD[op], _MEASURED[op]

    def choose(key):
        if key.work < threshold:
            return ("cpu-serial", "cpu-parallel"), (f"{key.work} state updates < {threshold}: threads cost more "
                                                    f"({measured})")
        if key.tasks < 2:
            return ("cpu-serial", "cpu-parallel"), "one task (a block of channels): nothing to split"
        return ("cpu-parallel", "cpu-serial"), f"{key.work} state updates >= {threshold}: threads pay off ({measured})"

    return Rule(("cpu-serial", "cpu-parallel"), choose)


_scan = register_op(Op("selective_scan", _describe_scan, memo=True, family="ssm", bound="compute", signature=_sig_scan,
                       flops=_flops_scan, bytes=_bytes_scan, rules={"cpu": _rule("selective_scan")},
                       synthesize=_synthesize))
register(Implementation("selective_scan", "cpu-serial", "cpu", _scan_host(False), kernel_modules=_KERNELS,
                        notes="blocks of 8 float32 / 4 float64 channels as vector lanes through chunks of 64 steps "
                              "(transposed tiles, the recurrence in LLVM IR, a polynomial 2**x); B, C transposed "
                              "once; " + HOST_COPY_NOTE))
register(Implementation("selective_scan", "cpu-parallel", "cpu", _scan_host(True), kernel_modules=_KERNELS,
                        notes="cpu-serial's worker, (batch, group, channel block) tasks from a shared counter on "
                              "every thread; " + HOST_COPY_NOTE))

_update = register_op(Op("selective_state_update", _describe_update, family="ssm", bound="memory",
                         signature=_sig_update, flops=_flops_update, bytes=_bytes_update,
                         rules={"cpu": _rule("selective_state_update")}, synthesize=_synthesize,
                         updates=("state",)))
register(Implementation("selective_state_update", "cpu-serial", "cpu", _update_host(False), kernel_modules=_KERNELS,
                        notes="per (batch, channel) row one vectorized loop over the N states; " + HOST_COPY_NOTE))
register(Implementation("selective_state_update", "cpu-parallel", "cpu", _update_host(True), kernel_modules=_KERNELS,
                        notes="cpu-serial's rows in blocks from a shared counter on every thread; " + HOST_COPY_NOTE))


@_scan.expose
def selective_scan(u, delta, A, B, C, D=None, z=None, *, delta_bias=None, delta_softplus=False, initial_state=None,
                   return_last_state=False, out=None):
    """Mamba's selective scan over a sequence (mamba-ssm's selective_scan_fn).

    u, delta: (batch, dim, L); A: (dim, N), real; B, C: (batch, N, L), or grouped (batch, G,
    N, L) with G dividing dim (channel d reads group d // (dim / G)), C of B's shape;
    D, delta_bias: (dim,); z: (batch, dim, L); initial_state: (batch, dim, N).  Any of D,
    z, delta_bias, initial_state may be None.  Per step t, channel d, state n:

        dt = delta + delta_bias, then softplus(dt) if delta_softplus (x itself above 20)
        h_t = exp(dt * A) * h_{t-1} + dt * u_t * B_t      (h_0: initial_state, else 0)
        y_t = (sum_n h_t C_t + D * u_t) * silu(z_t)

    Returns y (batch, dim, L) in u's dtype (written into out= when given), or (y,
    last_state) with return_last_state: the state after the last step, (batch, dim, N) in
    the accumulation dtype (float32 for float32 / float16 inputs, float64 for float64),
    which initial_state must have too.  u and the other arrays: one dtype, float32 or
    float64 (float16 on CUDA).  NaN in an input reaches the outputs it feeds (NaN in A[d, n]:
    channel d of y from its first step, state n)."""
    return _scan(u, delta, A, B, C, D, z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                 initial_state=initial_state, return_last_state=return_last_state, out=out)


@_update.expose
def selective_state_update(state, x, dt, A, B, C, D=None, z=None, *, dt_bias=None, dt_softplus=False, out=None):
    """One decode step of the selective scan (mamba-ssm's selective_state_update), the
    state carried by the caller: per batch b, channel d, state n (g = d // (dim / G)),

        dt = dt + dt_bias, then softplus(dt) if dt_softplus (x itself above 20)
        state[n] = exp(dt * A[d, n]) * state[n] + dt * x * B[b, g, n]
        y = (sum_n state[n] * C[b, g, n] + D * x) * silu(z)

    state: (batch, dim, N) in the accumulation dtype (float32 for float32 / float16 x,
    float64 for float64), updated in place (it must be writeable and share no memory with
    the other arguments); x, dt, z: (batch, dim); A: (dim, N); B, C: (batch, N) or
    grouped (batch, G, N), G dividing dim; D, dt_bias: (dim,).  Returns y (batch, dim) in
    x's dtype (written into out= when given).  A call that raises leaves state untouched."""
    return _update(state, x, dt, A, B, C, D, z, dt_bias=dt_bias, dt_softplus=dt_softplus, out=out)
