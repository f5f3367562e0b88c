#!/usr/bin/env bash
# session 18, call 1: the cp.async GEMM builds of cuda_tiles.TC_ASYNC_TILES (bigger block
# tiles, more stages in dynamic shared memory, 2 blocks per SM, grouped block order) on
# the GPU: their tests first (correctness before timing), then bench/gpu_probe_gemm.py.
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
NK_TEST_DEVICE=cuda timeout -k 5 "$(share 120 250)" python3 -m pytest -q -p no:cacheprovider -n "$NW" -W ignore::RuntimeWarning -rfE \
  tests/cuda/test_tensor_core_paths.py tests/cuda/test_mma.py -k "tile_builds or grouped or cp_async or mma" > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-300 | head -20; tail -2 "$O/tests.log"; el
SHAPES="${SHAPES:-4096,4096,4096,kn;4096,4096,4096,nk;4096,11008,4096,nk;8192,4096,4096,kn;2048,2048,2048,kn;512,11008,4096,nk;1000,1000,1000,kn}" \
  VARIANTS="${VARIANTS:-128x128x32,128x128x32.b2,128x128x32.s4b2,128x128x32.g8,128x256x32.s3,128x256x32.s4,128x256x32.s4g8,256x128x32.s4g8,128x256x64.s3g8}" REPS=15 timeout -k 5 "$(share 300 0)" python3 bench/gpu_probe_gemm.py > "$O/probe.log" 2>&1
echo "probe rc=$?"; el
grep -v "^{" "$O/probe.log" | tail -80
