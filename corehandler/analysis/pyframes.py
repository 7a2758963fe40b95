"""The Python frames of a CPython crash (docs/analysis.md, "Python frames"): per thread the Python stack (file,
line, function), which thread held the GIL and which crashed, read from the full raw core by bloomberg's
pystack, kept in the analysis result (`python`), so the index still has them once retention deleted the
full core (a mini core cannot give them: the frames live on the heap).

When: after the unwinder, in the same analysis job, for a dump whose process ran CPython: its exe exports
CPython's symbols (`_PyRuntime`, `Py_Initialize`: read by the jail as it vets the exe), or a libpython is among
its mapped files, or its exe is called pythonX[.Y] (a venv's python is the interpreter it links to, a
shebang script's process is its interpreter). The comm is never asked: the process chooses it.

How: in the analysis jail (jail.py), exactly as the unwinder: the core's mapped files vetted as the crashing
user (the interpreter and libpython among them, at their own paths, O_NOFOLLOW), its own uid, PID namespace,
no capabilities, seccomp, RLIMIT_AS/CPU/FSIZE and the [analysis] timeout, counted from its own start. The
program is this interpreter (`python -I -S`) running pyreader.py, which imports pystack from the daemon's
site-packages, bound read-only into the view with the script (nothing else of that directory). Its output is
one bounded JSON object, checked here as hostile input (parse). Absent pystack, a refused or replaced
interpreter, a timeout or a pystack error are a problem string of the analysis, never a stopped ingest.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from corehandler import boundedjson, elfcore, fields, steps
from corehandler.analysis import account, findings, jail, signature, unwind
from corehandler.analysis.findings import Limits
from corehandler.printable import display

READER = Path(__file__).with_name("pyreader.py")
# The C functions that run Python frames: one call per "entry" frame (3.11 on, a call runs several frames).
EVAL = frozenset({"_PyEval_EvalFrameDefault", "PyEval_EvalFrameEx", "_PyEval_EvalFrame", "PyEval_EvalFrame"})
_LIBPYTHON = re.compile(r"^libpython\d+\.\d+[a-z]*\.so")
_PYTHON_EXE = re.compile(r"^python\d+(?:\.\d+)?[a-z]*$")
OK, FAILED, TIMEOUT, UNAVAILABLE = "ok", "failed", "timeout", "unavailable"
CORE_MAPPINGS = 2  # times the core's size added to pystack's address space (read() says why)
MINI_ONLY = "not read (only the mini core is left, and Python frames live on the heap, which only the full core held)"


def is_cpython(result: Mapping[str, Any]) -> bool:
    """Whether the crashed process ran CPython: its exe has CPython's symbols, a libpython is mapped, or the
    exe (the interpreter a venv links to, a shebang script's interpreter) is named pythonX[.Y]."""
    exe = result.get("exe") or {}
    if exe.get("python") is True:
        return True
    if any(_LIBPYTHON.match(os.path.basename(str(m.get("name") or ""))) for m in result.get("modules") or []):
        return True
    path = str(exe.get("path") or "").removesuffix(" (deleted)")
    return bool(_PYTHON_EXE.match(os.path.basename(path)))


def pystack_files() -> tuple[str, list[str]] | None:
    """(the directory holding the `pystack` package, what the jail binds of it), None when it is not
    installed. Found without importing it: the daemon never loads pystack."""
    try:
        spec = importlib.util.find_spec("pystack")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(list(spec.submodule_search_locations)[0])
    libs = package.parent / "pystack.libs"  # the wheel's own libdw, libelf, libzstd ($ORIGIN/../pystack.libs)
    return str(package.parent), [str(package)] + ([str(libs)] if libs.is_dir() else [])


def _outcome(state: str, problem: str | None = None, **more) -> dict:
    return {"state": state, "version": None, "seconds": 0.0, "problems": [problem] if problem else [], "cut": [],
            "threads": [], "threads_seen": 0, "reader": "pystack", **more}


def _interpreter(result: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the exe pystack is given, or None with why not): the file the process ran, as the jail found it."""
    exe = result.get("exe") or {}
    path, state = exe.get("path"), exe.get("state")
    if not isinstance(path, str) or not path:
        return None, "the executable's path is not known"
    if state == "deleted" or path.endswith(" (deleted)"):
        return None, f"the interpreter {path} is gone since the crash"
    if state == "unreadable":
        return None, f"the interpreter {path} is {jail.UNSEEN}"
    if state == "replaced":
        return None, f"the interpreter {path} was replaced since the crash (another build-id)"
    return path, None


def read(core: Path, record: dict, result: Mapping[str, Any], limits: Limits = Limits(),
         started: Callable[[unwind.Running], None] | None = None) -> dict | None:
    """The `python` of an analysis result: None for a process that did not run CPython; else pystack's
    reading of the raw core in the jail, or why there is none. started(run): told of the jailed child, which
    unwind.interrupt(run) ends early (the daemon stopping)."""
    if not is_cpython(result):
        return None
    exe, why = _interpreter(result)
    if exe is None:
        return _outcome(FAILED, why)
    found = pystack_files()
    if found is None:
        return _outcome(UNAVAILABLE, "pystack is not installed (the package's optional extra: docs/analysis.md, "
                                     "\"Python frames\")")
    site, binds = found
    # pystack maps the core file (libelf, and libdwfl again: measured, it needs about twice the core's size of
    # address space beyond its own); those pages are the page cache's, not memory of its own, so its
    # RLIMIT_AS is max_memory plus that.
    jailed = dataclasses.replace(limits, memory_bytes=limits.memory_bytes + CORE_MAPPINGS * os.stat(core).st_size)
    run = unwind.Running(Path(core), record, jailed, time.monotonic())
    if os.geteuid() == 0:
        run.user = account.lookup()
        if run.user is None:
            return _outcome(UNAVAILABLE, f"no user {account.NAME} to run pystack as")
    python = os.path.realpath(sys.executable)
    argv = [python, "-I", "-S", str(READER), site, "", exe, str(limits.threads), str(limits.frames),
            str(limits.line_chars)]
    try:
        files = elfcore.inspect_core(run.core).files
        unwind.open_core(run)
        argv[5] = unwind.core_path(run)
        run.report = unwind.memfd("corehandler-pyframes-report")
        run.stack = unwind.spawn(run, argv, files, binds=(python, str(READER), *binds))
    except OSError as e:
        unwind.cancel(run)
        return _outcome(FAILED, f"cannot start pystack: {e.strerror}")
    if started is not None:
        started(run)
    timed_out = not unwind.wait_child(run.stack, run.started + limits.timeout)
    ended = run.stack.ended or time.monotonic()
    run.stack.stdout.seek(0)
    raw = run.stack.stdout.read(limits.output_bytes + 1)
    run.stack.stderr.seek(0)
    err = run.stack.stderr.read(4096).decode("utf-8", "replace").strip().splitlines()
    report = unwind.jail_report(run)
    died = unwind.exit_problem("pystack", run.stack)
    unwind.cancel(run)
    if timed_out:
        out = _outcome(TIMEOUT, f"pystack killed at the {limits.timeout:g} s timeout")
    elif report.get("error"):
        out = _outcome(FAILED, f"pystack not started: {report['error']}")
    elif died:
        out = _outcome(FAILED, died + (f": {err[-1][:limits.line_chars]}" if err else ""))
    else:
        out = parse(raw, result.get("crashing_tid"), limits)
    out["seconds"] = round(ended - run.started, 6)
    out["sandbox"] = report.get("applied") or []
    return out


def _text(value, limit: int) -> str | None:
    if not isinstance(value, str):
        return None
    return value[:limit] + ("...[cut]" if len(value) > limit else "")


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(raw: bytes, crashing_tid: int | None, limits: Limits = Limits()) -> dict:
    """pyreader's JSON as the `python` result: every field checked for its type, threads, frames and strings
    cut to the limits again (the output is the jailed reader's, as hostile as the core it read). The crashing
    thread (crashing_tid, the unwinder's) first."""
    try:
        data = boundedjson.loads(raw, max_bytes=limits.output_bytes, max_depth=8)
    except (boundedjson.BoundedJSONError, ValueError) as e:
        return _outcome(FAILED, f"pystack's output is not bounded JSON: {str(e)[:200]}")
    return checked(data, crashing_tid, limits)


def checked(data: Any, crashing_tid: int | None, limits: Limits = Limits()) -> dict:
    """The `python` result of what pyreader wrote (or what a sidecar, another host's word, says it read), each
    field of its type or left out, cut to the limits."""
    if not isinstance(data, dict):
        return _outcome(FAILED, "pystack's output is not a JSON object")
    if data.get("error"):
        return _outcome(FAILED, f"pystack: {_text(data['error'], limits.line_chars)}")
    threads, cut = [], []
    listed = data.get("threads") if isinstance(data.get("threads"), list) else []
    for t in listed[:limits.threads]:
        if not isinstance(t, dict) or _int(t.get("tid")) is None:
            continue
        frames = []
        for f in (t.get("frames") if isinstance(t.get("frames"), list) else [])[:limits.frames]:
            if isinstance(f, dict):
                frames.append({"file": _text(f.get("file"), limits.line_chars), "line": _int(f.get("line")),
                               "function": _text(f.get("function"), limits.line_chars),
                               "entry": f.get("entry") is True})
        seen = _int(t.get("frames_seen"))
        threads.append({"tid": t["tid"], "crashing": t["tid"] == crashing_tid, "gil": t.get("gil") is True,
                        "gc": t.get("gc") is True, "name": _text(t.get("name"), limits.line_chars),
                        "frames": frames, "frames_cut": seen is not None and seen > len(frames)})
    threads.sort(key=lambda t: not t["crashing"])
    seen = _int(data.get("threads_seen")) or len(threads)
    if seen > len(threads):
        cut.append(f"Python threads: {len(threads)} of {seen} kept")
    if any(t["frames_cut"] for t in threads):
        cut.append(f"Python frames: at most {limits.frames} per thread kept (the innermost)")
    version = data.get("version")
    out = _outcome(OK if any(t["frames"] for t in threads) else FAILED,
                   None if any(t["frames"] for t in threads) else "pystack found no Python frame in any thread",
                   cut=cut, threads=threads, threads_seen=seen)
    out["version"] = version if isinstance(version, str) and re.fullmatch(r"\d{1,2}\.\d{1,3}", version) else None
    return out


def crashing(result: Mapping[str, Any]) -> dict | None:
    """The crashing thread's Python stack, if it ran Python when it crashed."""
    py = result.get("python") or {}
    return next((t for t in py.get("threads") or [] if t.get("crashing") and t.get("frames")), None)


def rekey(result: dict, record: Mapping[str, Any]) -> None:
    """The signature given the crashing thread's Python frames (signature.py, rule 9); the exact key, the
    native frames' alone, stays."""
    py, threads = crashing(result), result.get("threads") or []
    frames = threads[0].get("frames") if threads and threads[0].get("crashing") else None
    if not frames or not result.get("signature"):
        return
    exe = (result.get("exe") or {}).get("path") or fields.comm(record)
    sig = fields.signal_number(record)
    text = signature.signature(exe, fields.signal_name(sig), frames, python=py["frames"] if py else ())
    result.update(signature=text, signature_id=signature.signature_id(text))


def add(result: dict, core: Path, record: dict, limits: Limits = Limits(),
        started: Callable[[unwind.Running], None] | None = None) -> None:
    """Reads the Python frames of a CPython crash into result (`python`), its problems into the result's, and
    gives it its Python signature. Never raises: whatever fails is a problem string."""
    problems: list[str] = []
    py = steps.run("Python frames", problems, read, core, record, result, limits, started)
    if py is None and problems:
        py = _outcome(FAILED, problems[0])
    if py is None:
        return
    result["python"] = py
    if py["state"] != OK:
        result.setdefault("problems", []).append(f"Python frames not read: {'; '.join(py['problems'][:2])}")
        if result.get("state") == findings.OK:
            result["state"] = findings.PARTIAL
    rekey(result, record)


def carry_over(before: Mapping[str, Any] | None, result: dict, record: Mapping[str, Any]) -> None:
    """An analysis done again from the mini core (re-symbolising, `analyze`) keeps the Python frames the first
    one read from the full core, and its signature takes them again; one done from the full core keeps its
    own unless they failed where the first's did not."""
    old = (before or {}).get("python")
    new = result.get("python")
    if isinstance(old, dict) and (not isinstance(new, dict) or old.get("state") == OK != new.get("state")):
        result["python"] = old
        rekey(result, record)


# -- how they read (info, the journal) -------------------------------------------------------------------------

def frame_line(f: Mapping[str, Any]) -> str:
    """A Python frame as Python's traceback writes it; the file and function are the crashed program's:
    escaped (printable.py)."""
    line = f" line {f['line']}," if isinstance(f.get("line"), int) else ""
    return f'File "{display(f.get("file") or "?")}",{line} in {display(f.get("function") or "?")}'


def _is_eval(frame: Mapping[str, Any]) -> bool:
    return signature.normalise_function(frame.get("function") or "") in EVAL


def _groups(frames: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The Python frames (innermost first) in the eval calls that ran them: each call ends at an entry frame
    (3.11 on); before 3.11 every frame is its own call."""
    groups: list[list[Mapping[str, Any]]] = [[]]
    entries = any(f.get("entry") for f in frames)
    for f in frames:
        groups[-1].append(f)
        if f.get("entry") or not entries:
            groups.append([])
    return [g for g in groups if g]


def thread_lines(native: Mapping[str, Any], py: Mapping[str, Any] | None) -> list[str]:
    """A thread's trace, its Python frames under the eval frames that ran them, as a developer reads a mixed
    stack; where the native frames do not show the eval calls (stripped, cut) the Python stack follows."""
    lines = findings.thread_lines(native)
    if not py or not py.get("frames"):
        return lines
    groups = _groups(py["frames"])
    evals = sum(_is_eval(f) for f in native.get("frames") or [])
    if not evals:
        return lines + traceback_lines(py)
    out, rest = [lines[0]], groups
    for f, text in zip(native.get("frames") or [], lines[1:]):
        out.append(text)
        if _is_eval(f) and rest:
            out += [f"    {frame_line(p)}" for p in rest[0]]
            rest = rest[1:]
    out += lines[1 + len(native.get("frames") or []):]
    if rest:
        out.append("    (Python frames below the native ones shown:)")
        out += [f"    {frame_line(p)}" for g in rest for p in g]
    return out


def _marks(t: Mapping[str, Any]) -> str:
    marks = [m for m, on in (("crashing", t.get("crashing")), ("held the GIL", t.get("gil")),
                             ("collecting garbage", t.get("gc"))) if on]
    name = f" \"{display(t['name'])}\"" if t.get("name") else ""
    return name + (f" ({', '.join(marks)})" if marks else "")


def traceback_lines(t: Mapping[str, Any]) -> list[str]:
    """A Python thread as Python prints a traceback: most recent call last."""
    out = [f"Python traceback of thread {t['tid']}{_marks(t)}, most recent call last:"]
    out += [f"  {frame_line(f)}" for f in reversed(t.get("frames") or [])]
    if t.get("frames_cut"):
        out.insert(1, "  ... (outer frames cut)")
    return out


def python_of(result: Mapping[str, Any], tid: int | None) -> dict | None:
    return next((t for t in (result.get("python") or {}).get("threads") or [] if t.get("tid") == tid), None)


def summary(result: Mapping[str, Any], full_core: bool | None = None) -> str | None:
    """info's `Python:` line: the version, the threads, who held the GIL; or why there are no frames (only a
    mini core left: it cannot give them). full_core: whether the full core is still stored (None: unknown).
    Unescaped: info prints every value through printable.display."""
    py = result.get("python")
    if not isinstance(py, dict):
        if not is_cpython(result) or result.get("state") in (None, "pending", findings.SKIPPED):
            return None
        if full_core is False:
            return f"CPython, frames {MINI_ONLY}"
        return "CPython, frames not read (`corehandler analyze` reads them from the full core)"
    if py.get("state") != OK:
        why = "; ".join(str(p) for p in py.get("problems") or []) or py.get("state")
        return f"CPython{' ' + py['version'] if py.get('version') else ''}, frames not read: {why}"
    threads = py.get("threads") or []
    gil = next((t["tid"] for t in threads if t.get("gil")), None)
    held = "the crashing thread" if gil is not None and gil == result.get("crashing_tid") else \
        (f"thread {gil}" if gil is not None else "no thread")
    return (f"CPython {py.get('version') or '?'}: {py.get('threads_seen', len(threads))} Python threads, "
            f"{held} held the GIL")
