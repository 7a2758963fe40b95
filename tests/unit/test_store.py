"""The SQLite index: idempotent ingest, the CLI's filters, deletions that survive a kill, schema guard."""

from __future__ import annotations

import json
import sqlite3

import pytest

from corehandler.store import SCHEMA_VERSION, Filter, Store, StoreError, row_from_record


def _record(n: int, *, pid=None, comm="app", exe="/usr/bin/app", signal=11, ts=None):
    return {"schema": 1, "id": f"17960000000{n:05d}-0123456789abcdef-{pid or n}", "core": "x.core",
            "pid": pid or n, "uid": 1000, "gid": 1000, "signal": signal, "timestamp": ts or 1_700_000_000 + n,
            "comm": comm, "hostname": "h", "boot_id": "0" * 32,
            "proc": {"exe": exe, "cmdline": [exe, f"--n={n}"]}}


def _row(record, status="ok"):
    return row_from_record(record, status=status, problem=None, path=f"{record['id']}.zst", raw_bytes=100,
                           stored_bytes=10, sha256="ab" * 32)


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
    assert (tmp_path / "state/store").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "state/index.sqlite").stat().st_mode & 0o777 == 0o600
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_surrogates_round_trip_in_the_record(store):
    record = _record(1, comm="bad\udcffname", exe="/tmp/\udcfe/x")
    store.insert(_row(record))
    dump = store.get(record["id"])
    assert dump.record["comm"].encode("utf-8", "surrogateescape") == b"bad\xffname"
    assert dump.comm == "bad\\xffname" and dump.exe == "/tmp/\\xfe/x"  # printable columns


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
    assert q(ids=(ids[2][:14],)) == ids  # a prefix shared by all
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
        Store(tmp_path)


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
