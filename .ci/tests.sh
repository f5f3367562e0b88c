#!/usr/bin/env bash
# Everything CI checks, in order of cost. Called by ./run.sh test (which set up .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
start=$(date +%s)

echo "== CPU tests"
t0=$(date +%s)
python -m pytest -q -n "${NK_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=15 tests
echo "CPU tests: $(( $(date +%s) - t0 )) s"

if [ -f .ci/cuda_checks.sh ]; then
    echo "== CUDA: simulator tests and PTX compilation for sm_80/sm_87/sm_90"
    bash .ci/cuda_checks.sh
fi

if [ -f .ci/bench_smoke.sh ]; then
    echo "== asv smoke run and published-HTML render check"
    bash .ci/bench_smoke.sh
fi
echo "== all checks passed in $(( $(date +%s) - start )) s"
