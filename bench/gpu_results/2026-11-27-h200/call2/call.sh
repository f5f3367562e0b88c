#!/usr/bin/env bash
# session 12, call 2: the row kernels' variants (probe_rows.py), then their tests on the GPU
set -uo pipefail
cd "$(dirname "$0")/.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
timeout -k 5 150 python3 bench_out/probe_rows.py > "$O/probe_rows.log" 2>&1; echo "probe rc=$?"; el
cat "$O/probe_rows.log"
NK_TEST_DEVICE=cuda timeout -k 5 70 python3 -m pytest tests/test_softmax.py tests/test_norm.py tests/cuda -q -p no:cacheprovider -n 14 --dist loadfile \
  -W ignore::RuntimeWarning -rfE > "$O/tests.log" 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-250 | head -20; tail -2 "$O/tests.log"; el
