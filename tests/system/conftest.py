"""The deb tier's builds, once per run: this tree's package (or the one COREHANDLER_DEB names, built from this
tree already), the previous release's (cached by its commit by packaging/deb/build-commit.sh) and a Debian root
per suite (mmdebstrap, once per run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def deb(tmp_path_factory) -> Path:
    """This tree's package (packaging/deb/build.sh), built once per run."""
    if os.environ.get("COREHANDLER_DEB"):
        return Path(os.environ["COREHANDLER_DEB"]).resolve()
    out = tmp_path_factory.mktemp("deb")
    subprocess.run([str(ROOT / "packaging" / "deb" / "build.sh"), str(out)], check=True, capture_output=True,
                   timeout=1800)
    (package,) = out.glob("corehandler_*_*.deb")
    return package


@pytest.fixture(scope="session")
def previous_deb() -> Path:
    """The previous release's package, built from the commit packaging/deb/previous-release names."""
    result = subprocess.run([str(ROOT / "packaging" / "deb" / "build-commit.sh")], capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.split()[-1])


@pytest.fixture(scope="session")
def bookworm_tarball(tmp_path_factory) -> Path:
    from support import debroot
    return debroot.make_tarball("bookworm", tmp_path_factory.mktemp("roots"))


@pytest.fixture(scope="session")
def trixie_tarball(tmp_path_factory) -> Path:
    from support import debroot
    return debroot.make_tarball("trixie", tmp_path_factory.mktemp("roots"))


@pytest.fixture(scope="session")
def trixie_deb(tmp_path_factory) -> Path:
    """This tree's package for Debian 13, built in a trixie root (packaging/deb/build-in-root.sh)."""
    if os.environ.get("COREHANDLER_TRIXIE_DEB"):
        return Path(os.environ["COREHANDLER_TRIXIE_DEB"]).resolve()
    out = tmp_path_factory.mktemp("trixie-deb")
    result = subprocess.run([str(ROOT / "packaging" / "deb" / "build-in-root.sh"), "trixie", str(out)],
                            capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, result.stderr
    (package,) = out.glob("corehandler_*_*.deb")
    return package
