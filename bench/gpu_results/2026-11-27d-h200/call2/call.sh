#!/usr/bin/env bash
# session 19, call 2: the first wgmma kernels (kernels_cuda/wgmma.py, gemm_wgmma.py; never run on
# a GPU before): the fragment-layout and GEMM tests, racecheck over them, the probe fix
# (tests/cuda/test_probes.py keeps the shim on PYTHONPATH), then every WGMMA_TILES build timed
# against cuBLAS and the best mma.sync build.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
BUDGET="${1:-330}"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
share() { local cap=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < cap )) && cap=$l; (( cap < 1 )) && cap=1; echo $cap; }
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
{ git log --oneline -1; git status --short | head; } > "$O/info.txt" 2>&1
NK_TEST_DEVICE=cuda timeout -k 5 "$(share 90 200)" python3 -m pytest -q -p no:cacheprovider -n 8 -W ignore::RuntimeWarning -rfE \
  tests/cuda/test_wgmma.py tests/cuda/test_probes.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|^E  " "$O/tests.log" | cut -c1-300 | head -20; tail -2 "$O/tests.log"; el
NK_TEST_DEVICE=cuda timeout -k 5 "$(share 50 140)" compute-sanitizer --tool racecheck --error-exitcode 97 --print-limit 10 \
  python3 -m pytest -q -p no:cacheprovider tests/cuda/test_wgmma.py -k "layout or wg128x128.b2" -W ignore::RuntimeWarning > "$O/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "ERROR SUMMARY|HAZARD|passed|failed" "$O/racecheck.log" | head -5; el
SHAPES="4096,4096,4096,kn;4096,4096,4096,nk;4096,11008,4096,nk;512,11008,4096,nk;8192,8192,8192,kn" \
  VARIANTS="128x128x64,wg128x128,wg128x128.b2,wg128x128.p1,wg128x256,wg128x256.p1" REPS=15 \
  timeout -k 5 "$(share 150 0)" python3 bench/gpu_probe_gemm.py > "$O/gemm.log" 2>&1
echo "gemm rc=$?"; grep -v "^{" "$O/gemm.log" | tail -40; el
