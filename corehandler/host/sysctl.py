"""Reading the kernel settings corehandler cares about: kernel.core_pattern and kernel.core_pipe_limit, live
(under a sysctl root, /proc/sys unless injected) and persistent (our sysctl.d file, applied at boot by
systemd-sysctl or procps); and the host lock that whoever changes them holds. The writes are host/handler.py's
alone."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from pathlib import Path

from corehandler import daemonlock
from corehandler.errors import SystemFailure
from corehandler.paths import HOST_LOCK

SYSCTL_ROOT = Path("/proc/sys")
CORE_PATTERN = "kernel.core_pattern"
CORE_PIPE_LIMIT = "kernel.core_pipe_limit"
SUID_DUMPABLE = "fs.suid_dumpable"  # never set by corehandler; a borrow puts it back (borrow())
CORE_PATTERN_LOCK = HOST_LOCK
# After distributions' 50-coredump.conf (systemd) in name order, so ours wins at boot where both exist.
SYSCTL_D_NAME = "50-corehandler.conf"
# A process started by the lock's holder (a test's `corehandler install`, a daemon a benchmark runs) holds it
# too: the holder writes a random token into the lock file, which only root can read, and passes it in this
# variable. A token that is not the file's is ignored.
LOCK_TOKEN_ENV = "COREHANDLER_HOST_LOCK"


def path_of(name: str, root: Path) -> Path:
    return root / name.replace(".", "/")


def read(name: str, root: Path = SYSCTL_ROOT) -> str:
    """The value as the kernel shows it, without the trailing newline."""
    try:
        return path_of(name, root).read_text().removesuffix("\n")
    except OSError as e:
        raise SystemFailure(f"cannot read {name} ({path_of(name, root)}): {e.strerror}") from None


def read_or_none(name: str, root: Path = SYSCTL_ROOT) -> str | None:
    """read(), or None where the setting cannot be read (a kernel without it, a fake tree that leaves it out)."""
    try:
        return read(name, root)
    except SystemFailure:
        return None


def sysctl_d_file(sysctl_d: Path) -> Path:
    return sysctl_d / SYSCTL_D_NAME


def parse_sysctl_d(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith(("#", ";")) and "=" in line:
            name, value = line.split("=", 1)
            values[name.strip()] = value.strip()
    return values


def read_sysctl_d(sysctl_d: Path) -> dict[str, str] | None:
    """Our sysctl.d file's values, or None if it is absent."""
    path = sysctl_d_file(sysctl_d)
    try:
        return parse_sysctl_d(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SystemFailure(f"cannot read {path}: {e.strerror}") from None


def _own_dir(path: Path, mode: int) -> int:
    """path as a directory fd: made with mode if missing; never through a symlink, and only if nobody but us
    may write it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise SystemFailure(f"{path} is not ours alone (uid {st.st_uid}, mode {st.st_mode & 0o7777:04o}): "
                            "refusing to take a lock in it")
    return fd


def _open_lock(lock: Path) -> int:
    try:
        parent = _own_dir(lock.parent.parent, 0o755)
        try:
            os.close(_own_dir(lock.parent, 0o700))
            return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        finally:
            os.close(parent)
    except OSError as e:
        raise SystemFailure(f"cannot open the lock {lock}: {e.strerror}") from None


def _contents(fd: int) -> list[str]:
    return os.pread(fd, 4096, 0).decode(errors="replace").splitlines()


def holder(lock: Path = CORE_PATTERN_LOCK) -> str | None:
    """Who holds the lock ("pid 123 (doctor --probe) since ..."), None when nobody does; needs root."""
    text = daemonlock.held_text(lock)
    return None if text is None else (text.splitlines() or ["another process"])[0]


class LockBusy(SystemFailure):
    pass


def _inherited(fd: int) -> bool:
    token = os.environ.get(LOCK_TOKEN_ENV)
    if not token:
        return False
    lines = _contents(fd)
    return len(lines) > 1 and secrets.compare_digest(lines[1], token)


@contextlib.contextmanager
def held_lock(lock: Path = CORE_PATTERN_LOCK, what: str = "corehandler", timeout: float | None = None):
    """Holds lock, naming its holder in it, and yields its token (for children that are to hold it too:
    LOCK_TOKEN_ENV). Waits for it forever, or timeout seconds and then raises LockBusy naming the holder. Its
    directory and that one's parent are made if missing and must be ours, writable by nobody else; no symlink
    is followed on the way. Held already by this process or an ancestor that passed its token: held again."""
    fd = _open_lock(lock)
    try:
        if _inherited(fd):
            yield os.environ[LOCK_TOKEN_ENV]
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    lines = _contents(fd)
                    raise LockBusy(f"the host lock {lock} is held by {lines[0] if lines else 'another process'}"
                                   ) from None
                time.sleep(0.05)
        token = secrets.token_hex(16)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({what}) since {stamp}\n{token}\n".encode(), 0)
        try:
            yield token
        finally:
            os.ftruncate(fd, 0)  # the token is spent: a child still running holds nothing from now on
    finally:
        os.close(fd)
