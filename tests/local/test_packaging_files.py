"""The Debian package's source files say what the package holds: debian/copyright has a stanza for every PyPI
distribution the package bundles (the pins in packaging/lock/runtime.txt), and the control file recommends
what every dump runs, and the current version (pyproject.toml's) is the one every copy says, with a dated
NEWS.md section and debian/changelog's top entry. (tests/system/test_packaging.py checks the built package
itself.)"""

from __future__ import annotations

import email.utils
import functools
import importlib.machinery
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

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


@functools.cache
def _release_script():
    """scripts/release as a module: its DERIVED table and grammar are what these tests hold the tree to."""
    path = ROOT / "scripts" / "release"
    loader = importlib.machinery.SourceFileLoader("corehandler_release_script", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_the_current_version_has_its_news_section_and_changelog_entry():
    release = _release_script()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    release.semver_key(version)  # a semantic version, or ReleaseError
    # NEWS.md: a dated section for this version; above it only sections not released yet, of later versions.
    news = (ROOT / "NEWS.md").read_text()
    headings = list(release.NEWS_HEADING.finditer(news))
    dated = [h for h in headings if h["version"] == version and h["date"] != "unreleased"]
    assert dated, f"NEWS.md has no '## {version} (YYYY-MM-DD)' section (scripts/release {version} dates it)"
    for h in headings[:headings.index(dated[0])]:
        assert h["date"] == "unreleased" and release.semver_key(h["version"]) > release.semver_key(version), h[0]
    # debian/changelog: its top entry is this version's, of this date, with NEWS.md's bullets.
    changelog = (ROOT / "debian" / "changelog").read_text()
    top = release.changelog_top(changelog)
    assert top["package"] == "corehandler" and top["version"] == release.debian_version(version), top
    entry = changelog.split("\n -- ", 1)
    signed = email.utils.parsedate_to_datetime(entry[1].splitlines()[0].split("  ", 1)[1])
    assert signed.date().isoformat() == dated[0]["date"], (signed, dated[0][0])
    _, body = release.news_section(news, version)
    assert entry[0].rstrip("\n").splitlines()[2:] == release.changelog_items(body), \
        "debian/changelog's entry is not NEWS.md's section: scripts/release --refresh-notes"


def test_every_copy_of_the_version_is_pyprojects():
    release = _release_script()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert {path: found for path, found in release.copies(ROOT) if found != version} == {}


def test_the_release_script_orders_versions_as_semver_does():
    key = _release_script().semver_key
    ordered = ["0.1.0", "0.4.0-rc.1", "0.4.0", "0.4.1", "0.10.0", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta",
               "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]
    assert sorted(reversed(ordered), key=key) == ordered
    for bad in ("0.4", "v0.4.0", "0.04.0", "0.4.0-"):
        with pytest.raises(_release_script().ReleaseError):
            key(bad)
