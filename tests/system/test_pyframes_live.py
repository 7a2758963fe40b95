"""Issue 36's Python frames on the live kernel: a Python program that segfaults through ctypes three calls deep
in its own code, run by the interpreter, from a venv and as a shebang script, crashes through core_pattern
into csplice; `corehandler serve` reads its Python frames with pystack in the analysis jail from the raw spool
core; `info` (text and --json) and the journal entry show the three frames with file and line, before and after
retention deletes the full core (the mini core stays, the frames stay in the index)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from test_daemon_live import live, serve, stop  # noqa: F401 (live is a fixture)

from corehandler.observe import journal
from support import pycrash
from support.daemon_harness import wait_for
from support.journald import PrivateJournald, field_bytes

pytestmark = [pytest.mark.root, pytest.mark.live_kernel, pytest.mark.journald]

PYTHON = Path(sys.executable).resolve()
def _allow_core():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _frames_shown(text: str, script: Path) -> bool:
    at = pycrash.lines(script)
    return all(f'File "{script}", line {at[n]}, in {n}' in text for n in pycrash.FRAMES)


def _own(analysis: dict, script: Path) -> list[tuple]:
    crashing = analysis["python"]["threads"][0]
    assert crashing["crashing"] and crashing["tid"] == analysis["crashing_tid"]
    return [(f["file"], f["line"], f["function"]) for f in crashing["frames"] if f["file"] == str(script)][:3]


def test_python_frames_of_real_crashes_before_and_after_retention(live, tmp_path):
    state, etc, cli, base = live
    programs = tmp_path / "programs"
    programs.mkdir()
    script = pycrash.write(programs / "crash.py", PYTHON)
    subprocess.run([str(PYTHON), "-m", "venv", "--without-pip", str(programs / "venv")], check=True)
    runs = {"interpreter": [str(PYTHON), str(script)], "venv": [str(programs / "venv/bin/python"), str(script)],
            "shebang": [str(script)]}
    daemon = serve(base)
    try:
        for argv in runs.values():
            r = subprocess.run(argv, preexec_fn=_allow_core, capture_output=True, timeout=60)
            assert r.returncode == -11, r
        wait_for(lambda: len(json.loads(cli("--json", "list").stdout or "[]")) == 3 and all(
            d["analysis_state"] not in (None, "pending") for d in json.loads(cli("--json", "list").stdout)),
            what="3 dumps indexed and analysed", timeout=120)
    finally:
        log = stop(daemon)
    assert "Traceback" not in log
    dumps = json.loads(cli("--json", "list").stdout)
    expected = pycrash.expected(script)
    before = {}
    for d in dumps:
        analysis = json.loads(cli("--json", "info", f"id={d['id']}").stdout)[0]["analysis"]
        assert analysis["python"]["state"] == "ok", analysis["python"]["problems"]
        assert _own(analysis, script) == expected
        assert "crash.py:inner < crash.py:middle < crash.py:outer" in analysis["signature"]
        text = cli("info", f"id={d['id']}", text=True).stdout
        assert _frames_shown(text, script) and "held the GIL" in text, text
        before[d["id"]] = analysis
    assert len({a["signature_id"] for a in before.values()}) == 1  # one bug, however it was started

    # The journal entry the daemon writes for each (its observer, on a private journald): MESSAGE as
    # coredumpctl prints it, and the Python traceback in a field of its own.
    journald = PrivateJournald(tmp_path / "journald")
    journald.start()
    try:
        client = journald.client()
        for d in dumps:
            detail = json.loads(cli("--json", "info", f"id={d['id']}").stdout)[0]
            record = json.loads(cli("--json", "info", f"id={d['id']}").stdout)[0]["record"]
            client.call("on_stored", record, {**detail, "analysis": before[d["id"]]})
        assert client.close() == 0
        entries = journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_COREDUMP}", count=3)
        for e in entries:
            message = field_bytes(e, "MESSAGE").decode()
            assert _frames_shown(message, script), message
            assert "most recent call last" in field_bytes(e, "COREHANDLER_PYTHON_STACK").decode()
    finally:
        journald.close()

    # Retention takes the full cores (max_age), the mini cores stay (mini_max_age): the frames stay shown.
    (etc / "corehandler.d").mkdir(exist_ok=True)
    (etc / "corehandler.d" / "retain.toml").write_text("[retention]\nmax_age = \"1s\"\nmini_max_age = \"1d\"\n")
    wait_for(lambda: cli("vacuum").returncode == 0 and all(
        d["corefile"] == "mini" for d in json.loads(cli("--json", "list").stdout)), what="full cores deleted",
        timeout=30)
    for d in dumps:
        text = cli("info", f"id={d['id']}", text=True).stdout
        assert "mini core only" in text and _frames_shown(text, script), text
        after = json.loads(cli("--json", "info", f"id={d['id']}").stdout)[0]["analysis"]
        assert after["python"] == before[d["id"]]["python"]
    assert os.listdir(state / "spool") == [] or all(n.startswith(".") for n in os.listdir(state / "spool"))
