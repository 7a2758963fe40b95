"""The deb tier's builds, once per run: this tree's packages, corehandler and corehandler-fleet, for Debian 12
and 13 (or the ones COREHANDLER_DEB and COREHANDLER_TRIXIE_DEB name, built from this tree already), the
previous release's (cached by its commit by packaging/deb/build-commit.sh) and a Debian root
per suite (mmdebstrap, once per run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def packages(out: Path) -> dict[str, Path]:
    """The binary packages of one build, by name: corehandler and corehandler-fleet (not their -dbgsym)."""
    found = {p.name.split("_", 1)[0]: p for p in out.glob("*.deb") if "-dbgsym_" not in p.name}
    assert set(found) == {"corehandler", "corehandler-fleet"}, sorted(found)
    return found


@pytest.fixture(scope="session")
def debs(tmp_path_factory) -> dict[str, Path]:
    """This tree's packages for Debian 12 (packaging/deb/build.sh on this bookworm host), built once per run;
    COREHANDLER_DEB names a built corehandler_*.deb instead, corehandler-fleet's beside it."""
    if os.environ.get("COREHANDLER_DEB"):
        return packages(Path(os.environ["COREHANDLER_DEB"]).resolve().parent)
    out = tmp_path_factory.mktemp("deb")
    subprocess.run([str(ROOT / "packaging" / "deb" / "build.sh"), str(out)], check=True, capture_output=True,
                   timeout=1800)
    return packages(out)


@pytest.fixture(scope="session")
def deb(debs) -> Path:
    """This tree's corehandler package for Debian 12."""
    return debs["corehandler"]


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
def trixie_debs(tmp_path_factory) -> dict[str, Path]:
    """This tree's packages for Debian 13, built in a trixie root (packaging/deb/build-in-root.sh);
    COREHANDLER_TRIXIE_DEB names a built corehandler_*.deb instead, corehandler-fleet's beside it."""
    if os.environ.get("COREHANDLER_TRIXIE_DEB"):
        return packages(Path(os.environ["COREHANDLER_TRIXIE_DEB"]).resolve().parent)
    out = tmp_path_factory.mktemp("trixie-deb")
    result = subprocess.run([str(ROOT / "packaging" / "deb" / "build-in-root.sh"), "trixie", str(out)],
                            capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, result.stderr
    return packages(out)


@pytest.fixture(scope="session")
def trixie_deb(trixie_debs) -> Path:
    return trixie_debs["corehandler"]
