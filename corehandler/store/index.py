"""The store: compressed dumps in <state>/store/ and their SQLite index, one row per dump.

A dump retention removes loses its file and its row; the index keeps only a count per rule (the deletions
table: dumps and bytes removed by each rule, ever), which the metrics read at scrape time. A row marked
`deleting` is a deletion under way (or one a kill interrupted, which finish_deletions completes).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from pathlib import Path
from typing import Iterable

from corehandler import __version__, paths
from corehandler.atomicfile import fsync_dir
from corehandler.errors import EXIT_INDEX_NEWER, EXIT_INDEX_OLDER, EXIT_PERMISSION, CorehandlerError
from corehandler.paths import DIR_MODES
from corehandler.store import analyses, match
from corehandler.store.dumprow import _COLUMNS, COMPRESSING, Dump
from corehandler.store.match import Filter

# Every table of index.sqlite is spelled and migrated here, and nowhere else. 5: the analysis table is part
# of the schema (before, the daemon made it at start); the upload queue's tables come with the first upload.
# 7: records lose proc.oci_config (_SCRUB_OCI_CONFIG). 8: ingest_attempts (store/attempts.py).
# 9: uploads.core, the verified core in the bucket (JSON), kept so a retry does not send it again.
# 10: the mini core's columns (mini_path, mini_bytes). 11: the re-symbolising schedule (_RESYMBOLISE_TABLE).
# 12: written_by, the corehandler version that wrote the index (_WRITER_TABLE).
# 13: signature v2 (analysis.signature_v1_id; every stored analysis re-signed from its frames) and the crash's
# reason line (analysis.reason).
SCHEMA_VERSION = 13

# Only the daemon (at start) and `corehandler migrate` migrate, after a copy of the index named for its old
# schema (index.schema-11.sqlite) is made beside it; the newest BACKUPS_KEPT copies stay.
BACKUPS_KEPT = 2
CREATING_WAIT = 5.0  # s a reader waits for a daemon's first transaction, which creates the index's tables

_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS dumps (
    id TEXT PRIMARY KEY,
    crashed_at REAL NOT NULL,
    ingested_at REAL NOT NULL,
    pid INTEGER, uid INTEGER, gid INTEGER, signal INTEGER,
    exe TEXT, comm TEXT, cmdline TEXT, hostname TEXT, boot_id TEXT,
    raw_bytes INTEGER NOT NULL DEFAULT 0,
    stored_bytes INTEGER NOT NULL DEFAULT 0,
    sha256 TEXT,
    status TEXT NOT NULL,
    problem TEXT,
    path TEXT,
    deleting INTEGER NOT NULL DEFAULT 0,
    record TEXT NOT NULL,
    deleted_rule TEXT,
    freed_bytes INTEGER,
    compress_seconds REAL,
    ingest_seconds REAL,
    corrupt TEXT,
    mini_path TEXT,
    mini_bytes INTEGER
)"""
_ANALYSIS_TABLE = """
CREATE TABLE IF NOT EXISTS analysis (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    analysed_at REAL NOT NULL,
    seconds REAL,
    signature TEXT,
    signature_id TEXT,
    signature_version INTEGER,
    exact_key TEXT,
    exact_version INTEGER,
    exe_build_id TEXT,
    runtime TEXT,
    container_id TEXT,
    pod_uid TEXT,
    pod_name TEXT,
    unit TEXT,
    result TEXT NOT NULL,
    signature_v1_id TEXT,
    reason TEXT
)"""
_ANALYSIS_INDEXES = ("CREATE INDEX IF NOT EXISTS analysis_signature ON analysis (signature_id)",
            "CREATE INDEX IF NOT EXISTS analysis_exact ON analysis (exact_key)",
            "CREATE INDEX IF NOT EXISTS analysis_signature_v1 ON analysis (signature_v1_id)")
_UPLOAD_TABLES = (
    """CREATE TABLE IF NOT EXISTS uploads (
        id TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt REAL NOT NULL DEFAULT 0,
        last_error TEXT,
        reason TEXT,
        queued_at REAL NOT NULL,
        done_at REAL,
        budget TEXT,
        core_key TEXT,
        sidecar_key TEXT,
        bytes INTEGER NOT NULL DEFAULT 0,
        seconds REAL NOT NULL DEFAULT 0,
        core TEXT)""",
    "CREATE INDEX IF NOT EXISTS uploads_due ON uploads (state, next_attempt)",
    # Failures by reason since the index began: a counter the metrics read at scrape time.
    "CREATE TABLE IF NOT EXISTS upload_failures (reason TEXT PRIMARY KEY, count INTEGER NOT NULL)",
    # The problem holding the queue, if any (one row): what `status` shows.
    "CREATE TABLE IF NOT EXISTS upload_problem (one INTEGER PRIMARY KEY CHECK (one = 1), reason TEXT, "
    "message TEXT, since REAL)",
)


# Ingest attempts of spool records not indexed yet, counted before each attempt (store/attempts.py).
_ATTEMPTS_TABLE = """
CREATE TABLE IF NOT EXISTS ingest_attempts (
    id TEXT PRIMARY KEY,
    attempts INTEGER NOT NULL,
    failures INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    last_at REAL NOT NULL,
    given_up INTEGER NOT NULL DEFAULT 0
)"""

# When the daemon next looks for the debug info a dump's trace lacks (analysis/resymbolise.py): tries made so far.
_RESYMBOLISE_TABLE = """
CREATE TABLE IF NOT EXISTS resymbolise (
    id TEXT PRIMARY KEY,
    tries INTEGER NOT NULL,
    due REAL NOT NULL
)"""
_RESYMBOLISE_DUE = "CREATE INDEX IF NOT EXISTS resymbolise_due ON resymbolise (due)"

# The version of corehandler that created, migrated or last served the index (one row): what a downgrade's
# refusal names.
_WRITER_TABLE = """
CREATE TABLE IF NOT EXISTS written_by (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    version TEXT NOT NULL,
    schema INTEGER NOT NULL,
    at REAL NOT NULL
)"""
_RECORD_WRITER = ("INSERT INTO written_by (one, version, schema, at) VALUES (1, ?, ?, ?) ON CONFLICT (one) "
                  "DO UPDATE SET version = excluded.version, schema = excluded.schema, at = excluded.at")

_DELETIONS_TABLE = """
CREATE TABLE IF NOT EXISTS deletions (
    rule TEXT PRIMARY KEY,
    dumps INTEGER NOT NULL,
    freed_bytes INTEGER NOT NULL
)"""
_COUNT_DELETIONS = ("INSERT INTO deletions (rule, dumps, freed_bytes) VALUES (?, ?, ?) ON CONFLICT (rule) "
                    "DO UPDATE SET dumps = dumps + excluded.dumps, freed_bytes = freed_bytes + excluded.freed_bytes")
_SCHEMA_INDEXES = ("CREATE INDEX IF NOT EXISTS dumps_crashed_at ON dumps (crashed_at)",
                   "CREATE INDEX IF NOT EXISTS dumps_exe ON dumps (exe)")

# Added by schema 2; an index of schema 1 gets them by ALTER TABLE. Schema 4 adds corrupt: what a check of the
# stored file found wrong (NULL: nothing found), set by whoever found it (`info`, `dump`, `debug`, `list` as
# root), read by the daemon (errors_total{kind="corrupt"}) and the metrics (corehandler_store_corrupt_dumps).
# Schema 9 adds the mini core (analysis/minicore.py): its file in the store and its size, NULL when it has none.
_ADDED_COLUMNS = (("deleted_rule", "TEXT"), ("freed_bytes", "INTEGER"), ("compress_seconds", "REAL"),
                  ("ingest_seconds", "REAL"), ("corrupt", "TEXT"), ("mini_path", "TEXT"), ("mini_bytes", "INTEGER"))
# v0.2's csplice copied a container's config.json into proc.oci_config, process.env and all (where Kubernetes
# puts secrets), for a cgroup any user could name; a user's view and the bucket carried it. Records now hold
# proc.container, the bundle's naming annotations only (csplice/container.c).
_SCRUB_OCI_CONFIG = ("UPDATE dumps SET record = json_remove(record, '$.proc.oci_config') "
                     "WHERE json_valid(record) AND json_type(record, '$.proc.oci_config') IS NOT NULL")
# A dump a user can see: not half deleted.
_LIVE = "deleting = 0"
# The rule of a deletion a schema-1 daemon started and a kill interrupted (it did not record one), and of a
# schema-2 tombstone without one.
UNKNOWN_RULE = "unknown"


def blocks(path: Path | None) -> int:
    """The bytes a file occupies (0 when there is none, or it is gone)."""
    try:
        return path.stat().st_blocks * 512 if path is not None else 0
    except FileNotFoundError:
        return 0


class StoreError(CorehandlerError):
    """The index cannot be opened or is of a newer schema."""


class StoreAccessError(StoreError):
    """The index is root's: this user may not read it (exit 4, not a damaged index)."""

    exit_code = EXIT_PERMISSION


class IndexNewerError(StoreError):
    """A newer corehandler wrote the index (a downgrade, or mixed versions): nothing here reads or migrates it."""

    exit_code = EXIT_INDEX_NEWER


class IndexOlderError(StoreError):
    """An older corehandler wrote the index and it is not migrated yet: only the daemon or `migrate` do it."""

    exit_code = EXIT_INDEX_OLDER


@dataclasses.dataclass(frozen=True)
class IndexVersion:
    """What an index says of itself: its schema and the corehandler version that wrote it (None before
    schema 12 recorded it)."""

    schema: int
    version: str | None

    def describe(self) -> str:
        # Before schema 12 the index did not say which version wrote it.
        return f"{f'corehandler {self.version}' if self.version else 'an older corehandler'} (schema {self.schema})"


@dataclasses.dataclass(frozen=True)
class Migration:
    """What one migration did, for its one log line."""

    before: IndexVersion
    backup: Path
    removed: tuple[Path, ...]  # older copies past BACKUPS_KEPT

    def describe(self) -> str:
        gone = f"; removed the older {', '.join(p.name for p in self.removed)}" if self.removed else ""
        return (f"Migrated the index from {self.before.describe()} to corehandler {__version__} (schema "
                f"{SCHEMA_VERSION}); the old index is kept as {self.backup} (the newest {BACKUPS_KEPT} such copies "
                f"are kept{gone})")


def backup_path(state_dir: Path, schema: int) -> Path:
    return Path(state_dir) / f"index.schema-{schema}.sqlite"


def backups(state_dir: Path) -> list[tuple[int, Path]]:
    """The copies migrations left, by the schema they hold, oldest first."""
    found = []
    for p in Path(state_dir).glob("index.schema-*.sqlite"):
        number = p.name[len("index.schema-"):-len(".sqlite")]
        if number.isdigit():
            found.append((int(number), p))
    return sorted(found)


def _this() -> str:
    return f"corehandler {__version__} (schema {SCHEMA_VERSION})"


def _newer(index_path: Path, found: IndexVersion) -> IndexNewerError:
    copies = [p for schema, p in backups(index_path.parent) if schema <= SCHEMA_VERSION]
    back = f"restore {copies[-1]} (the index before it was migrated) or " if copies else ""
    return IndexNewerError(f"{index_path} was written by {found.describe()}, newer than this {_this()}: "
                           f"{back}install corehandler {found.version or 'of that schema'} or newer again")


def _older(index_path: Path, found: IndexVersion) -> IndexOlderError:
    return IndexOlderError(f"{index_path} was written by {found.describe()}, older than this {_this()}, and is not "
                           "migrated yet: the daemon migrates it when it starts (systemctl restart corehandler), "
                           "or run `corehandler migrate` as root")


def index_version(db: sqlite3.Connection) -> IndexVersion:
    schema = db.execute("PRAGMA user_version").fetchone()[0]
    try:
        row = db.execute("SELECT version FROM written_by WHERE one = 1").fetchone()
    except sqlite3.OperationalError:  # before schema 12
        row = None
    return IndexVersion(schema, row[0] if row else None)


def read_version(state_dir: Path) -> IndexVersion | None:
    """The schema and writer of the index in state_dir, read-only; None when there is none."""
    path = paths.index_path(state_dir)
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            return index_version(db)
        finally:
            db.close()
    except sqlite3.Error as e:
        if not os.access(path, os.R_OK):
            raise StoreAccessError(f"cannot open the index {path}: permission denied") from e
        raise StoreError(f"cannot open the index {path}: {e}") from e


def refusal(state_dir: Path, found: IndexVersion, schema: int = SCHEMA_VERSION) -> IndexNewerError | None:
    """Why a corehandler reading schema `schema` (this one by default) cannot use the index (a downgrade),
    None when it can, directly or by migrating it."""
    if found.schema <= schema:
        return None
    if schema == SCHEMA_VERSION:
        return _newer(paths.index_path(state_dir), found)
    copies = [p for n, p in backups(state_dir) if n <= schema]
    back = f"restore {copies[-1]} after the downgrade or " if copies else ""
    return IndexNewerError(f"{paths.index_path(state_dir)} was written by {found.describe()}, which a corehandler "
                           f"of schema {schema} cannot read: {back}keep corehandler {found.version or 'as it is'}")


def _is_empty(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0


def _backup(db: sqlite3.Connection, path: Path) -> None:
    """A consistent copy of the index (SQLite's online backup), whole under its name or not there at all."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    try:
        copy = sqlite3.connect(tmp)
        try:
            db.backup(copy)
            copy.execute("PRAGMA journal_mode=DELETE")  # one file, readable without its -wal
        finally:
            copy.close()
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def create_upload_tables(db: sqlite3.Connection) -> None:
    """The upload queue's tables, all in one transaction (a reader sees all of them or none)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in _UPLOAD_TABLES:
            db.execute(statement)
        db.commit()
    except BaseException:
        db.rollback()
        raise


class Store:
    """The index and the directory of stored files. One connection per Store; not shared across threads."""

    def __init__(self, state_dir: Path, *, readonly: bool = False, migrate: bool = False):
        """readonly: opened with SQLite's mode=ro (the read verbs, the metrics, status). migrate: an index an
        older corehandler wrote is migrated, after a backup (the daemon, `corehandler migrate`); without it such
        an index is refused (IndexOlderError), as one a newer corehandler wrote always is (IndexNewerError).
        Who writes may create a missing index."""
        self.state_dir = Path(state_dir)
        self.store_dir = paths.store_dir(self.state_dir)
        self.index_path = paths.index_path(self.state_dir)
        self.readonly = readonly
        self.migration: Migration | None = None
        try:
            if readonly and not self.index_path.exists():
                raise StoreError(f"no index at {self.index_path}")
            if readonly:
                self.db = self._connect_readonly()
                self._check(self.db)
            else:
                for d, kind in ((self.state_dir, "state"), (self.store_dir, "store")):
                    d.mkdir(mode=DIR_MODES[kind], parents=True, exist_ok=True)
                self.db = sqlite3.connect(self.index_path, timeout=30)
                os.chmod(self.index_path, 0o600)
                if _is_empty(self.db) and self.db.execute("PRAGMA user_version").fetchone()[0] == 0:
                    self._upgrade(self.db, 0)
                elif migrate:
                    self.migration = self._migrate(self.db)
                else:
                    self._check(self.db)
        except PermissionError as e:
            raise StoreAccessError(f"cannot open the index {self.index_path}: permission denied") from e
        except (sqlite3.Error, OSError) as e:
            if not os.access(self.index_path, os.R_OK) and self.index_path.exists():
                raise StoreAccessError(f"cannot open the index {self.index_path}: permission denied") from e
            raise StoreError(f"cannot open the index {self.index_path}: {e}") from e

    def _connect_readonly(self) -> sqlite3.Connection:
        db = sqlite3.connect(f"file:{self.index_path}?mode=ro", uri=True, timeout=30)
        db.execute("PRAGMA user_version").fetchone()  # fails here if it is not an SQLite file
        # A file with no table yet is an index its daemon is creating (its first transaction not committed):
        # read it once that is done, not as an "older" one.
        deadline = time.monotonic() + CREATING_WAIT
        while _is_empty(db) and db.execute("PRAGMA user_version").fetchone()[0] == 0:
            if time.monotonic() > deadline:
                db.close()
                raise StoreError(f"the index {self.index_path} holds nothing yet (its daemon is creating it)")
            time.sleep(0.05)
        return db

    def _check(self, db: sqlite3.Connection) -> None:
        found = index_version(db)
        if found.schema > SCHEMA_VERSION:
            raise _newer(self.index_path, found)
        if found.schema < SCHEMA_VERSION:
            raise _older(self.index_path, found)

    def _migrate(self, db: sqlite3.Connection) -> Migration | None:
        """Brings an older index to this schema after a backup; records this version as the index's writer."""
        found = index_version(db)
        if found.schema > SCHEMA_VERSION:
            raise _newer(self.index_path, found)
        if found.schema == SCHEMA_VERSION:
            if found.version != __version__:
                with db:
                    db.execute(_RECORD_WRITER, (__version__, SCHEMA_VERSION, time.time()))
            return None
        backup = backup_path(self.state_dir, found.schema)
        _backup(db, backup)
        self._upgrade(db, found.schema)
        removed = tuple(p for _, p in backups(self.state_dir)[:-BACKUPS_KEPT])
        for old in removed:
            old.unlink(missing_ok=True)
        return Migration(found, backup, removed)

    def _upgrade(self, db: sqlite3.Connection, version: int) -> None:
        """Creates (version 0) or migrates the tables, in one transaction: a kill leaves the old schema
        untouched or the new one complete."""
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(_SCHEMA_TABLE)
            db.execute(_DELETIONS_TABLE)
            db.execute(_ANALYSIS_TABLE)
            db.execute(_ATTEMPTS_TABLE)
            db.execute(_RESYMBOLISE_TABLE)
            db.execute(_RESYMBOLISE_DUE)
            db.execute(_WRITER_TABLE)
            columns = {row[1] for row in db.execute("PRAGMA table_info(analysis)")}
            for name in ("signature_v1_id", "reason"):
                if name not in columns:
                    db.execute(f"ALTER TABLE analysis ADD COLUMN {name} TEXT")
            for statement in _ANALYSIS_INDEXES:
                db.execute(statement)
            # Signature v2: the stored frames give each analysis the new signature, its v1 id kept beside it
            # so groups, filters and alerts link the two (docs/analysis.md, "Grouping keys").
            analyses.resign_all(db)
            have = {row[1] for row in db.execute("PRAGMA table_info(dumps)")}
            for name, kind in _ADDED_COLUMNS:
                if name not in have:
                    db.execute(f"ALTER TABLE dumps ADD COLUMN {name} {kind}")
            if "deleted_at" in have:
                # Schema 2 kept a tombstone row per deleted dump: they become the count per rule.
                tombstones = db.execute("SELECT COALESCE(deleted_rule, ?), COUNT(*), SUM(COALESCE(freed_bytes, 0)) "
                                        "FROM dumps WHERE deleted_at IS NOT NULL GROUP BY 1", (UNKNOWN_RULE,))
                db.executemany(_COUNT_DELETIONS, tombstones.fetchall())
                db.execute("DELETE FROM dumps WHERE deleted_at IS NOT NULL")
                db.execute("ALTER TABLE dumps DROP COLUMN deleted_at")
            # Schema 6 names a dump whose core was not kept "dropped", as the record and the metrics do.
            db.execute("UPDATE dumps SET status = 'dropped' WHERE status = 'metadata_only'")
            if version < 7:
                db.execute(_SCRUB_OCI_CONFIG)
            for statement in _SCHEMA_INDEXES:
                db.execute(statement)
            uploads = {row[1] for row in db.execute("PRAGMA table_info(uploads)")}
            if uploads and "core" not in uploads:
                db.execute("ALTER TABLE uploads ADD COLUMN core TEXT")
            db.execute(_RECORD_WRITER, (__version__, SCHEMA_VERSION, time.time()))
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.commit()
        except BaseException:
            db.rollback()
            raise

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def file_path(self, dump: Dump) -> Path | None:
        return self.store_dir / dump.path if dump.path else None

    def mini_path(self, dump: Dump) -> Path | None:
        return self.store_dir / dump.mini_path if dump.mini_path else None

    # The CLI reads a dump's analysis through these, from the index or (userview.UserView) a user's view.
    def analysis_for(self, dump_id: str) -> dict | None:
        return analyses.analysis_for(self, dump_id)

    def analysis_summaries(self, ids: Iterable[str]) -> dict[str, dict]:
        return analyses.summaries(self, ids)

    def insert(self, row: dict) -> bool:
        """Adds a row; False when the id is already indexed (ingest is idempotent)."""
        columns = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        with self.db:
            cur = self.db.execute(f"INSERT OR IGNORE INTO dumps ({columns}) VALUES ({marks})", row)
        return cur.rowcount == 1

    def complete(self, dump_id: str, **values) -> bool:
        """A `compressing` row takes its final status and the stored file's figures (the columns given);
        False when it is not `compressing` (already completed)."""
        sets = ", ".join(f"{k} = :{k}" for k in values)
        with self.db:
            cur = self.db.execute(f"UPDATE dumps SET {sets} WHERE id = :id AND status = :compressing",
                                  {**values, "id": dump_id, "compressing": COMPRESSING})
        return cur.rowcount == 1

    def compressing(self) -> list[str]:
        """Ids of the dumps listed but not yet stored, oldest first."""
        return [r[0] for r in self.db.execute("SELECT id FROM dumps WHERE status = ? ORDER BY crashed_at, id",
                                              (COMPRESSING,))]

    def get(self, dump_id: str) -> Dump | None:
        """The row of that exact id, half deleted or not (ingest asks whether an id is indexed)."""
        row = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM dumps WHERE id = ?", (dump_id,)).fetchone()
        return Dump.from_row(row) if row else None

    def query(self, f: Filter = Filter()) -> list[Dump]:
        """The dumps f matches (match.py's rule), oldest first. SQL narrows by the exact columns (id, pid,
        time, signal, uid); the names are compared byte for byte in match.select, on the records."""
        where, args = [_LIVE], []

        def any_of(clause: str, values: Iterable) -> None:
            values = list(values)
            if values:
                where.append("(" + " OR ".join([clause] * len(values)) + ")")
                args.extend(values)

        if f.ids:
            where.append("(" + " OR ".join(["substr(id, 1, ?) = ?"] * len(f.ids)) + ")")
            for i in f.ids:
                args.extend((len(i), i))
        any_of("pid = ?", f.pids)
        for clause, value in (("crashed_at >= ?", f.since), ("crashed_at <= ?", f.until),
                              ("signal = ?", f.signal), ("uid = ?", f.uid)):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM dumps WHERE {' AND '.join(where)} ORDER BY crashed_at DESC, id DESC"
        # The newest N in SQL when nothing is left for Python to decide (an id prefix must be seen unique).
        if f.last is not None and not f.by_name and not f.ids:
            sql += " LIMIT ?"
            args.append(f.last)
        rows = self.db.execute(sql, args).fetchall()
        return match.select([Dump.from_row(r) for r in reversed(rows)], f)

    def mark_corrupt(self, dump: Dump, problem: str) -> bool:
        """Records that the dump's stored file failed a check; True when the mark is new. Needs write access
        to the index (root); a read-only Store writes through a connection of its own."""
        if dump.corrupt is not None:
            return False
        return self._write_mark("UPDATE dumps SET corrupt = ? WHERE id = ? AND corrupt IS NULL", (problem, dump.id))

    def clear_corrupt(self, dump: Dump) -> bool:
        """Forgets a corruption mark once the stored file passed a whole check again (restored from a backup,
        or a mark from a read that failed for another reason): the counts follow the store. True when cleared."""
        if dump.corrupt is None:
            return False
        return self._write_mark("UPDATE dumps SET corrupt = NULL WHERE id = ? AND corrupt = ?", (dump.id, dump.corrupt))

    def _write_mark(self, sql: str, args: tuple) -> bool:
        db = self.db if not self.readonly else sqlite3.connect(self.index_path, timeout=30)
        try:
            with db:
                cur = db.execute(sql, args)
        finally:
            if db is not self.db:
                db.close()
        return cur.rowcount == 1

    def corrupt(self) -> list[tuple[str, str]]:
        """(id, problem) of every stored dump marked corrupt."""
        return self.db.execute(f"SELECT id, corrupt FROM dumps WHERE {_LIVE} AND corrupt IS NOT NULL "
                               "ORDER BY crashed_at, id").fetchall()

    def all(self, include_deleting: bool = False) -> list[Dump]:
        """The stored dumps (and those whose deletion a kill interrupted, if asked), oldest first."""
        where = "" if include_deleting else f"WHERE {_LIVE}"
        rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM dumps {where} ORDER BY crashed_at, id")
        return [Dump.from_row(r) for r in rows]

    def sizes(self) -> list[tuple[str, float, str | None, int, bool, int | None]]:
        """(id, crashed_at, exe, bytes, coreless, uid) of every dump: what retention plans with, without parsing
        every record. Its bytes are the stored file's plus its record's and analysis's in the index: a
        metadata-only dump of a hostile argv is a record of hundreds of KiB."""
        return [(i, t, exe, size, bool(coreless), uid) for i, t, exe, size, coreless, uid in self.db.execute(
            "SELECT d.id, d.crashed_at, d.exe, d.stored_bytes + LENGTH(d.record) + COALESCE(LENGTH(a.result), 0), "
            "d.path IS NULL AND d.status != ?, d.uid FROM dumps d LEFT JOIN analysis a ON a.id = d.id "
            f"WHERE d.{_LIVE} ORDER BY d.crashed_at, d.id", (COMPRESSING,))]

    def minis(self) -> dict[str, tuple[bool, int]]:
        """{id: (full core still stored, mini core bytes)} of every dump with a mini core."""
        rows = self.db.execute(f"SELECT id, path IS NOT NULL, COALESCE(mini_bytes, 0) FROM dumps WHERE {_LIVE} "
                               "AND mini_path IS NOT NULL")
        return {i: (bool(full), int(size)) for i, full, size in rows}

    def totals(self) -> tuple[int, int]:
        """Stored bytes and number of dumps."""
        size, count = self.db.execute("SELECT COALESCE(SUM(stored_bytes), 0), COUNT(*) FROM dumps").fetchone()
        return int(size), int(count)

    def by_status(self) -> dict[str, tuple[int, int]]:
        """Number of dumps and their stored bytes, per status."""
        rows = self.db.execute("SELECT status, COUNT(*), COALESCE(SUM(stored_bytes), 0) FROM dumps GROUP BY status")
        return {status: (int(count), int(size)) for status, count, size in rows}

    def latest_crash(self) -> float | None:
        """When the most recent stored dump crashed; None for an empty store."""
        return self.db.execute("SELECT MAX(crashed_at) FROM dumps").fetchone()[0]

    def deletions(self) -> dict[str, tuple[int, int]]:
        """Dumps deleted and bytes freed, per rule, since the index was created."""
        rows = self.db.execute("SELECT rule, dumps, freed_bytes FROM deletions ORDER BY rule")
        return {rule: (int(count), int(freed)) for rule, count, freed in rows}

    def delete(self, dump: Dump, rule: str) -> int | None:
        """Removes a dump's file and its row, counting it under rule; returns the bytes freed, or None when
        another process (the daemon, or `vacuum`) had already started deleting it.

        The row is marked first, with the rule and the file's size, so a kill at any point leaves either the
        dump untouched or a marked row that `finish_deletions` completes with the same figures, never a file
        without a row nor a deletion counted twice. Only the process whose mark took counts the deletion: a
        second mark would overwrite the size with what is left of a file being unlinked."""
        freed = sum(blocks(p) for p in (self.file_path(dump), self.mini_path(dump)))
        with self.db:
            marked = self.db.execute("UPDATE dumps SET deleting = 1, deleted_rule = ?, freed_bytes = ? "
                                     "WHERE id = ? AND deleting = 0",
                                     (rule, freed, dump.id)).rowcount
        if not marked:
            return None
        self._finish_delete(dump.id)
        return freed

    def drop_full_core(self, dump: Dump, rule: str) -> int | None:
        """Deletes a dump's full core and keeps its row and mini core, counting the core under rule; returns the
        bytes freed, or None when there was no full core left to delete (another process took it first).

        The row forgets the file first: a kill before the unlink leaves a store file whose id has a row, which
        the daemon's recovery removes (never indexes as a stray)."""
        path = self.file_path(dump)
        if path is None:
            return None
        freed = blocks(path)
        with self.db:
            # A corruption mark was the full core's: it goes with it, so the corrupt count follows the store.
            taken = self.db.execute("UPDATE dumps SET path = NULL, stored_bytes = 0, corrupt = NULL WHERE id = ? "
                                    "AND path = ? AND deleting = 0", (dump.id, dump.path)).rowcount
            if taken:
                self.db.execute(_COUNT_DELETIONS, (rule, 1, freed))
        if not taken:
            return None
        path.unlink(missing_ok=True)
        return freed

    def _finish_delete(self, dump_id: str) -> Dump | None:
        """The second half of delete: unlink the file, then drop the row and count the deletion, in one
        transaction. Idempotent. Returns the row as it was, with the rule and the bytes freed."""
        dump = self.get(dump_id)
        if dump is None or not dump.deleting:
            return None
        freed = dump.freed_bytes
        for path in (self.file_path(dump), self.mini_path(dump)):
            if path is not None:
                if dump.freed_bytes is None:  # marked by a schema-1 daemon, which measured nothing beforehand
                    freed = (freed or 0) + blocks(path)
                path.unlink(missing_ok=True)
        done = dataclasses.replace(dump, deleted_rule=dump.deleted_rule or UNKNOWN_RULE, freed_bytes=freed or 0)
        with self.db:
            if self.db.execute("DELETE FROM dumps WHERE id = ? AND deleting = 1", (dump_id,)).rowcount:
                self.db.execute(_COUNT_DELETIONS, (done.deleted_rule, 1, done.freed_bytes))
            analyses.forget(self.db, dump_id)
        return done

    def finish_deletions(self) -> list[Dump]:
        """Completes deletions a kill interrupted; returns the rows they removed."""
        pending = [d.id for d in self.all(include_deleting=True) if d.deleting]
        return [t for t in map(self._finish_delete, pending) if t is not None]

    def unindexed_files(self) -> list[Path]:
        """Store files without an index row (temp files excluded)."""
        known = {r[0] for r in self.db.execute("SELECT path FROM dumps WHERE path IS NOT NULL UNION "
                                               "SELECT mini_path FROM dumps WHERE mini_path IS NOT NULL")}
        try:
            names = os.listdir(self.store_dir)
        except FileNotFoundError:
            return []
        return sorted(self.store_dir / n for n in names if not n.startswith(".") and n not in known)

    def temp_files(self) -> list[Path]:
        try:
            return sorted(self.store_dir / n for n in os.listdir(self.store_dir) if n.startswith(".tmp."))
        except FileNotFoundError:
            return []
