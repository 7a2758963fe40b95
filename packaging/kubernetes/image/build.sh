#!/bin/sh
# Builds the node agent's image (docs/kubernetes.md) from Debian packages and this tree, in one command:
#   packaging/kubernetes/image/build.sh [--out DIR] [--name NAME] [--deb FILE] [--cache DIR] [--no-load]
# 1. the Debian packages corehandler and corehandler-fleet (packaging/deb/build.sh; --deb FILE takes a
#    corehandler_*.deb built already, and the corehandler-fleet_*.deb of the same build beside it);
# 2. csplice for the host, linked statically (CSPLICE_STATIC): the kernel runs it on the node, whose libc is
#    not the image's;
# 3. a Debian 12 root filesystem with mmdebstrap (bookworm, the packages below and that .deb; as root), the
#    static csplice at /usr/libexec/corehandler/csplice-static;
# 4. DIR/corehandler-VERSION.oci.tar (default DIR: dist/image), an OCI archive for `ctr -n k8s.io images
#    import` and `kind load image-archive` (oci.py), loaded into podman as NAME (default
#    localhost/corehandler:VERSION) unless --no-load or podman is absent.
# Reproducible: SOURCE_DATE_EPOCH (default: the last commit's time) fixes every time stamp, so the same .deb
# and the same state of the archive give the same archive, byte for byte. Needs: mmdebstrap, cmake, gcc,
# libc6-dev (scripts/apt/test.txt), the .deb's build dependencies, network access to Debian's archive (and PyPI
# for the .deb). Downloaded packages are kept in --cache DIR (default ~/.cache/corehandler-image) for the next
# build.
set -eu

src=$(cd "$(dirname "$0")/../../.." && pwd)
here=$src/packaging/kubernetes/image
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$src/pyproject.toml" | head -n 1)
out=$src/dist/image
name=localhost/corehandler:$version
deb=
cache=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/corehandler-image
load=yes
suite=bookworm
mirror=${COREHANDLER_IMAGE_MIRROR:-http://deb.debian.org/debian}
security=${COREHANDLER_IMAGE_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# What the agent runs beside the package's own dependencies: eu-stack (analysis), useradd (the analyser's
# user, made by the package's postinst), the CAs for https uploads.
packages=elfutils,passwd,ca-certificates

usage() { sed -n '2,3p' "$0" | sed 's/^# //' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --out) out=$2; shift 2 ;;
        --name) name=$2; shift 2 ;;
        --deb) deb=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
        --cache) cache=$2; shift 2 ;;
        --no-load) load=no; shift ;;
        *) usage ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "build.sh: mmdebstrap builds the root filesystem as root" >&2; exit 1; }
for tool in mmdebstrap cmake gcc; do
    command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$src" log -1 --format=%ct 2>/dev/null || stat -c %Y "$src/pyproject.toml")
fi
export SOURCE_DATE_EPOCH
mkdir -p "$out" "$cache/debs"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/corehandler-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ -z "$deb" ]; then
    echo "build.sh: building the Debian package" >&2
    "$src/packaging/deb/build.sh" "$work/deb" >/dev/null
    deb=$(ls "$work"/deb/corehandler_*.deb)
fi

echo "build.sh: building csplice, statically linked" >&2
# No path of this build in the binary, so that it does not depend on where the build ran.
cmake -S "$src" -B "$work/static" -DCSPLICE_STATIC=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="-ffile-prefix-map=$src=. -ffile-prefix-map=$work=." >/dev/null
cmake --build "$work/static" --target csplice -j2 >/dev/null
static=$work/static/csplice/csplice
if ldd "$static" >/dev/null 2>&1; then
    echo "build.sh: $static is not statically linked" >&2
    exit 1
fi

echo "build.sh: building the root filesystem (Debian $suite)" >&2
cp "$deb" "$work/corehandler.deb"
# The node agent uploads to the fleet's bucket: corehandler-fleet, built beside corehandler, goes in too.
fleet_deb=$(dirname "$deb")/$(basename "$deb" | sed 's/^corehandler_/corehandler-fleet_/')
[ -f "$fleet_deb" ] || { echo "build.sh: no $fleet_deb beside $deb" >&2; exit 1; }
cp "$fleet_deb" "$work/corehandler-fleet.deb"
# The cache's packages go in before apt runs and come back out after, as mmdebstrap(1) shows; the .deb is put
# at its own path inside for dpkg (file-mirror-automount); documentation, man pages and translations stay out
# of the image (copyright files stay).
mmdebstrap --mode=root --variant=apt --include="$packages" --include="$work/corehandler.deb" \
    --include="$work/corehandler-fleet.deb" --verbose \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount --skip=essential/unlink \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
    --setup-hook="sync-in '$cache/debs' /var/cache/apt/archives/" \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/partial' \
    --customize-hook="sync-out /var/cache/apt/archives '$cache/debs'" \
    --customize-hook="upload '$static' /usr/libexec/corehandler/csplice-static" \
    --customize-hook='chmod 0755 "$1"/usr/libexec/corehandler/csplice-static' \
    --customize-hook=': > "$1"/etc/resolv.conf; echo corehandler > "$1"/etc/hostname' \
    "$suite" "$work/rootfs.tar" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main" \
    2>"$work/mmdebstrap.log" || { tail -n 40 "$work/mmdebstrap.log" >&2; exit 1; }

# The package's postinst must have seen a chroot, or it took the build host's core_pattern.
if ! grep -q "corehandler: in a chroot: the kernel's core_pattern was not changed" "$work/mmdebstrap.log"; then
    echo "build.sh: the package's postinst did not see a chroot: check this host's kernel.core_pattern" >&2
    exit 1
fi

archive=$out/corehandler-$version.oci.tar
sizes=$(python3 "$here/oci.py" "$work/rootfs.tar" "$archive" --name "$name" --entrypoint /usr/bin/corehandler \
    --label "org.opencontainers.image.version=$version" --label "org.opencontainers.image.title=corehandler")
if [ "$load" = yes ] && command -v podman >/dev/null; then
    podman load -q -i "$archive" >/dev/null
fi
python3 - "$sizes" "$archive" "$load" <<'PY'
import json, sys
s = json.loads(sys.argv[1])
mib = lambda n: f"{n / 2**20:.0f} MiB"
print(f"{s['name']}: {mib(s['rootfs_bytes'])} unpacked, {mib(s['archive_bytes'])} as {sys.argv[2]} "
      f"(manifest {s['manifest']})" + ("" if sys.argv[3] == "no" else "; loaded into podman"))
PY
