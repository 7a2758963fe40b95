"""Socket mode's moving parts seen from Python: what the kernel supports, the listener's command, and whether
it is listening.

In socket mode (kernel.core_pattern = "@@/run/corehandler/capture/coredump.socket") the kernel connects to a
listening unix socket for each crash; `csplice --listen` accepts and forks one csplice per connection. With no
listener the kernel drops every dump without a word, so "is it listening" must be answerable without
connecting (a connection would itself be a peer csplice refuses and counts): /proc/net/unix lists each
listening socket with its path.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from corehandler.host import sysctl

CORE_MODES = "kernel.core_modes"
SOCKET_SINCE = (6, 16)  # "@path": the kernel connects and streams
HANDSHAKE_SINCE = (6, 17)  # "@@path": request/ack first, so csplice can refuse a dump before it is written
# /proc/net/unix: Flags has __SO_ACCEPTCON (0x10000) and St is SS_UNCONNECTED (01) for a listening socket.
_ACCEPTCON = 0x10000


def kernel_version(release: str) -> tuple[int, int]:
    """(major, minor) of a release string such as "6.18.44-fc-v657"; (0, 0) if it does not parse."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def socket_prefix(proc_root: Path = Path("/proc")) -> str | None:
    """"@@" where the kernel has the handshake, "@" where it only streams, None without socket mode."""
    root = proc_root / "sys"
    version = kernel_version(sysctl.read("kernel.osrelease", root))
    # core_modes itself is 6.16+; older kernels have no socket mode either
    modes = (sysctl.read_or_none(CORE_MODES, root) or "").split()
    if version < SOCKET_SINCE or (modes and "socket" not in modes):
        return None
    return "@@" if version >= HANDSHAKE_SINCE else "@"


def socket_pattern(prefix: str, path: Path) -> str:
    return f"{prefix}{path}"


def socket_path_of(pattern: str) -> str | None:
    """The socket of an "@"/"@@" pattern, None for a pipe or file pattern."""
    if not pattern.startswith("@"):
        return None
    return pattern[2:] if pattern.startswith("@@") else pattern[1:]


def command(csplice: Path, socket_path: Path, max_connections: int) -> list[str]:
    return [str(csplice), "--listen", str(socket_path), "--max-connections", str(max_connections)]


def listening(socket_path: Path | str, proc_root: Path = Path("/proc")) -> bool:
    """True when some process listens on socket_path (this network namespace's /proc/net/unix)."""
    try:
        lines = (proc_root / "net" / "unix").read_text(errors="replace").splitlines()[1:]
    except OSError:
        return False
    wanted = str(socket_path)
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7] == wanted and int(fields[3], 16) & _ACCEPTCON and fields[5] == "01":
            return True
    return False


def wait_listening(socket_path: Path | str, timeout: float, proc_root: Path = Path("/proc")) -> bool:
    deadline = time.monotonic() + timeout
    while not listening(socket_path, proc_root):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
