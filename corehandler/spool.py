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
import time
from dataclasses import dataclass
from pathlib import Path

from corehandler import boundedjson
from corehandler.atomicfile import write_atomic
from corehandler.errors import CorehandlerError

log = logging.getLogger(__name__)

RECORD_SCHEMA = 1
RATE_DIR = ".rate"
RATE_WINDOW_SEC = 60
# csplice counts socket peers it refused (not a task being dumped: nothing else is stored for them) here.
REFUSED_FILE = ".refused"
# csplice counts the crashes it shed past their user's budget here, a "<uid> <count>" line per user (uid -1: the
# users past its 64 lines, and crashes without a uid).
SHED_FILE = ".shed"
_SHED_BYTES = 64 * 48
# csplice creates .tmp.<id>.core and only then takes its lock: a file this young may not be locked yet.
ORPHAN_MIN_AGE_SEC = 5.0
# A .tmp.<id>.json never outlives csplice by more than the time to write it; older ones are leftovers.
STALE_TMP_JSON_SEC = 600.0

# A dump id (docs/design.md, Spool; csplice's spool.c makes them): microseconds, boot id, PID, and a ".N"
# when two crashes of one PID share a microsecond. The Python side's one copy of that grammar.
ID_RE = re.compile(r"^(?P<usec>\d+)-(?P<boot>[0-9a-f]{16})-(?P<pid>\d+)(?:\.\d+)?$")
# A prefix of an id, as a MATCH word may give one. Its microsecond timestamp has 16 digits: 11 or more (more
# than any PID) start an id, and a comm like "2-b" stays a comm.
ID_PREFIX_RE = re.compile(r"\d{11,}(-[0-9a-f]{0,16}(-(\d+(\.\d*)?)?)?)?")


# A record is a few KiB; a 64 KiB argv of high bytes escaped makes ~700 KiB. Past this, it is not csplice's.
MAX_RECORD_BYTES = 16 << 20
_INT, _STR, _DICT, _LIST = (int,), (str,), (dict,), (list,)
# The JSON types of the fields the Python side reads (docs/design.md, schema 1); null is always allowed.
_SHAPE = {"schema": _INT, "id": _STR, "core": _STR, "pid": _INT, "tid": _INT, "uid": _INT, "gid": _INT,
          "signal": _INT, "timestamp": _INT, "dumpable": _INT, "rlimit_core": _STR, "hostname": _STR,
          "comm": _STR, "boot_id": _STR, "specifiers": _DICT, "proc": _DICT, "capture": _DICT, "handler": _DICT,
          "errors": _LIST}
_PROC_SHAPE = {"exe": _STR, "comm": _STR, "status": _STR, "cgroup": _STR, "cmdline": _LIST, "environ": _LIST,
               "maps": _STR, "ns": _DICT, "container": _DICT, "userns_owner": _INT,
               "truncated": _LIST}
_CAPTURE_SHAPE = {"socket": _DICT, "truncated_reason": _STR, "dropped_reason": _STR, "error": _STR}


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


def misshapen(record: dict) -> str | None:
    """The first field whose JSON type is not what schema 1 gives it (each reader relies on these), or None."""
    for where, obj, shape in (("record", record, _SHAPE), ("proc", record.get("proc"), _PROC_SHAPE),
                              ("capture", record.get("capture"), _CAPTURE_SHAPE)):
        if not isinstance(obj, dict):
            continue
        for key, types in shape.items():
            value = obj.get(key)
            if value is None:
                continue
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                return f"{where}.{key} is a JSON {type(value).__name__}, not {'/'.join(t.__name__ for t in types)}"
            if types is _INT and not -2**63 <= value < 2**63:  # the index's INTEGER
                return f"{where}.{key} is out of range"
    cmdline = (record.get("proc") or {}).get("cmdline") or []
    if not all(isinstance(arg, str) for arg in cmdline):
        return "proc.cmdline holds a value that is not a string"
    if not all(isinstance(err, str) for err in record.get("errors") or []):
        return "errors holds a value that is not a string"
    return None


def read_record(spool_dir: Path, dump_id: str) -> dict:
    """The parsed record. Strings keep invalid UTF-8 bytes as lone surrogates (\\udcXX). Anything else (not
    JSON, nested or sized past the bounds, a field of the wrong type) is a SpoolRecordError."""
    path = record_path(spool_dir, dump_id)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
    except OSError as e:
        raise SpoolRecordError(f"cannot read record {path}: {e}") from e
    try:
        record = boundedjson.loads(data, max_bytes=MAX_RECORD_BYTES)
    except boundedjson.BoundedJSONError as e:
        raise SpoolRecordError(f"cannot read record {path}: {e}") from None
    if not isinstance(record, dict):
        raise SpoolRecordError(f"record {path} is not a JSON object")
    wrong = misshapen(record)
    if wrong:
        raise SpoolRecordError(f"record {path}: {wrong}")
    if record.get("schema") != RECORD_SCHEMA:
        raise SpoolRecordError(f"record {path} has schema {record.get('schema')!r}, expected {RECORD_SCHEMA}")
    if record.get("id") != dump_id:
        raise SpoolRecordError(f"record {path} names id {record.get('id')!r}")
    if isinstance(record.get("proc"), dict):
        # v0.2's copy of a container's whole config.json, process.env and all (store/index.py, schema 6).
        record["proc"].pop("oci_config", None)
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


def stalled_captures(spool_dir: Path, timeout: float, now: float | None = None) -> list[str]:
    """Ids of captures still in progress (a .tmp.<id>.core its csplice holds locked) for longer than timeout
    seconds since the crash: csplice's alarm did not end them (a read of the process's memory stalled on a FUSE
    file, say), and each may hold a core_pipe_limit slot. None when timeout is 0 (no timeout)."""
    if timeout <= 0:
        return []
    now = time.time() if now is None else now
    try:
        names = sorted(os.listdir(spool_dir))
    except FileNotFoundError:
        return []
    stalled = []
    for name in names:
        m = ID_RE.match(name[5:-5]) if name.startswith(".tmp.") and name.endswith(".core") else None
        if m and now - int(m["usec"]) / 1e6 > timeout and not _unlocked(spool_dir / name):
            stalled.append(name[5:-5])
    return stalled


def shed_counts(spool_dir: Path) -> dict[int, int]:
    """Crashes csplice shed past their user's budget, per uid; {} when none were (or the file is unreadable)."""
    try:
        with open(spool_dir / SHED_FILE, "rb") as f:
            text = f.read(_SHED_BYTES).decode("ascii", "replace")
    except OSError:
        return {}
    counts: dict[int, int] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0].lstrip("-").isdigit() and words[1].isdigit():
            counts[int(words[0])] = counts.get(int(words[0]), 0) + int(words[1])
    return counts


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
    rewrite_record(spool_dir, record)
    log.warning("Adopted orphaned dump %s: %s", orphan.id, orphan.reason)
    return record


def rewrite_record(spool_dir: Path, record: dict) -> None:
    """Replaces the record of record["id"] in the spool (the daemon's own changes: an orphan adopted, a pod's
    policy applied), atomically."""
    # The temp name is csplice's, so clean_stale_tmp removes what a kill here leaves.
    write_atomic(record_path(spool_dir, record["id"]), json.dumps(record).encode(), 0o600,
                 tmp=spool_dir / f".tmp.{record['id']}.json")


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


