#!/usr/bin/env bash
# session 12, call 3: the whole suite on the GPU, the bars, every attention case (the
# tensor-core kernel's new load path), the row kernels at 8 / 32 / 64 elements a thread
set -uo pipefail
cd "$(dirname "$0")/.."
O="${OUT:-bench_out/gpu}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/bench/gpu_shim:$PWD"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
git log --oneline -1 > "$O/commit.txt" 2>/dev/null
NW=$(( $(nproc) - 2 ))
NK_TEST_DEVICE=cuda timeout -k 5 170 python3 -m pytest tests -q -p no:cacheprovider -n "$NW" --dist loadfile \
  -W ignore::RuntimeWarning -rfE > "$O/tests.log" 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)" "$O/tests.log" | cut -c1-250 | head -20; tail -2 "$O/tests.log"; el
timeout -k 5 70 python3 -m bench.gpu --bars --dtypes float16 float32 --json "$O/bars.json" > "$O/bars.log" 2>&1; echo "bars rc=$?"; el
timeout -k 5 45 python3 -m bench.gpu --full --ops attention --dtypes float16 --json "$O/attn.json" > "$O/attn.log" 2>&1; echo "attn rc=$?"; el
timeout -k 5 60 python3 bench_out/probe_rows.py > "$O/probe_rows2.log" 2>&1; echo "probe rc=$?"; el
for f in bars attn; do grep -v "^$" "$O/$f.log" | grep -v "^reference\|^peaks\|^device" | cut -c1-230; done
cat "$O/probe_rows2.log"
