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
# setting is global, no two may overlap.
CORE_PATTERN_LOCK = Path("/run/lock/corehandler-core-pattern.lock")
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


@contextlib.contextmanager
def core_pattern_exclusive(root: Path = SYSCTL_ROOT, lock: Path = CORE_PATTERN_LOCK):
    """Holds the host-wide core_pattern lock; on every exit puts back core_pattern and core_pipe_limit as found."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        saved = {name: read(name, root) for name in (CORE_PATTERN, CORE_PIPE_LIMIT)}
        try:
            yield saved
        finally:
            for name, value in saved.items():
                write(name, value, root)
