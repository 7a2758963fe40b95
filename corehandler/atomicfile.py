"""Files that others read (csplice, systemd-sysctl, a later uninstall) are replaced whole, never seen half
written: write a temp file beside the target, fsync it, rename it over, fsync the directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def write_atomic(path: Path, data: bytes, mode: int, *, tmp: Path | None = None,
                 prepare: Callable[[int], None] | None = None) -> None:
    """tmp: the temp file's name, for a directory whose cleanup knows a naming of its own (the spool's).
    prepare(fd): called on the temp file before its rename (e.g. to set an ACL readers find in place)."""
    tmp = tmp or path.with_name(f".{path.name}.tmp.{os.getpid()}")
    # Only a writer killed before its rename leaves one; every temp name has a single writer at a time.
    tmp.unlink(missing_ok=True)
    # O_EXCL|O_NOFOLLOW: never write through a link someone planted under the temp name.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it
        if prepare is not None:
            prepare(fd)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.rename(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """A rename is durable only once its directory is."""
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
