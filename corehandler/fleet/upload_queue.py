"""The durable upload queue: the uploads table of the index and what status and metrics read of it."""

from __future__ import annotations

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

