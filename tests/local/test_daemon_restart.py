"""The Prometheus series across a daemon restart, on a temporary state dir: what this daemon counted starts at
zero with the process (Prometheus's rate() and increase() take the reset), while what the index holds (stored
dumps, deletions by rule ever) is read from it at scrape time and carries on; and what a kill left unannounced
is announced once."""

from __future__ import annotations

import json
import os

from prometheus_client.parser import text_string_to_metric_families

from corehandler.cli import main
from corehandler.cli.serve import observers_for
from corehandler.config import Config
from corehandler.daemon import Settings
from corehandler.errors import EXIT_NOMATCH
from corehandler.observe.metrics import MetricsObserver
from corehandler.paths import Paths
from corehandler.store import retention
from corehandler.store.index import Store
from corehandler.store.retention import Policy
from support.daemon_harness import Recorder, Running, wait_for
from support.spoolfeed import feed, write_settings


def exposed(observer) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(observer.exposition().decode()) for s in family.samples}


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


def setup(tmp_path):
    """A state dir with its spool, csplice settings for the feeder, and the config serve would run with: the
    metrics observer writing a textfile (no HTTP port to share), no journald."""
    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True, mode=0o700)
    settings = write_settings(tmp_path / "s.conf", state / "spool")
    config = Config.model_validate({"metrics": {"enabled": False, "textfile": str(tmp_path / "corehandler.prom")},
                                    "journal": {"enabled": False}, "scrub": {"enabled": False}})
    return state, settings, config, Paths(state_dir=state)


def test_counters_restart_at_zero_and_the_index_series_carry_on(tmp_path, feeder, csplice, capsys):
    state, settings, config, paths = setup(tmp_path)
    # no mini cores: max_count then deletes whole dumps, whose counts carry on
    daemon_settings = Settings(state, threads=1, sweep_interval=3600, policy=Policy(max_count=3), mini_core=None)

    def run_until(done, metrics):
        with Running(daemon_settings, [metrics]):
            wait_for(lambda: done(exposed(metrics)), what="the dumps counted")
        metrics.close()

    records = [feed(feeder, csplice, settings, size=65536, pid=700 + i) for i in range(4)]
    observers, problems = observers_for(config, paths, lambda: None)
    [first] = [o for o in observers if isinstance(o, MetricsObserver)]
    assert problems == []
    # (the others stored too: analyses run beside ingest, and a dump is final once its own is done)
    run_until(lambda c: total(c, "corehandler_retention_deletions_total") == 1 and
              total(c, "corehandler_store_dumps", status="ok") == 3, first)
    before = exposed(first)
    assert total(before, "corehandler_dumps_total") == 4
    assert total(before, "corehandler_retention_deletions_total", rule="max_count") == 1
    with Store(state, readonly=True) as store:
        assert [d.id for d in store.all()] == [r["id"] for r in records[1:]]
        freed = store.deletions()["max_count"][1]
    assert len(os.listdir(state / "store")) == 3 and freed > 0

    # The restart: what serve does, on the index the first run left.
    [second] = [o for o in observers_for(config, paths, lambda: None)[0] if isinstance(o, MetricsObserver)]
    restarted = exposed(second)
    assert total(restarted, "corehandler_dumps_total") == 0  # counted by a process that is gone
    assert total(restarted, "corehandler_capture_throughput_bytes_per_second_count") == 0
    # Read from the index: the deletions ever, the dumps stored, the latest crash.
    assert total(restarted, "corehandler_retention_deletions_total", rule="max_count") == 1
    assert total(restarted, "corehandler_retention_freed_bytes_total", rule="max_count") == freed
    assert total(restarted, "corehandler_store_dumps", status="ok") == 3
    assert total(restarted, "corehandler_store_dumps") == 3
    with Store(state, readonly=True) as store:
        assert total(restarted, "corehandler_store_bytes") == store.totals()[0]
    assert total(restarted, "corehandler_last_dump_timestamp_seconds") == records[-1]["timestamp"]

    # And on from there: one more dump, one more deletion.
    feed(feeder, csplice, settings, size=65536, pid=710)
    run_until(lambda c: total(c, "corehandler_retention_deletions_total") == 2, second)
    after = exposed(second)
    assert total(after, "corehandler_dumps_total") == 1
    assert total(after, "corehandler_retention_freed_bytes_total", rule="max_count") > freed
    assert total(after, "corehandler_store_dumps") == 3

    # The CLI sees the stored dumps only: a deleted dump's id matches nothing.
    cli = ["--config-dir", str(tmp_path), "--state-dir", str(state)]
    assert main([*cli, "info", records[0]["id"]]) == EXIT_NOMATCH
    capsys.readouterr()
    assert main([*cli, "list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_what_a_kill_left_unannounced_is_announced_once_after_the_restart(tmp_path, feeder, csplice):
    """A kill after a dump's row is final (the record still in the spool) and a kill after a deletion's mark:
    the restarted daemon finishes both. The dump was announced (listed, then stored) by the daemon that
    committed its rows, so not again; the deletion was not, so it is, and the index counts it once."""
    state, settings, config, paths = setup(tmp_path)
    indexed, deleting = (feed(feeder, csplice, settings, size=65536, pid=720 + i) for i in range(2))
    record_file = state / "spool" / f"{indexed['id']}.json"
    record_text = record_file.read_text()
    first = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=3600), [first]):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")],
                 what="the dumps ingested")
    assert [e[1] for e in first.of("ingested")] == [e[1] for e in first.of("stored")] == [indexed["id"],
                                                                                          deleting["id"]]
    record_file.write_text(record_text)  # as a kill between the final row and the cleanup leaves it
    with Store(state) as store:  # as a kill between delete()'s mark and its unlink leaves it
        store.db.execute("UPDATE dumps SET deleting = 1, deleted_rule = 'max_count', freed_bytes = 4096 "
                         "WHERE id = ?", (deleting["id"],))
        store.db.commit()

    [metrics] = [o for o in observers_for(config, paths, lambda: None)[0] if isinstance(o, MetricsObserver)]
    recorder = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=3600), [metrics, recorder]):
        wait_for(lambda: not record_file.exists(), what="the cleanup redone")
    metrics.close()
    assert recorder.of("ingested") == recorder.of("stored") == []
    assert recorder.of("deleted") == [("deleted", deleting["id"], "max_count", 4096)]
    with Store(state, readonly=True) as store:
        assert [(d.id, d.status) for d in store.all()] == [(indexed["id"], "ok")]
    after = exposed(metrics)
    assert total(after, "corehandler_dumps_total") == 0
    assert total(after, "corehandler_retention_deletions_total", rule="max_count") == 1
    assert total(after, "corehandler_retention_freed_bytes_total", rule="max_count") == 4096


def test_dumps_a_kill_left_unfinished_are_finished_before_retention(tmp_path, feeder, csplice):
    """Two dumps indexed but still in the spool (a kill before the cleanup) and a policy that keeps one: the
    restarted daemon finishes both, then retention keeps the newest dump. While a record is still there, its
    dump is retention's to keep (`vacuum` with the daemon down), or the leftover record would be indexed again
    as a new, broken dump."""
    state, settings, _, _ = setup(tmp_path)
    records = [feed(feeder, csplice, settings, size=65536, pid=730 + i) for i in range(3)]
    # no mini cores: retention deletes whole dumps here
    texts = {r["id"]: (state / "spool" / f"{r['id']}.json").read_text() for r in records[:2]}
    with Running(Settings(state, threads=1, sweep_interval=3600, mini_core=None)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")],
                 what="the dumps ingested")
    for dump_id, text in texts.items():  # the cores are gone, the records back: as after the core_removed point
        (state / "spool" / f"{dump_id}.json").write_text(text)

    with Store(state) as store:
        assert [(d.id, d.rule) for d in retention.vacuum(store, Policy(max_count=1))] == [
            (records[2]["id"], "max_count")]
        assert [d.id for d in store.all()] == list(texts)
    recorder = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=3600, policy=Policy(max_count=1), mini_core=None),
                 [recorder]):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")],
                 what="the cleanups redone")
    with Store(state, readonly=True) as store:
        assert [(d.id, d.status) for d in store.all()] == [(records[1]["id"], "ok")]
    assert recorder.of("ingested") == []  # announced by the daemon that indexed them
    assert [e[1] for e in recorder.of("deleted")] == [records[0]["id"]]


def test_a_full_core_retention_dropped_before_a_kill_is_removed_at_start(tmp_path, feeder, csplice):
    """drop_full_core forgets the file in the row, then unlinks it: a kill between the two leaves a store file
    whose id has a row. The next start removes it (it is neither indexed as a stray nor kept)."""
    state, settings, _, _ = setup(tmp_path)
    r = feed(feeder, csplice, settings, size=65536, pid=740)
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")], what="ingested")
    with Store(state) as store:
        dump = store.get(r["id"])
        full = store.file_path(dump)
        store.db.execute("UPDATE dumps SET path = NULL, stored_bytes = 0 WHERE id = ?", (dump.id,))
        store.db.commit()
    assert full.exists()
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not full.exists(), what="the dropped core removed")
    with Store(state, readonly=True) as store:
        (row,) = store.all()
        assert (row.id, row.status, row.path, row.mini_path) == (r["id"], "ok", None, f"{r['id']}.mini.core")
