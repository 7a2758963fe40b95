"""MetricsObserver fed with records the real csplice wrote (via the feeder), checked on its exposition."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from corehandler import config, paths, spool
from corehandler.host import overview
from corehandler.observe import metrics, metrics_server
from corehandler.observe.metrics import MetricsObserver
from corehandler.store import analyses
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store
from support.records import RecordMaker

MIB = 1 << 20


def samples(text: str | bytes) -> dict[tuple[str, frozenset], float]:
    if isinstance(text, bytes):
        text = text.decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(exposition: dict, name: str, **labels: str) -> float:
    return exposition.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def maker(feeder, csplice, tmp_path) -> RecordMaker:
    return RecordMaker(feeder, csplice, tmp_path)


@pytest.fixture
def three_dumps(maker) -> list[tuple[dict, dict]]:
    """A complete dump, a truncated one (over max_dump_size) and a dropped one (max_pending reached)."""
    maker.configure(max_dump_size=MIB)
    complete_record = maker.make(3 * MIB // 4, signal=11)
    truncated = maker.make(2 * MIB, signal=6)
    maker.configure(max_pending=2)
    dropped = maker.make(MIB, signal=11)
    records = [complete_record, truncated, dropped]
    assert [r["capture"]["complete"] for r in records] == [True, False, False]
    assert truncated["capture"]["truncated_reason"] == "max_dump_size"
    assert dropped["capture"]["dropped_reason"] == "max_pending"
    return [(r, maker.store_dump(r)) for r in records]


def feed(observer: MetricsObserver, dumps) -> None:
    for record, stored in dumps:
        observer.on_ingested(record, stored)


def test_counts_and_histograms_match_the_records(three_dumps):
    observer = MetricsObserver()
    feed(observer, three_dumps)
    got = samples(observer.exposition())
    (complete, _), (truncated, _), (dropped, _) = three_dumps

    assert value(got, "corehandler_dumps_total", signal="SIGSEGV", outcome="complete", reason="",
                 exe="other") == 1
    assert value(got, "corehandler_dumps_total", signal="SIGABRT", outcome="truncated",
                 reason="max_dump_size", exe="other") == 1
    assert value(got, "corehandler_dumps_total", signal="SIGSEGV", outcome="dropped", reason="max_pending",
                 exe="other") == 1
    records = [r for r, _ in three_dumps]
    assert value(got, "corehandler_raw_bytes_total", exe="other") == sum(r["capture"]["bytes"] for r in records)
    assert value(got, "corehandler_drained_bytes_total") == 2 * MIB - MIB + MIB  # truncated rest + dropped whole

    throughputs = [r["capture"]["throughput_bytes_per_second"] for r in records]
    assert value(got, "corehandler_capture_throughput_bytes_per_second_count") == 3
    assert value(got, "corehandler_capture_throughput_bytes_per_second_sum") == pytest.approx(sum(throughputs))
    for bound in metrics.THROUGHPUT_BUCKETS:
        assert value(got, "corehandler_capture_throughput_bytes_per_second_bucket", le=floatToGoString(bound)) == \
            sum(t <= bound for t in throughputs)
    seconds = [r["capture"]["ns"] / 1e9 for r in records]
    assert value(got, "corehandler_capture_duration_seconds_sum") == pytest.approx(sum(seconds))
    assert value(got, "corehandler_dump_size_bytes_sum") == 3 * MIB // 4 + 2 * MIB + MIB
    assert value(got, "corehandler_hold_duration_seconds_count") == 3

    stored = [s for _, s in three_dumps if s["stored_bytes"]]
    assert len(stored) == 2  # the dropped dump has no core to compress
    assert value(got, "corehandler_compression_ratio_count") == 2
    assert value(got, "corehandler_compression_ratio_sum") == pytest.approx(
        sum(s["raw_bytes"] / s["stored_bytes"] for s in stored))
    assert value(got, "corehandler_compress_duration_seconds_sum") == pytest.approx(
        sum(s["compress_seconds"] for s in stored))
    assert value(got, "corehandler_stored_bytes_total") == sum(s["stored_bytes"] for s in stored)
    assert value(got, "corehandler_ingest_duration_seconds_count") == 3


def test_a_dump_listed_while_compressing_counts_its_stored_figures_once_stored(maker):
    """on_ingested of a `compressing` dump counts the dump, its capture and analysis at once; its stored bytes,
    ratio and compression and ingest times wait for on_stored, and are counted once."""
    record = maker.make(2 * MIB)
    final = maker.store_dump(record)
    listed = dataclasses.replace(final, path=None, stored_bytes=None, compress_seconds=None,
                                 status="compressing")
    observer = MetricsObserver()
    observer.on_ingested(record, listed)
    got = samples(observer.exposition())
    assert value(got, "corehandler_dumps_total", signal="SIGSEGV", outcome="complete", reason="",
                 exe="other") == 1
    assert value(got, "corehandler_hold_duration_seconds_count") == 1
    assert value(got, "corehandler_stored_bytes_total") == 0
    assert value(got, "corehandler_compression_ratio_count") == 0
    assert value(got, "corehandler_ingest_duration_seconds_count") == 0
    observer.on_stored(record, final)
    got = samples(observer.exposition())
    assert value(got, "corehandler_dumps_total", signal="SIGSEGV", outcome="complete", reason="",
                 exe="other") == 1
    assert value(got, "corehandler_stored_bytes_total") == final["stored_bytes"]
    assert value(got, "corehandler_compression_ratio_count") == 1
    assert value(got, "corehandler_compress_duration_seconds_count") == 1
    assert value(got, "corehandler_ingest_duration_seconds_count") == 1


def test_buckets_span_the_sizes_and_speeds_we_promise():
    assert min(metrics.SIZE_BUCKETS) <= MIB and max(metrics.SIZE_BUCKETS) >= 64 << 30
    assert min(metrics.THROUGHPUT_BUCKETS) <= 1e6 and max(metrics.THROUGHPUT_BUCKETS) >= 20e9
    # The quickest capture (1 MB at 20 GB/s) and the slowest (64 GB at 1 MB/s is past the 1 h timeout).
    assert min(metrics.DURATION_BUCKETS) <= 1e6 / 20e9 * 2 and max(metrics.DURATION_BUCKETS) >= 3600


def test_exe_label_only_for_the_allow_list(maker):
    record = maker.make(64 * 1024)
    exe = record["proc"]["exe"]
    assert exe  # the feeder's --pid is this test's own process: a real /proc entry
    for allow, label in ([os.path.basename(exe)], os.path.basename(exe)), ([exe], exe), (["nginx"], "other"):
        observer = MetricsObserver(exe_label_allowlist=allow)
        observer.on_ingested(record, maker.store_dump(record))
        got = samples(observer.exposition())
        assert value(got, "corehandler_dumps_total", signal="SIGSEGV", outcome="complete", reason="",
                     exe=label) == 1


def test_store_series_are_read_from_the_index_at_each_scrape(tmp_path):
    """No event needed: the stored dumps by status, their bytes, the latest crash and the deletions by rule
    since the index was created come from the index as it is when scraped, whichever process wrote it."""
    observer = MetricsObserver(state_dir=tmp_path)
    names = {k[0] for k in samples(observer.exposition())}
    assert not names & {"corehandler_store_dumps", "corehandler_retention_deletions_total"}  # no index yet

    with Store(tmp_path) as store:
        for n, status, stored in ((1, "ok", 10), (2, "truncated", 20), (3, "ok", 30), (4, "dropped", 0),
                                  (5, "compressing", 0)):
            record = {"schema": 1, "id": f"17960000000{n:05d}-0123456789abcdef-{n}", "timestamp": 1_700_000_000 + n}
            store.insert(row_from_record(record, status=status, problem=None, path=f"{record['id']}.zst",
                                         raw_bytes=100, stored_bytes=stored, sha256=None))
        got = samples(observer.exposition())
        assert {dict(k[1])["status"]: v for k, v in got.items() if k[0] == "corehandler_store_dumps"} == {
            "ok": 2, "truncated": 1, "dropped": 1, "invalid": 0, "orphan": 0, "compressing": 1}
        assert value(got, "corehandler_store_bytes") == 60
        assert value(got, "corehandler_last_dump_timestamp_seconds") == 1_700_000_005
        assert not [k for k in got if k[0] == "corehandler_retention_deletions_total"]

        store.delete(store.get(f"17960000000{1:05d}-0123456789abcdef-1"), "max_age")
        store.delete(store.get(f"17960000000{2:05d}-0123456789abcdef-2"), "max_use")
    for scraper in (observer, MetricsObserver(state_dir=tmp_path)):  # the running daemon, and a restarted one
        text = scraper.exposition().decode()
        got = samples(text)
        assert value(got, "corehandler_retention_deletions_total", rule="max_age") == 1
        assert value(got, "corehandler_retention_deletions_total", rule="max_use") == 1
        assert value(got, "corehandler_store_dumps", status="ok") == 1
        assert value(got, "corehandler_store_bytes") == 30
        assert "# TYPE corehandler_retention_deletions_total counter" in text
        assert "# TYPE corehandler_store_dumps gauge" in text


def test_start_time_and_the_newest_signature_for_the_alert_rules(tmp_path):
    """The crash rules need the daemon's start (a series back at 1 after a restart shows no increase);
    CorehandlerNewSignature needs when the newest signature first crashed."""
    before = time.time()
    observer = MetricsObserver(state_dir=tmp_path)
    got = samples(observer.exposition())
    assert before <= value(got, "corehandler_start_time_seconds") <= time.time()
    assert not [k for k in got if k[0] == "corehandler_newest_signature_first_seen_timestamp_seconds"]
    with Store(tmp_path) as store:
        for n, sig in ((1, "s1-aaaa"), (2, "s1-bbbb"), (3, "s1-aaaa")):
            dump_id = f"17960000000{n:05d}-0123456789abcdef-{n}"
            store.insert(row_from_record({"schema": 1, "id": dump_id, "timestamp": 1_700_000_000 + n}, status="ok",
                                         problem=None, path=None, raw_bytes=1, stored_bytes=1, sha256=None))
            analyses.put(store, dump_id, {"state": "ok", "signature_id": sig, "signature": f"app: {sig}"})
    got = samples(observer.exposition())
    # s1-bbbb first crashed at +2; s1-aaaa's newest dump is later (+3), but it was first seen at +1.
    assert value(got, "corehandler_newest_signature_first_seen_timestamp_seconds", signature_id="s1-bbbb",
                 signature="app: s1-bbbb") == 1_700_000_002


def test_counters_start_at_zero(tmp_path):
    got = samples(MetricsObserver().exposition())
    assert value(got, "corehandler_capture_throughput_bytes_per_second_count") == 0
    assert not [k for k in got if k[0] == "corehandler_dumps_total"]


def test_events_never_raise_and_count_observer_errors(maker):
    observer = MetricsObserver()
    # Strange but readable: counted as a dump whose outcome is unknown, not as an error.
    observer.on_ingested({"capture": "not a mapping", "signal": "11"}, {"raw_bytes": "x"})
    observer.on_ingested(None, None)  # type: ignore[arg-type]
    observer.on_state("lots", 0, 0)  # type: ignore[arg-type]
    got = samples(observer.exposition())
    assert value(got, "corehandler_errors_total", kind="observer") == 2
    assert value(got, "corehandler_dumps_total", signal="unknown", outcome="unknown", reason="", exe="other") == 1


def test_errors_by_kind_start_at_zero(tmp_path):
    observer = MetricsObserver()
    got = samples(observer.exposition())
    assert {dict(k[1])["kind"] for k in got if k[0] == "corehandler_errors_total"} == set(metrics.ERROR_KINDS)
    observer.on_error("disk_full", "no space left", None)
    assert value(samples(observer.exposition()), "corehandler_errors_total", kind="disk_full") == 1


def test_state_and_store_gauges(tmp_path):
    (tmp_path / "store").mkdir()
    observer = MetricsObserver(state_dir=tmp_path, store_limit_bytes=lambda: 5000)
    observer.on_state(backlog=4, store_bytes=1234, store_count=7)
    got = samples(observer.exposition())
    assert value(got, "corehandler_ingest_backlog") == 4
    assert value(got, "corehandler_store_limit_bytes") == 5000
    st = os.statvfs(tmp_path / "store")
    assert value(got, "corehandler_store_filesystem_size_bytes") == st.f_blocks * st.f_frsize
    # A probe that fails gives no sample, never a failed scrape.
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "index.sqlite").write_bytes(b"not a database" * 100)
    for state_dir in (tmp_path / "gone", tmp_path / "broken"):
        broken = MetricsObserver(state_dir=state_dir, store_limit_bytes=lambda: 1 // 0)
        names = {k[0] for k in samples(broken.exposition())}
        assert not names & {"corehandler_store_limit_bytes", "corehandler_store_filesystem_size_bytes",
                            "corehandler_store_dumps"}


def test_hold_time_uses_the_capture_end_when_the_record_has_it(maker):
    record = maker.make(64 * 1024)
    started = record["handler"]["started_realtime_ns"]
    record["capture"]["ended_realtime_ns"] = started + 250_000_000
    observer = MetricsObserver()
    observer.on_ingested(record, maker.store_dump(record))
    assert value(samples(observer.exposition()), "corehandler_hold_duration_seconds_sum") == pytest.approx(0.25)


def test_http_server_serves_and_stops(three_dumps):
    observer = MetricsObserver()
    feed(observer, three_dumps)
    host, port = observer.serve("127.0.0.1", 0)
    url = f"http://{host}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    got = samples(body)
    assert value(got, "corehandler_capture_throughput_bytes_per_second_count") == 3
    assert any(name == "process_resident_memory_bytes" for name, _ in got)
    observer.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_idle_connections_cost_no_thread_and_a_scrape_still_answers(three_dumps):
    """300 connections that send nothing, then a few that send half a request: the server's threads stay a
    fixed few, and a scrape made meanwhile is answered at once."""
    observer = MetricsObserver()
    feed(observer, three_dumps)
    host, port = observer.serve("127.0.0.1", 0)
    before = threads()
    idle = []
    try:
        for _ in range(300):
            idle.append(socket.create_connection((host, port), timeout=5))
        for sock in idle[-8:]:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        time.sleep(0.5)
        assert threads() - before <= metrics_server.WORKERS, (before, threads())
        started = time.monotonic()
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            body = response.read()
        assert time.monotonic() - started < 3
        assert value(samples(body), "corehandler_capture_throughput_bytes_per_second_count") == 3
        assert threads() - before <= metrics_server.WORKERS
        # The connections past the cap were closed by the server, oldest first.
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""
    finally:
        for sock in idle:
            sock.close()
        observer.close()


def test_captures_in_progress_past_the_timeout_are_counted(tmp_path):
    """A csplice stuck past [capture] timeout (a FUSE read it cannot leave) keeps its .tmp core locked in the
    spool: such a capture is counted; a young one, or one whose csplice is gone (an orphan), is not."""
    state = tmp_path / "state"
    spool_dir = state / "spool"
    spool_dir.mkdir(parents=True)
    now = time.time()
    ids = {name: f"{int((now - age) * 1e6)}-{'0' * 16}-{pid}"
           for name, age, pid in (("stalled", 7200, 4242), ("young", 10, 4243), ("orphan", 7200, 4244))}
    for dump_id in ids.values():
        (spool_dir / f".tmp.{dump_id}.core").write_bytes(b"\x7fELF")
    # csplice's hold on its file: an flock for the life of the process
    hold = "import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(60)"
    holders = [subprocess.Popen([sys.executable, "-c", hold, str(spool_dir / f".tmp.{ids[name]}.core")])
               for name in ("stalled", "young")]
    cfg = config.Config()
    where = paths.Paths(state_dir=state, config_dir=tmp_path / "etc", run_dir=tmp_path / "run")
    observer = MetricsObserver(capture_probe=lambda: overview.capture_state(cfg, where))
    try:
        wait_until = time.monotonic() + 10
        while len(spool.stalled_captures(spool_dir, cfg.capture.timeout)) < 1 and time.monotonic() < wait_until:
            time.sleep(0.05)
        assert spool.stalled_captures(spool_dir, cfg.capture.timeout) == [ids["stalled"]]
        assert value(samples(generate_latest(observer.registry)), "corehandler_captures_stalled") == 1
        assert spool.stalled_captures(spool_dir, 0) == []  # no timeout: no capture is late
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert value(samples(generate_latest(observer.registry)), "corehandler_captures_stalled") == 0


def test_textfile_is_written_atomically_without_process_metrics(three_dumps, tmp_path):
    path = tmp_path / "textfile" / "corehandler.prom"
    path.parent.mkdir()
    observer = MetricsObserver(textfile=path)
    feed(observer, three_dumps)
    observer.on_state(0, 10, 3)
    first_inode = path.stat().st_ino
    got = samples(path.read_text())
    assert value(got, "corehandler_dumps_total", signal="SIGSEGV", outcome="complete", reason="",
                 exe="other") == 1
    assert not any(name.startswith("process_") for name, _ in got)
    assert path.stat().st_mode & 0o777 == 0o644
    observer.on_state(1, 10, 3)
    # Replaced by rename, never rewritten in place, and no temp file left behind.
    assert path.stat().st_ino != first_inode
    assert value(samples(path.read_text()), "corehandler_ingest_backlog") == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["corehandler.prom"]


def test_real_records_carry_the_release_time(maker):
    """csplice stamps the moment it let the process go, so hold time includes its start-up and metadata reads."""
    from corehandler import fields

    record = maker.make(256 * 1024)
    started, ended = record["handler"]["started_realtime_ns"], record["capture"]["ended_realtime_ns"]
    assert fields.hold_seconds(record) == pytest.approx((ended - started) / 1e9, abs=1e-6)
    assert ended - started >= record["capture"]["ns"]
