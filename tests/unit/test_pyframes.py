"""The Python frames' pure parts (corehandler/analysis/pyframes.py): which dumps are CPython's, the jailed
reader's output checked and bounded as hostile input, the frames interleaved with the native ones, info's line
and what a second analysis keeps. The reader in the jail on real cores: tests/local/test_pyframes_real.py."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corehandler.analysis import findings, pyframes

LIMITS = findings.Limits(threads=4, frames=3, line_chars=40)


def out(**data) -> bytes:
    return json.dumps({"version": "3.11", "threads_seen": 1, "error": None, **data}).encode()


def thread(tid, frames, **more):
    return {"tid": tid, "gil": False, "gc": False, "name": None, "frames_seen": len(frames), "frames": frames,
            **more}


def pyf(function, file="/srv/app/crash.py", line=1, entry=False):
    return {"file": file, "line": line, "function": function, "entry": entry}


@pytest.mark.parametrize("result, expected", [
    ({"exe": {"path": "/usr/bin/python3.11", "state": "same"}}, True),            # a venv's: the interpreter
    ({"exe": {"path": "/opt/py/bin/python3", "state": "same"}}, True),            # a copied venv python
    ({"exe": {"path": "/usr/bin/uwsgi"}, "modules": [{"name": "/usr/lib/libpython3.11.so.1.0"}]}, True),
    ({"exe": {"path": "/usr/local/bin/service", "python": True}}, True),          # renamed, by its symbols
    ({"exe": {"path": "/usr/bin/bash"}, "modules": [{"name": "/usr/lib/libc.so.6"}]}, False),
    ({"exe": {"path": "/usr/bin/pythonista-helper"}}, False),
    ({"exe": {"path": "/usr/bin/app"}, "identity": {"comm": "python3"}}, False),  # the comm is never asked
])
def test_is_cpython_by_the_exe_and_the_mapped_files(result, expected):
    assert pyframes.is_cpython(result) is expected


def test_parse_orders_the_crashing_thread_first_and_keeps_the_gil():
    raw = out(threads_seen=2, threads=[thread(7, [pyf("idle")], gil=True), thread(9, [pyf("inner"), pyf("outer")])])
    p = pyframes.parse(raw, 9, LIMITS)
    assert p["state"] == "ok" and p["version"] == "3.11" and p["problems"] == [] and p["cut"] == []
    assert [(t["tid"], t["crashing"], t["gil"]) for t in p["threads"]] == [(9, True, False), (7, False, True)]
    assert [f["function"] for f in p["threads"][0]["frames"]] == ["inner", "outer"]


def test_parse_bounds_threads_frames_and_strings_again():
    many = [thread(n, [pyf(f"f{i}", file="/" + "d" * 100) for i in range(10)], frames_seen=10) for n in range(9)]
    p = pyframes.parse(out(threads_seen=9, threads=many), 3, LIMITS)
    assert len(p["threads"]) == 4 and all(len(t["frames"]) == 3 and t["frames_cut"] for t in p["threads"])
    assert p["threads"][0]["tid"] == 3
    assert all(len(f["file"]) == 40 + len("...[cut]") for t in p["threads"] for f in t["frames"])
    assert p["cut"] == ["Python threads: 4 of 9 kept", "Python frames: at most 3 per thread kept (the innermost)"]


@pytest.mark.parametrize("raw, problem", [
    (b"", "not bounded JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b"[" * 100 + b"]" * 100, "not bounded JSON"),
    (out(error="NotEnoughInformation: no _PyRuntime"), "pystack: NotEnoughInformation: no _PyRuntime"),
    (out(threads=[]), "no Python frame"),
    (out(threads="many"), "no Python frame"),
])
def test_parse_turns_bad_output_into_a_problem(raw, problem):
    p = pyframes.parse(raw, 1, LIMITS)
    assert p["state"] == "failed" and problem in p["problems"][0], p


def test_parse_keeps_only_fields_of_their_type():
    hostile = [{"tid": True, "frames": [pyf("x")]}, "thread", {"tid": 5, "gil": "yes", "name": 7,
               "frames": [{"file": ["/a"], "line": "12", "function": None, "entry": 1}, 3]}]
    p = pyframes.parse(out(version="3.11; rm -rf", threads=hostile), 5, LIMITS)
    assert p["version"] is None
    assert p["threads"] == [{"tid": 5, "crashing": True, "gil": False, "gc": False, "name": None,
                             "frames": [{"file": None, "line": None, "function": None, "entry": False}],
                             "frames_cut": False}]


def native(*functions):
    return {"tid": 9, "crashing": True, "frames": [
        {"index": i, "pc": 0x1000 + i, "function": f, "module": "/usr/bin/python3.11", "offset": i}
        for i, f in enumerate(functions)]}


def test_python_frames_go_under_the_eval_frames_that_ran_them():
    py = {"tid": 9, "frames": [pyf("inner", line=5), pyf("outer", line=13, entry=True),
                               pyf("<module>", line=16, entry=True)]}
    lines = pyframes.thread_lines(native("strlen", "_PyEval_EvalFrameDefault", "PyObject_Call",
                                         "_PyEval_EvalFrameDefault", "main"), py)
    text = "\n".join(lines)
    assert [line.split()[-1] if line.startswith("    File") else line.split()[2] for line in lines[1:]] == [
        "strlen", "_PyEval_EvalFrameDefault", "inner", "outer", "PyObject_Call", "_PyEval_EvalFrameDefault",
        "<module>", "main"]
    assert '    File "/srv/app/crash.py", line 5, in inner' in text


def test_without_eval_frames_the_python_traceback_follows_the_native_trace():
    py = {"tid": 9, "crashing": True, "gil": True, "frames": [pyf("inner", line=5), pyf("outer", line=13)]}
    lines = pyframes.thread_lines(native("strlen", None, None), py)
    assert lines[-3:] == ["Python traceback of thread 9 (crashing, held the GIL), most recent call last:",
                          '  File "/srv/app/crash.py", line 13, in outer',
                          '  File "/srv/app/crash.py", line 5, in inner']


def test_python_frames_past_the_native_ones_shown_are_not_lost():
    py = {"tid": 9, "frames": [pyf("a", entry=True), pyf("b", entry=True)]}
    lines = pyframes.thread_lines(native("f", "_PyEval_EvalFrameDefault"), py)
    assert lines[-2:] == ["    (Python frames below the native ones shown:)",
                          '    File "/srv/app/crash.py", line 1, in b']


def test_frame_lines_escape_what_the_process_chose():
    line = pyframes.frame_line(pyf("evil\x1b[31m", file="/tmp/\u202ex.py"))
    assert "\x1b" not in line and "\u202e" not in line and "\\x1b" in line


def test_info_says_a_mini_core_cannot_give_python_frames():
    analysed = {"state": "ok", "exe": {"path": "/usr/bin/python3.11"}, "crashing_tid": 9}
    assert "only the mini core is left" in pyframes.summary(analysed, full_core=False)
    assert "`corehandler analyze` reads them" in pyframes.summary(analysed, full_core=True)
    assert pyframes.summary({"state": "ok", "exe": {"path": "/usr/bin/bash"}}, full_core=False) is None
    read = dict(analysed, python={"state": "ok", "version": "3.11", "threads_seen": 2,
                                  "threads": [{"tid": 9, "gil": True, "frames": [pyf("x")]}]})
    assert pyframes.summary(read) == "CPython 3.11: 2 Python threads, the crashing thread held the GIL"
    failed = dict(analysed, python={"state": "failed", "version": None, "problems": ["pystack: no _PyRuntime"]})
    assert pyframes.summary(failed) == "CPython, frames not read: pystack: no _PyRuntime"


def _analysed(python=None):
    r = {"state": "ok", "problems": [], "exe": {"path": "/usr/bin/python3.11"}, "crashing_tid": 9,
         "threads": [native("strlen", "f", "_PyEval_EvalFrameDefault")], "signature": "python3.11 SIGSEGV x"}
    if python is not None:
        r["python"] = python
    return r


RECORD = {"signal": 11, "comm": "python3"}


def test_a_second_analysis_from_the_mini_core_keeps_the_first_ones_frames_and_signature():
    first = _analysed({"state": "ok", "threads": [{"tid": 9, "crashing": True, "frames": [pyf("inner")]}]})
    pyframes.rekey(first, RECORD)
    again = _analysed()
    pyframes.carry_over(first, again, RECORD)
    assert again["python"] == first["python"] and again["signature"] == first["signature"]
    assert again["signature"] == "python3.11 SIGSEGV strlen < crash.py:inner"
    # a full-core analysis that read them keeps its own; one that failed keeps the first's
    own = _analysed({"state": "ok", "threads": [{"tid": 9, "crashing": True, "frames": [pyf("other")]}]})
    pyframes.carry_over(first, own, RECORD)
    assert own["python"]["threads"][0]["frames"][0]["function"] == "other"
    failed = _analysed({"state": "failed", "threads": [], "problems": ["x"]})
    pyframes.carry_over(first, failed, RECORD)
    assert failed["python"] == first["python"]


def test_a_failure_is_a_problem_and_a_partial_result_never_an_exception(monkeypatch):
    def boom(*args):
        raise RuntimeError("pystack blew up")
    monkeypatch.setattr(pyframes, "read", boom)
    r = _analysed()
    pyframes.add(r, "/nonexistent", RECORD)
    assert r["state"] == "partial" and r["python"]["state"] == "failed"
    assert r["problems"] == ["Python frames not read: Python frames failed: RuntimeError: pystack blew up"]


def test_a_sidecars_python_frames_are_checked_as_another_hosts_word():
    """fleet info shows a sidecar's Python traceback only as checked() passes it (cli/fleet.py)."""
    stored = pyframes.parse(out(threads=[thread(9, [pyf("inner", line=5), pyf("outer", line=13)], gil=True)]), 9)
    again = pyframes.checked(json.loads(json.dumps(stored)), 9)
    assert again["threads"] == stored["threads"] and again["state"] == "ok"
    forged = pyframes.checked({"threads": [{"tid": 9, "frames": [pyf("x" * 100_000)] * 10_000}]}, 9)
    assert len(forged["threads"][0]["frames"]) == 64 and len(forged["threads"][0]["frames"][0]["function"]) < 600
    last = pyframes.traceback_lines(pyframes.crashing({"python": again}))[-1]
    assert last == '  File "/srv/app/crash.py", line 5, in inner'


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=80),
                     lambda inner: st.lists(inner, max_size=6) | st.dictionaries(
                         st.sampled_from(["tid", "frames", "file", "line", "function", "entry", "gil", "name",
                                          "threads", "threads_seen", "frames_seen", "version", "error", "x"]),
                         inner, max_size=6), max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_any_json_is_checked_never_raises_and_stays_bounded(data):
    p = pyframes.checked(data, 1, LIMITS)
    assert p["state"] in ("ok", "failed") and len(p["threads"]) <= LIMITS.threads
    for t in p["threads"]:
        assert isinstance(t["tid"], int) and len(t["frames"]) <= LIMITS.frames
        for f in t["frames"]:
            assert all(v is None or isinstance(v, str) and len(v) <= 48 for v in (f["file"], f["function"]))
        pyframes.traceback_lines(t)
