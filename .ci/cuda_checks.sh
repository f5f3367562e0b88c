#!/usr/bin/env bash
# CUDA checks without a GPU (called by .ci/run; installs nothing: CI installs '.[cuda]').
#  1. the op tests for the CUDA target under numba's CUDA simulator, with the test-only
#     warp-primitive emulation (tests/conftest.py installs it): every CUDA implementation,
#     the same test functions as the CPU side, small shapes;
#  2. python -m bench.ptx: every kernel compiled with compile_ptx for sm_80 / sm_87 / sm_90
#     and assembled with ptxas (fails on a compile error or a spill), then the performance
#     model table.  Runs without the simulator (compile_ptx needs the real CUDA target).
# Usage: .ci/cuda_checks.sh [sim|ptx|all] [python]   (default all; .venv/bin/python if
# present, else python)
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT="${1:-all}"
PY="${2:-}"
case "$WHAT" in
  sim|ptx|all) ;;
  *) echo "usage: .ci/cuda_checks.sh [sim|ptx|all] [python] (got '$WHAT')" >&2; exit 2 ;;
esac
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python; fi
fi
mkdir -p bench_out

if [ "$WHAT" = all ] || [ "$WHAT" = sim ]; then
echo "== CUDA simulator tests (NK_TEST_DEVICE=cuda NUMBA_ENABLE_CUDASIM=1) =="
start=$(date +%s)
NK_TEST_DEVICE=cuda NUMBA_ENABLE_CUDASIM=1 "$PY" -m pytest tests -q -p no:cacheprovider \
  -n "${NK_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder -W ignore::RuntimeWarning --durations=25
echo "simulator tests: $(( $(date +%s) - start )) s"
fi

if [ "$WHAT" = all ] || [ "$WHAT" = ptx ]; then
echo "== PTX for sm_80 / sm_87 / sm_90 (compile_ptx + ptxas -v) and the performance model =="
start=$(date +%s)
env -u NUMBA_ENABLE_CUDASIM "$PY" -m bench.ptx --json bench_out/ptx.json
echo "ptx + model: $(( $(date +%s) - start )) s"
fi
