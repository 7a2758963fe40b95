"""csplice's socket mode against a fake kernel on a socketpair: the request/ack/mark exchange, the stream, and
what happens when the kernel's side says or does something unusual.

The test plays the kernel: it holds one end of a socketpair and hands csplice the other as stdin, as the
listener (or systemd's Accept=yes) does with the kernel's connection. csplice only accepts a peer whose pidfd
is a task being dumped; the test process is not, so these runs set CSPLICE_TEST_SOCKETPAIR_PEER, which csplice
honours only on an unnamed socket (a socketpair; a connection to the real listening socket always has the
socket's path) and which the kernel, passing no environment, can never set. One test runs without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from corehandler import spool
from support.record_schema import check_record
from support.spoolfeed import write_settings

KERNEL, USERSPACE, REJECT, WAIT = 1, 2, 4, 8
MARK_REQACK, MARK_UNSUPPORTED = 0, 3
TEST_PEER_ENV = "CSPLICE_TEST_SOCKETPAIR_PEER"


def _pidfd_info_works() -> bool:
    # SO_PEERPIDFD (6.5) and PIDFD_GET_INFO (6.13): csplice learns who crashed from them.
    a, b = socket.socketpair()
    try:
        a.getsockopt(socket.SOL_SOCKET, 77, 4)
    except OSError:
        return False
    finally:
        a.close()
        b.close()
    release = os.uname().release.split(".")
    return (int(release[0]), int(release[1].split("-")[0])) >= (6, 13)


pytestmark = pytest.mark.skipif(not _pidfd_info_works(), reason="needs SO_PEERPIDFD and PIDFD_GET_INFO (Linux 6.13+)")


@pytest.fixture(autouse=True)
def core_dumps_allowed():
    """The peer is this process, and csplice honours its RLIMIT_CORE (0 by default on Debian) as the kernel's."""
    old = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (old[1], old[1]))
    yield old
    resource.setrlimit(resource.RLIMIT_CORE, old)


def elf_bytes(size: int) -> bytes:
    """A core-sized blob that starts like an ELF file (csplice checks the magic), with zero pages to skip."""
    body = bytearray(os.urandom(size))
    body[:4] = b"\x7fELF"
    body[8192:16384] = bytes(8192)
    return bytes(body)


class FakeKernel:
    """The kernel's end of one coredump connection, driven step by step by a test."""

    def __init__(self, tmp_path: Path, csplice: Path, env_peer: bool = True, **settings):
        tmp_path.mkdir(exist_ok=True)
        self.spool = tmp_path / "spool"
        self.settings = write_settings(tmp_path / "csplice.conf", self.spool, **settings)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {"CSPLICE_SETTINGS": str(self.settings), "CSPLICE_LOG_STDERR": "1"}
        if env_peer:
            env[TEST_PEER_ENV] = "1"
        self.proc = subprocess.Popen([str(csplice)], stdin=theirs, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env)
        theirs.close()

    def request(self, size: int = 16, size_ack: int = 16, mask: int = KERNEL | USERSPACE | REJECT | WAIT) -> None:
        self.sock.sendall(struct.pack("<IIQ", size, size_ack, mask) + bytes(size - 16))

    def ack(self) -> tuple[int, int]:
        size, _spare, mask = struct.unpack("<IIQ", self.recv_exact(16))
        return size, mask

    def recv_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, f"csplice closed after {len(data)} of {n} bytes"
            data += chunk
        return data

    def mark(self, value: int = MARK_REQACK) -> None:
        self.sock.sendall(struct.pack("<I", value))

    def stream(self, data: bytes) -> None:
        """Writes data as the kernel does; cut_short says csplice closed before taking it all (as it does past
        a limit: closing releases the process at once, where draining would keep it until the end)."""
        def send():
            try:
                self.sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                self.cut_short = True

        # The kernel writes while csplice reads; a thread keeps a large write from blocking the test.
        self.cut_short = False
        writer = threading.Thread(target=send)
        writer.start()
        writer.join(60)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def closed_by_csplice(self) -> bool:
        """With COREDUMP_WAIT the kernel keeps the task until the server closes: csplice must close."""
        self.sock.settimeout(30)
        return self.sock.recv(1) == b""

    def finish(self) -> tuple[int, str, dict | None]:
        _, err = self.proc.communicate(timeout=60)
        self.sock.close()
        records = sorted(self.spool.glob("*.json")) if self.spool.exists() else []
        assert len(records) <= 1, records
        record = json.loads(records[0].read_text()) if records else None
        if record is not None:
            check_record(record)
        return self.proc.returncode, err.decode(errors="replace"), record


def test_takes_the_dump_and_stores_it_byte_for_byte(tmp_path, csplice):
    k = FakeKernel(tmp_path, csplice)
    k.request()
    assert k.ack() == (16, KERNEL | WAIT)
    k.mark()
    data = elf_bytes(3 << 20)
    k.stream(data)
    assert not k.cut_short
    assert k.closed_by_csplice()
    rc, err, record = k.finish()
    assert rc == 0, err
    cap = record["capture"]
    assert cap["mode"] == "socket" and cap["complete"] and cap["bytes"] == len(data)
    sock = dict(cap["socket"])
    # PIDFD_COREDUMPED (bit 0) is clear: this process is not being dumped, the test hook let it through.
    assert sock.pop("coredump_mask") & 1 == 0
    assert sock == {"handshake": True, "request_size": 16, "request_mask": 15, "ack_mask": KERNEL | WAIT,
                    "rejected": False, "mark": 0, "error": None}
    core = k.spool / record["core"]
    assert core.read_bytes() == data
    # The zero pages were skipped, not written: the file has a hole there.
    assert core.stat().st_blocks * 512 < len(data)
    assert record["pid"] == os.getpid() and record["uid"] == os.getuid()
    assert record["specifiers"]["c"] is not None  # RLIMIT_CORE, from /proc/PID/limits


def test_a_longer_request_with_unknown_mask_bits(tmp_path, csplice):
    """A later kernel's request: bigger (its size field says so) and offering bits csplice does not know."""
    k = FakeKernel(tmp_path, csplice)
    unknown = 1 << 40 | 1 << 5
    k.request(size=48, size_ack=32, mask=KERNEL | REJECT | WAIT | unknown)
    size, mask = k.ack()
    assert (size, mask) == (16, KERNEL | WAIT), "only known bits the kernel offered, in a version-0 ack"
    k.mark()
    data = elf_bytes(1 << 20)
    k.stream(data)
    rc, err, record = k.finish()
    assert rc == 0, err
    assert record["capture"]["socket"]["request_size"] == 48
    assert record["capture"]["socket"]["request_mask"] == KERNEL | REJECT | WAIT | unknown
    assert (k.spool / record["core"]).read_bytes() == data


def test_refuses_before_the_kernel_writes_when_admission_says_no(tmp_path, csplice):
    """The size limit against the dump's estimate (this process's VmRSS): REJECT, nothing streamed."""
    k = FakeKernel(tmp_path, csplice, max_dump_size=4096)
    k.request()
    assert k.ack() == (16, REJECT | WAIT)
    k.mark()
    assert k.closed_by_csplice()
    rc, err, record = k.finish()
    assert rc == 0, err
    cap = record["capture"]
    assert record["core"] is None and cap["dropped"] and cap["dropped_reason"] == "max_dump_size"
    assert cap["socket"]["rejected"] is True and cap["bytes"] == cap["drained_bytes"] == 0
    assert list(k.spool.glob("*.core")) == []


def test_a_refused_ack_is_recorded_and_nothing_stored(tmp_path, csplice):
    k = FakeKernel(tmp_path, csplice)
    k.request()
    k.ack()
    k.mark(MARK_UNSUPPORTED)
    assert k.closed_by_csplice()
    rc, err, record = k.finish()
    assert rc == 0, err
    cap = record["capture"]
    assert cap["dropped_reason"] == "socket_error" and cap["socket"]["error"] == "ack_refused"
    assert cap["socket"]["mark"] == MARK_UNSUPPORTED and record["core"] is None


def test_a_short_mark(tmp_path, csplice):
    k = FakeKernel(tmp_path, csplice)
    k.request()
    k.ack()
    k.sock.sendall(b"\0\0")
    k.sock.shutdown(socket.SHUT_WR)
    rc, err, record = k.finish()
    assert rc == 0, err
    assert record["capture"]["socket"]["error"] == "short_mark"
    assert record["capture"]["dropped_reason"] == "socket_error" and record["core"] is None


@pytest.mark.parametrize("when", ["before_request", "after_ack"])
def test_a_peer_that_vanishes(tmp_path, csplice, when):
    k = FakeKernel(tmp_path, csplice)
    if when == "after_ack":
        k.request()
        k.ack()
    k.sock.close()
    rc, err, record = k.finish()
    assert rc == 0, err
    assert record["capture"]["socket"]["error"] == "peer_gone"
    assert record["capture"]["dropped"] and record["core"] is None


def test_plain_at_mode_streams_without_a_handshake(tmp_path, csplice):
    """core_pattern "@path" (Linux 6.16): the core comes at once, nothing to answer."""
    k = FakeKernel(tmp_path, csplice)
    data = elf_bytes(2 << 20)
    k.stream(data)
    rc, err, record = k.finish()
    assert rc == 0, err
    assert record["capture"]["socket"]["handshake"] is False and record["capture"]["complete"]
    assert (k.spool / record["core"]).read_bytes() == data


def test_rlimit_core_small_truncates_and_zero_refuses(tmp_path, csplice):
    """RLIMIT_CORE of the peer (read from /proc/PID/limits) means what it means for a core file."""
    old = resource.getrlimit(resource.RLIMIT_CORE)
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (65536, old[1]))
        k = FakeKernel(tmp_path / "small", csplice)
        k.request()
        assert k.ack()[1] == KERNEL | WAIT
        k.mark()
        k.stream(elf_bytes(1 << 20))
        rc, err, record = k.finish()
        assert rc == 0, err
        assert record["rlimit_core"] == "65536"
        assert record["capture"]["truncated_reason"] == "rlimit_core" and record["capture"]["bytes"] == 65536
        assert (k.spool / record["core"]).stat().st_size == 65536
        assert k.cut_short, "csplice drained past RLIMIT_CORE instead of letting the process go"

        resource.setrlimit(resource.RLIMIT_CORE, (0, old[1]))
        k = FakeKernel(tmp_path / "zero", csplice)
        k.request()
        assert k.ack()[1] == REJECT | WAIT
        k.mark()
        rc, err, record = k.finish()
        assert record["capture"]["dropped_reason"] == "rlimit_core" and record["core"] is None
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, old)


def test_a_crash_past_its_users_budget_is_rejected_and_shed(tmp_path, csplice):
    """Past twice its user's pending records (root's own: max_pending) the kernel is told not to write the dump
    and nothing is stored but the count (admit.c): exit 75, no record."""
    k = FakeKernel(tmp_path, csplice, max_pending=1)
    k.spool.mkdir(mode=0o700)
    pending = [f"{n}-0123456789abcdef-{n}.json" for n in (1, 2)]
    for name in pending:  # what csplice's records start with: the uid right behind the id
        (k.spool / name).write_text(f'{{"schema":1,"id":"{name[:-5]}","uid":{os.getuid()},"core":null}}')
    k.request()
    assert k.ack()[1] == REJECT | WAIT
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        k.mark()
    assert k.closed_by_csplice()
    _, err = k.proc.communicate(timeout=60)
    assert k.proc.returncode == 75, err
    assert sorted(p.name for p in k.spool.glob("*.json")) == pending
    assert spool.shed_counts(k.spool) == {os.getuid(): 1}


def test_a_peer_not_being_dumped_is_refused_and_nothing_stored(tmp_path, csplice):
    """Without the test hook a socketpair peer is what it is: a live process, not a crash. Usage error (64),
    no record, no core; the refusal is counted for the metrics."""
    k = FakeKernel(tmp_path, csplice, env_peer=False)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # csplice may be gone already
        k.request()
        k.sock.sendall(elf_bytes(1 << 16))
    k.sock.settimeout(30)
    try:
        answer = k.sock.recv(16)
    except ConnectionResetError:  # closed with our bytes unread
        answer = b""
    assert answer == b"", "csplice answered a peer that is not being dumped"
    rc, err, record = k.finish()
    assert rc == 64 and record is None
    assert "not a task being dumped" in err
    assert sorted(p.name for p in k.spool.iterdir()) == [".refused"]
    assert (k.spool / ".refused").read_text() == "1\n"


LISTENER_IN_A_PRIVATE_VAR_LIB = r"""
set -e
mount -t tmpfs tmpfs /var/lib
mkdir -p -m 0700 /var/lib/corehandler/spool
"$CSPLICE" --listen "$SOCK" 2>/dev/null &
listener=$!
"$PYTHON" -c '
import socket, sys, time
for _ in range(500):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); break
    except OSError:
        time.sleep(0.02)
s.settimeout(30)
while s.recv(4096):
    pass
' "$SOCK"
kill $listener
wait $listener || true
cat /var/lib/corehandler/spool/.refused 2>/dev/null || echo none
"""


@pytest.mark.root
def test_the_listener_passes_none_of_its_environment_to_a_crash(tmp_path, csplice):
    """A listener started with csplice's test overrides in its environment (a root shell's leftovers): the
    csplice that takes a connection runs on its built-in settings, not on CSPLICE_SETTINGS' (nor any other
    override's). Here the connection is refused (the test is not a crash), and the refusal is counted in the
    built-in spool (a private tmpfs over /var/lib), not in the one the environment named."""
    sockdir = tmp_path / "s"
    sockdir.mkdir(mode=0o700)
    settings = write_settings(tmp_path / "csplice.conf", tmp_path / "spool")
    env = {"PATH": os.environ["PATH"], "CSPLICE": str(csplice), "SOCK": str(sockdir / "sock"),
           "PYTHON": sys.executable, "CSPLICE_SETTINGS": str(settings), "CSPLICE_LOG_STDERR": "1",
           "CSPLICE_TEST_SOCKETPAIR_PEER": "1", "CSPLICE_PROC_ROOT": str(tmp_path / "noproc")}
    got = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          LISTENER_IN_A_PRIVATE_VAR_LIB], env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["1"]
    assert not (tmp_path / "spool" / ".refused").exists()
