"""The accuracy cost of the low-precision cases: what a user loses against the float32 op
they would otherwise run, reported beside the times (report rows, asv track_ values).

A low-precision case declares `accuracy=` (bench/cases): a function

    probe(case, data: dict) -> (got, fp32)

that takes float32 named inputs (the case's shapes, drawn by `draw` below), makes the
low-precision inputs from them (quantizes the weight, rounds it to bfloat16, ...), runs the
low-precision op and the float32 op it replaces, and returns both results.  Two
distributions are drawn:
  "normal":   every input standard normal;
  "outliers": standard normal with OUTLIER_FRACTION of the entries multiplied by
              OUTLIER_SCALE: the few large activations and weights of LLMs that make
              per-tensor int8 lose precision (LLM.int8(), Dettmers et al. 2022, reports
              outlier features about 20x the typical magnitude).
The errors, normwise so that entries near zero do not dominate:
  max_rel  = max |got - fp32| / max |fp32|
  mean_rel = mean |got - fp32| / mean |fp32|
"""
from __future__ import annotations

import numpy as np

OUTLIER_FRACTION = 1e-3
OUTLIER_SCALE = 20.0
DISTRIBUTIONS = ("normal", "outliers")


def draw(shapes: dict, rng, distribution: str) -> dict:
    """Float32 arrays of the given shapes from one of DISTRIBUTIONS."""
    out = {}
    for name, shape in shapes.items():
        a = rng.standard_normal(shape).astype(np.float32)
        if distribution == "outliers" and a.size:
            n = max(1, int(round(a.size * OUTLIER_FRACTION)))
            idx = rng.choice(a.size, size=n, replace=False)
            a.reshape(-1)[idx] *= np.float32(OUTLIER_SCALE)
        elif distribution != "normal":
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
        out[name] = a
    return out


def errors(got, ref) -> dict:
    """{"max_rel", "mean_rel"} of got against ref (see the module docstring)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"shapes differ: {got.shape} vs {ref.shape}")
    d = np.abs(got - ref)
    big, mean = float(np.max(np.abs(ref))), float(np.mean(np.abs(ref)))
    return {"max_rel": float(np.max(d)) / big if big else float(np.max(d)),
            "mean_rel": float(np.mean(d)) / mean if mean else float(np.mean(d))}


def measure(case, rng=None) -> dict | None:
    """{distribution: {"max_rel", "mean_rel"}} for a case with an accuracy probe, else None."""
    if case.accuracy is None:
        return None
    rng = rng if rng is not None else np.random.default_rng(0)
    out = {}
    for dist in DISTRIBUTIONS:
        got, ref = case.accuracy(case, draw(case.shapes, rng, dist))
        out[dist] = errors(got, ref)
    return out


def fmt(acc: dict | None) -> str:
    if not acc:
        return ""
    return "; ".join(f"{d} max {v['max_rel']:.1e} mean {v['mean_rel']:.1e}" for d, v in acc.items())
