"""Test-only pause points: a named point inside a long step where a test makes the process stop for ever, to
kill it exactly there and see that the next start finishes the work. Each part that has such points reads one
environment variable naming the point to stop at; outside tests it is unset and nothing pauses."""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger("corehandler.testpause")

INGEST_ENV = "COREHANDLER_TEST_PAUSE_AT"  # the daemon's ingest stages (daemon.PAUSE_POINTS)
UPLOAD_ENV = "COREHANDLER_TEST_UPLOAD_PAUSE_AT"  # the uploader: core_sent (before the sidecar), sidecar_sent
ANALYSIS_ENV = "COREHANDLER_TEST_ANALYSIS_PAUSE_AT"  # an analysis worker: analysing (before the unwinder)


def pause(env: str, point: str, until: threading.Event | None = None) -> None:
    """Stops here for ever when the variable env names this point, or until `until` is set (a worker thread
    paused in a test still ends with its daemon)."""
    if os.environ.get(env) == point:
        log.warning("Pausing at %s (%s, test-only)", point, env)
        while until is None:
            time.sleep(3600)
        until.wait()
