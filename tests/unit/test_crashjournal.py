"""The journal's part of the crash's reason (analysis/crashjournal.py, reason.with_journal): the blocks Rust and
CPython write before they die, in each form they take, found in the lines before a crash; and how they show in
the reason line, the journal entry and `info`. Read from a real journald: tests/system/test_crashjournal_journald.py."""

from __future__ import annotations

import pytest

from corehandler.analysis import crashjournal, reason
from corehandler.cli import crashview
from corehandler.observe import journal

NEW = ["starting", "thread 'main' (8200) panicked at main.rs:3:28:", "called `Option::unwrap()` on a `None` value",
       "stack backtrace:", "   0: __rustc::rust_begin_unwind"]
OLD = ["thread 'worker' panicked at 'index out of bounds: the len is 3 but the index is 7', src/lib.rs:9:13",
       "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace"]
PY = ["Fatal Python error: Segmentation fault", "", "Current thread 0x00007f3c5a1f8740 (most recent call first):",
      '  File "/srv/app/t.py", line 4 in inner', '  File "/srv/app/t.py", line 6 in middle',
      '  File "/srv/app/t.py", line 8 in <module>', "", "Extension modules: _ctypes (total: 1)"]


@pytest.mark.parametrize("lines, summary", [
    (NEW, "Rust panic: called `Option::unwrap()` on a `None` value (at main.rs:3:28, thread 'main')"),
    (["thread 'main' panicked at src/main.rs:4:5:", "first", "second"],
     "Rust panic: first second (at src/main.rs:4:5, thread 'main')"),
    (OLD, "Rust panic: index out of bounds: the len is 3 but the index is 7 (at src/lib.rs:9:13, thread 'worker')"),
    (["thread 'w' panicked at 'two", "lines', src/a.rs:1:2"], "Rust panic: two lines (at src/a.rs:1:2, thread 'w')"),
    (PY, "Fatal Python error: Segmentation fault (in /srv/app/t.py:4, inner)"),
    (["Fatal Python error: PyThreadState_Get: the function must be called with the GIL held", "Python runtime "
      "state: initialized"], "Fatal Python error: PyThreadState_Get: the function must be called with the GIL held"),
])
def test_blocks_and_their_summary(lines, summary):
    found = crashjournal.find(["an older line", *lines])
    assert found["summary"] == summary
    assert found["lines"][0] == lines[0] if lines is not NEW else found["lines"][0] == NEW[1]


def test_the_last_block_wins_and_bounds_hold():
    found = crashjournal.find([*OLD, *PY, "x" * 5000])
    assert found["kind"] == crashjournal.PYTHON and len(found["lines"]) == len(PY) + 1
    assert found["lines"][-1].endswith("...[cut]") and len(found["lines"][-1]) < 600
    assert crashjournal.find(["nothing to see", "thread 'main' panicked at nowhere"]) is None
    assert len(crashjournal.find(["Fatal Python error: x", *["  more"] * 500])["lines"]) == crashjournal.MAX_LINES


def test_the_reason_line_leads_with_it():
    panic = crashjournal.find(NEW)
    core = {"text": "abort() called by the process itself (SI_TKILL)", "signal": 6, "code": "SI_TKILL",
            "addr": None, "sender_pid": 1, "abort_message": None}
    why = reason.with_journal(core, panic)
    assert why["text"] == panic["summary"] and why["journal"]["lines"] == NEW[1:3] and why["signal"] == 6
    fault = dict(core, text="null pointer dereference (SEGV_MAPERR at 0x0)")
    assert reason.with_journal(fault, crashjournal.find(PY))["text"] == ("Fatal Python error: Segmentation fault (in "
                                                                         "/srv/app/t.py:4, inner); null pointer "
                                                                         "dereference (SEGV_MAPERR at 0x0)")
    assert reason.with_journal(core, None) is core
    assert reason.with_journal(None, panic)["text"] == panic["summary"]
    # Analysed again later without the journal's lines: the first reason stays.
    again = {"reason": core}
    reason.carry_over({"reason": why}, again)
    assert again["reason"] is why


def test_journal_entry_and_info_show_the_lines_escaped():
    lines = ["thread 'main' panicked at main.rs:3:28:", "bad \x1b[31mthing"]
    result = {"reason": reason.with_journal({"text": None}, crashjournal.find(lines))}
    f = {"MESSAGE": "Process 1 dumped core."}
    journal.analysis_fields(f, result)
    assert "\x1b" not in f["MESSAGE"] and "bad \\x1b[31mthing" in f["MESSAGE"]
    assert "In the journal before the crash:\nthread 'main' panicked at main.rs:3:28:" in f["MESSAGE"]
    assert f["COREHANDLER_REASON_JOURNAL"] == "thread 'main' panicked at main.rs:3:28:\nbad \\x1b[31mthing"
    assert f["COREHANDLER_REASON"] == "Rust panic: bad \\x1b[31mthing (at main.rs:3:28, thread 'main')"
    assert crashview.journal_fields(result["reason"]) == [("Journal", lines[0]), ("", lines[1])]
