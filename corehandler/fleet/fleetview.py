"""The fleet view: `fleet list`, `fleet list --group` and `fleet query SQL` on an embedded engine (DuckDB).

One table, `dumps` (the index's columns, dataset.COLUMNS, plus dt and host), made of:
- the Parquet index files of the days asked for (dataset.py): a day's compacted file when there is one, else
  the hosts' part files, merged here into one local file of the day (DuckDB opening a file per host costs
  more than the whole day's rows); downloaded once into the local cache by key and ETag (a file rewritten
  since is fetched again) and checked once at that ETag (schema, damage: the outcome is kept with it). The
  merged file is named by the digest of its parts' keys and ETags: while none changed, a later run reads it
  again as it is, and when some did, only those are fetched and the merge redone from the local parts;
- rows made from the sidecars the index does not cover: v1 hosts (corehandler 0.2), and a host's day with
  objects but no index file yet (a host whose uploader was killed between sidecar and index, until it
  retries).
A listing of the days costs one LIST per compacted day and three per other day (the compacted files', the
index's, the day's host partitions), plus the v1 hosts' listings, a GET per index file not cached and a GET
per uncovered sidecar not cached. Index files of a newer schema or damaged, and sidecars that are not JSON
or of a newer schema, are skipped, each named (a cached file's reason is named again from the cache).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from corehandler.fleet import bucket, dataset, reader
from corehandler.fleet.bucket import Target

_SAFE = re.compile(r"[A-Za-z0-9._-]+")
MERGED = "merged"
MERGED_GRACE = 600  # s: a merged file no run has used for this long, and of parts since changed, is dropped

LIST_SQL = """
SELECT id, host, epoch_us(crashed_at) / 1e6 AS crashed_at, exe, comm, signal, status, signature,
       has_core AS core, core_bytes, raw_bytes, budget, encrypted, sidecar_key AS key
FROM dumps ORDER BY crashed_at, id"""
GROUP_SQL = """
SELECT signature, count(*) AS count, count(*) FILTER (WHERE has_core) AS cores,
       list_sort(list(DISTINCT host)) AS hosts, min(epoch_us(crashed_at)) / 1e6 AS first_seen,
       max(epoch_us(crashed_at)) / 1e6 AS last_seen, arg_max(id, crashed_at) AS latest,
       arg_min(exe, crashed_at) AS exe, arg_min(signal, crashed_at) AS signal
FROM dumps GROUP BY signature ORDER BY count DESC, signature"""


@dataclass
class View:
    files: list[Path] = field(default_factory=list)   # local files of days, compacted or merged (dt in the path)
    rows: list[dict] = field(default_factory=list)    # rows of sidecars no index file covers
    skipped: list[str] = field(default_factory=list)  # why each unreadable object was left out
    hosts: tuple[str, ...] = ()                       # only these hosts, if any
    _tmp: str | None = None

    def close(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def connect(self):
        """A DuckDB connection with the view `dumps`."""
        import duckdb

        con = duckdb.connect(":memory:")
        con.register("unindexed", dataset.table(self.rows, partitions=True))
        sources = ["SELECT * FROM unindexed"]
        if self.files:
            paths = ", ".join(_quote(str(p)) for p in self.files)
            sources.insert(0, f"SELECT * FROM read_parquet([{paths}], hive_partitioning = true, "
                              "union_by_name = true, hive_types = {'dt': VARCHAR})")
        where = f" WHERE host IN ({', '.join(_quote(h) for h in self.hosts)})" if self.hosts else ""
        con.execute(f"CREATE VIEW dumps AS SELECT * FROM ({' UNION ALL BY NAME '.join(sources)}){where}")
        return con


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def collect(client, target: Target, days: list[datetime.date], only_hosts=(), cache: reader.SidecarCache | None = None,
            workers: int = reader.WORKERS) -> View:
    """What the view of those days (and hosts) is made of, fetched from the bucket."""
    wanted = set(only_hosts)
    view = View(hosts=tuple(sorted(wanted)))
    if cache is None:
        view._tmp = tempfile.mkdtemp(prefix="corehandler-fleet-")
    parts_dir = cache.parts_dir if cache else Path(view._tmp)

    def listing(day: datetime.date):
        # A compacted day is never stale (dataset.py): its file alone, nothing more to list.
        daily = reader.list_keys(client, target, dataset.daily_prefix(target, day), ".parquet")
        if daily:
            return day, [], sorted(daily)[-1:], []
        return (day, reader.list_keys(client, target, target.index_day_prefix(day), ".parquet"), [],
                reader.day_hosts(client, target, day))

    def local(key: str, day: datetime.date, host: str | None) -> Path:
        name = hashlib.sha256(key.encode()).hexdigest()[:32] + ".parquet"
        if host is None:
            return parts_dir / dataset.DAILY / f"dt={day:%Y-%m-%d}" / name
        return parts_dir / f"dt={day:%Y-%m-%d}" / f"host={host}" / name

    with ThreadPoolExecutor(max_workers=workers) as pool:
        per_day = list(pool.map(listing, days))
        files, uncovered, parts_of = [], [], {}
        for day, keys, daily, day_hosts in per_day:
            keys = [(k, e, bucket.host_of(k)) for k, e in keys if bucket.host_of(k)]
            parts_of[day] = [(k, e, day, h) for k, e, h in keys
                             if _SAFE.fullmatch(h) and h not in (".", "..") and (not wanted or h in wanted)]
            files += [(k, e, day, None) for k, e in daily] or parts_of[day]
            indexed = {h for _, _, h in keys}
            uncovered += [target.day_prefix(h, day) for h in day_hosts
                          if h not in indexed and (not wanted or h in wanted)]
        v1 = [h for h in reader.hosts(client, target) if not wanted or h in wanted]
        uncovered += [target.v1_day_prefix(h, d) for h in v1 for d in days]
        listed = [k for ks in pool.map(lambda p: reader.list_keys(client, target, p), uncovered) for k in ks]

        known = cache.parts([f[0] for f in files]) if cache else {}

        def fetch(item) -> tuple[str, str] | None:
            key, etag, day, host = item
            path = local(key, day, host)
            if known.get(key, ("",))[0] == etag and etag and path.exists():
                return None
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                body = reader._call(client.get_object, Bucket=target.bucket, Key=key)["Body"].read()
            except reader.BucketError:
                if host is None:  # a compaction of newer inputs replaced it since the listing: use the parts
                    return key, ""
                raise
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(body)
            os.replace(tmp, path)
            return key, etag
        fetched = list(pool.map(fetch, files))
        gone = {r[0] for r in fetched if r and not r[1]}
        if gone:
            retry = [p for f in files if f[0] in gone for p in parts_of[f[2]]]
            files = [f for f in files if f[0] not in gone] + retry
            fetched += list(pool.map(fetch, retry))
    fresh = {r[0] for r in fetched if r}
    checked, merge = [], {}
    for key, etag, day, host in files:
        path = local(key, day, host)
        _, schema, problem = known.get(key, ("", None, None))
        if key in fresh or schema != dataset.INDEX_SCHEMA or problem is None:
            problem = _problem(path)
            checked.append((key, etag, dataset.INDEX_SCHEMA, problem))
        if problem:
            view.skipped.append(f"s3://{target.bucket}/{key}{problem}")
        elif host is None:
            view.files.append(path)
            _prune(_merged_dir(parts_dir, day), None)  # compacted since: its merged file goes
        else:
            merge.setdefault(day, []).append((key, etag, host, path))
    if cache:
        cache.put_parts([c for c in checked if c[1]])
    view.files += [_merged(parts_dir, day, parts) for day, parts in sorted(merge.items())]
    sidecars, skipped = reader.read_sidecars(client, target, listed, workers, cache)
    view.skipped += skipped
    for sc in sidecars:
        r = dataset.row(sc, sc["_key"])
        day = bucket.crash_day(sc.get("crashed_at") or 0)
        r.update(dt=f"{day:%Y-%m-%d}", host=dataset._text(sc.get("host")))
        view.rows.append(r)
    return view


def _problem(path: Path) -> str:
    """Why a local index file is left out of the view ("" if it is not), as it follows its key."""
    try:
        dataset.check_file(path)
    except dataset.NewerSchemaError as e:
        return f": {e}"
    except Exception as e:  # noqa: BLE001 (a damaged file is named and left out, not fatal)
        return f" is not a Parquet index file: {e}"
    return ""


def _merged(parts_dir: Path, day: datetime.date, parts: list[tuple[str, str, str, Path]]) -> Path:
    """One local file of a day's checked part files (key, ETag, host, path), as a compacted day's file is
    (host a column), so a warm view opens one file for the day and not one per host. It is named by the
    parts' digest: while none changed, the last run's file is read again as it is."""
    import duckdb

    folder = _merged_dir(parts_dir, day)
    path = folder / f"merged-{dataset.INDEX_SCHEMA}-{dataset.digest([(k, e) for k, e, _, _ in parts])}.parquet"
    if all(e for _, e, _, _ in parts) and path.exists():
        os.utime(path)
        return path
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = folder / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
    # DuckDB reads the parts as the view would (union_by_name, host from the path), so the merged file holds
    # the same rows and types.
    files = ", ".join(_quote(str(p)) for _, _, _, p in parts)
    duckdb.connect(":memory:").execute(
        f"COPY (SELECT * EXCLUDE (dt) FROM read_parquet([{files}], hive_partitioning = true, union_by_name = true, "
        f"hive_types = {{'dt': VARCHAR, 'host': VARCHAR}})) TO {_quote(str(tmp))} "
        "(FORMAT parquet, COMPRESSION zstd)")
    os.replace(tmp, path)
    _prune(folder, path)
    return path


def _merged_dir(parts_dir: Path, day: datetime.date) -> Path:
    return parts_dir / MERGED / f"dt={day:%Y-%m-%d}"


def _prune(folder: Path, keep: Path | None) -> None:
    """Drops the day's merged files of parts since changed, once no run still reading one can be using it."""
    stale = time.time() - MERGED_GRACE
    for old in folder.iterdir() if folder.is_dir() else ():
        try:
            if old != keep and old.stat().st_mtime < stale:
                old.unlink()
        except FileNotFoundError:  # another run pruned it first
            pass


def rows(con, sql: str) -> tuple[list[str], list[tuple]]:
    cur = con.execute(sql)
    return [d[0] for d in cur.description], cur.fetchall()


def as_dicts(columns: list[str], values: list[tuple]) -> list[dict]:
    return [dict(zip(columns, v)) for v in values]
