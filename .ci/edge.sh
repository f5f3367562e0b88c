#!/usr/bin/env bash
# ./run.sh edge [--workers N] [OP ...]: every CPU implementation of every op on aarch64,
# under qemu-user emulation, against the float64 references (tests/edge_run.py).
#
# What it needs (it says so and stops where something is missing):
#   - root: it mounts binfmt_misc, registers the qemu-aarch64 handler, runs debootstrap and
#     chroots into the arm64 root;
#   - Debian's qemu-user-static and debootstrap packages (installed with apt-get when missing,
#     unless EDGE_NO_APT=1);
#   - the network for the first run only: Debian's mirror (debootstrap, ~5 min) and PyPI
#     (numba, numpy, ml_dtypes as aarch64 wheels, ~2 min).
# The arm64 root is kept and reused: $EDGE_ROOT, by default /var/tmp/numba-ml-edge/root
# (outside the repository; delete it to rebuild).  The project is copied into it
# (/opt/project, the tracked and untracked-but-not-ignored files of this checkout) and
# installed editable into its venv (/opt/edge-venv) on every run.  numba's cache inside the
# root is emptied before each run, so every first call compiles (first-call times are
# emulated compile times); EDGE_KEEP_CACHE=1 keeps it for quick reruns.
# Arguments go to tests/edge_run.py: op names to run only those, --workers N (2 is a good
# choice on a 2-core machine: each first call is a single-threaded emulated compilation).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
ROOT=${EDGE_ROOT:-/var/tmp/numba-ml-edge/root}
SUITE=${EDGE_SUITE:-bookworm}
MIRROR=${EDGE_MIRROR:-http://deb.debian.org/debian}
VENV=/opt/edge-venv
PKGS="python3,python3-venv,python3-pip,ca-certificates,libgomp1"

die() { echo "edge: $*" >&2; exit 2; }

[ "$(uname -m)" = aarch64 ] && die "this host is aarch64 already: run '.venv/bin/python -m tests.edge_run' directly"
[ "$(id -u)" = 0 ] || die "needs root (binfmt_misc registration, debootstrap, chroot): run 'sudo ./run.sh edge'"

# ---- the Debian packages ------------------------------------------------------------------
QEMU=$(command -v qemu-aarch64-static || true)
if [ -z "$QEMU" ] || ! command -v debootstrap >/dev/null; then
    if [ "${EDGE_NO_APT:-0}" != 1 ] && command -v apt-get >/dev/null; then
        echo "edge: installing qemu-user-static, debootstrap (apt-get)" >&2
        apt-get install -y -q qemu-user-static debootstrap >/dev/null \
            || { apt-get update -q >/dev/null && apt-get install -y -q qemu-user-static debootstrap >/dev/null; } \
            || die "apt-get could not install qemu-user-static and debootstrap"
        QEMU=$(command -v qemu-aarch64-static || true)
    fi
    [ -n "$QEMU" ] && command -v debootstrap >/dev/null \
        || die "needs the Debian packages qemu-user-static and debootstrap (apt-get install qemu-user-static debootstrap)"
fi

# ---- binfmt_misc: aarch64 ELF files run through qemu-aarch64 ------------------------------
BINFMT=/proc/sys/fs/binfmt_misc
if [ ! -e $BINFMT/register ]; then
    mount -t binfmt_misc binfmt_misc $BINFMT 2>/dev/null \
        || die "cannot mount binfmt_misc at $BINFMT (a container needs --privileged, or the host's binfmt_misc)"
fi
if [ ! -e $BINFMT/qemu-aarch64 ]; then
    # Debian's own registration line (flag F: the interpreter is opened now, so it works
    # inside the chroot without a copy), else the same magic and mask written out here
    conf=/usr/lib/binfmt.d/qemu-aarch64.conf
    if [ -f $conf ]; then
        line=$(grep -v '^#' $conf | head -1)
    else
        line=':qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:'"$QEMU"':OPF'
    fi
    printf '%s' "$line" > $BINFMT/register 2>/dev/null || die "could not register qemu-aarch64 in $BINFMT/register"
fi
grep -q enabled $BINFMT/qemu-aarch64 || die "the qemu-aarch64 binfmt handler is registered but disabled ($BINFMT/qemu-aarch64)"

# ---- the arm64 Debian root (built once) ---------------------------------------------------
if [ ! -f "$ROOT/.edge-root-ready" ]; then
    echo "edge: building the arm64 Debian root in $ROOT (debootstrap $SUITE, a few minutes; reused later)" >&2
    rm -rf "$ROOT.tmp"
    mkdir -p "$(dirname "$ROOT")"
    nice -n 19 debootstrap --arch=arm64 --variant=minbase --include="$PKGS" "$SUITE" "$ROOT.tmp" "$MIRROR" \
        > "$ROOT.debootstrap.log" 2>&1 || die "debootstrap failed: see $ROOT.debootstrap.log"
    cp "$QEMU" "$ROOT.tmp/usr/bin/"  # for a handler registered without flag F
    rm -rf "$ROOT" && mv "$ROOT.tmp" "$ROOT" && touch "$ROOT/.edge-root-ready"
fi

# ---- mounts for the run (undone on exit) --------------------------------------------------
MOUNTED=()
cleanup() {
    local i
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTED[$i]}" 2>/dev/null || umount -l "${MOUNTED[$i]}" 2>/dev/null || true
    done
}
trap cleanup EXIT
mnt() { mount "$@" && MOUNTED+=("${@: -1}"); }
mountpoint -q "$ROOT/proc" || mnt -t proc proc "$ROOT/proc"
mountpoint -q "$ROOT/dev" || mnt --bind /dev "$ROOT/dev"
mkdir -p "$ROOT/dev/shm"
mountpoint -q "$ROOT/dev/shm" || mnt -t tmpfs shm "$ROOT/dev/shm"   # multiprocessing's semaphores
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
# the host's CA bundle for pip (where the network's proxy has its own CA)
HOST_CA=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
[ -f "$HOST_CA" ] && cp "$HOST_CA" "$ROOT/etc/ssl/edge-host-ca.crt"

in_root() {
    chroot "$ROOT" /usr/bin/env -i PATH=/opt/edge-venv/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        PIP_CERT=/etc/ssl/edge-host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 \
        NUMBA_CACHE_DIR=/var/cache/numba-edge "$@"
}
in_root /bin/true 2>/dev/null || die "cannot run aarch64 programs in $ROOT (binfmt handler not working?)"
[ -e "$ROOT/usr/lib/aarch64-linux-gnu/libgomp.so.1" ] || {
    echo "edge: installing libgomp1 in the root (numba's omp threading layer)" >&2
    in_root apt-get install -y -q libgomp1 >/dev/null || echo "edge: note: no libgomp1; numba will use its workqueue layer" >&2
}

# ---- the project and its dependencies -----------------------------------------------------
NUMBA_V=$(.venv/bin/python -c "import numba; print(numba.__version__)" 2>/dev/null || true)
NUMPY_V=$(.venv/bin/python -c "import numpy; print(numpy.__version__)" 2>/dev/null || true)
REQS="numba${NUMBA_V:+==$NUMBA_V} numpy${NUMPY_V:+==$NUMPY_V} ml_dtypes wheel"  # wheel: the editable install below
if [ "$(cat "$ROOT$VENV/.edge-reqs" 2>/dev/null)" != "$REQS" ]; then
    echo "edge: installing $REQS in the root (aarch64 wheels from PyPI)" >&2
    [ -x "$ROOT$VENV/bin/python" ] || in_root python3 -m venv $VENV
    in_root nice -n 19 $VENV/bin/python -m pip install -q $REQS || die "pip install $REQS failed in the root"
    echo "$REQS" > "$ROOT$VENV/.edge-reqs"
fi
rm -rf "$ROOT/opt/project" && mkdir -p "$ROOT/opt/project"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$ROOT/opt/project"
if [ ! -f "$ROOT$VENV/.edge-project" ]; then  # editable: the copy refreshed above is what runs
    in_root nice -n 19 $VENV/bin/python -m pip install -q --no-deps --no-build-isolation -e /opt/project \
        || die "pip install -e /opt/project failed in the root"
    touch "$ROOT$VENV/.edge-project"
fi
[ "${EDGE_KEEP_CACHE:-0}" = 1 ] || rm -rf "$ROOT/var/cache/numba-edge"

echo "edge: running tests/edge_run.py on aarch64 under qemu-user ($ROOT)" >&2
start=$(date +%s)
set +e
ARGS=""
[ $# -gt 0 ] && ARGS=$(printf '%q ' "$@")
in_root nice -n 19 /bin/sh -c "cd /opt/project && exec $VENV/bin/python -m tests.edge_run $ARGS"
rc=$?
set -e
echo "edge: total $(( $(date +%s) - start )) s (emulated aarch64 on $(uname -m); not device times)" >&2
exit $rc
