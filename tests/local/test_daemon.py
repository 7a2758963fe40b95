"""The daemon on a temporary state dir: records committed by the real csplice (fed by the feeder) are
validated, compressed, indexed and removed from the spool; bad input is kept and flagged; retention and
reload act; observers hear about all of it and cannot break it."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from corehandler.daemon import Settings
from corehandler.observer import Quiet
from corehandler.store import analyses, compress
from corehandler.store.index import Store
from corehandler.store.retention import Policy
from corehandler.testpause import ANALYSIS_ENV
from support.daemon_harness import Recorder, Running, wait_for
from support.spoolfeed import feed, write_settings


@pytest.fixture
def state(tmp_path):
    state_dir = tmp_path / "state"
    (state_dir / "spool").mkdir(parents=True, mode=0o700)
    return state_dir


def sha_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def indexed(state_dir):
    with Store(state_dir) as s:
        return {d.id: d for d in s.all()}


def spool_empty(state_dir):
    return [n for n in os.listdir(state_dir / "spool") if n != ".rate"] == []


def test_ingest_complete_truncated_and_dropped(tmp_path, state, feeder, csplice):
    spool_dir = state / "spool"
    full = write_settings(tmp_path / "full.conf", spool_dir)
    small = write_settings(tmp_path / "small.conf", spool_dir, max_dump_size=65536)
    one = write_settings(tmp_path / "one.conf", spool_dir, max_pending=2)
    ok = feed(feeder, csplice, full, size=3 << 20, pid=101, zero_regions=True)
    raw_sha = sha_of(spool_dir / ok["core"])
    trunc = feed(feeder, csplice, small, size=1 << 20, pid=102)
    meta = feed(feeder, csplice, one, size=1 << 20, pid=103)  # two records pending: kept as metadata only
    assert meta["core"] is None and meta["capture"]["dropped_reason"] == "max_pending"

    rec = Recorder()
    with Running(Settings(state, level=1, threads=1, sweep_interval=3600), [rec]):
        wait_for(lambda: spool_empty(state), what="spool drained")
    rows = indexed(state)
    assert rows[ok["id"]].status == "ok" and rows[ok["id"]].problem is None
    assert rows[ok["id"]].raw_bytes == 3 << 20 and rows[ok["id"]].stored_bytes < 1 << 20
    assert rows[ok["id"]].sha256 == raw_sha
    assert (rows[ok["id"]].pid, rows[ok["id"]].signal, rows[ok["id"]].comm) == (101, 11, "feeder")
    assert rows[trunc["id"]].status == "truncated"
    assert rows[trunc["id"]].problem.startswith("capture truncated: max_dump_size; truncated: 65536 of")
    assert rows[meta["id"]].status == "dropped" and rows[meta["id"]].path is None
    assert rows[meta["id"]].problem == "dump dropped: max_pending"
    # Stored files decompress to what csplice captured.
    out = tmp_path / "out"
    with open(out, "wb") as f:
        compress.decompress_to(state / "store" / rows[ok["id"]].path, f)
    assert sha_of(out) == raw_sha
    # and beside each stored core, its mini core
    assert sorted(os.listdir(state / "store")) == sorted([r.path for r in rows.values() if r.path] +
                                                         [r.mini_path for r in rows.values() if r.mini_path])
    assert {r.mini_path for r in rows.values() if r.path} == {f"{r.id}.mini.core" for r in rows.values() if r.path}

    # Listed first (on_ingested), while the core is compressed; a dump with no core to store is final at once.
    ingested = {e[1]: e[2] for e in rec.of("ingested")}
    assert set(ingested) == set(rows) and len(rec.of("ingested")) == 3
    s = ingested[ok["id"]]
    assert s["status"] == "compressing" and s["raw_bytes"] == 3 << 20 and s["path"] is None
    assert s["stored_bytes"] is None and s["compress_seconds"] is None
    assert s["analysis"]["state"] == "pending"  # listed at once; analysed off the ingest thread
    assert set(s) == {"id", "path", "raw_bytes", "stored_bytes", "compress_seconds", "ingest_seconds",
                      "ingested_at", "status", "problem", "analysis"}
    assert ingested[trunc["id"]]["status"] == "compressing"
    assert ingested[meta["id"]]["status"] == "dropped"
    # Then stored (on_stored), with the final status and the stored file's figures.
    stored = {e[1]: e[2] for e in rec.of("stored")}
    assert set(stored) == {ok["id"], trunc["id"]} and len(rec.of("stored")) == 2
    s = stored[ok["id"]]
    assert s["status"] == "ok" and s["raw_bytes"] == 3 << 20 and s["stored_bytes"] == rows[ok["id"]].stored_bytes
    assert s["path"] == str(state / "store" / rows[ok["id"]].path) and s["ingest_seconds"] >= s["compress_seconds"]
    assert s["analysis"]["state"] not in (None, "pending")  # the final event has the analysis
    assert stored[trunc["id"]]["status"] == "truncated"
    order = [(e[0], e[1]) for e in rec.events if e[0] in ("ingested", "stored")]
    assert order.index(("ingested", ok["id"])) < order.index(("stored", ok["id"]))
    assert rec.of("state")[-1][1:] == (0, sum(r.stored_bytes for r in rows.values()), 3)
    assert rec.of("error") == [] and rec.events[-1] == ("close",)


def test_inotify_picks_up_new_records_without_a_sweep(tmp_path, state, feeder, csplice):
    settings = write_settings(tmp_path / "s.conf", state / "spool")
    with Running(Settings(state, threads=1, sweep_interval=3600)) as d:
        wait_for(lambda: d.store is not None, what="daemon start")
        for pid in (201, 202, 203):
            feed(feeder, csplice, settings, size=256 << 10, pid=pid)
        wait_for(lambda: [r.status for r in indexed(state).values()] == ["ok"] * 3, what="three dumps stored")
    assert sorted(r.pid for r in indexed(state).values()) == [201, 202, 203]
    assert spool_empty(state)


def test_bad_input_is_kept_and_flagged(tmp_path, state, feeder, csplice):
    spool_dir = state / "spool"
    settings = write_settings(tmp_path / "s.conf", spool_dir)
    not_elf = feed(feeder, csplice, settings, size=65536, pid=301)
    (spool_dir / not_elf["core"]).write_bytes(b"this is not an ELF core\n" * 100)
    missing = feed(feeder, csplice, settings, size=65536, pid=302)
    (spool_dir / missing["core"]).unlink()
    garbage = feed(feeder, csplice, settings, size=65536, pid=303)
    (spool_dir / f"{garbage['id']}.json").write_text("{ truncated")
    orphan_id = "1796000000000000-0123456789abcdef-304"
    orphan = spool_dir / f".tmp.{orphan_id}.core"
    orphan.write_bytes((spool_dir / garbage["core"]).read_bytes())
    os.utime(orphan, (time.time() - 60, time.time() - 60))

    rec = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=3600), [rec]):
        wait_for(lambda: spool_empty(state), what="spool drained")
    # A damaged record is data corruption, the kind the errors counter and the alert rules name for it.
    assert [(e[1], e[3]) for e in rec.of("error")] == [("corrupt", garbage["id"])]
    rows = indexed(state)
    assert (rows[not_elf["id"]].status, rows[not_elf["id"]].problem) == ("invalid", "not an ELF file")
    assert rows[not_elf["id"]].raw_bytes == 2400  # kept, though not a core
    assert (rows[missing["id"]].status, rows[missing["id"]].problem) == ("invalid", "core file missing from the spool")
    assert rows[garbage["id"]].status == "ok" and "cannot read record" in rows[garbage["id"]].problem
    assert rows[garbage["id"]].raw_bytes == 65536
    assert rows[orphan_id].status == "orphan" and rows[orphan_id].pid == 304
    assert "csplice did not commit this dump (capture did not finish)" in rows[orphan_id].problem


def test_a_failing_observer_never_stops_ingest(tmp_path, state, feeder, csplice):
    class Broken(Quiet):
        def on_ingested(self, record, stored):
            raise RuntimeError("observer bug")

    rec = Recorder()
    settings = write_settings(tmp_path / "s.conf", state / "spool")
    for pid in (401, 402):
        feed(feeder, csplice, settings, size=65536, pid=pid)
    with Running(Settings(state, threads=1, sweep_interval=3600), [Broken(), rec]) as d:
        wait_for(lambda: spool_empty(state), what="spool drained")
    assert len(indexed(state)) == 2 and len(rec.of("ingested")) == 2
    assert [e[1] for e in rec.of("error")] == ["observer", "observer"]
    assert "observer bug" in rec.of("error")[0][2]
    assert d.observer_failures == 2


def test_retention_after_ingest(tmp_path, state, feeder, csplice):
    settings = write_settings(tmp_path / "s.conf", state / "spool")
    records = [feed(feeder, csplice, settings, size=65536, pid=500 + i) for i in range(4)]
    rec = Recorder()
    policy = Policy(max_count=2, mini=Policy(max_count=1))
    with Running(Settings(state, threads=1, sweep_interval=3600, policy=policy), [rec]):
        wait_for(lambda: spool_empty(state), what="spool drained")
    # max_count took the two oldest full cores; their mini cores stayed, the older of them until mini_max_count
    rows = indexed(state)
    assert sorted(rows) == [r["id"] for r in records[1:]]
    assert [(e[1], e[2]) for e in rec.of("deleted")] == [(records[0]["id"], "max_count"),
                                                        (records[1]["id"], "max_count"),
                                                        (records[0]["id"], "mini_max_count")]
    mini_only = rows[records[1]["id"]]
    assert mini_only.path is None and mini_only.stored_bytes == 0 and mini_only.mini_path
    assert sorted(os.listdir(state / "store")) == sorted([rows[r["id"]].path for r in records[2:]] +
                                                         [rows[r["id"]].mini_path for r in records[1:]])


def test_reload_applies_new_settings_and_survives_a_bad_config(tmp_path, state, feeder, csplice):
    settings = write_settings(tmp_path / "s.conf", state / "spool")
    answers = [Settings(state, compression=False, sweep_interval=3600), ValueError("bad key x in y.toml")]

    def reload():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    rec = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=3600), [rec], reload) as d:
        wait_for(lambda: d.store is not None, what="daemon start")
        d.request_reload()
        wait_for(lambda: not d.settings.compression, what="reload")
        r = feed(feeder, csplice, settings, size=65536, pid=601)
        wait_for(lambda: spool_empty(state), what="spool drained")
        d.request_reload()
        wait_for(lambda: rec.of("error"), what="failed reload reported")
        assert not d.settings.compression
    assert indexed(state)[r["id"]].path == f"{r['id']}.core"  # stored raw, as the new settings say
    assert rec.of("error")[0][1:] == ("config", "Reload failed, keeping the running configuration: "
                                                "bad key x in y.toml", None)


def test_100_records_dropped_at_once(tmp_path, state, feeder, csplice):
    staging = tmp_path / "staging"
    staging.mkdir()
    settings = write_settings(tmp_path / "s.conf", staging)
    records = [feed(feeder, csplice, settings, size=32768, pid=1000 + i) for i in range(100)]
    with Running(Settings(state, threads=1, sweep_interval=3600)) as d:
        wait_for(lambda: d.store is not None, what="daemon start")
        for r in records:  # cores first, then the records: the records' rename is the commit
            os.rename(staging / r["core"], state / "spool" / r["core"])
        for r in records:
            os.rename(staging / f"{r['id']}.json", state / "spool" / f"{r['id']}.json")
        wait_for(lambda: [r.status for r in indexed(state).values()] == ["ok"] * 100, timeout=120,
                 what="100 dumps stored")
    rows = indexed(state)
    assert sorted(rows) == sorted(r["id"] for r in records)
    assert all(r.status == "ok" for r in rows.values())
    assert spool_empty(state) and len(os.listdir(state / "store")) == 200  # each core and its mini core


def test_recovery_finishes_every_half_done_state(tmp_path, state, feeder, csplice):
    """What a kill leaves at each step of ingest and deletion, made by hand, is finished at start."""
    spool_dir, store_dir = state / "spool", state / "store"
    settings = write_settings(tmp_path / "s.conf", spool_dir)
    a, b, c = (feed(feeder, csplice, settings, size=65536, pid=700 + i) for i in range(3))
    store_dir.mkdir(mode=0o700)
    # a: compressed and renamed into the store, not indexed (the raw is still in the spool)
    compress.store_file(spool_dir / a["core"], store_dir, a["id"], threads=1)
    # b: indexed, raw not removed yet
    with Store(state) as s:
        from corehandler.store.dumprow import row_from_record
        stored = compress.store_file(spool_dir / b["core"], store_dir, b["id"], threads=1)
        s.insert(row_from_record(b, status="ok", problem=None, path=stored.path.name, raw_bytes=stored.raw_bytes,
                                 stored_bytes=stored.stored_bytes, sha256=stored.sha256))
        # a retention deletion interrupted after its mark (which holds the rule and the size measured)
        gone = dict(row_from_record(c, status="ok", problem=None, path="gone.zst", raw_bytes=1, stored_bytes=1,
                                    sha256=None), id="1796000000000000-0123456789abcdef-9", deleting=1,
                    deleted_rule="max_use", freed_bytes=4096)
        s.insert(gone)
    # c: a temp file of an interrupted compression; c's record waits in the spool
    (store_dir / f".tmp.{c['id']}.zst").write_bytes(b"partial")
    # a stray store file: no row, no record
    stray = "1796000000000000-0123456789abcdef-8"
    compress.store_file(spool_dir / c["core"], store_dir, stray, threads=1)

    rec = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=3600), [rec]):
        wait_for(lambda: spool_empty(state), what="spool drained")
    rows = indexed(state)
    assert sorted(rows) == sorted([a["id"], b["id"], c["id"], stray])
    # The finished deletion is reported once, as the killed daemon would have, and the index counts it.
    assert rec.of("deleted") == [("deleted", gone["id"], "max_use", 4096)]
    with Store(state) as s:
        assert s.get(gone["id"]) is None and s.deletions() == {"max_use": (1, 4096)}
    assert rows[stray].status == "orphan" and rows[stray].raw_bytes == 65536
    assert sorted(os.listdir(store_dir)) == sorted([r.path for r in rows.values()] +
                                                   [r.mini_path for r in rows.values() if r.mini_path])
    for r in rows.values():
        compress.verify(store_dir / r.path, r.raw_bytes, r.sha256)


def test_recovery_finishes_every_state_of_a_dump_listed_before_it_was_stored(tmp_path, state, feeder, csplice):
    """Rows left `compressing` by a kill, made by hand: with the raw core alone (compressed again), with its
    stored file complete in place (verified and kept), with a damaged one in place (stored again), with a temp
    file, and with the record gone too (finished from the row). Each ends `ok` with a file that decompresses to
    the captured bytes, announced stored once and not listed again (the killed daemon did that)."""
    from corehandler.store.dumprow import row_from_record

    spool_dir, store_dir = state / "spool", state / "store"
    settings = write_settings(tmp_path / "s.conf", spool_dir)
    raw_alone, in_place, damaged, temp, no_record = (
        feed(feeder, csplice, settings, size=65536, pid=800 + i) for i in range(5))
    shas = {r["id"]: sha_of(spool_dir / r["core"]) for r in (raw_alone, in_place, damaged, temp, no_record)}
    store_dir.mkdir(mode=0o700)
    with Store(state) as s:
        for r in shas:
            s.insert(row_from_record(next(x for x in (raw_alone, in_place, damaged, temp, no_record) if x["id"] == r),
                                     status="compressing", problem=None, path=None, raw_bytes=65536, stored_bytes=0,
                                     sha256=None))
    kept = compress.store_file(spool_dir / in_place["core"], store_dir, in_place["id"], threads=1)
    kept_inode = kept.path.stat().st_ino
    bad = compress.store_file(spool_dir / damaged["core"], store_dir, damaged["id"], threads=1)
    bad.path.write_bytes(bad.path.read_bytes()[:-9])
    (store_dir / f".tmp.{temp['id']}.zst").write_bytes(b"partial")
    (spool_dir / f"{no_record['id']}.json").unlink()

    rec = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=3600), [rec]):
        wait_for(lambda: spool_empty(state) and len(rec.of("stored")) == 5, what="every dump stored")
    rows = indexed(state)
    assert sorted(rows) == sorted(shas)
    for r in rows.values():
        assert r.status == "ok" and r.sha256 == shas[r.id] and r.stored_bytes == (store_dir / r.path).stat().st_size
        compress.verify(store_dir / r.path, r.raw_bytes, r.sha256)
    assert sorted(os.listdir(store_dir)) == sorted([r.path for r in rows.values()] +
                                                   [r.mini_path for r in rows.values() if r.mini_path])
    assert (store_dir / rows[in_place["id"]].path).stat().st_ino == kept_inode  # kept, not written again
    assert sorted(e[1] for e in rec.of("stored")) == sorted(shas) and rec.of("ingested") == []
    assert [(e[1], e[3]) for e in rec.of("error")] == [("corrupt", damaged["id"])]


def test_retention_timer_applies_a_reloaded_policy(tmp_path, state, feeder, csplice):
    """No ingest after the reload: only the timer can delete, with the reloaded interval and policy. The
    dumps are young at the reload and pass max_age seconds later."""
    settings = write_settings(tmp_path / "s.conf", state / "spool")
    for i in range(2):
        feed(feeder, csplice, settings, size=65536, pid=800 + i)
    rec = Recorder()
    tighter = Settings(state, threads=1, sweep_interval=3600, retention_interval=0.2,
                       policy=Policy(max_age=6, mini=Policy(max_age=6)))
    with Running(Settings(state, threads=1, sweep_interval=3600), [rec], lambda: tighter) as d:
        wait_for(lambda: spool_empty(state) and len(rec.of("ingested")) == 2, what="spool drained")
        d.request_reload()
        wait_for(lambda: d.settings is tighter, what="reload")
        assert rec.of("deleted") == [] and len(indexed(state)) == 2
        wait_for(lambda: len(rec.of("deleted")) == 4, what="retention by the timer")
    # each full core, then its mini core
    assert sorted(e[2] for e in rec.of("deleted")) == ["max_age", "max_age", "mini_max_age", "mini_max_age"]
    assert indexed(state) == {}


def test_a_dump_waits_for_its_analysis_with_its_raw_core_kept(tmp_path, state, feeder, csplice, monkeypatch):
    """The analysis reads the full raw core: a dump stored while its analysis is held (the test-only pause
    of the analysis workers) keeps its raw core and record in the spool and its row `compressing`; the daemon
    stops at once all the same, and the next start analyses it and finishes the dump."""
    monkeypatch.setenv(ANALYSIS_ENV, "analysing")
    r = feed(feeder, csplice, write_settings(tmp_path / "s.conf", state / "spool"), size=1 << 20, pid=601)
    rec = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=0.1), [rec]):
        wait_for(lambda: (state / "store" / f"{r['id']}.zst").exists(), what="the core stored")
        time.sleep(0.3)  # sweeps come and go: none finishes the dump before its analysis
        assert indexed(state)[r["id"]].status == "compressing" and rec.of("stored") == []
        assert (state / "spool" / r["core"]).exists() and (state / "spool" / f"{r['id']}.json").exists()
        with Store(state, readonly=True) as s:
            assert analyses.analysis_for(s, r["id"])["state"] == analyses.PENDING
    monkeypatch.delenv(ANALYSIS_ENV)
    with Running(Settings(state, threads=1, sweep_interval=3600), [rec]):
        wait_for(lambda: spool_empty(state), what="spool drained")
    row = indexed(state)[r["id"]]
    assert row.status == "ok" and row.mini_path == f"{r['id']}.mini.core"
    with Store(state, readonly=True) as s:
        assert analyses.analysis_for(s, r["id"])["state"] != analyses.PENDING
    assert [e[1] for e in rec.of("stored")] == [r["id"]]
