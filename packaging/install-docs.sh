#!/bin/sh
# Generates corehandler's man pages (corehandler(1), corehandler.toml(5), csplice(8)) and its bash and zsh
# completion with PYTHON, an interpreter that imports the corehandler being installed, and installs them under
# SHARE: /usr/share for the Debian package (debian/rules), /usr/local/share for scripts/setup. zsh's function
# goes to SHARE/ZSHDIR (zsh/vendor-completions for the package, zsh/site-functions for /usr/local).
#   packaging/install-docs.sh PYTHON SHARE ZSHDIR
set -eu
python=$1
share=$2
zshdir=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/corehandler-docs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$python" -P -m corehandler.cli.manpage "$tmp/man"
for page in "$tmp"/man/*; do
    install -D -m 0644 "$page" "$share/man/man${page##*.}/${page##*/}"
done
"$python" -P -m corehandler.cli.completion bash >"$tmp/corehandler"
install -D -m 0644 "$tmp/corehandler" "$share/bash-completion/completions/corehandler"
"$python" -P -m corehandler.cli.completion zsh >"$tmp/_corehandler"
install -D -m 0644 "$tmp/_corehandler" "$share/$zshdir/_corehandler"
