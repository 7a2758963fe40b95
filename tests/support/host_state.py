"""What a test run must leave as it found it: the live handler and its sysctls, sysctl.d, the installed daemon
running or not, the Debian package, the state and config directories. tests/conftest.py takes a snapshot when
the session starts and compares at its end; a difference fails the run, naming what changed.

Both snapshots are taken under the host lock (host/sysctl.py held_lock): another run (or a benchmark) on this
machine changes these only while it holds it (host/handler.py borrow), and puts them back before letting go.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
from pathlib import Path

from corehandler.host import supervise
from corehandler.host.sysctl import CORE_PATTERN_LOCK, held_lock
from corehandler.paths import DEFAULT_CONFIG_DIR, DEFAULT_STATE_DIR, Paths

SYSCTLS = ("kernel/core_pattern", "kernel/core_pipe_limit", "fs/suid_dumpable")
SYSCTL_DIRS = (Path("/etc/sysctl.d"), Path("/usr/lib/sysctl.d"), Path("/run/sysctl.d"))
# Files the live daemon rewrites as crashes arrive, or at each start (its lock names its pid and start time):
# their presence is compared, not their bytes.
LIVE_FILES = ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm", "index.sqlite-journal", "daemon.lock")


def _entry(path: Path, content: bool = True) -> str:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return "absent"
    kind = stat.S_IFMT(st.st_mode)
    head = f"mode {stat.S_IMODE(st.st_mode):04o} uid {st.st_uid}"
    if stat.S_ISLNK(st.st_mode):
        return f"symlink -> {os.readlink(path)}"
    if stat.S_ISREG(st.st_mode):
        if not content:
            return f"file, {head}"
        return f"file, {head}, sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    return f"{'directory' if kind == stat.S_IFDIR else 'other'}, {head}"


def _tree(root: Path, depth: int) -> dict[str, str]:
    """root and what is below it, depth levels deep; the live daemon's own files by presence only."""
    out = {str(root): _entry(root)}
    if depth == 0 or not root.is_dir() or root.is_symlink():
        return out
    with contextlib.suppress(OSError):
        for child in sorted(root.iterdir()):
            if depth > 1 and child.is_dir() and not child.is_symlink() and child.name not in ("spool", "store"):
                out.update(_tree(child, depth - 1))
            else:
                out[str(child)] = _entry(child, content=child.name not in LIVE_FILES)
    return out


def _package() -> str:
    try:
        result = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", "corehandler"],
                                capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return "no dpkg"
    return result.stdout.strip() if result.returncode == 0 else "not-installed"


def _interpreter(pid: int | None) -> str:
    try:
        return os.fsdecode(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0])
    except (OSError, TypeError):
        return "interpreter unknown"


def _daemon() -> dict[str, str]:
    current = supervise.status(Paths())
    # Which installation's supervisor runs, not its pid: the deb test stops the host's and starts it again.
    out = {"supervisor": f"running, {_interpreter(current.pid)}" if current.running else "not running",
           "supervised daemon": "running" if current.running and current.daemon_pid else "not running"}
    if supervise.systemd_is_pid1():
        result = subprocess.run(["systemctl", "is-active", "corehandler.service"], capture_output=True,
                                text=True, timeout=60)
        out["corehandler.service"] = result.stdout.strip()
    return out


def snapshot() -> dict[str, str]:
    state: dict[str, str] = {}
    for name in SYSCTLS:
        state[f"/proc/sys/{name}"] = Path("/proc/sys", name).read_text().strip()
    for directory in SYSCTL_DIRS:
        state.update(_tree(directory, 1))
    state.update(_tree(DEFAULT_STATE_DIR, 2))
    state.update(_tree(DEFAULT_CONFIG_DIR, 2))
    state["package corehandler"] = _package()
    state.update(_daemon())
    return state


def locked_snapshot() -> dict[str, str]:
    with held_lock(CORE_PATTERN_LOCK, "tests: host snapshot"):
        return snapshot()


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per thing that differs: `what: before -> after`."""
    return [f"{key}: {before.get(key, 'absent')} -> {after.get(key, 'absent')}"
            for key in sorted(set(before) | set(after)) if before.get(key, "absent") != after.get(key, "absent")]
