"""The daemon's re-symbolising (docs/analysis.md, "Symbols"): a dump whose trace lacks symbols is analysed again
from its mini core once debug info for it has come, looked for on a bounded schedule.

- After a dump's first analysis, the build-ids its trace lacks symbols for (symbols.wanted: the crashing
  thread's unnamed frames in modules without symbols) go to the fetcher thread at once when servers are
  configured, and the dump gets a row in the index's `resymbolise` table: tries 0, due after the first delay of
  `[analysis] resymbolise_after` (1 h, 6 h, 1 d by default).
- A due try reads the dump's stored result again: nothing lacking any more (`corehandler analyze` did it), no
  mini core, or no dump: the row goes. A debug file of a lacking build-id there by now (a -dbgsym package
  installed since, the cache filled by `analyze`): the dump is analysed again. For the others, with servers,
  the fetcher asks them (its per-dump budget; a 404 is remembered for its negative_ttl). The try counts either
  way; after the last delay the row goes and the dump is left to `corehandler analyze`.
- Whatever the fetcher brings makes the dump analysed again. The analysis runs in a thread of its own, one
  dump at a time, and is handed out only while no committed record waits in the spool (ingest first); the
  daemon's thread only hands it out and stores what comes back, so ingest never waits for it, and the crash
  path (csplice) knows nothing of it. At most DUE_PER_CYCLE due rows are looked at per turn of the daemon's loop.
- The new result replaces the stored one only when it names more of the crashing thread's frames (a mini-core
  analysis cut short by a loaded host never replaces a better one). The exact key never changes: should the
  new frames give another one (a debug file's own unwind tables taking a frame elsewhere), the first is kept
  and a problem says so. The signature may change: its text names functions where it had a module's name;
  its version (signature.SIGNATURE_VERSION) stays, as the formula is the same.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from corehandler import spool
from corehandler.analysis import debuginfod, findings, pyframes, reason, symbols, unwind
from corehandler.store import analyses, userview

log = logging.getLogger(__name__)

DUE_PER_CYCLE = 16


def _named(result: dict) -> int:
    threads = result.get("threads") or []
    return sum(1 for f in threads[0]["frames"] if f.get("function")) if threads else 0


def _debug_file_there(build_id: str, cache: Path) -> bool:
    return debuginfod.cached(cache, build_id).exists() or debuginfod.system_debug_file(build_id).exists()


class _Analyser:
    """The thread that analyses one mini core at a time, off the daemon's thread."""

    def __init__(self, wake: Callable[[], None]):
        self._wake = wake
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()   # (dump id, result or None)
        self._running: unwind.Running | None = None
        self._thread = threading.Thread(target=self._run, name="resymbolise", daemon=True)
        self._thread.start()

    def give(self, dump_id: str, mini: Path, record: dict, limits: findings.Limits, state_dir: Path) -> None:
        self._jobs.put((dump_id, mini, record, limits, state_dir))

    def stop(self) -> None:
        self._jobs.put(None)
        running = self._running
        if running is not None:
            unwind.interrupt(running)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            dump_id, mini, record, limits, state_dir = job
            result = None
            try:
                self._running = unwind.start(mini, record, limits)
                result = unwind.finish(self._running)
                result["core"] = "mini"
                symbols.annotate(result, state_dir)
            except Exception:  # the thread goes on with the next dump; this one keeps its result
                log.exception("Analysing %s again failed", dump_id)
            finally:
                self._running = None
            self.done.put((dump_id, result))
            self._wake()


class Resymboliser:
    """Owned by the daemon, called from its thread only: analysed() after each first analysis, step() on each
    turn of its loop, stop() at the end. wake: makes the loop turn (something arrived or finished); publish:
    the users' views of these uids are stale."""

    def __init__(self, wake: Callable[[], None], publish: Callable[[list[int]], None]):
        self._wake = wake
        self._publish = publish
        self._fetcher: debuginfod.Fetcher | None = None
        self._analyser: _Analyser | None = None
        self._busy: str | None = None      # the dump the analyser thread has
        self._ready: dict[str, None] = {}  # dumps to analyse again, in arrival order

    def analysed(self, store, settings, dump_id: str, result: dict) -> None:
        wanted = symbols.wanted(result)
        if not wanted:
            return
        schedule = settings.debuginfod.retry_after
        if schedule and settings.mini_core is not None:
            with store.db:
                store.db.execute("INSERT OR REPLACE INTO resymbolise (id, tries, due) VALUES (?, 0, ?)",
                                 (dump_id, time.time() + schedule[0]))
        self._fetch(settings, dump_id, wanted)

    def step(self, store, settings) -> None:
        try:
            self._step(store, settings)
        except (sqlite3.Error, OSError) as e:  # the index busy or a disk error: the next turn tries again
            log.error("Re-symbolising: %s", e)

    def _step(self, store, settings) -> None:
        if self._fetcher is not None:
            self._ready.update(dict.fromkeys(self._fetcher.arrived()))
        while self._analyser is not None and not self._analyser.done.empty():
            dump_id, result = self._analyser.done.get()
            self._busy = None
            if result is not None:
                self._store(store, dump_id, result)
        self._due(store, settings)
        if self._busy is None and self._ready and not spool.committed_ids(settings.spool_dir):
            self._hand_out(store, settings)

    def stop(self) -> None:
        for worker in (self._fetcher, self._analyser):
            if worker is not None:
                worker.stop()
        self._fetcher = self._analyser = None

    def _fetch(self, settings, dump_id: str, wanted: list[str]) -> None:
        if not wanted or not settings.debuginfod.urls:
            return
        if self._fetcher is None:
            self._fetcher = debuginfod.Fetcher(debuginfod.cache_dir(settings.state_dir), self._wake)
        self._fetcher.want(dump_id, wanted, settings.debuginfod)

    def _due(self, store, settings) -> None:
        now = time.time()
        schedule = settings.debuginfod.retry_after
        cache = debuginfod.cache_dir(settings.state_dir)
        due = store.db.execute("SELECT id, tries FROM resymbolise WHERE due <= ? ORDER BY due LIMIT ?",
                               (now, DUE_PER_CYCLE)).fetchall()
        for dump_id, tries in due:
            mini = self._mini(store, dump_id)
            result = analyses.analysis_for(store, dump_id) if mini is not None else None
            wanted = symbols.wanted(result) if result is not None else []
            tries += 1
            with store.db:
                if not wanted or tries >= len(schedule):
                    store.db.execute("DELETE FROM resymbolise WHERE id = ?", (dump_id,))
                else:
                    store.db.execute("UPDATE resymbolise SET tries = ?, due = ? WHERE id = ?",
                                     (tries, now + schedule[tries], dump_id))
            if not wanted:
                continue
            missing = [b for b in wanted if not _debug_file_there(b, cache)]
            if len(missing) < len(wanted):
                self._ready[dump_id] = None
            self._fetch(settings, dump_id, missing)
            log.info("Looking again for the symbols of %s (try %d): %d of %d debug files there now%s", dump_id,
                     tries, len(wanted) - len(missing), len(wanted),
                     ", asking debuginfod for the rest" if missing and settings.debuginfod.urls else "")

    @staticmethod
    def _mini(store, dump_id: str) -> Path | None:
        dump = store.get(dump_id)
        mini = store.mini_path(dump) if dump is not None and not dump.deleting else None
        return mini if mini is not None and mini.exists() else None

    def _hand_out(self, store, settings) -> None:
        while self._ready:
            dump_id = next(iter(self._ready))
            del self._ready[dump_id]
            mini = self._mini(store, dump_id)
            if mini is None or not settings.analysis_enabled:
                log.info("Debug info for %s arrived; it has no mini core (`corehandler analyze` re-symbolises it)",
                         dump_id)
                continue
            if self._analyser is None:
                self._analyser = _Analyser(self._wake)
            self._analyser.give(dump_id, mini, store.get(dump_id).record,
                                debuginfod.reading_cache(settings.analysis_limits, settings.state_dir),
                                settings.state_dir)
            self._busy = dump_id
            return

    def _store(self, store, dump_id: str, result: dict) -> None:
        before = analyses.analysis_for(store, dump_id)
        dump = store.get(dump_id)
        if before is None or dump is None or dump.deleting:
            return  # retention took it meanwhile
        if _named(result) <= _named(before):
            log.info("Analysed %s again from its mini core: no more names than before (%s); kept the first result",
                     dump_id, result["state"])
            return
        if before.get("exact_key") and result.get("exact_key") != before["exact_key"]:
            result.setdefault("problems", []).append(
                f"the frames analysed again give the exact key {result.get('exact_key')}: the first, "
                f"{before['exact_key']}, is kept")
            result["exact_key"], result["exact_version"] = before["exact_key"], before.get("exact_version")
        reason.carry_over(before, result)
        pyframes.carry_over(before, result, dump.record)
        result["resymbolised_at"] = time.time()
        analyses.put(store, dump_id, result)
        if not symbols.wanted(result):
            with store.db:
                store.db.execute("DELETE FROM resymbolise WHERE id = ?", (dump_id,))
        log.info("Re-symbolised %s from its mini core: %s, %d frames of the crashing thread named", dump_id,
                 result["state"], _named(result))
        if userview.visible(dump):
            self._publish([dump.uid])
