#!/bin/sh
# Builds the package of a past commit (by default the previous release's, packaging/deb/previous-release) once
# and keeps it in CACHE/COMMIT/ (default ~/.cache/corehandler-deb): the deb tier's upgrades start from it.
#   packaging/deb/build-commit.sh [COMMIT] [CACHE]
# Prints the .deb's path. The build runs in a git worktree of that commit with that commit's build.sh, so the
# package is what that release shipped, not this tree's packaging applied to old code.
set -eu

src=$(cd "$(dirname "$0")/../.." && pwd)
commit=${1:-$(sed -n '/^[0-9a-f]\{40\}$/p' "$src/packaging/deb/previous-release")}
cache=${2:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/corehandler-deb}
commit=$(git -C "$src" rev-parse --verify "$commit^{commit}")
dir=$cache/$commit
if ! ls "$dir"/corehandler_*.deb >/dev/null 2>&1; then
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/.build.XXXXXX")
    trap 'git -C "$src" worktree remove --force "$work/tree" 2>/dev/null || true; rm -rf "$work"' EXIT
    git -C "$src" worktree add --detach "$work/tree" "$commit" >/dev/null 2>&1
    "$work/tree/packaging/deb/build.sh" "$work/out" >/dev/null
    # Complete or not at all: a run killed mid-build leaves no half of a cache entry.
    mv "$work/out" "$dir"
fi
ls "$dir"/corehandler_*.deb | grep -v dbgsym
