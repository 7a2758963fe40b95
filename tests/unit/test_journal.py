"""JournalObserver on a socket of the test's own: the native protocol, and the stderr fallback when journald is
absent or stale. (A real journald receives the entries in tests/system/test_journald.py.)"""

from __future__ import annotations

import array
import fcntl
import io
import os
import socket

import pytest

from corehandler import journal
from corehandler.journal import JournalObserver
from support.journald import decode_native
from support.records import RecordMaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def listener(tmp_path):
    """A bound datagram socket where journald's would be."""
    path = tmp_path / "socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield path, sock
    sock.close()


def receive(sock: socket.socket) -> dict[str, bytes]:
    data, ancillary, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4))
    if ancillary:  # an entry passed in a memfd
        (level, kind, payload), = ancillary
        assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
        fd = array.array("i", payload)[0]
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL  # journald only trusts sealed memfds
            data = os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
    return decode_native(data)


def test_encoding_is_binary_safe():
    fields = {"A": "plain", "B": "two\nlines", "C": "bad \udcff byte", "D": ""}
    assert decode_native(journal.encode(fields)) == {"A": b"plain", "B": b"two\nlines", "C": b"bad \xff byte",
                                                     "D": b""}
    assert b"B\n" + (9).to_bytes(8, "little") + b"two\nlines\n" in journal.encode(fields)


def test_dump_entry_from_a_real_record(feeder, csplice, tmp_path, listener):
    path, sock = listener
    maker = RecordMaker(feeder, csplice, tmp_path / "spool-root", max_dump_bytes=1 << 20)
    record = maker.make(3 << 20, signal=6, comm=b"cr\xffsher")
    stored = maker.store_dump(record)
    observer = JournalObserver(path)
    observer.on_ingested(record, stored)
    got = receive(sock)
    cap = record["capture"]
    assert got["MESSAGE_ID"] == journal.MESSAGE_ID_DUMP.encode()
    assert got["PRIORITY"] == b"2"
    assert got["COREDUMP_PID"] == str(os.getpid()).encode()
    assert got["COREDUMP_SIGNAL"] == b"6" and got["COREDUMP_SIGNAL_NAME"] == b"SIGABRT"
    assert got["COREDUMP_COMM"] == b"cr\xffsher"  # the process's bytes, not a mangled text
    assert got["COREDUMP_EXE"] == os.fsencode(os.readlink("/proc/self/exe"))
    assert got["COREDUMP_TIMESTAMP"] == str(record["timestamp"] * 10**6).encode()
    assert got["COREDUMP_TRUNCATED"] == b"1"
    assert got["COREHANDLER_TRUNCATED_REASON"] == b"max_dump_bytes"
    assert got["COREHANDLER_DROPPED"] == b"0" and "COREHANDLER_DROPPED_REASON" not in got
    assert got["COREHANDLER_CAPTURED_BYTES"] == b"1048576"
    assert got["COREHANDLER_DUMP_BYTES"] == str(3 << 20).encode()
    assert got["COREHANDLER_THROUGHPUT_BYTES_PER_SECOND"] == str(round(cap["throughput_bytes_per_second"])).encode()
    assert got["COREDUMP_FILENAME"] == stored["path"].encode()
    assert got["COREHANDLER_ID"] == record["id"].encode()
    assert b"truncated (max_dump_bytes)" in got["MESSAGE"]


def test_large_entries_go_in_a_sealed_memfd(listener):
    path, sock = listener
    observer = JournalObserver(path)
    message = "x" * (1 << 19)  # larger than a default datagram
    observer.on_error("ingest", message, "some-id")
    got = receive(sock)
    assert got["MESSAGE"].endswith(message.encode())
    assert got["COREHANDLER_ERROR_KIND"] == b"ingest"


def test_absent_journald_falls_back_to_stderr_and_retries(tmp_path):
    err = io.StringIO()
    clock = Clock()
    path = tmp_path / "socket"
    observer = JournalObserver(path, retry_seconds=30, stderr=err, clock=clock)
    observer.on_deleted("dump-1", "/usr/bin/x", "max_age", 4096)
    lines = err.getvalue().splitlines()
    assert "journald unavailable" in lines[0] and "No such file or directory" in lines[0]
    assert lines[1].startswith("<6>Removed dump dump-1 (/usr/bin/x) by retention rule max_age")
    assert '"COREHANDLER_RULE": "max_age"' in lines[1]

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    try:
        # Within the retry interval journald is not tried, even though it is back.
        clock.now += 10
        assert observer.send({"MESSAGE": "early"}) is False
        clock.now += 30
        assert observer.send({"MESSAGE": "late"}) is True
        assert receive(sock) == {"MESSAGE": b"late"}
        assert "is back" in err.getvalue().splitlines()[-1]
    finally:
        sock.close()


def test_stale_socket_falls_back_to_stderr(listener):
    path, sock = listener
    sock.close()  # the file stays: what a killed journald leaves behind
    assert path.exists()
    err = io.StringIO()
    observer = JournalObserver(path, stderr=err)
    observer.on_error("disk_full", "no space\nleft", None)
    first, second = err.getvalue().splitlines()
    assert "Connection refused" in first
    assert second.startswith("<3>corehandler disk_full error: no space\\nleft {")


def test_nothing_raises_when_stderr_is_gone_too(tmp_path):
    err = io.StringIO()
    err.close()
    observer = JournalObserver(tmp_path / "none", stderr=err)
    observer.on_ingested({}, {})
    observer.on_ingested(None, None)  # type: ignore[arg-type]
    observer.on_state(1, 2, 3)
    observer.close()
