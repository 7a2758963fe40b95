"""The upload queue's metrics, read from the index at scrape time."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from corehandler.fleet import bucket
from corehandler.store.upload_queue import LOST, STATES, stats

log = logging.getLogger("corehandler.upload")


class UploadCollector:
    """The queue's metrics, read from the index at scrape time (so they survive restarts without replay)."""

    def __init__(self, index_path: Path):
        self.index_path = Path(index_path)

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            db = sqlite3.connect(f"file:{self.index_path}?mode=ro", uri=True, timeout=5)
            try:
                st = stats(db)
            finally:
                db.close()
        except sqlite3.Error as e:
            log.debug("metrics: upload queue unreadable: %s", e)
            return
        if st is None:
            return
        yield CounterMetricFamily("corehandler_upload_bytes", "Bytes uploaded to the fleet bucket (cores and "
                                  "sidecars)", value=st["uploaded_bytes"])
        yield CounterMetricFamily("corehandler_upload_seconds", "Seconds spent on uploads that succeeded",
                                  value=st["upload_seconds"])
        done = CounterMetricFamily("corehandler_uploads", "Dumps uploaded, by what went up", labels=["kind"])
        done.add_metric(["core"], st["cores"])
        done.add_metric(["sidecar_only"], st["states"]["done"] - st["cores"])
        yield done
        yield CounterMetricFamily("corehandler_upload_kept_back", "Dumps whose core the fleet budget kept "
                                  "home (sidecar only)", value=st["kept_back"])
        failures = CounterMetricFamily("corehandler_upload_failures", "Failed upload attempts by reason "
                                       "(lost: deleted before it was uploaded)", labels=["reason"])
        for reason in (*bucket.REASONS, LOST):
            failures.add_metric([reason], st["failures"].get(reason, 0))
        yield failures
        queue = GaugeMetricFamily("corehandler_upload_queue", "Dumps in the upload queue by state",
                                  labels=["state"])
        for state in STATES:
            queue.add_metric([state], st["states"][state])
        yield queue
        yield GaugeMetricFamily("corehandler_upload_oldest_pending_seconds", "Age of the oldest dump waiting "
                                "to upload; 0 when none waits", value=st["oldest_pending_seconds"])
        yield GaugeMetricFamily("corehandler_upload_failing", "1 while a problem of the bucket (credentials, "
                                "missing bucket, clock skew, no connection) holds the queue",
                                value=1 if st["problem"] else 0)

