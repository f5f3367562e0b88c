#!/usr/bin/env bash
# session 16, call 2 (the last of the lease): the bars and the report's quick cases of the
# ops with new kernels (vector rows and elementwise, the cp.async GEMM on by default, the
# float32 vector GEMM, the decode kernel, the cp.async attention), the attention variants
# probe, then the tests of the touched families on the GPU.  Steps in priority order, each
# cut off by its share of the budget; at most 7 files (the device tool returns a limited
# number).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
BUDGET="${1:-360}"
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
share() { local cap=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < cap )) && cap=$l; (( cap < 1 )) && cap=1; echo $cap; }
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
{ git log --oneline -1; git status --short | head; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } > "$O/info.txt" 2>&1
timeout -k 5 "$(share 75 250)" python3 -m bench.gpu --bars --dtypes float16 float32 --json "$O/bars.json" > "$O/bars.log" 2>&1; echo "bars rc=$?"; el
timeout -k 5 "$(share 75 175)" python3 -m bench.gpu --ops matmul linear attention relu gelu swiglu softmax log_softmax layer_norm rms_norm \
  --dtypes float16 float32 --json "$O/key.json" > "$O/key.log" 2>&1; echo "key rc=$?"; el
VARIANTS="${VARIANTS:-tc,async8,async4,async8s2}" timeout -k 5 "$(share 55 120)" python3 bench/gpu_probe_attention.py > "$O/attn_probe.log" 2>&1; echo "attn probe rc=$?"; el
NW=$(( $(nproc) - 2 ))
NK_TEST_DEVICE=cuda timeout -k 5 "$(share 150 0)" python3 -m pytest -q -p no:cacheprovider -n "$NW" --dist loadfile \
  -W ignore::RuntimeWarning -rfE tests/cuda tests/test_attention.py tests/test_attention_grad.py tests/test_softmax.py \
  tests/test_softmax_grad.py tests/test_norm.py tests/test_activation.py tests/test_linalg.py tests/test_linalg_grad.py \
  tests/test_linear_cross_entropy.py tests/test_threads.py > "$O/tests.log" 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-300 | head -20; tail -2 "$O/tests.log"; el
for f in bars key; do grep -v "^$" "$O/$f.log" | grep -v "^reference\|^peaks" | cut -c1-200; done
grep -v "^{" "$O/attn_probe.log" | tail -30
