"""Metadata-only records stay bounded (issue 20, item 7: 400 crashes with a 64 KiB argv of high bytes made a
286 MB index, a 315 MB user view and 3.3 s per publish, every ingest rewriting the whole view). Retention
keeps a default count of dumps without a core and counts record bytes in max_use; a user's view grows by what
each ingest adds, not by what the user has."""

from __future__ import annotations

import json
import os
import time

import pytest

from corehandler.daemon import Settings
from corehandler.store import retention, userview
from corehandler.store.index import Store
from support.daemon_harness import Running, wait_for

pytestmark = pytest.mark.root  # the views carry POSIX ACLs

USER = 4242  # an ordinary user's uid (no passwd entry needed)
ARGV = ["/usr/bin/hostile", "\udcff" * (64 << 10)]  # 64 KiB of bytes that are not UTF-8: ~400 KiB of JSON


def metadata_only(spool, n: int) -> list[str]:
    ids = []
    for i in range(n):
        dump_id = f"{time.time_ns() // 1000 + i}-{'0' * 16}-{7000 + i}"
        record = {"schema": 1, "id": dump_id, "core": None, "pid": 7000 + i, "tid": 7000 + i, "uid": USER,
                  "gid": USER, "signal": 11, "timestamp": int(time.time()), "dumpable": 1, "hostname": "h",
                  "comm": "hostile", "boot_id": "0" * 32,
                  "proc": {"available": True, "exe": ARGV[0], "comm": "hostile", "cmdline": ARGV,
                           "status": f"Uid:\t{USER}\t{USER}\t{USER}\t{USER}\nGid:\t{USER}\t{USER}\t{USER}\t{USER}\n",
                           "ns": userview.HOST_NAMESPACES},
                  "capture": {"bytes": 0, "complete": False, "truncated": False, "dropped": True,
                              "dropped_reason": "max_pending"},
                  "errors": []}
        (spool / f"{dump_id}.json").write_text(json.dumps(record))
        ids.append(dump_id)
    return ids


def test_many_large_metadata_only_records_keep_the_index_and_the_view_bounded(tmp_path, monkeypatch):
    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True, mode=0o700)
    n, keep = 30, 5
    written = {"whole": 0, "appended": 0}
    whole, append = userview.write_atomic, userview._append

    def counted_whole(path, data, *a, **kw):
        written["whole"] += len(data)
        return whole(path, data, *a, **kw)

    def counted_append(path, data):
        done = append(path, data)
        written["appended"] += len(data) if done else 0
        return done

    monkeypatch.setattr(userview, "write_atomic", counted_whole)
    monkeypatch.setattr(userview, "_append", counted_append)
    policy = retention.Policy(dropped_max_count=keep)
    with Running(Settings(state, threads=1, sweep_interval=0.2, policy=policy, analysis_enabled=False)):
        ids = []
        for _ in range(n // 5):  # in rounds, as crashes come
            ids += metadata_only(state / "spool", 5)
            wait_for(lambda: not [x for x in os.listdir(state / "spool") if x.endswith(".json")], what="ingest")
    with Store(state) as s:
        assert [d.id for d in s.all()] == ids[-keep:]
    view = userview.view_path(state, USER)
    assert [d.id for d in userview.UserView(state, USER).dumps] == ids[-keep:]
    line = max(len(x) for x in view.read_bytes().splitlines())  # a dump's entry in the view
    # At most twice what it holds when written whole, the slack, and one round of appends.
    assert view.stat().st_size < 2 * keep * line + userview.COMPACT_SLACK + 5 * line
    # Each ingest costs about its own entry in view writes (twice, with the compactions), not the user's all.
    assert sum(written.values()) < 3 * n * line, written
    assert userview.acl_readers(view) == [USER]


def test_record_bytes_count_toward_max_use(tmp_path):
    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True, mode=0o700)
    ids = metadata_only(state / "spool", 6)
    with Running(Settings(state, threads=1, sweep_interval=0.2, analysis_enabled=False)):
        wait_for(lambda: not [x for x in os.listdir(state / "spool") if x.endswith(".json")], what="ingest")
    with Store(state) as s:
        size = s.sizes()[0][3]
        assert size >= 6 * (64 << 10)  # a record holds 64 KiB of argv, escaped: no 0-byte dump
        deleted = retention.vacuum(s, retention.Policy(max_use=3 * size))
    assert [d.id for d in deleted] == ids[:3] and {d.rule for d in deleted} == {"max_use"}
