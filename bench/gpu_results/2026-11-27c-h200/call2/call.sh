#!/usr/bin/env bash
# session 18, call 2: the 2-blocks-per-SM GEMM as the default (c6b042f): the tests of the
# families on the GEMM (full shapes), compute-sanitizer over the cp.async GEMM's tests,
# issue #9's bars, and the probe of the default against the 1-block build.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
BUDGET="${1:-400}"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
share() { local cap=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < cap )) && cap=$l; (( cap < 1 )) && cap=1; echo $cap; }
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
{ git log --oneline -1; git status --short | head; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > "$O/info.txt" 2>&1
NW=$(( $(nproc) - 2 ))
NK_TEST_DEVICE=cuda timeout -k 5 "$(share 170 220)" python3 -m pytest -q -p no:cacheprovider -n "$NW" --dist loadfile -W ignore::RuntimeWarning -rfE \
  tests/cuda tests/test_linalg.py tests/test_linalg_grad.py tests/test_linear_cross_entropy.py tests/test_threads.py \
  tests/test_autograd.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-300 | head -20; tail -2 "$O/tests.log"; el
for tool in memcheck racecheck; do
  echo "-- $tool" >> "$O/sanitize.log"
  NK_TEST_DEVICE=cuda timeout -k 5 "$(share 45 130)" compute-sanitizer --tool "$tool" --error-exitcode 97 --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/cuda/test_tensor_core_paths.py -k "cp_async_tensor or tile_builds and 128x128" \
    -W ignore::RuntimeWarning >> "$O/sanitize.log" 2>&1
  echo "$tool rc=$?" | tee -a "$O/sanitize.log"
done
grep -E "ERROR SUMMARY|HAZARD|Invalid|Race|passed|failed" "$O/sanitize.log" | head; el
timeout -k 5 "$(share 80 60)" python3 -m bench.gpu --bars --dtypes float16 float32 --json "$O/bars.json" > "$O/bars.log" 2>&1; echo "bars rc=$?"; el
SHAPES="4096,4096,4096,kn;4096,4096,4096,nk;4096,11008,4096,nk;2048,2048,2048,kn;512,11008,4096,nk;1000,1000,1000,kn;128,768,768,nk" \
  VARIANTS="128x128x32,128x128x32.b1,128x128x32.s4b2" REPS=15 timeout -k 5 "$(share 80 0)" python3 bench/gpu_probe_gemm.py > "$O/probe.log" 2>&1
echo "probe rc=$?"; el
grep -v "^$" "$O/bars.log" | grep -v "^reference\|^peaks" | cut -c1-200
grep -v "^{" "$O/probe.log" | tail -30
