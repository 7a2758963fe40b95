"""A real Prometheus scrapes the MetricsObserver; the counters continue across a daemon restart."""

from __future__ import annotations

import json

import pytest

from corehandler.metrics import MetricsObserver
from support.prometheus import PrometheusServer, free_port
from support.records import RecordMaker

pytestmark = [pytest.mark.prometheus]

MIB = 1 << 20


def test_counters_survive_a_restart_seeded_from_the_index(feeder, csplice, tmp_path):
    maker = RecordMaker(feeder, csplice, tmp_path / "csplice")
    dumps = []
    for size in (MIB, 2 * MIB, 3 * MIB):
        record = maker.make(size)
        dumps.append((record, maker.store_dump(record)))
    port = free_port()
    before = MetricsObserver()
    for record, stored in dumps:
        before.on_ingested(record, stored)
    before.serve("127.0.0.1", port)
    prometheus = PrometheusServer(tmp_path / "prometheus", f"127.0.0.1:{port}")
    try:
        assert prometheus.wait_for('up{job="corehandler"}', 1) == 1
        assert prometheus.wait_for("sum(corehandler_dumps_total)", 3) == 3
        before.close()
        assert prometheus.wait_for('up{job="corehandler"}', 0) == 0

        # The restarted daemon: counters seeded from the index (record JSON + stored columns), then a new dump.
        after = MetricsObserver()
        assert after.seed([dict(stored, record=json.dumps(record)) for record, stored in dumps]) == 3
        record = maker.make(4 * MIB)
        dumps.append((record, maker.store_dump(record)))
        after.on_ingested(*dumps[-1])
        after.serve("127.0.0.1", port)
        try:
            assert prometheus.wait_for("sum(corehandler_dumps_total)", 4) == 4
            throughputs = [r["capture"]["throughput_bytes_per_second"] for r, _ in dumps]
            assert prometheus.scalar("corehandler_capture_throughput_bytes_per_second_count") == 4
            assert prometheus.scalar("corehandler_capture_throughput_bytes_per_second_sum") == \
                pytest.approx(sum(throughputs), rel=1e-12)
            # No counter went backwards: Prometheus saw one continuous series, not a reset to zero.
            assert prometheus.scalar("sum(resets(corehandler_dumps_total[5m]))") == 0
            assert prometheus.scalar("resets(corehandler_capture_throughput_bytes_per_second_count[5m])") == 0
            assert prometheus.scalar("sum(increase(corehandler_dumps_total[5m]))") > 0
        finally:
            after.close()
    finally:
        before.close()
        prometheus.stop()
