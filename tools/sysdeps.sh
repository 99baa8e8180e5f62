#!/bin/sh
# The Debian packages hetero needs, named in this one place: `make run` and `make test` (and so
# .ci/run) call this before anything else.
#
#   tools/sysdeps.sh run    what serving the default policy needs (espeak-ng for text-to-speech)
#   tools/sysdeps.sh test   what the tests start: redis-server, a SoftHSM2 token, containerd,
#                           Prometheus and promtool (the dashboard test), systemd-analyze
#                           (the systemd unit's check),
#                           sandboxes under runc, containerd's runc shim, gVisor and bubblewrap;
#                           gcc, the C library's and the Python headers (libc6-dev,
#                           python3-dev) for the feature cache's compiled modules
#                           (tools/build_native.py), whose import is tested
#
# Both also need python3-venv while the venv ($VENV, default .venv) does not exist yet: Debian
# ships ensurepip, which `$PYTHON -m venv` needs (PYTHON, default python3), in that package.
#
# Everything present: exit 0 at once, no apt-get. Something missing: as root on Debian or
# Ubuntu, install the packages with apt-get; otherwise print one line naming the packages and
# the command to run, and exit 1. HETERO_SYSDEPS_INSTALL=0 never installs, only reports.
set -eu

# program:package
run_needs="espeak-ng:espeak-ng"
test_needs="redis-server:redis-server softhsm2-util:softhsm2 runc:runc containerd:containerd
busybox:busybox-static newuidmap:uidmap runsc:runsc bwrap:bubblewrap espeak-ng:espeak-ng
prometheus:prometheus systemd-analyze:systemd gcc:gcc"

mode=${1:-}
case "$mode" in
run) needs=$run_needs ;;
test) needs=$test_needs ;;
*)
    echo "usage: $0 run|test" >&2
    exit 2
    ;;
esac
case "${HETERO_SYSDEPS_INSTALL:-1}" in
1) install=1 ;;
0) install=0 ;;
*)
    echo "HETERO_SYSDEPS_INSTALL: expected 0 or 1, got '$HETERO_SYSDEPS_INSTALL'" >&2
    exit 2
    ;;
esac

# The packages whose program is not on PATH (or python3-venv), space-separated.
missing_packages() {
    missing=""
    for entry in $needs; do
        command -v "${entry%%:*}" >/dev/null 2>&1 || missing="$missing ${entry#*:}"
    done
    if [ ! -x "${VENV:-.venv}/bin/python" ] &&
        ! "${PYTHON:-python3}" -c "import ensurepip" >/dev/null 2>&1; then
        missing="$missing python3-venv"
    fi
    if [ "$mode" = test ] && ! "${PYTHON:-python3}" -c "import os, sysconfig
raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
        >/dev/null 2>&1; then
        missing="$missing python3-dev"
    fi
    # gcc only recommends the C library's headers, which --no-install-recommends leaves out.
    [ "$mode" = test ] && [ ! -f /usr/include/stdio.h ] && missing="$missing libc6-dev"
    echo "${missing# }"
}

missing=$(missing_packages)
[ -z "$missing" ] && exit 0

command="apt-get install -y --no-install-recommends $missing"
if [ "$install" = 1 ] && [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
    echo "make $1: installing Debian packages: $missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # $missing unquoted: one argument per package. dpkg's progress is dropped, errors are not.
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 $missing >/dev/null
    still=$(missing_packages)
    [ -z "$still" ] && exit 0
    echo "make $1: after apt-get, still missing: $still (programs are looked up on PATH," \
        "python3-venv as ensurepip in ${PYTHON:-python3}, python3-dev as its Python.h)" >&2
    exit 1
fi
[ "$(id -u)" = 0 ] || command="sudo $command"
echo "make $1 needs Debian packages that are missing: $missing; install them with: $command" >&2
exit 1
