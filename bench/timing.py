"""The one timing method used by the report, the tuner and the overhead measurement.

    warm up  ->  calibrate a batch size  ->  rounds of batches, candidates interleaved  ->  median

* Every candidate is called ``warmup`` times first (compiles, page faults, thread pools).
* A batch repeats a call ``number`` times, ``number`` chosen so one batch lasts about
  ``batch_s``; one sample is the batch time divided by ``number``.
* Candidates are interleaved: round r runs every candidate once, in an order rotated each
  round, so machine noise (other jobs on the cores) hits all of them alike.
* When the next candidate belongs to another threaded library (numba's OpenMP pool,
  OpenBLAS, onnxruntime, PyTorch) we sleep ``pause_s`` (0.2 s) first: those libraries keep
  their worker threads spinning after a call, and the next library would pay for it.  The
  first candidate's warm-up and calibration wait too: the caller's last call is unknown.
* The result per candidate is the median sample, plus the spread: (p75 - p25) / median
  and min / max of the samples.  Two candidates' samples of the same round ran next to
  each other, so their ratio round by round (paired_ratio) says how far a ratio of medians
  can be trusted: a neighbour's burst lands on both of a round's samples.
* A candidate whose first-round batch came out under a quarter of ``batch_s`` (calibrated
  during a burst) gets its batch size from that round, and the round runs again for all.
* With ``max_rounds``, rounds are added one at a time past ``rounds`` while any
  candidate's spread exceeds ``max_spread``, up to ``max_rounds``: on the shared 2-core
  VMs a burst from a neighbour can put one of three samples at 4x the others (the quick
  report once gave matmul 128x768x768 4.68 ms +-77% where quiet runs give 1.0-1.15 ms),
  and the median of three then rests on two.  Quiet cases cost nothing extra.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

clock = time.perf_counter

PAUSE_S = 0.2
# interleaved(): a candidate whose first-round batch lasted outside RECHECK (as fractions of
# batch_s) had its batch size set while its calls ran at another speed than they do in the
# rounds (calibrate's calls in a burst, or in a long ramp after the pause); the ramp after
# each pause then weighed more (short batches) or less (long ones) on its samples than on
# the others'.  Its batch size is set again from round 1, which runs again for all.  The
# quick report of 2026-12-05 (Zen 4) timed matmul 128x768x768 in batches of 3 calls (1.03
# ms a call, 1.50x onnxruntime) where the others ran 24-30 (0.69-0.85 ms), and linear+gelu
# in batches of 2 against 5-6; interleaved() in a script of the same five candidates, its
# batches about 21 calls: 0.73-0.75 ms a call, numpy 0.80-0.95.  The full report of
# 2026-12-06 gave the same case's candidates, all at 0.7-0.95 ms a call, batches of 33-38
# calls (numpy, PyTorch, onnxruntime) and 73-74 (ours, calibrated from the fastest call):
# 0.5 of batch_s against 1.1.
RECHECK = (0.7, 1.5)
# interleaved(max_rounds=...): keep adding rounds while a candidate's spread is above this
MAX_SPREAD = 0.25


@dataclass
class Stats:
    """Per-call seconds of one candidate: median, spread and the raw samples."""

    median: float
    spread: float  # interquartile range / median (0 when fewer than 4 samples)
    min: float
    max: float
    number: int  # calls per sample
    samples: list = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return len(self.samples)

    def as_dict(self):
        return {"median_s": self.median, "spread": self.spread, "min_s": self.min,
                "max_s": self.max, "calls_per_sample": self.number, "samples_s": self.samples,
                "rounds": self.rounds}


def summarize(samples: list, number: int = 1) -> Stats:
    s = sorted(samples)
    med = statistics.median(s)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4)
        spread = (q[2] - q[0]) / med if med > 0 else 0.0
    else:
        spread = (s[-1] - s[0]) / med if med > 0 and len(s) > 1 else 0.0
    return Stats(med, spread, s[0], s[-1], number, list(samples))


def calibrate(fn: Callable[[], object], batch_s: float, max_number: int = 10_000) -> int:
    """Calls per batch so that one batch of warm calls lasts about batch_s (at least 1),
    from the fastest of the calls made in about batch_s / 2 (at least 3).  The calls right
    after a pause are slow for a while (threads waking, caches and clocks ramping), so
    neither one call nor the median decides it: from one call, the 7x7/2 conv2d stem got
    3-call batches that the ramp then dominated (1.97 ms against 20 calls and 0.90 ms for
    the same kernel prepacked, Sapphire Rapids, 2026-12-02); from the median, candidates of
    the same speed still got 36 or 70 calls a batch by where their ramp fell (matmul
    128x768x768 in the full report, ours 70 at 724 us a call, prepacked 36 at 728,
    onnxruntime 37 at 702; Zen 4, 2026-12-06), and the ramp weighed twice on the short
    batches."""
    t0 = clock()
    fn()
    one = clock() - t0
    if one >= batch_s:
        return 1
    if one < 1e-4:  # too short to trust one call: time a few
        t0 = clock()
        for _ in range(10):
            fn()
        one = max((clock() - t0) / 10, 1e-9)
        return max(1, min(max_number, int(batch_s / one)))
    times, start = [one], t0
    while len(times) < 3 or (clock() - start < batch_s / 2 and len(times) < max_number):
        t = clock()
        fn()
        times.append(clock() - t)
    one = max(min(times), 1e-9)
    return max(1, min(max_number, int(batch_s / one)))


def _batch(fn, number):
    t0 = clock()
    for _ in range(number):
        fn()
    return (clock() - t0) / number


_CALLER = object()  # the library of whatever ran before interleaved() (never a candidate's)


def interleaved(candidates: dict, *, rounds: int = 5, warmup: int = 2, batch_s: float = 0.02,
                pause_s: float = PAUSE_S, library: dict | None = None,
                progress: Callable[[str], None] | None = None, max_rounds: int | None = None,
                max_spread: float = MAX_SPREAD) -> dict:
    """Time several zero-argument callables side by side.

    candidates: {name: fn}.  library: {name: library name}; a pause of pause_s is taken
    before the first call and whenever consecutive calls come from different libraries
    (default: every name is its own library).  max_rounds: add rounds past `rounds`, one at
    a time, while a candidate's spread exceeds max_spread (at most max_rounds in all).
    Returns {name: Stats}; Stats.rounds says how many ran.
    """
    names = list(candidates)
    library = library or {n: n for n in names}
    # The caller ran something just before (the report: each library's first call; the
    # previous case's last round), and which library's threads still spin is unknown: the
    # first candidate pauses too.  Without it, matmul 128x768x768 (ours first, right after
    # onnxruntime's first call) was calibrated at 13-14 calls a batch, at 1.3 ms a call,
    # against onnxruntime's 28-29 at 0.7: onnxruntime's threads held our second core.  The
    # ramp after each pause then weighed twice on our samples (ratio 1.01-1.04; with the
    # pause: 25-29 calls a batch, 0.97-1.03; Zen 4, 2026-12-06, /tmp/w/cal49b.py).
    last_lib = [_CALLER]

    def switch_to(name):
        lib = library.get(name, name)
        if lib != last_lib[0] and pause_s > 0:
            time.sleep(pause_s)
        last_lib[0] = lib

    numbers = {}
    for name in names:
        switch_to(name)
        for _ in range(warmup):
            candidates[name]()
        numbers[name] = calibrate(candidates[name], batch_s)
    samples = {n: [] for n in names}
    target = rounds
    r = 0
    rechecked = False
    while r < target:
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            switch_to(name)
            samples[name].append(_batch(candidates[name], numbers[name]))
        r += 1
        if r == 1 and not rechecked:
            rechecked = True
            lo, hi = RECHECK
            again = {n: max(1, int(batch_s / max(samples[n][0], 1e-9))) for n in names
                     if not lo * batch_s <= samples[n][0] * numbers[n] <= hi * batch_s}
            again = {n: v for n, v in again.items() if v != numbers[n]}
            if again:  # batch sizes from round 1 (see RECHECK), which runs again
                numbers.update(again)
                samples = {n: [] for n in names}
                r = 0
                continue
        if progress is not None:
            progress(f"round {r}/{target}")
        if r == target and max_rounds is not None and target < max_rounds and any(
                summarize(samples[n]).spread > max_spread for n in names):
            target += 1
    return {n: summarize(samples[n], numbers[n]) for n in names}


def paired_ratio(num: Stats, den: Stats) -> dict | None:
    """num's sample over den's, round by round (both from one interleaved() call): the median
    and quartiles of those ratios, or None with fewer than 4 rounds in common.  A bar is met
    robustly when both quartiles clear it, not only the ratio of the two medians."""
    pairs = [a / b for a, b in zip(num.samples, den.samples) if b > 0]
    if len(pairs) < 4:
        return None
    q = statistics.quantiles(pairs, n=4)
    return {"median": statistics.median(pairs), "q25": q[0], "q75": q[2], "rounds": len(pairs)}


def time_one(fn: Callable[[], object], **kw) -> Stats:
    """Stats of one callable (warm-up, calibrated batches, median)."""
    return interleaved({"fn": fn}, pause_s=0.0, **kw)["fn"]
