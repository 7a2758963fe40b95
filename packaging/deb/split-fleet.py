"""Moves the fleet's distributions out of the private environment into corehandler-fleet's directory:
    python3 packaging/deb/split-fleet.py SITE_PACKAGES FLEET_SITE_PACKAGES
(packaging/deb/install-venv.sh, after packaging/lock/install.sh filled SITE_PACKAGES with the whole lock).

The fleet's distributions are those that corehandler's extra "fleet" (pyproject.toml) pulls in and that
nothing else needs: what corehandler's requirements with `extra == "fleet"` reach, transitively, less what its
plain requirements reach. Each moves with exactly the files its RECORD lists, RECORD included, so each file's
hash in it (the lock's wheel's) still checks it in its new place. Prints the names moved. Fails when an
installed distribution is in neither set, or a file its RECORD lists is not there.
"""

from __future__ import annotations

import csv
import os
import re
import sys
from importlib.metadata import Distribution, distributions
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement(text: str) -> tuple[str, str | None]:
    """A Requires-Dist line's name and the extra its marker asks for (None: none)."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text).group(1)
    extra = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", text)
    return canonical(name), extra and canonical(extra.group(1))


def closure(roots: set[str], installed: dict[str, Distribution]) -> set[str]:
    """Every installed distribution the roots need, without their own extras. A requirement whose marker
    (a Python version, a platform) excluded it is not installed, so is not followed either."""
    seen: set[str] = set()
    todo = [name for name in roots if name in installed]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in installed[name].requires or ():
            dep, extra = requirement(text)
            if extra is None and dep in installed and dep not in seen:
                todo.append(dep)
    return seen


def main() -> int:
    site, fleet = Path(sys.argv[1]), Path(sys.argv[2])
    installed = {canonical(d.metadata["Name"]): d for d in distributions(path=[str(site)])}
    own = installed["corehandler"]
    plain = {dep for dep, extra in map(requirement, own.requires or ()) if extra is None}
    extra = {dep for dep, extra in map(requirement, own.requires or ()) if extra == "fleet"}
    host = closure(plain, installed) | {"corehandler"}
    moving = closure(extra, installed) - host
    stray = set(installed) - host - moving
    if stray:
        raise SystemExit(f"split-fleet.py: installed but needed by neither package: {', '.join(sorted(stray))}")
    fleet.mkdir(parents=True, exist_ok=True)
    for name in sorted(moving):
        # RECORD is read whole before it moves with the rest.
        dist = installed[name]
        rows = Path(dist._path, "RECORD").read_text()  # the .dist-info directory's
        move(rows, dist.metadata["Name"], site, fleet)
        print(name)
    return 0


def move(rows: str, name: str, site: Path, fleet: Path) -> None:
    """The files of one RECORD, from site to fleet, at the same relative paths."""
    paths = [row[0] for row in csv.reader(rows.splitlines()) if row and not row[0].startswith("..")]
    for path in paths:
        source = site / path
        if not source.exists():
            raise SystemExit(f"split-fleet.py: {path} of {name} is not in {site}")
        target = fleet / path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
    # What the moves emptied: the distribution's own directories.
    for directory in sorted({(site / path).parent for path in paths}, key=lambda p: len(p.parts), reverse=True):
        while directory != site and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
            directory = directory.parent


if __name__ == "__main__":
    sys.exit(main())
