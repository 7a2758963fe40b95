"""Prometheus metrics of the dumps the daemon ingests: a daemon observer (docs/design.md, "Daemon events").

Everything lives on a private CollectorRegistry, served over HTTP (`serve`) and, when configured, written as a
node_exporter textfile. Two kinds of series:

- counted: counters and histograms of what this daemon ingested and its errors, derived from each dump's spool
  record. They start at zero with the process; Prometheus's rate() and increase() take the reset in stride.
- read: what the index holds, read at scrape time (_StoreCollector): the stored dumps by status and their
  bytes, the latest crash, and the deletions by rule since the index was created (counters, since they only
  grow), plus the store's limit and filesystem.
"""

from __future__ import annotations

import logging
import os
import platform
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest, make_wsgi_app
from prometheus_client.process_collector import ProcessCollector

from corehandler import __version__, fields, paths
from corehandler.atomicfile import write_atomic
from corehandler.observe.analysis_metrics import AnalysisMetrics
from corehandler.observe.metrics_server import MetricsServer
from corehandler.observe.upload_metrics import UploadCollector
from corehandler.observer import Quiet
from corehandler.store.dumprow import COMPRESSING, STATUSES
from corehandler.store.index import Store, StoreError

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1"
DEFAULT_PORT = 9577
# Label value for executables not on the allow-list: one series for all of them keeps cardinality bounded.
OTHER_EXE = "other"
ERROR_KINDS = ("ingest", "compress", "disk_full", "corrupt", "config", "observer", "analysis")

# 256 KiB .. 64 GiB in powers of two: a small daemon's core to the largest dump the default limits allow.
SIZE_BUCKETS = tuple(float(2**k) for k in range(18, 37))
# 1 MB/s (a throttled disk) .. 50 GB/s (a COREDUMP_USE_PIPE kernel into page cache), 1-2-5 steps.
THROUGHPUT_BUCKETS = tuple(m * 10.0**e for e in range(6, 11) for m in (1, 2, 5))
# 100 µs (1 MB at 10 GB/s) .. 1 h (csplice's default timeout; 64 GB at 20 MB/s), 1-2.5-5 steps.
DURATION_BUCKETS = tuple(round(m * 10.0**e, 6) for e in range(-4, 3) for m in (1, 2.5, 5)) + (1800.0, 3600.0)
# Raw size over compressed size; cores full of untouched pages compress by hundreds.
RATIO_BUCKETS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0)


class MetricsObserver(Quiet):
    """Counts what the daemon reports; never raises from an event (a failure is logged and counted)."""

    def __init__(self, *, exe_label_allowlist: Iterable[str] = (), textfile: str | os.PathLike | None = None,
                 state_dir: str | os.PathLike | None = None,
                 store_limit_bytes: Callable[[], int | None] | None = None,
                 csplice_version: str | None = None, capture_probe: Callable[[], Mapping[str, Any]] | None = None
                 ) -> None:
        # No _created series: they double the exposition, and Prometheus ignores them unless told otherwise.
        disable_created_metrics()
        self._allow = tuple(name for name in exe_label_allowlist if name)
        self.textfile = Path(textfile) if textfile else None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.dumps = Counter("corehandler_dumps", "Dumps handled, by signal and outcome (complete, truncated, "
                             "dropped, orphan); reason says why a dump was truncated or dropped",
                             ["signal", "outcome", "reason", "exe"], registry=r)
        self.raw_bytes = Counter("corehandler_raw_bytes", "Bytes of core kept in the spool (uncompressed)",
                                 ["exe"], registry=r)
        self.drained_bytes = Counter("corehandler_drained_bytes",
                                     "Bytes read from the kernel and discarded past a limit", registry=r)
        self.stored_bytes = Counter("corehandler_stored_bytes",
                                    "Bytes written to the store (compressed where compression is on)", registry=r)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, documentation, buckets=buckets, registry=r)

        self.dump_size = histogram("corehandler_dump_size_bytes",
                                   "Size of each dump as the kernel wrote it (kept plus drained bytes)", SIZE_BUCKETS)
        self.capture_duration = histogram("corehandler_capture_duration_seconds",
                                          "Time csplice spent copying each dump from the kernel's pipe",
                                          DURATION_BUCKETS)
        self.throughput = histogram("corehandler_capture_throughput_bytes_per_second",
                                    "Capture throughput of each dump (kept plus drained bytes over copy time)",
                                    THROUGHPUT_BUCKETS)
        self.hold = histogram("corehandler_hold_duration_seconds",
                              "Time each crashed process was held by csplice, from handler start "
                              "(handler.started_realtime_ns) to capture end; records without "
                              "capture.ended_realtime_ns count the copy only (capture.ns)", DURATION_BUCKETS)
        self.compress_duration = histogram("corehandler_compress_duration_seconds",
                                           "Time the daemon spent compressing each dump", DURATION_BUCKETS)
        self.compression_ratio = histogram("corehandler_compression_ratio",
                                           "Raw size over compressed size of each stored dump", RATIO_BUCKETS)
        self.ingest_duration = histogram("corehandler_ingest_duration_seconds",
                                         "Time the daemon spent ingesting each dump (validate, analyse, index, "
                                         "compress)",
                                         DURATION_BUCKETS)
        # Rules need it: a counter's series that reappears at 1 after a restart shows no increase.
        Gauge("corehandler_start_time_seconds", "When this daemon started (Unix time); its counters count from "
              "here", registry=r).set_to_current_time()
        self.backlog = Gauge("corehandler_ingest_backlog", "Committed spool records waiting to be ingested",
                             registry=r)
        self.errors = Counter("corehandler_errors", "Daemon errors since the daemon started, by kind",
                              ["kind"], registry=r)
        for kind in ERROR_KINDS:
            self.errors.labels(kind)
        Info("corehandler_build", "Versions of the running corehandler", registry=r).info(
            {"version": __version__, "csplice_version": csplice_version or "",
             "python_version": platform.python_version()})
        # Every collector that reads the index at scrape time, here in one place.
        r.register(_StoreCollector(state_dir, store_limit_bytes))
        if state_dir is not None:
            r.register(UploadCollector(paths.index_path(state_dir)))
        if capture_probe is not None:
            r.register(_CaptureCollector(capture_probe))
        self.socket_rejects = Counter("corehandler_socket_rejects", "Dumps csplice refused over the coredump "
                                      "socket before the kernel wrote them, by reason", ["reason"], registry=r)
        self.excluded = Counter("corehandler_crashes_excluded", "Crashes in pods whose policy keeps nothing (a pod's "
                                "corehandler.io/core: none, its namespace's or the default setting): no record, "
                                "no core; source says which decided", ["source"], registry=r)
        for source in ("default", "namespace", "annotation"):
            self.excluded.labels(source)
        self.analysis = AnalysisMetrics(r, state_dir)
        self._server: MetricsServer | None = None

    @classmethod
    def from_config(cls, metrics_config: Any, **kwargs: Any) -> MetricsObserver:
        """From the [metrics] section (anything with exe_label_allowlist and textfile attributes)."""
        return cls(exe_label_allowlist=metrics_config.exe_label_allowlist,
                   textfile=metrics_config.textfile or None, **kwargs)

    # Serving

    def serve(self, listen: str = DEFAULT_LISTEN, port: int = DEFAULT_PORT) -> tuple[str, int]:
        """Starts the /metrics HTTP server (metrics_server.py: a thread and a small pool, however many clients
        connect); returns the bound address (port 0 picks a free one)."""
        http_registry = CollectorRegistry(auto_describe=True)
        http_registry.register(_Forward(self.registry))
        # The daemon's own CPU and memory, over HTTP only: node_exporter has process_* of its own, so these
        # must stay out of the textfile.
        ProcessCollector(registry=http_registry)
        self._server = MetricsServer(make_wsgi_app(http_registry), listen, port)
        host, bound = self._server.server_address[:2]
        log.info("serving metrics on %s port %d", host, bound)
        return host, bound

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def write_textfile(self) -> None:
        """Writes the node_exporter textfile atomically: readers see the old file or the new, never half."""
        if self.textfile is not None:
            write_atomic(self.textfile, self.exposition(), 0o644)

    # Daemon events

    def on_ingested(self, record: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        with self._guard("on_ingested"):
            self._count_dump(record, stored)
            if stored.get("status") != COMPRESSING:  # else its analysis comes with on_stored
                self.analysis.count(stored)

    def on_stored(self, record: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        with self._guard("on_stored"):
            self._count_stored(stored)
            self.analysis.count(stored)

    def on_excluded(self, record: Mapping[str, Any], source: str) -> None:
        with self._guard("on_excluded"):
            self.excluded.labels(source).inc()

    def on_error(self, kind: str, message: str, dump_id: str | None) -> None:
        with self._guard("on_error"):
            self.errors.labels(kind).inc()

    def on_state(self, backlog: int, store_bytes: int, store_count: int) -> None:
        """The store's figures are read from the index at scrape time; this is the moment to write them out."""
        with self._guard("on_state"):
            self.backlog.set(backlog)
            self.write_textfile()

    def close(self) -> None:
        with self._guard("close"):
            self.write_textfile()
        if self._server is not None:
            self._server.close()
            self._server = None

    # Counting

    def exe_label(self, exe: str | None) -> str:
        if exe:
            base = os.path.basename(exe)
            for name in self._allow:
                if name == exe or name == base:
                    return name
        return OTHER_EXE

    def _count_dump(self, record: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        outcome, reason = fields.outcome(record, stored)
        signal = fields.signal_name(fields.signal_number(record)) or "unknown"
        exe = self.exe_label(fields.exe(record))
        self.dumps.labels(signal, outcome, reason, exe).inc()
        if fields.socket_rejected(record):
            self.socket_rejects.labels(reason).inc()
        cap = fields.capture(record)
        kept = fields.number(cap, "bytes") or 0.0
        self.raw_bytes.labels(exe).inc(kept)
        self.drained_bytes.inc(fields.number(cap, "drained_bytes") or 0.0)
        size = fields.dump_bytes(record)
        if size is not None:
            self.dump_size.observe(size)
        seconds = fields.capture_seconds(record)
        throughput = fields.number(cap, "throughput_bytes_per_second")
        # A dropped dump is drained too, so its figures are real capture figures; a zero-length copy is not.
        if seconds is not None and seconds > 0:
            self.capture_duration.observe(seconds)
            if throughput is not None:
                self.throughput.observe(throughput)
        hold = fields.hold_seconds(record)
        if hold is not None:
            self.hold.observe(hold)
        if stored.get("status") != COMPRESSING:  # else on_stored counts it, once its figures are known
            self._count_stored(stored)

    def _count_stored(self, stored: Mapping[str, Any]) -> None:
        raw = fields.number(stored, "raw_bytes")
        packed = fields.number(stored, "stored_bytes")
        # Dropped dumps have nothing stored: 0 bytes, and no ratio or compression time to count.
        if not packed:
            packed = None
        if packed is not None:
            self.stored_bytes.inc(packed)
            if raw:
                self.compression_ratio.observe(raw / packed)
            seconds = fields.number(stored, "compress_seconds")
            if seconds is not None:
                self.compress_duration.observe(seconds)
        seconds = fields.number(stored, "ingest_seconds")
        if seconds is not None:
            self.ingest_duration.observe(seconds)

    def _guard(self, event: str) -> _Guard:
        return _Guard(self, event)


class _Guard:
    """Turns an exception in an observer event into a log line and an `observer` error, as the contract asks."""

    def __init__(self, observer: MetricsObserver, event: str) -> None:
        self.observer, self.event = observer, event

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, traceback) -> bool:
        if value is None or not isinstance(value, Exception):
            return False
        log.warning("metrics: %s failed, ignoring: %s", self.event, value, exc_info=value)
        try:
            self.observer.errors.labels("observer").inc()
        except Exception:  # never let accounting of a failure become a failure
            pass
        return True


class _Forward:
    """Collects another registry, so the HTTP registry can add process metrics without touching ours."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self):
        return self.registry.collect()


class _StoreCollector:
    """What the index and the store's filesystem say at scrape time. A probe that fails (no index yet, a
    vanished directory) gives no samples, never a failed scrape."""

    def __init__(self, state_dir: str | os.PathLike | None, limit: Callable[[], int | None] | None) -> None:
        self.state_dir, self.limit = (Path(state_dir) if state_dir is not None else None), limit

    def describe(self):
        return []

    def collect(self):
        if self.limit is not None:
            try:
                value = self.limit()
            except Exception as err:
                log.debug("metrics: store limit unavailable: %s", err)
                value = None
            if value is not None:
                yield GaugeMetricFamily("corehandler_store_limit_bytes",
                                        "Bytes the store may use (retention.max_use resolved)", value=value)
        if self.state_dir is None:
            return
        yield from self._index()
        try:
            st = os.statvfs(paths.store_dir(self.state_dir))
        except OSError as err:
            log.debug("metrics: statvfs %s: %s", paths.store_dir(self.state_dir), err)
            return
        yield GaugeMetricFamily("corehandler_store_filesystem_size_bytes",
                                "Size of the store's filesystem", value=st.f_blocks * st.f_frsize)
        yield GaugeMetricFamily("corehandler_store_filesystem_avail_bytes",
                                "Bytes available to unprivileged users on the store's filesystem",
                                value=st.f_bavail * st.f_frsize)

    def _index(self):
        try:
            with Store(self.state_dir, readonly=True) as store:
                by_status, deletions, latest = store.by_status(), store.deletions(), store.latest_crash()
                corrupt = len(store.corrupt())
        except (StoreError, sqlite3.Error) as err:
            log.debug("metrics: index unavailable: %s", err)
            return
        dumps = GaugeMetricFamily("corehandler_store_dumps", "Dumps in the store, by index status (ok, "
                                  "truncated, dropped, invalid, orphan, compressing)", labels=["status"])
        for status in STATUSES:
            dumps.add_metric([status], by_status.get(status, (0, 0))[0])
        yield dumps
        yield GaugeMetricFamily("corehandler_store_bytes", "Bytes the store's dumps take on disk",
                                value=sum(size for _, size in by_status.values()))
        yield GaugeMetricFamily("corehandler_store_corrupt_dumps", "Dumps in the store whose stored file failed "
                                "a check (`corehandler list` shows which)", value=corrupt)
        if latest is not None:
            yield GaugeMetricFamily("corehandler_last_dump_timestamp_seconds",
                                    "When the most recent stored dump crashed (the kernel's %t)", value=latest)
        removed = CounterMetricFamily("corehandler_retention_deletions", "Dumps removed by retention since the "
                                      "index was created, by rule", labels=["rule"])
        freed = CounterMetricFamily("corehandler_retention_freed_bytes", "Bytes freed by retention since the "
                                    "index was created, by rule", labels=["rule"])
        for rule, (count, size) in deletions.items():
            removed.add_metric([rule], count)
            freed.add_metric([rule], size)
        yield removed
        yield freed


SHED_TOP_UIDS = 5


class _CaptureCollector:
    """How the kernel reaches csplice, at scrape time: the mode, whether the socket listener listens (the kernel
    drops dumps silently when not), the socket peers csplice refused, the captures stalled past csplice's
    timeout and the crashes shed. probe() returns a mapping with "mode" ("pipe", "socket" or None when
    corehandler is not the handler), "listening", "refused_peers", "stalled" and "shed" ({uid: crashes shed})."""

    def __init__(self, probe: Callable[[], Mapping[str, Any]]) -> None:
        self.probe = probe

    def describe(self):
        return []

    def collect(self):
        try:
            state = self.probe()
        except Exception as err:
            log.debug("metrics: capture probe failed: %s", err)
            return
        mode = GaugeMetricFamily("corehandler_capture_mode", "1 for the way the kernel hands this installation its "
                                 "dumps (pipe, socket; none when it does not own the host's core handler: another "
                                 "handler or another installation captures)", labels=["mode"])
        for name in ("pipe", "socket", "none"):
            mode.add_metric([name], 1.0 if (state.get("mode") or "none") == name else 0.0)
        yield mode
        yield GaugeMetricFamily("corehandler_handler_displaced", "1 while the kernel runs another core handler "
                                "although csplice.conf names this installation as its owner: another package took "
                                "it (systemd-coredump's postinst re-applies its pattern on every systemd update)",
                                value=1.0 if state.get("displaced") else 0.0)
        if state.get("mode") == "socket":
            yield GaugeMetricFamily("corehandler_listener_up", "1 while csplice's coredump socket listener "
                                    "listens; at 0 the kernel drops every dump silently",
                                    value=1.0 if state.get("listening") else 0.0)
        yield CounterMetricFamily("corehandler_socket_refused_peers", "Connections to the coredump socket from "
                                  "a peer that is not a task being dumped: refused, nothing stored",
                                  value=float(state.get("refused_peers") or 0))
        yield GaugeMetricFamily("corehandler_captures_stalled", "Captures still in progress (csplice alive, its "
                                ".tmp core in the spool) longer than [capture] timeout after the crash: each may "
                                "hold a core_pipe_limit slot", value=float(state.get("stalled") or 0))
        shed = state.get("shed") or {}
        yield CounterMetricFamily("corehandler_crashes_shed", "Crashes csplice shed past their user's budget "
                                  "(twice max_pending_per_uid, max_pending or max_per_exe_per_minute): nothing "
                                  "stored", value=float(sum(shed.values())))
        # The users who shed the most, a bounded label set: which user storms, without a series per uid.
        top = CounterMetricFamily("corehandler_crashes_shed_by_uid", f"Crashes shed, for the {SHED_TOP_UIDS} "
                                  "users who shed the most (uid -1: users past csplice's table, or no uid)",
                                  labels=["uid"])
        for uid, count in sorted(shed.items(), key=lambda kv: (-kv[1], kv[0]))[:SHED_TOP_UIDS]:
            top.add_metric([str(uid)], float(count))
        yield top
