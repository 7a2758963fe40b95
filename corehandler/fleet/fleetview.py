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
footer checked (dataset.check_file) before DuckDB opens it; its pages are decoded once, a compacted file's
by a scan of its own, a host's part by the day's merge (which, should a part's pages not decode, scans the
parts one by one to name it: a scan per part cost more than the merge of all). The pass holds one DuckDB
database (a cursor per file), closed when it ends. Index files of a newer schema, damaged or past
the bounds, and sidecars that are not UTF-8 JSON or of a newer schema, are skipped, each named (a cached
file's reason is named again from the cache). A damaged compacted file falls back to the day's parts,
saying so; a host's day whose part file is left out (damaged, of a newer schema, past the bounds), or that a
compacted file names as left out when it was made, is read from that host's sidecars of the day instead,
saying so (its other part files of the day left out, so no row counts twice). A row's host is the one its key
names, never what the object says. Index rows of an older schema get the columns it lacked from what they
hold (_old_rows_filled).
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

from corehandler.fleet import bucket, dataset, reader, withoutcore
from corehandler.fleet.bucket import Target

MERGED = "merged"
MERGED_GRACE = 600  # s: a merged file no run has used for this long, and of parts since changed, is dropped

LIST_SQL = """
SELECT id, host, epoch_us(crashed_at) / 1e6 AS crashed_at, exe, comm, signal, status, signature, signature_id,
       signature_v1_id, has_core AS core, core_key, core_bytes, raw_bytes, budget, no_core_reason, no_core_why,
       encrypted, sidecar_key AS key
FROM dumps ORDER BY crashed_at, id"""

# Signature v2 (docs/analysis.md, "Grouping keys") linked to v1: the dumps of hosts still on v1 (or uploaded
# before their host's upgrade) are grouped with the v2 signature whose dumps carry their v1 id as
# signature_v1_id (with the most dumps of the window, when several do), so an upgrade makes no group "new" and
# splits none in two. link(con) makes `links` (v1 id -> that signature; a table: the queries of a report use it
# three times) and the view `linked`: `dumps` with signature and signature_id those of the group, and
# own_signature_id the dump's own.
LINKS_SQL = """
CREATE OR REPLACE TEMP TABLE links AS
WITH v2 AS (SELECT signature_v1_id AS v1, signature_id, any_value(signature) AS signature, count(*) AS n
            FROM dumps WHERE signature_v1_id IS NOT NULL AND signature_id IS DISTINCT FROM signature_v1_id
            GROUP BY 1, 2)
SELECT v1, first(signature ORDER BY n DESC, signature) AS signature,
       first(signature_id ORDER BY n DESC, signature) AS signature_id FROM v2 GROUP BY v1"""
LINKED_SQL = """
CREATE OR REPLACE TEMP VIEW linked AS
SELECT d.* REPLACE (coalesce(l.signature, d.signature) AS signature,
                    coalesce(l.signature_id, d.signature_id) AS signature_id),
       d.signature_id AS own_signature_id
FROM dumps d LEFT JOIN links l ON l.v1 = d.signature_id"""
GROUP_SQL = """
SELECT signature, any_value(signature_id) AS signature_id, count(*) AS count,
       count(*) FILTER (WHERE has_core) AS cores, list_sort(list(DISTINCT host)) AS hosts,
       min(epoch_us(crashed_at)) / 1e6 AS first_seen, max(epoch_us(crashed_at)) / 1e6 AS last_seen,
       arg_max(id, crashed_at) AS latest, arg_min(exe, crashed_at) AS exe, arg_min(signal, crashed_at) AS signal,
       list_sort(list(DISTINCT signature_v1_id) FILTER (WHERE signature_v1_id IS NOT NULL)) AS signature_v1_ids,
       count(*) FILTER (WHERE own_signature_id IS DISTINCT FROM signature_id) AS linked_v1
FROM linked GROUP BY signature ORDER BY count DESC, signature"""


def link(con):
    """Adds `links` and the view `linked` (above) to a connection of View.connect(); returns it."""
    con.execute(LINKS_SQL)
    con.execute(LINKED_SQL)
    return con


def _old_rows_filled() -> str:
    """The `dumps` view's select list: what rows of index schema 1 lack, from what they hold (signature_v1_id
    from a version 1 signature_id; why a dump has no core from its budget and status, withoutcore.OLD_ROWS)."""
    def case(pick: int, otherwise: str) -> str:
        whens = " ".join(f"WHEN {test} THEN {dataset.quote(words[pick - 1])}"
                         for test, *words in withoutcore.OLD_ROWS)
        return f"CASE WHEN has_core THEN NULL {whens} ELSE {dataset.quote(otherwise)} END"
    return ("* REPLACE (coalesce(signature_v1_id, CASE WHEN starts_with(signature_id, "
            f"{dataset.quote(dataset.V1_ID_PREFIX)}) THEN signature_id END) AS signature_v1_id, "
            f"coalesce(no_core_reason, {case(1, withoutcore.UNKNOWN)}) AS no_core_reason, "
            f"coalesce(no_core_why, {case(2, withoutcore.UNKNOWN_WHY)}) AS no_core_why)")


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
        con = dataset.connect()
        con.register("unindexed", dataset.table(self.rows, partitions=True))
        sources = ["SELECT * FROM unindexed"]
        if self.files:
            paths = ", ".join(dataset.quote(str(p)) for p in self.files)
            files = dataset.every_column(con, f"SELECT * FROM read_parquet([{paths}], hive_partitioning = true, "
                                              "union_by_name = true, hive_types = {'dt': VARCHAR})", partitions=True)
            sources.insert(0, f"SELECT {dataset.bounded_columns()} FROM ({files})")
        where = f" WHERE host IN ({', '.join(dataset.quote(h) for h in self.hosts)})" if self.hosts else ""
        con.execute(f"CREATE VIEW dumps AS SELECT {_old_rows_filled()} FROM "
                    f"({' UNION ALL BY NAME '.join(sources)}){where}")
        return con


def collect(client, target: Target, days: list[datetime.date], only_hosts=(), cache: reader.SidecarCache | None = None,
            workers: int = reader.WORKERS) -> View:
    """What the view of those days (and hosts) is made of, fetched from the bucket."""
    db = dataset.connect()  # one for the pass: the files it checks and merges each take a cursor
    try:
        return _collect(client, target, days, only_hosts, cache, workers, db)
    finally:
        db.close()


def _collect(client, target: Target, days: list[datetime.date], only_hosts, cache: reader.SidecarCache | None,
             workers: int, db) -> View:
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
        checked, merge, fallback = {}, {}, []

        def leave_out(key: str, day: datetime.date, host: str | None, problem: str) -> None:
            view.skipped.append(f"s3://{target.bucket}/{key}{problem}" + (
                "; reading the day's parts instead" if host is None else
                f"; reading {host}'s sidecars of the day instead" if (day, host) not in unread else ""))
            if host is None:
                fallback.append(day)
            else:
                unread.add((day, host))

        def merged(day: datetime.date, parts: list) -> Path | None:
            """The day's merged file. Should a part's pages not decode (its footer passed), each part is
            scanned alone, and those that fail are left out as a damaged footer would be."""
            try:
                return _merged(parts_dir, day, parts, db)
            except Exception:  # noqa: BLE001 (which part it was is found below; no part failing re-raises)
                pass
            for (key, etag, host, path), problem in zip(parts, pool.map(lambda p: _problem(p[3], False, db), parts)):
                if problem:
                    checked[key] = (key, etag, dataset.INDEX_SCHEMA, problem)
                    leave_out(key, day, host, problem)
            good = [p for p in parts if (day, p[2]) not in unread]
            return _merged(parts_dir, day, good, db) if good else None

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
                    # A compacted file is read as it is: its pages are decoded here. A host's part is read
                    # through the day's merge, which decodes them: its footer alone here (merged() below).
                    return _problem(local(key, day, host), host is None, db, pages=host is None)
                return problem
            for (key, etag, day, host), problem in zip(items, pool.map(outcome, items)):
                checked[key] = (key, etag, dataset.INDEX_SCHEMA, problem)
                if problem:
                    leave_out(key, day, host, problem)
                elif host is None:
                    view.files.append(local(key, day, host))
                    _prune(_merged_dir(parts_dir, day), None)  # compacted since: its merged file goes
                    for left in dataset.left_out(local(key, day, host)):
                        if not wanted or left in wanted:
                            view.skipped.append(f"s3://{target.bucket}/{key} left out {left}'s index file of the "
                                                f"day (unreadable when it was compacted); reading {left}'s "
                                                "sidecars of the day instead")
                            unread.add((day, left))
                else:
                    merge.setdefault(day, []).append((key, etag, host, local(key, day, host)))
        unread: set[tuple[datetime.date, str]] = set()
        judge(files)
        # A compacted file that is gone or unreadable: the day's parts instead, and the view says so.
        judge([p for day in fallback for p in parts_of[day]])
        # A host's day whose index file cannot be read: that day's sidecars of the host instead (the sidecar is
        # the commit point; the index only a summary of them), its other files left out, not to count a row twice.
        for day, host in unread:
            if day in merge:
                merge[day] = [p for p in merge[day] if p[2] != host]
        view.files += [f for day, parts in sorted(merge.items()) if parts and (f := merged(day, parts))]
        listed += [k for ks in pool.map(lambda dh: reader.list_keys(client, target, target.day_prefix(dh[1], dh[0]),
                                                                    direct=True), sorted(unread)) for k in ks]
    if cache:
        cache.put_parts([c for c in checked.values() if c[1]])
    sidecars, skipped = reader.read_sidecars(client, target, listed, workers, cache)
    view.skipped += skipped
    for sc in sidecars:
        r = dataset.row(sc, sc["_key"])
        day = bucket.crash_day(r["crashed_at"].timestamp() if r["crashed_at"] else 0)
        r.update(dt=f"{day:%Y-%m-%d}", host=sc["host"])
        view.rows.append(r)
    return view


def _problem(path: Path, daily: bool, db, pages: bool = True) -> str:
    """Why a local index file is left out of the view ("" if it is not), as it follows its key: its footer
    checked, and with pages every value decoded."""
    try:
        dataset.check_file(path, host=daily)
        if pages:
            dataset.scan(path, host=daily, db=db)
    except (dataset.NewerSchemaError, dataset.BadIndexFile) as e:
        return f": {e}"
    except Exception as e:  # noqa: BLE001 (a damaged file is named and left out, not fatal)
        return f" is not a Parquet index file: {e}"
    return ""


def _merged(parts_dir: Path, day: datetime.date, parts: list[tuple[str, str, str, Path]], db) -> Path:
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
    dataset.merge([p for _, _, _, p in parts], tmp, db=db)
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
