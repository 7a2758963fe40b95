"""A real systemd-journald of the test's own, and code under test that sends to it from the same namespace.

PrivateJournald runs /lib/systemd/systemd-journald in a private mount namespace (unshare -m) where a tmpfs
covers /run, and temp directories are bound over /run/systemd/journal (its sockets) and /run/log/journal (its
volatile storage), with our journald.conf over /etc/systemd/journald.conf. The host's journal, if any, is never
touched. systemd-python's journal.send always sends to /run/systemd/journal/socket, so the code under test runs
in a namespace of its own with the same temp directory bound there (JournalClient); `journalctl --directory`
reads the result from outside.
"""

from __future__ import annotations

import json
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from corehandler.printable import display

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

# Both journald and its clients see "$1/sock" as /run/systemd/journal, and nothing else of the host's /run.
NAMESPACE = """set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/systemd/journal /run/log/journal
mount --bind "$1/sock" /run/systemd/journal
"""

START = NAMESPACE + """mount --bind "$1/log" /run/log/journal
mount --bind "$1/journald.conf" /etc/systemd/journald.conf
exec {journald}
"""

CLIENT = NAMESPACE + """shift
exec "$@"
"""

# Runs in the client's namespace: a JournalObserver made with the options in argv[1], called once per line of
# stdin (`[method, args]`); each call answers one line of JSON (the result) on stdout.
DRIVER = """
import json, os, sys
from corehandler.observe.journal import JournalObserver
observer = JournalObserver(**json.loads(sys.argv[1]))
for line in sys.stdin:
    method, args = json.loads(line)
    if method == "close_stderr":
        os.close(2)
        result = None
    else:
        result = getattr(observer, method)(*args)
    print(json.dumps(result), flush=True)
"""


class JournalClient:
    """corehandler.observe.journal.JournalObserver in a process that sees the private journald's socket directory."""

    def __init__(self, root: Path, **options: object) -> None:
        self.stderr_path = root / f"client-{time.monotonic_ns()}.stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                ["unshare", "--mount", "sh", "-c", CLIENT, "sh", str(root),
                 sys.executable, "-P", "-c", DRIVER, json.dumps(options)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd="/")

    def call(self, method: str, *args: object, timeout: float = 30.0) -> object:
        """The observer's `method(*args)`; fails instead of hanging when the observer blocks."""
        self.process.stdin.write(json.dumps([method, args], default=dict) + "\n")  # a Stored event goes as its fields
        self.process.stdin.flush()
        if not select.select([self.process.stdout], [], [], timeout)[0]:
            self.process.kill()
            raise TimeoutError(f"journal client blocked in {method} for {timeout:g} s: {self.stderr()}")
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"journal client died ({self.process.wait()}): {self.stderr()}")
        return json.loads(answer)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="surrogateescape")

    def close(self) -> int:
        """Ends the client; its exit status."""
        if self.process.poll() is None:
            self.process.stdin.close()
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.process.stdout.close()
        return code


class PrivateJournald:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock_dir, self.log_dir = root / "sock", root / "log"
        self.socket_path = self.sock_dir / "socket"
        self.process: subprocess.Popen | None = None
        self.clients: list[JournalClient] = []
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

    def pause(self) -> None:
        """Stops journald (SIGSTOP): its socket is there, but nobody reads it."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def client(self, **options: object) -> JournalClient:
        """A JournalObserver(**options) that sends to this journald (started or not); ended by close()."""
        client = JournalClient(self.root, **options)
        self.clients.append(client)
        return client

    def close(self) -> None:
        """Ends the clients, then journald."""
        for client in self.clients:
            client.close()
        self.stop()

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

    def shown(value) -> bytes:  # what the process chose, escaped (printable.py)
        return display(value).encode()

    cap = record["capture"]
    expected = {
        "PRIORITY": b"2",
        "SYSLOG_IDENTIFIER": b"corehandler",
        "COREDUMP_PID": b(record["pid"]),
        "COREDUMP_UID": b(record["uid"]),
        "COREDUMP_GID": b(record["gid"]),
        "COREDUMP_SIGNAL": b(record["signal"]),
        "COREDUMP_SIGNAL_NAME": b(signal.Signals(record["signal"]).name),
        "COREDUMP_EXE": shown(record["proc"]["exe"]),
        # /proc's comm when the record has it (the kernel's %e shows a '/' as '!'), as systemd-coredump does.
        "COREDUMP_COMM": shown(record["proc"].get("comm") or record["comm"]),
        "COREDUMP_CMDLINE": " ".join(shlex.quote(display(a)) for a in record["proc"]["cmdline"]).encode(),
        "COREDUMP_HOSTNAME": shown(record["hostname"]),
        "COREDUMP_TIMESTAMP": b(record["timestamp"] * 1_000_000),
        "COREDUMP_TRUNCATED": b"1" if cap["truncated"] else b"0",
        "COREHANDLER_ID": b(record["id"]),
        "COREHANDLER_DROPPED": b"1" if cap["dropped"] else b"0",
        "COREHANDLER_DUMP_BYTES": b(cap["bytes"] + cap["drained_bytes"]),
        "COREHANDLER_RAW_BYTES": b(cap["bytes"]),
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
        expected["COREHANDLER_STORED_BYTES"] = b(stored["stored_bytes"])
    return expected


def mismatches(entry: dict, expected: dict[str, bytes]) -> dict[str, tuple]:
    """Fields whose value in the journal entry differs from the expected one: (journal, expected)."""
    return {key: (field_bytes(entry, key), value) for key, value in expected.items()
            if field_bytes(entry, key) != value}
