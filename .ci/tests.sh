#!/usr/bin/env bash
# Everything CI checks. Called by ./run.sh test (which set up .venv).
#
# The four steps share the machine's cores instead of taking turns (each alone leaves a
# core idle at its tail, and the asv run uses one):
#   cpu  CPU tests (pytest-xdist)              | from the start
#   sim  CUDA tests under the simulator        | from the start
#   ptx  PTX for sm_80/87/90, ptxas, the model | from the start
#   asv  asv smoke run + HTML render check     | once cpu has filled numba's kernel cache
# Each step writes bench_out/ci/<step>.log, printed whole when the step ends, with its time;
# the script fails if any step fails.  NK_CI_SERIAL=1 runs them one after another instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
start=$(date +%s)
logs=bench_out/ci
rm -rf "$logs" && mkdir -p "$logs"
workers=${NK_TEST_WORKERS:-2}

step() {  # step NAME COMMAND...: run it, record "rc seconds", print its log when done
    local name=$1
    shift
    local t0 rc
    t0=$(date +%s)
    set +e
    "$@" > "$logs/$name.log" 2>&1
    rc=$?
    set -e
    echo "$rc $(( $(date +%s) - t0 ))" > "$logs/$name.status"
    flock "$logs/.print" bash -c "echo '== $name'; cat '$logs/$name.log'; \
        echo '== $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $(( $(date +%s) - t0 )) s'"
}

cpu=(python -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder --durations=15 tests)
sim=(bash .ci/cuda_checks.sh sim)
ptx=(bash .ci/cuda_checks.sh ptx)
asv=(bash .ci/bench_smoke.sh)

if [ "${NK_CI_SERIAL:-0}" = 1 ]; then
    step cpu "${cpu[@]}"; step sim "${sim[@]}"; step ptx "${ptx[@]}"; step asv "${asv[@]}"
else
    echo "cpu, sim and ptx start together; asv after cpu (logs: $logs/)"
    step sim "${sim[@]}" &
    step ptx "${ptx[@]}" &
    step cpu "${cpu[@]}"
    step asv "${asv[@]}"
    wait
fi

failed=""
for s in cpu sim ptx asv; do
    read -r rc secs < "$logs/$s.status"
    echo "$s: exit $rc, $secs s"
    [ "$rc" -eq 0 ] || failed="$failed $s"
done
if [ -n "$failed" ]; then
    echo "== FAILED:$failed (after $(( $(date +%s) - start )) s)"
    exit 1
fi
echo "== all checks passed in $(( $(date +%s) - start )) s"
