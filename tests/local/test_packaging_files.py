"""The Debian package's source files say what the package holds: debian/copyright has a stanza for every PyPI
distribution the package bundles (the pins in packaging/deb/constraints.txt), and the control file recommends
what every dump runs. (tests/system/test_packaging.py checks the built package itself.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    lines = (ROOT / "packaging/deb/constraints.txt").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))


def test_copyright_names_every_bundled_distribution_at_its_pinned_version():
    text = (ROOT / "debian/copyright").read_text()
    named = dict(re.findall(r"PyPI distribution (\S+) (\S+), bundled", text))
    assert named == pins()
    licenses = {m for m in re.findall(r"^License: (.+)$", text, re.MULTILINE)}
    for used in {part for lic in licenses for part in lic.split(" or ")}:
        # Every short name used in a Files stanza has its own License paragraph (its text, or common-licenses).
        assert re.search(rf"^License: {re.escape(used)}\n ", text, re.MULTILINE), used


def test_control_recommends_the_unwinder_every_dump_runs():
    control = (ROOT / "debian/control").read_text()
    assert re.search(r"^Recommends: .*\belfutils\b", control, re.MULTILINE)
