#!/usr/bin/env bash
# session 16, call 1: the bars (the vector row kernels, 666427f), every softmax / norm case,
# the helper's cp.async GEMM probe, every float16 attention case (654cf25's loads, never
# timed), then the whole suite on the GPU
set -uo pipefail
cd "$(dirname "$0")/../../../.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
git log --oneline -1 > "$O/commit.txt" 2>/dev/null; git diff HEAD --stat > "$O/diffstat.txt" 2>/dev/null
git diff HEAD > "$O/uncommitted.diff" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$O/env.txt" 2>&1
timeout -k 5 80 python3 -m bench.gpu --bars --dtypes float16 float32 --json "$O/bars.json" > "$O/bars.log" 2>&1; echo "bars rc=$?"; el
timeout -k 5 70 python3 -m bench.gpu --full --ops softmax log_softmax layer_norm rms_norm --dtypes float16 float32 --json "$O/rows.json" > "$O/rows.log" 2>&1; echo "rows rc=$?"; el
timeout -k 5 90 python3 bench/gpu_probe_gemm.py > "$O/gemm_probe.log" 2>&1; echo "gemm probe rc=$?"; el
timeout -k 5 45 python3 -m bench.gpu --full --ops attention --dtypes float16 --json "$O/attn.json" > "$O/attn.log" 2>&1; echo "attn rc=$?"; el
NW=$(( $(nproc) - 2 ))
NK_TEST_DEVICE=cuda timeout -k 5 170 python3 -m pytest tests -q -p no:cacheprovider -n "$NW" --dist loadfile \
  -W ignore::RuntimeWarning -rfE > "$O/tests.log" 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-250 | head -20; tail -2 "$O/tests.log"; el
for f in bars rows attn; do grep -v "^$" "$O/$f.log" | grep -v "^reference\|^peaks" | cut -c1-230; done
tail -40 "$O/gemm_probe.log"
