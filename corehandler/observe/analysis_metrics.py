"""Prometheus metrics of crash analysis (corehandler/analysis/unwind.py), registered by metrics.MetricsObserver.

- corehandler_analyses{outcome}: analyses that ended in each state, counted as dumps are ingested (this
  daemon run; Prometheus reads a restart as a counter reset);
- corehandler_analysis_duration_seconds: how long each took (the unwinder's wall time, beside compression);
- corehandler_signature_dumps{signature_id, signature}: dumps in the store per signature, read from the index
  at scrape time for the TOP_SIGNATURES most frequent ones only, so labels stay bounded however many distinct
  crashes a host has; corehandler_signatures is how many distinct signatures there are in all;
- corehandler_newest_signature_first_seen_timestamp_seconds{signature_id, signature}: when the signature whose
  first dump in the store is the newest crashed first (one series: the CorehandlerNewSignature alert's).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from corehandler import fields, paths
from corehandler.analysis import findings
from corehandler.store import analyses

log = logging.getLogger(__name__)

TOP_SIGNATURES = 10
MAX_LABEL = 120
# 10 ms (a tiny crash) .. the longest timeout allowed (1 h).
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class AnalysisMetrics:
    def __init__(self, registry: CollectorRegistry, state_dir: str | os.PathLike | None) -> None:
        self.analyses = Counter("corehandler_analyses", "Crash analyses by outcome (ok, partial, failed, timeout, "
                                "unavailable, skipped)", ["outcome"], registry=registry)
        for state in findings.STATES:
            self.analyses.labels(state)
        self.duration = Histogram("corehandler_analysis_duration_seconds", "Wall time of each crash analysis "
                                  "(it runs beside compression)", buckets=BUCKETS, registry=registry)
        if state_dir is not None:
            registry.register(_SignatureCollector(paths.index_path(state_dir)))

    def count(self, stored: Mapping[str, Any]) -> None:
        result = stored.get("analysis")
        if not isinstance(result, Mapping) or result.get("state") not in findings.STATES:
            return
        self.analyses.labels(result["state"]).inc()
        seconds = fields.number(result, "seconds")
        if seconds and result["state"] != findings.SKIPPED:
            self.duration.observe(seconds)


class _SignatureCollector:
    def __init__(self, index: Path) -> None:
        self.index = index

    def describe(self):
        return []

    def collect(self):
        if not self.index.exists():
            return
        try:
            db = sqlite3.connect(f"file:{self.index}?mode=ro", uri=True, timeout=2)
            try:
                top = analyses.top_signatures(db, TOP_SIGNATURES)
                (distinct,) = db.execute("SELECT COUNT(DISTINCT signature_id) FROM analysis a JOIN dumps d "
                                         "ON d.id = a.id WHERE d.deleting = 0") .fetchone() \
                    if top else (0,)
                newest = analyses.newest_signature(db) if top else None
            finally:
                db.close()
        except sqlite3.Error as err:
            log.debug("metrics: signatures unavailable: %s", err)
            return
        family = GaugeMetricFamily("corehandler_signature_dumps", f"Dumps in the store per crash signature, for "
                                   f"the {TOP_SIGNATURES} most frequent", labels=["signature_id", "signature"])
        for sig_id, text, count in top:
            family.add_metric([sig_id, (text or "")[:MAX_LABEL]], count)
        yield family
        yield GaugeMetricFamily("corehandler_signatures", "Distinct crash signatures in the store", value=distinct)
        first = GaugeMetricFamily("corehandler_newest_signature_first_seen_timestamp_seconds",
                                  "First crash (Unix time) of the signature first seen most recently in the store",
                                  labels=["signature_id", "signature"])
        if newest is not None:
            first.add_metric([newest[0], (newest[1] or "")[:MAX_LABEL]], newest[2])
        yield first
