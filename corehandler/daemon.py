"""corehandlerd: the loop that ingests committed spool records into the store (ingest.py: the stages) and keeps
the store within its limits; its signals (stop, reload), its lock (one daemon per state dir), its start
(recovery of what a killed daemon left) and its observers."""

from __future__ import annotations

import logging
import os
import select
import signal
import sqlite3
import threading
import time
from dataclasses import replace
from typing import Callable, Sequence

from corehandler import analysisqueue, capture, daemonlock, idlecpus, spool
from corehandler.analysis import resymbolise, unwind
from corehandler.ingest import Ingest, Settings, settings_from_config  # noqa: F401 (serve, tests)
from corehandler.inotify import IN_Q_OVERFLOW, Watch
from corehandler.observer import Observer
from corehandler.store import attempts, retention, userview
from corehandler.store.dumprow import COMPRESSING
from corehandler.store.index import Store

log = logging.getLogger("corehandler.daemon")


class Daemon:
    def __init__(self, settings: Settings, observers: Sequence[Observer] = (),
                 reload: Callable[[], Settings] | None = None, *, handle_signals: bool = False):
        """handle_signals: SIGTERM/SIGINT stop, SIGHUP reloads (the process's main thread only; tests
        running the daemon in a thread call stop() and request_reload())."""
        self.settings = settings
        self.observers: list[Observer] = list(observers)
        self.reload = reload
        self.observer_failures = 0
        self._symbols = resymbolise.Resymboliser(self._wake, self._publish)
        self._stop = threading.Event()
        self._reload_pending = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.store: Store | None = None
        self._ingest: Ingest | None = None  # from run(), with the store
        self._workers: analysisqueue.Workers | None = None  # from run()
        # Paused between chunks of background work while csplice captures (capture.py).
        self.capture = capture.Yield(settings.spool_dir, self._stop)
        self._corrupt_seen: set[str] | None = None
        self._views_stale = False  # an append failed: the next change rewrites every view whole
        if handle_signals:  # now, not in run(): a SIGHUP before the loop starts is kept, not fatal
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
            signal.signal(signal.SIGHUP, lambda *_: self.request_reload())

    # -- observers ----------------------------------------------------------------------------------------

    def _notify(self, event: str, call: Callable[[Observer], None]) -> None:
        for obs in self.observers:
            try:
                call(obs)
            except Exception as e:  # an observer never stops ingest
                self.observer_failures += 1
                log.exception("Observer %r failed in %s, ignoring", obs, event)
                if event != "on_error":
                    message = f"{type(obs).__name__}.{event}: {e}"
                    self._notify("on_error", lambda o: o.on_error("observer", message, None))

    def report_error(self, kind: str, message: str, dump_id: str | None = None) -> None:
        log.error("%s", message)
        self._notify("on_error", lambda obs: obs.on_error(kind, message, dump_id))

    def _state(self) -> None:
        size, count = self.store.totals()
        backlog = len(spool.committed_ids(self.settings.spool_dir))
        self._notify("on_state", lambda obs: obs.on_state(backlog, size, count))

    # -- control --------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks run() to return; safe from a signal handler or another thread."""
        self._stop.set()
        self._wake()

    def request_reload(self) -> None:
        self._reload_pending = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _do_reload(self) -> None:
        self._reload_pending = False
        if self.reload is None:
            return
        try:
            new = self.reload()
        except Exception as e:
            self.report_error("config", f"Reload failed, keeping the running configuration: {e}")
            return
        if new.state_dir != self.settings.state_dir:
            log.warning("state_dir changed to %s: takes effect at the next start", new.state_dir)
            new = replace(new, state_dir=self.settings.state_dir)
        self.settings = new
        if self._workers is not None:  # the number of workers is the start's
            self._workers.budget, self._workers.window = new.analysis_uid_budget, new.analysis_uid_window
        log.info("Configuration reloaded")

    # -- ingest passes ------------------------------------------------------------------------------------------

    def sweep(self) -> int:
        """Adopts orphans and ingests every committed record; returns how many were ingested."""
        spool_dir = self.settings.spool_dir
        for path in spool.clean_stale_tmp(spool_dir):
            log.warning("Removed %s, a record csplice never finished writing", path.name)
        spool.clean_rate(spool_dir)
        for orphan in spool.find_orphans(spool_dir):
            try:
                spool.adopt_orphan(spool_dir, orphan)
            except OSError as e:
                self.report_error("ingest", f"Cannot adopt orphaned dump {orphan.id}: {e}", orphan.id)
        count = 0
        for dump_id in spool.committed_ids(spool_dir):
            if self._stop.is_set():
                break
            if self._ingest.try_ingest(dump_id):
                count += 1
                self.retain()
        self.check_corrupt()
        self._state()  # every sweep: the gauges stay fresh and systemd's watchdog hears from us (sdnotify.py)
        return count

    # -- recovery and retention -------------------------------------------------------------------------------

    def recover(self) -> None:
        """Finishes what a killed daemon left: interrupted deletions, temp files, dumps visible but not yet
        stored, orphans, records in the spool (in sweep), and store files that have neither an index row nor a
        record."""
        for d in self.store.finish_deletions():
            log.warning("Finished the interrupted deletion of %s (%s)", d.id, d.deleted_rule)
            # The killed daemon never reported it (the index counted it when the row went).
            self._notify("on_deleted", lambda obs: obs.on_deleted(d.id, d.exe, d.deleted_rule, d.freed_bytes or 0))
        for tmp in self.store.temp_files():
            log.warning("Removing %s, left by an interrupted compression", tmp.name)
            tmp.unlink(missing_ok=True)
        self._ingest.analyse_indexed()
        # Dumps a kill left indexed but not stored or not cleaned up: finished first, so the retention passes
        # of the sweep plan with every one of them done. A row still `compressing` is finished from the row
        # even if its record is gone.
        unfinished = [i for i in spool.committed_ids(self.settings.spool_dir) if self.store.get(i) is not None]
        for dump_id in dict.fromkeys(unfinished + self.store.compressing()):
            self._ingest.try_ingest(dump_id)
        self.sweep()
        pending = set(spool.committed_ids(self.settings.spool_dir))
        self._ingest.count(attempts.prune, pending | set(self.store.compressing()))
        for path in self.store.unindexed_files():
            dump_id = path.name.rsplit(".", 1)[0]
            if dump_id in pending or not spool.is_valid_id(dump_id):
                continue
            row = self.store.get(dump_id)
            if row is not None:
                if row.status != COMPRESSING and row.path is None and row.mini_path is not None:
                    # Retention dropped this full core from its row and a kill came before the unlink.
                    log.warning("Removing %s, a full core retention had already dropped", path.name)
                    path.unlink(missing_ok=True)
                continue
            self._ingest.index_stray(path, dump_id)

    def retain(self) -> list[retention.Deletion]:
        try:
            deleted = retention.vacuum(self.store, self.settings.policy)
        except (OSError, sqlite3.Error) as e:  # the next ingest or timer tries again
            self.report_error("ingest", f"Retention failed: {e}")
            return []
        for d in deleted:
            self._notify("on_deleted", lambda obs: obs.on_deleted(d.id, d.exe, d.rule, d.freed_bytes))
        if deleted:
            self._update_views(gone=[(d.id, d.uid) for d in deleted])
        self._state()
        return deleted

    def _publish(self, uids) -> None:
        """Republishes the users' views whole (userview.py); a failure is logged and retried at the next
        change."""
        try:
            userview.refresh(self.store, uids)
        except (OSError, sqlite3.Error) as e:
            self.report_error("ingest", f"Cannot publish the users' views of their dumps: {e}")

    def _update_views(self, changed=(), gone=()) -> None:
        """Appends what one ingest stage or one retention pass changed to the users' views: the cost of the
        change, not of everything a user has (userview.update)."""
        try:
            if self._views_stale:
                userview.refresh(self.store, None)
            else:
                userview.update(self.store, changed, gone)
            self._views_stale = False
        except (OSError, sqlite3.Error) as e:
            self._views_stale = True
            self.report_error("ingest", f"Cannot publish the users' views of their dumps: {e}")

    def check_corrupt(self) -> None:
        """Counts the stored dumps found corrupt since the last look (the CLI marks them in the index when a
        check fails: info, dump, debug, list), once each: errors_total{kind="corrupt"}, the journal, the log.
        Marks that predate this daemon are its baseline, not news (list, info and status show them)."""
        try:
            marked = dict(self.store.corrupt())
        except sqlite3.Error as e:  # the next sweep looks again
            self.report_error("ingest", f"Cannot read the corruption marks: {e}")
            return
        if self._corrupt_seen is not None:
            for dump_id in marked.keys() - self._corrupt_seen:
                self.report_error("corrupt", f"Stored dump {dump_id} is corrupt: {marked[dump_id]}", dump_id)
        self._corrupt_seen = set(marked)

    # -- main loop ------------------------------------------------------------------------------------------

    def _lock(self) -> int:
        """One daemon per state dir: two would compress the same records side by side. The lock is also this
        daemon's liveness for `status` (daemonlock.py)."""
        return daemonlock.hold(self.settings.state_dir / "daemon.lock")

    def run(self) -> int:
        s = self.settings
        s.spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        idlecpus.lower_priority()  # storage takes a worker per CPU and only what the host's own work leaves
        lock = self._lock()
        # The one place (with `corehandler migrate`) an index an older version wrote is migrated; one a newer
        # version wrote stops us here with EXIT_INDEX_NEWER, which neither systemd nor the supervisor restarts.
        self.store = Store(s.state_dir, migrate=True)
        if self.store.migration is not None:
            log.warning("%s", self.store.migration.describe())
        self._workers = analysisqueue.Workers(self._wake, workers=s.analysis_workers, budget=s.analysis_uid_budget,
                                              window=s.analysis_uid_window,
                                              yield_to=lambda: self.capture("analysis"))
        self._ingest = Ingest(lambda: self.settings, self.store, self._stop, notify=self._notify,
                              report_error=self.report_error, update_views=self._update_views, retain=self.retain,
                              symbols=self._symbols, workers=self._workers, yield_to=self.capture)
        if s.analysis_enabled:
            unwind.sandbox()  # probed now, not in the first dump's analysis time
        self.check_corrupt()  # the baseline, before an observer (the scrub) can mark anything
        # the state dir is ours now (the uploader starts its thread here)
        self._notify("on_start", lambda obs: obs.on_start())
        watch = Watch(s.spool_dir)
        try:
            log.info("Watching %s (compression %s, level %d)", s.spool_dir,
                     "on" if s.compression else "off", s.level)
            self.recover()
            self._publish(None)  # a view for every user, also of an index an older version wrote
            self.retain()
            next_sweep = time.monotonic() + self.settings.sweep_interval
            next_retain = time.monotonic() + self.settings.retention_interval
            while not self._stop.is_set():
                timeout = max(0.0, min(next_sweep, next_retain) - time.monotonic())
                ready, _, _ = select.select([watch, self._wake_r], [], [], timeout)
                if self._wake_r in ready:
                    while True:
                        try:
                            if not os.read(self._wake_r, 4096):
                                break
                        except BlockingIOError:
                            break
                if self._stop.is_set():
                    break
                if self._ingest.collect():
                    self.retain()
                self._symbols.step(self.store, self.settings)
                if self._reload_pending:
                    self._do_reload()
                    # The intervals may have changed; the new policy applies at once.
                    next_sweep = time.monotonic() + self.settings.sweep_interval
                    next_retain = 0.0
                if watch in ready:
                    events = watch.read()
                    if any(mask & IN_Q_OVERFLOW for mask, _ in events):
                        next_sweep = 0.0
                    for _, name in events:
                        if name.endswith(".json") and not name.startswith(".") and spool.is_valid_id(name[:-5]):
                            if self._ingest.try_ingest(name[:-5]):
                                self.retain()
                now = time.monotonic()
                if now >= next_sweep:
                    self.sweep()
                    next_sweep = now + self.settings.sweep_interval
                if now >= next_retain:
                    self.retain()
                    next_retain = now + self.settings.retention_interval
            log.info("Stopping")
            return 0
        finally:
            watch.close()
            self._workers.stop()
            self._symbols.stop()
            self.store.close()
            os.close(lock)  # the wake-up pipe stays: stop() may still be called from another thread
            for obs in self.observers:
                try:
                    obs.close()
                except Exception:
                    log.exception("Observer %r failed to close, ignoring", obs)
