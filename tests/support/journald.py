"""A real systemd-journald of the test's own, and a reader of journald's native protocol for unit tests.

PrivateJournald runs /lib/systemd/systemd-journald in a private mount namespace (unshare -m) where a tmpfs
covers /run, and temp directories are bound over /run/systemd/journal (its sockets) and /run/log/journal (its
volatile storage), with our journald.conf over /etc/systemd/journald.conf. The host's journal, if any, is never
touched; the socket and the journal files are visible from outside through the temp directories, so the code
under test sends from the test process itself and `journalctl --directory` reads the result.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

JOURNALD = Path("/lib/systemd/systemd-journald")

CONFIG = """[Journal]
Storage=volatile
ReadKMsg=no
ForwardToSyslog=no
ForwardToKMsg=no
ForwardToConsole=no
ForwardToWall=no
RateLimitBurst=0
Audit=no
"""

START = """set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/systemd/journal /run/log/journal
mount --bind "$1/sock" /run/systemd/journal
mount --bind "$1/log" /run/log/journal
mount --bind "$1/journald.conf" /etc/systemd/journald.conf
exec {journald}
"""


def decode_native(data: bytes) -> dict[str, bytes]:
    """Parses one native-protocol entry (KEY=value lines, or KEY, le64 length, value for binary values)."""
    fields: dict[str, bytes] = {}
    i = 0
    while i < len(data):
        end = data.index(b"\n", i)
        line = data[i:end]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            i = end + 1
        else:
            key = line
            (size,) = struct.unpack("<Q", data[end + 1:end + 9])
            value = data[end + 9:end + 9 + size]
            assert data[end + 9 + size:end + 10 + size] == b"\n"
            i = end + 10 + size
        fields[key.decode()] = value
    return fields


class PrivateJournald:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock_dir, self.log_dir = root / "sock", root / "log"
        self.socket_path = self.sock_dir / "socket"
        self.process: subprocess.Popen | None = None
        for d in (self.sock_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        (root / "journald.conf").write_text(CONFIG)
        (root / "start.sh").write_text(START.format(journald=JOURNALD))

    def start(self, timeout: float = 20.0) -> None:
        self.process = subprocess.Popen(["unshare", "--mount", "sh", str(self.root / "start.sh"), str(self.root)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while not self._listening():
            if self.process.poll() is not None:
                raise RuntimeError(f"journald exited {self.process.returncode}: {self.process.stderr.read()!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("journald did not open its socket")
            time.sleep(0.05)

    def _listening(self) -> bool:
        if not self.socket_path.exists():
            return False
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(str(self.socket_path))
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def stop(self) -> None:
        """Kills journald the way a crash would: its socket file stays behind, stale."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
            self.process.stderr.close()
        self.process = None

    def entries(self, *matches: str) -> list[dict]:
        out = subprocess.run(["journalctl", "--directory", str(self.log_dir), "--output", "json", "--all",
                              "--no-pager", *matches], check=True, capture_output=True, text=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def wait_for(self, *matches: str, count: int = 1, timeout: float = 15.0) -> list[dict]:
        """The entries matching, once there are `count` of them (journald writes asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.entries(*matches)
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def field_bytes(entry: dict, key: str) -> bytes | None:
    """A field as bytes: journalctl -o json gives text, or a list of byte values for binary data."""
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, list):
        return bytes(value)
    return value.encode()



def expected_dump_fields(record: dict, stored: dict) -> dict[str, bytes]:
    """The journal fields a dump's entry must carry, worked out from the record on their own."""
    def b(value) -> bytes:
        return str(value).encode("utf-8", "surrogateescape")

    cap = record["capture"]
    expected = {
        "PRIORITY": b"2",
        "SYSLOG_IDENTIFIER": b"corehandler",
        "COREDUMP_PID": b(record["pid"]),
        "COREDUMP_UID": b(record["uid"]),
        "COREDUMP_GID": b(record["gid"]),
        "COREDUMP_SIGNAL": b(record["signal"]),
        "COREDUMP_SIGNAL_NAME": b(signal.Signals(record["signal"]).name),
        "COREDUMP_EXE": b(record["proc"]["exe"]),
        "COREDUMP_COMM": b(record["comm"]),
        "COREDUMP_CMDLINE": b(" ".join(record["proc"]["cmdline"])),
        "COREDUMP_HOSTNAME": b(record["hostname"]),
        "COREDUMP_TIMESTAMP": b(record["timestamp"] * 1_000_000),
        "COREDUMP_TRUNCATED": b"1" if cap["truncated"] else b"0",
        "COREHANDLER_ID": b(record["id"]),
        "COREHANDLER_DROPPED": b"1" if cap["dropped"] else b"0",
        "COREHANDLER_DUMP_BYTES": b(cap["bytes"] + cap["drained_bytes"]),
        "COREHANDLER_CAPTURED_BYTES": b(cap["bytes"]),
        "COREHANDLER_DRAINED_BYTES": b(cap["drained_bytes"]),
        "COREHANDLER_CAPTURE_SECONDS": f"{cap['ns'] / 1e9:.9f}".encode(),
        "COREHANDLER_THROUGHPUT_BYTES_PER_SECOND": b(round(cap["throughput_bytes_per_second"])),
        "COREHANDLER_STATUS": b(stored["status"]),
    }
    if cap["strategy"]:  # none for a dump dropped unread
        expected["COREHANDLER_STRATEGY"] = b(cap["strategy"])
    if cap["truncated"]:
        expected["COREHANDLER_TRUNCATED_REASON"] = b(cap["truncated_reason"])
    if cap["dropped"]:
        expected["COREHANDLER_DROPPED_REASON"] = b(cap["dropped_reason"])
    if stored["path"]:
        expected["COREDUMP_FILENAME"] = b(stored["path"])
        expected["COREHANDLER_COMPRESSED_BYTES"] = b(stored["compressed_bytes"])
        expected["COREHANDLER_RAW_BYTES"] = b(stored["raw_bytes"])
    return expected


def mismatches(entry: dict, expected: dict[str, bytes]) -> dict[str, tuple]:
    """Fields whose value in the journal entry differs from the expected one: (journal, expected)."""
    return {key: (field_bytes(entry, key), value) for key, value in expected.items()
            if field_bytes(entry, key) != value}
