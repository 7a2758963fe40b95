#!/bin/sh
# Writes the lock that packaging/lock/install.sh installs from, with pip-tools' pip-compile:
#   runtime.txt  pyproject.toml's dependencies and its extra "fleet" (corehandler-fleet's), and all of theirs:
#                what goes into corehandler's environment
#   build.txt    the build backends that make wheels of them: pyproject.toml's build-system requires
#                (scikit-build-core) and setuptools, for the dependencies PyPI has only as source
# Each pin carries the sha256 of every file PyPI has for that version (every platform's wheel and the sdist).
#   packaging/lock/update.sh              keeps the pins there are and adds what is new (a new dependency)
#   packaging/lock/update.sh --upgrade    moves every pin to the newest version: run the whole suite on them,
#                                         since they are what setup and the package install, and raise
#                                         debian/copyright's versions (tests/local/test_packaging_files.py)
# Needs PyPI; it asks no other index, whatever pip's configuration says, so that the hashes are PyPI's.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/corehandler-lock.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS
# What the header of each file says made it.
export CUSTOM_COMPILE_COMMAND=packaging/lock/update.sh

/usr/bin/python3 -m venv "$work/tools"
"$work/tools/bin/pip" install --quiet --index-url https://pypi.org/simple pip-tools
compile() {
    "$work/tools/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
        --no-emit-find-links --index-url https://pypi.org/simple "$@"
}
cd "$root"
compile "$@" --extra fleet --output-file packaging/lock/runtime.txt pyproject.toml
# build.in is written in the work directory, so that the lock's "via" comments name it without that path.
"$work/tools/bin/python" - >"$work/build.in" <<'PY'
import tomllib
print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], "setuptools", sep="\n")
PY
(cd "$work" && compile "$@" --output-file "$root/packaging/lock/build.txt" build.in)
