"""End to end on the live kernel: real crashes through core_pattern into csplice, their records fed to both
observers; a real Prometheus scrapes the dumps with their throughput, a real journald holds their entries."""

from __future__ import annotations

import json
import signal
import time
import urllib.request

import pytest

from corehandler.config import CaptureConfig
from corehandler.csplice_contract import SPECIFIERS
from corehandler.observe import journal
from corehandler.observe.metrics import MetricsObserver
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store
from support.crash import build_crasher, crash, python_crash
from support.host_core import capture_into
from support.journald import PrivateJournald, expected_dump_fields, field_bytes, mismatches
from support.prometheus import PrometheusServer, free_port
from support.records import store_dump

pytestmark = [pytest.mark.root, pytest.mark.live_kernel, pytest.mark.prometheus, pytest.mark.journald]

# The crasher twice (SIGABRT, its name on the label allow-list), and a Python dying of SIGSEGV (label "other").
CRASHER_MIB = (2, 8)
CRASHES = len(CRASHER_MIB) + 1


def crash_for_real(lent, csplice, spool, crasher) -> list[dict]:
    """Crashes CRASHES real processes with csplice as the live handler (lent: the borrowed handler, which
    puts core_pattern and csplice.conf back after); the committed records."""
    capture_into(lent, spool.parent, CaptureConfig.model_validate({"min_free": "0"}),
                 pattern=f"|{csplice} {SPECIFIERS}")
    for mib in CRASHER_MIB:
        result = crash(crasher, "abort", mib)
        assert result.returncode == -signal.SIGABRT, result
    result = python_crash()
    assert result.returncode == -signal.SIGSEGV, result
    deadline = time.monotonic() + 30
    while len(list(spool.glob("*.json"))) < CRASHES and time.monotonic() < deadline:
        time.sleep(0.05)
    return [json.loads(p.read_text()) for p in sorted(spool.glob("*.json"))]


def test_real_crashes_reach_prometheus_and_the_journal(csplice, tmp_path, host_core_settings):
    spool, store = tmp_path / "spool", tmp_path / "store"
    spool.mkdir(mode=0o700)
    store.mkdir(mode=0o700)
    crasher = build_crasher(tmp_path / "bin")
    records = crash_for_real(host_core_settings, csplice, spool, crasher)
    assert len(records) == CRASHES
    assert all(r["capture"]["complete"] for r in records)
    assert [r["proc"]["exe"] == str(crasher) for r in records] == [True, True, False]
    dumps = [(r, store_dump(r, spool, store)) for r in records]

    journald = PrivateJournald(tmp_path / "journald")
    journald.start()
    with Store(tmp_path) as index:  # what the daemon indexes; the store series are read from it at scrape time
        for record, stored in dumps:
            index.insert(row_from_record(record, status=stored["status"], problem=None, path=None,
                                         raw_bytes=stored["raw_bytes"], stored_bytes=stored["stored_bytes"] or 0,
                                         sha256=None))
    metrics = MetricsObserver(exe_label_allowlist=[crasher.name], state_dir=tmp_path)
    # The JournalObserver runs where the private journald's socket is /run/systemd/journal/socket.
    client = journald.client()
    port = free_port()
    metrics.serve("127.0.0.1", port)
    prometheus = None
    try:
        for record, stored in dumps:
            metrics.on_ingested(record, stored)
            client.call("on_ingested", record, stored)
        metrics.on_state(0, sum(s["stored_bytes"] for _, s in dumps), len(dumps))
        assert client.close() == 0 and client.stderr() == ""

        # What an admin's curl sees.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            body = response.read().decode()
        assert f'corehandler_dumps_total{{exe="{crasher.name}",outcome="complete",reason="",signal="SIGABRT"}} 2.0' \
            in body
        assert 'corehandler_dumps_total{exe="other",outcome="complete",reason="",signal="SIGSEGV"} 1.0' in body
        assert "corehandler_capture_throughput_bytes_per_second_count 3.0" in body

        prometheus = PrometheusServer(tmp_path / "prometheus", f"127.0.0.1:{port}")
        assert prometheus.wait_for('up{job="corehandler"}', 1) == 1
        assert prometheus.wait_for("sum(corehandler_dumps_total)", CRASHES) == CRASHES
        assert prometheus.scalar(f'corehandler_dumps_total{{exe="{crasher.name}",signal="SIGABRT",'
                                 f'outcome="complete"}}') == 2
        throughputs = [r["capture"]["throughput_bytes_per_second"] for r in records]
        assert prometheus.scalar("corehandler_capture_throughput_bytes_per_second_count") == CRASHES
        assert prometheus.scalar("corehandler_capture_throughput_bytes_per_second_sum") == \
            pytest.approx(sum(throughputs), rel=1e-12)
        sizes = [r["capture"]["bytes"] for r in records]
        assert prometheus.scalar("corehandler_dump_size_bytes_sum") == sum(sizes)
        assert prometheus.scalar('corehandler_store_dumps{status="ok"}') == CRASHES

        entries = journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_COREDUMP}", count=CRASHES)
        by_id = {field_bytes(e, "COREHANDLER_ID").decode(): e for e in entries}
        assert sorted(by_id) == sorted(r["id"] for r in records)
        for record, stored in dumps:
            assert mismatches(by_id[record["id"]], expected_dump_fields(record, stored)) == {}
    finally:
        metrics.close()
        journald.close()
        if prometheus is not None:
            prometheus.stop()
