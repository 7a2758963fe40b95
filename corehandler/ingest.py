"""Ingest: one committed spool record's way into the store, stage by stage, on the daemon's thread; its analysis
beside it, in the analysis workers (analysisqueue.py).

A dump goes through ingest in stages, each read back from what is on disk (its index row, its analysis row, its
spool files, its stored file), so a daemon started after a kill resumes where the killed one stopped and every
step is safe to redo (see Ingest.ingest):

  no row --visible--> row `compressing` --stored + analysed--> row final, spool files left --cleanup--> done

visible   validate the raw core, mark its analysis pending, announce the dump (on_ingested), then insert its
          index row: status `compressing` when there is a core to store, else its final status; publish the
          users' views, and hand the unwinding (and the symbols' sources) to the workers. From here `list`,
          `info`, the journal and the metrics show the dump; its trace and signature come with the final row.
          No analysis runs on this thread: a slow one holds its own dump only.
stored    store the raw core (compress to a temp file verified as it streams, fsync, rename); a stored file a
          kill left in place is verified and kept instead; then hand the mini core to the workers. The raw core
          stays in the spool until they are done (they read the full core). A dump stored before its jobs end
          waits for them, off this thread; the next dumps go on meanwhile.
analysed  the workers' results go into the analysis row as they arrive (collect); once the core is stored and
          every job done, announce the final status, the stored file's figures and the analysis (on_stored:
          the journal's one coredumpctl entry, with the trace), then commit them to the row.
cleanup   delete the raw core, then the record.
Each announcement is made at least once: it is built from the row about to be committed (and the analysis
already stored) and made just BEFORE that commit, so a kill at any point loses none. A kill between an
announcement and its commit makes the restarted daemon redo the stage and announce it again: that instant
is the only one that repeats an announcement; a kill anywhere else (during compression, the long window,
included) repeats none. Observers therefore may hear of a row a moment before the index shows it.

COREHANDLER_TEST_PAUSE_AT=<point> (test-only, testpause.py) makes ingest stop forever at a named point so tests
can kill the daemon there: ingested_announced, visible, compressing, compressed, stored, stored_announced, indexed,
core_removed. COREHANDLER_TEST_ANALYSIS_PAUSE_AT=analysing holds every analysis worker before its unwinder until
the daemon stops.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from corehandler import analysisqueue, elfcore, paths, spool, steps
from corehandler.analysis import debuginfod, findings, identity, minicore, pyframes, resymbolise, symbols, unwind
from corehandler.config import KubernetesConfig
from corehandler.observer import Observer, Stored
from corehandler.pods import apiserver, policy
from corehandler.store import analyses, attempts, compress, retention, userview
from corehandler.store.dumprow import COMPRESSING, Dump, row_from_record
from corehandler.store.index import Store
from corehandler.testpause import ANALYSIS_ENV, INGEST_ENV, pause

log = logging.getLogger("corehandler.daemon")

PAUSE_POINTS = ("ingested_announced", "visible", "compressing", "compressed", "stored", "stored_announced", "indexed",
                "core_removed")


@dataclass(frozen=True)
class Settings:
    """What the daemon needs, resolved from the config (see settings_from_config)."""
    state_dir: Path
    compression: bool = True
    level: int = 1
    threads: int | str = "auto"    # zstd workers per dump: "auto" = idle CPUs (compress.resolve_threads)
    policy: retention.Policy = field(default_factory=retention.Policy)
    retention_interval: float = 3600.0
    sweep_interval: float = 30.0    # also picks up what inotify missed
    retry_interval: float = 60.0    # after a failed ingest (disk full, I/O error)
    analysis_enabled: bool = True
    analysis_limits: findings.Limits = field(default_factory=findings.Limits)
    ingest_attempts: int = attempts.MAX_ATTEMPTS  # then the record is given up (store/attempts.py)
    mini_core: minicore.Limits | None = field(default_factory=minicore.Limits)  # None: no mini cores
    debuginfod: debuginfod.Settings = field(default_factory=debuginfod.Settings)
    analysis_workers: int = 2       # threads analysing at once (analysisqueue.py)
    analysis_uid_budget: float = 0.0  # analysis seconds per uid per window; 0: no cap
    analysis_uid_window: float = 600.0
    pods: KubernetesConfig = field(default_factory=KubernetesConfig)  # what a crash in a pod keeps
    pod_lookup: apiserver.PodLookup | None = None  # the API server's view of pods ([kubernetes] api)

    @property
    def spool_dir(self) -> Path:
        return paths.spool_dir(self.state_dir)


def settings_from_config(config, paths, **overrides) -> Settings:
    """Settings from a corehandler.config.Config and the effective Paths (state_dir already applied);
    percentages resolve against the state dir's filesystem."""
    state_dir = paths.state_dir
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    total, _ = retention.filesystem(state_dir)
    return Settings(state_dir=state_dir, compression=config.compression.enabled, level=config.compression.level,
                    threads=config.compression.threads,
                    policy=retention.policy_from_config(config.retention, total),
                    retention_interval=config.retention.interval, analysis_enabled=config.analysis.enabled,
                    analysis_limits=analysis_limits(config),
                    mini_core=minicore.Limits(config.analysis.mini_core_stack, config.analysis.mini_core_max)
                    if config.analysis.mini_core else None,
                    debuginfod=debuginfod_settings(config), analysis_workers=config.analysis.workers,
                    analysis_uid_budget=config.analysis.uid_budget, analysis_uid_window=config.analysis.uid_window,
                    pods=config.kubernetes,
                    pod_lookup=apiserver.PodLookup.in_cluster() if config.kubernetes.api else None, **overrides)


def analysis_limits(config) -> findings.Limits:
    a = config.analysis
    return findings.Limits(timeout=a.timeout, memory_bytes=a.max_memory, threads=a.max_threads, frames=a.max_frames,
                           source_lines=a.source_lines)


def debuginfod_settings(config) -> debuginfod.Settings:
    a = config.analysis
    return debuginfod.Settings(urls=debuginfod.urls(a.debuginfod_urls, allow_http=a.debuginfod_allow_http),
                               timeout=a.debuginfod_timeout, budget=a.debuginfod_budget,
                               cache_max=a.debuginfod_cache_max, retry_after=tuple(a.resymbolise_after))


class Stopping(Exception):
    """SIGTERM arrived during a long step; the step is abandoned and redone on the next start."""


class _Retry(Exception):
    """Ingest failed in a way worth retrying later; the raw dump stays in the spool."""


def _status(record: dict, info: elfcore.CoreInfo | None, core_missing: bool) -> tuple[str, list[str]]:
    """The index status of a record and the problems that decided it."""
    capture = record.get("capture") or {}
    # Records the daemon made itself (unreadable, orphan) carry their story in "errors"; csplice's errors
    # are in the record for `info` and are not problems of the dump.
    problems = list(record.get("errors") or []) if record.get("unreadable") or record.get("orphan") else []
    if info is not None:
        problems += info.problems
    if record.get("orphan"):
        return "orphan", problems
    if record.get("given_up"):
        return "invalid", problems
    if record.get("core") is None:
        if record.get("unreadable"):
            return "invalid", problems
        reason = capture.get("dropped_reason") or capture.get("error")
        return "dropped", [f"dump dropped: {reason}"] if reason else []
    if core_missing:
        return "invalid", problems + ["core file missing from the spool"]
    if capture.get("truncated") or info.status == elfcore.STATUS_TRUNCATED:
        if capture.get("truncated_reason"):
            problems.insert(0, f"capture truncated: {capture['truncated_reason']}")
        return "truncated", problems
    return ("ok" if info.status == elfcore.STATUS_OK else "invalid"), problems


def stored_event(dump: Dump, path: Path | None, analysis: Mapping[str, Any] | None) -> Stored:
    """The event observers hear of a dump (corehandler/observer.py), from its index row: while the row is
    `compressing` the stored file's figures are None."""
    pending = dump.status == COMPRESSING
    return Stored(id=dump.id, path=str(path) if path else None, raw_bytes=dump.raw_bytes,
                  stored_bytes=None if pending else dump.stored_bytes,
                  compress_seconds=None if pending else dump.compress_seconds or 0.0,
                  ingest_seconds=dump.ingest_seconds or 0.0, ingested_at=dump.ingested_at, status=dump.status,
                  problem=dump.problem, analysis=analysis)


@dataclass(eq=False)
class _Parked:
    """A dump indexed `compressing` with jobs in the workers: its unwinding (from the stage visible on) and its
    mini core (once its core is stored: a full disk then leaves nothing of the dump in the store). Its core
    once stored, and the mini core's index columns and problems once written."""
    jobs: set[analysisqueue.Job] = field(default_factory=set)  # running or queued
    mini_asked: bool = False
    stored: compress.Stored | None = None
    seconds: float = 0.0  # the store stage's
    mini: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _stand_in(spool_dir: Path, dump_id: str, error: str, **flags) -> dict:
    """The record the daemon makes for one it cannot use: the id, the core if there is one, and why."""
    core = spool.core_path(spool_dir, dump_id)
    return {"schema": spool.RECORD_SCHEMA, "id": dump_id, "unreadable": True,
            "core": core.name if core.exists() else None, "errors": [error], **flags}


class Ingest:
    """The stages above, for one dump at a time, on the daemon's thread; analyses in the workers, collected
    on the daemon's thread. What it tells the world goes through the daemon: its observers (notify,
    report_error), the users' views (update_views) and retention (retain, when a full disk stopped a dump)."""

    def __init__(self, settings: Callable[[], Settings], store: Store, stop: threading.Event, *,
                 notify: Callable[[str, Callable[[Observer], None]], None],
                 report_error: Callable[..., None], update_views: Callable[..., None], retain: Callable[[], Any],
                 symbols: resymbolise.Resymboliser, workers: analysisqueue.Workers,
                 yield_to: Callable[[str], None] | None = None):
        """settings: the daemon's current Settings (a reload replaces them); stop: set when the daemon stops,
        which abandons a long step at its next checkpoint; workers: where analyses run; yield_to(what): called
        between compression chunks and before a mini core, returns once no capture runs (capture.Yield)."""
        self._settings = settings
        self.store = store
        self._stop = stop
        self._notify = notify
        self.report_error = report_error
        self._update_views = update_views
        self._retain = retain
        self._symbols = symbols
        self._retry_at: dict[str, float] = {}
        self._workers = workers
        self._yield = yield_to
        self._parked: dict[str, _Parked] = {}

    @property
    def settings(self) -> Settings:
        return self._settings()

    def _checkpoint(self, point: str) -> None:
        pause(INGEST_ENV, point)
        if self._yield is not None and point == "compressing":
            self._yield("compress")
        if self._stop.is_set():
            raise Stopping(point)

    # -- one attempt, and what it leaves for the next ----------------------------------------------------------

    def try_ingest(self, dump_id: str) -> bool:
        if self._retry_at.get(dump_id, 0) > time.monotonic():
            return False
        parked = self._parked.get(dump_id)
        if parked is not None and parked.stored is not None and parked.jobs:
            return False  # stored; collect() finishes it when its jobs end
        try:
            # Counted before it runs: an attempt that kills the daemon counts too.
            attempt = attempts.begin(self.store, dump_id)
            given_up = attempts.give_up(self.store, dump_id, attempt, self.settings.ingest_attempts)
            if given_up is not None:
                self.report_error("ingest", f"{dump_id}: {given_up.reason}; indexed as invalid", dump_id)
            done = self.ingest(dump_id, given_up)
        except _Retry as e:
            self._retry_at[dump_id] = time.monotonic() + self.settings.retry_interval
            if isinstance(e.__cause__, compress.DiskFullError):
                self.count(attempts.undo, dump_id)  # not the record's fault
                self._retain()  # keep_free may make room for the retry
            else:
                self.count(attempts.failed, dump_id, str(e.__cause__))
            return False
        except Stopping:
            self.count(attempts.undo, dump_id)
            return False
        except Exception as e:
            log.exception("Ingest of %s failed", dump_id)
            self.report_error("ingest", f"Ingest of {dump_id} failed: {e}; retrying later", dump_id)
            self._retry_at[dump_id] = time.monotonic() + self.settings.retry_interval
            self.count(attempts.failed, dump_id, f"{type(e).__name__}: {e}")
            return False
        self._retry_at.pop(dump_id, None)
        self.count(attempts.done, dump_id)
        return done

    def count(self, change: Callable, *args) -> None:
        """Notes an attempt's end in the index (store/attempts.py); an index error there is logged: the next
        sweep tries the record again either way."""
        try:
            change(self.store, *args)
        except sqlite3.Error as e:
            log.error("Cannot count ingest attempts (%s): %s", change.__name__, e)

    # -- the stages ------------------------------------------------------------------------------------------------

    def ingest(self, dump_id: str, given_up: attempts.GiveUp | None = None) -> bool:
        """Takes one dump as far as it goes (the stages in this module's doc); True when it is in the index
        afterwards. given_up: ingest gave this record up (store/attempts.py): it is indexed as invalid, without
        analysis, and its core is stored only if given_up.keep_core."""
        start = time.monotonic()
        dump = self.store.get(dump_id)
        if dump is None:
            dump = self._make_visible(dump_id, given_up)
            if dump is None:
                return False
        if dump.status == COMPRESSING:
            dump = self._make_stored(dump, start, given_up)
            if dump is None:
                return False  # waits for its analysis (collect)
        self._cleanup(dump)
        return True

    def _read_record(self, dump_id: str) -> dict | None:
        """The spool record; an unreadable one becomes a record of our own that says why (indexed invalid);
        None when it is gone (a concurrent sweep took it)."""
        spool_dir = self.settings.spool_dir
        try:
            return spool.read_record(spool_dir, dump_id)
        except spool.SpoolRecordError as e:
            if not spool.record_path(spool_dir, dump_id).exists():
                return None
            self.report_error("corrupt", f"{e}; indexed as invalid", dump_id)
            return _stand_in(spool_dir, dump_id, str(e))

    def _validate(self, dump_id: str, record: dict,
                  given_up: attempts.GiveUp | None = None) -> tuple[Path, elfcore.CoreInfo | None, str, list[str]]:
        """(raw core, what its headers say or None when there is none to store, status, problems). A record
        given up a second time keeps no core: not even its headers are read."""
        if given_up is not None and not given_up.keep_core:
            said = list(record.get("errors") or []) if record.get("given_up") else [given_up.reason]
            return spool.core_path(self.settings.spool_dir, dump_id), None, "invalid", \
                said + ["core not kept: storing it failed as well"]
        raw = spool.core_path(self.settings.spool_dir, dump_id)
        has_core = record.get("core") is not None
        if has_core and record.get("core") != raw.name:
            log.warning("Record %s names core %r; using %s", dump_id, record.get("core"), raw.name)
        core_missing = has_core and not raw.exists()
        info = elfcore.inspect_core(raw) if has_core and not core_missing else None
        if info is not None:  # the view rule's clean-exec check (userview.clean_exec)
            record[userview.AUXV_KEY] = {"at_secure": info.at_secure}
        return (raw, info, *_status(record, info, core_missing))

    def _make_visible(self, dump_id: str, given_up: attempts.GiveUp | None = None) -> Dump | None:
        """Stage visible: the dump's row, analysis and announcement, before its core is stored."""
        start = time.monotonic()
        record = self._read_record(dump_id)
        if record is None:
            return None
        if given_up is not None:  # what failed may be anything the record says: only the core is kept
            record = _stand_in(self.settings.spool_dir, dump_id, given_up.reason, given_up=True)
        elif not self._pod_policy(record):
            return None
        raw, info, status, problems = self._validate(dump_id, record, given_up)
        if self._analysable(status) and self.settings.analysis_enabled:
            analyses.mark_pending(self.store, dump_id)
        else:
            self._put_analysis(dump_id, self._not_analysed(record, status))
        row = row_from_record(record, status=COMPRESSING if info is not None else status,
                              problem="; ".join(problems) or None, path=None,
                              raw_bytes=raw.stat().st_size if info is not None else 0, stored_bytes=0,
                              sha256=None, ingest_seconds=time.monotonic() - start)
        self._announce("on_ingested", Dump.of_row(row))
        pause(INGEST_ENV, "ingested_announced")
        self.store.insert(row)
        dump = self.store.get(dump_id)
        self._update_views(changed=[dump])
        if info is not None and self._analysable(status) and self.settings.analysis_enabled:
            self._submit(self._parked.setdefault(dump_id, _Parked()), dump, raw, "analysis")
        self._checkpoint("visible")
        return dump

    def _pod_policy(self, record: dict) -> bool:
        """What a crash in a pod keeps (pods/policy.py), applied to its spool files before anything reads its
        core; False when nothing is (`none`). Decided once: the record keeps the decision (its `kubernetes`
        section), rewritten before the core goes, so a kill in between leaves a record without a core."""
        if record.get("unreadable") or record.get("orphan") or isinstance(record.get("kubernetes"), dict):
            return True
        ident = identity.identify(record)
        namespace = ident.get("pod_namespace")
        if not namespace:
            return True  # not a pod's (or a pod the runtime did not name): capture's outcome stands
        s = self.settings
        pod = None
        if s.pod_lookup is not None and ident.get("pod_name"):
            pod = s.pod_lookup.pod(namespace, ident["pod_name"], ident.get("pod_uid"))
        annotation = ident.get("core_annotation")
        if annotation is None and pod is not None:
            annotation = pod["annotations"].get(policy.ANNOTATION)
        decision = policy.decide(s.pods, namespace, annotation)
        if decision.warning:
            log.warning("%s: %s", record["id"], decision.warning)
        spool_dir = s.spool_dir
        if decision.keep == policy.NONE:
            spool.remove_record(spool_dir, record["id"])
            log.debug("Excluded %s (pod policy, %s): nothing kept", record["id"], decision.source)
            self._notify("on_excluded", lambda obs: obs.on_excluded(record, decision.source))
            return False
        record["kubernetes"] = decision.section(policy.chosen_labels(pod and pod["labels"], s.pods.pod_labels))
        if decision.keep == policy.METADATA and record.get("core") is not None:
            record["core"] = None
            record["capture"] = {**(record.get("capture") or {}), "dropped": True,
                                 "dropped_reason": policy.DROPPED_REASON}
        spool.rewrite_record(spool_dir, record)
        if record.get("core") is None:
            spool.core_path(spool_dir, record["id"]).unlink(missing_ok=True)
        return True

    def _make_stored(self, dump: Dump, start: float, given_up: attempts.GiveUp | None = None) -> Dump | None:
        """Stage stored: the raw core into the store, verified, and, once its analysis is done too, the row's
        final status; None while the analysis still runs. Validation is redone (it reads headers only): a
        restarted daemon has only the row and the spool."""
        s = self.settings
        raw, info, status, problems = self._validate(dump.id, dump.record, given_up)
        if given_up is not None:  # stored as invalid without waiting for its analysis (collect stores one that ends)
            self._parked.pop(dump.id, None)
        parked = self._parked.get(dump.id)
        if parked is None and info is not None and self._analysable(status):
            # A restarted daemon: the analysis is redone unless its result was stored before the kill.
            parked = self._parked[dump.id] = _Parked()
            found = analyses.analysis_for(self.store, dump.id)
            if s.analysis_enabled and (found is None or found["state"] == analyses.PENDING):
                self._submit(parked, dump, raw, "analysis")
        store_dir = paths.store_dir(s.state_dir)
        stored = parked.stored if parked is not None else None
        if stored is None:
            stored = self._stored_already(dump.id, store_dir, raw if info is not None else None)
        if stored is None and info is not None:
            try:
                stored = compress.store_file(raw, store_dir, dump.id, enabled=s.compression, level=s.level,
                                             threads=s.threads, checkpoint=self._checkpoint)
            except compress.DiskFullError as e:
                self.report_error("disk_full", f"{e}; the raw dump stays in the spool and is retried later", dump.id)
                raise _Retry() from e
            except compress.VerifyError as e:
                self.report_error("corrupt", f"Storing {dump.id} failed verification ({e}); retrying later", dump.id)
                raise _Retry() from e
            except compress.CompressError as e:
                self.report_error("compress", f"{e}; the raw dump stays in the spool", dump.id)
                raise _Retry() from e
            log.debug("Stored %s: %d -> %d bytes in %.2f s, %d zstd workers", dump.id, stored.raw_bytes,
                      stored.stored_bytes, stored.seconds, stored.workers)
        self._checkpoint("stored")
        mini: dict = {}
        seconds = time.monotonic() - start
        if parked is not None:
            if parked.stored is None:
                parked.stored, parked.seconds = stored, seconds
            if not parked.mini_asked and s.mini_core is not None:
                # After the store's copy, so a full disk leaves nothing of the dump in the store until the retry.
                self._submit(parked, dump, raw, "mini")
            if parked.jobs:
                return None
            del self._parked[dump.id]
            mini, seconds = parked.mini, parked.seconds  # this thread's time: the wait for the jobs was not ingest's
            problems += parked.problems
        final = dict(**mini, status=status, problem="; ".join(problems) or None,
                     path=stored.path.name if stored else None, raw_bytes=stored.raw_bytes if stored else 0,
                     stored_bytes=stored.stored_bytes if stored else 0, sha256=stored.sha256 if stored else None,
                     compress_seconds=stored.seconds if stored else 0.0,
                     ingest_seconds=(dump.ingest_seconds or 0.0) + seconds)
        self._announce("on_stored", replace(dump, **final))
        pause(INGEST_ENV, "stored_announced")
        self.store.complete(dump.id, **final)
        dump = self.store.get(dump.id)
        pause(INGEST_ENV, "indexed")  # from here on, stopping would only delay the cleanup
        self._update_views(changed=[dump])
        return dump

    def _stored_already(self, dump_id: str, store_dir: Path, raw: Path | None) -> compress.Stored | None:
        """The stored file a kill left in place (renamed there, so complete, but not yet in the row), if it
        verifies and holds as many bytes as the raw core; one that does not is removed and stored again."""
        path = compress.find_stored(store_dir, dump_id)
        if path is None:
            return None
        try:
            stored = compress.adopt(path)
            if raw is not None and raw.stat().st_size != stored.raw_bytes:
                raise compress.VerifyError(f"{path.name} holds {stored.raw_bytes} bytes, the raw core "
                                           f"{raw.stat().st_size}")
        except compress.VerifyError as e:
            self.report_error("corrupt", f"Stored {dump_id} left by an interrupted ingest: {e}; storing it again",
                              dump_id)
            path.unlink(missing_ok=True)
            return None
        log.info("Kept %s, stored before an interruption", path.name)
        return stored

    def _announce(self, event: str, dump: Dump) -> None:
        """Tells the observers about the row about to be committed, with its figures (corehandler/observer.py);
        its analysis is already stored."""
        stored = stored_event(dump, self.store.file_path(dump), analyses.analysis_for(self.store, dump.id))
        self._notify(event, lambda obs: getattr(obs, event)(dump.record, stored))

    def _write_mini(self, dump_id: str, raw: Path, problems: list[str]) -> dict:
        """The mini core's index columns, written from the raw core now (it is deleted after ingest); what
        went wrong or was left out becomes a problem of the dump, never a failed ingest."""
        limits = self.settings.mini_core
        if limits is None:
            return {}
        dest = paths.store_dir(self.settings.state_dir) / f"{dump_id}{minicore.SUFFIX}"
        try:
            mini = minicore.write(raw, dest, limits)
        except (minicore.MiniCoreError, OSError) as e:
            problems.append(f"no mini core: {e}")
            return {}
        if mini.cut:
            problems.append(f"mini core cut: {'; '.join(sorted(set(mini.cut)))}")
        log.debug("Mini core of %s: %d bytes, %d threads in %.1f ms", dump_id, mini.bytes, mini.threads,
                  mini.seconds * 1e3)
        return {"mini_path": dest.name, "mini_bytes": mini.bytes}

    def _cleanup(self, dump: Dump) -> None:
        """Stage cleanup: removes the raw files of a dump whose row is final."""
        spool_dir = self.settings.spool_dir
        if not spool.record_path(spool_dir, dump.id).exists() and not spool.core_path(spool_dir, dump.id).exists():
            return
        spool.core_path(spool_dir, dump.id).unlink(missing_ok=True)
        pause(INGEST_ENV, "core_removed")
        spool.remove_record(spool_dir, dump.id)
        log.info("Ingested %s: %s%s, %d -> %d bytes", dump.id, dump.status,
                 f" ({dump.problem})" if dump.problem else "", dump.raw_bytes, dump.stored_bytes)

    # -- analysis, in the workers (analysisqueue.py; corehandler/analysis/unwind.py) -------------------------------

    def _analysable(self, status: str) -> bool:
        """Whether a dump of this status gets a job: an unwinder run, a mini core, or both."""
        s = self.settings
        return status in ("ok", "truncated") and (s.analysis_enabled or s.mini_core is not None)

    def _not_analysed(self, record: dict, status: str) -> dict:
        if not self.settings.analysis_enabled:
            return findings.skipped(record, "analysis disabled ([analysis] enabled = false)")
        return findings.skipped(record, f"no core to analyse ({status})")

    def _submit(self, parked: _Parked, dump: Dump, raw: Path, kind: str) -> None:
        """Hands a job of the dump to the workers: its "analysis" (the unwinder and the symbols' sources) or its
        "mini" core, both read from the raw core, which stays in the spool until they are done."""
        record = dump.record
        if kind == "analysis":
            def work(job):
                return self._analyse(job, raw, record)

            def skip(reason):
                return findings.skipped(record, reason)
        else:
            parked.mini_asked = True

            def work(job):
                problems: list[str] = []
                if self._yield is not None:
                    self._yield("mini core")
                return self._write_mini(dump.id, raw, problems), problems

            def skip(reason):
                return {}, [f"no mini core: {reason}"]
        uid = record.get("uid") if isinstance(record.get("uid"), int) else None
        job = analysisqueue.Job(dump.id, uid, kind, work, skip)
        parked.jobs.add(job)
        self._workers.submit(job)

    def _analyse(self, job: analysisqueue.Job, raw: Path, record: dict) -> dict:
        """In a worker: the unwinder on the full raw core. Touches no index: the daemon's thread stores what
        this returns (collect)."""
        pause(ANALYSIS_ENV, "analysing", until=self._stop)
        if self._stop.is_set():  # the daemon stops: this outcome is dropped, the next start redoes it
            return findings.skipped(record, "the daemon stopped")
        failed: list[str] = []
        running = unwind.start(raw, record, self._analysis_limits())
        job.interrupt = lambda: unwind.interrupt(running)
        result = steps.run("analysis", failed, unwind.finish, running)
        if result is None:
            unwind.cancel(running)
            result = findings.skipped(record, failed[0], state=findings.FAILED)
        elif not self._stop.is_set():
            # From the same raw core, which stays in the spool until this job ends (compression writes the
            # store's copy beside it): the Python frames live on its heap (pyframes.py).
            pyframes.add(result, raw, record, self._analysis_limits(),
                         started=lambda run: setattr(job, "interrupt", lambda: unwind.interrupt(run)))
        symbols.annotate(result, self.settings.state_dir)
        return result

    def collect(self) -> int:
        """Stores what the workers finished and finishes the dumps whose cores are stored and jobs done;
        returns how many it finished. On the daemon's thread, each turn of its loop."""
        finished = 0
        for job in self._workers.finished():
            parked = self._parked.get(job.key)
            if parked is not None and job not in parked.jobs:
                parked = None  # a job of a dump given up and parked again since: the outcome is stale
            if parked is not None:
                parked.jobs.discard(job)
            if job.what == "mini":
                if parked is not None:
                    parked.mini, parked.problems = job.outcome
            elif self.store.get(job.key) is not None:  # an analysis, also of a dump given up meanwhile
                try:
                    self._put_analysis(job.key, job.outcome)
                except sqlite3.Error as e:  # still pending: the next sweep parks the dump again and redoes it
                    self.report_error("ingest", f"Cannot store the analysis of {job.key}: {e}; retrying later",
                                      job.key)
                    if parked is not None:
                        del self._parked[job.key]
                    continue
            if parked is not None and parked.stored is not None and not parked.jobs and self.try_ingest(job.key):
                finished += 1
        return finished

    def _put_analysis(self, dump_id: str, result: dict) -> None:
        analyses.put(self.store, dump_id, result)
        self._symbols.analysed(self.store, self.settings, dump_id, result)
        if result["state"] == findings.TIMEOUT:  # a failed unwind is a fact of the dump, a hang is ours
            self.report_error("analysis", f"Analysis of {dump_id}: {result['state']}: "
                              f"{'; '.join(result['problems'][:3]) or 'no frames'}; the dump is kept", dump_id)

    def _analysis_limits(self) -> findings.Limits:
        return debuginfod.reading_cache(self.settings.analysis_limits, self.settings.state_dir)

    # -- leftovers of a killed daemon (Daemon.recover) ----------------------------------------------------------

    def analyse_indexed(self) -> None:
        """Dumps indexed without an analysis: analysed now if their raw core is still in the spool (a kill
        after indexing), else marked skipped. Before sweep, which removes such raw cores."""
        for dump_id, state in analyses.unanalysed(self.store):
            raw = spool.core_path(self.settings.spool_dir, dump_id)
            dump = self.store.get(dump_id)
            if dump.status == COMPRESSING:  # resumed by ingest, which hands its analysis to the workers
                continue
            if self.settings.analysis_enabled and raw.exists() and dump.status in ("ok", "truncated"):
                result = unwind.analyse(raw, dump.record, self._analysis_limits())
                pyframes.add(result, raw, dump.record, self._analysis_limits())
            else:
                why = "killed mid-analysis" if state == analyses.PENDING else "indexed before analysis existed"
                result = findings.skipped(dump.record, f"raw core gone before it was analysed ({why})")
            analyses.put(self.store, dump_id, result)
            log.info("Analysis of %s, indexed earlier: %s", dump_id, result["state"])

    def index_stray(self, path: Path, dump_id: str) -> None:
        problem = "store file found without index row or spool record"
        try:
            raw_bytes, digest = compress.measure(path)
        except compress.VerifyError as e:
            raw_bytes, digest, problem = 0, None, f"{problem}; {e}"
            self.report_error("corrupt", f"Stray store file {path.name}: {e}", dump_id)
        record = {"schema": spool.RECORD_SCHEMA, "id": dump_id, "core": None, "orphan": True, "errors": [problem]}
        self.store.insert(row_from_record(record, status="orphan", problem=problem, path=path.name,
                                          raw_bytes=raw_bytes, stored_bytes=path.stat().st_size, sha256=digest))
        log.warning("Indexed stray store file %s: %s", path.name, problem)
