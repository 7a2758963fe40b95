"""journald entries for dumps, retention deletions and errors: a daemon observer (docs/design.md).

Find them with `journalctl MESSAGE_ID=<id>`:
  fc2e22bc6ee647b6b90729ab34a250b1  a dump in its final state, one per dump: systemd-coredump's own id
                                    (SD_MESSAGE_COREDUMP) with the COREDUMP_* fields it writes, so that
                                    coredumpctl (list, info, dump, debug: it reads the stored .zst through
                                    COREDUMP_FILENAME), journal shippers and anything keyed on systemd's
                                    coredump entries see corehandler's dumps as they saw systemd-coredump's;
                                    SYSLOG_IDENTIFIER=corehandler tells the two apart. For a dump whose core
                                    is stored after it is listed, this is the second entry, once the core is
                                    stored and verified and its analysis done: it carries the trace, so
                                    coredumpctl shows one entry per dump, complete (PRIORITY 6: the first one
                                    was the crash's alarm)
  7a7dd158d6224178bebec48e1516b612  a dump listed while its core is being stored and analysed
                                    (COREHANDLER_STATUS=compressing, COREHANDLER_ANALYSIS=pending), as soon as
                                    it is indexed: the record's fields, without COREDUMP_FILENAME,
                                    COREHANDLER_STORED_BYTES and the trace, which the entry above has; the
                                    analysis runs off the ingest thread (ingest.py), and one slow dump's does
                                    not hold up the alarm of the next (COREHANDLER_ID is the id `corehandler
                                    list` shows; a kill just before the row's commit repeats an entry, daemon.py)
  240de2af0a3e441c8602d0269540ea6c  retention removed a dump
  a219c89f8f754bd9b672a00dd7c65b78  a daemon error

Entries go to journald through systemd-python's journal.send (sd_journal_sendv(3)): it picks the native
protocol's binary framing for values holding a newline and passes an entry too large for a datagram in a
sealed memfd. It always sends to /run/systemd/journal/socket.

Every value the crashing process (or its container, cgroup or symbols) chose is escaped by printable.display, in
MESSAGE and in each field: coredumpctl and `journalctl -o verbose` print fields as they are, so a comm or exe
holding a terminal escape or a newline would reach the admin's terminal. systemd-coredump escapes the comm
(cellescape) and quotes the command line (PROCESS_CMDLINE_QUOTE_POSIX) but leaves exe and hostname raw; here
all are escaped, the command line as shell words of escaped arguments. The raw bytes stay in the record.

When journald is absent (no socket), stale (a socket nobody listens on: ECONNREFUSED), stuck (its socket's
queue stays full for `send_timeout`) or refuses the entry for any other reason, the entry is written as one
line to stderr, `<priority>MESSAGE {fields as JSON}`, and journald is tried again after `retry_seconds`;
entries written to stderr are not replayed into the journal later.
"""

from __future__ import annotations

import errno
import json
import logging
import select
import shlex
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from systemd import journal

from corehandler import fields, nocore
from corehandler.analysis import pyframes
from corehandler.observer import Quiet
from corehandler.printable import display
from corehandler.store.dumprow import COMPRESSING

log = logging.getLogger(__name__)

# Where sd_journal_sendv always sends; not a parameter because libsystemd offers none.
SOCKET = "/run/systemd/journal/socket"
# systemd's SD_MESSAGE_COREDUMP (sd-messages.h): coredumpctl lists the entries that carry it.
MESSAGE_ID_COREDUMP = "fc2e22bc6ee647b6b90729ab34a250b1"
MESSAGE_ID_LISTED = "7a7dd158d6224178bebec48e1516b612"
MESSAGE_ID_DELETED = "240de2af0a3e441c8602d0269540ea6c"
MESSAGE_ID_ERROR = "a219c89f8f754bd9b672a00dd7c65b78"
SYSLOG_IDENTIFIER = "corehandler"

# syslog priorities. A crash is critical, as systemd-coredump logs it, so alerting on PRIORITY keeps working.
PRIORITY_CRIT, PRIORITY_ERR, PRIORITY_INFO = 2, 3, 6

Fields = dict[str, str]


def check_journald(timeout: float) -> None:
    """Raises OSError unless journald listens on SOCKET and has room for an entry within `timeout` seconds.

    journal.send cannot be trusted to say so: sd_journal_sendv reports success when the socket is missing (the
    entry is lost), and blocks, holding the GIL, while journald does not read (its queue of
    net.unix.max_dgram_qlen datagrams is full). A socket connected to journald's, which sends nothing, tells
    both: connect fails when it is absent or stale, and it polls writable only while the queue has room.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as probe:
        probe.connect(SOCKET)
        if not select.select([], [probe], [], timeout)[1]:
            raise TimeoutError(errno.ETIMEDOUT, f"journald took no entry in {timeout:g} s")


def send_to_journald(fields: Mapping[str, str], timeout: float) -> None:
    """Sends one entry with journal.send; raises OSError when journald cannot take it."""
    check_journald(timeout)
    # Record strings carry undecodable bytes as lone surrogates: sent as bytes they are the original bytes.
    values = {key: value.encode("utf-8", "surrogateescape") for key, value in fields.items()
              if key not in ("MESSAGE", "MESSAGE_ID")}
    message = fields.get("MESSAGE", "").encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    journal.send(message, MESSAGE_ID=fields.get("MESSAGE_ID"), **values)


class JournalObserver(Quiet):
    """Writes one journal entry per event; never raises from an event."""

    def __init__(self, *, retry_seconds: float = 30.0, send_timeout: float = 2.0,
                 stderr: TextIO | None = None) -> None:
        self.retry_seconds = retry_seconds
        self.send_timeout = send_timeout
        self.stderr = stderr
        # When journald last failed; None while it works.
        self.down_since: float | None = None

    # Daemon events

    def on_ingested(self, record: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        self._safely(dump_entry, record, stored)

    def on_stored(self, record: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        self._safely(stored_entry, record, stored)

    def on_deleted(self, dump_id: str, exe: str | None, rule: str, freed_bytes: int) -> None:
        self._safely(deleted_entry, dump_id, exe, rule, freed_bytes)

    def on_error(self, kind: str, message: str, dump_id: str | None) -> None:
        self._safely(error_entry, kind, message, dump_id)

    def on_state(self, backlog: int, store_bytes: int, store_count: int) -> None:
        pass

    def close(self) -> None:
        pass

    # Sending

    def send(self, fields: Fields) -> bool:
        """Sends an entry to journald, or to stderr when journald is unavailable. True if journald took it."""
        now = time.monotonic()
        if self.down_since is not None and now - self.down_since < self.retry_seconds:
            self._to_stderr(fields)
            return False
        try:
            send_to_journald(fields, self.send_timeout)
        except OSError as err:
            if self.down_since is None:
                self._note(f"journald unavailable at {SOCKET} ({err.strerror or err}); writing entries to "
                           f"stderr, retrying every {self.retry_seconds:g} s")
            self.down_since = now
            self._to_stderr(fields)
            return False
        if self.down_since is not None:
            self.down_since = None
            self._note("journald is back")
        return True

    def _to_stderr(self, fields: Fields) -> None:
        rest = {k: v for k, v in fields.items() if k not in ("MESSAGE", "PRIORITY")}
        message = fields.get("MESSAGE", "").replace("\n", "\\n")
        line = f"<{fields.get('PRIORITY', PRIORITY_INFO)}>{message} {json.dumps(rest)}\n"
        self._write_stderr(line)

    def _note(self, text: str) -> None:
        self._write_stderr(f"<{PRIORITY_ERR}>corehandler: {text}\n")

    def _write_stderr(self, line: str) -> None:
        stream = self.stderr or sys.stderr
        try:
            stream.write(line.encode("utf-8", "backslashreplace").decode("utf-8"))
            stream.flush()
        except (OSError, ValueError):  # stderr closed too: nowhere left to say it
            pass

    def _safely(self, build: Callable[..., Fields], *args: Any) -> None:
        try:
            self.send(build(*args))
        except Exception as err:
            log.warning("journal: %s failed, ignoring: %s", build.__name__, err, exc_info=err)


# Entries

def _put(fields: Fields, key: str, value: Any) -> None:
    """Adds a field unless the value is unknown; numbers and booleans in the journal's usual spelling, text
    escaped (printable.py): it may be the crashing process's."""
    if value is None:
        return
    if isinstance(value, bool):
        fields[key] = "1" if value else "0"
    elif isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        fields[key] = str(int(value))
    else:
        fields[key] = display(value)


def _put_lines(fields: Fields, key: str, lines: Any) -> None:
    """A field of one line per item, each escaped."""
    if isinstance(lines, list) and lines:
        fields[key] = "\n".join(display(line) for line in lines)


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.9f}"


def _mib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**20:.1f} MiB"


def dump_entry(record: Mapping[str, Any], stored: Mapping[str, Any]) -> Fields:
    cap = fields.capture(record)
    outcome, reason = fields.outcome(record, stored)
    number = fields.signal_number(record)
    name = fields.signal_name(number)
    comm, exe = fields.comm(record), fields.exe(record)
    argv = fields.cmdline(record)
    seconds = fields.capture_seconds(record)
    throughput = fields.number(cap, "throughput_bytes_per_second")
    timestamp = fields.number(record, "timestamp")

    final = stored.get("status") != COMPRESSING
    f: Fields = {"MESSAGE_ID": MESSAGE_ID_COREDUMP if final else MESSAGE_ID_LISTED,
                 "PRIORITY": str(PRIORITY_CRIT), "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER}
    # What the record does not say is "unknown" (an orphan's record knows only its pid), never "None";
    # the process's name is escaped (printable.py): a comm may hold a newline or a terminal escape.
    pid, uid = record.get("pid"), record.get("uid")
    what = (f"Process {'unknown' if pid is None else pid} ({display(comm) or 'unknown'}) of user "
            f"{'unknown' if uid is None else uid} ")
    on = name or "an unknown signal"
    if outcome == fields.ORPHAN:
        what += f"dumped core on {on}, found without its record ({_mib(fields.number(cap, 'bytes'))})"
    elif outcome == fields.DROPPED:
        what += f"crashed on {on}; dump dropped ({reason}), metadata kept"
    elif outcome == fields.TRUNCATED:
        what += (f"dumped core on {on}; truncated ({reason}) at {_mib(fields.number(cap, 'bytes'))} "
                 f"of {_mib(fields.dump_bytes(record))}")
    else:
        what += f"dumped core on {on}: {_mib(fields.dump_bytes(record))}"
    if seconds and throughput:
        what += f", captured in {seconds:.3f} s ({throughput / 2**20:.0f} MiB/s)"
    if stored.get("path"):
        what += f", stored as {stored['path']}"
    elif stored.get("status") == COMPRESSING:
        what += ", being compressed into the store"
    missing = nocore.line(record)
    if missing:  # the record's words only (a unit's name is escaped)
        what += f"\n\n{display(missing)}"
        _put(f, "COREHANDLER_NO_CORE", missing)
    f["MESSAGE"] = what
    _put(f, "COREDUMP_PID", record.get("pid"))
    _put(f, "COREDUMP_TID", record.get("tid"))
    _put(f, "COREDUMP_UID", record.get("uid"))
    _put(f, "COREDUMP_GID", record.get("gid"))
    _put(f, "COREDUMP_SIGNAL", number)
    _put(f, "COREDUMP_SIGNAL_NAME", name)
    _put(f, "COREDUMP_EXE", exe)
    _put(f, "COREDUMP_COMM", comm)
    # Shell words, as systemd-coredump writes it (quoted), each escaped; the record keeps the exact argv.
    if argv is not None:
        f["COREDUMP_CMDLINE"] = " ".join(shlex.quote(display(arg)) for arg in argv)
    _put(f, "COREDUMP_HOSTNAME", record.get("hostname"))
    # µs since the Epoch, as systemd-coredump's field of the same name.
    _put(f, "COREDUMP_TIMESTAMP", None if timestamp is None else int(timestamp) * 1_000_000)
    _put(f, "COREDUMP_RLIMIT", record.get("rlimit_core"))
    _put(f, "COREDUMP_TRUNCATED", outcome == fields.TRUNCATED)
    _put(f, "COREDUMP_FILENAME", stored.get("path"))
    _put(f, "COREHANDLER_ID", stored.get("id") or record.get("id"))
    _put(f, "COREHANDLER_OUTCOME", outcome)
    _put(f, "COREHANDLER_TRUNCATED_REASON", reason if outcome == fields.TRUNCATED else None)
    _put(f, "COREHANDLER_DROPPED", outcome == fields.DROPPED)
    _put(f, "COREHANDLER_DROPPED_REASON", reason if outcome == fields.DROPPED else None)
    _put(f, "COREHANDLER_STATUS", stored.get("status"))
    _put(f, "COREHANDLER_PROBLEM", stored.get("problem"))
    _put(f, "COREHANDLER_CAPTURE_ERROR", cap.get("error"))
    _put(f, "COREHANDLER_DUMP_BYTES", fields.dump_bytes(record))
    _put(f, "COREHANDLER_RAW_BYTES", cap.get("bytes"))
    _put(f, "COREHANDLER_DRAINED_BYTES", cap.get("drained_bytes"))
    _put(f, "COREHANDLER_CAPTURE_SECONDS", _seconds(seconds))
    _put(f, "COREHANDLER_THROUGHPUT_BYTES_PER_SECOND", None if throughput is None else round(throughput))
    _put(f, "COREHANDLER_HOLD_SECONDS", _seconds(fields.hold_seconds(record)))
    _put(f, "COREHANDLER_STRATEGY", cap.get("strategy"))
    _stored_fields(f, stored)
    _put_lines(f, "COREHANDLER_RECORD_ERRORS", record.get("errors"))
    analysis_fields(f, stored.get("analysis"))
    return f


def _stored_fields(f: Fields, stored: Mapping[str, Any]) -> None:
    _put(f, "COREHANDLER_RAW_BYTES", stored.get("raw_bytes"))
    _put(f, "COREHANDLER_STORED_BYTES", stored.get("stored_bytes"))
    _put(f, "COREHANDLER_COMPRESS_SECONDS", _seconds(fields.number(stored, "compress_seconds")))


def stored_entry(record: Mapping[str, Any], stored: Mapping[str, Any]) -> Fields:
    """The second entry of a dump listed while compressing: the dump in its final state, as coredumpctl reads
    it (COREDUMP_FILENAME, the stored figures), at PRIORITY 6 since the listed entry raised the alarm."""
    f = dump_entry(record, stored)
    f["PRIORITY"] = str(PRIORITY_INFO)
    _put(f, "COREHANDLER_INGEST_SECONDS", _seconds(fields.number(stored, "ingest_seconds")))
    return f


# The stack trace appended to MESSAGE is the crashing thread's, at most this many bytes (journald's default
# field limit is 64 MiB, but an entry that large helps nobody).
MAX_TRACE_BYTES = 16 << 10


def analysis_fields(f: Fields, result: Mapping[str, Any] | None) -> None:
    """The analysis (corehandler/analysis/unwind.py) as systemd-coredump spells it where it has a field (COREDUMP_UNIT,
    COREDUMP_SLICE, COREDUMP_PACKAGE_*, the trace in MESSAGE), COREHANDLER_* for the rest."""
    if not result:
        return
    ident = result.get("identity") or {}
    exe = result.get("exe") or {}
    threads = result.get("threads") or []
    why = (result.get("reason") or {}).get("text")
    if why:  # the crashed process's words (an assert's text): escaped, on one line
        f["MESSAGE"] += f"\n\nReason: {display(why)}"
        _put(f, "COREHANDLER_REASON", why)
    python = pyframes.crashing(result)
    if threads:  # the crashing thread, its Python frames under the eval frames that ran them (pyframes.py)
        trace = "\n".join(pyframes.thread_lines(threads[0], pyframes.python_of(result, threads[0].get("tid"))))
        if len(trace) > MAX_TRACE_BYTES:
            trace = trace[:MAX_TRACE_BYTES] + "\n... (cut)"
        f["MESSAGE"] += "\n\n" + trace
        f["COREHANDLER_STACK_TRACE"] = trace  # its lines escaped already (findings.frame_line)
    elif python:
        f["MESSAGE"] += "\n\n" + "\n".join(pyframes.traceback_lines(python))[:MAX_TRACE_BYTES]
    if python:  # the Python traceback alone, as Python prints it: most recent call last
        f["COREHANDLER_PYTHON_STACK"] = "\n".join(pyframes.traceback_lines(python))[:MAX_TRACE_BYTES]
    _put(f, "COREHANDLER_PYTHON", pyframes.summary(result))
    _put(f, "COREDUMP_CGROUP", ident.get("cgroup"))
    _put(f, "COREDUMP_UNIT", ident.get("unit"))
    _put(f, "COREDUMP_USER_UNIT", ident.get("user_unit"))
    _put(f, "COREDUMP_SLICE", ident.get("slice"))
    package = exe.get("package") or {}
    _put(f, "COREDUMP_PACKAGE_NAME", package.get("name"))
    _put(f, "COREDUMP_PACKAGE_VERSION", package.get("version"))
    if package:
        f["COREDUMP_PACKAGE_JSON"] = json.dumps(package, sort_keys=True)  # ASCII, its escapes JSON's
    _put(f, "COREHANDLER_ANALYSIS", result.get("state"))
    _put(f, "COREHANDLER_ANALYSIS_SECONDS", _seconds(fields.number(result, "seconds")))
    _put_lines(f, "COREHANDLER_ANALYSIS_PROBLEMS", result.get("problems"))
    _put(f, "COREHANDLER_SIGNATURE", result.get("signature"))
    _put(f, "COREHANDLER_SIGNATURE_ID", result.get("signature_id"))
    _put(f, "COREHANDLER_EXACT_KEY", result.get("exact_key"))
    _put(f, "COREHANDLER_BUILD_ID", exe.get("build_id"))
    _put(f, "COREHANDLER_EXE_ON_DISK", exe.get("state"))
    _put(f, "COREHANDLER_CRASHING_TID", result.get("crashing_tid"))
    for key in ("runtime", "container_id", "container_name", "image", "pod_uid", "pod_name", "pod_namespace",
                "machine", "pid_in_namespace"):
        _put(f, f"COREHANDLER_{key.upper()}", ident.get(key))


def deleted_entry(dump_id: str, exe: str | None, rule: str, freed_bytes: int) -> Fields:
    f: Fields = {"MESSAGE_ID": MESSAGE_ID_DELETED, "PRIORITY": str(PRIORITY_INFO),
                 "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
                 "MESSAGE": f"Removed dump {dump_id} ({display(exe) or 'unknown executable'}) by retention rule "
                            f"{rule}, freed {_mib(freed_bytes)}"}
    _put(f, "COREHANDLER_ID", dump_id)
    _put(f, "COREDUMP_EXE", exe)
    _put(f, "COREHANDLER_RULE", rule)
    _put(f, "COREHANDLER_FREED_BYTES", freed_bytes)
    return f


def error_entry(kind: str, message: str, dump_id: str | None) -> Fields:
    f: Fields = {"MESSAGE_ID": MESSAGE_ID_ERROR, "PRIORITY": str(PRIORITY_ERR),
                 "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
                 "MESSAGE": f"corehandler {kind} error" + (f" on dump {dump_id}" if dump_id else "")
                            + f": {message}"}
    _put(f, "COREHANDLER_ERROR_KIND", kind)
    _put(f, "COREHANDLER_ID", dump_id)
    return f
