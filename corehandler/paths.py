"""Where corehandler's files live, in two worlds that never mix: an installation (`Paths`: a state dir and what
hangs from it, one per `--state-dir`) and the host (`Host`: what exists once per machine, the kernel's
core_pattern and core_pipe_limit, our sysctl.d file, csplice.conf at the path fixed in csplice, and the lock
that guards them). Code handed an installation cannot name a host file; only host/handler.py writes them.
Every root is a field, so tests run without touching the host's."""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STATE_DIR = Path("/var/lib/corehandler")
DEFAULT_CONFIG_DIR = Path("/etc/corehandler")
# Fixed in the csplice binary (CSPLICE_SETTINGS_PATH): the kernel runs it with no arguments of ours and no
# environment, so this is the one place it can look. A host file, although it sits in the default state dir.
CSPLICE_SETTINGS = DEFAULT_STATE_DIR / "csplice.conf"
# Whoever changes the host's handler holds this lock, for a moment (install, a daemon's refresh) or a while
# (doctor --probe, the tests, the benchmarks). Root's directory, not world-writable /run/lock, where any user
# could hold the lock or plant a symlink for root to follow (host/sysctl.py held_lock()).
HOST_LOCK = Path("/run/corehandler/lock/core-pattern.lock")
# Modes of the state directories, all root's. The state and store directories may be crossed but not listed
# (0711) so a user can open what is published for them by name (userview.py: their own view, and the stored
# cores that carry a read ACL for them); the spool is root's alone.
DIR_MODES = {"state": 0o711, "spool": 0o700, "store": 0o711, "users": 0o711}


def libexec_dir() -> Path:
    """The directory holding this installation's csplice: where the build put it (CMakeLists.txt says where),
    or COREHANDLER_LIBEXEC for a development build tree."""
    override = os.environ.get("COREHANDLER_LIBEXEC")
    if override:
        return Path(override)
    try:
        from corehandler._libexec import LIBEXEC_DIR  # written by the build; absent in a source tree
    except ImportError:
        LIBEXEC_DIR = ""  # noqa: N806
    if LIBEXEC_DIR:
        return Path(LIBEXEC_DIR)
    # A wheel puts csplice in its environment's data directory: a virtualenv's prefix.
    return Path(sysconfig.get_path("data")) / "libexec" / "corehandler"


def csplice_path() -> Path:
    return libexec_dir() / "csplice"


# The state directory's layout, spelled here only: every module that has a state directory asks these.
def spool_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "spool"


def store_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "store"


def users_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "users"


def index_path(state_dir: Path) -> Path:
    return Path(state_dir) / "index.sqlite"


def cache_dir(state_dir: Path) -> Path:
    """root's caches (the fleet view's sidecars), never a HOME that sudo kept."""
    return Path(state_dir) / "cache"


def capture_rates_path(state_dir: Path) -> Path:
    return Path(state_dir) / "capture-rates.json"


@dataclass(frozen=True)
class Paths:
    """One installation: its state dir and the directories that derive from it."""
    state_dir: Path = DEFAULT_STATE_DIR
    config_dir: Path = DEFAULT_CONFIG_DIR
    run_dir: Path = field(default=Path("/run/corehandler"))
    log_dir: Path = Path("/var/log/corehandler")  # the supervised daemon's log, where systemd is not PID 1

    @property
    def spool_dir(self) -> Path:
        return spool_dir(self.state_dir)

    @property
    def store_dir(self) -> Path:
        return store_dir(self.state_dir)

    @property
    def users_dir(self) -> Path:
        return users_dir(self.state_dir)

    @property
    def index_path(self) -> Path:
        return index_path(self.state_dir)

    @property
    def capture_rates(self) -> Path:
        """The spool filesystem's measured write rates (host/writerates.py)."""
        return capture_rates_path(self.state_dir)

    @property
    def daemon_lock(self) -> Path:
        """Held by this installation's daemon for its whole life, naming it (daemonlock.py)."""
        return Path(self.state_dir) / "daemon.lock"

    @property
    def installation_id(self) -> Path:
        """A random name made at the first claim: csplice.conf names its owner by it and the state dir."""
        return Path(self.state_dir) / "installation-id"

    @property
    def install_mode(self) -> Path:
        """The mode install was last asked for (pipe, socket, auto): what a later install keeps (host/install.py)."""
        return Path(self.state_dir) / "install-mode"

    @property
    def previous_handler(self) -> Path:
        """What the host's handler was before this installation claimed it (host/handler.py)."""
        return Path(self.state_dir) / "previous-handler.conf"

    @property
    def config_file(self) -> Path:
        return self.config_dir / "corehandler.toml"

    @property
    def dropin_dir(self) -> Path:
        return self.config_dir / "corehandler.d"


@dataclass(frozen=True)
class Host:
    """What exists once per machine. Only host/handler.py writes these; everyone may read them."""
    proc_root: Path = Path("/proc")
    sysctl_d: Path = Path("/etc/sysctl.d")
    csplice_settings: Path = CSPLICE_SETTINGS
    lock: Path = HOST_LOCK

    @property
    def sysctl_root(self) -> Path:
        return self.proc_root / "sys"
