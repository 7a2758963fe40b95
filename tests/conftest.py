"""Shared fixtures and the tier gates.

Tiers: unit (fakes only, always), system (root, the live kernel, real journald and Prometheus), kernel (qemu).
Tests that need more than a plain user say so with a marker; the gates below skip them with the reason when
the machine does not meet it, and the header line says which tiers can run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from corehandler import paths

from support import cbuild, host_core

def _is_root() -> bool:
    return os.geteuid() == 0


def _why_not(marker: str) -> str | None:
    if marker in ("root", "live_kernel", "deb") and not _is_root():
        return f"{marker} tests need root"
    if marker == "qemu" and not shutil.which("qemu-system-x86_64"):
        return "qemu tests need qemu-system-x86_64 (apt-get install qemu-system-x86)"
    if marker == "prometheus" and not shutil.which("prometheus"):
        return "prometheus tests need the prometheus server (apt-get install prometheus)"
    if marker == "journald" and not Path("/lib/systemd/systemd-journald").exists():
        return "journald tests need systemd-journald (apt-get install systemd)"
    if marker == "journald" and not _is_root():
        return "journald tests need root (private mount namespace)"
    return None


GATED = ("root", "live_kernel", "qemu", "journald", "prometheus", "deb")


def pytest_report_header(config):
    tiers = []
    for marker in GATED:
        why = _why_not(marker)
        tiers.append(f"{marker}: " + ("runs" if why is None else f"skipped ({why})"))
    return "corehandler tiers: unit: runs; " + "; ".join(tiers)


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker in GATED:
            if item.get_closest_marker(marker):
                why = _why_not(marker)
                if why:
                    item.add_marker(pytest.mark.skip(reason=why))
                    break


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """The project's own environment variables never leak into a test from the shell."""
    for name in list(os.environ):
        if name.startswith("CSPLICE_") or (name.startswith("COREHANDLER_") and name != "COREHANDLER_LIBEXEC"):
            monkeypatch.delenv(name)


def _built(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path.name} is not built at {path}: run `pip install .` first")
    return path


@pytest.fixture
def csplice() -> Path:
    return _built(paths.csplice_path())


@pytest.fixture
def feeder() -> Path:
    return cbuild.feeder()


@pytest.fixture
def host_core_settings():
    """Exclusive use of the host's core_pattern, core_pipe_limit and fixed csplice.conf, restored afterwards on
    every exit path, failure included. Yields the saved sysctl values."""
    with host_core.host_core_settings(paths.CSPLICE_SETTINGS) as saved:
        yield saved
