#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Builds the two kernels of the qemu matrix from Debian's linux-source-6.1: "stock" and "patched" (with the
# COREDUMP_USE_PIPE vmsplice patch, see README.md; the kernel's code, not ours, so it is passed in, never copied).
#
#   tests/kernel/build-kernels.sh [--patch FILE] [--cache DIR] [--jobs N] [stock|patched ...]
#
# Environment (the options win): COREHANDLER_KERNEL_PATCH (default: ../shared/kernel/coredump-vmsplice-6.1.patch
# next to the repository), COREHANDLER_KERNEL_CACHE (default: ${XDG_CACHE_HOME:-~/.cache}/corehandler/kernel),
# KERNEL_SOURCE (default: /usr/src/linux-source-6.1.tar.xz, from `apt-get install linux-source-6.1`).
#
# Each flavour goes from `make tinyconfig` + tests/kernel/kconfig.fragment (merge_config.sh -m, olddefconfig) to
# CACHE/bzImage-FLAVOUR, CACHE/System.map-FLAVOUR and CACHE/config-FLAVOUR. CACHE/stamp-FLAVOUR holds the hashes
# of source, patch, fragment and this script: a flavour is rebuilt only when one of them changed. A build proves
# which kernel it made: vmsplice_to_pipe must be a global (T) symbol in the patched System.map and must not be
# one in the stock System.map.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
patch=${COREHANDLER_KERNEL_PATCH:-$repo/../shared/kernel/coredump-vmsplice-6.1.patch}
cache=${COREHANDLER_KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corehandler/kernel}
source_tar=${KERNEL_SOURCE:-/usr/src/linux-source-6.1.tar.xz}
fragment=$here/kconfig.fragment
jobs=2
flavours=()

die() { echo "build-kernels: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --patch) patch=$2; shift 2 ;;
        --cache) cache=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        stock|patched) flavours+=("$1"); shift ;;
        -h|--help) sed -n '4,17p' "$0"; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[ ${#flavours[@]} -gt 0 ] || flavours=(stock patched)

[ -r "$source_tar" ] || die "no kernel source at $source_tar: apt-get install linux-source-6.1"
[ -r "$fragment" ] || die "no config fragment at $fragment"
for f in "${flavours[@]}"; do
    [ "$f" = stock ] || [ -r "$patch" ] || die "no patch at $patch: pass --patch FILE or COREHANDLER_KERNEL_PATCH"
done
mkdir -p "$cache"
chmod 0700 "$cache"

hash_of() { sha256sum "$1" | cut -d' ' -f1; }

stamp_for() {
    local flavour=$1
    echo "source $source_hash"
    echo "fragment $(hash_of "$fragment")"
    echo "script $(hash_of "$0")"
    if [ "$flavour" = patched ]; then echo "patch $(hash_of "$patch")"; fi
}

# Every line of the fragment must survive olddefconfig: a dependency that silently drops an option would give
# a kernel that boots but cannot dump (or cannot be told apart).
check_config() {
    local config=$1 line name missing=0
    while IFS= read -r line; do
        case "$line" in
            CONFIG_*=*) grep -qxF "$line" "$config" || { echo "missing from .config: $line" >&2; missing=1; } ;;
            "# CONFIG_"*" is not set")
                name=${line#\# }; name=${name%% *}
                if grep -q "^$name=" "$config"; then echo "should be unset: $name" >&2; missing=1; fi ;;
        esac
    done < "$fragment"
    [ $missing = 0 ] || die "the config fragment did not apply (see above)"
}

check_flavour() {
    local flavour=$1 map=$2
    if [ "$flavour" = patched ]; then
        grep -qE '^[0-9a-f]+ T vmsplice_to_pipe$' "$map" \
            || die "$map: vmsplice_to_pipe is not a global symbol: the patch did not take"
    elif grep -qE '^[0-9a-f]+ T vmsplice_to_pipe$' "$map"; then
        die "$map: vmsplice_to_pipe is global in the stock build: it is patched"
    fi
}

build() {
    local flavour=$1 work=$cache/build-$1 stamp started src
    stamp=$(stamp_for "$flavour")
    if [ -f "$cache/stamp-$flavour" ] && [ -f "$cache/bzImage-$flavour" ] \
        && [ "$(cat "$cache/stamp-$flavour")" = "$stamp" ]; then
        echo "build-kernels: $flavour is up to date in $cache"
        return
    fi
    started=$(date +%s)
    rm -rf "$work" "$cache/stamp-$flavour"
    mkdir -p "$work"
    echo "build-kernels: $flavour: unpacking $source_tar"
    tar -C "$work" -xf "$source_tar"
    src=$(echo "$work"/linux-source-*)
    [ -d "$src" ] || die "unexpected layout in $source_tar"
    if [ "$flavour" = patched ]; then
        echo "build-kernels: patched: applying $patch"
        patch -d "$src" -p1 --forward --batch < "$patch" >/dev/null || die "$patch does not apply to $source_tar"
    fi
    (
        cd "$src"
        make -s tinyconfig
        ./scripts/kconfig/merge_config.sh -m .config "$fragment" >/dev/null
        make -s olddefconfig
    )
    check_config "$src/.config"
    echo "build-kernels: $flavour: make -j$jobs bzImage"
    make -C "$src" -s -j"$jobs" bzImage
    check_flavour "$flavour" "$src/System.map"
    install -m 0644 "$src/arch/x86/boot/bzImage" "$cache/bzImage-$flavour"
    install -m 0644 "$src/System.map" "$cache/System.map-$flavour"
    install -m 0644 "$src/.config" "$cache/config-$flavour"
    echo "$stamp" > "$cache/stamp-$flavour"
    rm -rf "$work"
    echo "build-kernels: $flavour: built in $(( $(date +%s) - started )) s -> $cache/bzImage-$flavour"
}

source_hash=$(hash_of "$source_tar")
for flavour in "${flavours[@]}"; do
    build "$flavour"
done
