"""Exclusive use of the host's kernel.core_pattern, core_pipe_limit and csplice's fixed settings file, for the
tests (tests/conftest.py's host_core_settings fixture) and the benchmarks (bench/) alike."""

from __future__ import annotations

import contextlib
from pathlib import Path

# One lock for the tests, the benchmarks and doctor --probe: core_pattern is global.
from corehandler.host.sysctl import CORE_PATTERN_LOCK, held_lock

SYSCTLS = ("kernel/core_pattern", "kernel/core_pipe_limit")


@contextlib.contextmanager
def host_core_settings(settings_file: Path):
    """Takes the lock, yields the saved sysctl values; on any exit puts back the sysctls and settings_file (and
    removes its directory again if this made it and it is empty)."""
    with held_lock(CORE_PATTERN_LOCK):
        saved = {name: Path("/proc/sys", name).read_text() for name in SYSCTLS}
        made_dir = not settings_file.parent.exists()
        saved_settings = settings_file.read_bytes() if settings_file.exists() else None
        try:
            settings_file.parent.mkdir(parents=True, exist_ok=True)
            yield saved
        finally:
            for name, value in saved.items():
                Path("/proc/sys", name).write_text(value)
            if saved_settings is not None:
                settings_file.write_bytes(saved_settings)
            else:
                settings_file.unlink(missing_ok=True)
                if made_dir:
                    with contextlib.suppress(OSError):
                        settings_file.parent.rmdir()
