"""The SQLite index: idempotent ingest, the CLI's filters, deletions that survive a kill, schema guard."""

from __future__ import annotations

import json
import sqlite3

import pytest

from corehandler.errors import UsageError
from corehandler.paths import DIR_MODES
from corehandler.store.index import SCHEMA_VERSION, UNKNOWN_RULE, Store, StoreError
from corehandler.store.match import Filter
from support.indexrows import SCHEMA_1, SCHEMA_2_TOMBSTONES
from support.indexrows import record as _record
from support.indexrows import row as _row


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "state") as s:
        yield s


def test_insert_is_idempotent(store):
    row = _row(_record(1))
    assert store.insert(row) is True
    assert store.insert(dict(row, status="invalid")) is False
    [dump] = store.all()
    assert dump.status == "ok" and dump.cmdline == ["/usr/bin/app", "--n=1"]
    assert store.totals() == (10, 1)


def test_files_and_modes(tmp_path, store):
    assert (tmp_path / "state/store").stat().st_mode & 0o777 == DIR_MODES["store"]
    assert (tmp_path / "state/index.sqlite").stat().st_mode & 0o777 == 0o600
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_surrogates_round_trip_in_the_record(store):
    record = _record(1, comm="bad\udcffname", exe="/tmp/\udcfe/x")
    store.insert(_row(record))
    dump = store.get(record["id"])
    assert dump.record["comm"].encode("utf-8", "surrogateescape") == b"bad\xffname"
    # The dump's names are the process's bytes too (the index columns hold display forms for SQL only).
    assert dump.comm.encode("utf-8", "surrogateescape") == b"bad\xffname"
    assert dump.exe.encode("utf-8", "surrogateescape") == b"/tmp/\xfe/x"
    # A name literally spelled with a backslash is another name, and matches only itself.
    twin = _record(2, comm="bad\\xffname")
    store.insert(_row(twin))
    assert [d.id for d in store.query(Filter(comms=("bad\udcffname",)))] == [record["id"]]
    assert [d.id for d in store.query(Filter(comms=("bad\\xffname",)))] == [twin["id"]]


def test_query_filters(store):
    records = [_record(1, comm="a", exe="/bin/a"), _record(2, comm="b", exe="/bin/b", signal=6),
               _record(3, comm="a", exe="/bin/a"), _record(4, pid=999, comm="c", exe="/bin/c")]
    for r in records:
        store.insert(_row(r))
    ids = [r["id"] for r in records]

    def q(**kw):
        return [d.id for d in store.query(Filter(**kw))]

    assert q() == ids
    assert q(comms=("a",)) == [ids[0], ids[2]]
    assert q(exes=("/bin/b", "/bin/c")) == [ids[1], ids[3]]
    assert q(pids=(999,)) == [ids[3]]
    assert q(signal=6) == [ids[1]]
    assert q(since=1_700_000_002, until=1_700_000_003) == [ids[1], ids[2]]
    assert q(last=1) == [ids[3]] and q(last=2, comms=("a",)) == [ids[0], ids[2]]
    with pytest.raises(UsageError, match="ambiguous: 4 dumps"):
        q(ids=(ids[2][:14],))  # a prefix shared by all names no one dump
    assert q(ids=(ids[2][:-1],)) == [ids[2]]  # a unique prefix
    assert q(ids=(ids[2],)) == [ids[2]]
    assert q(comms=("a",), pids=(3,)) == [ids[2]]
    assert q(comms=("zzz",)) == []


def test_delete_survives_a_kill_between_file_and_row(store):
    record = _record(1)
    store.insert(_row(record))
    path = store.store_dir / f"{record['id']}.zst"
    path.write_bytes(b"x" * 4096)
    dump = store.get(record["id"])
    # What a kill after the mark and the unlink leaves: a row marked deleting, no file.
    store.db.execute("UPDATE dumps SET deleting = 1 WHERE id = ?", (dump.id,))
    store.db.commit()
    path.unlink()
    assert store.all() == [] and store.query() == []
    assert [d.id for d in store.finish_deletions()] == [dump.id]
    assert store.all(include_deleting=True) == []
    store.insert(_row(_record(2)))
    path2 = store.store_dir / f"{_record(2)['id']}.zst"
    path2.write_bytes(b"y" * 8192)
    assert store.delete(store.get(_record(2)["id"]), "max_count") >= 8192
    assert not path2.exists() and store.all() == []


def test_unindexed_and_temp_files(store):
    store.insert(_row(_record(1)))
    (store.store_dir / f"{_record(1)['id']}.zst").write_bytes(b"x")
    (store.store_dir / "stray.zst").write_bytes(b"x")
    (store.store_dir / ".tmp.a.zst").write_bytes(b"x")
    assert [p.name for p in store.unindexed_files()] == ["stray.zst"]
    assert [p.name for p in store.temp_files()] == [".tmp.a.zst"]


def test_newer_schema_is_refused(tmp_path):
    Store(tmp_path).close()
    db = sqlite3.connect(tmp_path / "index.sqlite")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer than this corehandler"):
        Store(tmp_path, migrate=True)


def test_readonly_open_of_missing_index(tmp_path):
    with pytest.raises(StoreError, match="no index"):
        Store(tmp_path, readonly=True)


def test_record_json_is_ascii(store):
    record = _record(1, comm="\udcff")
    row = _row(record)
    assert row["record"].isascii() and json.loads(row["record"])["comm"] == "\udcff"


@pytest.mark.parametrize("readonly", [False, True])
def test_a_damaged_index_is_one_clear_error(tmp_path, readonly):
    (tmp_path / "index.sqlite").write_bytes(b"this is not a database, just some text" * 100)
    with pytest.raises(StoreError, match="cannot open the index .*index.sqlite: file is not a database"):
        Store(tmp_path, readonly=readonly)


def test_delete_removes_the_row_and_counts_it_under_its_rule(store):
    for n in (1, 2, 3):
        store.insert(_row(_record(n)))
        (store.store_dir / f"{_record(n)['id']}.zst").write_bytes(b"x" * 4096)
    gone = _record(1)
    freed = store.delete(store.get(gone["id"]), "max_age")
    assert freed >= 4096 and not (store.store_dir / f"{gone['id']}.zst").exists()
    assert store.get(gone["id"]) is None  # nothing of the dump is kept: not its record, not its cmdline

    live = [_record(2)["id"], _record(3)["id"]]
    assert [d.id for d in store.query()] == live and store.query(Filter(ids=(gone["id"],))) == []
    assert [d.id for d in store.all()] == live and [d.id for d in store.all(include_deleting=True)] == live
    assert [r[0] for r in store.sizes()] == live
    assert store.totals() == (20, 2) and store.by_status() == {"ok": (2, 20)}
    assert store.unindexed_files() == []
    assert store.deletions() == {"max_age": (1, freed)}

    second = store.delete(store.get(_record(2)["id"]), "max_age")
    store.delete(store.get(_record(3)["id"]), "max_count")
    assert store.deletions() == {"max_age": (2, freed + second), "max_count": (1, 4096)}
    assert store.totals() == (0, 0) and store.latest_crash() is None
    assert store.finish_deletions() == []


def test_a_kill_after_the_mark_completes_with_the_marked_rule_and_size(store):
    record = _record(1)
    store.insert(_row(record))
    path = store.store_dir / f"{record['id']}.zst"
    path.write_bytes(b"x" * 8192)
    # delete()'s first step, then a kill: the row carries the rule and the size measured before the unlink.
    store.db.execute("UPDATE dumps SET deleting = 1, deleted_rule = 'max_use', freed_bytes = ? WHERE id = ?",
                     (path.stat().st_blocks * 512, record["id"]))
    store.db.commit()
    path.unlink()
    (done,) = store.finish_deletions()
    assert (done.id, done.deleted_rule, done.freed_bytes) == (record["id"], "max_use", 8192)
    assert store.finish_deletions() == [] and store.all(include_deleting=True) == []
    assert store.deletions() == {"max_use": (1, 8192)}


def test_a_schema_1_index_is_migrated_in_place(tmp_path):
    """What corehandler wrote before schema 2: one live row and one deletion a kill interrupted."""
    (tmp_path / "store").mkdir()
    db = sqlite3.connect(tmp_path / "index.sqlite")
    db.executescript(SCHEMA_1)
    odd = _record(3, comm="bad\udcffname")
    for record, deleting in ((_record(1), 0), (_record(2), 1), (odd, 0)):
        row = dict(_row(record), deleting=deleting)
        del row["compress_seconds"], row["ingest_seconds"]  # not in schema 1
        if record is odd:
            row["comm"] = "bad\\xffname"  # v0.1's display form: the bytes are only in the record
        db.execute(f"INSERT INTO dumps ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    db.commit()
    db.close()
    (tmp_path / "store" / f"{_record(2)['id']}.zst").write_bytes(b"x" * 4096)

    with Store(tmp_path, migrate=True) as s:
        assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [d.id for d in s.query()] == [_record(1)["id"], odd["id"]]
        assert len(s.all(include_deleting=True)) == 3 and s.deletions() == {}
        # v0.1's rows: found by the name's real bytes, not marked corrupt
        [found] = s.query(Filter(comms=("bad\udcffname",)))
        assert found.id == odd["id"] and found.corrupt is None and s.query(Filter(comms=("bad\\xffname",))) == []
    with Store(tmp_path) as s:
        (done,) = s.finish_deletions()  # schema 1 marked no rule and measured nothing: done now
        assert (done.deleted_rule, done.freed_bytes) == (UNKNOWN_RULE, 4096)
        assert s.get(_record(1)["id"]).record == _record(1)
        assert s.deletions() == {UNKNOWN_RULE: (1, 4096)}


def test_a_schema_6_index_loses_the_container_configs_v02_copied(tmp_path):
    """v0.2's records held a container's whole config.json (process.env: secrets) in proc.oci_config."""
    with Store(tmp_path) as s:
        for n, proc in ((1, {"oci_config": '{"process": {"env": ["K=secret"]}}', "comm": "a\udcff"}),
                        (2, {"comm": "b"})):
            record = _record(n)
            record["proc"] = proc
            row = _row(record)
            s.db.execute(f"INSERT INTO dumps ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                         list(row.values()))
        s.db.execute("PRAGMA user_version=6")
        s.db.commit()
    with Store(tmp_path, migrate=True) as s:
        assert [d.record["proc"] for d in s.all()] == [{"comm": "a\udcff"}, {"comm": "b"}]


def test_a_schema_2_index_turns_its_tombstones_into_counts(tmp_path):
    """v0.1 kept a tombstone row per deleted dump, for the metrics to replay: the migration counts them per rule
    and drops them with their column; live rows and a deletion under way stay as they were."""
    (tmp_path / "store").mkdir()
    db = sqlite3.connect(tmp_path / "index.sqlite")
    db.executescript(SCHEMA_1.replace("record TEXT NOT NULL);", "record TEXT NOT NULL" + SCHEMA_2_TOMBSTONES)
                     .replace("user_version=1", "user_version=2"))
    rows = [(1, None, None, None, 0), (2, 1.0, "max_age", 4096, 0), (3, 2.0, "max_age", 8192, 0),
            (4, 3.0, None, 512, 0), (5, None, "max_use", 100, 1)]
    for n, deleted_at, rule, freed, deleting in rows:
        row = dict(_row(_record(n)), deleted_at=deleted_at, deleted_rule=rule, freed_bytes=freed, deleting=deleting)
        db.execute(f"INSERT INTO dumps ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    db.commit()
    db.close()

    with Store(tmp_path, migrate=True) as s:
        assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert "deleted_at" not in {r[1] for r in s.db.execute("PRAGMA table_info(dumps)")}
        assert s.deletions() == {"max_age": (2, 4096 + 8192), UNKNOWN_RULE: (1, 512)}
        assert [d.id for d in s.all(include_deleting=True)] == [_record(1)["id"], _record(5)["id"]]
        assert s.get(_record(1)["id"]).record == _record(1)
    with Store(tmp_path) as s:
        (done,) = s.finish_deletions()
        assert (done.id, done.deleted_rule, done.freed_bytes) == (_record(5)["id"], "max_use", 100)
        assert s.deletions()["max_use"] == (1, 100)


def test_a_dump_another_process_is_deleting_is_left_to_it(store):
    """The daemon's retention and `corehandler vacuum` may pick the same dump: the second deleter must not
    overwrite the first one's rule and size (what the deletion counts) nor count the deletion again."""
    record = _record(1)
    store.insert(_row(record))
    path = store.store_dir / f"{record['id']}.zst"
    path.write_bytes(b"x" * 8192)
    with Store(store.state_dir) as other:
        dump = other.get(record["id"])
        store.db.execute("UPDATE dumps SET deleting = 1, deleted_rule = 'max_use', freed_bytes = 8192 "
                         "WHERE id = ?", (record["id"],))
        store.db.commit()
        assert other.delete(dump, "max_count") is None
    assert path.exists()
    (done,) = store.finish_deletions()
    assert (done.deleted_rule, done.freed_bytes) == ("max_use", 8192)
    assert store.deletions() == {"max_use": (1, 8192)}


def _v1_analysis(variant: str, offset: int) -> dict:
    """An analysis as a schema-11 daemon (signature v1) stored it, of a strlen(NULL) crash on a CPU whose libc
    picked `variant`."""
    from corehandler.analysis import signature
    frames = [{"index": 0, "pc": 0x7f0000000000 + offset, "function": variant,
               "module": "/usr/lib/x86_64-linux-gnu/libc.so.6", "build_id": "cc", "offset": offset},
              {"index": 1, "pc": 0x5555_5555_5189, "function": "count_name", "module": "/usr/bin/app",
               "build_id": "aa", "offset": 0x1189},
              {"index": 2, "pc": 0x5555_5555_51d0, "function": "main", "module": "/usr/bin/app", "build_id": "aa",
               "offset": 0x11d0}]
    text = signature.signature("/usr/bin/app", "SIGSEGV", frames, 1)
    return {"state": "ok", "threads": [{"tid": 1, "crashing": True, "frames": frames}],
            "exe": {"path": "/usr/bin/app", "build_id": "aa"}, "signature": text,
            "signature_id": signature.signature_id(text, 1), "signature_version": 1,
            "exact_key": f"x1-{offset:032x}", "exact_version": 1}


def test_a_schema_11_index_gets_signature_v2_with_the_v1_ids_kept(tmp_path):
    """Three dumps of one bug on three CPUs, analysed by a v1 daemon: three groups before the upgrade, one
    after the daemon's migration, each analysis keeping its v1 id (what the fleet's older hosts still send), the
    exact keys as they were; `--signature` finds them by either id, and their group lists the v1 ids it links."""
    from corehandler.cli import crashview
    from corehandler.store import analyses
    with Store(tmp_path) as s:
        s.db.execute("DROP INDEX analysis_signature_v1")
        s.db.execute("ALTER TABLE analysis DROP COLUMN signature_v1_id")
        olds = {}
        for n, (variant, offset) in enumerate((("__strlen_evex", 0x1a1a5d), ("__strlen_avx2", 0x19e6bd),
                                               ("__strlen_sse2", 0xa0b65)), 1):
            record = _record(n)
            s.insert(_row(record))
            values = analyses.row(record["id"], _v1_analysis(variant, offset))
            del values["signature_v1_id"]
            s.db.execute(f"INSERT INTO analysis ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                         list(values.values()))
            olds[record["id"]] = values
        s.db.execute("PRAGMA user_version=11")
        s.db.commit()
    with Store(tmp_path, migrate=True):  # what the daemon does at start
        pass
    with Store(tmp_path, readonly=True) as s:
        rows = s.analysis_summaries(olds)
        assert {r["signature"] for r in rows.values()} == {"app SIGSEGV strlen | count_name < main"}
        assert {r["signature_version"] for r in rows.values()} == {2}
        assert {i: r["signature_v1_id"] for i, r in rows.items()} == {i: v["signature_id"] for i, v in olds.items()}
        assert {i: r["exact_key"] for i, r in rows.items()} == {i: v["exact_key"] for i, v in olds.items()}
        result = s.analysis_for(_record(1)["id"])
        assert result["signature_id"] == rows[_record(1)["id"]]["signature_id"]
        assert result["signature_v1_id"] == olds[_record(1)["id"]]["signature_id"]
        [group] = crashview.groups(s.all(), rows)
        assert group["count"] == 3 and sorted(group["signature_v1_ids"]) == sorted(v["signature_id"]
                                                                                   for v in olds.values())
        old_id = olds[_record(2)["id"]]["signature_id"]
        args = type("Args", (), {"signature": old_id, "unit": None, "container": None, "pod": None})()
        assert [d.id for d in crashview.apply_filters(args, s, s.all(), None)] == [_record(2)["id"]]


def test_a_v2_signature_is_as_old_as_the_v1_group_it_links(store):
    """Two dumps of one v1 signature that v2 splits (its prefix rule reads deeper): the second v2 group is not a
    new kind of crash, as its v1 id was seen with the first dump."""
    from corehandler.store import analyses
    for n, sig in ((1, "s2-aaaa"), (2, "s2-bbbb")):
        record = _record(n, ts=1_700_000_000 + n * 1000)
        store.insert(_row(record))
        analyses.put(store, record["id"], {"state": "ok", "signature": sig, "signature_id": sig,
                                           "signature_version": 2, "signature_v1_id": "s1-same"})
    assert analyses.newest_signature(store)[2] == 1_700_001_000
    record = _record(3, ts=1_700_003_000)
    store.insert(_row(record))
    analyses.put(store, record["id"], {"state": "ok", "signature": "s2-cccc", "signature_id": "s2-cccc",
                                       "signature_version": 2, "signature_v1_id": "s1-other"})
    assert analyses.newest_signature(store)[:3] == ("s2-cccc", "s2-cccc", 1_700_003_000)
