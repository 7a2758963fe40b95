"""Python frames (corehandler/analysis/pyframes.py) of real CPython crashes: a program that segfaults through
ctypes three calls deep in its own functions, run by the interpreter, from a venv and as a shebang script,
cored by gdb (tests/support/realcore.py: no core_pattern is touched), read by pystack in the analysis jail as
the crashing user; then through the real daemon: info (text and --json) and the journal entry, before and after
retention leaves only the mini core."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from corehandler.analysis import findings, pyframes, unwind
from corehandler.cli import main
from corehandler.daemon import Settings
from corehandler.observe import journal
from corehandler.store import analyses
from corehandler.store.index import Store
from support import pycrash, realcore
from support.daemon_harness import Recorder, Running, wait_for

pytestmark = pytest.mark.root

USER = 4242  # the crashing user: its files are vetted as it, no passwd entry needed
PYTHON = Path(sys.executable).resolve()  # the interpreter pystack's wheel was installed for
@pytest.fixture(scope="module")
def programs():
    for tool in ("gdb", "eu-stack"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: scripts/install-deps installs it (scripts/apt/*.txt)")
    if pyframes.pystack_files() is None:
        pytest.fail("pystack is missing: it is a runtime dependency (pyproject.toml, packaging/lock/runtime.txt)")
    base = Path(tempfile.mkdtemp(prefix="corehandler-pyframes-"))
    os.chmod(base, 0o755)  # the crashing user's files: readable by anyone, as a user's checkout is
    pycrash.write(base / "crash.py", PYTHON)
    subprocess.run([str(PYTHON), "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    yield base
    shutil.rmtree(base)


def crash(programs: Path, kind: str, *args: str) -> tuple[realcore.Crash, dict]:
    """A crash of crash.py as `kind` runs it, and its record as csplice writes it (the exe as /proc gives it:
    a venv's python and a shebang script's process are the interpreter itself)."""
    script, core = programs / "crash.py", programs / f"core.{kind}{''.join(args)}"
    if kind == "shebang":
        c = realcore.crash_attached([str(script), "--stop", *args], core)
    else:
        c = realcore.crash(programs / "venv/bin/python" if kind == "venv" else PYTHON, core, str(script), *args)
    os.chmod(core, 0o644)
    exe = str(Path(c.binary).resolve())
    record = realcore.record_for(c, "id", exe=exe, cmdline=[exe, str(script)])
    return c, record


def analyse(c: realcore.Crash, record: dict) -> dict:
    result = unwind.analyse(c.core, record, findings.Limits(timeout=60))
    pyframes.add(result, c.core, record, findings.Limits(timeout=60))
    return result


def own_frames(thread: dict, script: Path) -> list[tuple]:
    return [(f["file"], f["line"], f["function"]) for f in thread["frames"] if f["file"] == str(script)]


@pytest.mark.parametrize("kind", ["interpreter", "venv", "shebang"])
def test_three_python_frames_with_file_and_line_come_out_of_the_jail(programs, kind):
    c, record = crash(programs, kind)
    as_user = dict(record, uid=USER, gid=USER)
    r = analyse(c, as_user)
    py = r["python"]
    assert py["state"] == "ok", (py["problems"], r["problems"])
    assert py["version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    # The same jail as the unwinder's: its own uid, PID namespace, private view, seccomp.
    assert {"own-uid", "pid-namespace", "private-view", "no-new-privs", "seccomp", "no-capabilities"} <= \
        set(py["sandbox"]), py["sandbox"]
    t = py["threads"][0]
    assert t["tid"] == c.tid == r["crashing_tid"] and t["crashing"] and t["gil"]
    script = programs / "crash.py"
    assert own_frames(t, script)[:3] == pycrash.expected(script)
    assert t["frames"][0]["function"] == "string_at"  # ctypes' own, innermost
    assert "crash.py:inner < crash.py:middle < crash.py:outer" in r["signature"], r["signature"]
    assert r["signature"].startswith(f"{PYTHON.name} SIGSEGV strlen | ")


def test_the_thread_that_held_the_gil_and_the_one_that_crashed(programs):
    c, record = crash(programs, "interpreter", "--thread")
    r = analyse(c, record)
    threads = r["python"]["threads"]
    assert r["python"]["threads_seen"] == 2 and [t["crashing"] for t in threads] == [True, False]
    assert threads[0]["gil"] and not threads[1]["gil"]  # time.sleep releases it
    assert threads[1]["frames"] and threads[1]["tid"] != c.tid
    lines = pyframes.traceback_lines(threads[0])
    assert lines[0] == f"Python traceback of thread {c.tid} (crashing, held the GIL), most recent call last:"


def test_a_core_larger_than_max_memory_is_read(programs):
    """pystack maps the core (twice): its address-space limit is max_memory plus twice the core's size, so a
    400 MiB heap is read under a 320 MiB max_memory."""
    c, record = crash(programs, "interpreter", "--heap", "400")
    limits = findings.Limits(timeout=60, memory_bytes=320 << 20)
    assert c.core.stat().st_size > 400 << 20
    r = unwind.analyse(c.core, record, limits)
    pyframes.add(r, c.core, record, limits)
    assert r["python"]["state"] == "ok", r["python"]["problems"]
    assert own_frames(r["python"]["threads"][0], programs / "crash.py")[0][2] == "inner"


def test_an_interpreter_replaced_since_the_crash_is_not_read(programs):
    """A venv whose interpreter is a copy (`venv --copies`), read; then that file replaced by another build:
    pystack would read the new file's offsets into the old process's memory, so it is not run."""
    subprocess.run([str(PYTHON), "-m", "venv", "--copies", "--without-pip", str(programs / "copies")], check=True)
    interpreter = programs / "copies/bin" / PYTHON.name
    c = realcore.crash(interpreter, programs / "core.copies", str(programs / "crash.py"))
    record = realcore.record_for(c, "id")
    assert analyse(c, record)["python"]["state"] == "ok"
    shutil.copy(shutil.which("true"), interpreter)  # another ELF at the path the core names
    r = analyse(c, record)
    assert r["exe"]["state"] == "replaced"
    assert r["python"]["state"] == "failed" and "replaced since the crash" in r["python"]["problems"][0]
    assert any(p.startswith("Python frames not read: ") for p in r["problems"]) and r["state"] == "partial"


def _ingest(state: Path, observers=()):
    with Running(Settings(state, threads=1, sweep_interval=3600), observers):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")], what="spool drained")


def test_through_the_daemon_info_json_and_journal_before_and_after_retention(programs, tmp_path, capsys):
    c, record = crash(programs, "interpreter")
    state = tmp_path / "state"
    dump_id = realcore.spool(c, state / "spool", exe=record["proc"]["exe"], cmdline=record["proc"]["cmdline"])
    rec = Recorder()
    _ingest(state, [rec])
    assert rec.of("error") == []
    stored = next(e[2] for e in rec.of("stored") if e[1] == dump_id)
    script = programs / "crash.py"
    at = pycrash.lines(script)

    def cli(*argv):
        code = main(["--config-dir", str(tmp_path / "etc"), "--state-dir", str(state), *argv])
        out, _ = capsys.readouterr()
        assert code == 0
        return out

    def shows_frames(out: str) -> None:
        for name in pycrash.FRAMES:
            assert f'File "{script}", line {at[name]}, in {name}' in out, out
        # interleaved: the Python frames follow the eval frame that ran them
        lines = out.splitlines()
        first = next(i for i, line in enumerate(lines) if "in string_at" in line)
        assert "_PyEval_EvalFrameDefault" in lines[first - 1]
        assert "Python: CPython " in out and "the crashing thread held the GIL" in out

    shows_frames(cli("info", f"id={dump_id}"))
    info = json.loads(cli("--json", "info", f"id={dump_id}"))[0]["analysis"]
    assert own_frames(info["python"]["threads"][0], script)[0] == pycrash.expected(script)[0]
    detail = json.loads(cli("--json", "info", f"id={dump_id}"))[0]
    # the daemon's own event, and one made of `info --json` as tests/system/test_pyframes_live.py makes it
    for entry in (journal.dump_entry(record, stored), journal.dump_entry(detail["record"], detail)):
        for name in pycrash.FRAMES:
            assert f'File "{script}", line {at[name]}, in {name}' in entry["MESSAGE"]
            assert f'line {at[name]}, in {name}' in entry["COREHANDLER_PYTHON_STACK"]

    with Store(state) as store:  # what retention does to a dump with a mini core
        assert store.drop_full_core(store.get(dump_id), "max_count") is not None
    out = cli("info", f"id={dump_id}")
    assert "mini core only" in out
    shows_frames(out)  # kept in the index: the mini core could not give them
    after = json.loads(cli("--json", "info", f"id={dump_id}"))[0]["analysis"]
    assert after["python"] == info["python"]

    with Store(state) as store:  # a dump analysed before Python frames were read: the mini core cannot
        older = analyses.analysis_for(store, dump_id)
        del older["python"]
        analyses.put(store, dump_id, older)
    out = cli("info", f"id={dump_id}")
    assert "Python: CPython, frames not read (only the mini core is left" in out
