"""A dump's index row as the Python side sees it: the Dump type, the row built from a record."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

from corehandler import fields
from corehandler.printable import display

# A dump listed before its core is stored: visible (row, analysis, journal, metrics) while compression and
# verification run; it then takes one of the other statuses (daemon.py's stages).
COMPRESSING = "compressing"
STATUSES = ("ok", "truncated", "dropped", "invalid", "orphan", COMPRESSING)


_COLUMNS = ("id", "crashed_at", "ingested_at", "pid", "uid", "gid", "signal", "exe", "comm", "cmdline",
            "hostname", "boot_id", "raw_bytes", "stored_bytes", "sha256", "status", "problem", "path",
            "deleting", "record", "deleted_rule", "freed_bytes", "compress_seconds", "ingest_seconds", "corrupt",
            "mini_path", "mini_bytes")


@dataclass(frozen=True)
class Dump:
    id: str
    crashed_at: float
    ingested_at: float
    pid: int | None
    uid: int | None
    gid: int | None
    signal: int | None
    exe: str | None
    comm: str | None
    cmdline: list[str] | None
    hostname: str | None
    boot_id: str | None
    raw_bytes: int
    stored_bytes: int
    sha256: str | None
    status: str
    problem: str | None
    path: str | None  # file name inside the store directory, None for a dropped dump
    deleting: bool
    record: dict
    deleted_rule: str | None = None    # set when its deletion starts: the rule removing it
    freed_bytes: int | None = None     # bytes its file took, measured when the deletion started
    # What ingest took (None in rows a schema-1 daemon wrote).
    compress_seconds: float | None = None
    ingest_seconds: float | None = None
    corrupt: str | None = None         # what a check of the stored file found wrong (schema 4)
    mini_path: str | None = None       # the mini core's file in the store (schema 6), None when it has none
    mini_bytes: int | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "Dump":
        values = dict(zip(_COLUMNS, row))
        values["cmdline"] = json.loads(values["cmdline"]) if values["cmdline"] else None
        values["record"] = json.loads(values["record"])
        values["deleting"] = bool(values["deleting"])
        return cls(**exact_names(values))

    @classmethod
    def of_row(cls, row: dict) -> "Dump":
        """The Dump a row of row_from_record reads back as once inserted (daemon.py announces it before)."""
        return cls.from_row(tuple(row.get(c) for c in _COLUMNS))

    def summary(self) -> dict:
        """Every column, as JSON-ready values (the record separately, under "record")."""
        return {k: getattr(self, k) for k in _COLUMNS}


def _crash_time(record: dict) -> float:
    ts = record.get("timestamp")
    if isinstance(ts, (int, float)):
        return float(ts)
    started = (record.get("handler") or {}).get("started_realtime_ns")
    if isinstance(started, int):
        return started / 1e9
    try:
        return int(record["id"].split("-", 1)[0]) / 1e6
    except (KeyError, ValueError):
        return time.time()


def exact_names(values: dict) -> dict:
    """The row's exe, comm, cmdline and hostname as the process's bytes, from its record: the index columns
    hold display forms (an index of v0.1 too), the record the bytes (lone surrogates, see docs/design.md)."""
    record = values["record"]
    proc = fields.proc(record)
    values["exe"] = proc.get("exe") if isinstance(proc.get("exe"), str) else values["exe"]
    values["comm"] = fields.comm(record) or values["comm"]
    values["cmdline"] = fields.cmdline(record) or values["cmdline"]
    if isinstance(record.get("hostname"), str):
        values["hostname"] = record["hostname"]
    return values


def row_from_record(record: dict, *, status: str, problem: str | None, path: str | None, raw_bytes: int,
                    stored_bytes: int, sha256: str | None, ingested_at: float | None = None,
                    compress_seconds: float | None = None, ingest_seconds: float | None = None) -> dict:
    """The index row for a spool record. Text columns are display forms (SQLite text is UTF-8); the record
    keeps the exact bytes, which Dump reads back."""
    proc = record.get("proc") or {}
    cmdline = proc.get("cmdline")
    return {
        "id": record["id"],
        "crashed_at": _crash_time(record),
        "ingested_at": time.time() if ingested_at is None else ingested_at,
        "pid": record.get("pid"), "uid": record.get("uid"), "gid": record.get("gid"),
        "signal": record.get("signal"),
        "exe": display(proc.get("exe")),
        "comm": display(fields.comm(record)),
        "cmdline": json.dumps([display(a) for a in cmdline]) if isinstance(cmdline, list) else None,
        "hostname": display(record.get("hostname")),
        "boot_id": display(record.get("boot_id")),  # the kernel's, but the record's bytes all the same
        "raw_bytes": raw_bytes, "stored_bytes": stored_bytes, "sha256": sha256,
        "status": status, "problem": problem, "path": path, "deleting": 0,
        "compress_seconds": compress_seconds, "ingest_seconds": ingest_seconds,
        # ensure_ascii keeps the lone surrogates as \udcXX escapes, which round-trip through json.loads.
        "record": json.dumps(record, ensure_ascii=True, sort_keys=True),
    }

