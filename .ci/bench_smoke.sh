#!/usr/bin/env bash
# asv smoke run (not a gate on speed): every benchmark of the suite runs once on its quick
# shapes in the current Python, the results are published as HTML, the HTML is made
# self-contained (JavaScript from the npm registry, no CDN), and headless Chromium must
# render the benchmark list from it.  Fails on any benchmark error or a blank page.
# Expects .venv (run.sh sets it up); installs Chromium with apt-get when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
start=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "-- asv run (quick shapes, one sample each, existing environment)"
asv machine --yes --machine ci-smoke >/dev/null
# NK_ASV_QUICK=1: each op's first quick case only, fresh-process compile timing for relu only.
# -a repeat/rounds/warmup: one sample per benchmark, like --quick, but results are saved for
# `asv publish` (--quick does not save); --set-commit-hash: an existing environment saves
# results only with it.
set +e
NK_ASV_QUICK=1 asv run --machine ci-smoke --environment "existing:$(command -v python)" \
    -a repeat=1 -a rounds=1 -a warmup_time=0 --set-commit-hash "$(git rev-parse HEAD)" \
    --show-stderr 2>&1 | tee "$work/asv.log" | grep --line-buffered -E "^\[.*\] ··· [a-z_]+\."
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ] || grep -qE "failed|Traceback" "$work/asv.log"; then
    grep -B3 -A25 -E "failed|Traceback" "$work/asv.log" | head -120
    echo "asv smoke run FAILED (asv exit status $status)"
    exit 1
fi
n_ok=$(grep -cE "^\[.*\] ··· [a-z_]+\..* ok$" "$work/asv.log" || true)
echo "asv: $n_ok benchmarks ok in $(( $(date +%s) - start )) s"

echo "-- asv publish + offline assets"
asv publish >/dev/null
python -m bench.asv_html --html-dir .asv/html --cache .asv/vendor

echo "-- render check (headless Chromium, file://, no network)"
if ! command -v chromium >/dev/null 2>&1; then
    apt-get install -y chromium >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get install -y chromium >/dev/null)
fi
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
       --no-first-run --allow-file-access-from-files --virtual-time-budget=15000 --user-data-dir="$work/profile")
url="file://$PWD/.asv/html/index.html"
timeout 120 chromium "${flags[@]}" --dump-dom "$url" > "$work/dom.html" 2>/dev/null
timeout 120 chromium "${flags[@]}" --window-size=1280,900 --screenshot="$work/asv.png" "$url" >/dev/null 2>&1
mkdir -p bench_out && cp "$work/asv.png" bench_out/asv_smoke.png
python - "$work/dom.html" bench_out/asv_smoke.png <<'EOF'
import re, sys
import matplotlib.image as mpimg
import numpy as np
dom = open(sys.argv[1], encoding="utf-8", errors="replace").read()
names = set(re.findall(r"\bops\.[A-Z][A-Za-z]+\.[a-z_]+", dom))  # bench/benchmarks/ops.py: one class per op
img = mpimg.imread(sys.argv[2])
colours = len(np.unique(img.reshape(-1, img.shape[-1]), axis=0))
print(f"rendered page: {len(names)} benchmark names in the DOM, {colours} colours in the screenshot")
if len(names) < 10 or colours < 16:
    sys.exit("the published asv page is blank or lacks the benchmark list")
EOF
echo "bench smoke passed in $(( $(date +%s) - start )) s (screenshot: bench_out/asv_smoke.png)"
