#!/usr/bin/env bash
# session 18, call 4: K tiles of 64 at 2 blocks per SM ("128x128x64.s3b2": half the barriers per
# product; it spills 24-184 bytes outside the main loop) against the default.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
{ git log --oneline -1; git status --short | head; } > "$O/info.txt" 2>&1
NK_TEST_DEVICE=cuda timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider -n 4 -W ignore::RuntimeWarning -rfE \
  tests/cuda/test_tensor_core_paths.py -k "tile_builds and 128x128x64" > "$O/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-300 | head; tail -1 "$O/tests.log"
SHAPES="4096,4096,4096,kn;4096,4096,4096,nk;4096,11008,4096,nk;512,11008,4096,nk" \
  VARIANTS="128x128x32,128x128x64.s3b2" REPS=15 timeout -k 5 90 python3 bench/gpu_probe_gemm.py > "$O/probe.log" 2>&1
echo "probe rc=$?"; grep -v "^{" "$O/probe.log" | tail -24
