"""systemd-coredump (Compress=yes, its defaults) as a benchmark baseline, without touching the host's journal or
/var/lib/systemd/coredump: its socket served by systemd-socket-activate, a standalone systemd-journald, and its
store bind-mounted from a work directory, all in a private mount namespace that vanishes with it. The caller has
borrowed the host's handler (tests/support/host_core.py) and points it at `pattern` (from its sysctl.d file) per
crash."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = r"""
set -e
mount -t tmpfs -o mode=0755 tmpfs /run/systemd/journal
mkdir -p "$WORK/sdcd-store" "$WORK/sdcd-journal"
mount --bind "$WORK/sdcd-store" /var/lib/systemd/coredump
mount --bind "$WORK/sdcd-journal" /var/log/journal
/lib/systemd/systemd-journald &
for i in $(seq 100); do [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done
rm -f /run/systemd/coredump
exec systemd-socket-activate --seqpacket -a -l /run/systemd/coredump /lib/systemd/systemd-coredump
"""
SOCKET = Path("/run/systemd/coredump")
MOUNT_POINTS = tuple(Path(d) for d in ("/var/lib/systemd/coredump", "/var/log/journal", "/run/systemd/journal"))


def sysctl_d_pattern() -> str:
    for line in Path("/usr/lib/sysctl.d/50-coredump.conf").read_text().splitlines():
        if line.startswith("kernel.core_pattern="):
            return line.split("=", 1)[1]
    raise RuntimeError("no core_pattern in 50-coredump.conf")


class SystemdCoredump:
    def __init__(self, work: Path, server: subprocess.Popen):
        self.store = work / "sdcd-store"
        self.server = server
        self.pattern = sysctl_d_pattern()
        self.names: list[str] = []

    def stored(self) -> list[Path]:
        return sorted(self.store.glob("core.*"))

    def wait_stored(self, timeout: float = 300) -> str:
        """Waits for the dump of the crash just reaped, deletes it (disk space), returns its name."""
        deadline = time.monotonic() + timeout
        while not self.stored() and time.monotonic() < deadline:
            time.sleep(0.02)
        found = self.stored()
        if not found:
            raise RuntimeError("systemd-coredump stored nothing: " + self.server.stderr.read1(4096).decode())
        self.names.append(found[-1].name)
        for f in found:
            f.unlink()
        return found[-1].name

    @property
    def compressed(self) -> bool:
        return bool(self.names) and all(n.endswith((".zst", ".xz", ".lz4")) for n in self.names)


@contextlib.contextmanager
def systemd_coredump(work: Path):
    shutil.rmtree(work / "sdcd-store", ignore_errors=True)
    created = [d for d in MOUNT_POINTS if not d.exists()]
    for d in created:
        d.mkdir(parents=True)
    # Its own session and a private mount namespace: the tmpfs and bind mounts vanish with it.
    server = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT],
                              env=dict(os.environ, WORK=str(work)), start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            if SOCKET.is_socket():
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("systemd-socket-activate did not listen on /run/systemd/coredump")
        yield SystemdCoredump(work, server)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        SOCKET.unlink(missing_ok=True)
        for d in created:
            d.rmdir()
        shutil.rmtree(work / "sdcd-store", ignore_errors=True)
        shutil.rmtree(work / "sdcd-journal", ignore_errors=True)
