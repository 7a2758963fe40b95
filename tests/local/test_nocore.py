"""Why a crash has no core (corehandler/nocore.py): real csplice records of each admission refusal, in `info`,
`list`, `--json` and the journal entry; the table of every reason csplice records."""

from __future__ import annotations

import json
import os

import pytest

from corehandler import nocore, paths
from corehandler.cli import main
from corehandler.daemon import Settings
from corehandler.observe import journal
from support import cbuild
from support.daemon_harness import Running, wait_for
from support.spoolfeed import empty_state, feed, write_settings


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Three crashes csplice kept as metadata only: RLIMIT_CORE 0 in a unit, a full backlog, a crash storm."""
    feeder, csplice = cbuild.feeder(), paths.csplice_path()
    tmp = tmp_path_factory.mktemp("nocore")
    state, etc, settings = empty_state(tmp)
    proc = tmp / "proc"
    (proc / "5001").mkdir(parents=True)
    (proc / "5001" / "cgroup").write_text("0::/system.slice/limited.service\n")
    records = {"rlimit": feed(feeder, csplice, settings, size=4096, pid=5001, comm="limited", rlimit=0,
                              proc_root=proc)}
    storm = write_settings(tmp / "storm.conf", state / "spool", max_per_exe_per_minute=1)
    for n in range(2):  # the second past the rate keeps metadata (a third, past twice the rate, would be shed)
        records["storm"] = feed(feeder, csplice, storm, size=4096, pid=5100 + n, comm="stormy")
    # Three records wait: at max_pending 2 the next keeps metadata only (at twice it, it would be shed).
    pending = write_settings(tmp / "pending.conf", state / "spool", max_pending=2)
    records["pending"] = feed(feeder, csplice, pending, size=4096, pid=5200, comm="waiting")
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")])
    return state, etc, records


def cli(capsys, refused, *argv):
    state, etc, _ = refused
    code = main(["--config-dir", str(etc), "--state-dir", str(state), *argv])
    out, _ = capsys.readouterr()
    assert code == 0
    return out


def test_rlimit_core_zero_names_the_unit_and_the_fix(capsys, refused):
    record = refused[2]["rlimit"]
    assert record["capture"]["dropped_reason"] == "rlimit_core"
    why = nocore.explain(record)
    assert why["kind"] == "dropped" and "RLIMIT_CORE was 0" in why["why"] and "limited.service" in why["why"]
    assert "systemctl edit limited.service" in why["fix"] and "LimitCORE=infinity" in why["fix"]
    out = cli(capsys, refused, "info", "limited")
    fields = dict(line.strip().split(": ", 1) for line in out.split("\n\n")[0].splitlines())
    assert fields["No Core"] == why["why"] and fields["What To Do"] == why["fix"]
    [info] = json.loads(cli(capsys, refused, "--json", "info", "limited"))
    assert info["no_core"] == why
    entry = journal.dump_entry(record, {"status": "dropped"})
    assert "The process's RLIMIT_CORE was 0 (LimitCORE= of limited.service" in entry["MESSAGE"]
    assert entry["COREHANDLER_NO_CORE"] == nocore.line(record)


def test_list_says_why_each_dump_has_no_core(capsys, refused):
    out = cli(capsys, refused, "list", "--no-legend")
    cells = {line.split()[-1].strip("()"): line for line in out.splitlines()}
    assert "no core: rlimit_core" in cells["limited"]
    assert "no core: max_pending" in cells["waiting"]
    assert sum("no core: max_per_exe_per_minute" in line for line in out.splitlines()) == 1
    listed = json.loads(cli(capsys, refused, "--json", "list"))
    assert {d["no_core"]["reason"] for d in listed if d["no_core"]} == {"rlimit_core", "max_pending",
                                                                        "max_per_exe_per_minute"}
    assert sum(d["no_core"] is None for d in listed) == 1  # the storm's first crash has its core
    out = cli(capsys, refused, "info", "waiting")
    assert "No Core: [capture] max_pending dumps were already waiting" in out and "corehandler status" in out


@pytest.mark.parametrize("capture, words", [
    ({"dropped": True, "dropped_reason": "max_dump_size"}, ("max_dump_size", "refused")),
    ({"truncated": True, "truncated_reason": "max_dump_size"}, ("max_dump_size", "cut")),
    ({"dropped": True, "dropped_reason": "min_free"}, ("free-space floor", "vacuum")),
    ({"dropped": True, "dropped_reason": "max_per_exe_per_minute"}, ("crash storm", "Restart=")),
    ({"dropped": True, "dropped_reason": "max_pending"}, ("max_pending", "corehandler status")),
    ({"dropped": True, "dropped_reason": "max_pending_per_uid"}, ("max_pending_per_uid", "crash loop")),
    ({"truncated": True, "truncated_reason": "write_error", "error": "No space left on device"}, ("disk full",)),
    ({"truncated": True, "truncated_reason": "write_error", "error": "Input/output error"},
     ("Input/output error", "doctor")),
    ({"truncated": True, "truncated_reason": "timeout"}, ("timeout",)),
    ({"dropped": True, "dropped_reason": "empty"}, ("no byte", "coredump_filter")),
    ({"dropped": True, "dropped_reason": "socket_error", "socket": {"error": "bad ack"}}, ("bad ack", "--mode pipe")),
    ({"dropped": True, "dropped_reason": "per_uid_budget"}, ("`per_uid_budget`", "doctor")),
    ({"truncated": True, "truncated_reason": "rlimit_core"}, ("cut at the process's RLIMIT_CORE of 1M",)),
])
def test_every_reason_csplice_records_has_words(capture, words):
    record = {"rlimit_core": "1048576", "capture": capture}
    line = nocore.line(record)
    for w in words:
        assert w.lower() in line.lower(), line


def test_a_complete_dump_needs_no_words():
    assert nocore.explain({"capture": {"complete": True}}) is None and nocore.line({}) is None
