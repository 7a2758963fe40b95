"""The real Daemon in a thread for tests, an observer that records events, and polling."""

from __future__ import annotations

import functools
import threading

from corehandler.daemon import Daemon
from corehandler.observer import Quiet
from support import waiting

# The daemon's passes compress and index: give them longer than waiting.wait_for's default.
wait_for = functools.partial(waiting.wait_for, timeout=30.0, interval=0.02)


class Recorder(Quiet):
    def __init__(self):
        self.events = []

    def on_ingested(self, record, stored):
        self.events.append(("ingested", record["id"], stored))

    def on_stored(self, record, stored):
        self.events.append(("stored", record["id"], stored))

    def on_deleted(self, dump_id, exe, rule, freed_bytes):
        self.events.append(("deleted", dump_id, rule, freed_bytes))

    def on_error(self, kind, message, dump_id):
        self.events.append(("error", kind, message, dump_id))

    def on_state(self, backlog, store_bytes, store_count):
        self.events.append(("state", backlog, store_bytes, store_count))

    def close(self):
        self.events.append(("close",))

    def of(self, kind):
        return [e for e in self.events if e[0] == kind]


class Running:
    """The daemon in a thread; stop() on exit."""

    def __init__(self, settings, observers=(), reload=None):
        self.daemon = Daemon(settings, observers, reload)
        self.thread = threading.Thread(target=self.daemon.run)

    def __enter__(self):
        self.thread.start()
        return self.daemon

    def __exit__(self, *exc):
        self.daemon.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def sample(metrics, name: str, **labels) -> float:
    """The sum over a MetricsObserver's series of that name whose labels include these."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(metrics.exposition().decode())
               for s in family.samples if s.name == name and labels.items() <= s.labels.items())
