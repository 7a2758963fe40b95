"""The durable upload queue: the uploads table of the index (its schema is index.py's), the uploader's
operations on it (fleet/upload.py) and what status and metrics read of it. A row: state pending | uploading |
done | failed, attempts, next attempt, last error and its reason, the fleet budget's answer, the verified
core; the upload_failures and upload_problem tables count failures and hold the queue-wide one."""

from __future__ import annotations

import json
import sqlite3
import time

from corehandler.store import index
from corehandler.store.dumprow import COMPRESSING

STATES = ("pending", "uploading", "done", "failed")
WAITING = ("pending", "uploading")
LOST = "lost"
KEPT_BACK = "kept_back"


def ensure_schema(db: sqlite3.Connection) -> None:
    """The queue's tables, made when uploads are first turned on (their presence tells `status` that a queue
    ever ran); the index's schema owner spells them."""
    if not _has_queue(db):
        index.create_upload_tables(db)


def _has_queue(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'uploads'").fetchone() is not None


def enqueue(db: sqlite3.Connection, dump_id: str, now: float | None = None) -> bool:
    with db:
        cur = db.execute("INSERT OR IGNORE INTO uploads (id, state, queued_at) VALUES (?, 'pending', ?)",
                         (dump_id, time.time() if now is None else now))
    return cur.rowcount == 1


def backfill(db: sqlite3.Connection, now: float | None = None) -> int:
    """Queues every live dump the queue has not seen (a kill between indexing and enqueueing, or a store
    that existed before [upload] was set); not one still compressing, which on_stored queues."""
    with db:
        cur = db.execute("INSERT OR IGNORE INTO uploads (id, state, queued_at) SELECT id, 'pending', ? FROM dumps "
                         "WHERE deleting = 0 AND status != ?", (time.time() if now is None else now, COMPRESSING))
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


def resume(db: sqlite3.Connection) -> None:
    """At the uploader's start: an upload a kill interrupted is pending again."""
    with db:
        db.execute("UPDATE uploads SET state = 'pending' WHERE state = 'uploading'")


def due(db: sqlite3.Connection, now: float) -> tuple[str, int, str | None] | None:
    """The oldest upload due at `now`, as (id, attempts, budget); None when none is."""
    return db.execute("SELECT id, attempts, budget FROM uploads WHERE state = 'pending' AND next_attempt <= ? "
                      "ORDER BY next_attempt, queued_at, id LIMIT 1", (now,)).fetchone()


def next_attempt(db: sqlite3.Connection) -> float | None:
    """The soonest next attempt of any pending upload; None when nothing is pending."""
    return db.execute("SELECT MIN(next_attempt) FROM uploads WHERE state = 'pending'").fetchone()[0]


def postpone(db: sqlite3.Connection, dump_id: str, until: float) -> None:
    """Not an attempt: looked at again at `until`."""
    with db:
        db.execute("UPDATE uploads SET next_attempt = ? WHERE id = ?", (until, dump_id))


def begin(db: sqlite3.Connection, dump_id: str) -> None:
    """An attempt starts: counted before it runs."""
    with db:
        db.execute("UPDATE uploads SET state = 'uploading', attempts = attempts + 1 WHERE id = ?", (dump_id,))


def interrupted(db: sqlite3.Connection, dump_id: str) -> None:
    """The attempt was stopped, not failed: pending again, at once."""
    with db:
        db.execute("UPDATE uploads SET state = 'pending' WHERE id = ?", (dump_id,))


def keep_budget(db: sqlite3.Connection, dump_id: str, budget: str) -> None:
    """The fleet budget's answer (a slot's key, or KEPT_BACK), kept so a retry does not claim again."""
    with db:
        db.execute("UPDATE uploads SET budget = ? WHERE id = ?", (budget, dump_id))


def keep_core(db: sqlite3.Connection, dump_id: str, core: dict, size: int | None, checksum: str | None) -> None:
    """The verified core in the bucket, kept so a retry finds it there and does not send it again."""
    with db:
        db.execute("UPDATE uploads SET core = ? WHERE id = ?",
                   (json.dumps({"core": core, "size": size, "checksum": checksum}), dump_id))


def kept_core(db: sqlite3.Connection, dump_id: str) -> dict | None:
    """What keep_core kept ({core, size, checksum}), or None."""
    kept = db.execute("SELECT core FROM uploads WHERE id = ?", (dump_id,)).fetchone()
    return json.loads(kept[0]) if kept and kept[0] else None


def done(db: sqlite3.Connection, dump_id: str, *, at: float, sent: int, seconds: float, budget: str | None,
         core_key: str | None, sidecar_key: str) -> bool:
    """The upload is done; True when it cleared a queue-wide problem (uploads work again)."""
    with db:
        db.execute("UPDATE uploads SET state = 'done', done_at = ?, bytes = ?, seconds = ?, budget = ?, "
                   "core_key = ?, sidecar_key = ?, last_error = NULL, reason = NULL WHERE id = ?",
                   (at, sent, seconds, budget, core_key, sidecar_key, dump_id))
        return db.execute("DELETE FROM upload_problem").rowcount > 0


def retry_at(db: sqlite3.Connection, dump_id: str, when: float, reason: str, message: str) -> None:
    """The attempt failed: pending again from `when`, the failure counted under its reason."""
    with db:
        db.execute("UPDATE uploads SET state = 'pending', next_attempt = ?, last_error = ?, reason = ? "
                   "WHERE id = ?", (when, message, reason, dump_id))
        _count_failure(db, reason)


def queue_failed(db: sqlite3.Connection, reason: str, message: str, now: float, *, counted: bool) -> bool:
    """A failure of the bucket, not of one dump: counted (unless retry_at counted it) and held as the queue's
    problem; True when it is news (not the problem already held)."""
    with db:
        if not counted:
            _count_failure(db, reason)
        old = db.execute("SELECT reason, message FROM upload_problem").fetchone()
        if old == (reason, message):
            return False
        db.execute("INSERT OR REPLACE INTO upload_problem (one, reason, message, since) VALUES (1, ?, ?, ?)",
                   (reason, message, now))
    return True


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

