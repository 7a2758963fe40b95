"""The Prometheus counters across a daemon restart, on a temporary state dir: the metrics observer serve wires
in is seeded from the index, tombstones of the dumps retention removed included, so no counter goes down
(Prometheus would read that as a reset and increase() would count every dump again)."""

from __future__ import annotations

import json
import os

from prometheus_client.parser import text_string_to_metric_families

from corehandler.cli import main
from corehandler.cli.serve import observers_for
from corehandler.config import Config
from corehandler.daemon import Settings
from corehandler.errors import EXIT_NOMATCH
from corehandler.paths import Paths
from corehandler.retention import Policy
from corehandler.store import Store
from support.daemon_harness import Running, wait_for
from support.spoolfeed import feed, write_settings


def counters(observer) -> dict[tuple[str, frozenset], float]:
    """Every counter and histogram sample; the errors counter counts one daemon run by design."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(observer.exposition().decode())
            for s in family.samples
            if s.name.endswith(("_total", "_count", "_sum", "_bucket")) and s.name != "corehandler_errors_total"}


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


def setup(tmp_path):
    """A state dir with its spool, csplice settings for the feeder, and the config serve would run with: the
    metrics observer writing a textfile (no HTTP port to share), no journald."""
    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True, mode=0o700)
    settings = write_settings(tmp_path / "s.conf", state / "spool")
    config = Config.model_validate({"metrics": {"enabled": False, "textfile": str(tmp_path / "corehandler.prom")},
                                    "journal": {"enabled": False}})
    return state, settings, config, Paths(state_dir=state)


def test_counters_continue_across_a_restart_after_deletions(tmp_path, feeder, csplice, capsys):
    state, settings, config, paths = setup(tmp_path)
    daemon_settings = Settings(state, threads=1, sweep_interval=3600, policy=Policy(max_count=3))

    def run_until(done, metrics):
        with Running(daemon_settings, [metrics]):
            wait_for(lambda: done(counters(metrics)), what="the dumps counted")
        metrics.close()

    records = [feed(feeder, csplice, settings, size=65536, pid=700 + i) for i in range(4)]
    (first,), problems = observers_for(config, paths, lambda: None)
    assert problems == []
    run_until(lambda c: total(c, "corehandler_retention_deletions_total") == 1, first)
    before = counters(first)
    assert total(before, "corehandler_dumps_total") == 4
    assert total(before, "corehandler_retention_deletions_total", rule="max_count") == 1
    with Store(state, readonly=True) as store:
        assert [d.id for d in store.all()] == [r["id"] for r in records[1:]]
    assert len(os.listdir(state / "store")) == 3

    # The restart: what serve does, on the index the first run left.
    (second,), _ = observers_for(config, paths, lambda: None)
    seeded = counters(second)
    assert seeded == before  # every counter, histogram bucket and sum exactly where it was
    assert total(seeded, "corehandler_dumps_total") == 4  # not 3, the dumps still stored

    # And they go on from there: one more dump, one more deletion.
    feed(feeder, csplice, settings, size=65536, pid=710)
    run_until(lambda c: total(c, "corehandler_retention_deletions_total") == 2, second)
    after = counters(second)
    assert total(after, "corehandler_dumps_total") == 5
    assert all(after.get(key, 0.0) >= value for key, value in before.items())
    assert total(after, "corehandler_retention_freed_bytes_total", rule="max_count") > \
        total(before, "corehandler_retention_freed_bytes_total", rule="max_count") > 0
    # The store gauges count what is stored, not the tombstones.
    gauges = {(s.name): s.value for f in text_string_to_metric_families(second.exposition().decode())
              for s in f.samples if s.name in ("corehandler_store_dumps", "corehandler_store_bytes")}
    with Store(state, readonly=True) as store:
        assert gauges == {"corehandler_store_dumps": 3, "corehandler_store_bytes": store.totals()[0]}
        assert len(store.history()) == 5

    # The CLI sees the stored dumps only: a tombstone's id matches nothing.
    cli = ["--config-dir", str(tmp_path), "--state-dir", str(state)]
    assert main([*cli, "info", records[0]["id"]]) == EXIT_NOMATCH
    capsys.readouterr()
    assert main([*cli, "list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_what_a_kill_left_unannounced_is_counted_once_after_the_restart(tmp_path, feeder, csplice):
    """A kill after indexing (the record still in the spool) and a kill after a deletion's mark: the restarted
    daemon announces both, so the seed must leave them out, or the counters would go up by two."""
    state, settings, config, paths = setup(tmp_path)
    indexed, deleting = (feed(feeder, csplice, settings, size=65536, pid=720 + i) for i in range(2))
    record_file = state / "spool" / f"{indexed['id']}.json"
    record_text = record_file.read_text()
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")],
                 what="the dumps ingested")
    record_file.write_text(record_text)  # as a kill between the index row and the cleanup leaves it
    with Store(state) as store:  # as a kill between delete()'s mark and its unlink leaves it
        store.db.execute("UPDATE dumps SET deleting = 1, deleted_rule = 'max_count', freed_bytes = 4096 "
                         "WHERE id = ?", (deleting["id"],))
        store.db.commit()

    (metrics,), _ = observers_for(config, paths, lambda: None)
    with Running(Settings(state, threads=1, sweep_interval=3600), [metrics]):
        wait_for(lambda: not record_file.exists(), what="the cleanup redone")
    metrics.close()
    after = counters(metrics)
    assert total(after, "corehandler_dumps_total") == 2
    assert total(after, "corehandler_retention_deletions_total", rule="max_count") == 1
    assert total(after, "corehandler_retention_freed_bytes_total", rule="max_count") == 4096
