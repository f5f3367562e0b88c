#!/usr/bin/env bash
# session 12, call 1: the tensor-core attention's first run on a GPU (tests, then bars, then every attention case)
set -uo pipefail
cd "$(dirname "$0")/.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
git log --oneline -1 > "$O/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$O/env.txt" 2>&1
python3 -c "import numba, numba_cuda, torch, numpy; print(numba.__version__, numba_cuda.__version__, torch.__version__, numpy.__version__)" >> "$O/env.txt" 2>&1
cat "$O/env.txt"
NW=$(( $(nproc) - 2 ))
NK_TEST_DEVICE=cuda timeout -k 5 160 python3 -m pytest tests -q -p no:cacheprovider -n "$NW" --dist loadfile \
  -W ignore::RuntimeWarning -rfE > "$O/tests.log" 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-250 | head -20; tail -2 "$O/tests.log"; el
timeout -k 5 80 python3 -m bench.gpu --bars --dtypes float16 float32 --json "$O/bars.json" > "$O/bars.log" 2>&1; echo "bars rc=$?"; el
timeout -k 5 "$(( 330 - ($(date +%s) - T0) ))" python3 -m bench.gpu --full --ops attention --dtypes float16 float32 --json "$O/attn.json" > "$O/attn.log" 2>&1; echo "attn rc=$?"; el
for f in bars attn; do grep -v "^$" "$O/$f.log" | grep -v "^reference\|^peaks\|^device" | cut -c1-230; done
