"""The fleet view: `fleet list`, `fleet list --group` and `fleet query SQL` on an embedded engine (DuckDB).

One table, `dumps` (the index's columns, dataset.COLUMNS, plus dt and host), made of:
- the Parquet index files of the days asked for (dataset.py): a day's compacted file when one is named by
  the digest of the day's listed parts (it provably covers them; any other is never read), else the hosts'
  part files, merged here into one local file of the day (DuckDB opening a file per host costs
  more than the whole day's rows); downloaded once into the local cache by key and ETag (a file rewritten
  since is fetched again) and checked once at that ETag (schema, damage: the outcome is kept with it). The
  merged file is named by the digest of its parts' keys and ETags: while none changed, a later run reads it
  again as it is, and when some did, only those are fetched and the merge redone from the local parts;
- rows made from the sidecars the index does not cover: v1 hosts (corehandler 0.2), and a host's day with
  objects but no index file yet (a host whose uploader was killed between sidecar and index, until it
  retries).
A listing of the days costs two LISTs per compacted day (its compacted files', its parts') and three per
other day (those and the day's host partitions), plus the v1 hosts' listings, a GET per index file not
cached and a GET per uncovered sidecar not cached. Every file is size-capped before it is read and its
footer checked (dataset.check_file) before DuckDB opens it; index files of a newer schema, damaged or past
the bounds, and sidecars that are not UTF-8 JSON or of a newer schema, are skipped, each named (a cached
file's reason is named again from the cache). A damaged compacted file falls back to the day's parts,
saying so. A row's host is the one its key names, never what the object says.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from corehandler.fleet import bucket, dataset, reader
from corehandler.fleet.bucket import Target

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
        con.execute(f"SET memory_limit = {dataset.quote(dataset.MEMORY_LIMIT)}")
        con.register("unindexed", dataset.table(self.rows, partitions=True))
        sources = ["SELECT * FROM unindexed"]
        if self.files:
            paths = ", ".join(dataset.quote(str(p)) for p in self.files)
            sources.insert(0, f"SELECT {dataset.bounded_columns()} FROM read_parquet([{paths}], "
                              "hive_partitioning = true, union_by_name = true, hive_types = {'dt': VARCHAR})")
        where = f" WHERE host IN ({', '.join(dataset.quote(h) for h in self.hosts)})" if self.hosts else ""
        con.execute(f"CREATE VIEW dumps AS SELECT * FROM ({' UNION ALL BY NAME '.join(sources)}){where}")
        return con


def collect(client, target: Target, days: list[datetime.date], only_hosts=(), cache: reader.SidecarCache | None = None,
            workers: int = reader.WORKERS) -> View:
    """What the view of those days (and hosts) is made of, fetched from the bucket."""
    wanted = set(only_hosts)
    view = View(hosts=tuple(sorted(wanted)))
    if cache is None:
        view._tmp = tempfile.mkdtemp(prefix="corehandler-fleet-")
    parts_dir = cache.parts_dir if cache else Path(view._tmp)

    def listing(day: datetime.date):
        parts = dataset.day_parts(client, target, day)
        # A compacted file stands for the day only under the digest of exactly the parts listed now.
        covering = dataset.daily_key(target, day, parts) if parts else None
        daily = [(k, e) for k, e in reader.list_keys(client, target, dataset.daily_prefix(target, day), ".parquet")
                 if k == covering]
        return day, parts, daily, reader.day_hosts(client, target, day)

    def local(key: str, day: datetime.date, host: str | None) -> Path:
        name = hashlib.sha256(key.encode()).hexdigest()[:32] + ".parquet"
        if host is None:
            return parts_dir / dataset.DAILY / f"dt={day:%Y-%m-%d}" / name
        return parts_dir / f"dt={day:%Y-%m-%d}" / f"host={host}" / name

    with ThreadPoolExecutor(max_workers=workers) as pool:
        per_day = list(pool.map(listing, days))
        files, uncovered, parts_of = [], [], {}
        for day, keys, daily, day_hosts in per_day:
            keys = [(k, e, bucket.host_of(k)) for k, e in keys]
            parts_of[day] = [(k, e, day, h) for k, e, h in keys if not wanted or h in wanted]
            files += [(k, e, day, None) for k, e in daily] or parts_of[day]
            indexed = {h for _, _, h in keys}
            uncovered += [target.day_prefix(h, day) for h in day_hosts
                          if h not in indexed and (not wanted or h in wanted)]
        v1 = [h for h in reader.hosts(client, target) if not wanted or h in wanted]
        uncovered += [target.v1_day_prefix(h, d) for h in v1 for d in days]
        listed = [k for ks in pool.map(lambda p: reader.list_keys(client, target, p, direct=True), uncovered)
                  for k in ks]

        known = cache.parts([f[0] for f in files]) if cache else {}

        def fetch(item) -> tuple[str, str, str] | None:
            key, etag, day, host = item
            path = local(key, day, host)
            if known.get(key, ("",))[0] == etag and etag and path.exists():
                return None
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
            limit = dataset.MAX_PART_BYTES if host else dataset.MAX_DAILY_BYTES
            try:
                reader._call(bucket.download, client, target.bucket, key, tmp, limit)
            except bucket.ObjectTooLarge as e:
                tmp.unlink(missing_ok=True)
                path.unlink(missing_ok=True)
                return key, etag, f" {e.message.split(' ', 1)[1]}"
            except reader.BucketError:
                tmp.unlink(missing_ok=True)
                if host is None:  # a compaction of newer inputs replaced it since the listing: use the parts
                    return key, "", ""
                raise
            os.replace(tmp, path)
            return key, etag, ""
        checked, merge, fallback = [], {}, []

        def judge(items: list) -> None:
            """Fetches those files and sorts each into the view, the day's merge, or the skipped."""
            fetched = {r[0]: r for r in pool.map(fetch, items) if r}
            gone = [i for i in items if i[0] in fetched and not fetched[i[0]][1]]
            fallback.extend(day for _, _, day, _ in gone)  # a compacted file gone since the listing
            items = [i for i in items if i not in gone]

            def outcome(item) -> str:
                key, _, day, host = item
                _, schema, problem = known.get(key, ("", None, None))
                if key in fetched and fetched[key][2]:
                    return fetched[key][2]
                if key in fetched or schema != dataset.INDEX_SCHEMA or problem is None:
                    return _problem(local(key, day, host), daily=host is None)  # in the pool: DuckDB scans
                return problem
            for (key, etag, day, host), problem in zip(items, pool.map(outcome, items)):
                checked.append((key, etag, dataset.INDEX_SCHEMA, problem))
                if problem:
                    view.skipped.append(f"s3://{target.bucket}/{key}{problem}"
                                        + ("; reading the day's parts instead" if host is None else ""))
                    if host is None:
                        fallback.append(day)
                elif host is None:
                    view.files.append(local(key, day, host))
                    _prune(_merged_dir(parts_dir, day), None)  # compacted since: its merged file goes
                else:
                    merge.setdefault(day, []).append((key, etag, host, local(key, day, host)))
        judge(files)
        # A compacted file that is gone or unreadable: the day's parts instead, and the view says so.
        judge([p for day in fallback for p in parts_of[day]])
    if cache:
        cache.put_parts([c for c in checked if c[1]])
    view.files += [_merged(parts_dir, day, parts) for day, parts in sorted(merge.items())]
    sidecars, skipped = reader.read_sidecars(client, target, listed, workers, cache)
    view.skipped += skipped
    for sc in sidecars:
        r = dataset.row(sc, sc["_key"])
        day = bucket.crash_day(r["crashed_at"].timestamp() if r["crashed_at"] else 0)
        r.update(dt=f"{day:%Y-%m-%d}", host=sc["host"])
        view.rows.append(r)
    return view


def _problem(path: Path, daily: bool) -> str:
    """Why a local index file is left out of the view ("" if it is not), as it follows its key."""
    try:
        dataset.check_file(path, host=daily)
        dataset.scan(path, host=daily)
    except (dataset.NewerSchemaError, dataset.BadIndexFile) as e:
        return f": {e}"
    except Exception as e:  # noqa: BLE001 (a damaged file is named and left out, not fatal)
        return f" is not a Parquet index file: {e}"
    return ""


def _merged(parts_dir: Path, day: datetime.date, parts: list[tuple[str, str, str, Path]]) -> Path:
    """One local file of a day's checked part files (key, ETag, host, path), as a compacted day's file is
    (host a column), so a warm view opens one file for the day and not one per host. It is named by the
    parts' digest: while none changed, the last run's file is read again as it is."""
    folder = _merged_dir(parts_dir, day)
    path = folder / f"merged-{dataset.INDEX_SCHEMA}-{dataset.digest([(k, e) for k, e, _, _ in parts])}.parquet"
    if all(e for _, e, _, _ in parts) and path.exists():
        os.utime(path)
        return path
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = folder / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
    # DuckDB reads the parts as the view would (host from the path), so the merged file holds the same rows
    # and types, each string cut as the view cuts it.
    dataset.merge([p for _, _, _, p in parts], tmp)
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
