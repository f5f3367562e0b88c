"""Performance over time: the asv suite on the last N commits of main, on this machine.

    ./run.sh history [N]            (N = 10 by default; the same as python -m bench.history N)

1. Names the machine after what decides the speed (llvmlite's host CPU, the widest vector
   ISA, the core count), e.g. ``znver3-avx2-2cpu``, and registers it with ``asv machine``,
   so that the graphs of different hosts of this machine kind are never mixed.
2. ``asv run`` over the last N first-parent commits of main, each built and installed in
   asv's own virtualenv (numba, numpy and the package's dependencies from the package
   registry), on the quick case set (``NK_ASV_QUICK=1``: each op's first quick case).
   Commits already measured on this machine are skipped, so a second run only adds the new
   ones.  A commit whose build fails is reported and left out; the others still run.
3. ``asv publish`` with the site made to render offline (bench.asv_html), then
   ``asv compare`` of the oldest and the newest commit.
4. Headless Chromium draws one op's graph page; the check fails if the plot area has no
   drawn series (the empty frames the single-sample CI smoke site shows), and the
   screenshot is kept at bench_out/asv_history.png.

Cost: building and installing a commit takes about 30 s, and the quick set about
1.5-2 minutes per commit on 2 cores (mostly numba compiling each commit's kernels cold):
about 20 minutes for 10 commits on a first run.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from bench import ROOT

# The op whose graph page the Chromium check draws: relu's quick benchmarks run on every
# commit in quick mode (bench/benchmarks/_suite.py: QUICK_FIRST_CALL_OPS) and are cheap.
CHECK_BENCHMARK = "ops.Relu.time_op"


def machine_name() -> str:
    """e.g. 'znver3-avx2-2cpu', 'icelake-server-avx512-2cpu', 'neoverse-n1-neon-2cpu'."""
    import llvmlite.binding as llb

    cpu = llb.get_host_cpu_name() or "unknown"
    feats = llb.get_host_cpu_features()
    isa = ("avx512" if feats.get("avx512f") else "avx2" if feats.get("avx2") else
           "neon" if feats.get("neon") else "sse2" if feats.get("sse2") else "scalar")
    return f"{cpu}-{isa}-{os.cpu_count()}cpu"


def _asv(*args, env=None, check=True, capture=False):
    cmd = [sys.executable, "-m", "asv", *args]
    print("$ " + " ".join(args if args[0] != "run" else ("asv",) + args), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.STDOUT if capture else None)
    if check and proc.returncode != 0:
        raise SystemExit(f"asv {args[0]} failed (exit {proc.returncode})")
    return proc


def commits(n: int, branch: str = "main") -> list[str]:
    """The last n first-parent commits of branch, newest first."""
    out = subprocess.run(["git", "rev-list", "--first-parent", f"--max-count={n}", branch],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    if not out:
        raise SystemExit(f"no commits on {branch}")
    return out


def _series_columns(png: str) -> int:
    """How many pixel columns of the plot area hold a drawn series in a screenshot of an asv
    graph page: saturated colours (flot's series colours), as opposed to the grey frame,
    grid and text of an empty plot.  Counting columns, not pixels, keeps the legend's
    colour boxes (about 10 columns) and a lone one-commit dot from passing for a line,
    which spans the plot's width (about 1000 columns at 1400 px)."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(png)[..., :3].astype(float)
    sat = img.max(axis=-1) - img.min(axis=-1)
    # the header and the left-hand navigation (coloured links, selected buttons) are left out
    h, w = sat.shape
    plot = sat[h // 8:, int(w * 0.2):] > 0.35
    return int(np.count_nonzero(plot.any(axis=0)))


def render_check(html_dir: str, out_png: str, benchmark: str = CHECK_BENCHMARK,
                 min_columns: int = 300) -> int:
    """Screenshot the graph page of `benchmark` with headless Chromium (file://, offline)
    and return how many columns of the plot show a series; raise SystemExit below
    min_columns (an empty frame has none; the legend alone about 10)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        subprocess.run("apt-get install -y chromium >/dev/null 2>&1 || "
                       "(apt-get update >/dev/null && apt-get install -y chromium >/dev/null)",
                       shell=True, check=False)
        chromium = shutil.which("chromium")
        if chromium is None:
            raise SystemExit("Chromium is needed for the graph check (apt-get install chromium)")
    url = f"file://{os.path.abspath(html_dir)}/index.html#{benchmark}"
    with tempfile.TemporaryDirectory() as prof:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-background-networking", "--disable-component-update",
                        "--no-first-run", "--allow-file-access-from-files",
                        "--virtual-time-budget=20000", f"--user-data-dir={prof}",
                        "--window-size=1400,1000", f"--screenshot={os.path.abspath(out_png)}", url],
                       cwd=ROOT, check=False, capture_output=True, timeout=180)
    if not os.path.exists(out_png):
        raise SystemExit("Chromium wrote no screenshot")
    n = _series_columns(out_png)
    print(f"graph page {benchmark}: series drawn across {n} pixel columns (screenshot {out_png})")
    if n < min_columns:
        raise SystemExit(f"the graph of {benchmark} draws no line ({n} columns with a series < {min_columns})")
    return n


def main(argv=None):
    p = argparse.ArgumentParser(prog="./run.sh history", description=__doc__.split("\n\n")[0])
    p.add_argument("n", nargs="?", type=int, default=10, help="how many commits of main (default 10)")
    p.add_argument("--branch", default="main")
    p.add_argument("--full", action="store_true", help="every case, not the quick set (hours)")
    p.add_argument("--check-only", action="store_true",
                   help="publish, compare and check the graphs of the results already saved")
    a = p.parse_args(argv)
    if a.n < 2:
        p.error("N must be at least 2: a graph needs two commits")

    name = machine_name()
    hashes = commits(a.n, a.branch)
    oldest, newest = hashes[-1], hashes[0]
    print(f"machine {name}: {len(hashes)} commits of {a.branch}, {oldest[:8]} .. {newest[:8]}")
    env = dict(os.environ)
    if not a.full:
        env["NK_ASV_QUICK"] = "1"
    failed = []
    if not a.check_only:
        _asv("machine", "--yes", "--machine", name)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(hashes) + "\n")
            hashfile = f.name
        try:
            # --skip-existing-successful: commits measured before on this machine are kept;
            # no --quick: it would not save the results
            proc = _asv("run", "--machine", name, "--skip-existing-successful",
                        "--show-stderr", f"HASHFILE:{hashfile}", env=env, check=False)
        finally:
            os.unlink(hashfile)
        if proc.returncode != 0:
            # asv exits non-zero when any benchmark of any commit failed; the published
            # graphs still hold every commit that ran, so go on and say so at the end
            failed.append(f"asv run exited {proc.returncode} (a benchmark or a build failed; see above)")
    _asv("publish")
    html = os.path.join(ROOT, ".asv", "html")
    subprocess.run([sys.executable, "-m", "bench.asv_html", "--html-dir", html,
                    "--cache", os.path.join(ROOT, ".asv", "vendor")], cwd=ROOT, check=True)
    print(f"\n== asv compare {oldest[:8]} (oldest) {newest[:8]} (newest), machine {name}")
    cmp = _asv("compare", "--machine", name, "--split", oldest, newest, check=False, capture=True)
    # rows of parameters that never run on this machine (cuda without a GPU, the cases the
    # quick set skips) read "n/a | n/a": left out
    rows = [ln for ln in cmp.stdout.splitlines() if not re.search(r"\|\s*n/a\s*\|\s*n/a\s*\|", ln)]
    print("\n".join(rows))
    os.makedirs(os.path.join(ROOT, "bench_out"), exist_ok=True)
    render_check(html, os.path.join(ROOT, "bench_out", "asv_history.png"))
    print(f"site: {html}/index.html (renders offline; open it with a browser, or serve it with "
          f"`python -m http.server -d {os.path.relpath(html, ROOT)}`)")
    if failed:
        print("\n".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
