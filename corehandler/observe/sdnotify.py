"""systemd's service notifications (sd_notify(3), through systemd-python): READY=1 once the daemon holds its
state directory and watches the spool, so `Type=notify` orders units after a daemon that really runs;
WATCHDOG=1 at every event and every sweep (at least every [serve] sweep interval, 30 s), so systemd restarts a
daemon whose main loop hangs (`WatchdogSec=` in corehandler.service); STATUS= with the backlog and the store;
STOPPING=1 at the end. Without $NOTIFY_SOCKET (not started by systemd) every call is a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from systemd import daemon

from corehandler.observer import Quiet, Stored

log = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Sends one notification; False when there is nobody to tell (or the send failed: never fatal)."""
    try:
        return bool(daemon.notify(state))
    except OSError as err:
        log.debug("sd_notify(%r) failed, ignoring: %s", state, err)
        return False


class SystemdNotifier(Quiet):
    def on_start(self) -> None:
        notify("READY=1\nSTATUS=Watching the spool")

    def on_ingested(self, record: Mapping[str, Any], stored: Stored) -> None:
        notify("WATCHDOG=1")

    def on_stored(self, record: Mapping[str, Any], stored: Stored) -> None:
        notify("WATCHDOG=1")

    def on_deleted(self, dump_id: str, exe: str | None, rule: str, freed_bytes: int) -> None:
        notify("WATCHDOG=1")

    def on_error(self, kind: str, message: str, dump_id: str | None) -> None:
        notify("WATCHDOG=1")

    def on_state(self, backlog: int, store_bytes: int, store_count: int) -> None:
        notify(f"WATCHDOG=1\nSTATUS={store_count} dumps stored ({store_bytes} bytes), {backlog} waiting in the "
               "spool")

    def close(self) -> None:
        notify("STOPPING=1")
