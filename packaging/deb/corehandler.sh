#!/bin/sh
# corehandler's CLI and daemon run in the package's private Python environment. csplice lives where
# kernel.core_pattern names it, outside that environment.
exec /usr/lib/corehandler/bin/python3 -m corehandler "$@"
