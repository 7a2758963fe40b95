#!/bin/sh
# Builds the corehandler Debian package from this source tree into OUTDIR (default: dist/deb):
#   packaging/deb/build.sh [OUTDIR]
# It builds in a copy under a temporary directory, since dpkg-buildpackage writes next to the source tree,
# and needs network access to PyPI only (the private virtualenv's dependencies, hash-checked against
# packaging/lock/; see install-venv.sh).
# Build dependencies: apt-get install --no-install-recommends debhelper dpkg-dev cmake gcc libsystemd-dev
# pkg-config python3-dev python3-venv (the list in debian/control).
set -eu

src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$src/dist/deb}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/corehandler-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT

mkdir "$work/corehandler"
if [ -d "$src/.git" ] || [ -f "$src/.git" ]; then
    # What is committed or staged, not the build leftovers of a working tree.
    (cd "$src" && git ls-files -z --cached --others --exclude-standard |
        xargs -0 cp --parents -P -t "$work/corehandler")
else
    cp -a "$src/." "$work/corehandler/"
fi
(cd "$work/corehandler" && dpkg-buildpackage -b -us -uc -j2 >"$work/build.log" 2>&1) || {
    tail -n 60 "$work/build.log" >&2
    echo "build.sh: dpkg-buildpackage failed (last lines above)" >&2
    exit 1
}
for file in "$work"/*.deb "$work"/*.ddeb "$work"/*.buildinfo "$work"/*.changes; do
    [ -e "$file" ] && cp "$file" "$out/"
done
ls "$out"/corehandler_*.deb
