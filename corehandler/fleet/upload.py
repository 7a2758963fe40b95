"""Upload: the uploader that drains the durable queue in the index into the fleet's bucket.

The queue is the `uploads` table of the index (store/upload_queue.py: one row per dump, state pending |
uploading | done | failed, attempts, next attempt, last error and its reason). The daemon enqueues a dump when
it is indexed; the uploader, a thread of the daemon with its own connection, sends the oldest due one:

  1. the fleet budget (if configured): claim one of N slots for the dump's signature and crash day with a
     conditional create, per uid before global (_claim); none left means the dump's core stays home and
     only its sidecar goes up;
  2. the core, by transfer.py (multipart past one part, each part hashed once and checked by the server
     against that SHA-256; encrypted to [upload] recipients as it is read when there are some), unless an
     attempt a kill interrupted already sent it (the row's note of the verified core, or, on a retry, a HEAD
     matching the store's file); then HEAD: size and checksum must match what was sent, or the attempt fails;
  3. the sidecar: whoever sees it can trust the core it names;
  4. its row in this host's Parquet index file of the crash's day (dataset.py), before the row is done; the
     file's rows are kept in the state dir, never read back from the bucket.
The uploader reads nothing another host could have written but a budget slot's first bytes (to know a slot
of its own): what is in the bucket never decides what this host uploads or stops it.
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

import functools
import hashlib
import json
import logging
import random
import sqlite3
import threading
import time
from pathlib import Path

from corehandler import capture, paths, spool
from corehandler.analysis import minicore
from corehandler.errors import CorehandlerError
from corehandler.fleet import available, bucket, dataset, seal, transfer, withoutcore
from corehandler.fleet.bucket import BucketError, Target
from corehandler.fleet.payload import check_object, digests, fallback_signature, sidecar, signature_key
from corehandler.observer import Quiet
from corehandler.store import analyses, upload_queue
from corehandler.store.dumprow import COMPRESSING
from corehandler.store.index import Store
from corehandler.store.upload_queue import KEPT_BACK
from corehandler.testpause import UPLOAD_ENV, pause

log = logging.getLogger("corehandler.fleet.upload")

# How soon a dump queued before its row was committed is looked at again (see _not_committed).
NOT_COMMITTED_RETRY = 0.5


# --- the retry schedule -----------------------------------------------------------------------------------


def backoff(attempts: int, initial: float, cap: float, rand: random.Random = random) -> float:
    """The delay before attempt attempts+1: initial * 2^(attempts-1) capped, with equal jitter (half fixed,
    half random) so a fleet that failed together does not retry together."""
    delay = min(cap, initial * 2 ** max(0, attempts - 1))
    return delay / 2 + rand.uniform(0, delay / 2)


# --- the uploader ---------------------------------------------------------------------------------------

class Uploader(Quiet):
    """A daemon observer that enqueues each ingested dump, and the thread that uploads the queue."""

    def __init__(self, config, state_dir: Path, *, client_factory=None, analysis=None, clock=time.time):
        self.config = config          # the [upload] section
        self.state_dir = Path(state_dir)
        self.target: Target | None = None  # None: uploads are off
        self.unavailable: str | None = None  # why [upload] url is set but uploads cannot run (no fleet package)
        self._recipients: list = []
        self._configure(config)
        self._client_factory = client_factory or (lambda: bucket.client(self.config,
                                                                        pool=max(16, self.config.concurrency)))
        self._reconfigured = None   # a reloaded [upload] section, for the thread to take between two uploads
        self._analysis = analysis or analyses.analysis_for
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._capture = capture.Yield(paths.spool_dir(self.state_dir), self._stop)  # csplice first
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
        if stored.get("status") != COMPRESSING:  # else its file is not there yet: on_stored queues it
            self.on_stored(record, stored)

    def on_stored(self, record: dict, stored: dict) -> None:
        with self._db_lock:
            # A reload that turned uploads off counts at once, before the thread takes it; turning them on
            # again queues what the store holds (backfill).
            if not (self._reconfigured or self.config).url:
                return
            if self._enqueue_db is None:
                self._enqueue_db = sqlite3.connect(paths.index_path(self.state_dir), timeout=30,
                                                   check_same_thread=False)
                upload_queue.ensure_schema(self._enqueue_db)
            upload_queue.enqueue(self._enqueue_db, stored["id"], self._clock())
        self._wake.set()

    def reconfigure(self, config) -> None:
        """A reload's [upload] section. The thread takes it between two uploads, never during one, so a
        transfer under way finishes with the settings it began with; url = "" turns uploads off. An unchanged
        section is taken too: what it names may have changed in place (keys rotated in the credentials file,
        a recipients file), and a client resolves static keys once, so the thread builds its client, its
        credential chain and its recipients anew, and retries at once what the old keys failed."""
        if config.url:
            bucket.target(config)  # a bad URL fails the reload here, not the thread
        with self._db_lock:
            self._reconfigured = config  # the latest reload wins, also over one the thread has not taken yet
        self._wake.set()

    def _take_reconfigured(self) -> bool:
        """Applies a pending reconfigure(); True when there was one."""
        with self._db_lock:
            config, self._reconfigured = self._reconfigured, None
            if config is None:
                return False
            self.config = config
        self._configure(config, rescan=True)
        self._client = None
        self._conditional_ok = None
        self._aborted_stale = False
        self._hold_until = 0.0
        log.info("Upload configuration reloaded: %s", config.url or "uploads off")
        return True

    def _configure(self, config, *, rescan: bool = False) -> None:
        """Takes an [upload] section: its target and recipients, or why uploads stay off although it names a
        bucket (the fleet's libraries missing: the queue is kept for when they come)."""
        self.config = config
        self.unavailable = available.why_off(rescan=rescan) if config.url else None
        if self.unavailable:
            log.warning("Uploads are off although [upload] url is set: %s", self.unavailable)
        ready = config.url and not self.unavailable
        self.target = bucket.target(config) if ready else None
        self._recipients = seal.recipients(config.recipients) if ready else []

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
            if self.unavailable:  # url set: what waits goes up once the fleet package is installed
                return
            dropped = upload_queue.drop_waiting(store.db)
            if dropped:
                log.info("Uploads are off: %d dumps left the upload queue", dropped)
            return
        upload_queue.ensure_schema(store.db)  # only once uploads are on: `status` tells a queue that ever ran from none
        upload_queue.resume(store.db)
        queued = upload_queue.backfill(store.db, self._clock())
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
        row = upload_queue.due(store.db, now)
        if row is None:
            nxt = upload_queue.next_attempt(store.db)
            return 60.0 if nxt is None else min(60.0, max(0.01, nxt - now))
        self.upload_one(store, *row)
        return 0.0

    def _abort_stale(self) -> None:
        """Multipart uploads of this host that nothing will complete (a kill mid-upload): under its v1 prefix,
        or its host= partition of any v2 day."""
        pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.target.bucket,
                                                                              Prefix=self.target.key(layout=""))
        v1 = self.target.key(self.target.host, layout=bucket.V1) + "/"
        for page in pages:
            for up in page.get("Uploads") or []:
                if not (up["Key"].startswith(v1) or (up["Key"].startswith(self.target.root())
                                                     and bucket.host_of(up["Key"]) == self.target.host)):
                    continue
                self._client.abort_multipart_upload(Bucket=self.target.bucket, Key=up["Key"], UploadId=up["UploadId"])
                log.warning("Aborted a multipart upload of %s left by an interrupted attempt", up["Key"])

    def upload_one(self, store: Store, dump_id: str, attempts: int = 0, budget: str | None = None) -> bool:
        start = time.monotonic()
        dump = store.get(dump_id)
        if self._not_committed(dump_id, dump):
            # not an attempt: the daemon commits the row just after announcing it
            upload_queue.postpone(store.db, dump_id, self._clock() + NOT_COMMITTED_RETRY)
            return False
        upload_queue.begin(store.db, dump_id)
        if dump is None or dump.deleting:
            upload_queue.mark_lost(store.db, dump_id, "deleted from the store before it was uploaded")
            log.error("Dump %s was deleted before it was uploaded: lost to the fleet", dump_id)
            return False
        try:
            sent, core_key, budget = self._send(store, dump, budget, retry=attempts > 0)
        except Exception as e:
            if self._stop.is_set():  # the daemon is stopping: not a failure, the next start does it again
                upload_queue.interrupted(store.db, dump_id)
                log.info("Upload of %s interrupted by the daemon stopping; it resumes at the next start", dump_id)
                return False
            self._failed(store, dump_id, attempts + 1, bucket.classify(e))
            return False
        cleared = upload_queue.done(store.db, dump_id, at=self._clock(), sent=sent,
                                    seconds=time.monotonic() - start, budget=budget, core_key=core_key,
                                    sidecar_key=self._key(dump, bucket.SIDECAR_SUFFIX))
        if cleared:
            log.info("Uploads work again")
        self._queue_failures = 0
        log.info("Uploaded %s to s3://%s/%s (%d bytes%s)", dump_id, self.target.bucket,
                 self._key(dump, bucket.SIDECAR_SUFFIX), sent,
                 ", core kept back by the fleet budget" if budget == KEPT_BACK else "")
        return True

    def _not_committed(self, dump_id: str, dump) -> bool:
        """Queued by an announcement whose commit has not happened yet (daemon.py announces first): the row
        still `compressing`, or no row while the spool still holds the dump's record (a deleted dump has
        neither)."""
        if dump is not None:
            return dump.status == COMPRESSING
        return spool.record_path(paths.spool_dir(self.state_dir), dump_id).exists()

    def _key(self, dump, suffix: str) -> str:
        return self.target.dump_key(dump.crashed_at, dump.id, suffix)

    def _send(self, store: Store, dump, budget: str | None, retry: bool) -> tuple[int, str | None, str | None]:
        cfg = self.config
        # docs/analysis.md, "Result"; None for dumps indexed before analysis existed
        analysis = self._analysis(store, dump.id)
        signature = (analysis or {}).get("signature") or fallback_signature(dump)
        path = store.file_path(dump)
        send_core = cfg.send == "cores" and path is not None
        if send_core and cfg.fleet_budget > 0:
            if budget is None:
                budget = self._claim(dump, signature)
                upload_queue.keep_budget(store.db, dump.id, budget)
            send_core = budget != KEPT_BACK
        core, sent = None, 0
        if send_core:
            core = self._kept_core(store, dump.id)
            if core is None:
                core, head = self._send_core(dump, path, retry)
                sent += core["bytes"] if core.pop("sent") else 0
                upload_queue.keep_core(store.db, dump.id, core, head.get("ContentLength"), head.get("ChecksumSHA256"))
            pause(UPLOAD_ENV, "core_sent")
        mini = self._send_mini(store, dump) if cfg.send == "cores" else None
        sent += mini["bytes"] if mini else 0
        no_core = None if core else withoutcore.at_upload(
            dump, send=cfg.send, budget=budget, fleet_budget=cfg.fleet_budget, per_uid=self._share(),
            signature=signature, crash_day=f"{bucket.crash_day(dump.crashed_at):%Y-%m-%d}")
        doc = dict(sidecar(dump, host=self.target.host, core=core, budget=budget, analysis=analysis,
                           signature=signature, environ=cfg.send_environ, maps=cfg.send_maps, no_core=no_core),
                   mini=mini)
        if self._recipients:
            doc = seal.seal(doc, self._recipients)
            doc["sealed"]["recipients"] = list(cfg.recipients)
        body = json.dumps(doc, ensure_ascii=True, sort_keys=True, default=str).encode()
        sidecar_key = self._key(dump, bucket.SIDECAR_SUFFIX)
        self._client.put_object(Bucket=self.target.bucket, Key=sidecar_key, Body=body,
                                ContentType="application/json", ChecksumAlgorithm="SHA256", **self._sse())
        pause(UPLOAD_ENV, "sidecar_sent")
        # Before the row is done: a dump this host finished is always in its day's index file.
        dataset.add(self._client, self.target, bucket.crash_day(dump.crashed_at), dataset.row(doc, sidecar_key),
                    dataset.local_dir(self.state_dir, self.target), self._sse())
        return sent + len(body), core["key"] if core else None, budget

    def _send_mini(self, store: Store, dump) -> dict | None:
        """The mini core goes up for every dump, the ones the fleet budget keeps back too (it is small): one
        PUT of ID.mini.core (encrypted to [upload] recipients as the core is: it holds the stacks' memory),
        checked by the server against its SHA-256. The sidecar's `mini`: {key, bytes, sha256 (of the object),
        encryption}, or null when the dump has none."""
        path = store.mini_path(dump)
        try:
            data = path.read_bytes() if path is not None else None
        except FileNotFoundError:  # retention took it meanwhile
            data = None
        if data is None:
            return None
        encryption = "age" if self._recipients else None
        if encryption:
            data = seal.encrypt_bytes(data, self._recipients)
        key = self._key(dump, minicore.SUFFIX + (seal.SUFFIX if encryption else ""))
        self._client.put_object(Bucket=self.target.bucket, Key=key, Body=data, ContentType="application/octet-stream",
                                ChecksumAlgorithm="SHA256", **self._sse())
        return {"key": key, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "encryption": encryption}

    def _sse(self) -> dict:
        return bucket.sse_args(self.config)

    def _kept_core(self, store: Store, dump_id: str) -> dict | None:
        """The core an earlier attempt sent and verified, when the bucket still holds it unchanged."""
        kept = upload_queue.kept_core(store.db, dump_id)
        if kept is None:
            return None
        head = self._head(kept["core"]["key"])
        if head is None or head.get("ContentLength") != kept["size"] or head.get("ChecksumSHA256") != kept["checksum"]:
            return None
        return kept["core"]

    def _send_core(self, dump, path: Path, retry: bool) -> tuple[dict, dict]:
        """The core in the bucket, verified: (its sidecar entry with "sent", the object's HEAD). It is read
        once, in parts (transfer.py: each part hashed once, the server checks it against that digest),
        encrypted to [upload] recipients as it is read when there are some. What is checked against the
        bucket is what was sent; age is randomised, so for an encrypted core only the queue row's note of the
        verified core (_kept_core) saves a retry from sending it again."""
        name = ".zst" if path.name.endswith(".zst") else ".core"
        size = path.stat().st_size
        if self._recipients:
            key, encryption = self._key(dump, name + seal.SUFFIX), "age"
            part = transfer.part_size_for(self.config.part_size, seal.encrypted_size_bound(size))
            source, content_type = seal.EncryptingReader(path, self._recipients), "application/octet-stream"
        else:
            key, encryption = self._key(dump, name), None
            part = transfer.part_size_for(self.config.part_size, size)
            # Sent by an attempt a kill interrupted before the row noted it? Only a retry can find one.
            head = self._head(key) if retry else None
            if head is not None:
                expect = digests(path, part)
                if check_object(head, expect, multipart=size > part) is None:
                    return self._verified(dump, key, head, expect, part, sent=False)
            source, content_type = open(path, "rb", buffering=0), "application/zstd"
        with source:
            expect = transfer.send(self._client, self.target.bucket, key, source, part,
                                   concurrency=self.config.concurrency, bandwidth=self.config.bandwidth_limit,
                                   extra={"ContentType": content_type, **self._sse()}, stop=self._stop,
                                   yield_to=functools.partial(self._capture, "upload"))
        return self._verified(dump, key, self._head(key), expect, part, sent=True, encryption=encryption)

    def _verified(self, dump, key: str, head: dict | None, expect, part_size: int, *, sent: bool,
                  encryption: str | None = None) -> tuple[dict, dict]:
        problem = check_object(head or {}, expect, multipart=expect.size > part_size)
        if problem:
            raise BucketError(f"the core of {dump.id} in the bucket does not match the store's: {problem}", "server")
        # object_sha256 only where it was computed (one part); `checksum` with part_size always identifies it.
        core = {"key": key, "bytes": expect.size, "object_sha256": expect.sha256,
                "checksum": expect.checksum(part_size), "part_size": part_size, "raw_bytes": dump.raw_bytes,
                "raw_sha256": dump.sha256, "compression": "zstd" if ".zst" in key.rsplit("/", 1)[-1] else None,
                "encryption": encryption, "verified": "sha256" if head.get("ChecksumSHA256") else "size",
                "sent": sent}
        if encryption:
            core["recipients"] = list(self.config.recipients)
        return core, head

    def _head(self, key: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self._client.head_object(Bucket=self.target.bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def _claim(self, dump, signature: str) -> str:
        """A slot of the fleet budget for this signature and crash day, or KEPT_BACK. Per uid before global:
        root's crashes (uid 0) claim from a pool of fleet_budget of their own, so no user's crashes refuse
        them; any other crash first claims one of its user's share on this host (fleet_budget_per_uid), then
        one of the fleet's fleet_budget, so one user mimicking a signature spends at most that share of it."""
        if self._conditional_ok is None:
            self._conditional_ok = self._probe_conditional()
        if not self._conditional_ok:
            return "unenforced"
        day = f"{bucket.crash_day(dump.crashed_at):%Y-%m-%d}"
        sig = signature_key(signature)
        mine = json.dumps({"host": self.target.host, "id": dump.id}, sort_keys=True).encode()
        budget = self.config.fleet_budget
        if dump.uid == 0:
            return self._claim_in(sig, day, "root", budget, mine)
        uid = dump.uid if isinstance(dump.uid, int) else "unknown"
        if self._claim_in(sig, day, f"user/{self.target.host}-{uid}", self._share(), mine) == KEPT_BACK:
            return KEPT_BACK
        return self._claim_in(sig, day, "", budget, mine)

    def _share(self) -> int:
        """The slots of a signature's day one user of a host may claim."""
        return self.config.fleet_budget_per_uid or max(1, self.config.fleet_budget // 2)

    def _claim_in(self, sig: str, day: str, pool: str, slots: int, mine: bytes) -> str:
        """One of the slots of a pool (a conditional create each), or KEPT_BACK when all are taken."""
        from botocore.exceptions import ClientError

        for slot in range(slots):
            key = self.target.budget_slot(sig, day, slot, pool)
            try:
                self._client.put_object(Bucket=self.target.bucket, Key=key, Body=mine, IfNoneMatch="*")
                return f"slot {slot}"
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "412",
                                                                    "ConditionalRequestConflict"):
                    raise
            # Taken: by us, when a kill came between the claim and noting it? (A slot is any host's object:
            # no more than our own claim's length of it is read.)
            try:
                if bucket.read_bounded(self._client, self.target.bucket, key, len(mine)) == mine:
                    return f"slot {slot}"
            except bucket.ObjectTooLarge:
                pass
        return KEPT_BACK

    def _probe_conditional(self) -> bool:
        """Whether the server refuses a second conditional create of one key. A server that ignores
        If-None-Match would give every host a slot: the budget cannot be held there, so every core is sent
        (nothing is lost) and the log says why."""
        from botocore.exceptions import ClientError

        key = self.target.key(bucket.BUDGET, ".probe", f"{self.target.host}-{time.time_ns()}", layout=bucket.V1)
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
        # A multipart upload transfer.py could not abort (the server went away) is aborted before the next try.
        self._aborted_stale = False
        delay = backoff(attempts, self.config.retry_initial, self.config.retry_max)
        upload_queue.retry_at(store.db, dump_id, self._clock() + delay, err.reason, err.message)
        if err.reason in bucket.QUEUE_WIDE:
            self._queue_failed(store, err, counted=True)
        else:
            log.warning("Upload of %s failed (%s), retrying in %.0fs: %s", dump_id, err.reason, delay, err.message)

    def _queue_failed(self, store: Store, err: BucketError, counted: bool = False) -> None:
        """A failure of the bucket, not of one dump: hold the queue, say it once."""
        self._queue_failures += 1
        delay = backoff(self._queue_failures, self.config.retry_initial, self.config.retry_max)
        self._hold_until = self._clock() + delay
        if upload_queue.queue_failed(store.db, err.reason, err.message, self._clock(), counted=counted):
            log.error("Uploads to s3://%s are failing (%s): %s; retrying with backoff", self.target.bucket,
                      err.reason, err.message)
        else:
            log.debug("Uploads still failing (%s), next try in %.0fs", err.reason, delay)


