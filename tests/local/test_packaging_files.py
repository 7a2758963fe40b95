"""The Debian package's source files say what the package holds: debian/copyright has a stanza for every PyPI
distribution the package bundles (the pins in packaging/lock/runtime.txt), and the control file recommends
what every dump runs. (tests/system/test_packaging.py checks the built package itself.)"""

from __future__ import annotations

import re
from pathlib import Path

from support.lockfile import LOCK, canonical, pins

ROOT = Path(__file__).resolve().parents[2]


def test_copyright_names_every_bundled_distribution_at_its_pinned_version():
    text = (ROOT / "debian/copyright").read_text()
    named = {canonical(name): version
             for name, version in re.findall(r"PyPI distribution (\S+) (\S+), bundled", text)}
    assert named == pins(LOCK / "runtime.txt")
    licenses = {m for m in re.findall(r"^License: (.+)$", text, re.MULTILINE)}
    for used in {part for lic in licenses for part in lic.split(" or ")}:
        # Every short name used in a Files stanza has its own License paragraph (its text, or common-licenses).
        assert re.search(rf"^License: {re.escape(used)}\n ", text, re.MULTILINE), used


def test_control_recommends_the_unwinder_every_dump_runs():
    control = (ROOT / "debian/control").read_text()
    assert re.search(r"^Recommends: .*\belfutils\b", control, re.MULTILINE)
