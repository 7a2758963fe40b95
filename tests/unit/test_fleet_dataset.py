"""The bucket as a dataset (corehandler/fleet/dataset.py, fleetview.py) on moto's S3: each host's Parquet
index files, written without a coordinator, read by a second engine (DuckDB reads what pyarrow wrote), and
the fleet view over them plus the sidecars no index file covers (v1 hosts, a host's day without one)."""

from __future__ import annotations

import datetime
import threading

import pytest

from corehandler.fleet import bucket, dataset, fleetview, reader
from support.fleetrows import DAY, NOW, put_sidecar, sidecar

moto = pytest.importorskip("moto", reason="moto is a test dependency (scripts/pip/test.txt)")
duckdb = pytest.importorskip("duckdb")


def view_rows(client, target, sql=fleetview.LIST_SQL, days=(DAY,), hosts=()):
    view = fleetview.collect(client, target, list(days), hosts)
    try:
        return fleetview.as_dicts(*fleetview.rows(fleetview.link(view.connect()), sql)), view.skipped
    finally:
        view.close()


def test_an_index_row_holds_the_plain_fields_only():
    r = dataset.row(sidecar("alpha", 1), "the/key.json")
    assert r["exe"] == "/usr/bin/crasher" and r["signal"] == 11 and r["top_function"] == "main"
    assert r["exact_key"] == "x1-abcd" and r["has_core"] and r["core_bytes"] == 101
    assert r["crashed_at"] == datetime.datetime.fromtimestamp(NOW + 1, datetime.timezone.utc)
    assert "cmdline" not in r and set(r) == {name for name, _, _ in dataset.COLUMNS}
    # Bytes that are not UTF-8 (a process's own names) cannot go into a Parquet string: escaped, not lost.
    odd = sidecar("alpha", 2)
    odd["index"]["exe"] = "/tmp/caf\udce9"
    assert dataset.row(odd, "k")["exe"] == "/tmp/caf\\udce9"
    dataset.to_parquet([dataset.row(odd, "k")])


def test_each_host_writes_its_own_file_idempotently_and_rolls_over(s3mock, monkeypatch):
    monkeypatch.setattr(dataset, "PART_ROWS", 3)
    target = bucket.Target("fleet-test", "p", "alpha")
    scs = [sidecar("alpha", n) for n in range(5)]
    for sc in scs:
        put_sidecar(s3mock, target, sc)
    put_sidecar(s3mock, target, scs[4])  # a retry after a kill between the index write and `done`
    parts = reader.list_keys(s3mock, target, target.index_prefix("alpha", DAY), ".parquet")
    assert [k.rsplit("/", 1)[1] for k, _ in parts] == ["part-00000.parquet", "part-00001.parquet"]
    rows, skipped = view_rows(s3mock, target)
    assert sorted(r["id"] for r in rows) == sorted(sc["id"] for sc in scs) and skipped == []


def test_a_damaged_last_file_does_not_stop_the_host_writing(s3mock):
    target = bucket.Target("fleet-test", "p", "alpha")
    s3mock.put_object(Bucket="fleet-test", Key=dataset.part_key(target, "alpha", DAY, 0), Body=b"not parquet")
    key = put_sidecar(s3mock, target, sidecar("alpha", 1))
    assert reader.list_keys(s3mock, target, target.index_prefix("alpha", DAY), ".parquet")[-1][0].endswith(
        "part-00001.parquet")
    rows, skipped = view_rows(s3mock, target)
    assert [r["key"] for r in rows] == [key] and len(skipped) == 1 and "part-00000" in skipped[0]


def test_hosts_writing_at_once_need_no_coordinator(s3mock):
    target = bucket.Target("fleet-test", "p", "any")
    hosts = [f"node-{n:02d}" for n in range(12)]

    def one_host(host: str) -> None:
        for n in range(3):
            put_sidecar(s3mock, target, sidecar(host, n))
    threads = [threading.Thread(target=one_host, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    rows, _ = view_rows(s3mock, target, fleetview.GROUP_SQL)
    (group,) = rows
    assert group["count"] == 36 and group["hosts"] == hosts and group["cores"] == 36


def test_duckdb_reads_what_pyarrow_wrote_as_a_hive_table(s3mock, tmp_path):
    """What an engine over the bucket sees (Athena, Trino, Spark or DuckDB): the files as they are, the
    partitions from the path."""
    target = bucket.Target("fleet-test", "p", "alpha")
    for host in ("alpha", "beta"):
        for n in range(3):
            put_sidecar(s3mock, target, sidecar(host, n, signature=f"sig {n % 2}"))
    root = tmp_path / "bucket"
    for key, _ in reader.list_keys(s3mock, target, target.key(bucket.INDEX) + "/", ".parquet"):
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(s3mock.get_object(Bucket="fleet-test", Key=key)["Body"].read())
    con = duckdb.connect()
    got = con.execute(f"SELECT host, dt, signature, count(*) FROM read_parquet('{root}/p/v2/index/*/*/*.parquet', "
                      "hive_partitioning = true) GROUP BY ALL ORDER BY ALL").fetchall()
    assert [(h, str(d), s, c) for h, d, s, c in got] == [
        ("alpha", str(DAY), "sig 0", 2), ("alpha", str(DAY), "sig 1", 1),
        ("beta", str(DAY), "sig 0", 2), ("beta", str(DAY), "sig 1", 1)]
    described = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{root}/p/v2/index/*/*/*.parquet')").fetchall()
    types = {r[0]: r[1] for r in described}
    assert types["crashed_at"] == "TIMESTAMP WITH TIME ZONE" and types["signal"] == "INTEGER"


def test_the_view_adds_sidecars_no_index_covers_and_v1_hosts(s3mock):
    target = bucket.Target("fleet-test", "p", "any")
    indexed = put_sidecar(s3mock, target, sidecar("alpha", 1))
    unindexed = put_sidecar(s3mock, target, sidecar("beta", 2), index=False)  # killed before its index write
    old = put_sidecar(s3mock, target, sidecar("gamma", 3, schema=1), v1=True)  # a corehandler 0.2 host
    rows, skipped = view_rows(s3mock, target)
    assert [(r["host"], r["key"]) for r in rows] == [("alpha", indexed), ("beta", unindexed), ("gamma", old)]
    assert skipped == []
    rows, _ = view_rows(s3mock, target, hosts=("beta",))
    assert [r["host"] for r in rows] == ["beta"]
    rows, _ = view_rows(s3mock, target, days=(DAY - datetime.timedelta(days=1),))
    assert rows == []


def test_an_index_file_of_a_newer_schema_or_not_parquet_is_skipped_and_named(s3mock, monkeypatch):
    """Left out and named, and the host's day read from its sidecars instead (a newer host's sidecars are of a
    schema this one reads)."""
    target = bucket.Target("fleet-test", "p", "alpha")
    put_sidecar(s3mock, target, sidecar("alpha", 1))
    now = dataset.INDEX_SCHEMA
    monkeypatch.setattr(dataset, "INDEX_SCHEMA", now + 1)
    put_sidecar(s3mock, bucket.Target("fleet-test", "p", "beta"), sidecar("beta", 2))
    monkeypatch.setattr(dataset, "INDEX_SCHEMA", now)
    broken = dataset.part_key(target, "delta", DAY, 0)
    s3mock.put_object(Bucket="fleet-test", Key=broken, Body=b"PAR1 not really")
    rows, skipped = view_rows(s3mock, target)
    assert [r["host"] for r in rows] == ["alpha", "beta"]
    assert len(skipped) == 2
    assert any("host=beta" in s and f"index schema {now + 1}" in s and "reading beta's sidecars of the day instead"
               in s for s in skipped)
    assert any(broken in s and "not a Parquet index file" in s for s in skipped)


def test_the_cache_fetches_an_index_file_again_only_when_it_changed(s3mock, s3gets, tmp_path):
    target = bucket.Target("fleet-test", "p", "alpha")
    put_sidecar(s3mock, target, sidecar("alpha", 1))
    gets = s3gets
    cache = reader.SidecarCache(tmp_path / "fleet.sqlite")
    for expect in (1, 0):
        gets.clear()
        fleetview.collect(s3mock, target, [DAY], cache=cache).close()
        assert len(gets) == expect
    put_sidecar(s3mock, target, sidecar("alpha", 2))
    gets.clear()
    view = fleetview.collect(s3mock, target, [DAY], cache=cache)
    assert len(gets) == 1
    assert len(fleetview.rows(view.connect(), fleetview.LIST_SQL)[1]) == 2
    cache.close()


def test_the_documented_schema_is_the_written_one():
    """docs/fleet-query.md is what admins declare their tables from: its table and DDL name every column."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "fleet-query.md").read_text()
    table = [line.split("|")[1:4] for line in doc.splitlines() if line.startswith("| `")]
    assert [(c.strip().strip("`"), t.strip()) for c, t, _ in table] == \
        [(name, kind) for name, kind, _ in dataset.COLUMNS + dataset.PARTITIONS]
    athena = doc[doc.index("CREATE EXTERNAL TABLE"):doc.index("PARTITIONED BY")]
    assert [w.split()[0] for w in athena.split("(", 1)[1].replace("\n", " ").split(",")] == \
        [name for name, _, _ in dataset.COLUMNS]
    assert f"index schema {dataset.INDEX_SCHEMA}" in doc


def test_a_compacted_day_stands_for_its_parts_until_a_late_row(s3mock, tmp_path):
    target = bucket.Target("fleet-test", "p", "any")
    for host in ("alpha", "beta"):
        for n in range(3):
            put_sidecar(s3mock, target, sidecar(host, n))
    key, count, _ = dataset.compact(s3mock, target, DAY)
    assert count == 6 and key == dataset.daily_key(target, DAY, reader.list_keys(
        s3mock, target, target.index_day_prefix(DAY), ".parquet"))
    assert dataset.compact(s3mock, target, DAY) == (key, 6, [])  # twice: the same file, nothing else
    assert [k for k, _ in reader.list_keys(s3mock, target, dataset.daily_prefix(target, DAY), ".parquet")] == [key]
    view = fleetview.collect(s3mock, target, [DAY])
    assert [p.parents[1].name for p in view.files] == [dataset.DAILY]  # the compacted file, none of the parts
    assert len(fleetview.rows(view.connect(), fleetview.LIST_SQL)[1]) == 6
    assert [r[0] for r in fleetview.rows(view.connect(), "SELECT DISTINCT host FROM dumps ORDER BY 1")[1]] == \
        ["alpha", "beta"]
    view.close()
    rows, _ = view_rows(s3mock, target, hosts=("beta",))
    assert {r["host"] for r in rows} == {"beta"} and len(rows) == 3

    # A late upload into that day: the compacted file no longer covers the day's parts, which are read
    # instead...
    put_sidecar(s3mock, target, sidecar("alpha", 9))
    assert [k for k, _ in reader.list_keys(s3mock, target, dataset.daily_prefix(target, DAY), ".parquet")] == [key]
    view = fleetview.collect(s3mock, target, [DAY])
    assert [p.parents[1].name for p in view.files] == [fleetview.MERGED]  # both parts, merged locally
    assert len(fleetview.rows(view.connect(), fleetview.LIST_SQL)[1]) == 7
    view.close()
    # ...until the next compaction.
    new_key, count, _ = dataset.compact(s3mock, target, DAY)
    assert count == 7 and new_key != key
    assert [k for k, _ in reader.list_keys(s3mock, target, dataset.daily_prefix(target, DAY), ".parquet")] == \
        [new_key]


def test_a_compaction_that_a_host_overtakes_leaves_no_stale_file(s3mock, monkeypatch):
    target = bucket.Target("fleet-test", "p", "any")
    put_sidecar(s3mock, target, sidecar("alpha", 1))
    real_put = s3mock.put_object
    overtaken = []

    def put_then_a_host_writes(**kw):
        real_put(**kw)
        if "/daily/" in kw["Key"] and not overtaken:  # the worst moment: right after the compacted file
            overtaken.append(kw["Key"])
            real_put(Bucket="fleet-test", Key=dataset.part_key(target, "beta", DAY, 0),
                     Body=dataset.to_parquet([dataset.row(sidecar("beta", 2), "k")]))
    monkeypatch.setattr(s3mock, "put_object", put_then_a_host_writes)
    key, count, _ = dataset.compact(s3mock, target, DAY)
    assert overtaken and key != overtaken[0] and count == 2  # the stale one deleted, the next attempt whole
    assert [k for k, _ in reader.list_keys(s3mock, target, dataset.daily_prefix(target, DAY), ".parquet")] == [key]


def test_a_cache_of_before_the_checks_were_kept_checks_its_files_again(tmp_path):
    import sqlite3

    db = sqlite3.connect(tmp_path / "fleet.sqlite")
    db.execute("CREATE TABLE parts (key TEXT PRIMARY KEY, etag TEXT NOT NULL)")
    db.execute("INSERT INTO parts VALUES ('k', '\"e\"')")
    db.commit()
    db.close()
    cache = reader.SidecarCache(tmp_path / "fleet.sqlite")
    assert cache.parts(["k"]) == {"k": ('"e"', None, None)}
    cache.put_parts([("k", '"e"', 1, "")])
    assert cache.parts(["k"]) == {"k": ('"e"', 1, "")}
    cache.close()
