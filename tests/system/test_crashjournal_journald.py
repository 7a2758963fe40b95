"""The crash's last words from a real journald (analysis/crashjournal.py): programs that die the way a service
does, their stderr a journal stream connected from their own PID (systemd-cat, as systemd connects a unit's), in
a private journald. A real Rust panic (rustc, `-C panic=abort`; where rustc is missing, a C program writing the
same text and aborting) and CPython's faulthandler block three calls deep; the lines found by the crashed PID,
uid and boot within the window before the crash, and shown in the analysis of a real core (the reason line,
the journal entry, `info`)."""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corehandler.analysis import crashjournal, unwind
from corehandler.analysis.findings import Limits
from corehandler.cli import crashview
from corehandler.observe import journal
from support import realcore
from support.journald import CLIENT, PrivateJournald

pytestmark = [pytest.mark.root, pytest.mark.journald]

RUST = """fn main() {
    let nothing: Option<u32> = None;
    println!("{}", nothing.unwrap());
}
"""
# Where rustc is missing: the text Rust 1.73+ writes, then abort(), as panic=abort does.
C_PANIC = r"""#include <stdio.h>
#include <stdlib.h>
int main(void) {
        fputs("thread 'main' panicked at main.rs:3:28:\ncalled `Option::unwrap()` on a `None` value\n"
              "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n", stderr);
        abort();
}
"""
PYTHON = """import ctypes, faulthandler
faulthandler.enable()
def inner():
    ctypes.string_at(0)
def middle():
    inner()
middle()
"""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")


@pytest.fixture
def journald(tmp_path):
    server = PrivateJournald(tmp_path / "journald")
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def panicker(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("panicker")
    if shutil.which("rustc"):
        (d / "main.rs").write_text(RUST)
        subprocess.run(["rustc", "-C", "panic=abort", "-o", "panicker", "main.rs"], cwd=d, check=True,
                       capture_output=True, timeout=300)
    else:
        (d / "panic.c").write_text(C_PANIC)
        subprocess.run(["gcc", "-o", "panicker", "panic.c"], cwd=d, check=True, capture_output=True)
    return d / "panicker"


def die_in_journal(server: PrivateJournald, *argv: str) -> dict:
    """Runs argv with its stdout and stderr a journal stream of its own PID (systemd-cat execs it), until it
    dies; the crash's record as csplice would have written it (pid, uid, boot, id, time)."""
    def no_core():  # the host's core_pattern is none of ours: leave it no core file
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # unshare and sh exec, systemd-cat execs: the PID we start is the PID that dies.
    p = subprocess.Popen(["unshare", "--mount", "sh", "-c", CLIENT, "sh", str(server.root), "systemd-cat",
                          "--identifier=crasher", *argv], preexec_fn=no_core, cwd=Path(argv[0]).parent)
    assert p.wait(timeout=120) < 0 or p.returncode > 128
    now = time.time()
    server.wait_for(f"_PID={p.pid}", count=2)
    return {"pid": p.pid, "uid": 0, "boot_id": BOOT_ID, "timestamp": int(now),
            "id": f"{int(now * 1e6)}-{BOOT_ID[:16]}-{p.pid}"}


def test_a_rust_panic(journald, panicker):
    record = die_in_journal(journald, str(panicker))
    found = crashjournal.of_crash(record, {}, str(journald.log_dir))
    assert found["kind"] == crashjournal.RUST and found["where"] == "main.rs:3:28" and found["thread"] == "main"
    assert found["message"] == "called `Option::unwrap()` on a `None` value"
    assert found["summary"] == "Rust panic: called `Option::unwrap()` on a `None` value (at main.rs:3:28, " \
                               "thread 'main')"
    # Another uid's, or outside the window: not this crash's.
    assert crashjournal.of_crash(dict(record, uid=4242), {}, str(journald.log_dir)) is None
    later = int(record["timestamp"] + crashjournal.WINDOW_BEFORE + 20)
    assert crashjournal.of_crash(dict(record, id=f"{later * 10**6}-{BOOT_ID[:16]}-{record['pid']}"), {},
                                 str(journald.log_dir)) is None


def test_a_fatal_python_error(journald, tmp_path):
    script = tmp_path / "t.py"
    script.write_text(PYTHON)
    record = die_in_journal(journald, sys.executable, "-P", str(script))
    found = crashjournal.of_crash(record, {}, str(journald.log_dir))
    assert found["kind"] == crashjournal.PYTHON and found["message"] == "Segmentation fault"
    # The innermost frame is ctypes' own string_at; the script's three calls follow it.
    assert found["where"].endswith("ctypes/__init__.py:" + found["where"].rsplit(":", 1)[1])
    assert found["function"] == "string_at"
    frames = [line.strip() for line in found["lines"] if line.strip().startswith("File ")]
    assert frames[1:4] == [f'File "{script}", line 4 in inner', f'File "{script}", line 6 in middle',
                           f'File "{script}", line 7 in <module>']


@pytest.mark.skipif(not realcore.have_gdb(), reason="gdb is in scripts/apt/base.txt")
def test_in_the_analysis_of_a_real_core(journald, panicker, tmp_path):
    """The daemon's analysis (unwind.finish) adds the journal's block to the reason of a real core: the line,
    the journal entry's MESSAGE and `info` (here the core is gdb's of a real abort(), the lines the panicker's)."""
    record = die_in_journal(journald, str(panicker))
    binary = realcore.build(tmp_path / "build", name="analysed")
    c = realcore.crash(binary, tmp_path / "core", "assert")
    result = unwind.analyse(c.core, {**realcore.record_for(c, record["id"]), **record},
                            Limits(journal_dir=str(journald.log_dir)))
    why = result["reason"]
    assert why["text"].startswith("Rust panic: called `Option::unwrap()` on a `None` value (at main.rs:3:28")
    assert why["journal"]["lines"][:2] == ["thread 'main' panicked at main.rs:3:28:",
                                           "called `Option::unwrap()` on a `None` value"] or \
        why["journal"]["lines"][0].startswith("thread 'main' (")
    assert "assertion failed" in why["text"]  # the core's own words follow the panic's
    f = {"MESSAGE": "Process dumped core."}
    journal.analysis_fields(f, result)
    assert "In the journal before the crash:\nthread 'main'" in f["MESSAGE"]
    labels = [k for k, _ in crashview.info_fields(result)]
    assert labels[labels.index("Reason") + 1] == "Journal"
