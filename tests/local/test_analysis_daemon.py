"""Analysis inside the daemon, the CLI's views of it and the journal entry: real crashes (gdb's gcore) put into
the spool as csplice commits them, ingested by the real Daemon with the real eu-stack."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from corehandler.analysis import findings, unwind
from corehandler.cli import main
from corehandler.daemon import Settings
from corehandler.observe import journal
from corehandler.observe.metrics import MetricsObserver
from corehandler.store import analyses
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store
from support import realcore
from support.daemon_harness import Recorder, Running, wait_for

CONTAINER = "3f2a9c0e1b7d4c5a8e6f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f"
POD = "7c4d2a1e-93b5-4f0c-8d6e-1a2b3c4d5e6f"
POD_CGROUP = (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
              f"cri-containerd-{CONTAINER}.scope")


@pytest.fixture(scope="module")
def crashes(tmp_path_factory):
    for tool in ("gdb", "eu-stack", "gcc"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: scripts/install-deps installs it")
    tmp = tmp_path_factory.mktemp("crashes")
    # Where anyone may read it: a pod's crash has its mapped files vetted as the analysis's own uid, not root.
    programs = Path(tempfile.mkdtemp(prefix="corehandler-analysed-"))
    os.chmod(programs, 0o755)
    binary = realcore.build(programs, name="analysed")
    yield {kind: realcore.crash(binary, tmp / f"core.{kind}", kind) for kind in ("segv", "other", "thread")}
    shutil.rmtree(programs)


def ingest_all(state, observers=(), **settings):
    with Running(Settings(state, threads=1, sweep_interval=3600, **settings), observers):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")], what="spool drained")


def test_ingest_analyses_reports_and_shows(tmp_path, crashes, capsys):
    state = tmp_path / "state"
    ids = {}
    ids["a"] = realcore.spool(crashes["segv"], state / "spool")
    ids["b"] = realcore.spool(crashes["segv"], state / "spool")
    ids["c"] = realcore.spool(crashes["other"], state / "spool", cgroup="0::/system.slice/other.service\n")
    ids["t"] = realcore.spool(crashes["thread"], state / "spool")
    ids["k"] = realcore.spool(crashes["thread"], state / "spool", cgroup=f"0::{POD_CGROUP}\n")
    rec = Recorder()
    metrics = MetricsObserver(state_dir=state)
    ingest_all(state, [rec, metrics])
    assert rec.of("error") == []
    events = {e[1]: e[2] for e in rec.of("stored")}  # with the analysis (listed before it: pending)
    assert {e[2]["analysis"]["state"] for e in rec.of("ingested")} == {analyses.PENDING}
    exposition = metrics.exposition().decode()
    assert 'corehandler_analyses_total{outcome="ok"} 5.0' in exposition
    assert "corehandler_analysis_duration_seconds_count 5.0" in exposition
    assert "corehandler_signatures 3.0" in exposition
    a = events[ids["a"]]["analysis"]
    assert a["state"] == findings.OK and a["threads"][0]["frames"][0]["function"] == "crash_segv"
    assert a["signature"] == events[ids["b"]]["analysis"]["signature"]
    assert a["exact_key"] == events[ids["b"]]["analysis"]["exact_key"]
    assert events[ids["c"]]["analysis"]["signature_id"] != a["signature_id"]
    assert f'corehandler_signature_dumps{{signature="{a["signature"]}",signature_id="{a["signature_id"]}"}} 2.0' \
        in exposition
    with Store(state, readonly=True) as store:
        assert analyses.analysis_for(store, ids["t"])["crashing_tid"] == crashes["thread"].tid
        assert analyses.analysis_for(store.db, ids["a"])["signature_id"] == a["signature_id"]
        assert analyses.analysis_for(store, "nonexistent") is None

    # the journal entry: trace in MESSAGE, identity and keys as fields
    record = json.loads(json.dumps(realcore.record_for(crashes["segv"], ids["a"])))
    f = journal.dump_entry(record, events[ids["a"]])
    assert "Stack trace of thread" in f["MESSAGE"] and "crash_segv" in f["MESSAGE"]
    assert f["COREDUMP_UNIT"] == "analysed.service" and f["COREDUMP_SLICE"] == "system.slice"
    assert f["COREHANDLER_SIGNATURE"] == a["signature"] and f["COREHANDLER_EXACT_KEY"] == a["exact_key"]
    assert f["COREHANDLER_ANALYSIS"] == "ok" and f["COREHANDLER_BUILD_ID"] == a["exe"]["build_id"]
    assert "\n\nReason: null pointer dereference (SEGV_MAPERR at 0x0)\n\nStack trace of thread" in f["MESSAGE"]
    assert f["COREHANDLER_REASON"] == "null pointer dereference (SEGV_MAPERR at 0x0)"

    def cli(*argv):
        code = main(["--config-dir", str(tmp_path / "etc"), "--state-dir", str(state), *argv])
        out, _ = capsys.readouterr()
        assert code == 0
        return out

    out = cli("info", f"id={ids['t']}")
    assert "Signature: analysed SIGSEGV worker_crash < worker" in out
    assert f"Stack trace of thread {crashes['thread'].tid} (crashing):" in out and "worker_crash (analysed + 0x" in out
    assert "--all-threads shows them" in out and out.count("Stack trace of thread") == 1
    out = cli("info", "--all-threads", f"id={ids['t']}")
    assert out.count("Stack trace of thread") == 9 and "Unit: analysed.service" in out
    info = json.loads(cli("--json", "info", f"id={ids['a']}"))
    assert info[0]["analysis"]["signature"] == a["signature"]
    assert info[0]["analysis"]["reason"]["text"] == "null pointer dereference (SEGV_MAPERR at 0x0)"
    assert info[0]["analysis"]["reason"]["code"] == "SEGV_MAPERR" and info[0]["analysis"]["reason"]["addr"] == 0
    assert "Reason: null pointer dereference (SEGV_MAPERR at 0x0)" in cli("info", f"id={ids['a']}")
    with Store(state, readonly=True) as store:  # kept in the index's own column, for queries
        row = store.analysis_summaries([ids["a"]])[ids["a"]]
        assert row["reason"] == "null pointer dereference (SEGV_MAPERR at 0x0)"

    out = cli("list")
    assert "SIGNATURE" in out.splitlines()[0] and out.count(a["signature_id"]) == 2
    listed = json.loads(cli("--json", "list"))
    assert {d["id"]: d["signature_id"] for d in listed}[ids["a"]] == a["signature_id"]

    groups = json.loads(cli("--json", "list", "--group"))
    assert [g["count"] for g in groups] == [2, 2, 1]
    pair = next(g for g in groups if g["signature_id"] == a["signature_id"])
    assert pair["hosts"] == ["testhost"] and pair["units"] == ["analysed.service"] and pair["exact_keys"] == 1
    threads = next(g for g in groups if "worker_crash" in g["signature"])
    assert threads["units"] == sorted(["analysed.service", f"cri-containerd-{CONTAINER}.scope"])
    out = cli("list", "--group")
    assert out.splitlines()[1].split()[0] == "2" and "crash_segv < main" in out

    assert [d["id"] for d in json.loads(cli("--json", "list", "--container", CONTAINER[:12]))] == [ids["k"]]
    assert [d["id"] for d in json.loads(cli("--json", "list", "--pod", POD))] == [ids["k"]]
    out = cli("info", f"id={ids['k']}")
    assert "Runtime: containerd" in out and f"Pod UID: {POD}" in out and f"Container: {CONTAINER}" in out

    assert {d["id"] for d in json.loads(cli("--json", "list", "--signature", a["signature_id"][:8]))} == \
        {ids["a"], ids["b"]}
    assert {d["id"] for d in json.loads(cli("--json", "list", "--signature", a["exact_key"]))} == \
        {ids["a"], ids["b"]}
    assert [d["id"] for d in json.loads(cli("--json", "list", "--unit", "other.service"))] == [ids["c"]]
    assert [d["id"] for d in json.loads(cli("--json", "list", "--unit", "analysed.service", "-n", "1"))] == \
        [ids["t"]]
    assert [d["id"] for d in json.loads(cli("--json", "list", "--unit", "analysed.service", "-n", "2"))] == \
        [ids["b"], ids["t"]]
    assert main(["--config-dir", str(tmp_path / "etc"), "--state-dir", str(state), "list", "--pod", "x"]) == 1


def test_a_hanging_analyser_delays_ingest_by_its_timeout_only(tmp_path, crashes, monkeypatch):
    fake = tmp_path / "eu-stack"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    real = unwind._tool
    monkeypatch.setattr(unwind, "_tool", lambda name: str(fake) if name == "eu-stack" else real(name))
    state = tmp_path / "state"
    first = realcore.spool(crashes["segv"], state / "spool")
    second = realcore.spool(crashes["other"], state / "spool")
    rec = Recorder()
    started = time.monotonic()
    ingest_all(state, [rec], analysis_limits=findings.Limits(timeout=1))
    assert time.monotonic() - started < 30
    with Store(state, readonly=True) as store:
        assert {store.get(i).status for i in (first, second)} == {"ok"}
        assert analyses.analysis_for(store, first)["state"] == findings.TIMEOUT
    assert [e[1] for e in rec.of("error")] == ["analysis", "analysis"]


def test_restart_analyses_what_a_kill_left_and_skips_what_is_gone(tmp_path, crashes):
    """A kill after the index row (pause point `indexed`) leaves the raw core in the spool: analysed at the
    next start. A pending row whose raw core is gone, or a dump an older daemon indexed, is marked skipped."""
    state = tmp_path / "state"
    spool_dir = state / "spool"
    left = realcore.spool(crashes["segv"], spool_dir)
    gone = realcore.spool(crashes["other"], spool_dir)
    older = realcore.spool(crashes["thread"], spool_dir)
    with Store(state) as store:
        for dump_id in (left, gone, older):
            record = json.loads((spool_dir / f"{dump_id}.json").read_text())
            store.insert(row_from_record(record, status="ok", problem=None, path=None, raw_bytes=1, stored_bytes=1,
                                         sha256=None))
        analyses.mark_pending(store, gone)
    for dump_id in (gone, older):
        (spool_dir / f"{dump_id}.core").unlink()
    rec = Recorder()
    ingest_all(state, [rec])
    with Store(state, readonly=True) as store:
        assert analyses.analysis_for(store, left)["signature"].startswith("analysed SIGSEGV crash_segv")
        g, o = analyses.analysis_for(store, gone), analyses.analysis_for(store, older)
        assert g["state"] == o["state"] == findings.SKIPPED
        assert "killed mid-analysis" in g["problems"][0] and "before analysis existed" in o["problems"][0]
        assert analyses.unanalysed(store) == []
    assert not (spool_dir / f"{left}.core").exists()
    assert rec.of("ingested") == []  # their rows were final: the daemon that wrote them announced them


def test_dropped_and_disabled_are_skipped(tmp_path, crashes):
    state = tmp_path / "state"
    meta = realcore.spool(crashes["segv"], state / "spool")
    path = state / "spool" / f"{meta}.json"
    record = json.loads(path.read_text())
    record["core"] = None
    path.write_text(json.dumps(record))
    (state / "spool" / f"{meta}.core").unlink()
    off = realcore.spool(crashes["segv"], state / "spool")
    ingest_all(state)  # analysis on: the metadata-only dump is skipped
    with Store(state, readonly=True) as store:
        m = analyses.analysis_for(store, meta)
        assert m["state"] == findings.SKIPPED and "dropped" in m["problems"][0]
        assert m["identity"]["unit"] == "analysed.service"
    state2 = tmp_path / "state2"
    off = realcore.spool(crashes["segv"], state2 / "spool")
    ingest_all(state2, analysis_enabled=False)
    with Store(state2, readonly=True) as store:
        assert "disabled" in analyses.analysis_for(store, off)["problems"][0]


def test_a_deleted_dump_takes_its_analysis_along(tmp_path, crashes):
    state = tmp_path / "state"
    dump_id = realcore.spool(crashes["segv"], state / "spool")
    ingest_all(state)
    with Store(state) as store:
        full = analyses.analysis_for(store, dump_id)
        assert full["threads"] and full["identity"]["unit"] == "analysed.service"
        assert store.delete(store.get(dump_id), "max_count") is not None
        assert analyses.analysis_for(store, dump_id) is None
        assert store.deletions()["max_count"][0] == 1


def _hanging_unwinder(tmp_path, monkeypatch):
    fake = tmp_path / "eu-stack"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    real = unwind._tool
    monkeypatch.setattr(unwind, "_tool", lambda name: str(fake) if name == "eu-stack" else real(name))


def test_a_slow_analysis_holds_its_own_dump_only(tmp_path, crashes, monkeypatch):
    """Issue 34, MEDIUM 4: a dump whose unwinder runs to a long timeout (a 4000-thread process) no longer holds
    the ingest of the dumps after it. The first dump's analysis hangs; a second one, of root, arriving after
    it is listed and its core stored while the first is still being analysed. The next start finishes both
    from their rows."""
    _hanging_unwinder(tmp_path, monkeypatch)
    state = tmp_path / "state"
    spool_dir = state / "spool"
    slow = realcore.spool(crashes["thread"], spool_dir, uid=1000)
    rec = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=3600, analysis_limits=findings.Limits(timeout=600)),
                 [rec]) as d:
        wait_for(lambda: d.store is not None and rec.of("ingested"), what="the slow dump listed")
        second = realcore.spool(crashes["segv"], spool_dir)
        wait_for(lambda: [e[1] for e in rec.of("ingested")] == [slow, second], what="the second dump listed")
        wait_for(lambda: (state / "store" / f"{second}.zst").exists(), what="the second core stored")
        with Store(state, readonly=True) as store:
            assert analyses.analysis_for(store, slow)["state"] == analyses.PENDING
            assert store.get(slow).status == store.get(second).status == "compressing"
        listed = dict((e[1], e[2]) for e in rec.of("ingested"))
        assert listed[second]["analysis"]["state"] == analyses.PENDING and rec.of("stored") == []
    # Stopped mid-analysis: raw cores kept, rows `compressing`; the next start analyses and finishes both.
    assert (spool_dir / f"{slow}.core").exists() and (spool_dir / f"{second}.core").exists()
    monkeypatch.undo()
    rec = Recorder()
    ingest_all(state, [rec])
    with Store(state, readonly=True) as store:
        assert {store.get(i).status for i in (slow, second)} == {"ok"}
        assert analyses.analysis_for(store, second)["signature"].startswith("analysed SIGSEGV crash_segv")
        # (partial: uid 1000 may not read the test's binary, so the unwinder is not shown it)
        assert analyses.analysis_for(store, slow)["state"] in (findings.OK, findings.PARTIAL)
        assert store.get(slow).mini_path == f"{slow}.mini.core"
    stored = {e[1]: e[2] for e in rec.of("stored")}
    assert set(stored) == {slow, second} and stored[second]["analysis"]["state"] == findings.OK
    # the one coredumpctl entry of the dump carries its trace
    f = journal.stored_entry(realcore.record_for(crashes["segv"], second), stored[second])
    assert f["MESSAGE_ID"] == journal.MESSAGE_ID_COREDUMP and "crash_segv" in f["MESSAGE"]


def test_past_its_budget_a_uid_is_stored_without_analysis(tmp_path, crashes, monkeypatch):
    """Every budget is per uid: a uid whose analyses used its seconds in the window gets its next dumps
    stored without analysis, saying why; another uid's (root's) dumps are analysed as before."""
    _hanging_unwinder(tmp_path, monkeypatch)
    state = tmp_path / "state"
    first = realcore.spool(crashes["segv"], state / "spool", uid=1000)
    second = realcore.spool(crashes["other"], state / "spool", uid=1000)
    root = realcore.spool(crashes["segv"], state / "spool", uid=0)
    rec = Recorder()
    ingest_all(state, [rec], analysis_limits=findings.Limits(timeout=1), analysis_uid_budget=0.5)
    with Store(state, readonly=True) as store:
        assert {store.get(i).status for i in (first, second, root)} == {"ok"}
        assert analyses.analysis_for(store, first)["state"] == findings.TIMEOUT
        skipped = analyses.analysis_for(store, second)
        assert skipped["state"] == findings.SKIPPED and skipped["problems"][0].startswith(
            "analysis skipped: uid budget (uid 1000 used 1 s of analysis in the last 600 s")
        assert analyses.analysis_for(store, root)["state"] == findings.TIMEOUT  # analysed: its own budget
        assert store.get(second).mini_path is None  # the mini core too: that uid is stored without analysis
    assert {e[1] for e in rec.of("stored")} == {first, second, root}
