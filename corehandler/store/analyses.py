"""The `analysis` table of the index: one row per dump id, the analysis result and the columns queries need
(signature, exact key, unit, container, pod). Beside `dumps`, not in it, so the dump row stays the one
commit point of ingest and the analysis can be redone or skipped without touching it.

A row is written `pending` when the analyser starts and replaced by the result when it ends, both before
the dump's index row (daemon.ingest); a kill in between leaves the spool record, and ingest redoes both.
At start the daemon marks the dumps indexed without a result (an older daemon's, or a pending row whose
raw core is gone) as skipped, with the reason (Daemon.recover).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

from corehandler import fields
from corehandler.analysis import signature
from corehandler.printable import display

PENDING = "pending"

_COLUMNS = ("id", "state", "analysed_at", "seconds", "signature", "signature_id", "signature_version",
            "exact_key", "exact_version", "exe_build_id", "runtime", "container_id", "pod_uid", "pod_name", "unit",
            "signature_v1_id", "reason")


def _db(store_or_db) -> sqlite3.Connection:
    return getattr(store_or_db, "db", store_or_db)


def _exists(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'analysis'").fetchone() is not None


def row(dump_id: str, result: Mapping[str, Any]) -> dict:
    """Text columns as display forms (SQLite text is UTF-8; a signature names the process, whose name may not
    be): the result column keeps the exact text."""
    ident = result.get("identity") or {}
    exe = result.get("exe") or {}
    values = {"id": dump_id, "state": result["state"], "analysed_at": time.time(), "seconds": result.get("seconds"),
            "signature": result.get("signature"), "signature_id": result.get("signature_id"),
            "signature_version": result.get("signature_version"), "exact_key": result.get("exact_key"),
            "exact_version": result.get("exact_version"), "exe_build_id": exe.get("build_id"),
            "runtime": ident.get("runtime"), "container_id": ident.get("container_id"),
            "pod_uid": ident.get("pod_uid"), "pod_name": ident.get("pod_name"),
            "unit": ident.get("user_unit") or ident.get("unit"), "signature_v1_id": result.get("signature_v1_id"),
            "reason": (result.get("reason") or {}).get("text")}
    values = {k: display(v) if isinstance(v, str) else v for k, v in values.items()}
    values["result"] = json.dumps(dict(result), ensure_ascii=True, sort_keys=True)
    return values


def resign(result: dict, record: Mapping[str, Any]) -> bool:
    """Gives an analysis of an older signature version the current signature, from its stored frames (the
    crashing thread's, first) and the dump's record, keeping its old id as `signature_v1_id`; the exact key
    stays. False when it has no frames to compute one from (it keeps what it had)."""
    version = result.get("signature_version")
    if not isinstance(version, int) or version >= signature.SIGNATURE_VERSION:
        return False
    if version == 1:
        result.setdefault("signature_v1_id", result.get("signature_id"))
    threads = result.get("threads") or []
    frames = threads[0].get("frames") if threads and isinstance(threads[0], dict) else None
    if not frames:
        return False
    exe = (result.get("exe") or {}).get("path") or fields.comm(record)
    sig = fields.signal_number(record)
    keys = signature.keys(exe, None, sig, fields.signal_name(sig), frames)
    result.update(signature=keys["signature"], signature_id=keys["signature_id"],
                  signature_version=keys["signature_version"])
    return True


def resign_all(db: sqlite3.Connection) -> int:
    """Every analysis of an older signature version given the current one (resign), inside the caller's
    transaction (the index's migration); returns how many changed."""
    changed = 0
    rows = db.execute("SELECT a.id, a.result, d.record FROM analysis a LEFT JOIN dumps d ON d.id = a.id "
                      "WHERE a.signature_version < ?", (signature.SIGNATURE_VERSION,)).fetchall()
    for dump_id, text, record_text in rows:
        try:
            result = json.loads(text)
            record = json.loads(record_text) if record_text else {}
        except ValueError:
            continue
        if not isinstance(result, dict):
            continue
        resign(result, record if isinstance(record, dict) else {})
        values = row(dump_id, result)
        db.execute("UPDATE analysis SET signature = ?, signature_id = ?, signature_version = ?, signature_v1_id = ?, "
                   "result = ? WHERE id = ?", (values["signature"], values["signature_id"],
                                               values["signature_version"], values["signature_v1_id"],
                                               values["result"], dump_id))
        changed += 1
    return changed


def put(store_or_db, dump_id: str, result: Mapping[str, Any]) -> None:
    db = _db(store_or_db)
    values = row(dump_id, result)
    with db:
        db.execute(f"INSERT OR REPLACE INTO analysis ({', '.join(values)}) VALUES "
                   f"({', '.join(':' + k for k in values)})", values)


def mark_pending(store_or_db, dump_id: str) -> None:
    put(store_or_db, dump_id, {"state": PENDING})


def forget(store_or_db, dump_id: str) -> None:
    """For a dump retention removed: its result goes with its index row."""
    db = _db(store_or_db)
    if not _exists(db):
        return
    with db:
        db.execute("DELETE FROM analysis WHERE id = ?", (dump_id,))


def analysis_for(store_or_index, dump_id: str) -> dict | None:
    """The analysis result of a dump (docs/analysis.md, "Result"), None when there is none: a Store, or an
    sqlite3 connection to the index. For the fleet sidecar and the CLI."""
    db = _db(store_or_index)
    if not _exists(db):
        return None
    found = db.execute("SELECT result, state, analysed_at FROM analysis WHERE id = ?", (dump_id,)).fetchone()
    if found is None:
        return None
    result = json.loads(found[0])
    result["state"], result["analysed_at"] = found[1], found[2]
    return result


def summaries(store_or_db, ids: Iterable[str]) -> dict[str, dict]:
    """The query columns (no result JSON) of the given dumps, by id."""
    db = _db(store_or_db)
    ids = list(ids)
    if not ids or not _exists(db):
        return {}
    out = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        marks = ", ".join("?" * len(chunk))
        for values in db.execute(f"SELECT {', '.join(_COLUMNS)} FROM analysis WHERE id IN ({marks})", chunk):
            out[values[0]] = dict(zip(_COLUMNS, values))
    return out


def unanalysed(store_or_db) -> list[tuple[str, str | None]]:
    """(id, state) of live dumps indexed without a finished analysis: no row, or a pending one."""
    db = _db(store_or_db)
    return db.execute("SELECT d.id, a.state FROM dumps d LEFT JOIN analysis a ON a.id = d.id "
                      "WHERE d.deleting = 0 AND (a.id IS NULL OR a.state = ?) ORDER BY d.crashed_at",
                      (PENDING,)).fetchall()


def state_counts(store_or_db) -> dict[str, int]:
    db = _db(store_or_db)
    if not _exists(db):
        return {}
    return dict(db.execute("SELECT state, COUNT(*) FROM analysis GROUP BY state").fetchall())


def top_signatures(store_or_db, limit: int) -> list[tuple[str, str, int]]:
    """(signature_id, signature, live dumps) of the `limit` most frequent signatures."""
    db = _db(store_or_db)
    if not _exists(db):
        return []
    return db.execute("SELECT a.signature_id, a.signature, COUNT(*) AS n FROM analysis a JOIN dumps d "
                      "ON d.id = a.id WHERE d.deleting = 0 AND a.signature_id IS NOT NULL "
                      "GROUP BY a.signature_id ORDER BY n DESC, a.signature_id LIMIT ?", (limit,)).fetchall()


def newest_signature(store_or_db) -> tuple[str, str, float] | None:
    """(signature_id, signature, first crash) of the signature whose first dump in the store is the newest:
    what a "new kind of crash" alert watches. A signature is as old as the oldest dump of any v1 signature it
    links: new only when neither id was seen before."""
    db = _db(store_or_db)
    if not _exists(db):
        return None
    return db.execute(
        "WITH live AS (SELECT a.signature_id AS s, a.signature AS t, a.signature_v1_id AS v1, d.crashed_at AS c "
        "FROM analysis a JOIN dumps d ON d.id = a.id WHERE d.deleting = 0 AND a.signature_id IS NOT NULL), "
        "v1_first AS (SELECT v1, MIN(c) AS f FROM live WHERE v1 IS NOT NULL GROUP BY v1) "
        "SELECT l.s, l.t, MIN(MIN(l.c), COALESCE(MIN(v.f), MIN(l.c))) AS first FROM live l "
        "LEFT JOIN v1_first v ON v.v1 = l.v1 GROUP BY l.s ORDER BY first DESC, l.s LIMIT 1").fetchone()
