"""Reading csplice's spool: committed records in order, the lock protocol for orphans, cleanup."""

from __future__ import annotations

import fcntl
import os
import time

import pytest

from corehandler import spool
from support.spoolfeed import feed, write_settings

ID = "1796000000000000-0123456789abcdef-77"


@pytest.fixture
def spool_dir(tmp_path):
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    return d


def test_committed_records_in_order_and_parsed(tmp_path, spool_dir, feeder, csplice):
    settings = write_settings(tmp_path / "s.conf", spool_dir)
    records = [feed(feeder, csplice, settings, size=8192, pid=100 + i, comm=f"app{i}") for i in range(3)]
    (spool_dir / ".tmp.x.json").write_text("{}")  # never a committed record
    (spool_dir / "notanid.json").write_text("{}")
    assert spool.committed_ids(spool_dir) == [r["id"] for r in records]
    for r in records:
        got = spool.read_record(spool_dir, r["id"])
        assert got["pid"] == r["pid"] and got["capture"]["complete"] is True


def test_record_strings_keep_raw_bytes(tmp_path, spool_dir, feeder, csplice):
    settings = write_settings(tmp_path / "s.conf", spool_dir)
    record = feed(feeder, csplice, settings, size=8192, comm="bad\udcffname")  # argv bytes b"bad\xffname"
    got = spool.read_record(spool_dir, record["id"])
    assert got["comm"].encode("utf-8", "surrogateescape") == b"bad\xffname"


@pytest.mark.parametrize("content,message", [
    (b"{not json", "cannot read record"),
    (b"[]", "not a JSON object"),
    (b'{"schema": 2, "id": "%s"}' % ID.encode(), "has schema 2"),
    (b'{"schema": 1, "id": "other"}', "names id 'other'"),
])
def test_bad_records_raise(spool_dir, content, message):
    (spool_dir / f"{ID}.json").write_bytes(content)
    with pytest.raises(spool.SpoolRecordError, match=message):
        spool.read_record(spool_dir, ID)


def _age(path, seconds=60):
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_orphans_follow_the_lock_protocol(spool_dir):
    names = {
        "locked_tmp": f".tmp.{ID}1.core", "unlocked_tmp": f".tmp.{ID}2.core",
        "young_tmp": f".tmp.{ID}3.core", "core_no_json": f"{ID}4.core", "committed": f"{ID}5.core",
        "locked_core": f"{ID}6.core",
    }
    for name in names.values():
        (spool_dir / name).write_bytes(b"\x7fELF")
        if name != names["young_tmp"]:
            _age(spool_dir / name)
    (spool_dir / f"{ID}5.json").write_text("{}")
    held = [os.open(spool_dir / names[k], os.O_RDONLY) for k in ("locked_tmp", "locked_core")]
    for fd in held:
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        orphans = spool.find_orphans(spool_dir)
    finally:
        for fd in held:
            os.close(fd)
    assert sorted((o.id, o.core.name) for o in orphans) == [(f"{ID}2", names["unlocked_tmp"]),
                                                            (f"{ID}4", names["core_no_json"])]


def test_adopted_orphan_becomes_a_committed_record(spool_dir):
    tmp = spool_dir / f".tmp.{ID}.core"
    tmp.write_bytes(b"\x7fELF" + bytes(100))
    _age(tmp)
    [orphan] = spool.find_orphans(spool_dir)
    record = spool.adopt_orphan(spool_dir, orphan)
    assert not tmp.exists() and (spool_dir / f"{ID}.core").stat().st_size == 104
    assert spool.committed_ids(spool_dir) == [ID]
    assert spool.read_record(spool_dir, ID) == record
    assert record["orphan"] is True and record["pid"] == 77 and record["timestamp"] == 1796000000
    assert spool.find_orphans(spool_dir) == []


def test_remove_record(spool_dir):
    for suffix in (".core", ".json"):
        (spool_dir / f"{ID}{suffix}").write_text("x")
    spool.remove_record(spool_dir, ID)
    assert os.listdir(spool_dir) == []
    spool.remove_record(spool_dir, ID)  # idempotent


def test_stale_tmp_json_cleanup(spool_dir):
    old, new = spool_dir / f".tmp.{ID}.json", spool_dir / f".tmp.{ID}9.json"
    old.write_text("{")
    new.write_text("{")
    _age(old, 3600)
    assert spool.clean_stale_tmp(spool_dir) == [old]
    assert new.exists()


def test_rate_cleanup_keeps_current_and_locked_counters(spool_dir):
    rate = spool_dir / ".rate"
    rate.mkdir()
    now = int(time.time())
    (rate / "old").write_text(f"{now - 61} 3\n")
    (rate / "current").write_text(f"{now - 10} 1\n")
    (rate / "oldlocked").write_text(f"{now - 600} 2\n")
    fd = os.open(rate / "oldlocked", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert spool.clean_rate(spool_dir, now) == 1
    finally:
        os.close(fd)
    assert sorted(os.listdir(rate)) == ["current", "oldlocked"]
