#!/bin/sh
# Builds the package for one Debian release in a fresh root of that release (mmdebstrap, as root), so that it
# depends on that release's python3.X and ships wheels for it:
#   packaging/deb/build-in-root.sh SUITE [OUTDIR]       # e.g. trixie; OUTDIR default dist/deb/SUITE
# The root gets debian/control's build dependencies; the build itself is packaging/deb/build.sh's (network
# access to PyPI for the lock's hash-checked files). Debian's downloads are kept in ~/.cache/corehandler-deb.
set -eu

src=$(cd "$(dirname "$0")/../.." && pwd)
suite=${1:?usage: packaging/deb/build-in-root.sh SUITE [OUTDIR]}
out=${2:-$src/dist/deb/$suite}
mirror=${COREHANDLER_DEB_MIRROR:-http://deb.debian.org/debian}
cache=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/corehandler-deb/archives/$suite-build
[ "$(id -u)" = 0 ] || { echo "build-in-root.sh: mmdebstrap builds the root as root" >&2; exit 1; }
# pip in the root trusts what this host's pip trusts (a proxy's CA where there is one).
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
mkdir -p "$out" "$cache"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/corehandler-root-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# What is committed or staged, as build.sh takes it.
mkdir "$work/src"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -P -t "$work/src")
depends=$(sed -n '/^Build-Depends:/,/^[A-Z]/p' "$src/debian/control" | sed '1s/^Build-Depends://; /^[A-Z]/d' |
    tr -d ' \n' | sed 's/([^)]*)//g; s/,$//')
mmdebstrap --mode=root --variant=apt --include="build-essential,dpkg-dev,$depends" \
    --aptopt='Acquire::Languages "none"' --skip=essential/unlink \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
    --setup-hook="sync-in '$cache' /var/cache/apt/archives/" \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/partial' \
    --customize-hook="sync-out /var/cache/apt/archives '$cache'" \
    --customize-hook='mkdir -p "$1"/build' --customize-hook="copy-in '$work/src' /build" \
    --customize-hook="upload '$ca' /build/ca.crt" \
    --customize-hook='chroot "$1" sh -c "cd /build/src && env -u PIP_FIND_LINKS HOME=/root PIP_CERT=/build/ca.crt SSL_CERT_FILE=/build/ca.crt REQUESTS_CA_BUNDLE=/build/ca.crt packaging/deb/build.sh /build/out"' \
    --customize-hook="sync-out /build/out '$out'" \
    "$suite" /dev/null "deb $mirror $suite main" 2>"$work/mmdebstrap.log" || {
        tail -n 60 "$work/mmdebstrap.log" >&2
        echo "build-in-root.sh: the $suite build failed (last lines above)" >&2
        exit 1
    }
ls "$out"/corehandler_*.deb
