#!/bin/sh
# corehandler's CLI and daemon run in the package's private Python environment. csplice lives where
# kernel.core_pattern names it, outside that environment.
COREHANDLER_LIBEXEC=${COREHANDLER_LIBEXEC:-/usr/libexec/corehandler}
export COREHANDLER_LIBEXEC
exec /usr/lib/corehandler/bin/python3 -m corehandler "$@"
