#!/usr/bin/env bash
# One entry point for a fresh clone: sets up .venv (reused on later runs), then
#   ./run.sh report [args]   the performance report (python -m bench --quick by default)
#   ./run.sh test            CPU tests, CUDA tests under the simulator, PTX compile check,
#                            and the asv smoke run with its HTML render check
#   ./run.sh history [N]     the asv suite (quick set) on the last N commits of main, each in
#                            asv's own virtualenv; publishes the site and compares oldest/newest
#   ./run.sh edge [--workers N] [OP ...]
#                            every CPU implementation on aarch64 under qemu-user emulation, in a
#                            cached arm64 Debian root (root needed; .ci/edge.sh, README "Edge CPUs")
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

setup() {
    if [ ! -x .venv/bin/python ]; then
        "$PY" -m venv .venv
    fi
    if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
        .venv/bin/python -m pip install -q --upgrade pip
        .venv/bin/python -m pip install -q -e ".[test,bench,cuda]"
        # PyTorch CPU is an optional peer in the report; 2.13.0 is a CPU build that this
        # machine kind keeps on disk. Without it the report simply leaves torch out.
        .venv/bin/python -m pip install -q "torch==2.13.0" \
            || echo "note: torch not installed; the report will skip the PyTorch peer"
        touch .venv/.installed
    fi
}

cmd=${1:-}
shift || true
case "$cmd" in
    report)
        setup
        .venv/bin/python -m bench "$@"
        ;;
    test)
        setup
        bash .ci/tests.sh "$@"
        ;;
    history)
        setup
        .venv/bin/python -m bench.history "$@"
        ;;
    edge)
        setup
        bash .ci/edge.sh "$@"
        ;;
    *)
        echo "usage: ./run.sh report [--full ...] | ./run.sh test | ./run.sh history [N] | ./run.sh edge [--workers N] [OP ...]" >&2
        exit 2
        ;;
esac
