"""A daemon's liveness is its own lock: `serve` holds an exclusive flock on <state>/daemon.lock for its whole
life, with its pid and start time written in it, under systemd, the supervisor, a foreground shell and the
node agent's pod alike. `status` asks the lock, never a pid file someone else wrote: a pid may be reused, a
lock dies with its holder."""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from corehandler.errors import CorehandlerError


@dataclass(frozen=True)
class Holder:
    pid: int | None
    since: float | None


def _parse(text: str) -> Holder:
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    try:
        pid = int(fields["pid"])
    except (KeyError, ValueError):
        pid = None
    try:
        since = float(fields["since"])
    except (KeyError, ValueError):
        since = None
    return Holder(pid, since)


def hold(path: Path) -> int:
    """The lock, held (its fd: closing it, or exiting, lets go); raises CorehandlerError naming the daemon that
    holds it already. Readable by all (0644): any user's `status` may ask it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise CorehandlerError(f"cannot open the daemon's lock {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        found = _parse(os.pread(fd, 256, 0).decode(errors="replace"))
        os.close(fd)
        who = f" (pid {found.pid})" if found.pid else ""
        raise CorehandlerError(f"another corehandler daemon{who} is running on {path.parent}") from None
    os.fchmod(fd, 0o644)  # a lock file from an older version was 0600
    os.ftruncate(fd, 0)
    # The start time whole (repr): rounded, it could read a moment later than it was.
    os.pwrite(fd, f"pid={os.getpid()} since={time.time()!r}\n".encode(), 0)
    return fd


def held_text(path: Path) -> str | None:
    """What a lock file says while someone holds its flock (its holder writes its name there); None when nobody
    holds it, or it cannot be read. The host lock (host/sysctl.py) is asked the same way."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return os.pread(fd, 4096, 0).decode(errors="replace")
    finally:
        os.close(fd)


def holder(path: Path) -> Holder | None:
    """The daemon holding the lock, None when none does (or the lock cannot be read)."""
    text = held_text(path)
    return None if text is None else _parse(text)
