"""The crashed process's last words in the journal: a Rust panic message or a `Fatal Python error` block, which
the process wrote to its stderr (a service's stderr is the journal) just before it died, and which no core holds.

Read by the daemon after the unwinder (unwind.finish), through systemd-python's sd-journal reader: entries of the
crash's boot and uid whose _PID is the crashed process's (systemd connects a service's stdout and stderr from its
main process, so its lines carry that PID), or, for a child process of a unit, whose _SYSTEMD_UNIT or
_SYSTEMD_USER_UNIT is the crash's; only from WINDOW_BEFORE seconds before the crash to WINDOW_AFTER after (the
crash's time is csplice's, a moment after the process's last write). Bounded: at most MAX_ENTRIES entries, MAX_BYTES
of their messages and MAX_SECONDS of reading; the block kept is at most MAX_LINES lines of MAX_LINE characters.
The _UID match keeps another user's lines out however PIDs are reused. The lines are the crashed process's words:
kept raw here, escaped where they are printed (printable.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from corehandler import spool

WINDOW_BEFORE = 10.0
WINDOW_AFTER = 2.0
MAX_ENTRIES = 500
MAX_BYTES = 256 << 10
MAX_SECONDS = 2.0
MAX_LINES = 40
MAX_LINE = 512

RUST, PYTHON = "rust_panic", "python_fatal"
# Rust 1.73 and later: "thread 'main' panicked at src/main.rs:4:5:" and the message on the lines after it (newer
# ones name the thread's id too: "thread 'main' (8200) panicked at ...").
_THREAD = r"^thread '(?P<thread>[^']*)'(?: \(\d+\))? panicked at "
_RUST_NEW = re.compile(_THREAD + r"(?P<where>\S+:\d+:\d+):$")
# Before 1.73: "thread 'main' panicked at 'the message', src/main.rs:4:5" (the message may span lines).
_RUST_OLD = re.compile(_THREAD + r"'(?P<message>.*)$")
_RUST_OLD_END = re.compile(r"^(?P<message>.*)', (?P<where>\S+:\d+:\d+)$")
_RUST_TAIL = ("note: run with `RUST_BACKTRACE", "stack backtrace:", "note: Some details are omitted")
_PYTHON = re.compile(r"^Fatal Python error: (?P<message>.*)$")
_PYTHON_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + "...[cut]"


def _rust(lines: list[str], start: int) -> dict | None:
    first = lines[start]
    m = _RUST_NEW.match(first)
    if m:
        body = []
        for line in lines[start + 1:]:
            if line.startswith(_RUST_TAIL) or _RUST_NEW.match(line) or len(body) >= MAX_LINES:
                break
            body.append(line)
        message = "\n".join(body).strip()
        block = [first, *body]
        return {"kind": RUST, "thread": m["thread"], "where": m["where"], "message": message, "lines": block}
    m = _RUST_OLD.match(first)
    if not m:
        return None
    block, parts = [first], []
    for k, text in enumerate([m["message"], *lines[start + 1:start + MAX_LINES]]):
        if k:
            block.append(text)
        end = _RUST_OLD_END.match(text)
        if end:
            parts.append(end["message"])
            return {"kind": RUST, "thread": m["thread"], "where": end["where"], "message": "\n".join(parts),
                    "lines": block}
        parts.append(text)
    return None


def _python(lines: list[str], start: int) -> dict:
    m = _PYTHON.match(lines[start])
    block = lines[start:start + MAX_LINES]
    frame = next((f for f in map(_PYTHON_FRAME.match, block) if f), None)
    return {"kind": PYTHON, "message": m["message"], "lines": block,
            "where": f"{frame['file']}:{frame['line']}" if frame else None,
            "function": frame["func"] if frame else None}


def find(lines: Iterable[str]) -> dict | None:
    """The last panic or fatal-error block in lines (oldest first), with its summary line; None when none."""
    lines = [_cut(line.rstrip("\n")) for line in lines]
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if line.startswith("thread '") and " panicked at " in line:
            found = _rust(lines, i)
            if found:
                return {**found, "summary": summary(found)}
        elif line.startswith("Fatal Python error: "):
            found = _python(lines, i)
            return {**found, "summary": summary(found)}
    return None


def summary(found: Mapping[str, Any]) -> str:
    """The block as one line for the reason: `Rust panic: MESSAGE (at FILE:L:C, thread 'main')`,
    `Fatal Python error: MESSAGE (in FILE:LINE, FUNCTION)`."""
    if found["kind"] == RUST:
        message = " ".join(found["message"].split("\n")) or "(no message)"
        return f"Rust panic: {message} (at {found['where']}, thread '{found['thread']}')"
    where = f" (in {found['where']}, {found['function']})" if found.get("where") else ""
    return f"Fatal Python error: {found['message']}{where}"


def _crash_time(record: Mapping[str, Any]) -> float | None:
    m = spool.ID_RE.match(str(record.get("id") or ""))
    if m:
        return int(m["usec"]) / 1e6
    ts = record.get("timestamp")
    return float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None


def read_lines(record: Mapping[str, Any], ident: Mapping[str, Any], directory: str | None = None) -> list[str]:
    """The crashed process's journal lines before the crash (see the module's docstring), oldest first; [] when
    the record lacks what the query needs (pid, uid, boot id, time)."""
    from systemd import journal

    pid, uid, boot, when = record.get("pid"), record.get("uid"), record.get("boot_id"), _crash_time(record)
    if not isinstance(pid, int) or not isinstance(uid, int) or not isinstance(boot, str) or when is None:
        return []
    boot = boot.replace("-", "")
    reader = journal.Reader(path=directory) if directory else journal.Reader(flags=journal.LOCAL_ONLY)
    try:
        common = {"_UID": str(uid), "_BOOT_ID": boot}
        reader.add_match(_PID=str(pid), **common)
        unit, user_unit = ident.get("unit"), ident.get("user_unit")
        if user_unit:
            reader.add_disjunction()
            reader.add_match(_SYSTEMD_USER_UNIT=str(user_unit), **common)
        elif unit and unit != "init.scope" and not str(unit).startswith("user@"):
            reader.add_disjunction()
            reader.add_match(_SYSTEMD_UNIT=str(unit), **common)
        reader.seek_realtime(when - WINDOW_BEFORE)
        lines: list[str] = []
        size = 0
        deadline = time.monotonic() + MAX_SECONDS
        for _ in range(MAX_ENTRIES):
            entry = reader.get_next()
            if not entry or entry["__REALTIME_TIMESTAMP"].timestamp() > when + WINDOW_AFTER:
                break
            message = entry.get("MESSAGE")
            if isinstance(message, bytes):
                message = message.decode("utf-8", "surrogateescape")
            if not isinstance(message, str):
                continue
            size += len(message)
            if size > MAX_BYTES or time.monotonic() > deadline:
                break
            lines.append(message)
        return lines
    finally:
        reader.close()


def of_crash(record: Mapping[str, Any], ident: Mapping[str, Any], directory: str | None = None) -> dict | None:
    """The block the crashed process left in the journal, or None."""
    return find(read_lines(record, ident, directory))
