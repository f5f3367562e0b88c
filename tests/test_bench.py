"""The performance tools: timing helpers, the tuning cache (write, read, stale, corrupt),
the tuner end to end, the report on one tiny case, the asv suite's classes and the
offline rewrite of the asv site.  All fast: tiny shapes, no 256 MiB ceilings, no peers
beyond numpy."""
import json
import os
import shutil
import warnings

import numpy as np
import pytest

import dispatch
from bench import cases as C
from bench import peers as P
from bench import report, roofline, timing
from dispatch import registry, select, tuning
from tests.support import ON_CUDA

pytestmark = pytest.mark.skipif(ON_CUDA, reason="CPU-side tools")


# ---- timing ------------------------------------------------------------------------------

def test_summarize_median_and_spread():
    st = timing.summarize([1.0, 2.0, 3.0, 4.0, 100.0], number=3)
    assert st.median == 3.0 and st.min == 1.0 and st.max == 100.0 and st.number == 3
    assert st.spread > 0
    assert timing.summarize([2.0]).spread == 0.0


def test_interleaved_runs_every_candidate_each_round_in_rotating_order():
    calls = []
    cands = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    res = timing.interleaved(cands, rounds=3, warmup=1, batch_s=0.0, pause_s=0.0)
    assert set(res) == set("abc")
    assert all(r.median >= 0 and len(r.samples) == 3 for r in res.values())
    # after warm-up + calibration, each round runs all three (batch of 1 call each)
    tail = calls[-9:]
    assert [tail[i:i + 3] for i in (0, 3, 6)] == [list("abc"), list("bca"), list("cab")]


def test_interleaved_pauses_only_when_the_library_changes(monkeypatch):
    events = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append(("sleep", s)))
    lib = {"ours": "numba", "ours2": "numba", "peer": "torch"}
    cands = {n: (lambda n=n: events.append(("call", n))) for n in lib}
    timing.interleaved(cands, rounds=3, warmup=0, batch_s=0.0, pause_s=0.2, library=lib)
    # a pause precedes a call exactly when the library differs from the previous call's,
    # and the first call (whatever the caller ran last may still spin)
    assert events[0] == ("sleep", 0.2)
    last, expected, pauses = None, 0, 0
    for kind, what in events:
        if kind == "sleep":
            assert what == 0.2
            pauses += 1
        else:
            expected += lib[what] != last
            last = lib[what]
    assert pauses == expected > 1


def _scripted(monkeypatch, script):
    """Candidates whose batch times come from script[name] (a list, repeated at its end)."""
    cands = {n: (lambda: None) for n in script}
    names = {id(f): n for n, f in cands.items()}
    seen = {n: 0 for n in script}

    def batch(fn, number):
        n = names[id(fn)]
        seq = script[n]
        v = seq[min(seen[n], len(seq) - 1)]
        seen[n] += 1
        return v

    monkeypatch.setattr(timing, "_batch", batch)
    return cands


def test_interleaved_adds_rounds_only_while_a_spread_is_high(monkeypatch):
    # quiet candidates: exactly `rounds` rounds
    cands = _scripted(monkeypatch, {"a": [1.0], "b": [2.0]})
    res = timing.interleaved(cands, rounds=3, warmup=0, batch_s=0.0, pause_s=0.0, max_rounds=9)
    assert [r.rounds for r in res.values()] == [3, 3]
    # one burst in the second round: rounds are added until the interquartile spread of
    # [1, 4, 1, 1, 1, 1, 1] is 0 (seven rounds), for every candidate alike
    cands = _scripted(monkeypatch, {"a": [1.0, 4.0, 1.0], "b": [2.0]})
    res = timing.interleaved(cands, rounds=3, warmup=0, batch_s=0.0, pause_s=0.0, max_rounds=9)
    assert res["a"].rounds == res["b"].rounds == 7
    assert res["a"].median == 1.0 and res["a"].spread <= timing.MAX_SPREAD
    # noise that never settles stops at max_rounds; without max_rounds nothing is added
    cands = _scripted(monkeypatch, {"a": [1.0, 3.0] * 20})
    assert timing.interleaved(cands, rounds=3, warmup=0, batch_s=0.0, pause_s=0.0, max_rounds=6)["a"].rounds == 6
    cands = _scripted(monkeypatch, {"a": [1.0, 3.0] * 20})
    assert timing.interleaved(cands, rounds=3, warmup=0, batch_s=0.0, pause_s=0.0)["a"].rounds == 3


def test_paired_ratio_pairs_the_samples_of_each_round():
    """A burst that hits both candidates' samples of one round moves each median but not the
    round's ratio; the quartiles come from the per-round ratios, in round order."""
    a = timing.summarize([1.0, 4.0, 1.0, 1.0, 1.2])
    b = timing.summarize([2.0, 8.0, 2.0, 2.0, 2.0])
    r = timing.paired_ratio(a, b)
    assert r["rounds"] == 5 and r["median"] == 0.5
    assert r["q25"] == 0.5 and abs(r["q75"] - 0.55) < 1e-12
    assert timing.paired_ratio(timing.summarize([1.0, 2.0, 3.0]), timing.summarize([1.0, 2.0, 3.0])) is None


def test_verdict_gives_the_rounds_quartiles_in_its_own_sense():
    lose = {"median": 1.1, "q25": 0.96, "q75": 1.2, "rounds": 7}
    assert report._verdict(1.1, "onnxruntime", lose) == "LOSE x1.10 to onnxruntime (0.96-1.20)"
    win = {"median": 0.8, "q25": 0.5, "q75": 1.25, "rounds": 7}
    assert report._verdict(0.8, "torch", win) == "win  x1.25 (0.80-2.00)"
    assert report._verdict(0.8, "torch") == "win  x1.25"


def test_calibrate_batches_fast_calls():
    assert timing.calibrate(lambda: None, 0.001) > 1
    assert timing.calibrate(lambda: None, 0.0) == 1


def test_calibrate_is_not_decided_by_a_slow_first_call(monkeypatch):
    """Calls slower than the rest at first (the ramp after a pause: the first 3x, then
    most of the window 2x) must not shrink the batches: the batch size follows the warm
    calls (the median call would give 10).  The clock is scripted: a sleeping fn failed in CI when two test workers on 2
    cores stretched its 1 ms sleeps to ~7 ms."""
    now = [0.0]
    monkeypatch.setattr(timing, "clock", lambda: now[0])
    calls = [0]

    def fn():
        calls[0] += 1
        now[0] += 0.003 if calls[0] == 1 else 0.002 if calls[0] < 5 else 0.001

    n = timing.calibrate(fn, 0.02)
    assert n in (19, 20), f"{n} calls a batch: not the warm call's 1 ms"  # 0.02 / 0.001 in floats


def test_interleaved_rechecks_a_batch_size_set_in_a_burst(monkeypatch):
    """A burst during calibration (every call 10x slow) must not leave a candidate with
    2-call batches for the whole run: round 1 shows the batch far under batch_s, the batch
    size is set again from it and the round is repeated (scripted clock, as above)."""
    now = [0.0]
    monkeypatch.setattr(timing, "clock", lambda: now[0])
    calls = {"burst": 0, "steady": 0}

    def make(name, slow_calls):
        def fn():
            calls[name] += 1
            now[0] += 0.010 if calls[name] <= slow_calls else 0.001
        return fn

    res = timing.interleaved({"burst": make("burst", 5), "steady": make("steady", 0)}, rounds=3,
                             warmup=2, batch_s=0.02, pause_s=0.0)
    assert res["burst"].number in (19, 20, 21) and res["steady"].number in (19, 20, 21)
    assert res["burst"].rounds == res["steady"].rounds == 3
    assert res["burst"].median == pytest.approx(0.001)


def test_interleaved_rechecks_a_batch_size_set_too_long(monkeypatch):
    """The other way: calls fast during calibration, then at their own (2x slower) speed in
    the rounds: the batches would last 2x batch_s, and the ramp after each pause weigh half
    as much as on the other candidates'.  The batch size is set again from round 1."""
    now = [0.0]
    monkeypatch.setattr(timing, "clock", lambda: now[0])
    calls = [0]

    def fn():
        calls[0] += 1
        now[0] += 0.001 if calls[0] <= 12 else 0.002

    res = timing.interleaved({"a": fn}, rounds=3, warmup=0, batch_s=0.02, pause_s=0.0)
    assert res["a"].number in (9, 10, 11) and res["a"].rounds == 3


def test_roofline_floor():
    ceil = {"gflops": 100.0, "gbs": 10.0}
    assert roofline.floor_seconds(1e9, 1e6, ceil) == pytest.approx(0.01)  # compute-bound
    assert roofline.floor_seconds(1e6, 1e9, ceil) == pytest.approx(0.1)  # memory-bound


# ---- tuning cache ------------------------------------------------------------------------

@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("NK_TUNING_CACHE", str(path))
    tuning.reload()
    select.clear_cache()
    yield path
    tuning.reload()
    select.clear_cache()


def _relu_key(n=100_000):
    x = np.ones(n, np.float32)
    return x, registry.OPS["relu"].describe(x).key


def _non_rule_choice(key):
    chosen = select.rule_choice(key).name
    return [n for n in registry.OPS["relu"].implementations if n != chosen and n.startswith("cpu")][0]


def test_store_then_dispatch_uses_the_tuned_choice(cache_file):
    x, key = _relu_key()
    other = _non_rule_choice(key)
    tuning.store([{"op": "relu", "key": key, "impl": other, "params": {}, "time_s": 1e-5}])
    data = json.loads(cache_file.read_text())
    assert data["format"] == tuning.FORMAT and len(data["entries"]) == 1
    select.clear_cache()
    ex = dispatch.explain("relu", x)
    assert ex.chosen == other and ex.source == "tuned"
    assert "tuning cache" in str(ex)
    np.testing.assert_array_equal(dispatch.relu(x), np.maximum(x, 0))


@pytest.mark.parametrize("field, value", [("kernel_version", 999), ("numba_version", "0.0.1"), ("impl", "gone")])
def test_stale_entry_is_ignored_with_a_warning(cache_file, field, value):
    x, key = _relu_key()
    other = _non_rule_choice(key)
    tuning.store([{"op": "relu", "key": key, "impl": other, "params": {}}])
    data = json.loads(cache_file.read_text())
    for e in data["entries"].values():
        e[field] = value
    cache_file.write_text(json.dumps(data))
    tuning.reload()
    select.clear_cache()
    with pytest.warns(RuntimeWarning, match="stale"):
        ex = dispatch.explain("relu", x)
        np.testing.assert_array_equal(dispatch.relu(x), np.maximum(x, 0))
    assert ex.source == "rule"


@pytest.mark.parametrize("content", [
    "{not json", "[1, 2]", '{"format": 99, "entries": {}}', '{"format": 1, "entries": []}', b"\xff\xfe\x00garbage",
])
def test_corrupt_cache_is_ignored_with_a_warning(cache_file, content):
    if isinstance(content, bytes):
        cache_file.write_bytes(content)
    else:
        cache_file.write_text(content)
    x, _ = _relu_key()
    with pytest.warns(RuntimeWarning, match="tuning cache"):
        ex = dispatch.explain("relu", x)
    assert ex.source == "rule"
    np.testing.assert_array_equal(dispatch.relu(x), np.maximum(x, 0))


@pytest.mark.parametrize("entry", [5, ["cpu-serial"], {"impl": 3}, {"impl": "cpu-serial", "params": [1]}])
def test_malformed_entry_is_ignored_with_a_warning(cache_file, entry):
    x, key = _relu_key()
    cache_file.write_text(json.dumps({"format": tuning.FORMAT, "entries": {tuning.entry_key("relu", key): entry}}))
    with pytest.warns(RuntimeWarning, match="malformed"):
        ex = dispatch.explain("relu", x)
    assert ex.source == "rule"


def test_store_overwrites_an_unreadable_file(cache_file):
    cache_file.write_text("{broken")
    _, key = _relu_key()
    with pytest.warns(RuntimeWarning, match="overwriting"):
        tuning.store([{"op": "relu", "key": key, "impl": "cpu-serial"}])
    assert len(json.loads(cache_file.read_text())["entries"]) == 1


def test_tuner_end_to_end(cache_file):
    from bench import tune

    lines = []
    results = tune.tune(["relu"], quick=True, rounds=1, out=lines.append)
    assert results and all(r["op"] == "relu" for r in results)
    assert any("tuning cache written" in line for line in lines)
    case = C.cases(["relu"], quick=True)[0]
    args, kwargs = case.call_args(case.inputs(np.random.default_rng(0)))
    ex = dispatch.explain("relu", *args, **kwargs)
    assert ex.source == "tuned" and ex.chosen == results[0]["impl"]


def test_param_grid_expands_tunables():
    from bench.tune import param_grid

    impl = registry.Implementation("x", "cpu-x", "cpu", run=None, params={"tile": 64, "other": 1},
                                   tunables={"tile": [32, 64], "split": [1, 2]})
    grid = param_grid(impl)
    assert len(grid) == 4 and all(g["other"] == 1 for g in grid)
    assert {(g["tile"], g["split"]) for g in grid} == {(32, 1), (32, 2), (64, 1), (64, 2)}


# ---- cases and peers ---------------------------------------------------------------------

def test_every_case_fits_its_registered_op():
    for case in C.CASES:
        op = registry.OPS[case.op]
        args, kwargs = case.call_args(case.inputs(None, shape_only=True))
        op.describe(*args, **kwargs)  # raises if the case's arguments do not fit


def test_every_op_has_a_case_and_a_quick_case():
    ops_with_cases = {c.op for c in C.CASES}
    quick = {c.op for c in C.CASES if c.quick}
    assert set(registry.OPS) <= ops_with_cases, "ops without benchmark cases in bench/cases/<family>.py"
    assert set(registry.OPS) <= quick, "ops without a quick case (the report's quick run and asv smoke)"


def test_a_case_for_an_unknown_op_raises():
    with pytest.raises(ValueError, match="unknown op 'not_an_op'"):
        C.Case("not_an_op", "tiny", "test", {"x": (3,)}).inputs(np.random.default_rng(0))


def test_case_inputs_come_from_the_op_record():
    ce = C.Case("cross_entropy", "t", "test", {"logits": (4, 9)})
    inp = ce.inputs(np.random.default_rng(0))
    assert inp["targets"].dtype == np.int64 and inp["targets"].shape == (4,)
    assert inp["targets"].min() >= 0 and inp["targets"].max() < 9
    rope = C.Case("rope", "t", "test", {"x": (1, 2, 5, 8)}).inputs(np.random.default_rng(0))
    assert rope["cos"].shape == (5, 4) and np.allclose(rope["cos"] ** 2 + rope["sin"] ** 2, 1)
    args, kwargs = ce.call_args(inp)
    assert args[0] is inp["logits"] and args[1] is inp["targets"]


def test_the_report_checks_against_the_tests_reference():
    from tests.reference import activation as ref

    case = C.Case("gelu", "t", "test", {"x": (7,)})
    inputs = case.inputs(np.random.default_rng(0))
    np.testing.assert_array_equal(P.reference(case, inputs), ref.gelu(inputs["x"]))


def test_every_cuda_launch_names_a_declared_ptx_kernel():
    pytest.importorskip("numba.cuda")
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        pytest.skip("kernels_cuda PTX declarations are read without the simulator")
    from bench import ptx

    table = ptx.kernels()
    for chip, launched in ptx.launches_by_chip(ptx.ARCHS).items():
        assert launched, chip
        assert not ptx.undeclared(table, launched), chip


TINY = [
    C.Case("relu", "tiny", "test", {"x": (3, 50)}),
    C.Case("softmax", "tiny", "test", {"x": (4, 33)}),
    C.Case("rms_norm", "tiny", "test", {"x": (4, 33), "weight": (33,)}),
    C.Case("layer_norm", "tiny", "test", {"x": (4, 33), "weight": (33,), "bias": (33,)}),
    C.Case("cross_entropy", "tiny", "test", {"logits": (5, 17)}),
    C.Case("rope", "tiny", "test", {"x": (1, 2, 5, 8)}),
    C.Case("attention", "tiny", "test", {"q": (1, 2, 5, 8), "k": (1, 2, 7, 8), "v": (1, 2, 7, 8)}, {"causal": True}),
    C.Case("linear", "tiny", "test", {"x": (5, 8), "weight": (6, 8), "bias": (6,)}, {"activation": "gelu"}),
    C.Case("swiglu", "tiny", "test", {"gate": (3, 10), "up": (3, 10)}),
]


@pytest.mark.parametrize("case", TINY, ids=lambda c: c.op)
def test_peers_agree_with_dispatch_on_tiny_cases(case):
    inputs = case.inputs(np.random.default_rng())
    args, kwargs = case.call_args(inputs)
    ours = getattr(dispatch, case.op)(*args, **kwargs)
    ref = P.reference(case, inputs)
    assert report.rel_err(ours, ref) < 1e-4
    for peer in P.PEERS:
        try:
            run, conv = P.prepare(peer, case, inputs)
        except P.Unavailable:
            continue
        assert report.rel_err(conv(run()), ref) < 1e-4, peer


# ---- the report --------------------------------------------------------------------------

CEIL = {"gflops": 100.0, "gbs": 20.0, "gemm": {"best_gflops": 92.0, "median_gflops": 90.0, "what": "fake"},
        "fma": {"best_gflops": 100.0, "median_gflops": 99.0, "what": "fake"},
        "copy": {"median_gbs": 18.0, "what": "fake"}}


def test_measure_case_on_a_tiny_case():
    case = C.Case("relu", "tiny", "test", {"x": (1000,)}, quick=True)
    row = report.measure_case(case, CEIL, rounds=2, peers=("numpy",), pause_s=0.0)
    assert row["status"] == "ok", row["notes"]
    assert set(row["times"]) == {"ours", "numpy"}
    assert row["agreement"]["ours"]["ok"] and row["agreement"]["numpy"]["ok"]
    assert row["floor_s"] > 0 and row["times"]["ours"]["gbs"] > 0
    assert row["ratio_to_fastest_peer"] > 0 and row["fastest_peer"] == "numpy"
    assert row["ratio_rounds"] is None  # 2 rounds: too few for quartiles
    text = report.table([row], {}, {"numpy": "x"})
    assert "relu" in text and ("LOSE" in text or "win" in text)
    assert "err vs fp32" not in text  # no low-precision row, no accuracy column


def test_low_precision_case_reports_its_accuracy_beside_its_times():
    def probe(case, data):  # relu of the float16-rounded input against relu of the input
        x = data["x"]
        return np.maximum(x.astype(np.float16), 0).astype(np.float32), np.maximum(x, 0)

    case = C.Case("relu", "tiny fp16", "test", {"x": (1000,)}, quick=True, accuracy=probe)
    row = report.measure_case(case, CEIL, rounds=2, peers=("numpy",), pause_s=0.0)
    acc = row["accuracy_vs_fp32"]
    assert 0 < acc["normal"]["max_rel"] <= 2.0**-11 and 0 < acc["outliers"]["max_rel"] <= 2.0**-11
    text = report.table([row], {}, {"numpy": "x"})
    assert "err vs fp32 (normal/outliers)" in text
    assert f"{acc['normal']['max_rel']:.1e}/{acc['outliers']['max_rel']:.1e}" in text


def test_prepacked_note_speaks_as_the_table_does():
    """The prepacked weight's note and the table's column use the same words for the same
    kind of ratio (our time over the fastest peer's): LOSE xR to PEER above 1, win x(1/R)."""
    case = C.Case("linear", "tiny", "test", {"x": (8, 16), "weight": (24, 16)})
    row = report.measure_case(case, CEIL, rounds=1, peers=("numpy",), pause_s=0.0)
    r = row["prepacked_ratio_to_fastest_peer"]
    want = f"LOSE x{r:.2f} to numpy" if r > 1.0 else f"win  x{1 / r:.2f}"
    assert any(n.startswith("weight prepacked (dispatch.prepack): ") and n.endswith(want) for n in row["notes"]), row
    assert ("LOSE x" in report.table([row], {}, {"numpy": "x"})) == (row["ratio_to_fastest_peer"] > 1.0)


def test_mismatch_mark_names_who_disagrees():
    """A peer whose output disagrees with the float64 reference (its own rounding, say) is
    named in the verdict column: the reader must not take it for ours."""
    case = C.Case("relu", "tiny", "test", {"x": (1000,)})
    row = report.measure_case(case, CEIL, rounds=1, peers=("numpy",), pause_s=0.0)
    assert row["agreement"]["ours"]["ok"] and row["agreement"]["numpy"]["ok"], row["agreement"]
    assert "MISMATCH" not in report.table([row], {}, {"numpy": "x"})
    row["agreement"]["numpy"] = {"rel_err": 3.9e-3, "ok": False}
    assert "MISMATCH numpy" in report.table([row], {}, {"numpy": "x"})
    row["agreement"]["ours"] = {"rel_err": 1.0, "ok": False}
    assert "MISMATCH ours,numpy" in report.table([row], {}, {"numpy": "x"})


def test_case_that_does_not_fit_is_skipped_with_a_note():
    bad = C.Case("softmax", "tiny", "test", {"x": (4, 5)}, {"axis": 7})
    row = report.measure_case(bad, CEIL, rounds=1, peers=())
    assert row["status"] == "skipped" and "do not fit" in row["notes"][0]
    assert "SKIPPED" in report.table([row], {}, {})


def test_full_report_on_one_tiny_case(tmp_path, monkeypatch):
    tiny = C.Case("relu", "tiny", "test", {"x": (2000,)}, quick=True)
    monkeypatch.setattr(C, "CASES", [tiny])
    monkeypatch.setattr(roofline, "measure", lambda quick: CEIL)
    # a first call over the cold-start bar, as compile_times returns it: the table names
    # the functions its compile time went to
    why = {"compile_s": 3.5, "top": [{"fn": "kernels_cpu.activation.activation_worker", "sig": "()", "own_s": 2.0,
                                      "total_s": 3.0}]}
    monkeypatch.setattr(report, "compile_times", lambda cases, progress=None: {"activation": {
        "cold": {"first_call_s": 4.0, "per_case": {tiny.id: 4.0}, "compiles": {tiny.id: why}, "errors": {},
                 "helpers": {tiny.id: 1}},
        "warm": {"first_call_s": 0.1, "per_case": {tiny.id: 0.1}, "compiles": {}, "errors": {}}}})
    lines = []
    res = report.run(quick=True, json_path=str(tmp_path / "r.json"), plot_path=str(tmp_path / "r.png"),
                     peers=("numpy",), out=lines.append, progress=report.Progress(quiet=True),
                     model=False)
    text = "\n".join(lines)
    for needle in ("== machine", "simd:", "== ceilings", "relu", "dispatch overhead", "CUDA (PREDICTED",
                   "OVER THE BAR", "3.50 s in numba's compiler; most (own time): activation_worker 2.00 s",
                   "(activation, tiny; 1 compile helper)"):
        assert needle in text, needle
    assert res["rows"][0]["status"] == "ok"
    assert json.loads((tmp_path / "r.json").read_text())["rows"][0]["op"] == "relu"
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_compile_time_subprocess_reports_first_call(tmp_path):
    """Cold and warm first calls in fresh processes; the cold one says which functions its
    compile time went to (relu's worker among them, compiled from an empty cache)."""
    case = C.cases(["relu"], quick=True)[0]
    res = report.compile_times([case])
    warm, cold = res["activation"]["warm"], res["activation"]["cold"]
    assert "first_call_s" in warm, res
    assert warm["first_call_s"] >= 0 and not warm["errors"]
    why = cold["compiles"][case.id]
    assert 0 < why["compile_s"] <= cold["per_case"][case.id]
    assert any(f["fn"] == "kernels_cpu.activation.activation_worker" for f in why["top"]), why
    for f in why["top"]:
        assert 0 <= f["own_s"] <= f["total_s"] <= why["compile_s"], f


def test_compile_log_own_time_leaves_out_callees():
    """A caller's own time is its span less its callees' spans; functions are listed by own
    time; a compile left open by an exception is left out."""
    from bench.compile_time import CompileLog

    log = CompileLog()
    log.start("worker", "()", now=0.0)
    log.start("helper", "(int64,)", now=1.0)
    log.end(now=3.5)              # helper: 2.5 s, all its own
    log.start("other", "()", now=4.0)
    log.end(now=4.5)
    log.end(now=6.0)              # worker: 6 s, 6 - 2.5 - 0.5 = 3 own
    log.start("broken", "()", now=7.0)
    s = log.summary(top=2)
    assert s["compile_s"] == 6.0
    assert [(f["fn"], f["own_s"], f["total_s"]) for f in s["top"]] == [("worker", 3.0, 6.0), ("helper", 2.5, 2.5)]


def test_dispatch_overhead_is_measured():
    o = report.dispatch_overhead(rounds=2)
    assert o["dispatch_s"] > 0 and o["kernel_s"] > 0 and o["goal_s"] == 5e-6


def test_cuda_predictions_never_raise():
    """Every quick case gets a prediction row without compiling anything (no SASS rows: the
    model falls back to assumed occupancy); the path through compiled kernels and their SASS
    counts is CI's PTX step (python -m bench.ptx fails when the model raises there), and one
    cheap case goes through it here."""
    from bench import cuda_model

    cases = C.cases(quick=True)
    preds = cuda_model.predictions(cases, ptx_rows=[])
    assert {(p["op"], p["case"]) for p in preds} == {(c.op, c.name) for c in cases}
    preds, why = report.cuda_predictions([c for c in cases if c.op == "relu"][:1])
    assert (preds is None) == (why is not None)


# ---- asv suite and site ------------------------------------------------------------------

def test_asv_classes_come_from_the_registry():
    from bench.benchmarks import _suite

    classes = _suite.op_classes()
    assert {"".join(p.capitalize() for p in op.split("_")) for op in registry.OPS} <= set(classes)
    relu = classes["Relu"]
    impls, case_names = relu.params
    assert impls[0] == "dispatch" and "numpy" in impls and "cuda" in impls
    assert set(registry.OPS["relu"].implementations) & set(impls)
    assert case_names == [c.name for c in C.CASES if c.op == "relu"]
    assert "ReluFirstCall" in classes and hasattr(relu, "track_ms_per_gb")
    assert hasattr(classes["Matmul"], "track_ms_per_gflop")  # bound="compute" on the op record
    b = relu()
    if not _suite._cuda_available():
        with pytest.raises(NotImplementedError):
            b.setup("cuda", case_names[0])


def test_asv_html_rewrite_points_at_local_copies(tmp_path):
    import asv

    from bench import asv_html

    www = os.path.join(os.path.dirname(asv.__file__), "www")
    html = tmp_path / "html"
    shutil.copytree(www, html)
    cache = tmp_path / "vendor"
    for _, _, dest, _ in asv_html.FILES + asv_html.FONTS:  # stand-ins: no npm in a unit test
        (cache / dest).parent.mkdir(parents=True, exist_ok=True)
        (cache / dest).write_text("/* stub */")
    replaced = asv_html.make_offline(str(html), str(cache))
    assert len(replaced) == len(asv_html.FILES)
    text = (html / "index.html").read_text()
    assert "cdn" not in text.lower() and 'src="vendor/jquery.min.js"' in text
    assert (html / "vendor" / "fonts" / "glyphicons-halflings-regular.woff").exists()


def test_bench_package_imports_are_harmless():
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for mod in ("bench", "bench.cases", "bench.peers", "bench.timing", "bench.roofline", "bench.report",
                    "bench.tune", "bench.asv_html", "bench.compile_time", "bench.__main__"):
            importlib.import_module(mod)


def test_runtime_settings_measure_every_setting_and_check_threads():
    from bench import runtime as RT

    def build(rng):
        return (rng.standard_normal((64, 96)).astype(np.float32),), {}

    rows = RT.measure([RT.RuntimeCase("softmax tiny", "softmax", build)], rounds=1)
    assert {r["variant"] for r in rows} == {"dispatched", "serial"}
    for r in rows:
        for k in ("loop_s", "idle_s", "mixed_s", "threads_s", "peer_mixed_s", "paced_s"):
            assert r[k] > 0, (k, r)
        assert r["thread_mismatches"] == 0 and r["layer"] in RT.LAYERS
    assert "softmax tiny" in RT.format_rows(rows)


def test_wake_probe_times_the_second_thread(capsys):
    """bench.runtime --wake: one timing per idle period, each the time until a second
    thread took up work, far below the spin cap (a layer that never gave the region a
    second thread would spin to the cap)."""
    import numba
    from bench import runtime as RT

    if numba.get_num_threads() < 2:
        pytest.skip("one numba thread: no second thread to wait for")
    delays, layer, threads = RT.wake_delays(rounds=2, idles=(0.0, 0.001), cap=10**9)
    assert set(delays) == {0.0, 0.001} and layer in RT.LAYERS and threads >= 1
    for med, mx in delays.values():
        assert 0 < med <= mx < 1.0
    assert RT.main(["--wake", "--rounds", "1"]) == 0
    assert "second thread's start after idle" in capsys.readouterr().out


def test_keepwarm_ab_times_both_sides_with_the_heartbeat_on_and_off(capsys):
    """bench.runtime --keepwarm: our call after idle and the peer's calls, each with the
    heartbeat on and off; the process's window is restored afterwards."""
    from bench import runtime as RT
    from kernels_cpu import keepwarm

    if not keepwarm.enabled():
        pytest.skip(keepwarm.describe())

    def build(rng):
        return (rng.standard_normal((64, 96)).astype(np.float32),), {}

    before = keepwarm.window_ms()
    res = RT.keepwarm_ab(rounds=2, cases=[RT.RuntimeCase("softmax tiny", "softmax", build)])
    assert keepwarm.window_ms() == before
    assert set(res["ours"]) == {"softmax tiny"} and res["peers"]
    for side in ("ours", "peers"):
        for v in res[side].values():
            assert v["on"] > 0 and v["off"] > 0, res


def test_model_forward_matches_pytorch_at_a_small_size(monkeypatch):
    """The encoder of bench/model.py through our ops equals the PyTorch forward (same weights)."""
    pytest.importorskip("torch")
    from bench import model as M
    for name, v in dict(B=3, S=10, H=64, HEADS=4, FFN=96, LAYERS=2).items():
        monkeypatch.setattr(M, name, v)
    p = M.weights(seed=5)
    assert not p["mask"].all(), "the padding mask must mask something"
    ours, ref = M.forward_ours(p), M.forward_torch(p)
    assert ours.shape == ref.shape == (3, 10, 64)
    err = np.max(np.abs(ours.astype(np.float64) - ref)) / np.max(np.abs(ref))
    assert err < 1e-5, err


def test_gpu_harness_says_when_there_is_no_gpu():
    """On a machine without a GPU (this job) it exits with the reason, measuring nothing."""
    from bench import gpu

    with pytest.raises(SystemExit, match="no CUDA GPU"):
        gpu.main(["--ops", "relu"])


class _FakeStream:
    """A GPU stream for bench.gpu.device_timed's logic: work items run one after another on
    a virtual GPU clock that starts when they are enqueued or when the GPU frees up,
    whichever is later; the host's clock is real (time.perf_counter)."""

    def __init__(self):
        import time

        self.time = time
        self.t0 = time.perf_counter()
        self.free_at = 0.0

    def now(self):
        return self.time.perf_counter() - self.t0

    def run(self, seconds):
        self.free_at = max(self.free_at, self.now()) + seconds

    def sync(self):
        wait = self.free_at - self.now()
        if wait > 0:
            self.time.sleep(wait)

    def events(self):
        stream = self

        class Event:
            def record(self):
                self.at = max(stream.free_at, stream.now())

            def synchronize(self):
                stream.sync()

            def elapsed_time(self, other):  # milliseconds, as numba's and torch's
                return (other.at - self.at) * 1e3

        return Event(), Event()


def test_device_timed_hides_the_host_and_refuses_a_synchronizing_op(monkeypatch):
    """device_timed: calls whose host cost (5 ms) far exceeds their GPU time (0.2 ms) are
    measured at their GPU time once they are queued behind the spin; an op that waits for
    the GPU inside the call can never be queued ahead: None."""
    import time

    from bench import gpu

    stream = _FakeStream()
    monkeypatch.setattr(gpu, "SIM", False)
    monkeypatch.setattr(gpu, "_spin", lambda cuda: stream.run)

    def op():  # 5 ms of host work, then 0.2 ms of GPU work
        time.sleep(5e-3)
        stream.run(2e-4)

    got = gpu.device_timed(op, 4, 5e-3, None, stream.events, batches=3)
    assert got is not None and abs(got - 2e-4) < 5e-5, got

    def synchronizing_op():  # reads a value back: waits for everything enqueued before it
        stream.run(2e-4)
        stream.sync()

    assert gpu.device_timed(synchronizing_op, 4, 1e-3, None, stream.events, batches=2) is None


def test_gpu_overhead_stub_times_our_layers_without_a_gpu():
    """bench.gpu_overhead --stub: the dispatcher's host layers for CUDA arrays over fake device
    memory, launches stubbed; it puts back what it replaced."""
    pytest.importorskip("numba.cuda")
    from bench import gpu_overhead
    from dispatch import devices
    from dispatch.cuda_impls import _common as C

    before = (C.kernels, devices.cuda_module)
    rows = gpu_overhead.stubbed(3)
    assert [r[0] for r in rows] == ["relu", "softmax", "layer_norm", "attention"]
    assert all(0 < r[2] < 0.05 for r in rows), rows
    assert (C.kernels, devices.cuda_module) == before


# ---- accuracy of the low-precision cases -------------------------------------------------

def test_accuracy_probe_draws_and_errors():
    from bench import accuracy as A
    from bench.cases import Case

    g = np.random.default_rng(3)
    normal = A.draw({"w": (100, 100)}, g, "normal")["w"]
    outl = A.draw({"w": (100, 100)}, g, "outliers")["w"]
    assert normal.dtype == outl.dtype == np.float32
    assert np.max(np.abs(outl)) > 3 * np.max(np.abs(normal))  # 10 entries scaled by 20
    with pytest.raises(ValueError, match="distribution"):
        A.draw({"w": (2,)}, g, "uniform")
    ref = np.array([1.0, -2.0, 4.0])
    e = A.errors(ref * 1.01, ref)
    assert abs(e["max_rel"] - 0.01) < 1e-12 and abs(e["mean_rel"] - 0.01) < 1e-12
    assert A.errors(ref, ref) == {"max_rel": 0.0, "mean_rel": 0.0}

    # a probe that rounds its input to float16: its error is float16's, on both distributions
    def probe(case, data):
        x = data["x"]
        return x.astype(np.float16).astype(np.float32), x

    c = Case("relu", "fp16 round trip", "test", {"x": (64, 64)}, accuracy=probe)
    acc = A.measure(c, np.random.default_rng(0))
    assert set(acc) == set(A.DISTRIBUTIONS)
    for v in acc.values():
        assert 0 < v["max_rel"] <= 2.0**-11 and 0 < v["mean_rel"] <= 2.0**-11
    assert A.measure(Case("relu", "plain", "test", {"x": (4,)})) is None
    assert "outliers max" in A.fmt(acc)


def test_device_overlap_checks_on_numba_arrays_match_numpy():
    """dispatch.devices.overlaps on real numba DeviceNDArrays (over host memory posing as
    device memory, no GPU needed; the simulator's arrays take another path): contiguous
    arrays take the fast span, strided views the general one, and both agree with
    numpy.may_share_memory on the same layouts."""
    pytest.importorskip("numba.cuda")
    from numba.cuda.cudadrv import devicearray as DA

    from bench.gpu_overhead import _FakeMemory
    from dispatch import devices

    host = np.zeros((6, 8), np.float32)
    other = np.zeros(5, np.float32)

    def dev(v):  # a device array with v's layout at v's address
        return DA.DeviceNDArray(v.shape, v.strides, v.dtype, gpu_data=_FakeMemory(v.nbytes, at=v.ctypes.data))

    views = {"whole": host, "rows 0-2": host[0:3], "rows 3-5": host[3:6], "col 1": host[:, 1],
             "col 2": host[:, 2], "transposed": host.T, "reversed rows": host[::-1], "row 4 tail": host[4, 5:],
             "other": other}
    for na, ha in views.items():
        for nb, hb in views.items():
            assert devices.overlaps(dev(ha), dev(hb)) == bool(np.may_share_memory(ha, hb)), (na, nb)


def test_c_view_matches_numbas_reshape_and_type():
    """dispatch.cuda_impls._common.c_view builds a real numba device array's kernel view
    directly and sets its numba type: the same shape, strides, memory and type as numba-cuda's
    own reshape and typing give (over host memory posing as device memory, no GPU needed)."""
    pytest.importorskip("numba.cuda")
    from numba.core.typing.typeof import Purpose, typeof
    from numba.cuda.cudadrv import devicearray as DA

    from bench.gpu_overhead import _FakeMemory
    from dispatch.cuda_impls._common import c_view

    for dt in (np.float32, np.float16, np.float64):
        host = np.zeros((4, 6, 10), dt)
        d = DA.DeviceNDArray(host.shape, host.strides, host.dtype, gpu_data=_FakeMemory(host.nbytes, at=host.ctypes.data))
        for shape in [(240,), (24, 10), (4, 60), (1, 240), (4, 6, 10), (240, 1)]:
            for _ in range(2):  # the first view of a (dtype, ndim) computes the type, later ones reuse it
                v, r = c_view(d, *shape), d.reshape(shape)
                assert (v.shape, v.strides, v.dtype) == (r.shape, r.strides, r.dtype), shape
                assert v.device_ctypes_pointer.value == r.device_ctypes_pointer.value
                assert typeof(v, Purpose.argument) == typeof(r, Purpose.argument), (dt, shape)
        with pytest.raises(ValueError):
            c_view(d, 7, 7)
        # a non-contiguous array is left to numba's reshape (which refuses to copy)
        t = DA.DeviceNDArray((5, 24), (48 * np.dtype(dt).itemsize, np.dtype(dt).itemsize), host.dtype,
                             gpu_data=_FakeMemory(host.nbytes, at=host.ctypes.data))  # every other row of 24
        with pytest.raises(NotImplementedError):
            c_view(t, 120)


def test_fma_peak_counts_the_tile_flops():
    """The FMA-rate ceiling runs (tiny: 2 rounds, 16 k-steps) and reports a positive,
    finite rate whose median is no faster than its best sample."""
    res = roofline.fma_peak(rounds=2, kc=16)
    assert 0 < res["best_gflops"] < 1e5 and res["median_gflops"] <= res["best_gflops"] * 1.0001
    assert "micro-kernel" in res["what"]
