"""The spool record's fields as the daemon reads them: outcome, signal, names, capture figures."""

from __future__ import annotations

import signal as _signal
from collections.abc import Mapping
from typing import Any

# What happened to the dump, from the capture figures: csplice sets exactly one of these per record.
COMPLETE = "complete"

TRUNCATED = "truncated"

DROPPED = "dropped"

# The daemon found the dump without a committed record (csplice died): stored.status == "orphan".
ORPHAN = "orphan"

# A record whose capture section says none of the above (a capture that failed before any byte, a record
# from a future schema).
UNKNOWN = "unknown"


def capture(record: Mapping[str, Any]) -> Mapping[str, Any]:
    value = record.get("capture")
    return value if isinstance(value, Mapping) else {}


def proc(record: Mapping[str, Any]) -> Mapping[str, Any]:
    value = record.get("proc")
    return value if isinstance(value, Mapping) else {}


def outcome(record: Mapping[str, Any], stored: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """(outcome, reason): reason is why a dump was truncated or dropped, "" for the others."""
    if stored and stored.get("status") == "orphan":
        return ORPHAN, ""
    cap = capture(record)
    if cap.get("dropped"):
        return DROPPED, str(cap.get("dropped_reason") or UNKNOWN)
    if cap.get("truncated"):
        return TRUNCATED, str(cap.get("truncated_reason") or UNKNOWN)
    if cap.get("complete"):
        return COMPLETE, ""
    return UNKNOWN, ""


def socket_rejected(record: Mapping[str, Any]) -> bool:
    """True when csplice refused the dump over the coredump socket, so the kernel never wrote it."""
    sock = capture(record).get("socket")
    return isinstance(sock, Mapping) and sock.get("rejected") is True


def signal_number(record: Mapping[str, Any]) -> int | None:
    value = record.get("signal")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def signal_name(number: int | None) -> str | None:
    """SIGSEGV for 11; the number as text for signals Python does not name; None when unknown."""
    if number is None:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return str(number)


def exe(record: Mapping[str, Any]) -> str | None:
    """The crashed executable's path from /proc, else the kernel's comm (the best name left)."""
    value = proc(record).get("exe")
    if isinstance(value, str) and value:
        return value
    return comm(record)


def comm(record: Mapping[str, Any]) -> str | None:
    """/proc's comm first: the kernel's %e shows a '/' in the name as '!'."""
    for value in (proc(record).get("comm"), record.get("comm")):
        if isinstance(value, str) and value:
            return value
    return None


def cmdline(record: Mapping[str, Any]) -> list[str] | None:
    value = proc(record).get("cmdline")
    if isinstance(value, list) and all(isinstance(arg, str) for arg in value):
        return value
    return None


def number(mapping: Mapping[str, Any], key: str) -> float | None:
    """A numeric field as a float; None when absent, null, boolean or not a number."""
    value = mapping.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def capture_seconds(record: Mapping[str, Any]) -> float | None:
    ns = number(capture(record), "ns")
    return None if ns is None else ns / 1e9


def dump_bytes(record: Mapping[str, Any]) -> float | None:
    """Bytes the kernel wrote into the pipe: kept plus drained past a limit."""
    cap = capture(record)
    kept, drained = number(cap, "bytes"), number(cap, "drained_bytes")
    if kept is None and drained is None:
        return None
    return (kept or 0.0) + (drained or 0.0)


def hold_seconds(record: Mapping[str, Any]) -> float | None:
    """How long csplice held the crashed process: from handler start to capture end.

    The kernel releases the process when the pipe is drained, i.e. at capture end. Schema 1 records carry the
    handler's start (handler.started_realtime_ns) and the copy's duration (capture.ns) but not the capture's end;
    when a record has capture.ended_realtime_ns the exact span is used, otherwise the copy's duration, which
    leaves out csplice's start-up and metadata phase (about a millisecond).
    """
    handler = record.get("handler")
    started = number(handler, "started_realtime_ns") if isinstance(handler, Mapping) else None
    ended = number(capture(record), "ended_realtime_ns")
    if started is not None and ended is not None and ended >= started:
        return (ended - started) / 1e9
    return capture_seconds(record)

