"""The lock (packaging/lock/) that setup, the tests and the Debian package install from: it pins every runtime
dependency pyproject.toml declares and all of theirs, at versions that satisfy the declared ranges, each with
hashes; the build backends likewise; and the environment these tests run in holds exactly those versions, so
what ships is what was tested. (tests/system/test_lock_build.py: a tampered hash stops the build.)"""

from __future__ import annotations

import importlib.metadata as metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from support.lockfile import LOCK, canonical, entries, pins

ROOT = Path(__file__).resolve().parents[2]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _satisfied_by(requirements: list[str], lock: Path) -> None:
    locked = pins(lock)
    for spec in map(Requirement, requirements):
        name = canonical(spec.name)
        assert name in locked, f"{spec} is not in {lock.name}: run packaging/lock/update.sh"
        assert spec.specifier.contains(locked[name], prereleases=True), \
            f"{lock.name} pins {name}=={locked[name]}, outside {spec}: run packaging/lock/update.sh"


def test_every_runtime_dependency_is_locked_within_its_range():
    """The host's and the fleet's (the extra corehandler-fleet ships): one lock for both packages."""
    project = pyproject()["project"]
    _satisfied_by([*project["dependencies"], *project["optional-dependencies"]["fleet"]], LOCK / "runtime.txt")


def test_the_build_backends_are_locked():
    _satisfied_by([*pyproject()["build-system"]["requires"], "setuptools"], LOCK / "build.txt")


def test_every_pin_has_hashes():
    for lock in ("runtime.txt", "build.txt"):
        found = entries(LOCK / lock)
        assert found
        for name, (version, hashes) in found.items():
            assert hashes, f"{lock}: {name}=={version} has no --hash"


def _closure(name: str, seen: dict[str, str], extra: str = "") -> None:
    dist = metadata.distribution(name)
    seen[canonical(dist.metadata["Name"])] = dist.version
    for text in dist.requires or ():
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        if canonical(req.name) not in seen:
            _closure(req.name, seen)


def test_the_tests_run_on_exactly_the_locked_set():
    """corehandler[fleet] as installed here (scripts/venv) and everything it pulls in, transitively, at the lock's
    versions: no more, no less, no other version."""
    installed: dict[str, str] = {}
    _closure("corehandler", installed, extra="fleet")
    del installed["corehandler"]
    assert installed == pins(LOCK / "runtime.txt")
