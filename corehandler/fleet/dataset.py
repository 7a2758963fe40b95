"""The bucket as a dataset: per-host, per-day Parquet index files of the sidecars' plain fields.

    PREFIX/v2/index/dt=YYYY-MM-DD/host=HOST/part-NNNNN.parquet

Hive-style partitions (dt, host come from the path, not from the file), so Athena, Trino, Spark, ClickHouse
and DuckDB read the tree as one table (docs/fleet-query.md). Each host writes only its own files, so there is
no coordinator: the uploader adds a dump's row to its host's last part of the crash's day after the sidecar
is up (a row of the same id is replaced: a retry is idempotent), and starts the next part past PART_ROWS rows
(so an upload rewrites a bounded file). The index lives in its own tree, not beside the sidecars and cores,
because engines read every file under a table's location as Parquet.

A day's files can be compacted into one (`fleet compact`, by any host or an admin, for closed days):
    PREFIX/v2/daily/dt=YYYY-MM-DD/index-DIGEST.parquet     (the same columns plus host)
A reader takes a day's compacted file for the whole day, without listing its parts, so it must never be
stale: an uploader that adds a row to a day deletes the day's compacted files after writing its part, and a
compaction checks after writing that the day's parts are still those it read (DIGEST, of their keys and
ETags), deleting its file otherwise. Either the uploader's check comes after the compacted file was written
and sees it, or the compaction's comes after the part was written and sees that. The same inputs give the
same key and rows, so compactions at once or twice are harmless.

Schema (INDEX_SCHEMA; the file's key-value metadata `corehandler.index_schema` and the column `index_schema`
say it): a reader skips a file of a newer schema, naming it. Strings are the sidecar's, with bytes that are not
UTF-8 (lone surrogates in Python) written as backslash escapes, since Parquet strings are UTF-8.
"""

from __future__ import annotations

import datetime
import hashlib
import io

from corehandler.fleet import bucket
from corehandler.fleet.bucket import Target

INDEX_SCHEMA = 1
PART_ROWS = 2000
METADATA_KEY = b"corehandler.index_schema"
DAILY = "daily"

# (name, pyarrow type name, what it is): the documented columns, in order (docs/fleet-query.md).
COLUMNS = (
    ("index_schema", "int32", "this file's schema version"),
    ("id", "string", "the dump id (<µs>-<boot id>-<pid>)"),
    ("crashed_at", "timestamp", "the crash's time, UTC"),
    ("uploaded_at", "timestamp", "when the sidecar went up, UTC"),
    ("exe", "string", "the executable's path"),
    ("comm", "string", "the thread's name"),
    ("signal", "int32", "the signal number"),
    ("uid", "int64", "the process's user id"),
    ("status", "string", "the dump's status on its host (ok, truncated, dropped, invalid, orphan)"),
    ("signature", "string", "the normalised signature (or EXE:SIGNAL without an analysis)"),
    ("signature_id", "string", "s1-... of the signature (null without an analysis)"),
    ("signature_source", "string", "analysis | exe+signal"),
    ("exact_key", "string", "x1-... the exact key (null without an analysis)"),
    ("analysis_state", "string", "ok | partial | failed | timeout | unavailable | skipped | null"),
    ("top_function", "string", "the crashing thread's first frame's function, if known"),
    ("has_core", "bool", "a core is in the bucket"),
    ("core_key", "string", "its object key"),
    ("core_bytes", "int64", "its object's size"),
    ("raw_bytes", "int64", "the core's size as captured"),
    ("encrypted", "bool", "the core and the sensitive fields are age-encrypted"),
    ("budget", "string", "slot N | kept_back | unenforced | null (no fleet budget)"),
    ("sidecar_key", "string", "the sidecar's object key"),
    ("sidecar_schema", "int32", "the sidecar's schema version"),
)
PARTITIONS = (("dt", "string", "the crash's day, UTC, YYYY-MM-DD (from the path)"),
              ("host", "string", "the host (from the path)"))


class NewerSchemaError(ValueError):
    """A file of an index schema this corehandler does not know."""


def schema(partitions: bool = False, host: bool = False):
    """The index file's schema; with the partition columns (dt, host) for rows made in memory, or with host
    for a compacted day's file."""
    import pyarrow as pa

    types = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(), "bool": pa.bool_(),
             "timestamp": pa.timestamp("us", tz="UTC")}
    extra = PARTITIONS if partitions else PARTITIONS[1:] if host else ()
    fields = [pa.field(name, types[kind]) for name, kind, _ in COLUMNS + extra]
    return pa.schema(fields, metadata={METADATA_KEY: str(INDEX_SCHEMA).encode()})


def _text(value) -> str | None:
    if value is None:
        return None
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _time(ts) -> datetime.datetime | None:
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def row(sc: dict, key: str) -> dict:
    """A sidecar's index row (its plain fields only: what an encrypted sidecar shows too)."""
    index = sc.get("index") or {}
    core = sc.get("core") or None
    analysis = sc.get("analysis") or {}
    threads = analysis.get("threads") or []
    crashing = next((t for t in threads if isinstance(t, dict) and t.get("crashing")), None)
    frames = (crashing or {}).get("frames") or []
    return {
        "index_schema": INDEX_SCHEMA, "id": _text(sc.get("id")), "crashed_at": _time(sc.get("crashed_at")),
        "uploaded_at": _time(sc.get("uploaded_at")), "exe": _text(index.get("exe")),
        "comm": _text(index.get("comm")), "signal": _int(index.get("signal")), "uid": _int(index.get("uid")),
        "status": _text(index.get("status")), "signature": _text(sc.get("signature")),
        "signature_id": _text(analysis.get("signature_id")), "signature_source": _text(sc.get("signature_source")),
        "exact_key": _text(analysis.get("exact_key")), "analysis_state": _text(analysis.get("state")),
        "top_function": _text(frames[0].get("function")) if frames and isinstance(frames[0], dict) else None,
        "has_core": core is not None, "core_key": _text(core.get("key")) if core else None,
        "core_bytes": _int(core.get("bytes")) if core else None, "raw_bytes": _int(index.get("raw_bytes")),
        "encrypted": bool(sc.get("sealed")) or bool(core and core.get("encryption")),
        "budget": _text(sc.get("budget")), "sidecar_key": _text(key), "sidecar_schema": _int(sc.get("schema")),
    }


def table(rows: list[dict], partitions: bool = False, host: bool = False):
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=schema(partitions, host))


def to_parquet(rows: list[dict], host: bool = False) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table(rows, host=host), buf, compression="zstd")
    return buf.getvalue()


def from_parquet(data: bytes, where: str) -> list[dict]:
    """The rows of a part file; NewerSchemaError for a schema past ours."""
    import pyarrow.parquet as pq

    t = pq.read_table(io.BytesIO(data))
    version = int((t.schema.metadata or {}).get(METADATA_KEY, b"0"))
    if version > INDEX_SCHEMA:
        raise NewerSchemaError(f"{where} has index schema {version}, newer than this corehandler's "
                               f"({INDEX_SCHEMA})")
    return t.to_pylist()


def check_file(path) -> None:
    """NewerSchemaError for a local part file of a schema past ours (read from its footer only)."""
    import pyarrow.parquet as pq

    version = int((pq.read_schema(path).metadata or {}).get(METADATA_KEY, b"0"))
    if version > INDEX_SCHEMA:
        raise NewerSchemaError(f"index schema {version}, newer than this corehandler's ({INDEX_SCHEMA})")


def part_key(target: Target, host: str, day: datetime.date, n: int) -> str:
    return target.index_prefix(host, day) + f"part-{n:05d}.parquet"


def add(client, target: Target, day: datetime.date, new: dict, sse: dict | None = None) -> str:
    """Puts `new` into this host's last part file of `day` (replacing a row of the same id), or into a new
    part past PART_ROWS rows. Only this host writes under its own partition: no lock, no coordinator."""
    parts = sorted(k for k, _ in _list(client, target, target.index_prefix(target.host, day)))
    rows: list[dict] = []
    n = 0
    if parts:
        last = parts[-1]
        n = int(last.rsplit("part-", 1)[1].split(".", 1)[0])
        body = client.get_object(Bucket=target.bucket, Key=last)["Body"].read()
        try:
            rows = [r for r in from_parquet(body, f"s3://{target.bucket}/{last}") if r["id"] != new["id"]]
        except Exception:  # noqa: BLE001 (damaged or newer: left for readers to name, never the host stuck on it)
            rows = [None] * PART_ROWS
        if len(rows) >= PART_ROWS:
            rows, n = [], n + 1
    key = part_key(target, target.host, day, n)
    client.put_object(Bucket=target.bucket, Key=key, Body=to_parquet(rows + [new]),
                      ContentType="application/vnd.apache.parquet", **(sse or {}))
    for stale, _ in _list(client, target, daily_prefix(target, day)):  # a compaction without this row
        client.delete_object(Bucket=target.bucket, Key=stale)
    return key


def digest(parts: list[tuple[str, str]]) -> str:
    """The name of a set of part files (key, ETag), as a compacted file carries it."""
    return hashlib.sha256("\n".join(f"{k} {e}" for k, e in sorted(parts)).encode()).hexdigest()[:32]


def daily_prefix(target: Target, day: datetime.date) -> str:
    return target.key(DAILY, f"dt={day:%Y-%m-%d}") + "/"


def daily_key(target: Target, day: datetime.date, parts: list[tuple[str, str]]) -> str:
    return daily_prefix(target, day) + f"index-{digest(parts)}.parquet"


def _list(client, target: Target, prefix: str) -> list[tuple[str, str]]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix=prefix)
    return [(o["Key"], o.get("ETag", "")) for page in pages for o in page.get("Contents") or []
            if o["Key"].endswith(".parquet")]


def compact(client, target: Target, day: datetime.date, sse: dict | None = None,
            attempts: int = 3) -> tuple[str | None, int]:
    """The day's part files as one file (its key, its rows); (None, 0) for a day without any, or when hosts
    kept writing to it through every attempt. Idempotent and safe to run twice at once (the module's
    docstring says why)."""
    for _ in range(attempts):
        parts = [(k, e) for k, e in _list(client, target, target.index_day_prefix(day)) if bucket.host_of(k)]
        if not parts:
            return None, 0
        key = daily_key(target, day, parts)
        rows = []
        for part, _ in sorted(parts):
            host = bucket.host_of(part)
            rows += [dict(r, host=host) for r in from_parquet(
                client.get_object(Bucket=target.bucket, Key=part)["Body"].read(), f"s3://{target.bucket}/{part}")]
        rows.sort(key=lambda r: (r["host"], r["id"]))
        client.put_object(Bucket=target.bucket, Key=key, Body=to_parquet(rows, host=True),
                          ContentType="application/vnd.apache.parquet", **(sse or {}))
        now = [(k, e) for k, e in _list(client, target, target.index_day_prefix(day)) if bucket.host_of(k)]
        if sorted(now) != sorted(parts):
            client.delete_object(Bucket=target.bucket, Key=key)  # a host wrote meanwhile: stale already
            continue
        for other, _ in _list(client, target, daily_prefix(target, day)):
            if other != key:
                client.delete_object(Bucket=target.bucket, Key=other)
        return key, len(rows)
    return None, 0
