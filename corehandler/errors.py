"""Errors that reach the user: each carries its message and the exit code the CLI returns for it.

Exit codes (stable; scripts rely on them):
  0  success
  1  EXIT_NOMATCH     nothing matched the query (as coredumpctl)
  2  EXIT_USAGE       bad command line (argparse uses it too)
  3  EXIT_CONFIG      the configuration is invalid or unreadable
  4  EXIT_PERMISSION  needs root, the store is not this user's to read, or a path is not safe to trust
                      (writable by others)
  5  EXIT_CONFLICT    another core handler is installed, or the system is not in the state the verb expects
                      (`python -m corehandler.host.supervise status|reload`: the daemon is not running;
                      `dump`, `debug`: the dump's core is still being compressed; `fleet` verbs: the fleet's
                      libraries, the package corehandler-fleet, are not installed)
  6  EXIT_SYSTEM      a system operation failed (sysctl write, filesystem, a helper program), or a stored
                      dump failed verification (info, dump, debug)
  7  EXIT_INDEX_NEWER the index was written by a newer corehandler (a downgrade): nothing reads or migrates it;
                      the daemon exits with it and is not restarted (RestartPreventExitStatus)
  8  EXIT_INDEX_OLDER the index was written by an older corehandler and not migrated yet: the daemon migrates it
                      when it starts, or `corehandler migrate` (read verbs never do)
The CLI prints `corehandler: <message>` on stderr, one line, and exits with the code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_NOMATCH = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_PERMISSION = 4
EXIT_CONFLICT = 5
EXIT_SYSTEM = 6
EXIT_INDEX_NEWER = 7
EXIT_INDEX_OLDER = 8


class CorehandlerError(Exception):
    exit_code = EXIT_SYSTEM

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class NoMatchError(CorehandlerError):
    exit_code = EXIT_NOMATCH


class UsageError(CorehandlerError):
    exit_code = EXIT_USAGE


class ConfigError(CorehandlerError):
    """A configuration problem, located: `file`, `key` (dotted, e.g. capture.max_dump_size) and `value`
    when known; the message names all three."""

    exit_code = EXIT_CONFIG

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None, value=None):
        super().__init__(message)
        self.file = file
        self.key = key
        self.value = value


class NotRootError(CorehandlerError):
    exit_code = EXIT_PERMISSION


class UnsafePathError(CorehandlerError):
    """A path the kernel would run or trust as root is writable by someone other than root."""

    exit_code = EXIT_PERMISSION


class HandlerConflictError(CorehandlerError):
    exit_code = EXIT_CONFLICT


class NotReadyError(CorehandlerError):
    """What the verb needs exists but is not ready yet (a dump's core still being compressed): try again."""

    exit_code = EXIT_CONFLICT


class SystemFailure(CorehandlerError):
    """An operation on the system failed; the message says which and why (strerror)."""

    exit_code = EXIT_SYSTEM
