"""The bucket as a dataset: per-host, per-day Parquet index files of the sidecars' plain fields.

    PREFIX/v2/index/dt=YYYY-MM-DD/host=HOST/part-NNNNN.parquet

Hive-style partitions (dt, host come from the path, not from the file), so Athena, Trino, Spark, ClickHouse
and DuckDB read the tree as one table (docs/fleet-query.md). Each host writes only its own files, so there is
no coordinator: the uploader adds a dump's row to its host's last part of the crash's day after the sidecar
is up (a row of the same id is replaced: a retry is idempotent), and starts the next part past PART_ROWS rows
(so an upload rewrites a bounded file). The part's rows are kept on this host (the uploader's state dir,
`upload-index/`), never read back from the bucket: what another host with the fleet's credentials wrote
there (a decompression bomb, a name that is not a part's) never decides what this host uploads or stops it.
A day this host holds nothing of (a lost state dir, an upgrade) starts a new part after the highest number
its partition lists, by the keys' names alone (PART_NAME). The index lives in its own tree, not beside the
sidecars and cores, because engines read every file under a table's location as Parquet.

A day's files can be compacted into one (`fleet compact`, by any host or an admin, for closed days):
    PREFIX/v2/daily/dt=YYYY-MM-DD/index-DIGEST.parquet     (the same columns plus host)
A reader takes a day's compacted file for the whole day only when it provably covers the day's parts: its
name is DIGEST, of the parts' keys and ETags it was made from, and a reader lists the parts and uses only the
file of their digest; a part written since changes the digest, so the reader falls back to the parts. A file
of another name (stale, or planted) is never read. A compaction deletes the day's other compacted files. The
same inputs give the same key and rows, so compactions at once or twice are harmless.

Every index file read from the bucket is checked before an engine decodes it (check_file): its size before
it is downloaded (MAX_PART_BYTES, MAX_DAILY_BYTES), then from its footer alone the schema (exactly the
documented columns and types; a part has no `host` column, the path says it) and the decoded size of each
column chunk and row group (MAX_CHUNK_BYTES), so a small file that decompresses to gigabytes is refused
unread; the view cuts every string to MAX_TEXT characters (bounded_columns), which a dictionary-encoded
value repeated over many rows cannot get past.

Schema (INDEX_SCHEMA; the file's key-value metadata `corehandler.index_schema` and the column `index_schema`
say it): a reader skips a file of a newer schema, naming it. Columns are only ever added, each with the schema
that added it (ADDED); a file of an older schema has exactly the columns of its own, and reads with the newer
ones null (filled, for a reader's SQL). Strings are the sidecar's, with bytes that are not
UTF-8 (lone surrogates in Python) written as backslash escapes, since Parquet strings are UTF-8.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import os
import re
import time
from pathlib import Path

from corehandler.fleet import bucket, withoutcore
from corehandler.fleet.bucket import Target

INDEX_SCHEMA = 2
PART_ROWS = 2000
METADATA_KEY = b"corehandler.index_schema"
LEFT_OUT_KEY = b"corehandler.left_out"   # a compacted day's hosts whose parts it left out (left_out)
MAX_LEFT_OUT = 10000
DAILY = "daily"
LOCAL_KEEP_DAYS = 8      # a day's part this host holds locally is dropped once untouched for this long

# What a reader lets through (check_file): far above what an honest file holds (a part's PART_ROWS rows of
# sidecar fields; a compacted day's rows in row groups of DAILY_ROW_GROUP), far below what hurts a host.
MAX_PART_BYTES = 64 << 20
MAX_DAILY_BYTES = 2 << 30
MAX_CHUNK_BYTES = 32 << 20    # one column chunk, decoded (16384 rows of 2 KiB)
MAX_ROWS = 1 << 24
MAX_TEXT = 16384              # characters of a string value the view shows
MEMORY_LIMIT = "1GB"          # DuckDB's own, wherever it reads index files: past it a query fails cleanly
DAILY_ROW_GROUP = 16384
# part-NNNNN.parquet, the number as part_key writes it (wider once past 99999).
PART_NAME = re.compile(r"part-([0-9]{5,9})\.parquet")
V1_ID_PREFIX = "s1-"
DAILY_NAME = re.compile(r"index-([0-9a-f]{32})\.parquet")

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
    ("signature_id", "string", "s2-... of the signature (s1-... from a host before signature v2; null without "
                               "an analysis)"),
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
    ("signature_v1_id", "string", "s1-... the dump's signature by version 1 (an upgraded host's, or the "
                                  "signature_id of a host before signature v2): links v1 and v2 groups"),
    ("no_core_reason", "string", "why has_core is false: send_metadata | fleet_budget | capture:REASON | "
                                 "invalid | removed | unknown"),
    ("no_core_why", "string", "the same in one sentence"),
)
# The schema that added a column (the others are schema 1's).
ADDED = {"signature_v1_id": 2, "no_core_reason": 2, "no_core_why": 2}
PARTITIONS = (("dt", "string", "the crash's day, UTC, YYYY-MM-DD (from the path)"),
              ("host", "string", "the host (from the path)"))


class NewerSchemaError(ValueError):
    """A file of an index schema this corehandler does not know."""


def columns(version: int | None = None) -> tuple[tuple[str, str, str], ...]:
    """The columns of a file of that schema (INDEX_SCHEMA's by default)."""
    return tuple(c for c in COLUMNS if ADDED.get(c[0], 1) <= (INDEX_SCHEMA if version is None else version))


def schema(partitions: bool = False, host: bool = False, version: int | None = None):
    """The index file's schema (of that version); with the partition columns (dt, host) for rows made in
    memory, or with host for a compacted day's file."""
    import pyarrow as pa

    types = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(), "bool": pa.bool_(),
             "timestamp": pa.timestamp("us", tz="UTC")}
    extra = PARTITIONS if partitions else PARTITIONS[1:] if host else ()
    fields = [pa.field(name, types[kind]) for name, kind, _ in columns(version) + extra]
    return pa.schema(fields, metadata={METADATA_KEY: str(INDEX_SCHEMA if version is None else version).encode()})


def _text(value) -> str | None:
    if value is None:
        return None
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _time(ts) -> datetime.datetime | None:
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return None
    try:
        return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    except (ValueError, OverflowError, OSError):  # past year 9999, NaN: no time
        return None


def _int(value) -> int | None:
    """An int64 column's value, or None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63
    return value if ok else None


def _int32(value) -> int | None:
    return value if _int(value) is not None and -(1 << 31) <= value < 1 << 31 else None


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list_of(value) -> list:
    return value if isinstance(value, list) else []


def crashing_frames(sc: dict) -> tuple[dict | None, list[dict]]:
    """The crashing thread of a sidecar's analysis (else its first) and that thread's frames, whatever
    shapes the sidecar gives them (another host wrote it): only dicts are kept."""
    threads = [t for t in _list_of(_dict(sc.get("analysis")).get("threads")) if isinstance(t, dict)]
    thread = next((t for t in threads if t.get("crashing")), threads[0] if threads else None)
    return thread, [f for f in _list_of((thread or {}).get("frames")) if isinstance(f, dict)]


def row(sc: dict, key: str) -> dict:
    """A sidecar's index row (its plain fields only: what an encrypted sidecar shows too), each of the type
    its column says or null, whatever the sidecar holds."""
    index = _dict(sc.get("index"))
    core = _dict(sc.get("core")) if sc.get("core") is not None else None
    analysis = _dict(sc.get("analysis"))
    thread, frames = crashing_frames(sc)
    top = frames[0].get("function") if frames and thread and thread.get("crashing") else None
    no_core = withoutcore.of_sidecar(sc)
    return {
        "index_schema": INDEX_SCHEMA, "id": _text(sc.get("id")), "crashed_at": _time(sc.get("crashed_at")),
        "uploaded_at": _time(sc.get("uploaded_at")), "exe": _text(index.get("exe")),
        "comm": _text(index.get("comm")), "signal": _int32(index.get("signal")), "uid": _int(index.get("uid")),
        "status": _text(index.get("status")), "signature": _text(sc.get("signature")),
        "signature_id": _text(analysis.get("signature_id")), "signature_source": _text(sc.get("signature_source")),
        "exact_key": _text(analysis.get("exact_key")), "analysis_state": _text(analysis.get("state")),
        "top_function": _text(top),
        "has_core": core is not None, "core_key": _text(core.get("key")) if core else None,
        "core_bytes": _int(core.get("bytes")) if core else None, "raw_bytes": _int(index.get("raw_bytes")),
        "encrypted": bool(sc.get("sealed")) or bool(core and core.get("encryption")),
        "budget": _text(sc.get("budget")), "sidecar_key": _text(key), "sidecar_schema": _int32(sc.get("schema")),
        "signature_v1_id": _v1_id(analysis), "no_core_reason": no_core["reason"] if no_core else None,
        "no_core_why": no_core["why"] if no_core else None,
    }


def _v1_id(analysis: dict) -> str | None:
    """The analysis's version 1 signature id: its own signature_id when it is of version 1 (a host before
    signature v2), else the one an upgraded host keeps beside the v2 id."""
    linked = _text(analysis.get("signature_v1_id"))
    own = _text(analysis.get("signature_id"))
    return linked or (own if own and own.startswith(V1_ID_PREFIX) else None)


def table(rows: list[dict], partitions: bool = False, host: bool = False):
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=schema(partitions, host))


def to_parquet(rows: list[dict], host: bool = False, left_out: list[str] = ()) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    t = table(rows, host=host)
    if left_out:
        t = t.replace_schema_metadata({**t.schema.metadata, LEFT_OUT_KEY: ",".join(left_out).encode()})
    pq.write_table(t, buf, compression="zstd")
    return buf.getvalue()


def left_out(path) -> list[str]:
    """The hosts a compacted day's file says it holds no rows of, their index files of the day unreadable
    when it was made (compact): names of a host's shape only, at most MAX_LEFT_OUT."""
    import pyarrow.parquet as pq

    said = (pq.ParquetFile(path).metadata.metadata or {}).get(LEFT_OUT_KEY, b"")
    names = said.decode("ascii", "replace").split(",")[:MAX_LEFT_OUT] if said else []
    return sorted({n for n in names if bucket.safe_host(n)})


def from_parquet(data: bytes, where: str) -> list[dict]:
    """The rows of a part file; NewerSchemaError for a schema past ours."""
    import pyarrow.parquet as pq

    t = pq.read_table(io.BytesIO(data))
    version = int((t.schema.metadata or {}).get(METADATA_KEY, b"0"))
    if version > INDEX_SCHEMA:
        raise NewerSchemaError(f"{where} has index schema {version}, newer than this corehandler's "
                               f"({INDEX_SCHEMA})")
    return t.to_pylist()


class BadIndexFile(ValueError):
    """An index file whose footer is not one this corehandler wrote (schema, sizes): left unread."""


def check_file(path, host: bool = False) -> None:
    """NewerSchemaError for a local index file of a schema past ours; BadIndexFile for one whose footer is
    not the documented schema (a compacted day's, with host: `host`) or claims decoded sizes past the
    bounds. Reads the footer only, never a page."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    version = (meta.metadata or {}).get(METADATA_KEY, b"0")
    if not version.isdigit() or len(version) > 6:
        raise BadIndexFile(f"index schema {version[:40]!r} is not a number")
    if int(version) > INDEX_SCHEMA:
        raise NewerSchemaError(f"index schema {int(version)}, newer than this corehandler's ({INDEX_SCHEMA})")
    want = schema(host=host, version=max(1, int(version)))  # an older file: its own schema's columns
    have = meta.schema.to_arrow_schema()
    if sorted(have.names) != sorted(want.names):
        extra, missing = set(have.names) - set(want.names), set(want.names) - set(have.names)
        raise BadIndexFile("not the index's columns (" + "; ".join(
            x for x in (f"unknown: {', '.join(sorted(extra))[:200]}" if extra else "",
                        f"missing: {', '.join(sorted(missing))}" if missing else "",
                        "a column twice" if len(have.names) != len(set(have.names)) else "") if x) + ")")
    for f in have:
        if f.type != want.field(f.name).type:
            raise BadIndexFile(f"column {f.name} is {f.type}, not {want.field(f.name).type}")
    if meta.num_rows > MAX_ROWS:
        raise BadIndexFile(f"{meta.num_rows} rows, more than {MAX_ROWS}")
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            size = group.column(c).total_uncompressed_size
            if size > MAX_CHUNK_BYTES:
                raise BadIndexFile(f"a column chunk ({group.column(c).path_in_schema}) decodes to {size} bytes, "
                                   f"more than {MAX_CHUNK_BYTES}")


def connect():
    """An in-memory DuckDB under MEMORY_LIMIT. Opening one costs ~15 ms (duckdb 2.0), more than scanning a
    host's part file: a pass over many files opens one and gives each file a cursor (under 1 ms), and closes
    it when the pass ends, so no live database is left for a forked child to inherit."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute(f"SET memory_limit = {quote(MEMORY_LIMIT)}")
    return con


@contextlib.contextmanager
def _cursor(db):
    """A cursor of the pass's database db, or a database of its own when there is no pass."""
    con = db.cursor() if db is not None else connect()
    try:
        yield con
    finally:
        con.close()


def scan(path, host: bool = False, db=None) -> None:
    """Decodes every value of a file check_file passed, as the view will (strings cut, under DuckDB's memory
    limit), so a damaged page is met here, named, and not in the middle of a user's query. duckdb.Error
    for a file that does not read."""
    with _cursor(db) as con:
        source = every_column(con, f"SELECT * FROM read_parquet({quote(str(path))})", host=host)
        con.execute(f"SELECT max(hash(COLUMNS(*))) FROM (SELECT {bounded_columns(host)} FROM ({source}))").fetchall()


def every_column(con, source: str, partitions: bool = False, host: bool = True) -> str:
    """A SELECT of source (SQL over index files, maybe of older schemas) with every column of INDEX_SCHEMA,
    those a file lacks null, in the types of the current schema: the way DuckDB's union_by_name fills
    columns in, for a read where no file of the current schema may be."""
    name = f"index_schema_{INDEX_SCHEMA}_{'p' if partitions else 'h' if host else 'n'}"
    con.register(name, table([], partitions=partitions, host=host))
    return f"SELECT * FROM ({source}) UNION ALL BY NAME SELECT * FROM {name}"


def bounded_columns(host: bool = True, exclude: str = "") -> str:
    """The select list of an index file's columns for DuckDB, each string cut to MAX_TEXT characters: one
    value repeated through a dictionary then costs a row no more than an honest one."""
    strings = [name for name, kind, _ in COLUMNS if kind == "string"] + (["host"] if host else [])
    cut = ", ".join(f"left({n}, {MAX_TEXT}) AS {n}" for n in strings)
    return f"* {f'EXCLUDE ({exclude}) ' if exclude else ''}REPLACE ({cut})"


def part_key(target: Target, host: str, day: datetime.date, n: int) -> str:
    return target.index_prefix(host, day) + f"part-{n:05d}.parquet"


def part_number(key: str) -> int | None:
    """N of a key named part-N.parquet, or None (a name another host chose is parsed by its pattern only)."""
    m = PART_NAME.fullmatch(key.rsplit("/", 1)[-1])
    return int(m[1]) if m else None


def is_part(target: Target, day: datetime.date, key: str) -> bool:
    """Whether key has the exact shape of a part of that day: INDEX/dt=DAY/host=HOST/part-N.parquet, nothing
    between (a key another host made may hold `host=` twice, or more folders, to pass as someone else's)."""
    host = bucket.host_of(key)
    folder, _, name = key.rpartition("/")
    return host is not None and folder + "/" == target.index_prefix(host, day) and part_number(name) is not None


def day_parts(client, target: Target, day: datetime.date, host: str | None = None) -> list[tuple[str, str]]:
    """(key, ETag) of the day's parts (of one host, if given), only those of the exact shape (is_part)."""
    prefix = target.index_prefix(host, day) if host else target.index_day_prefix(day)
    return [(k, e) for k, e in _list(client, target, prefix) if is_part(target, day, k)]


def local_dir(state_dir: Path, target: Target) -> Path:
    """Where this host keeps the last part of each day it wrote to that bucket, prefix and host name."""
    name = hashlib.sha256(f"{target.bucket}\0{target.prefix}\0{target.host}".encode()).hexdigest()[:16]
    return Path(state_dir) / "upload-index" / name


def add(client, target: Target, day: datetime.date, new: dict, local: Path, sse: dict | None = None) -> str:
    """Puts `new` into this host's last part file of `day` (replacing a row of the same id), or into a new
    part past PART_ROWS rows. The part's rows come from `local` (local_dir), never from the bucket; a day
    held nowhere starts a new part after the highest one listed. Only this host writes under its own
    partition: no lock, no coordinator."""
    folder = Path(local) / f"dt={day:%Y-%m-%d}"
    held = sorted((n, p) for p in (folder.iterdir() if folder.is_dir() else ())
                  if (n := part_number(p.name)) is not None)
    rows: list[dict] = []
    if held:
        n, path = held[-1]
        try:
            rows = [r for r in from_parquet(path.read_bytes(), str(path)) if r["id"] != new["id"]]
        except Exception:  # noqa: BLE001 (a damaged local copy: the next part, never the host stuck on it)
            rows = [None] * PART_ROWS
        if len(rows) >= PART_ROWS:
            rows, n = [], n + 1
    else:
        n = max((part_number(k) for k, _ in day_parts(client, target, day, target.host)), default=-1) + 1
    key = part_key(target, target.host, day, n)
    body = to_parquet(rows + [new])
    client.put_object(Bucket=target.bucket, Key=key, Body=body, ContentType="application/vnd.apache.parquet",
                      **(sse or {}))
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mine = folder / f"part-{n:05d}.parquet"
    tmp = folder / f".{mine.name}.tmp"
    tmp.write_bytes(body)
    os.replace(tmp, mine)
    for _, older in held:
        if older != mine:
            older.unlink(missing_ok=True)
    _prune_local(Path(local), folder)
    return key


def _prune_local(local: Path, keep: Path) -> None:
    stale = time.time() - LOCAL_KEEP_DAYS * 86400
    for folder in local.iterdir():
        if folder != keep and folder.stat().st_mtime < stale:
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()


def digest(parts: list[tuple[str, str]]) -> str:
    """The name of a set of part files (key, ETag), as a compacted file carries it."""
    return hashlib.sha256("\n".join(f"{k} {e}" for k, e in sorted(parts)).encode()).hexdigest()[:32]


def daily_prefix(target: Target, day: datetime.date) -> str:
    return target.key(DAILY, f"dt={day:%Y-%m-%d}") + "/"


def daily_key(target: Target, day: datetime.date, parts: list[tuple[str, str]]) -> str:
    """The only compacted file of a day a reader uses while the day's parts are these (key, ETag)."""
    return daily_prefix(target, day) + f"index-{digest(parts)}.parquet"


def _list(client, target: Target, prefix: str) -> list[tuple[str, str]]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix=prefix)
    return [(o["Key"], o.get("ETag", "")) for page in pages for o in page.get("Contents") or []
            if o["Key"].endswith(".parquet")]


def merge(files: list[Path], out: Path, left_out: list[str] = (), db=None) -> None:
    """One file with a host column (a compacted day's shape) of checked part files laid out under
    host=HOST/ folders (the host comes from the path), each string cut to MAX_TEXT, in row groups of
    DAILY_ROW_GROUP (so check_file's bounds hold for it); left_out: the hosts whose parts were left out."""
    names = ", ".join(quote(str(p)) for p in files)
    with _cursor(db) as con:
        parts = every_column(con, f"SELECT * FROM read_parquet([{names}], hive_partitioning = true, union_by_name "
                                  "= true, hive_types = {'dt': VARCHAR, 'host': VARCHAR})", partitions=True)
        con.execute(
            f"COPY (SELECT {bounded_columns(exclude='dt')} FROM ({parts}) ORDER BY host, id) "
            f"TO {quote(str(out))} (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {DAILY_ROW_GROUP}, "
            f"KV_METADATA {{{quote(METADATA_KEY.decode())}: {quote(str(INDEX_SCHEMA))}"
            + (f", {quote(LEFT_OUT_KEY.decode())}: {quote(','.join(left_out))}" if left_out else "") + "})")


def quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def compact(client, target: Target, day: datetime.date, sse: dict | None = None,
            attempts: int = 3) -> tuple[str | None, int, list[str]]:
    """The day's part files as one file (its key, its rows, why each part left out was); (None, 0, ...) for a
    day without any, or when hosts kept writing to it through every attempt. Each part is size-capped and
    checked as a reader checks it before anything decodes it; one that fails is left out with its host's other
    parts of the day, named, still counted in the digest, and its host named in the file (left_out: a reader
    reads that host's sidecars of the day instead). Idempotent and safe to run twice at once (the
    module's docstring says why)."""
    import tempfile

    skipped: list[str] = []
    for _ in range(attempts):
        parts = day_parts(client, target, day)
        if not parts:
            return None, 0, skipped
        key = daily_key(target, day, parts)
        skipped = []
        with tempfile.TemporaryDirectory(prefix="corehandler-compact-") as tmp:
            good, bad = [], set()
            for n, (part, _) in enumerate(sorted(parts)):
                host = bucket.host_of(part)
                path = Path(tmp) / f"dt={day:%Y-%m-%d}" / f"host={host}" / f"{n}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    bucket.download(client, target.bucket, part, path, MAX_PART_BYTES)
                    check_file(path)
                    scan(path)
                except (bucket.ObjectTooLarge, NewerSchemaError, BadIndexFile) as e:
                    skipped.append(f"s3://{target.bucket}/{part}: {e}")
                    bad.add(host)
                    continue
                except Exception as e:  # noqa: BLE001 (pyarrow's errors for a damaged footer are many)
                    skipped.append(f"s3://{target.bucket}/{part} is not a Parquet index file: {e}")
                    bad.add(host)
                    continue
                good.append((host, path))
            # A host with a part left out is left out whole, and named in the file: a reader takes that
            # host's day from its sidecars instead, and no row twice.
            good = [p for h, p in good if h not in bad]
            out = Path(tmp) / "daily.parquet"
            if good:
                merge(good, out, sorted(bad))
            else:
                out.write_bytes(to_parquet([], host=True, left_out=sorted(bad)))
            rows = _rows_in(out)
            with open(out, "rb") as body:
                client.put_object(Bucket=target.bucket, Key=key, Body=body,
                                  ContentType="application/vnd.apache.parquet", **(sse or {}))
        now = day_parts(client, target, day)
        if sorted(now) != sorted(parts):
            client.delete_object(Bucket=target.bucket, Key=key)  # a host wrote meanwhile: stale already
            continue
        for other, _ in _list(client, target, daily_prefix(target, day)):
            if other != key:
                client.delete_object(Bucket=target.bucket, Key=other)
        return key, rows, skipped
    return None, 0, skipped


def _rows_in(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows
