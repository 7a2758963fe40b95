"""Building fails when a file is not the one the lock names: the Debian package's build (packaging/deb/build.sh,
through packaging/lock/install.sh, which scripts/setup and scripts/test use too) stops at a build backend or a
runtime dependency whose sha256 is not in packaging/lock/, saying which, and leaves no package behind."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support.lockfile import entries

pytestmark = [pytest.mark.deb, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def tree_copy(dest: Path) -> Path:
    """What build.sh copies of a checkout: the committed and staged files, with the working tree's content."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    dest.mkdir()
    subprocess.run(["cp", "--parents", "-P", "-t", str(dest), *(f.decode() for f in files if f)], cwd=ROOT,
                   check=True)
    return dest


def tamper(lock: Path, name: str) -> None:
    """Every hash of NAME's pin replaced by another (one bit of each flipped): no file PyPI has matches."""
    text = lock.read_text()
    _, hashes = entries(lock)[name]
    assert hashes
    for h in hashes:
        text = text.replace(h, h[:-1] + format(int(h[-1], 16) ^ 1, "x"))
    lock.write_text(text)


# A build backend (the first thing fetched) and a runtime dependency that goes into the package.
@pytest.mark.parametrize("lock, name", [("build.txt", "scikit-build-core"), ("runtime.txt", "six")])
def test_a_tampered_hash_stops_the_package_build(tmp_path, lock, name):
    src = tree_copy(tmp_path / "src")
    tamper(src / "packaging" / "lock" / lock, name)
    out = tmp_path / "out"
    got = subprocess.run([str(src / "packaging" / "deb" / "build.sh"), str(out)], capture_output=True, text=True,
                         timeout=1200)
    assert got.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in got.stderr, got.stderr
    assert re.search(rf"^\s*{re.escape(name)}==", got.stderr, re.MULTILINE), got.stderr
    assert not list(out.glob("*.deb"))
