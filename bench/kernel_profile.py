"""Where the guest's vCPUs are during a dump: samples every vCPU's instruction pointer through the qemu monitor
and names it with the kernel's System.map. A poor man's perf for TCG guests (no PMU, no perf in tinyconfig).

Used by bench/kernel.py: pass monitor_args() to the boot, follow() as its on_line, then start()/stop().
Samples are grouped by the guest's current case (the `BEGIN case` .. `RESULT` lines of tests/kernel/guest.c).
"""

from __future__ import annotations

import bisect
import collections
import re
import socket
import threading
import time
from pathlib import Path

RIP = re.compile(r"RIP=([0-9a-f]{16})")
PROMPT = b"(qemu) "


class SystemMap:
    def __init__(self, path: Path | None):
        self.addresses: list[int] = []
        self.names: list[str] = []
        if path and path.exists():
            for line in path.read_text().splitlines():
                address, kind, name = line.split()[:3]
                if kind in "tTwW":
                    self.addresses.append(int(address, 16))
                    self.names.append(name)

    def name(self, rip: int) -> str:
        if rip < 0xFFFF800000000000:
            return "(user)"
        i = bisect.bisect_right(self.addresses, rip) - 1
        return self.names[i] if i >= 0 else f"{rip:#x}"


class Profiler:
    def __init__(self, socket_path: Path, system_map: Path | None, hz: float = 20):
        self.socket_path = socket_path
        self.map = SystemMap(system_map)
        self.period = 1 / hz
        self.case: str | None = None
        self.samples: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def monitor_args(self) -> list[str]:
        return ["-monitor", f"unix:{self.socket_path},server,nowait"]

    def follow(self, line: str) -> None:
        if line.startswith("BEGIN "):
            self.case = line.split()[1]
        elif "RESULT " in line:
            self.case = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _connect(self) -> socket.socket | None:
        while not self._stop.is_set():
            try:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(str(self.socket_path))
                self._read_prompt(conn)
                return conn
            except OSError:
                time.sleep(0.05)
        return None

    @staticmethod
    def _read_prompt(conn: socket.socket) -> bytes:
        data = b""
        while not data.endswith(PROMPT):
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("monitor closed")
            data += chunk
        return data

    def _run(self) -> None:
        conn = self._connect()
        while conn and not self._stop.is_set():
            case = self.case
            try:
                if case is not None:
                    conn.sendall(b"info registers -a\n")
                    text = self._read_prompt(conn).decode("latin-1")
                    if self.case == case:
                        for rip in RIP.findall(text):
                            self.samples[case][self.map.name(int(rip, 16))] += 1
            except OSError:
                return
            time.sleep(self.period)

    def top(self, case: str, n: int = 6) -> list[tuple[str, float]]:
        counter = self.samples.get(case, collections.Counter())
        total = sum(counter.values()) or 1
        return [(name, count / total) for name, count in counter.most_common(n)]
