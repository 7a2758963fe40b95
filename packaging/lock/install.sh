#!/bin/sh
# Installs this tree's corehandler into the virtualenv VENV with exactly the Python packages it was tested with,
# from the lock beside this script (scripts/venv for scripts/setup and the tests; packaging/deb/install-venv.sh
# for the Debian package). Run from the source root:
#   packaging/lock/install.sh [--no-compile] VENV [OPTIONS FOR BUILDING corehandler'S WHEEL...]
# Nothing reaches VENV unchecked:
#   1. a throwaway build environment gets the build backends of build.txt, each file checked against the sha256
#      the lock names (pip's hash-checking mode);
#   2. the dependencies of runtime.txt are fetched and checked the same way; one that PyPI has only as source
#      (systemd-python) is built by the checked setuptools without build isolation, since an isolated build
#      would fetch its backend unpinned and unchecked;
#   3. corehandler's own wheel is built from this tree by the checked scikit-build-core and Debian's cmake;
#   4. VENV gets those wheels and nothing else (--no-index), and `pip check` confirms that they satisfy what
#      corehandler declares.
# packaging/lock/update.sh writes the lock.
set -eu

compile=--compile
if [ "${1:-}" = --no-compile ]; then
    compile=--no-compile
    shift
fi
venv=${1:?usage: packaging/lock/install.sh [--no-compile] VENV [WHEEL BUILD OPTIONS...]}
shift
lock=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/corehandler-lock.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Made by VENV's interpreter: the build environment is the Python the wheels are for. Its pip (and the
# setuptools that ensurepip brings, replaced from build.txt) is Debian's, from python3-venv.
"$venv/bin/python3" -m venv "$work/build"
pip() { "$work/build/bin/python3" -m pip --quiet --disable-pip-version-check --no-input "$@"; }
pip install --require-hashes -r "$lock/build.txt"
pip wheel --require-hashes --no-build-isolation --use-pep517 --wheel-dir "$work/wheels" -r "$lock/runtime.txt"
pip wheel --no-build-isolation --no-deps --no-index --wheel-dir "$work/own" "$@" .
"$lock/pins.sh" "$lock/runtime.txt" >"$work/pins.txt"
into() { pip --python "$venv/bin/python3" "$@"; }
into install --no-warn-script-location "$compile" --no-index --find-links "$work/wheels" -r "$work/pins.txt"
# The same version number may hold other code (a rebuilt tree): corehandler itself is always replaced.
into install --no-warn-script-location "$compile" --no-index --no-deps --force-reinstall "$work"/own/corehandler-*.whl
into check
