"""Backward of the rotary position embedding: dx = R^T grad_out, the inverse rotation of each
pair, (a, b) -> (a cos + b sin, b cos - a sin) (rope with sin negated, exact: R is orthogonal).

Same layout as kernels_cpu/rope.py: grad_out viewed as (rows, D) with rows = batch * S in C
order, row r at position r % S; cos / sin (S, D/2); pairs (i, i + D/2) (rotate-half) or
(2i, 2i + 1) (interleaved).  The row loop and the pair loop in one function with the layout
branch outside both, as the forward (a per-row helper cost 3x in cache at D = 128 there).
"""
from numba import njit, prange

from .approx import JIT
from .parallel import row_of, run_dynamic, tasks_for
from .rope import ROWS_PER_TASK


@njit(**JIT)
def rope_grad_rows(g, cos, sin, out, lo, hi, interleaved):
    """Rows lo..hi-1 of g (rows, D) -> out; row r uses position r % S."""
    seq = cos.shape[0]
    h = cos.shape[1]
    t = lo % seq
    if interleaved:
        for r in range(lo, hi):
            gr = row_of(g, r)
            orow = row_of(out, r)
            c = row_of(cos, t)
            s = row_of(sin, t)
            for i in range(h):
                a = gr[2 * i]
                b = gr[2 * i + 1]
                orow[2 * i] = a * c[i] + b * s[i]
                orow[2 * i + 1] = b * c[i] - a * s[i]
            t += 1
            if t == seq:
                t = 0
    else:
        for r in range(lo, hi):
            gr = row_of(g, r)
            orow = row_of(out, r)
            c = row_of(cos, t)
            s = row_of(sin, t)
            for i in range(h):
                a = gr[i]
                b = gr[i + h]
                orow[i] = a * c[i] + b * s[i]
                orow[i + h] = b * c[i] - a * s[i]
            t += 1
            if t == seq:
                t = 0


@njit(**JIT)
def rope_grad_serial(g, cos, sin, out, interleaved):
    """g, out: (rows, D); cos, sin: (S, D/2); row r uses position r % S."""
    rope_grad_rows(g, cos, sin, out, 0, g.shape[0], interleaved)


@njit(parallel=True, **JIT)
def _rope_grad_parallel(g, cos, sin, out, interleaved, tasks):
    n = g.shape[0]
    for k in prange(tasks):
        rope_grad_rows(g, cos, sin, out, k * n // tasks, (k + 1) * n // tasks, interleaved)


def rope_grad_parallel(g, cos, sin, out, interleaved):
    """rope_grad_serial's result, row blocks split over numba's threads (dynamic hand-out)."""
    n = g.shape[0]
    tasks = min(tasks_for(n), max((n + ROWS_PER_TASK - 1) // ROWS_PER_TASK, 1))
    run_dynamic(_rope_grad_parallel, tasks, g, cos, sin, out, interleaved)
