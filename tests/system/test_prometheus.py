"""A real Prometheus scrapes the MetricsObserver across a daemon restart: the counters of what a daemon ingested
start again at zero, which Prometheus sees as a reset (rate() and increase() take it in stride); the deletions by
rule, read from the index at scrape time, go on without one."""

from __future__ import annotations

import os

import pytest

from corehandler.observe.metrics import MetricsObserver
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store
from support.prometheus import PrometheusServer, free_port
from support.records import RecordMaker

pytestmark = [pytest.mark.prometheus]

MIB = 1 << 20


def test_a_restart_resets_the_counters_and_not_what_the_index_holds(feeder, csplice, tmp_path):
    maker = RecordMaker(feeder, csplice, tmp_path / "csplice")
    state = tmp_path / "csplice"  # the maker's store directory is this state dir's store/
    dumps = []
    with Store(state) as store:
        for size in (MIB, 2 * MIB, 3 * MIB):
            record = maker.make(size)
            stored = maker.store_dump(record)
            dumps.append((record, stored))
            store.insert(row_from_record(record, status=stored["status"], problem=None,
                                         path=os.path.basename(stored["path"]), raw_bytes=stored["raw_bytes"],
                                         stored_bytes=stored["stored_bytes"], sha256=None))
        store.delete(store.get(dumps[0][0]["id"]), "max_count")
    port = free_port()
    before = MetricsObserver(state_dir=state)
    for record, stored in dumps:
        before.on_ingested(record, stored)
    before.serve("127.0.0.1", port)
    prometheus = PrometheusServer(tmp_path / "prometheus", f"127.0.0.1:{port}")
    try:
        assert prometheus.wait_for('up{job="corehandler"}', 1) == 1
        assert prometheus.wait_for("sum(corehandler_dumps_total)", 3) == 3
        assert prometheus.wait_for("sum(corehandler_retention_deletions_total)", 1) == 1
        before.close()
        assert prometheus.wait_for('up{job="corehandler"}', 0) == 0

        # The restarted daemon ingests one more dump.
        after = MetricsObserver(state_dir=state)
        record = maker.make(4 * MIB)
        after.on_ingested(record, maker.store_dump(record))
        after.serve("127.0.0.1", port)
        try:
            assert prometheus.wait_for("sum(corehandler_dumps_total)", 1) == 1
            assert prometheus.scalar("corehandler_capture_throughput_bytes_per_second_sum") == \
                pytest.approx(record["capture"]["throughput_bytes_per_second"], rel=1e-12)
            assert prometheus.scalar("sum(resets(corehandler_dumps_total[5m]))") >= 1
            assert prometheus.scalar("sum(increase(corehandler_dumps_total[5m]))") > 0
            assert prometheus.scalar("sum(corehandler_retention_deletions_total)") == 1
            assert prometheus.scalar("sum(resets(corehandler_retention_deletions_total[5m]))") == 0
            assert prometheus.scalar('corehandler_store_dumps{status="ok"}') == 2
        finally:
            after.close()
    finally:
        before.close()
        prometheus.stop()
