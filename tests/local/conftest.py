"""Fixtures of the local tier's install tests (test_install.py, test_agent.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def short_dir():
    """A directory of a short path: pytest's tmp_path can be too long for a 127-character core_pattern."""
    path = Path(tempfile.mkdtemp(prefix="ch-"))
    yield path
    shutil.rmtree(path)
