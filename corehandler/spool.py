"""Reading csplice's spool: committed records, orphans, cleanup (the lock protocol is in docs/design.md), and
the fields of a record as every observer reads them (metrics, journal, CLI).

Records are csplice's schema 1 (docs/design.md) parsed from JSON. Observers must never fail on a record that
lacks a field (an orphan the daemon synthesised, a newer or older csplice), so every field accessor below
tolerates missing or null values and returns None or a neutral value instead of raising.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import signal as _signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corehandler.atomicfile import write_atomic
from corehandler.errors import CorehandlerError

log = logging.getLogger(__name__)

RECORD_SCHEMA = 1
RATE_DIR = ".rate"
RATE_WINDOW_SEC = 60
# csplice counts socket peers it refused (not a task being dumped: nothing else is stored for them) here.
REFUSED_FILE = ".refused"
# csplice creates .tmp.<id>.core and only then takes its lock: a file this young may not be locked yet.
ORPHAN_MIN_AGE_SEC = 5.0
# A .tmp.<id>.json never outlives csplice by more than the time to write it; older ones are leftovers.
STALE_TMP_JSON_SEC = 600.0

ID_RE = re.compile(r"^(?P<usec>\d+)-(?P<boot>[0-9a-f]{16})-(?P<pid>\d+)(?:\.\d+)?$")


class SpoolRecordError(CorehandlerError):
    """A committed record that cannot be read or is not schema 1."""


@dataclass(frozen=True)
class Orphan:
    id: str
    core: Path  # as found: .tmp.<id>.core or <id>.core
    reason: str


def record_path(spool_dir: Path, dump_id: str) -> Path:
    return spool_dir / f"{dump_id}.json"


def core_path(spool_dir: Path, dump_id: str) -> Path:
    return spool_dir / f"{dump_id}.core"


def is_valid_id(dump_id: str) -> bool:
    return bool(ID_RE.match(dump_id))


def committed_ids(spool_dir: Path) -> list[str]:
    """Ids of committed records, oldest first (ids sort by time)."""
    try:
        names = os.listdir(spool_dir)
    except FileNotFoundError:
        return []
    ids = [n[:-5] for n in names if n.endswith(".json") and not n.startswith(".")]
    return sorted(i for i in ids if is_valid_id(i))


def read_record(spool_dir: Path, dump_id: str) -> dict:
    """The parsed record. Strings keep invalid UTF-8 bytes as lone surrogates (\\udcXX)."""
    path = record_path(spool_dir, dump_id)
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise SpoolRecordError(f"cannot read record {path}: {e}") from e
    if not isinstance(record, dict):
        raise SpoolRecordError(f"record {path} is not a JSON object")
    if record.get("schema") != RECORD_SCHEMA:
        raise SpoolRecordError(f"record {path} has schema {record.get('schema')!r}, expected {RECORD_SCHEMA}")
    if record.get("id") != dump_id:
        raise SpoolRecordError(f"record {path} names id {record.get('id')!r}")
    return record


def _unlocked(path: Path) -> bool:
    """True when nobody holds the file's flock (csplice holds it until it exits)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    finally:
        os.close(fd)
    return True


def _old_enough(path: Path, now: float, min_age: float) -> bool:
    try:
        return now - path.stat().st_mtime >= min_age
    except FileNotFoundError:
        return False


def refused_count(spool_dir: Path) -> int:
    """Socket peers csplice refused since the spool was made; 0 when none were (or the count is unreadable)."""
    try:
        text = (spool_dir / REFUSED_FILE).read_text()
    except (OSError, UnicodeDecodeError):
        return 0
    return int(text) if text.strip().isdigit() else 0


def find_orphans(spool_dir: Path, now: float | None = None, min_age: float = ORPHAN_MIN_AGE_SEC) -> list[Orphan]:
    """Cores whose csplice died before committing: an unlocked .tmp.<id>.core, or an unlocked <id>.core
    without <id>.json. Files younger than min_age are left alone (their lock may not be taken yet)."""
    now = time.time() if now is None else now
    try:
        names = set(os.listdir(spool_dir))
    except FileNotFoundError:
        return []
    orphans = []
    for name in sorted(names):
        if name.startswith(".tmp.") and name.endswith(".core"):
            dump_id, reason = name[5:-5], "capture did not finish"
        elif not name.startswith(".") and name.endswith(".core") and f"{name[:-5]}.json" not in names:
            dump_id, reason = name[:-5], "record was not committed"
        else:
            continue
        path = spool_dir / name
        if not is_valid_id(dump_id) or not _old_enough(path, now, min_age) or not _unlocked(path):
            continue
        # The record may have been committed since the listing.
        if record_path(spool_dir, dump_id).exists():
            continue
        orphans.append(Orphan(dump_id, path, reason))
    return orphans


def adopt_orphan(spool_dir: Path, orphan: Orphan) -> dict:
    """Turns an orphan into a committed record (so ingest treats it like any other), and returns it.

    The core is published as <id>.core first, then a record made from what the id and the file tell is
    committed: a kill between the two leaves an <id>.core without record, which is found again next time.
    """
    core = core_path(spool_dir, orphan.id)
    if orphan.core != core:
        os.rename(orphan.core, core)
    m = ID_RE.match(orphan.id)
    assert m, orphan.id
    size = core.stat().st_size
    message = f"csplice did not commit this dump ({orphan.reason}); found by the daemon"
    record = {
        "schema": RECORD_SCHEMA, "id": orphan.id, "core": core.name,
        "specifiers": {}, "pid": int(m["pid"]), "tid": None, "uid": None, "gid": None, "signal": None,
        "timestamp": int(m["usec"]) // 1_000_000, "dumpable": None, "rlimit_core": None, "hostname": None,
        "comm": None, "boot_id": None, "boot_id_prefix": m["boot"], "orphan": True,
        "proc": {"available": False},
        "capture": {"bytes": size, "complete": False, "truncated": True, "truncated_reason": "orphan",
                    "dropped": False, "dropped_reason": None},
        "errors": [message],
    }
    # The temp name is csplice's, so clean_stale_tmp removes what a kill here leaves.
    write_atomic(record_path(spool_dir, orphan.id), json.dumps(record).encode(), 0o600,
                 tmp=spool_dir / f".tmp.{orphan.id}.json")
    log.warning("Adopted orphaned dump %s: %s", orphan.id, orphan.reason)
    return record


def remove_record(spool_dir: Path, dump_id: str) -> None:
    """Deletes a record's files after ingest: the core first, so a kill in between never leaves a core
    without its record (which would look like an orphan and be ingested twice)."""
    core_path(spool_dir, dump_id).unlink(missing_ok=True)
    record_path(spool_dir, dump_id).unlink(missing_ok=True)


def clean_stale_tmp(spool_dir: Path, now: float | None = None, max_age: float = STALE_TMP_JSON_SEC) -> list[Path]:
    """Removes .tmp.<id>.json files left by a csplice that died while writing its record."""
    now = time.time() if now is None else now
    removed = []
    try:
        names = os.listdir(spool_dir)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(".tmp.") and name.endswith(".json"):
            path = spool_dir / name
            if _old_enough(path, now, max_age):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def clean_rate(spool_dir: Path, now: float | None = None) -> int:
    """Removes .rate counters whose window ended more than a minute ago; returns how many."""
    now = time.time() if now is None else now
    rate_dir = spool_dir / RATE_DIR
    removed = 0
    try:
        names = os.listdir(rate_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        path = rate_dir / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            # csplice updates a counter under this lock; never remove one it is using.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fields = os.pread(fd, 64, 0).split()
            window = int(fields[0]) if fields else 0
            if now - window >= RATE_WINDOW_SEC:
                os.unlink(path)
                removed += 1
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
    return removed


# --- a record's fields ----------------------------------------------------------------------------------

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
