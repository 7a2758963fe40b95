"""What systemd says of a unit's core limits, for `corehandler why` (host/coreready.py): its main PID, its
LimitCORE= (soft and hard) and CoredumpFilter=, and the manager's DefaultLimitCORE= for units that set none.

Asked through `systemctl show` (the system manager, or with user=True the caller's own user manager), which reads
the properties over D-Bus, or for root over systemd's private socket; no D-Bus library is needed. A unit name is
passed as one argv word after `--`, never through a shell.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

UNIT_SUFFIXES = (".service", ".scope", ".socket", ".mount", ".swap", ".timer", ".slice", ".target", ".path",
                 ".device", ".automount")
PROPERTIES = ("Id", "LoadState", "ActiveState", "MainPID", "LimitCORE", "LimitCORESoft", "CoredumpFilter")
TIMEOUT = 10.0
# systemd's "infinity" for an rlimit (RLIM_INFINITY), as systemctl show prints it
INFINITY = "infinity"


class SystemdUnavailable(Exception):
    """systemd cannot be asked (not PID 1, no bus, systemctl missing): the message says which."""


@dataclass(frozen=True)
class Unit:
    name: str
    load_state: str
    active_state: str
    main_pid: int | None
    limit_core_soft: int | None     # bytes; None = infinity
    limit_core_hard: int | None
    coredump_filter: str | None     # as systemd prints it ("private-anonymous shared-anonymous ..."), if set


def running() -> bool:
    """systemd is the init system (sd_booted(3)'s test)."""
    return Path("/run/systemd/system").is_dir()


def _limit(value: str | None) -> int | None:
    return None if value in (None, "", INFINITY) or not value.isdigit() else int(value)


def _show(args: list[str], user: bool) -> dict[str, str]:
    if not user and not running():
        raise SystemdUnavailable("systemd is not the init system here (no /run/systemd/system)")
    cmd = ["systemctl", *(["--user"] if user else []), "show", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, errors="surrogateescape",
                              env={**os.environ, "SYSTEMD_PAGER": "cat", "LC_ALL": "C"})
    except FileNotFoundError:
        raise SystemdUnavailable("systemctl is not installed") from None
    except subprocess.TimeoutExpired:
        raise SystemdUnavailable(f"systemctl did not answer within {TIMEOUT:g} s") from None
    if done.returncode != 0:
        raise SystemdUnavailable(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                                 else f"systemctl show exited {done.returncode}")
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def unit_name(name: str) -> str:
    """name as a unit: `nginx` is nginx.service, as systemctl takes it."""
    return name if name.endswith(UNIT_SUFFIXES) else name + ".service"


def show(name: str, user: bool = False) -> Unit:
    values = _show(["-p", ",".join(PROPERTIES), "--", unit_name(name)], user)
    pid = values.get("MainPID", "0")
    return Unit(name=values.get("Id") or unit_name(name), load_state=values.get("LoadState", ""),
                active_state=values.get("ActiveState", ""), main_pid=int(pid) if pid.isdigit() and pid != "0" else None,
                limit_core_soft=_limit(values.get("LimitCORESoft")), limit_core_hard=_limit(values.get("LimitCORE")),
                coredump_filter=values.get("CoredumpFilter") or None)


def default_limit(user: bool = False) -> tuple[int | None, int | None]:
    """The manager's DefaultLimitCORESoft= and DefaultLimitCORE= (what a unit setting none gets)."""
    values = _show(["-p", "DefaultLimitCORESoft,DefaultLimitCORE"], user)
    return _limit(values.get("DefaultLimitCORESoft")), _limit(values.get("DefaultLimitCORE"))
