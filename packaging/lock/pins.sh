#!/bin/sh
# Prints the pins of a lock file (packaging/lock/*.txt) without their hashes, one `name==version` a line: a
# constraints file for pip, which turns hash-checking on for everything as soon as a constraint has a hash.
#   packaging/lock/pins.sh LOCKFILE
set -eu
sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*==[^ ;\\]*\).*/\1/p' "$1"
