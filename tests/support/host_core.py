"""Exclusive use of the host's handler (core_pattern, core_pipe_limit, csplice.conf, our sysctl.d file) for the
tests (tests/conftest.py's host_core_settings fixture) and the benchmarks (bench/) alike: a thin user of
host/handler.py's borrow, the one writer of host state. Everything is put back on every exit path; processes
started meanwhile (a test's `corehandler install`, a daemon) hold the lock too."""

from __future__ import annotations

import contextlib
from pathlib import Path

from corehandler import paths
from corehandler.config import CaptureConfig
from corehandler.csplice_contract import SPECIFIERS
from corehandler.host import handler
from corehandler.paths import Host


@contextlib.contextmanager
def borrowed(what: str = "tests"):
    """The host lock held and a handler.Borrowed yielded; `.found` is what the host had (handler.live()),
    read under the lock before anything changed."""
    host = Host()
    with handler.borrow(host, what) as lent:
        lent.found = handler.live(host)
        yield lent


def capture_into(lent, state_dir: Path, capture=None, pattern: str | None = None, pipe_limit: int = 16) -> str:
    """Within a borrow: csplice.conf as state_dir's installation renders it (handler.settings_for, capture the
    config's [capture], its defaults when None), then the pattern live (this build's csplice by default).
    Returns the pattern."""
    pattern = pattern or f"|{paths.csplice_path()} {SPECIFIERS}"
    assert len(pattern) <= 127, f"too long for core_pattern: {pattern}"
    lent.write_settings(handler.settings_for(capture or CaptureConfig(), paths.Paths(state_dir=state_dir), Host()))
    lent.point(pattern, pipe_limit)
    return pattern
