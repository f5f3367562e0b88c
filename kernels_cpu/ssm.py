"""Mamba's selective scan (the S6 recurrence) and its one-step decode update.

Per (batch b, channel d) and state index n, with g = d // (dim / G) the channel's group:

    dt_l   = softplus?(delta[b, d, l] + bias[d])
    h_l[n] = exp(dt_l * A[d, n]) * h_{l-1}[n] + (dt_l * u[b, d, l]) * B[b, g, n, l]
    y_l    = (sum_n h_l[n] * C[b, g, n, l] + D[d] * u[b, d, l]) * silu(z[b, d, l])

selective_scan: the state starts at initial_state (or 0) and its value after the last step
is written out on request.  Vectorized over channels: a block of W channels of one group
(W = 8 float32 / 4 float64, one 256-bit vector) runs through L together, one channel per
vector lane, so every operation of the recurrence is one vector instruction and B_l[n],
C_l[n] are one broadcast each (the block shares its group's B and C).  Per chunk of LC
steps:
  1. row pass: dt and dt*u along each channel's contiguous row (softplus, bias), into
     (W, LC) row-major temporaries;
  2. register transposes (gemm's W x W transposer) to (LC, W) tiles: one vector per step;
  3. the recurrence over the tile (`_tile`, LLVM IR: h[N][W] and exp(dt*A) for a whole
     vector per instruction, two y accumulators over n);
  4. transpose y back to rows and the row pass adding D*u and the silu(z) gate.
B and C come transposed by the caller, (batch, G, L, N), so step l's N values are
contiguous.  A lane past the end of a partial block (fewer than W channels left in the
group) computes with dt = 0, A = 0, u = 0 and is never stored.

exp: the tile computes exp(dt*A) as 2**(dt * A*log2(e)), A scaled once per block.
float32: a degree-5 polynomial on the fraction (minimax for relative error, p(0) = 1
exactly, so exp(0) = 1: no spurious decay when dt*A = 0) and the integer part added to the
exponent bits; relative error 1.6e-7 (measured on 4e5 points), 13 vector instructions.
approx.fexp (Cody-Waite reduction, degree 7, range selects) costs about twice as much:
streaming loops of 4096 float32 on this machine (AMD znver3, 2026-11-23) took 0.33 ns per
element with this exp and 0.63 ns with fexp; the exps are most of the scan's work (one per
state update).  Arguments are clamped to [-127, 128]: results under 2**-126 (exp of less
than -87.3) are flushed to 0 or a value below 2**-126, as float32 code with
flush-to-zero would, 2**128 and above give inf, NaN stays NaN.  float64: libm's exp2 (4
calls per vector).

selective_state_update: one step for every (b, d) row, the state (batch, dim, N) updated
in place, vectorized along n by LLVM (the same exp, through `exp2_fast`).

Both run as workers called by address (parallel.run_workers / run_serial: one compiled
worker per dtype for the serial and the parallel call), taking blocks of work from an
atomic counter.
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .approx import OVERLOAD, JIT_INNER, JIT_BY_ADDRESS, fexp, like, silu
from .gemm import _transpose_block, _vw
from .parallel import (TASKS_PER_THREAD, c_array_at, fetch_add, like_dtype, row_of, run_serial, run_workers,
                      worker_address)

# Steps per chunk (a multiple of W).  Per block: five W x LC tiles of dtype plus two N x W
# (about 10 KiB at float32, L1).  Measured 2026-11-23 (AMD znver3, one thread, float32,
# 64 channels x L 1024 x N 16, best of 5): 32 steps 0.77 ms, 64: 0.70, 128: 0.68, 256: 0.67;
# 64 keeps the tiles well inside L1 next to B, C and the rows.
LC = 64

# Rows (channels of one batch row) per selective_state_update task: dt and the gate are
# computed for the task's rows in vectorized loops (per row, they had cost more than the N
# = 16 states: 2.8 -> 1.1 ns per state update at batch 16, dim 4096).  Measured 2026-11-23
# (AMD znver3, one thread, float32, best of 20): 16 / 64 / 256 rows per task gave 1.13 /
# 1.10 / 1.05 ns per update at batch 16 x dim 4096 and 1.64 / 1.66 / 1.60 at batch 1 x dim
# 1536 (noise level): 64.
UPDATE_ROWS = 64

LOG2E = 1.4426950408889634

# 2**f on [0, 1): p(f) = 1 + f*(Q1 + f*(Q2 + f*(Q3 + f*(Q4 + f*Q5)))), minimax for
# relative error with p(0) = 1 (1.6e-7 evaluated in float32 Horner).
_EXP2_Q = (0.6931512951850891, 0.24016453325748444, 0.055799856781959534, 0.009016931988298893,
           0.0018672207370400429)
_EXP2_LO, _EXP2_HI = -127.0, 128.0
_MAGIC = 12582912.0  # 1.5 * 2**23: an integer-valued float n plus this has n in its low bits


def _intrinsic(builder, name, ty, nargs):
    """The LLVM intrinsic `name` (llvm.fma, llvm.floor, ...) on float / double type ty,
    scalar or vector, taking nargs arguments of ty."""
    vec = isinstance(ty, ir.VectorType)
    fir = ty.element if vec else ty
    suffix = ("v%d" % ty.count if vec else "") + ("f32" if isinstance(fir, ir.FloatType) else "f64")
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * nargs), f"{name}.{suffix}")


def _exp2_ir(builder, x):
    """IR for 2**x of a float / double, scalar or vector (see the module docstring)."""
    ty = x.type
    vec = isinstance(ty, ir.VectorType)
    fir = ty.element if vec else ty

    def const(v, t=ty):
        return ir.Constant(t, [v] * ty.count) if vec else ir.Constant(t, v)

    def intr(name, nargs):
        return _intrinsic(builder, name, ty, nargs)

    if isinstance(fir, ir.DoubleType):
        return builder.call(intr("llvm.exp2", 1), [x])
    lo, hi = const(_EXP2_LO), const(_EXP2_HI)
    # select(x < lo, lo, x): a NaN x fails both compares and stays NaN
    x = builder.select(builder.fcmp_ordered("<", x, lo), lo, x)
    x = builder.select(builder.fcmp_ordered(">", x, hi), hi, x)
    n = builder.call(intr("llvm.floor", 1), [x])
    f = builder.fsub(x, n)
    fma = intr("llvm.fma", 3)
    p = const(_EXP2_Q[4])
    for q in _EXP2_Q[3::-1] + (1.0,):
        p = builder.call(fma, [p, f, const(q)])
    # 2**n times p by adding n to p's exponent field: n + MAGIC holds n in its low bits
    # (no float -> int conversion, whose NaN result LLVM leaves undefined)
    ity = ir.VectorType(ir.IntType(32), ty.count) if vec else ir.IntType(32)
    nbits = builder.bitcast(builder.fadd(n, const(_MAGIC)), ity)
    return builder.bitcast(builder.add(builder.bitcast(p, ity), builder.shl(nbits, const(23, ity))), ty)


@intrinsic
def exp2_fast(typingctx, x):
    """2**x: float32 the module's polynomial (relative error 1.6e-7), float64 libm's exp2."""
    if x not in (types.float32, types.float64):
        return None

    def codegen(context, builder, sig, args):
        return _exp2_ir(builder, args[0])

    return x(x), codegen


def _make_tile(fir, width):
    """The recurrence over one chunk of one channel block (module docstring, step 3)."""
    vty = ir.VectorType(fir, width)
    isz = 4 if isinstance(fir, ir.FloatType) else 8

    @intrinsic
    def tile(typingctx, dt_p, du_p, y_p, h_p, a_p, b_p, c_p, steps, nst):
        """For l < steps: h[n] = 2**(dt[l]*a[n]) * h[n] + du[l] * b[l*nst + n] for n < nst,
        y[l] = sum_n h[n] * c[l*nst + n].  dt, du, y: steps x W, h, a: nst x W (h updated
        in place), b, c: steps x nst scalars; arguments are element addresses and counts."""
        sig = types.none(*(types.intp,) * 9)

        def codegen(context, builder, sig, args):
            dt_p, du_p, y_p, h_p, a_p, b_p, c_p, steps, nst = args
            i32, i64 = ir.IntType(32), ir.IntType(64)
            DT, DU, Y, H, A, B, C = (builder.inttoptr(v, fir.as_pointer())
                                     for v in (dt_p, du_p, y_p, h_p, a_p, b_p, c_p))
            fma = _intrinsic(builder, "llvm.fma", vty, 3)
            undef = ir.Constant(vty, ir.Undefined)
            zeros = ir.Constant(ir.VectorType(i32, width), [0] * width)
            W = ir.Constant(i64, width)
            one = ir.Constant(i64, 1)

            def vptr(base, off):
                return builder.bitcast(builder.gep(base, [off]), vty.as_pointer())

            def splat(ptr):
                s = builder.insert_element(undef, builder.load(ptr), ir.Constant(i32, 0))
                return builder.shuffle_vector(s, undef, zeros)

            acc = (cgutils.alloca_once(builder, vty), cgutils.alloca_once(builder, vty))

            def state(n, row, dtv, duv, k):
                off = builder.mul(n, W)
                e = _exp2_ir(builder, builder.fmul(dtv, builder.load(vptr(A, off), align=isz)))
                i = builder.add(row, n)
                hv = builder.call(fma, [e, builder.load(vptr(H, off), align=isz),
                                        builder.fmul(duv, splat(builder.gep(B, [i])))])
                builder.store(hv, vptr(H, off), align=isz)
                builder.store(builder.call(fma, [hv, splat(builder.gep(C, [i])), builder.load(acc[k])]), acc[k])

            pairs = builder.lshr(nst, one)
            odd = builder.icmp_unsigned("!=", builder.and_(nst, one), ir.Constant(i64, 0))
            with cgutils.for_range(builder, steps) as step:
                loff = builder.mul(step.index, W)
                dtv = builder.load(vptr(DT, loff), align=isz)
                duv = builder.load(vptr(DU, loff), align=isz)
                row = builder.mul(step.index, nst)
                builder.store(ir.Constant(vty, None), acc[0])
                builder.store(ir.Constant(vty, None), acc[1])
                # two accumulators: the y sum is a chain of FMAs over n
                with cgutils.for_range(builder, pairs) as pr:
                    n0 = builder.shl(pr.index, one)
                    state(n0, row, dtv, duv, 0)
                    state(builder.add(n0, one), row, dtv, duv, 1)
                with builder.if_then(odd):
                    state(builder.sub(nst, one), row, dtv, duv, 0)
                builder.store(builder.fadd(builder.load(acc[0]), builder.load(acc[1])), vptr(Y, loff), align=isz)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_tile_f32 = _make_tile(ir.FloatType(), 8)
_tile_f64 = _make_tile(ir.DoubleType(), 4)


def _tile(z, dt_p, du_p, y_p, h_p, a_p, b_p, c_p, steps, nst):
    """The tile for z's element type (float32: 8 lanes, float64: 4)."""


@overload(_tile, **OVERLOAD)
def _tile_overload(z, dt_p, du_p, y_p, h_p, a_p, b_p, c_p, steps, nst):
    impl = _tile_f32 if z == types.float32 else _tile_f64

    def run(z, dt_p, du_p, y_p, h_p, a_p, b_p, c_p, steps, nst):
        impl(dt_p, du_p, y_p, h_p, a_p, b_p, c_p, steps, nst)

    return run


def softplus(x):
    """log(1 + exp(x)), x itself above 20 (PyTorch's threshold)."""
    return x if x > 20.0 else math.log1p(math.exp(x))


# log1p(t) = 2s * P(s^2), s = t / (2 + t) in [0, 1/3] for t in [0, 1]: P minimax for
# relative error, degree 4 (float32 result within 2.1e-7)
_SP_P = (0.33333125710487366, 0.20013634860515594, 0.1396505981683731, 0.14153194427490234)


@overload(softplus, **OVERLOAD)
def _softplus_overload(x):
    """float32: max(x, 0) + log1p(exp(-|x|)), vectorizable (exp: approx.fexp, accurate for
    any argument; log1p by the series above, no cancellation for small t); relative error
    within 2.5e-7 for x > -87 (measured on 1e6 points in [-100, 100]; below, exp(x)
    underflows and the result is 0); exactly x above 20.  float64: libm."""
    if x == types.float32:
        p1, p2, p3, p4 = (np.float32(c) for c in _SP_P)
        one, two, zero = np.float32(1.0), np.float32(2.0), np.float32(0.0)

        def f32(x):
            t = fexp(-abs(x))
            s = t / (two + t)
            w = s * s
            return max(x, zero) + two * s * ((((p4 * w + p3) * w + p2) * w + p1) * w + one)

        return f32
    return lambda x: x if x > 20.0 else math.log1p(math.exp(x))


# ---- the workers' int64 argument block -------------------------------------------------------
# selective_state_update uses the same slots: P_U = x, P_DELTA = dt, P_INIT = the state
# (read and written), L = 1.
(P_SYNC, P_U, P_DELTA, P_A, P_B, P_C, P_D, P_Z, P_BIAS, P_INIT, P_Y, P_LAST, P_BATCH, P_DIM, P_L, P_N, P_G,
 P_FLAGS, P_PER_TASK, P_COUNT) = range(20)
F_SOFTPLUS, F_D, F_Z, F_BIAS, F_INIT, F_LAST = 1, 2, 4, 8, 16, 32

_U = np.uint64  # unsigned indices: numba drops the negative-index fix-up, loops vectorize


# The SSM kernels keep LLVM's 8-lane loops on AVX-512: 16 (approx.wide_loops on
# scan_worker, _dt_row, _y_row, update_worker) measured slower, loop medians, old / new
# trees alternating three times (Xeon with AMX, 2026-12-07), 2 threads, us:
# selective_state_update mamba-130m batch 16 233-245 -> 268-330, mamba-1.4b batch 1
# 100-105 -> 115-120; selective_scan dim 1536 L 1024 5937-6501 -> 6570-6737.
@njit(**JIT_BY_ADDRESS)
def scan_worker(w, params, is64):
    """Worker w of a selective_scan call (the P_* slots; P_B / P_C: B and C as (batch, G,
    L, N)); takes (batch, group, channel block) tasks from the counter.  An absent optional
    array (its flag off) is never read."""
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    z = like_dtype(is64)
    nb, dim, L, N, G, fl, per = p[P_BATCH], p[P_DIM], p[P_L], p[P_N], p[P_G], p[P_FLAGS], p[P_PER_TASK]
    isz = 8 if is64 else 4
    u = c_array_at(p[P_U], z, (nb * dim, L))
    delta = c_array_at(p[P_DELTA], z, (nb * dim, L))
    y = c_array_at(p[P_Y], z, (nb * dim, L))
    A = c_array_at(p[P_A], z, (dim, N))
    D = c_array_at(p[P_D], z, (dim,))
    zz = c_array_at(p[P_Z], z, (nb * dim, L))
    bias = c_array_at(p[P_BIAS], z, (dim,))
    h0 = c_array_at(p[P_INIT], z, (nb * dim, N))
    hl = c_array_at(p[P_LAST], z, (nb * dim, N))
    sync = c_array_at(p[P_SYNC], np.int64(0), (1,))
    W = _vw(y)
    H = dim // G
    nblk = (H + W - 1) // W
    ntasks = nb * G * nblk
    rows_dt = np.zeros(W * LC, y.dtype)   # (W, LC) row-major: dt, then the y rows
    rows_du = np.zeros(W * LC, y.dtype)   # (W, LC): dt * u
    t_dt = np.empty(LC * W, y.dtype)      # (LC, W) tiles
    t_du = np.empty(LC * W, y.dtype)
    t_y = np.empty(LC * W, y.dtype)
    h = np.empty(N * W, y.dtype)          # (N, W)
    a = np.empty(N * W, y.dtype)
    zero = like(z, 0.0)
    log2e = like(z, LOG2E)
    while True:
        first = fetch_add(sync, 0, per)
        if first >= ntasks:
            break
        for task in range(first, min(first + per, ntasks)):
            bg = task // nblk
            c0 = (bg % G) * H + (task - bg * nblk) * W
            nch = min(W, (bg % G + 1) * H - c0)
            r0 = (bg // G) * dim + c0   # the block's first row of u, delta, z, y
            for i in range(N * W):
                a[i] = zero
                h[i] = zero
            for j in range(nch):
                for n in range(N):
                    a[n * W + j] = A[c0 + j, n] * log2e
                    if fl & F_INIT:
                        h[n * W + j] = h0[r0 + j, n]
            for i in range(W * LC):  # lanes past nch stay 0
                rows_dt[i] = zero
                rows_du[i] = zero
            bc = p[P_B] + bg * L * N * isz
            cc = p[P_C] + bg * L * N * isz
            for l0 in range(0, L, LC):
                lc = min(LC, L - l0)
                lw = (lc + W - 1) // W * W
                for j in range(nch):
                    _dt_row(row_of(delta, r0 + j), row_of(u, r0 + j), bias[c0 + j] if fl & F_BIAS else zero,
                            fl & F_SOFTPLUS, rows_dt, rows_du, j * LC, l0, lc)
                for l in range(0, lw, W):
                    _transpose_block(rows_dt, l, LC, t_dt, l * W, W)
                    _transpose_block(rows_du, l, LC, t_du, l * W, W)
                _tile(z, t_dt.ctypes.data, t_du.ctypes.data, t_y.ctypes.data, h.ctypes.data, a.ctypes.data,
                      bc + l0 * N * isz, cc + l0 * N * isz, lc, N)
                for l in range(0, lw, W):
                    _transpose_block(t_y, l * W, W, rows_dt, l, LC)
                for j in range(nch):
                    ur = row_of(u, r0 + j)
                    _y_row(rows_dt, j * LC, ur, row_of(zz, r0 + j) if fl & F_Z else ur,
                           D[c0 + j] if fl & F_D else zero, fl & F_D, fl & F_Z, row_of(y, r0 + j), l0, lc)
            if fl & F_LAST:
                for j in range(nch):
                    for n in range(N):
                        hl[r0 + j, n] = h[n * W + j]


@njit(**JIT_INNER)
def _dt_row(drow, urow, bias, soft, rows_dt, rows_du, o, l0, lc):
    """rows_dt[o + l] = dt, rows_du[o + l] = dt * u for the steps l0..l0+lc of one channel."""
    if soft:
        for l in range(lc):
            v = softplus(drow[_U(l0 + l)] + bias)
            rows_dt[_U(o + l)] = v
            rows_du[_U(o + l)] = v * urow[_U(l0 + l)]
    else:
        for l in range(lc):
            v = drow[_U(l0 + l)] + bias
            rows_dt[_U(o + l)] = v
            rows_du[_U(o + l)] = v * urow[_U(l0 + l)]


@njit(**JIT_INNER)
def _y_row(rows_y, o, urow, zrow, dd, has_d, has_z, yrow, l0, lc):
    """yrow[l0 + l] = (rows_y[o + l] + D u) * silu(z) for l < lc, each term when given
    (two passes: one loop with silu to compile, not one per option)."""
    if has_d:
        for l in range(lc):
            rows_y[_U(o + l)] += dd * urow[_U(l0 + l)]
    if has_z:
        for l in range(lc):
            yrow[_U(l0 + l)] = rows_y[_U(o + l)] * silu(zrow[_U(l0 + l)])
    else:
        for l in range(lc):
            yrow[_U(l0 + l)] = rows_y[_U(o + l)]


@njit(**JIT_BY_ADDRESS)
def update_worker(w, params, is64):
    """Worker w of a selective_state_update call (P_* slots, module docstring): takes tasks
    of up to UPDATE_ROWS consecutive channels of one batch row from the counter.  Per task,
    dt (bias, softplus) and the silu(z) gate for all its rows in vectorized loops, and per
    row the N states in one vectorized loop."""
    p = c_array_at(params, np.int64(0), (P_COUNT,))
    z = like_dtype(is64)
    nb, dim, N, G, fl, per = p[P_BATCH], p[P_DIM], p[P_N], p[P_G], p[P_FLAGS], p[P_PER_TASK]
    x = c_array_at(p[P_U], z, (nb * dim,))
    dt = c_array_at(p[P_DELTA], z, (nb * dim,))
    y = c_array_at(p[P_Y], z, (nb * dim,))
    state = c_array_at(p[P_INIT], z, (nb * dim, N))
    A = c_array_at(p[P_A], z, (dim, N))
    B = c_array_at(p[P_B], z, (nb * G, N))
    C = c_array_at(p[P_C], z, (nb * G, N))
    D = c_array_at(p[P_D], z, (dim,))
    zz = c_array_at(p[P_Z], z, (nb * dim,))
    bias = c_array_at(p[P_BIAS], z, (dim,))
    sync = c_array_at(p[P_SYNC], np.int64(0), (1,))
    H = dim // G
    per_row = (dim + UPDATE_ROWS - 1) // UPDATE_ROWS
    ntasks = nb * per_row
    zero = like(z, 0.0)
    log2e = like(z, LOG2E)
    vl = np.empty(UPDATE_ROWS, y.dtype)   # dt * log2(e) per row of the task
    du = np.empty(UPDATE_ROWS, y.dtype)   # dt * x
    acc = np.empty(UPDATE_ROWS, y.dtype)  # sum_n h C
    while True:
        first = fetch_add(sync, 0, per)
        if first >= ntasks:
            break
        for task in range(first, min(first + per, ntasks)):
            b = task // per_row
            d0 = (task - b * per_row) * UPDATE_ROWS
            m = min(UPDATE_ROWS, dim - d0)
            r0 = b * dim + d0
            for i in range(m):
                v = dt[_U(r0 + i)] + (bias[_U(d0 + i)] if fl & F_BIAS else zero)
                if fl & F_SOFTPLUS:
                    v = softplus(v)
                vl[i] = v * log2e
                du[i] = v * x[_U(r0 + i)]
            for i in range(m):
                s = row_of(state, r0 + i)
                ar = row_of(A, d0 + i)
                bg = b * G + (d0 + i) // H
                br = row_of(B, bg)
                cr = row_of(C, bg)
                t = zero
                for n in range(N):
                    hv = exp2_fast(vl[i] * ar[n]) * s[n] + du[i] * br[n]
                    s[n] = hv
                    t += hv * cr[n]
                acc[i] = t
            if fl & F_D:
                for i in range(m):
                    acc[i] += D[_U(d0 + i)] * x[_U(r0 + i)]
            if fl & F_Z:
                for i in range(m):
                    y[_U(r0 + i)] = acc[i] * silu(zz[_U(r0 + i)])
            else:
                for i in range(m):
                    y[_U(r0 + i)] = acc[i]


@njit(cache=True)
def _addresses(p, sync, u, delta, A, B, C, D, zz, bias, init, y, last):
    p[P_SYNC] = sync.ctypes.data
    p[P_U] = u.ctypes.data
    p[P_DELTA] = delta.ctypes.data
    p[P_A] = A.ctypes.data
    p[P_B] = B.ctypes.data
    p[P_C] = C.ctypes.data
    p[P_D] = D.ctypes.data
    p[P_Z] = zz.ctypes.data
    p[P_BIAS] = bias.ctypes.data
    p[P_INIT] = init.ctypes.data
    p[P_Y] = y.ctypes.data
    p[P_LAST] = last.ctypes.data


def _params(u, delta, A, B, C, D, zz, bias, init, y, last, nb, dim, L, N, G, softplus_):
    """(the workers' int64 block, its task counter): the caller keeps both alive until the
    workers return.  An absent array (None) is flagged off and y's address stands in.
    Every array must be C-contiguous of y's dtype (ValueError; inputs are read through
    flat views, so the check is on the dtypes and on the arrays written)."""
    dt = y.dtype
    yf = y.reshape(-1)
    flat = [yf if a is None else a.reshape(-1) for a in (u, delta, A, B, C, D, zz, bias, init, y, last)]
    if any(a.dtype is not dt for a in flat) or not all(a is None or a.flags.c_contiguous for a in (y, last, init)):
        raise ValueError(f"ssm kernels: every array must be a C-contiguous {dt} array")
    flags = (F_SOFTPLUS if softplus_ else 0) | (F_D if D is not None else 0) | (F_Z if zz is not None else 0) | \
        (F_BIAS if bias is not None else 0) | (F_INIT if init is not None else 0) | (F_LAST if last is not None else 0)
    sync = np.zeros(1, np.int64)
    p = np.zeros(P_COUNT, np.int64)
    _addresses(p, sync, *flat)  # flat views: one compiled _addresses per dtype
    p[P_BATCH:P_PER_TASK] = (nb, dim, L, N, G, flags)
    return p, sync


def _run(worker, p, dtype, ntasks, nworkers):
    """Serial on the calling thread for one worker, else up to nworkers threads taking
    blocks of about ntasks / (nworkers * TASKS_PER_THREAD) tasks (dynamic: a thread that
    loses its core to another process hands its share on)."""
    fn = worker_address(worker, (bool(np.dtype(dtype) == np.float64),))
    if nworkers <= 1:
        p[P_PER_TASK] = max(ntasks, 1)
        run_serial(fn, p)
    else:
        p[P_PER_TASK] = max(1, ntasks // (nworkers * TASKS_PER_THREAD))
        run_workers(fn, p, min(nworkers, ntasks))


def scan_tasks(nb, dim, G, dtype):
    """The tasks a selective_scan call splits into: (batch, group, block of W channels),
    W the worker's lanes (gemm._vw: 8 float32, 4 float64)."""
    lanes = 8 if np.dtype(dtype) == np.float32 else 4
    return nb * G * -(-(dim // G) // lanes) if G else 0


def update_tasks(nb, dim):
    """The tasks a selective_state_update call splits into: UPDATE_ROWS channels of a batch row."""
    return nb * -(-dim // UPDATE_ROWS)


def selective_scan(u, delta, A, Bt, Ct, D, z, bias, init, y, last, softplus_, nworkers):
    """y (and last) from the module docstring's recurrence.  u, delta, z, y: (batch, dim, L);
    A (dim, N); Bt, Ct: (batch, G, L, N) (B and C with the state index last); D, bias (dim,);
    init, last (batch, dim, N); D, z, bias, init, last may be None.  Every array
    C-contiguous of y's dtype (float32 or float64).  nworkers 1 runs on the calling thread."""
    nb, dim, L = y.shape
    G = Bt.shape[1]
    N = A.shape[1]
    p, sync = _params(u, delta, A, Bt, Ct, D, z, bias, init, y, last, nb, dim, L, N, G, softplus_)
    ntasks = scan_tasks(nb, dim, G, y.dtype)
    if ntasks:
        _run(scan_worker, p, y.dtype, ntasks, nworkers)


def selective_state_update(state, x, dt, A, B, C, D, z, bias, y, softplus_, nworkers):
    """One step of the recurrence for every row: state (batch, dim, N) updated in place,
    y (batch, dim).  x, dt, z: (batch, dim); A (dim, N); B, C (batch, G, N); D, bias (dim,);
    D, z, bias may be None; all C-contiguous of y's dtype."""
    nb, dim = y.shape
    G = B.shape[1]
    N = A.shape[1]
    p, sync = _params(x, dt, A, B, C, D, z, bias, state, y, None, nb, dim, 1, N, G, softplus_)
    if nb * dim:
        _run(update_worker, p, y.dtype, update_tasks(nb, dim), nworkers)
