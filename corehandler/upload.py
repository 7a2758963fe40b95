"""Upload: the durable queue in the index and the uploader that drains it into the fleet's bucket.

The queue is the `uploads` table of the index (one row per dump: state pending | uploading | done | failed,
attempts, next attempt, last error and its reason). The daemon enqueues a dump when it is indexed; the
uploader, a thread of the daemon with its own connection, sends the oldest due one:

  1. the fleet budget (if configured): claim one of N slots for the dump's signature and crash day with a
     conditional create; none left means the dump's core stays home and only its sidecar goes up;
  2. the core, by s3transfer (multipart past one part, SHA-256 checksums per part), unless HEAD shows it is
     already there from an attempt a kill interrupted; then HEAD again: size and checksum must match what
     was read from the store, or the attempt fails;
  3. the sidecar, last: whoever sees it can trust the core it names.
Every step is safe to redo, so a kill anywhere leaves the row pending (uploading rows go back to pending at
start) and the next attempt finishes with exactly one core and one sidecar; multipart uploads a kill left
behind under this host's prefix are aborted at start.

A failure is retried with exponential backoff and jitter up to retry_max, never given up on (an endpoint
down for an hour loses nothing); one caused by the bucket's configuration (credentials, missing bucket,
clock skew, TLS, no connection) holds the whole queue, so it is logged once, shown in `status`, and tried
again at the backoff's pace by one request, not by every dump. A dump that is gone from the store before
it went up is `failed` with reason `lost` (retention's keep_free had to take it, or it vanished).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import random
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from corehandler import analysis_index, bucket
from corehandler.bucket import BucketError, Target
from corehandler.errors import CorehandlerError
from corehandler.store import Store

log = logging.getLogger("corehandler.upload")

STATES = ("pending", "uploading", "done", "failed")
WAITING = ("pending", "uploading")
SIDECAR_SCHEMA = 1
LOST = "lost"
KEPT_BACK = "kept_back"
CHUNK = 8 << 20
PAUSE_ENV = "COREHANDLER_TEST_UPLOAD_PAUSE_AT"  # test-only: "core_sent" stops forever before the sidecar

_SCHEMA = (
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
        seconds REAL NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS uploads_due ON uploads (state, next_attempt)",
    # Failures by reason since the index began: a counter the metrics read at scrape time.
    "CREATE TABLE IF NOT EXISTS upload_failures (reason TEXT PRIMARY KEY, count INTEGER NOT NULL)",
    # The problem holding the queue, if any (one row): what `status` shows.
    "CREATE TABLE IF NOT EXISTS upload_problem (one INTEGER PRIMARY KEY CHECK (one = 1), reason TEXT, "
    "message TEXT, since REAL)",
)


# --- the queue (plain functions on an index connection) --------------------------------------------------

def ensure_schema(db: sqlite3.Connection) -> None:
    """Creates the queue's tables, all in one transaction (a reader sees all of them or none)."""
    if _has_queue(db):
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA:
            db.execute(statement)
        db.commit()
    except BaseException:
        db.rollback()
        raise


def _has_queue(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'uploads'").fetchone() is not None


def enqueue(db: sqlite3.Connection, dump_id: str, now: float | None = None) -> bool:
    with db:
        cur = db.execute("INSERT OR IGNORE INTO uploads (id, state, queued_at) VALUES (?, 'pending', ?)",
                         (dump_id, time.time() if now is None else now))
    return cur.rowcount == 1


def backfill(db: sqlite3.Connection, now: float | None = None) -> int:
    """Queues every live dump the queue has not seen (a kill between indexing and enqueueing, or a store
    that existed before [upload] was set)."""
    with db:
        cur = db.execute("INSERT OR IGNORE INTO uploads (id, state, queued_at) SELECT id, 'pending', ? FROM dumps "
                         "WHERE deleting = 0", (time.time() if now is None else now,))
    return cur.rowcount


def drop_waiting(db: sqlite3.Connection) -> int:
    """Uploads are off: what waited leaves the queue, so retention's rules govern those dumps again (turning
    uploads on queues whatever the store still holds, by backfill)."""
    if not _has_queue(db):
        return 0
    with db:
        return db.execute("DELETE FROM uploads WHERE state IN ('pending', 'uploading')").rowcount


def waiting_ids(db: sqlite3.Connection) -> set[str]:
    """Dumps still to upload: retention keeps them unless the disk floor forces it."""
    if not _has_queue(db):
        return set()
    return {r[0] for r in db.execute("SELECT id FROM uploads WHERE state IN ('pending', 'uploading')")}


def mark_lost(db: sqlite3.Connection, dump_id: str, why: str) -> None:
    with db:
        n = db.execute("UPDATE uploads SET state = 'failed', reason = ?, last_error = ? WHERE id = ? AND state IN "
                       "('pending', 'uploading')", (LOST, why, dump_id)).rowcount
        if n:
            _count_failure(db, LOST)


def _count_failure(db: sqlite3.Connection, reason: str) -> None:
    db.execute("INSERT INTO upload_failures (reason, count) VALUES (?, 1) "
               "ON CONFLICT (reason) DO UPDATE SET count = count + 1", (reason,))


def stats(db: sqlite3.Connection, now: float | None = None) -> dict | None:
    """The queue at a glance (status, metrics); None when this index never had one."""
    if not _has_queue(db):
        return None
    now = time.time() if now is None else now
    states = dict.fromkeys(STATES, 0)
    states.update(dict(db.execute("SELECT state, COUNT(*) FROM uploads GROUP BY state")))
    oldest = db.execute("SELECT MIN(queued_at) FROM uploads WHERE state IN ('pending', 'uploading')").fetchone()[0]
    sent = db.execute("SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(seconds), 0), "
                      "COALESCE(SUM(budget = 'kept_back'), 0), COALESCE(SUM(core_key IS NOT NULL), 0) "
                      "FROM uploads WHERE state = 'done'").fetchone()
    problem = db.execute("SELECT reason, message, since FROM upload_problem").fetchone()
    return {"states": states, "oldest_pending_seconds": max(0.0, now - oldest) if oldest else 0.0,
            "uploaded_bytes": int(sent[0]), "upload_seconds": float(sent[1]), "kept_back": int(sent[2]),
            "cores": int(sent[3]), "failures": dict(db.execute("SELECT reason, count FROM upload_failures")),
            "problem": {"reason": problem[0], "message": problem[1], "since": problem[2]} if problem else None}


def status_line(st: dict | None) -> str:
    if st is None:
        return "off"
    s = st["states"]
    line = f"{s['pending'] + s['uploading']} waiting, {s['done']} done, {s['failed']} failed"
    if st["oldest_pending_seconds"]:
        line += f", oldest waiting {st['oldest_pending_seconds']:.0f}s"
    if st["problem"]:
        line += f"; FAILING ({st['problem']['reason']}): {st['problem']['message']}"
    return line


def backoff(attempts: int, initial: float, cap: float, rand: random.Random = random) -> float:
    """The delay before attempt attempts+1: initial * 2^(attempts-1) capped, with equal jitter (half fixed,
    half random) so a fleet that failed together does not retry together."""
    delay = min(cap, initial * 2 ** max(0, attempts - 1))
    return delay / 2 + rand.uniform(0, delay / 2)


# --- what goes into the bucket -------------------------------------------------------------------------

def fallback_signature(dump) -> str:
    """A signature for dumps without an analysis: the executable and the signal (coarser than the analysed
    one, which adds the top frames)."""
    return f"{dump.exe or dump.comm or '?'}:{dump.signal}"


def signature_key(signature: str) -> str:
    """The signature as a bucket key component."""
    return hashlib.sha256(signature.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def shareable_record(record: dict, *, environ: bool, maps: bool) -> dict:
    """The record as it may leave the host: what [capture] kept locally only stays unless [upload] says."""
    out = dict(record)
    proc = dict(out.get("proc") or {})
    if not environ:
        proc.pop("environ", None)
    if not maps:
        proc.pop("maps", None)
    if "proc" in out:
        out["proc"] = proc
    return out


def sidecar(dump, *, host: str, core: dict | None, budget: str | None, analysis: dict | None, signature: str,
            environ: bool, maps: bool) -> dict:
    row = {k: v for k, v in dump.summary().items() if k not in ("record", "path", "deleting")}
    return {"schema": SIDECAR_SCHEMA, "id": dump.id, "host": host, "crashed_at": dump.crashed_at,
            "uploaded_at": time.time(), "signature": signature,
            "signature_source": "analysis" if analysis and analysis.get("signature") else "exe+signal",
            "core": core, "budget": budget, "sha256": dump.sha256,
            "index": row, "record": shareable_record(dump.record, environ=environ, maps=maps),
            "analysis": analysis}


@dataclass(frozen=True)
class Digests:
    size: int
    sha256: str          # hex, of the object's bytes
    full_b64: str        # the S3 full-object SHA-256 checksum
    composite_b64: str   # the S3 multipart (composite) checksum: sha256 of the parts' digests, "-N"


def digests(path: Path, part_size: int) -> Digests:
    """One read of the file: its SHA-256 and the checksum S3 reports for it sent in parts of part_size."""
    full, parts, size = hashlib.sha256(), [], 0
    with open(path, "rb") as f:
        while True:
            part = hashlib.sha256()
            left = part_size
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    break
                part.update(chunk)
                full.update(chunk)
                left -= len(chunk)
                size += len(chunk)
            if left == part_size:
                break
            parts.append(part.digest())
            if left:
                break
    composite = base64.b64encode(hashlib.sha256(b"".join(parts)).digest()).decode() + f"-{len(parts)}"
    return Digests(size, full.hexdigest(), base64.b64encode(full.digest()).decode(), composite)


def transfer_part_size(part_size: int, size: int) -> int:
    """The part size s3transfer really uses for a file (it grows parts to stay within 10,000)."""
    from s3transfer.utils import ChunksizeAdjuster
    return ChunksizeAdjuster().adjust_chunksize(part_size, size)


def check_object(head: dict, expect: Digests, *, multipart: bool) -> str | None:
    """Why the HEAD of an uploaded core does not match what was sent, or None when it does. A server that
    keeps no checksums is checked by size only (the sidecar says so: core.verified = "size")."""
    if head.get("ContentLength") != expect.size:
        return f"size {head.get('ContentLength')} in the bucket, {expect.size} sent"
    got = head.get("ChecksumSHA256")
    if got is None:
        return None
    want = expect.composite_b64 if "-" in got else expect.full_b64
    if got != want:
        return f"checksum {got} in the bucket, {want} sent" + (" (multipart)" if multipart else "")
    return None


# --- the uploader ---------------------------------------------------------------------------------------

class Uploader:
    """A daemon observer that enqueues each ingested dump, and the thread that uploads the queue."""

    def __init__(self, config, state_dir: Path, *, client_factory=None, analysis=None, clock=time.time):
        self.config = config          # the [upload] section
        self.state_dir = Path(state_dir)
        self.target: Target | None = bucket.target(config) if config.url else None  # None: uploads are off
        self._client_factory = client_factory or (lambda: bucket.client(self.config,
                                                                        pool=max(16, self.config.concurrency)))
        self._reconfigured = None   # a reloaded [upload] section, for the thread to take between two uploads
        self._analysis = analysis or analysis_index.analysis_for
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hold_until = 0.0
        self._queue_failures = 0
        self._client = None
        self._conditional_ok: bool | None = None
        self._aborted_stale = False
        self._db_lock = threading.Lock()
        self._enqueue_db: sqlite3.Connection | None = None

    # observer events (the daemon's thread) ---------------------------------------------------------------

    def on_start(self) -> None:
        self.start()

    def on_ingested(self, record: dict, stored: dict) -> None:
        with self._db_lock:
            # A reload that turned uploads off counts at once, before the thread takes it; turning them on
            # again queues what the store holds (backfill).
            if not (self._reconfigured or self.config).url:
                return
            if self._enqueue_db is None:
                self._enqueue_db = sqlite3.connect(self.state_dir / "index.sqlite", timeout=30,
                                                   check_same_thread=False)
                ensure_schema(self._enqueue_db)
            enqueue(self._enqueue_db, stored["id"], self._clock())
        self._wake.set()

    def reconfigure(self, config) -> None:
        """A reload's [upload] section. The thread takes it between two uploads, never during one, so a
        transfer under way finishes with the settings it began with; url = "" turns uploads off."""
        if config.url:
            bucket.target(config)  # a bad URL fails the reload here, not the thread
        with self._db_lock:
            # The latest reload wins, also over one the thread has not taken yet (back to what runs: nothing).
            self._reconfigured = None if config == self.config else config
        self._wake.set()

    def _take_reconfigured(self) -> bool:
        """Applies a pending reconfigure(); True when there was one."""
        with self._db_lock:
            config, self._reconfigured = self._reconfigured, None
            if config is None:
                return False
            self.config = config
        self.target = bucket.target(config) if config.url else None
        self._client = None
        self._conditional_ok = None
        self._aborted_stale = False
        self._hold_until = 0.0
        log.info("Upload configuration reloaded: %s", config.url or "uploads off")
        return True

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(60)
        with self._db_lock:
            if self._enqueue_db is not None:
                self._enqueue_db.close()
                self._enqueue_db = None

    # the thread ---------------------------------------------------------------------------------------

    def start(self) -> "Uploader":
        self._thread = threading.Thread(target=self._run, name="uploader", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        store = None
        while not self._stop.is_set():
            try:
                if store is None:
                    store = Store(self.state_dir)
                    self._recover(store)
                elif self._take_reconfigured():
                    self._recover(store)
                wait = self.step(store) if self.target is not None else 3600.0
            except Exception:  # the index itself failing (disk full, locked too long): try again later
                log.exception("The uploader failed; retrying in %.0fs", self.config.retry_max)
                if store is not None:
                    store.close()
                    store = None
                wait = self.config.retry_max
            if wait:
                self._wake.wait(wait)
                self._wake.clear()
        if store is not None:
            store.close()

    def _recover(self, store: Store) -> None:
        if self.target is None:
            dropped = drop_waiting(store.db)
            if dropped:
                log.info("Uploads are off: %d dumps left the upload queue", dropped)
            return
        ensure_schema(store.db)  # only once uploads are on: `status` tells a queue that ever ran from none
        with store.db:
            store.db.execute("UPDATE uploads SET state = 'pending' WHERE state = 'uploading'")
        queued = backfill(store.db, self._clock())
        if queued:
            log.info("Queued %d dumps for upload found in the store", queued)

    def step(self, store: Store) -> float:
        """Uploads the next due dump, if any; returns how long to wait before the next step (0 = at once)."""
        now = self._clock()
        if now < self._hold_until:
            return self._hold_until - now
        try:
            if self._client is None:
                self._client = self._client_factory()
            if not self._aborted_stale:
                self._abort_stale()
                self._aborted_stale = True
        except Exception as e:
            self._queue_failed(store, e if isinstance(e, BucketError) else BucketError(e.message, "credentials")
                               if isinstance(e, CorehandlerError) else bucket.classify(e))
            self._client = None
            return max(0.0, self._hold_until - self._clock())
        row = store.db.execute("SELECT id, attempts, budget FROM uploads WHERE state = 'pending' AND "
                               "next_attempt <= ? ORDER BY next_attempt, queued_at, id LIMIT 1", (now,)).fetchone()
        if row is None:
            nxt = store.db.execute("SELECT MIN(next_attempt) FROM uploads WHERE state = 'pending'").fetchone()[0]
            return 60.0 if nxt is None else min(60.0, max(0.01, nxt - now))
        self.upload_one(store, *row)
        return 0.0

    def _abort_stale(self) -> None:
        """Multipart uploads under this host's prefix that nothing will complete (a kill mid-upload)."""
        prefix = self.target.key(self.target.host) + "/"
        pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.target.bucket,
                                                                              Prefix=prefix)
        for page in pages:
            for up in page.get("Uploads") or []:
                self._client.abort_multipart_upload(Bucket=self.target.bucket, Key=up["Key"], UploadId=up["UploadId"])
                log.warning("Aborted a multipart upload of %s left by an interrupted attempt", up["Key"])

    def upload_one(self, store: Store, dump_id: str, attempts: int = 0, budget: str | None = None) -> bool:
        start = time.monotonic()
        with store.db:
            store.db.execute("UPDATE uploads SET state = 'uploading', attempts = attempts + 1 WHERE id = ?",
                             (dump_id,))
        dump = store.get(dump_id)
        if dump is None or dump.deleting:
            mark_lost(store.db, dump_id, "deleted from the store before it was uploaded")
            log.error("Dump %s was deleted before it was uploaded: lost to the fleet", dump_id)
            return False
        try:
            sent, core_key, budget = self._send(store, dump, budget)
        except Exception as e:
            if self._stop.is_set():  # the daemon is stopping: not a failure, the next start does it again
                with store.db:
                    store.db.execute("UPDATE uploads SET state = 'pending' WHERE id = ?", (dump_id,))
                log.info("Upload of %s interrupted by the daemon stopping; it resumes at the next start", dump_id)
                return False
            self._failed(store, dump_id, attempts + 1, bucket.classify(e))
            return False
        with store.db:
            store.db.execute("UPDATE uploads SET state = 'done', done_at = ?, bytes = ?, seconds = ?, budget = ?, "
                             "core_key = ?, sidecar_key = ?, last_error = NULL, reason = NULL WHERE id = ?",
                             (self._clock(), sent, time.monotonic() - start, budget, core_key,
                              self._key(dump, bucket.SIDECAR_SUFFIX), dump_id))
            cleared = store.db.execute("DELETE FROM upload_problem").rowcount
        if cleared:
            log.info("Uploads work again")
        self._queue_failures = 0
        log.info("Uploaded %s to s3://%s/%s (%d bytes%s)", dump_id, self.target.bucket,
                 self._key(dump, bucket.SIDECAR_SUFFIX), sent,
                 ", core kept back by the fleet budget" if budget == KEPT_BACK else "")
        return True

    def _key(self, dump, suffix: str) -> str:
        return self.target.dump_key(dump.crashed_at, dump.id, suffix)

    def _send(self, store: Store, dump, budget: str | None) -> tuple[int, str | None, str | None]:
        cfg = self.config
        analysis = self._analysis(store, dump.id)  # docs/analysis.md, "Result"; None before D's wing ran
        signature = (analysis or {}).get("signature") or fallback_signature(dump)
        path = store.file_path(dump)
        send_core = cfg.send == "cores" and path is not None
        if send_core and cfg.fleet_budget > 0:
            if budget is None:
                budget = self._claim(dump, signature)
                with store.db:  # kept: a retry does not claim again
                    store.db.execute("UPDATE uploads SET budget = ? WHERE id = ?", (budget, dump.id))
            send_core = budget != KEPT_BACK
        core, sent = None, 0
        if send_core:
            core = self._send_core(dump, path)
            sent += core["bytes"] if core.pop("sent") else 0
            _pause("core_sent")
        body = json.dumps(sidecar(dump, host=self.target.host, core=core, budget=budget, analysis=analysis,
                                  signature=signature, environ=cfg.send_environ, maps=cfg.send_maps),
                          ensure_ascii=True, sort_keys=True, default=str).encode()
        self._client.put_object(Bucket=self.target.bucket, Key=self._key(dump, bucket.SIDECAR_SUFFIX), Body=body,
                                ContentType="application/json", ChecksumAlgorithm="SHA256", **self._sse())
        return sent + len(body), core["key"] if core else None, budget

    def _sse(self) -> dict:
        extra = {}
        if self.config.sse:
            extra["ServerSideEncryption"] = self.config.sse
        if self.config.sse_kms_key_id:
            extra["SSEKMSKeyId"] = self.config.sse_kms_key_id
        return extra

    def _send_core(self, dump, path: Path) -> dict:
        suffix = ".zst" if path.name.endswith(".zst") else ".core"
        key = self._key(dump, suffix)
        size = path.stat().st_size
        multipart = size > self.config.part_size
        with ThreadPoolExecutor(1) as pool:
            # The digests overlap the upload (hashlib lets go of the GIL): one more read of the file, no wait.
            digesting = pool.submit(digests, path, transfer_part_size(self.config.part_size, size))
            head = self._head(key)  # an attempt a kill interrupted after the core went up: not sent twice
            sent = head is None or check_object(head, digesting.result(), multipart=multipart) is not None
            if sent:
                self._transfer(path, key)
                head = self._head(key)
            expect = digesting.result()
        problem = check_object(head or {}, expect, multipart=multipart)
        if problem:
            raise BucketError(f"the core of {dump.id} in the bucket does not match the store's: {problem}", "server")
        return {"key": key, "bytes": size, "object_sha256": expect.sha256, "raw_bytes": dump.raw_bytes,
                "raw_sha256": dump.sha256, "compression": "zstd" if suffix == ".zst" else None,
                "verified": "sha256" if head.get("ChecksumSHA256") else "size", "sent": sent}

    def _head(self, key: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self._client.head_object(Bucket=self.target.bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def _transfer(self, path: Path, key: str) -> None:
        from s3transfer.manager import TransferConfig, TransferManager

        cfg = self.config
        tc = TransferConfig(multipart_threshold=cfg.part_size + 1, multipart_chunksize=cfg.part_size,
                            max_request_concurrency=cfg.concurrency, max_bandwidth=cfg.bandwidth_limit or None)
        extra = {"ChecksumAlgorithm": "SHA256", "ContentType": "application/zstd", **self._sse()}
        manager = TransferManager(self._client, tc)
        try:
            future = manager.upload(str(path), self.target.bucket, key, extra_args=extra)
            while not future.done():
                if self._stop.wait(0.2):
                    future.cancel()  # s3transfer aborts the multipart upload it started
                    break
            future.result()
        finally:
            manager.shutdown(cancel=self._stop.is_set())

    def _claim(self, dump, signature: str) -> str:
        """One of fleet_budget slots for this signature and crash day, or KEPT_BACK when all are taken."""
        from botocore.exceptions import ClientError

        if self._conditional_ok is None:
            self._conditional_ok = self._probe_conditional()
        if not self._conditional_ok:
            return "unenforced"
        day = f"{bucket.crash_day(dump.crashed_at):%Y-%m-%d}"
        sig = signature_key(signature)
        mine = json.dumps({"host": self.target.host, "id": dump.id}, sort_keys=True).encode()
        for slot in range(self.config.fleet_budget):
            key = self.target.budget_slot(sig, day, slot)
            try:
                self._client.put_object(Bucket=self.target.bucket, Key=key, Body=mine, IfNoneMatch="*")
                return f"slot {slot}"
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "412",
                                                                    "ConditionalRequestConflict"):
                    raise
            # Taken: by us, when a kill came between the claim and noting it?
            body = self._client.get_object(Bucket=self.target.bucket, Key=key)["Body"].read()
            if body == mine:
                return f"slot {slot}"
        return KEPT_BACK

    def _probe_conditional(self) -> bool:
        """Whether the server refuses a second conditional create of one key. A server that ignores
        If-None-Match would give every host a slot: the budget cannot be held there, so every core is sent
        (nothing is lost) and the log says why."""
        from botocore.exceptions import ClientError

        key = self.target.key(bucket.BUDGET, ".probe", f"{self.target.host}-{time.time_ns()}")
        try:
            self._client.put_object(Bucket=self.target.bucket, Key=key, Body=b"1", IfNoneMatch="*")
            try:
                self._client.put_object(Bucket=self.target.bucket, Key=key, Body=b"2", IfNoneMatch="*")
                ok = False
            except ClientError as e:
                ok = e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("NotImplemented", "501", "InvalidArgument"):
                raise
            ok = False
        finally:
            try:
                self._client.delete_object(Bucket=self.target.bucket, Key=key)
            except Exception:
                pass
        if not ok:
            log.error("The bucket's server ignores conditional creates (If-None-Match: *): the fleet budget "
                      "cannot be held there, so every core is uploaded")
        return ok

    # failures ------------------------------------------------------------------------------------------

    def _failed(self, store: Store, dump_id: str, attempts: int, err: BucketError) -> None:
        # A multipart upload s3transfer could not abort (the server went away) is aborted before the next try.
        self._aborted_stale = False
        delay = backoff(attempts, self.config.retry_initial, self.config.retry_max)
        with store.db:
            store.db.execute("UPDATE uploads SET state = 'pending', next_attempt = ?, last_error = ?, reason = ? "
                             "WHERE id = ?", (self._clock() + delay, err.message, err.reason, dump_id))
            _count_failure(store.db, err.reason)
        if err.reason in bucket.QUEUE_WIDE:
            self._queue_failed(store, err, counted=True)
        else:
            log.warning("Upload of %s failed (%s), retrying in %.0fs: %s", dump_id, err.reason, delay, err.message)

    def _queue_failed(self, store: Store, err: BucketError, counted: bool = False) -> None:
        """A failure of the bucket, not of one dump: hold the queue, say it once."""
        self._queue_failures += 1
        delay = backoff(self._queue_failures, self.config.retry_initial, self.config.retry_max)
        self._hold_until = self._clock() + delay
        with store.db:
            if not counted:
                _count_failure(store.db, err.reason)
            old = store.db.execute("SELECT reason, message FROM upload_problem").fetchone()
            if old != (err.reason, err.message):
                store.db.execute("INSERT OR REPLACE INTO upload_problem (one, reason, message, since) "
                                 "VALUES (1, ?, ?, ?)", (err.reason, err.message, self._clock()))
        if old != (err.reason, err.message):
            log.error("Uploads to s3://%s are failing (%s): %s; retrying with backoff", self.target.bucket,
                      err.reason, err.message)
        else:
            log.debug("Uploads still failing (%s), next try in %.0fs", err.reason, delay)


def _pause(point: str) -> None:
    if os.environ.get(PAUSE_ENV) == point:
        log.warning("Pausing at %s (%s, test-only)", point, PAUSE_ENV)
        while True:
            time.sleep(3600)


class UploadCollector:
    """The queue's metrics, read from the index at scrape time (so they survive restarts without replay)."""

    def __init__(self, index_path: Path):
        self.index_path = Path(index_path)

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            db = sqlite3.connect(f"file:{self.index_path}?mode=ro", uri=True, timeout=5)
            try:
                st = stats(db)
            finally:
                db.close()
        except sqlite3.Error as e:
            log.debug("metrics: upload queue unreadable: %s", e)
            return
        if st is None:
            return
        yield CounterMetricFamily("corehandler_upload_bytes", "Bytes uploaded to the fleet bucket (cores and "
                                  "sidecars)", value=st["uploaded_bytes"])
        yield CounterMetricFamily("corehandler_upload_seconds", "Seconds spent on uploads that succeeded",
                                  value=st["upload_seconds"])
        done = CounterMetricFamily("corehandler_uploads", "Dumps uploaded, by what went up", labels=["kind"])
        done.add_metric(["core"], st["cores"])
        done.add_metric(["sidecar_only"], st["states"]["done"] - st["cores"])
        yield done
        yield CounterMetricFamily("corehandler_upload_kept_back", "Dumps whose core the fleet budget kept "
                                  "home (sidecar only)", value=st["kept_back"])
        failures = CounterMetricFamily("corehandler_upload_failures", "Failed upload attempts by reason "
                                       "(lost: deleted before it was uploaded)", labels=["reason"])
        for reason in (*bucket.REASONS, LOST):
            failures.add_metric([reason], st["failures"].get(reason, 0))
        yield failures
        queue = GaugeMetricFamily("corehandler_upload_queue", "Dumps in the upload queue by state",
                                  labels=["state"])
        for state in STATES:
            queue.add_metric([state], st["states"][state])
        yield queue
        yield GaugeMetricFamily("corehandler_upload_oldest_pending_seconds", "Age of the oldest dump waiting "
                                "to upload; 0 when none waits", value=st["oldest_pending_seconds"])
        yield GaugeMetricFamily("corehandler_upload_failing", "1 while a problem of the bucket (credentials, "
                                "missing bucket, clock skew, no connection) holds the queue",
                                value=1 if st["problem"] else 0)
