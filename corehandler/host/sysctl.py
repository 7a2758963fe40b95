"""The kernel settings corehandler owns: kernel.core_pattern and kernel.core_pipe_limit, live (under a sysctl
root, /proc/sys unless injected) and persistent (a sysctl.d file that systemd-sysctl or procps applies at
boot)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from corehandler.atomicfile import write_atomic
from corehandler.errors import SystemFailure

SYSCTL_ROOT = Path("/proc/sys")
CORE_PATTERN = "kernel.core_pattern"
CORE_PIPE_LIMIT = "kernel.core_pipe_limit"
# Whoever changes core_pattern for a while (doctor --probe, the tests, the benchmarks) holds this lock: the
# setting is global, no two may overlap. Root's directory, not world-writable /run/lock, where any user could
# hold the lock (and hang doctor --probe) or plant a symlink for root to follow (held_lock()).
CORE_PATTERN_LOCK = Path("/run/corehandler/lock/core-pattern.lock")
# After distributions' 50-coredump.conf (systemd) in name order, so ours wins at boot where both exist.
SYSCTL_D_NAME = "50-corehandler.conf"


def _path(name: str, root: Path) -> Path:
    return root / name.replace(".", "/")


def read(name: str, root: Path = SYSCTL_ROOT) -> str:
    """The value as the kernel shows it, without the trailing newline."""
    try:
        return _path(name, root).read_text().removesuffix("\n")
    except OSError as e:
        raise SystemFailure(f"cannot read {name} ({_path(name, root)}): {e.strerror}") from None


def write(name: str, value: str, root: Path = SYSCTL_ROOT) -> None:
    if "\n" in value:
        raise ValueError(f"{name}: a sysctl value is one line")
    path = _path(name, root)
    data = (value + "\n").encode()
    try:
        # No O_CREAT: a setting the kernel does not have is an error, not a new file.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.EIO, "short write")
        finally:
            os.close(fd)
    except OSError as e:
        raise SystemFailure(f"cannot set {name} to {value!r} ({path}): {e.strerror}") from None
    # Some handlers' writes are cut short or refused silently by older kernels: read back to be sure.
    if read(name, root) != value:
        raise SystemFailure(f"{name} was set to {value!r} but the kernel reports {read(name, root)!r}")


def sysctl_d_file(sysctl_d: Path) -> Path:
    return sysctl_d / SYSCTL_D_NAME


def write_sysctl_d(values: dict[str, str], sysctl_d: Path) -> Path:
    """Writes our sysctl.d file with these values (0644, atomically) and returns its path."""
    path = sysctl_d_file(sysctl_d)
    body = "# Written by `corehandler install`; removed by `corehandler uninstall`.\n"
    body += "".join(f"{name} = {value}\n" for name, value in values.items())
    try:
        sysctl_d.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_atomic(path, body.encode(), 0o644)
    except OSError as e:
        raise SystemFailure(f"cannot write {path}: {e.strerror}") from None
    return path


def read_sysctl_d(sysctl_d: Path) -> dict[str, str] | None:
    """Our sysctl.d file's values, or None if it is absent."""
    path = sysctl_d_file(sysctl_d)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SystemFailure(f"cannot read {path}: {e.strerror}") from None
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith(("#", ";")) and "=" in line:
            name, value = line.split("=", 1)
            values[name.strip()] = value.strip()
    return values


def remove_sysctl_d(sysctl_d: Path) -> bool:
    """Removes our sysctl.d file; True if there was one."""
    path = sysctl_d_file(sysctl_d)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise SystemFailure(f"cannot remove {path}: {e.strerror}") from None
    return True


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


@contextlib.contextmanager
def held_lock(lock: Path = CORE_PATTERN_LOCK):
    """Holds lock (blocking until it is free). Its directory and that one's parent are made if missing and must
    be ours, writable by nobody else; no symlink is followed on the way."""
    try:
        parent = _own_dir(lock.parent.parent, 0o755)
        try:
            os.close(_own_dir(lock.parent, 0o700))
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        finally:
            os.close(parent)
    except OSError as e:
        raise SystemFailure(f"cannot open the lock {lock}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def core_pattern_exclusive(root: Path = SYSCTL_ROOT, lock: Path = CORE_PATTERN_LOCK):
    """Holds the host-wide core_pattern lock; on every exit puts back core_pattern and core_pipe_limit as found."""
    with held_lock(lock):
        saved = {name: read(name, root) for name in (CORE_PATTERN, CORE_PIPE_LIMIT)}
        try:
            yield saved
        finally:
            for name, value in saved.items():
                write(name, value, root)
