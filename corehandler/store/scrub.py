"""The background scrub: every stored file is read back and checked against its size and sha256 at a bounded
rate, as a filesystem scrub does, so a dump that rotted on disk is marked corrupt in the index before anyone
needs its core. The mark is what `list`, `info`, `status`, the corrupt-dumps gauge and the daemon's
errors_total{kind="corrupt"} (daemon.check_corrupt) all read.

A thread of its own with its own index connection: a multi-GiB file takes minutes at the rate, and ingest
does not wait for it. One pass goes through the dumps oldest first, then the next starts `interval` after this
one started. The rate is of bytes read from the disk (the stored, compressed bytes).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corehandler import capture, paths
from corehandler.observer import Quiet
from corehandler.store import compress
from corehandler.store.index import Store

log = logging.getLogger(__name__)


class _Stopped(Exception):
    pass


@dataclass(frozen=True)
class Policy:
    rate: int = 4 << 20          # bytes per second read from the store
    interval: float = 7 * 86400  # from one pass's start to the next's


class Pace:
    """Holds reads to rate bytes per second on average, and pauses them while csplice captures (yield_to,
    capture.py; the pause does not count against the rate); stop() ends the wait (and the read) at once."""

    def __init__(self, rate: int, stop: threading.Event, yield_to: Callable[[str], None] | None = None):
        self.rate, self.stop_event, self.yield_to = rate, stop, yield_to
        self.started, self.done = time.monotonic(), 0

    def __call__(self, n: int) -> None:
        self.done += n
        if self.yield_to is not None:
            paused = time.monotonic()
            self.yield_to("scrub")
            self.started += time.monotonic() - paused
        ahead = self.started + self.done / self.rate - time.monotonic()
        if self.stop_event.wait(max(0.0, ahead)):
            raise _Stopped()


def due(store: Store, after: str) -> list[tuple[str, str]]:
    """(id, path) of stored dumps after `after` (by id, "" for all) not marked corrupt yet."""
    return store.db.execute("SELECT id, path FROM dumps WHERE id > ? AND path IS NOT NULL AND sha256 IS NOT NULL "
                            "AND deleting = 0 AND corrupt IS NULL ORDER BY id", (after,)).fetchall()


def check(store: Store, dump_id: str, pace: Pace) -> str | None:
    """Checks one stored file; marks it corrupt (and returns the problem) when it fails."""
    dump = store.get(dump_id)
    if dump is None or dump.deleting or dump.path is None:
        return None  # retention took it since the listing
    path = store.file_path(dump)
    try:
        compress.verify(path, dump.raw_bytes, dump.sha256, pace=pace)
    except compress.VerifyError as e:
        problem = e.message
    except FileNotFoundError:
        return None if store.get(dump_id) is None else _mark(store, dump, f"{path.name} is missing")
    except OSError as e:
        problem = f"{path.name}: {e.strerror}"
    else:
        return None
    return _mark(store, dump, problem)


def _mark(store: Store, dump, problem: str) -> str:
    store.mark_corrupt(dump, f"scrub: {problem}")
    log.error("Scrub: stored dump %s is corrupt: %s", dump.id, problem)
    return problem


def run_pass(store: Store, pace: Pace) -> int:
    """One pass over the store; returns how many files it found corrupt."""
    found, after = 0, ""
    while batch := due(store, after)[:64]:
        for dump_id, _ in batch:
            after = dump_id
            if check(store, dump_id, pace) is not None:
                found += 1
    return found


class Scrubber(Quiet):
    """The scrub thread, as an observer of the daemon: starts with it, stops with it."""

    def __init__(self, state_dir: Path, policy: Policy = Policy()):
        self.state_dir, self.policy = Path(state_dir), policy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.capture = capture.Yield(paths.spool_dir(self.state_dir), self._stop)

    def on_start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scrub", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with Store(self.state_dir) as store:
                    found = run_pass(store, Pace(self.policy.rate, self._stop, self.capture))
                self.passes += 1
                log.info("Scrub pass done: %d corrupt dumps found", found)
            except _Stopped:
                return
            except (sqlite3.Error, OSError) as e:  # the next pass tries again
                log.error("Scrub pass failed: %s", e)
            if self._stop.wait(max(0.0, started + self.policy.interval - time.monotonic())):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
