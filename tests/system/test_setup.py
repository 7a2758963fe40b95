"""scripts/setup's install is usable by every user: its venv (scripts/venv) is made from Debian's python3, so
`corehandler` runs for a user who is not root (what such a user may then see in the store is the CLI's matter).
It holds exactly the Python packages of packaging/lock/runtime.txt, as the Debian package does."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.lockfile import LOCK, canonical, pins

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def prefix():
    # Not below pytest's tmp_path: /tmp/pytest-of-root is 0700, and the point is that others can run it.
    parent = Path(tempfile.mkdtemp(prefix="corehandler-setup-test-", dir="/var/tmp"))
    parent.chmod(0o755)
    try:
        yield parent / "venv"
    finally:
        shutil.rmtree(parent)


def test_installed_cli_runs_as_nobody(prefix):
    subprocess.run([str(ROOT / "scripts" / "venv"), str(prefix)], check=True, capture_output=True, timeout=900)
    home = next(line for line in (prefix / "pyvenv.cfg").read_text().splitlines() if line.startswith("home"))
    assert home == "home = /usr/bin", home
    result = subprocess.run(["runuser", "-u", "nobody", "--", str(prefix / "bin" / "corehandler"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage: corehandler" in result.stdout
    installed = json.loads(subprocess.run([str(prefix / "bin" / "pip"), "list", "--format=json"], check=True,
                                          capture_output=True, text=True).stdout)
    versions = {canonical(d["name"]): d["version"] for d in installed}
    # Besides the lock: corehandler, and what ensurepip put there (pip, setuptools).
    assert {n: v for n, v in versions.items() if n not in ("corehandler", "pip", "setuptools")} == \
        pins(LOCK / "runtime.txt")
