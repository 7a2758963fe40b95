"""Tests that install corehandler on this host for real (the Debian package, the node agent's container) get a
host without anyone else's corehandler in the way, and give it back as they found it: the paths moved aside
and back (whatever the test left there removed first), the host's own supervised daemon (scripts/setup's)
stopped and started again by the interpreter that ran it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from corehandler.host import supervise
from corehandler.paths import Paths


def live_supervisor_python() -> str | None:
    """The interpreter of the host's running supervisor (from its pid file), or None when none runs."""
    current = supervise.status(Paths())
    if not current.running or current.pid is None:
        return None
    return os.fsdecode(Path(f"/proc/{current.pid}/cmdline").read_bytes().split(b"\0")[0])


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


@contextlib.contextmanager
def paths_aside(paths: Iterable[Path], tag: str):
    """Each existing path renamed to `<name>.before-<tag>-<pid>` for the block; afterwards what the block left
    at such a path is removed and the original goes back (where nothing was, the block cleans up itself)."""
    aside = {}
    try:
        for path in paths:
            if os.path.lexists(path):
                aside[path] = path.with_name(f"{path.name}.before-{tag}-{os.getpid()}")
                os.rename(path, aside[path])
        yield
    finally:
        for path, moved in aside.items():
            _remove(path)
            os.rename(moved, path)


@contextlib.contextmanager
def host_daemon_stopped():
    """The host's own supervised daemon stopped for the block, started again after by its interpreter."""
    python = live_supervisor_python()
    if python:
        subprocess.run([python, "-m", "corehandler.host.supervise", "stop"], check=True, capture_output=True,
                       timeout=60)
    try:
        yield
    finally:
        if python:
            subprocess.run([python, "-m", "corehandler.host.supervise", "start"], check=True, capture_output=True,
                           timeout=60)
