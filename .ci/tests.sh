#!/usr/bin/env bash
# Everything CI checks. Called by ./run.sh test (which set up .venv).
#
# Six steps, ordered so that both cores stay busy and no kernel compiles twice:
#   port  every CPU kernel compiled for AArch64 (tests/test_portability.py): its child
#         compiles each CPU kernel once, fresh, and saves it to numba's cache | first, beside ptx
#   ptx   PTX for sm_80/87/90, ptxas, the performance model (one process)   | from the start
#   cpu   the other CPU tests (pytest-xdist), loading port's cached kernels | after port
#   sim   CUDA tests under the simulator                                    | after cpu
#   late  the CPU tests that compile in child processes (warmup, cache     | after cpu, beside sim
#         safety, the Haswell target)
#   asv   asv smoke run + HTML render check (loads the cached kernels)      | after cpu, beside sim
# Measured on a fresh clone, 2 cores (2026-11-25): in turn, the old four steps took 983 s
# (CPU 310, simulator 282, PTX 205, asv 186); all four started together, 960 s (the CPU
# tests then took 761 s and asv ran alone at the end); the CPU tests with a warm cache
# take 168 s, 161 of them the portability child on one worker.  2026-11-27 (Zen 5), wall /
# CPU seconds: port 232 / 146 (its child, on the critical path, got 63% of a core beside
# ptx's two processes), ptx 390 / 425, cpu 275 / 395, sim 372 / 477, asv 269 / 164: checks
# 879 s.  So ptx now runs as one process (NK_PTX_JOBS=1), leaving port a core of its own,
# and reads its SASS in batches (its CPU halved): port 144 / 140, ptx 348 / 275, cpu 269 /
# 392, sim 359 / 472, asv 255 / 158, checks 772 s; with the simulator on 3 workers (below):
# port 129 / 126, ptx 323 / 255, cpu 251 / 362, sim 326 / 460, asv 321 / 164, checks 706 s.
# 2026-11-27 evening, a Zen 4-class EPYC (every step about 1.9x the CPU seconds of the Zen 5):
# port 214 / 210, ptx 584 / 450, cpu 458 / 649, sim 717 / 1027, asv 657 / 314, checks 1389 s.
# Session 19 on it (the wgmma GEMM and attention builds added: ptx's largest growth): port
# 246 / 239, ptx 742 / 565, cpu 539 / 724, sim 667 / 958, asv 637 / 317, checks 1452 s.
# 2026-11-28, same host kind, the simulator's blocks as greenlets (tests/cuda/simwarp.py):
# port 240 / 234, ptx 651 / 499, cpu 466 / 644, sim 154 / 249, asv 327 / 258, checks 1033 s;
# asv is now the last step to end (sim beside it ends first).  2026-11-28 later (same host
# kind; asv times LCE at T = 128, the portable int8 GEMM no longer re-typed per call): port
# 221 / 215, ptx 670 / 508, cpu 511 / 702, sim 180 / 306, asv 309 / 191, checks 1041 s.
# 2026-12-02 (same host kind; the asv children no longer import numba.cuda on a host without
# a GPU): port 200 / 195, ptx 564 / 428, cpu 387 / 510, sim 163 / 271, asv 243 / 126, checks
# 830 s (.ci/run 885 s with set-up).  asv started beside cpu instead (sim last) was worse:
# cpu 550 / 621, asv 620 / 165, checks 939 s, .ci/run 1004 s.  Another run of da88e79's
# order: port 200 / 194, ptx 634 / 476, cpu 463 / 606, sim 149 / 235, asv 228 / 115, checks
# 891 s, .ci/run 946 s.  So the tests that compile in child processes moved to "late":
# port 193 / 188, ptx 627 / 455, cpu 377 / 484, late 228 / 103, sim 229 / 273, asv 326 /
# 123, checks 896 s, .ci/run 957 s: the CPU tests lost 86 s, but asv, sharing the last
# phase with five processes, took 98 s longer.  So sim and late run niced: port 196 / 191,
# ptx 549 / 429, cpu 315 / 412, asv 191 / 119, late 262 / 100, sim 265 / 262, checks 776 s,
# .ci/run 847 s.  Later that day, with attention's CPU workers compiled per (dtype, masked)
# instead of per (dtype, mask kind, causal), NVVM run once for sm_80 and sm_87, and the
# harness / host-arena tests no longer repeated under the simulator: port 225 / 220, ptx
# 580 / 461, cpu 289 / 377, asv 238 / 149, late 297 / 107, sim 325 / 310, checks 839 s,
# .ci/run 903 s.  Every step is CPU-bound: 1624 CPU s on 2 cores is 812 s of the 839.  With
# test_contract's host-input tests no longer repeated under the simulator: port 227 / 222,
# ptx 593 / 473, cpu 302 / 392, asv 235 / 147, late 283 / 100, sim 307 / 285, checks 836 s,
# .ci/run 908 s; and with the norm backward's blocks called by address (19fb640): port 226 /
# 219, ptx 603 / 481, cpu 293 / 381, asv 243 / 152, late 303 / 105, sim 326 / 294, checks 845 s,
# .ci/run 922 s.  Session 25 (b877a53: the IR check, same host kind): port 217 / 212, ptx 581 /
# 462, cpu 295 / 379, asv 214 / 131, late 254 / 90, sim 273 / 246, checks 785 s, .ci/run 848 s;
# a later run (af62dea + README, nearly the same code): port 236 / 230, ptx 681 / 539, cpu 337 / 433, asv 267 / 157,
# late 334 / 113, sim 355 / 315, checks 928 s, .ci/run 997 s (the host, not the code); with
# the GPU probes launching once under the simulator (04be1b3) and the pool-size parse test
# in the CPU step only: port 218 / 213, ptx 623 / 492, cpu 312 / 405, asv 245 / 147, late
# 294 / 101, sim 316 / 276, checks 846 s, .ci/run 915 s.
# Each step writes bench_out/ci/<step>.log, printed whole when the step ends, with its time;
# the script fails if any step fails.  NK_CI_SERIAL=1 runs them one after another instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
start=$(date +%s)
logs=bench_out/ci
rm -rf "$logs" && mkdir -p "$logs"
workers=${NK_TEST_WORKERS:-2}

step() {  # step NAME COMMAND...: run it, record "rc seconds", print its log when done
    local name=$1
    shift
    local t0 rc
    t0=$(date +%s)
    set +e
    # in a subshell so that `times` gives this step's own CPU time (its children's user and
    # system seconds): which steps compete for the two cores, not only how long each took
    ( "$@" > "$logs/$name.log" 2>&1; rc=$?; times > "$logs/$name.cpu"; exit $rc )
    rc=$?
    set -e
    local cpu
    cpu=$(awk 'NR == 2 {for (i = 1; i <= 2; i++) {split($i, a, /[ms]/); s += a[1] * 60 + a[2]}} END {printf "%d", s}' \
        "$logs/$name.cpu")
    echo "$rc $(( $(date +%s) - t0 )) $cpu" > "$logs/$name.status"
    flock "$logs/.print" bash -c "echo '== $name'; cat '$logs/$name.log'; \
        echo '== $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $(( $(date +%s) - t0 )) s, $cpu s of CPU'"
}

pytest=(python -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder --durations=15)
port=(python -m pytest -q --durations=5 tests/test_portability.py)
# CPU tests whose work is in child processes compiling from an empty cache (or for another
# CPU): they need nothing from port, so they run at the end beside sim and asv, where asv
# (one process) otherwise had the last ~80 s to itself on two cores (2026-12-02); on the
# critical path they were ~140 s of one xdist worker (Haswell 58-79 s, warmup 40-46 s).
late=(python -m pytest -q --durations=5 tests/test_warmup.py tests/test_cache_safety.py
      "tests/test_attention.py::test_narrow_vector_path_on_a_haswell_target")
cpu=("${pytest[@]}" --ignore=tests/test_portability.py --ignore=tests/test_warmup.py
     --ignore=tests/test_cache_safety.py
     --deselect "tests/test_attention.py::test_narrow_vector_path_on_a_haswell_target" tests)
# 3 simulator workers: each is GIL-bound (its simulated threads hand the GIL around, 0.8 of a
# core), so 2 leave CPU idle beside asv: sim + asv side by side (Zen 5, 2026-11-27) with 2
# workers 359-372 s / 255-269 s, with 3 330 s / 326 s
sim=(env NK_TEST_WORKERS="${NK_TEST_WORKERS:-3}" bash .ci/cuda_checks.sh sim)
ptx=(env NK_PTX_JOBS=1 bash .ci/cuda_checks.sh ptx)
asv=(bash .ci/bench_smoke.sh)
steps=(port ptx cpu sim late asv)

if [ "${NK_CI_SERIAL:-0}" = 1 ]; then
    for s in "${steps[@]}"; do
        eval "step $s \"\${$s[@]}\""
    done
else
    echo "port and ptx first; cpu after port; then sim, late and asv side by side (logs: $logs/)"
    step ptx "${ptx[@]}" &
    step port "${port[@]}"
    step cpu "${cpu[@]}"
    # asv is one sequential process, the longest chain of this phase: sim and late run
    # niced so that it keeps a core while they share the rest
    step sim nice -n 10 "${sim[@]}" &
    step late nice -n 10 "${late[@]}" &
    step asv "${asv[@]}"
    wait
fi

failed=""
for s in "${steps[@]}"; do
    read -r rc secs cpu < "$logs/$s.status"
    echo "$s: exit $rc, $secs s, $cpu s of CPU"
    [ "$rc" -eq 0 ] || failed="$failed $s"
done
if [ -n "$failed" ]; then
    # CI shows only the tail of this output, where the last step's log (often a passing
    # one) would hide why another failed: repeat each failed step's summary here, last
    for s in $failed; do
        echo "== $s failed; the end of $logs/$s.log, from pytest's summary (or its last 60 lines):"
        if grep -q "short test summary info" "$logs/$s.log"; then
            sed -n '/short test summary info/,$p' "$logs/$s.log" | cut -c1-400 | tail -n 80
        else
            tail -n 60 "$logs/$s.log" | cut -c1-400
        fi
        grep -oE "NK_TEST_SEED=[0-9]+.{0,120}" "$logs/$s.log" | sort -u | head -n 20 || true
    done
    echo "== FAILED:$failed (after $(( $(date +%s) - start )) s)"
    exit 1
fi
echo "== all checks passed in $(( $(date +%s) - start )) s"
