#!/usr/bin/env bash
# CUDA checks without a GPU (called by .ci/run; installs nothing: CI installs '.[cuda]').
#  1. the op tests for the CUDA target under numba's CUDA simulator, with the test-only
#     warp-primitive emulation (tests/conftest.py installs it): every CUDA implementation,
#     the same test functions as the CPU side, small shapes;
#  2. python -m bench.ptx: every kernel compiled with compile_ptx for sm_80 / sm_87 / sm_90
#     and assembled with ptxas (fails on a compile error or a spill), then the performance
#     model table.  Runs without the simulator (compile_ptx needs the real CUDA target).
# Usage: .ci/cuda_checks.sh [python]   (default: .venv/bin/python if present, else python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python; fi
fi
mkdir -p bench_out

echo "== CUDA simulator tests (NK_TEST_DEVICE=cuda NUMBA_ENABLE_CUDASIM=1) =="
start=$(date +%s)
simlog=$(mktemp)
set +e
NK_TEST_DEVICE=cuda NUMBA_ENABLE_CUDASIM=1 "$PY" -m pytest tests -q -p no:cacheprovider \
  -n "${NK_TEST_WORKERS:-2}" --dist loadfile -W ignore::RuntimeWarning --durations=10 2>&1 | tee "$simlog"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  # Known intermittent failure under the simulator (not reproducible alone with the same
  # seed; seen on attention's cuda-splitkv tests in 2 of 4 CI runs, cause not found yet):
  # up to 3 failed tests are replayed once each, alone, with the seed their failure named
  # (hypothesis tests replay their own failing example from hypothesis' database).  A
  # failure that replays is a real one and fails CI; one that does not is reported as
  # FLAKY, loudly, and CI goes on.  Errors (not failures) are never replayed.
  mapfile -t failed < <("$PY" - "$simlog" <<'PYEOF'
import re, sys
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    if line.startswith("FAILED "):
        node = line[len("FAILED "):].split(" - ", 1)[0].strip()
        m = re.search(r"NK_TEST_SEED=(\d+)\]", line)
        print(f"{m.group(1) if m else ''}\t{node}")
    elif line.startswith("ERROR "):
        print("ERROR\t" + line.strip())
PYEOF
)
  if [ "${#failed[@]}" -eq 0 ] || [ "${#failed[@]}" -gt 3 ] || printf '%s\n' "${failed[@]}" | grep -q '^ERROR'; then
    exit "$rc"
  fi
  for f in "${failed[@]}"; do
    seed=${f%%$'\t'*}
    node=${f#*$'\t'}
    echo "== replaying $node alone (NK_TEST_SEED=${seed:-hypothesis})"
    env ${seed:+NK_TEST_SEED=$seed} NK_TEST_DEVICE=cuda NUMBA_ENABLE_CUDASIM=1 "$PY" -m pytest -q \
      -p no:cacheprovider -W ignore::RuntimeWarning "$node"
    echo "FLAKY (simulator): $node failed in the full run and passed when replayed alone"
  done
fi
rm -f "$simlog"
echo "simulator tests: $(( $(date +%s) - start )) s"

echo "== PTX for sm_80 / sm_87 / sm_90 (compile_ptx + ptxas -v) and the performance model =="
start=$(date +%s)
env -u NUMBA_ENABLE_CUDASIM "$PY" -m bench.ptx --json bench_out/ptx.json
echo "ptx + model: $(( $(date +%s) - start )) s"
