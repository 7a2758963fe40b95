"""Index rows and the schemas older versions wrote, for the tests of the index and of its migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from corehandler.store.dumprow import row_from_record


def record(n: int, *, pid=None, comm="app", exe="/usr/bin/app", signal=11, ts=None):
    return {"schema": 1, "id": f"17960000000{n:05d}-0123456789abcdef-{pid or n}", "core": "x.core",
            "pid": pid or n, "uid": 1000, "gid": 1000, "signal": signal, "timestamp": ts or 1_700_000_000 + n,
            "comm": comm, "hostname": "h", "boot_id": "0" * 32,
            "proc": {"exe": exe, "cmdline": [exe, f"--n={n}"]}}


def row(record, status="ok"):
    return row_from_record(record, status=status, problem=None, path=f"{record['id']}.zst", raw_bytes=100,
                           stored_bytes=10, sha256="ab" * 32)


# What corehandler wrote before schema 2.
SCHEMA_1 = """
CREATE TABLE dumps (id TEXT PRIMARY KEY, crashed_at REAL NOT NULL, ingested_at REAL NOT NULL,
    pid INTEGER, uid INTEGER, gid INTEGER, signal INTEGER, exe TEXT, comm TEXT, cmdline TEXT, hostname TEXT,
    boot_id TEXT, raw_bytes INTEGER NOT NULL DEFAULT 0, stored_bytes INTEGER NOT NULL DEFAULT 0, sha256 TEXT,
    status TEXT NOT NULL, problem TEXT, path TEXT, deleting INTEGER NOT NULL DEFAULT 0, record TEXT NOT NULL);
CREATE INDEX dumps_crashed_at ON dumps (crashed_at);
CREATE INDEX dumps_exe ON dumps (exe);
PRAGMA user_version=1;
"""

# Schema 2's tombstone columns.
SCHEMA_2_TOMBSTONES = ", deleted_at REAL, deleted_rule TEXT, freed_bytes INTEGER, compress_seconds REAL, " \
    "ingest_seconds REAL);"


def schema_2_index(state: Path) -> Path:
    """An index as v0.1 left it (schema 2, rollback-journal mode): dumps 1 and 2 live, dump 3 a tombstone."""
    (state / "store").mkdir(parents=True)
    db = sqlite3.connect(state / "index.sqlite")
    db.executescript(SCHEMA_1.replace("record TEXT NOT NULL);", "record TEXT NOT NULL" + SCHEMA_2_TOMBSTONES)
                     .replace("user_version=1", "user_version=2"))
    for n, deleted_at in ((1, None), (2, None), (3, 5.0)):
        values = dict(row(record(n)), deleted_at=deleted_at, deleted_rule="max_age" if deleted_at else None)
        db.execute(f"INSERT INTO dumps ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                   list(values.values()))
    db.commit()
    db.close()
    return state / "index.sqlite"
