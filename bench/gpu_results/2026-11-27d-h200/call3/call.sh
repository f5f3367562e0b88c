#!/usr/bin/env bash
# session 19, call 3: the dispatcher on wgmma (wg128x128.b2, now spill-free: whole K tiles copy
# from fixed addresses) under the suite at full shapes; issue #9's bars through dispatch; 256 x 128
# wgmma tiles (4 warpgroups: 85 FLOP per byte copied from L2 against 64) timed against it.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
BUDGET="${1:-400}"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
share() { local cap=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < cap )) && cap=$l; (( cap < 1 )) && cap=1; echo $cap; }
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
{ git log --oneline -1; git status --short | head; } > "$O/info.txt" 2>&1
NW=$(( $(nproc) - 2 ))
NK_TEST_DEVICE=cuda timeout -k 5 "$(share 170 150)" python3 -m pytest -q -p no:cacheprovider -n "$NW" --dist loadfile -W ignore::RuntimeWarning -rfE \
  tests/cuda tests/test_linalg.py tests/test_linalg_grad.py tests/test_linear_cross_entropy.py tests/test_attention.py \
  tests/test_threads.py tests/test_autograd.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-300 | head -20; tail -2 "$O/tests.log"; el
timeout -k 5 "$(share 80 70)" python3 -m bench.gpu --bars --dtypes float16 float32 --json "$O/bars.json" > "$O/bars.log" 2>&1; echo "bars rc=$?"; el
SHAPES="4096,4096,4096,kn;4096,4096,4096,nk;4096,11008,4096,nk;512,11008,4096,nk;8192,8192,8192,kn" \
  VARIANTS="wg128x128.b2,wg256x128,wg256x128.s3,wg256x128.p1" REPS=15 timeout -k 5 "$(share 80 0)" python3 bench/gpu_probe_gemm.py > "$O/gemm.log" 2>&1
echo "gemm rc=$?"; el
grep -v "^$" "$O/bars.log" | grep -v "^reference\|^peaks" | cut -c1-200
grep -v "^{" "$O/gemm.log" | tail -30
