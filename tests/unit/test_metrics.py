"""MetricsObserver fed with records the real csplice wrote (via the feeder), checked on its exposition."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from corehandler import metrics
from corehandler.metrics import MetricsObserver
from corehandler.store import Store, row_from_record
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
    assert value(got, "corehandler_captured_bytes_total", exe="other") == sum(r["capture"]["bytes"] for r in records)
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
    assert value(got, "corehandler_last_dump_timestamp_seconds") == max(r["timestamp"] for r in records)

    stored = [s for _, s in three_dumps if s["compressed_bytes"]]
    assert len(stored) == 2  # the dropped dump has no core to compress
    assert value(got, "corehandler_compression_ratio_count") == 2
    assert value(got, "corehandler_compression_ratio_sum") == pytest.approx(
        sum(s["raw_bytes"] / s["compressed_bytes"] for s in stored))
    assert value(got, "corehandler_compress_duration_seconds_sum") == pytest.approx(
        sum(s["compress_seconds"] for s in stored))
    assert value(got, "corehandler_compressed_bytes_total") == sum(s["compressed_bytes"] for s in stored)
    assert value(got, "corehandler_ingest_duration_seconds_count") == 3


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


def test_seeding_from_the_index_continues_the_counters(three_dumps):
    live = MetricsObserver()
    feed(live, three_dumps)
    live.on_deleted(three_dumps[0][0]["id"], None, "max_age", three_dumps[0][1]["compressed_bytes"])

    # The index as the daemon would hand it over: record JSON text, stored figures as columns, a tombstone.
    rows = []
    for i, (record, stored) in enumerate(three_dumps):
        row = dict(stored, record=json.dumps(record))
        if i == 0:
            row.update(deleted_rule="max_age", freed_bytes=stored["compressed_bytes"])
        rows.append(row)
    restarted = MetricsObserver()
    assert restarted.seed(rows) == 3

    def counters(observer):
        return {k: v for k, v in samples(observer.exposition()).items()
                if k[0].endswith(("_total", "_count", "_sum", "_bucket")) and k[0] != "corehandler_errors_total"}

    assert counters(restarted) == counters(live)
    assert value(samples(restarted.exposition()), "corehandler_retention_deletions_total", rule="max_age") == 1


def test_seeding_from_rows_shaped_like_the_store_index(three_dumps):
    """store.py's Dump.summary(): the record as a dict, stored_bytes, and no compression or ingest times."""
    live = MetricsObserver()
    feed(live, three_dumps)
    rows = [{"id": r["id"], "record": r, "raw_bytes": s["raw_bytes"], "stored_bytes": s["compressed_bytes"] or 0,
             "status": s["status"], "path": s["path"] and os.path.basename(s["path"])} for r, s in three_dumps]
    restarted = MetricsObserver()
    assert restarted.seed(rows) == 3
    want, got = samples(live.exposition()), samples(restarted.exposition())
    for name in ("corehandler_dumps_total", "corehandler_captured_bytes_total", "corehandler_compressed_bytes_total",
                 "corehandler_capture_throughput_bytes_per_second_sum", "corehandler_compression_ratio_count",
                 "corehandler_hold_duration_seconds_count", "corehandler_dump_size_bytes_sum"):
        assert {k: v for k, v in got.items() if k[0] == name} == {k: v for k, v in want.items() if k[0] == name}
    assert value(got, "corehandler_compress_duration_seconds_count") == 0
    assert value(got, "corehandler_ingest_duration_seconds_count") == 0


def test_events_never_raise_and_count_observer_errors(maker):
    observer = MetricsObserver()
    # Strange but readable: counted as a dump whose outcome is unknown, not as an error.
    observer.on_ingested({"capture": "not a mapping", "signal": "11"}, {"raw_bytes": "x"})
    observer.on_ingested(None, None)  # type: ignore[arg-type]
    assert observer.seed([{"no": "record"}, {"record": "{not json"}]) == 0
    observer.on_deleted("id", None, "max_use", "lots")  # type: ignore[arg-type]
    got = samples(observer.exposition())
    assert value(got, "corehandler_errors_total", kind="observer") == 4
    assert value(got, "corehandler_dumps_total", signal="unknown", outcome="unknown", reason="", exe="other") == 1


def test_errors_by_kind_start_at_zero(tmp_path):
    observer = MetricsObserver()
    got = samples(observer.exposition())
    assert {dict(k[1])["kind"] for k in got if k[0] == "corehandler_errors_total"} == set(metrics.ERROR_KINDS)
    observer.on_error("disk_full", "no space left", None)
    assert value(samples(observer.exposition()), "corehandler_errors_total", kind="disk_full") == 1


def _index_row(n: int, stored_bytes: int) -> dict:
    record = {"schema": 1, "id": f"1796000000000{n:03d}-0123456789abcdef-{n}", "pid": n, "uid": 1000,
              "signal": 11, "timestamp": 1_700_000_000 + n}
    return row_from_record(record, status="ok", problem=None, path=f"{record['id']}.zst", raw_bytes=100,
                           stored_bytes=stored_bytes, sha256=None)


def test_state_and_store_gauges(tmp_path):
    """The store gauges come from the index at scrape time: what another process (`vacuum`, a corruption
    mark) changed shows at the next scrape, with no daemon event in between."""
    state = tmp_path / "state"
    with Store(state) as store:
        for n, size in ((1, 1000), (2, 234)):
            store.insert(_index_row(n, size))
    observer = MetricsObserver(store_dir=tmp_path, store_limit_bytes=lambda: 5000, state_dir=state)
    observer.on_state(backlog=4, store_bytes=0, store_count=0)  # the event's figures no longer decide
    got = samples(observer.exposition())
    assert value(got, "corehandler_ingest_backlog") == 4
    assert value(got, "corehandler_store_bytes") == 1234
    assert value(got, "corehandler_store_dumps") == 2
    assert value(got, "corehandler_store_corrupt_dumps") == 0
    assert value(got, "corehandler_store_limit_bytes") == 5000
    with Store(state) as store:  # as the CLI would: a deletion and a corruption mark, no event
        first, second = store.all()
        store.delete(first, "max_count")
        store.mark_corrupt(second, "flipped bytes")
    got = samples(observer.exposition())
    assert value(got, "corehandler_store_bytes") == 234 and value(got, "corehandler_store_dumps") == 1
    assert value(got, "corehandler_store_corrupt_dumps") == 1
    st = os.statvfs(tmp_path)
    assert value(got, "corehandler_store_filesystem_size_bytes") == st.f_blocks * st.f_frsize
    # A probe that fails gives no sample, never a failed scrape.
    broken = MetricsObserver(store_dir=tmp_path / "gone", store_limit_bytes=lambda: 1 // 0)
    names = {k[0] for k in samples(broken.exposition())}
    assert "corehandler_store_limit_bytes" not in names and "corehandler_store_filesystem_size_bytes" not in names


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
    from corehandler import facts

    record = maker.make(256 * 1024)
    started, ended = record["handler"]["started_realtime_ns"], record["capture"]["ended_realtime_ns"]
    assert facts.hold_seconds(record) == pytest.approx((ended - started) / 1e9, abs=1e-6)
    assert ended - started >= record["capture"]["ns"]
