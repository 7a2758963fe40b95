#!/bin/sh
# Installs corehandler into DESTDIR and its fleet's libraries into FLEET_DESTDIR as the Debian packages
# corehandler and corehandler-fleet lay them out (run by debian/rules, from the source root):
#   install-venv.sh DESTDIR FLEET_DESTDIR
#   /usr/lib/corehandler/            a private virtualenv on Debian's python3.X holding corehandler and its
#                                    dependencies from PyPI (Debian 12's python3-pydantic is v1; we need v2)
#   /usr/lib/corehandler/fleet/site-packages/
#                                    corehandler-fleet's: the distributions only uploads and the fleet view
#                                    need (pyproject.toml's extra "fleet": boto3, pyarrow, duckdb, pyrage and
#                                    theirs), moved there from the virtualenv by split-fleet.py, and put on
#                                    its sys.path by corehandler-fleet.pth in its site-packages
#   /usr/libexec/corehandler/        csplice, built and installed there by CMake; the path core_pattern
#                                    names, short and outside the virtualenv (the wheel built for the
#                                    virtualenv carries no csplice, only that path: CMakeLists.txt)
#   /usr/bin/corehandler             a wrapper running the CLI with that interpreter
# The virtualenv gets exactly the Python packages of packaging/lock/, each checked against its hash
# (packaging/lock/install.sh), so a rebuild ships what was tested.
set -eu

destdir=$1
fleet_destdir=${2:?usage: packaging/deb/install-venv.sh DESTDIR FLEET_DESTDIR}
prefix=/usr/lib/corehandler
fleet=$prefix/fleet/site-packages
libexec=/usr/libexec/corehandler
# The release's python3.X (debian/rules exports PY): bookworm's 3.11, trixie's 3.13.
python=/usr/bin/${PY:-python3.11}
venv=$destdir$prefix

rm -rf "$venv" "$destdir$libexec" "$fleet_destdir$prefix"
# No pip in the package: the lock's installer drives the private interpreter from outside.
"$python" -m venv --without-pip "$venv"
packaging/lock/install.sh --no-compile "$venv" --config-settings=cmake.define.CSPLICE_LIBEXEC_DIR=$libexec
site=$(echo "$venv"/lib/python3*/site-packages)
"$venv/bin/python3" packaging/deb/split-fleet.py "$site" "$fleet_destdir$fleet" >/dev/null
# Read by the private interpreter at start: the fleet's directory joins sys.path where the package is installed.
install -d "$fleet_destdir${site#"$destdir"}"
echo "$fleet" > "$fleet_destdir${site#"$destdir"}/corehandler-fleet.pth"

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
find "$venv" "$fleet_destdir$prefix" -name direct_url.json -delete
find "$venv" "$fleet_destdir$prefix" -name __pycache__ -type d -prune -exec rm -rf {} +
if grep -rIl -e "$destdir" -e "$fleet_destdir" "$venv" "$destdir$libexec" "$fleet_destdir$prefix"; then
    echo "install-venv.sh: the files above still name a build directory ($destdir, $fleet_destdir)" >&2
    exit 1
fi

install -D -m 0755 packaging/deb/corehandler.sh "$destdir/usr/bin/corehandler"
