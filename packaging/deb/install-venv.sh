#!/bin/sh
# Installs corehandler into DESTDIR as the Debian package lays it out (run by debian/rules, from the source
# root):
#   /usr/lib/corehandler/            a private virtualenv on Debian's python3.X holding corehandler and its
#                                    dependencies from PyPI (Debian 12's python3-pydantic is v1; we need v2)
#   /usr/libexec/corehandler/        csplice, built and installed there by CMake; the path core_pattern
#                                    names, short and outside the virtualenv (the wheel built for the
#                                    virtualenv carries no csplice, only that path: CMakeLists.txt)
#   /usr/bin/corehandler             a wrapper running the CLI with that interpreter
# The virtualenv gets exactly the Python packages of packaging/lock/, each checked against its hash
# (packaging/lock/install.sh), so a rebuild ships what was tested.
set -eu

destdir=$1
prefix=/usr/lib/corehandler
libexec=/usr/libexec/corehandler
# The release's python3.X (debian/rules exports PY): bookworm's 3.11, trixie's 3.13.
python=/usr/bin/${PY:-python3.11}
venv=$destdir$prefix

rm -rf "$venv" "$destdir$libexec"
# No pip in the package: the lock's installer drives the private interpreter from outside.
"$python" -m venv --without-pip "$venv"
packaging/lock/install.sh --no-compile "$venv" --config-settings=cmake.define.CSPLICE_LIBEXEC_DIR=$libexec

# csplice on its own, with dpkg's hardening flags from the environment (debian/rules exports them).
cmake -S . -B build/csplice -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
    -DCMAKE_INSTALL_LIBEXECDIR=libexec >/dev/null
cmake --build build/csplice --target csplice -j2
DESTDIR=$destdir cmake --install build/csplice >/dev/null
test -x "$destdir$libexec/csplice"

# The virtualenv was built under DESTDIR: drop what names the build directory (pip's console scripts, which
# /usr/bin/corehandler replaces; the activate scripts; pip's record of where it installed from) and any
# bytecode (compiled on the target by postinst, removed by prerm, as dh_python3 does).
find "$venv/bin" -type f -delete
rm -rf "$venv/include"
# Python 3.13's venv marks itself for git; in a package that is a stray VCS file (lintian).
rm -f "$venv/.gitignore"
sed -i '/^command = /d' "$venv/pyvenv.cfg"
find "$venv" -name direct_url.json -delete
find "$venv" -name __pycache__ -type d -prune -exec rm -rf {} +
if grep -rIl -- "$destdir" "$venv" "$destdir$libexec"; then
    echo "install-venv.sh: the files above still name the build directory $destdir" >&2
    exit 1
fi

install -D -m 0755 packaging/deb/corehandler.sh "$destdir/usr/bin/corehandler"
