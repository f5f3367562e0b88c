#!/usr/bin/env bash
# session 19, call 1: the commits since the last GPU run (07e7717..e1e07c6: 128x128x64 as the
# H100-class default, the epilogue's volatile %ctaid/%tid reads) under the suite at full
# shapes; mma.sync's issue rate alone; the 128x128x64 build re-timed; attention at 3 and 4
# blocks per SM against the default.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
BUDGET="${1:-420}"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
share() { local cap=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < cap )) && cap=$l; (( cap < 1 )) && cap=1; echo $cap; }
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
{ git log --oneline -1; git status --short | head; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > "$O/info.txt" 2>&1
NW=$(( $(nproc) - 2 ))
NK_TEST_DEVICE=cuda timeout -k 5 "$(share 170 200)" python3 -m pytest -q -p no:cacheprovider -n "$NW" --dist loadfile -W ignore::RuntimeWarning -rfE \
  tests/cuda tests/test_linalg.py tests/test_linalg_grad.py tests/test_linear_cross_entropy.py tests/test_attention.py \
  tests/test_threads.py tests/test_autograd.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-300 | head -20; tail -2 "$O/tests.log"; el
timeout -k 5 "$(share 40 150)" python3 bench/gpu_probe_mma.py > "$O/mma.log" 2>&1
echo "mma rc=$?"; grep -v "^{" "$O/mma.log" | tail -12; el
SHAPES="4096,4096,4096,kn;4096,4096,4096,nk;4096,11008,4096,nk;512,11008,4096,nk" \
  VARIANTS="128x128x32,128x128x64" REPS=15 timeout -k 5 "$(share 70 80)" python3 bench/gpu_probe_gemm.py > "$O/gemm.log" 2>&1
echo "gemm rc=$?"; grep -v "^{" "$O/gemm.log" | tail -14; el
SHAPES="1,32,4096,128,1;1,32,4096,128,0;1,12,2048,64,1;4,32,1024,128,1" \
  VARIANTS="async8,async4,async4b3,async4b4" REPS=15 timeout -k 5 "$(share 80 0)" python3 bench/gpu_probe_attention.py > "$O/attn.log" 2>&1
echo "attn rc=$?"; grep -v "^{" "$O/attn.log" | tail -24; el
