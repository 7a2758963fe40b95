"""Whether this installation has the fleet's libraries.

Uploads and the fleet view need boto3, pyarrow, duckdb and pyrage (pyproject.toml's extra "fleet"); the Debian
package splits them off into corehandler-fleet, so a host package alone has none of them. Every use imports
them lazily, so everything else runs without them: the daemon keeps uploads off and says why (its log, the
journal, `status`), and a fleet verb stops with one line naming what to install.

The fleet package adds its directory to the private environment's sys.path with a .pth file, which Python reads
at start only; a daemon that was running before the package came looks again when it reloads (rescan=True).
"""

from __future__ import annotations

import importlib
import importlib.util
import site

from corehandler.errors import EXIT_CONFLICT, CorehandlerError

# The import names of pyproject.toml's extra "fleet" (tests/local/test_fleet_available.py holds them equal).
MODULES = ("boto3", "botocore", "pyarrow", "duckdb", "pyrage")
INSTALL = "install corehandler-fleet (the Debian package; from PyPI: corehandler[fleet])"


class FleetMissing(CorehandlerError):
    """A fleet verb without the fleet's libraries: the system is not in the state the verb needs."""

    exit_code = EXIT_CONFLICT


def missing(*, rescan: bool = False) -> list[str]:
    """The fleet's modules this interpreter cannot import; [] when the fleet is installed."""
    if rescan:
        # A .pth file added since start (corehandler-fleet installed while the daemon ran): read them again.
        for directory in site.getsitepackages():
            site.addsitedir(directory)
        importlib.invalidate_caches()
    return [name for name in MODULES if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def why_off(*, rescan: bool = False) -> str | None:
    """Why uploads cannot run here, in a few words, or None when they can."""
    gone = missing(rescan=rescan)
    return f"corehandler-fleet is not installed (no {', '.join(gone)}): {INSTALL}" if gone else None


def require(what: str) -> None:
    """FleetMissing, naming what to install, unless every fleet module is importable."""
    gone = missing()
    if gone:
        raise FleetMissing(f"{what} needs the fleet's libraries, which are not installed (no {', '.join(gone)}): "
                           f"{INSTALL}")
