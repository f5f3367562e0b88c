#!/usr/bin/env bash
# session 18, call 3: 16-warp blocks of 128 x 256 and 256 x 128 (cuda_tiles "*.w16": the
# warps of two 128 x 128 blocks, half their L2 traffic per product) against the default.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
{ git log --oneline -1; git status --short | head; } > "$O/info.txt" 2>&1
NK_TEST_DEVICE=cuda timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider -n 4 -W ignore::RuntimeWarning -rfE \
  tests/cuda/test_tensor_core_paths.py -k "tile_builds and w16" > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-300 | head; tail -1 "$O/tests.log"
SHAPES="4096,4096,4096,kn;4096,4096,4096,nk;4096,11008,4096,nk;512,11008,4096,nk;2048,2048,2048,kn" \
  VARIANTS="128x128x32,128x256x32.w16,256x128x32.w16" REPS=15 timeout -k 5 90 python3 bench/gpu_probe_gemm.py > "$O/probe.log" 2>&1
echo "probe rc=$?"; grep -v "^{" "$O/probe.log" | tail -24
