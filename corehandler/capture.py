"""Whether csplice is capturing a dump now, read from the spool, and the wait that gives it priority: while a
capture runs, the daemon's background work (compression, analysis, the scrub, uploads) pauses between its
chunks, so the kernel's writer and csplice have the CPUs and the disk (docs/design.md, "Analysis off the
ingest thread; capture first").

csplice writes a dump to `.tmp.<id>.core` and renames it when the capture ends (spool.c), so a capture runs
while such a file exists and still grows. One that stopped changing for ACTIVE_SEC is not taking CPU or disk
(a stalled reader, or an orphan the sweep adopts) and holds nothing up. csplice never waits on the daemon:
it knows nothing of this; the daemon only looks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from corehandler import idlecpus

log = logging.getLogger(__name__)

# A capture's file changes at every write; one unchanged this long is stalled or abandoned.
ACTIVE_SEC = 5.0
POLL_SEC = 0.05
# A look that found no capture holds this long: a listing costs ~10 us, and a crash is seen within it.
LOOK_SEC = 0.005
# Longest one wait lasts: past it the work goes on until the spool has been seen without a capture once, so an
# endless storm of captures slows the daemon's work without stopping it.
MAX_WAIT_SEC = 120.0


def capturing(spool_dir: Path, now: float | None = None) -> bool:
    """True while csplice writes a core into spool_dir."""
    now = time.time() if now is None else now
    try:
        with os.scandir(spool_dir) as entries:
            for entry in entries:
                if entry.name.startswith(".tmp.") and entry.name.endswith(".core"):
                    try:
                        if now - entry.stat(follow_symlinks=False).st_mtime < ACTIVE_SEC:
                            return True
                    except FileNotFoundError:  # renamed or removed since the listing: that one ended
                        continue
    except FileNotFoundError:
        pass
    return False


class Yield:
    """Called between the chunks of background work: returns at once when no capture runs, else when it has
    ended (or stop is set, or `longest` passed). `waiting` names the work paused now, for tests and the
    log; `pauses` counts the waits."""

    def __init__(self, spool_dir: Path, stop: threading.Event | None = None):
        self.spool_dir = spool_dir
        self._stop = stop or threading.Event()
        self._lock = threading.Lock()
        self.waiting: dict[str, int] = {}
        self.pauses = 0
        self._tired = False  # waited MAX_WAIT_SEC: not again until a look finds no capture
        self._idle_at = 0.0  # monotonic time of the last look that found none

    def __call__(self, what: str, longest: float | None = None) -> None:
        """longest: shorter than MAX_WAIT_SEC (the default) for work that cannot stand still longer (a request on
        the wire, which a server times out); the next call waits again."""
        now = time.monotonic()
        if now - self._idle_at < LOOK_SEC:  # looked a moment ago
            return
        if not capturing(self.spool_dir):
            self._idle_at, self._tired = now, False
            return
        if self._tired:
            return
        self._wait(what, now, MAX_WAIT_SEC if longest is None else min(longest, MAX_WAIT_SEC))

    def _wait(self, what: str, since: float, longest: float) -> None:
        with self._lock:
            self.pauses += 1
            self.waiting[what] = self.waiting.get(what, 0) + 1
        log.debug("%s paused: a capture runs", what)
        try:
            with idlecpus.STEP_ASIDE:  # what was handed on before the pause runs on the CPUs the capture leaves
                while capturing(self.spool_dir) and not self._stop.wait(POLL_SEC):
                    if time.monotonic() - since > longest:
                        if longest < MAX_WAIT_SEC:
                            return
                        log.warning("%s waited %g s for captures to end; going on beside them", what,
                                    MAX_WAIT_SEC)
                        self._tired = True
                        return
            self._idle_at = time.monotonic()
        finally:
            with self._lock:
                self.waiting[what] -= 1
                if not self.waiting[what]:
                    del self.waiting[what]
