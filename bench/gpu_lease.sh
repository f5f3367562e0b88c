#!/usr/bin/env bash
# One lease of a GPU machine (the `device` tool), all of it in one call within a time budget:
# a lease is 15 minutes of device time and a machine's start costs one or two of them, so the
# steps run back to back, each cut off by its share of the budget, and everything lands in
# files as it goes (a step cut off keeps what it wrote).  From the repository root there:
#
#     bash bench/gpu_lease.sh [BUDGET_SECONDS [STEP ...]]   (default 540; all steps but overhead)
#
# STEPs run in the order given (default: tests wgmma mma bars key sanitize rest): tests, wgmma,
# mma, bars, key, overhead, sanitize, rest.  Correctness first: a lease cut short still says whether the
# suite passes (the H200 sessions of 2026-11-26 ran it in 107-142 s).
# with `bench_out/ptx.json` (python -m bench.ptx --json bench_out/ptx.json, made here: the
# model's register and SASS counts) named in the call's carry.
# Writes to $OUT (the device tool's folder) or bench_out/gpu/:
#   env.txt      nvidia-smi, python3's numba / numba-cuda / torch, the import check
#   bench.log    the tables of the three bench.gpu runs below
#   bars.json    bench.gpu --bars: issue #9's bar shapes, float16 and float32
#   key.json     bench.gpu on the ops of issue #9's bars at the report's quick shapes
#   tests.log, junit.xml   the test suite on the GPU (NK_TEST_DEVICE=cuda, full shapes),
#                          xdist over the machine's cores
#   sanitize.log     compute-sanitizer memcheck / racecheck / synccheck over a subset of
#                    the tests (small shapes: NK_TEST_SMALL_SHAPES=1)
#   rest.json    bench.gpu on the remaining CUDA ops, while time is left
#   overhead.log bench.gpu_overhead --profile: the host time per call of each layer
#   mma.log      bench/gpu_probe_mma.py: mma.sync's issue rate alone (bench/cuda_model.py's tensor pipe)
#   stream.log   bench/gpu_probe_stream.py: the DRAM bandwidth a copy / add reaches (the model's
#                memory bound divides by the datasheet figure)
#   wgmma_attention.log, wgmma_gemm.log   on Hopper: the wgmma attention builds (off in the
#                dispatcher until timed: cuda_tiles.TC_ATTN_WGMMA_ENABLED) against the cp.async
#                kernels, and the wgmma GEMM builds
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-540}"
shift || true
STEPS="${*:-tests wgmma mma bars key sanitize rest}"
O="${OUT:-bench_out/gpu}"
mkdir -p "$O"
T0=$(date +%s)
PY="${PY:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# seconds for a step: its cap, or what is left of the budget less a reserve for later steps
# (at least 1: `timeout 0` would mean no limit at all)
share() { local cap=$1 reserve=$2 l; l=$(( $(left) - reserve )); (( l < cap )) && cap=$l; (( cap < 1 )) && cap=1; echo $cap; }
step() { echo; echo "== $* ($(( $(date +%s) - T0 )) s in, $(left) s left)"; }

{
  step "machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  nproc; uname -r
  $PY - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for m in ("numpy", "numba", "numba_cuda", "llvmlite", "torch", "pytest", "xdist", "pytest_timeout", "hypothesis", "ml_dtypes"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING", e)
EOF
  which compute-sanitizer nvdisasm ptxas 2>&1
} > "$O/env.txt" 2>&1
cat "$O/env.txt"

# numpy 2.5 without np.row_stack against numba-cuda 0.30: bench/gpu_shim/sitecustomize.py, in
# every python3 the steps start
export PYTHONPATH="$PWD/bench/gpu_shim:$PYTHONPATH"
# (under the simulator, for a dry run of this script, with the tests' warp-primitive emulation)
check='import os
from numba import cuda
if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    from tests.cuda import simwarp
    simwarp.install()
assert cuda.is_available(), "no GPU"
import numpy as np, dispatch
y = dispatch.softmax(cuda.to_device(np.ones((4, 8), np.float32)))
print("softmax on the GPU:", y.copy_to_host()[0, :2])'
$PY -c "$check" >> "$O/env.txt" 2>&1 || { tail -30 "$O/env.txt"; echo "no working numba-cuda: stopping"; exit 1; }
tail -3 "$O/env.txt"

KEY="matmul linear attention softmax log_softmax cross_entropy layer_norm rms_norm relu silu gelu swiglu geglu rope"

step_bars() {
step "bench.gpu --bars (issue #9's bar shapes)"
timeout -k 5 "$(share 90 300)" $PY -m bench.gpu --bars --dtypes float16 float32 --json "$O/bars.json" >> "$O/bench.log" 2>&1
echo "rc=$?"; grep -v "^$" "$O/bench.log" | tail -12
}

step_key() {
step "bench.gpu on the bars' ops at the report's quick shapes"
timeout -k 5 "$(share 150 150)" $PY -m bench.gpu --ops $KEY --dtypes float16 float32 --json "$O/key.json" >> "$O/bench.log" 2>&1
echo "rc=$?"
}

step_overhead() {
step "host time per call (bench.gpu_overhead)"
timeout -k 5 "$(share 60 250)" $PY -m bench.gpu_overhead --profile > "$O/overhead.log" 2>&1
echo "rc=$?"; grep "us/call" "$O/overhead.log"
}

step_mma() {
step "mma.sync alone and DRAM streaming (bench/gpu_probe_mma.py, gpu_probe_stream.py: the model's pipes)"
timeout -k 5 "$(share 40 200)" $PY bench/gpu_probe_mma.py > "$O/mma.log" 2>&1
echo "rc=$?"; grep -v "^{" "$O/mma.log" | tail -12
timeout -k 5 "$(share 30 190)" $PY bench/gpu_probe_stream.py > "$O/stream.log" 2>&1
echo "rc=$?"; grep -v "^{" "$O/stream.log" | tail -8
}

step_wgmma() {
step "wgmma builds (Hopper): attention against the cp.async kernels, the GEMM builds"
SHAPES="1,32,4096,128,1;1,32,4096,128,0;1,12,2048,64,1;4,32,1024,128,1" REPS=15 \
  VARIANTS="async4,async4b3,wg64,wg64s2,wg128k,wg64x2" timeout -k 5 "$(share 90 250)" $PY bench/gpu_probe_attention.py \
  > "$O/wgmma_attention.log" 2>&1
echo "rc=$?"; grep -v "^{" "$O/wgmma_attention.log" | tail -30
SHAPES="4096,4096,4096,kn;4096,4096,4096,nk;4096,11008,4096,nk;512,11008,4096,nk" REPS=15 \
  VARIANTS="128x128x64,wg128x128.b2,wg256x128" timeout -k 5 "$(share 60 200)" $PY bench/gpu_probe_gemm.py \
  > "$O/wgmma_gemm.log" 2>&1
echo "rc=$?"; grep -v "^{" "$O/wgmma_gemm.log" | tail -16
}

step_tests() {
step "the test suite on the GPU"
TO=""; $PY -c "import pytest_timeout" 2>/dev/null && TO="--timeout 120"
NW=$(( $(nproc) - 2 )); (( NW < 1 )) && NW=1
NK_TEST_DEVICE=cuda timeout -k 10 "$(share 220 240)" $PY -m pytest tests -q -p no:cacheprovider -n "$NW" --dist loadfile \
  -W ignore::RuntimeWarning $TO -rfE --junitxml "$O/junit.xml" > "$O/tests.log" 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-160 | head -30; tail -2 "$O/tests.log"
}

step_sanitize() {
step "compute-sanitizer (small shapes; xdist workers are child processes, which it follows)"
for tool in memcheck racecheck synccheck; do
  echo "-- $tool" >> "$O/sanitize.log"
  NK_TEST_DEVICE=cuda NK_TEST_SMALL_SHAPES=1 timeout -k 10 "$(share 60 20)" compute-sanitizer --tool "$tool" \
    --target-processes all --error-exitcode 97 --print-limit 20 $PY -m pytest tests/test_linalg.py tests/test_attention.py tests/test_softmax.py \
    tests/test_norm.py tests/test_activation.py tests/test_rope.py tests/cuda -q -p no:cacheprovider --maxfail 5 \
    -n 8 -k "not thread" -W ignore::RuntimeWarning >> "$O/sanitize.log" 2>&1
  echo "$tool rc=$?" | tee -a "$O/sanitize.log"
done
grep -E "ERROR SUMMARY|HAZARD|Invalid|Race|Barrier|passed|failed" "$O/sanitize.log" | head -20
}

step_rest() {
  (( $(left) > 30 )) || return 0
  step "bench.gpu on the other CUDA ops"
  others=$($PY -c "
from dispatch import registry
key = set('$KEY'.split())
print(' '.join(n for n, op in registry.OPS.items() if n not in key and any(i.device == 'cuda' for i in op.implementations.values())))")
  timeout -k 5 "$(share 600 5)" $PY -m bench.gpu --ops $others --dtypes float16 float32 --json "$O/rest.json" >> "$O/bench.log" 2>&1
  echo "rc=$?"
}

for s in $STEPS; do
  if declare -F "step_$s" > /dev/null; then "step_$s"; else echo "unknown step: $s (known: tests wgmma mma bars key overhead sanitize rest)"; fi
done

step "tables"
grep -v "^$" "$O/bench.log" | grep -v "^reference\|^peaks\|^op  \|^device" | cut -c1-170
echo "done in $(( $(date +%s) - T0 )) s"
