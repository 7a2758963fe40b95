"""A fresh Debian root booted by systemd-nspawn: systemd is its PID 1, so the maintainer scripts take the path of a
systemd machine (deb-systemd-helper, deb-systemd-invoke, corehandler.service) that debroot.Root's plain init
cannot show.

The kernel's settings stay the root's own, as in debroot: nspawn mounts /proc/sys read-only, and once the root
has booted, files of the root's (KERNEL_DIR, kept out of the package's paths) are bound over
kernel/core_pattern and kernel/core_pipe_limit in its mount namespace, so nothing in it changes this host's
handler. nspawn runs without registering with a host systemd (this host may have none as PID 1) and in the
caller's cgroup (--keep-unit); killing it powers the root off.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from support import debroot
from support.waiting import wait_for

# systemd as PID 1 (whose own systemd-sysusers replaces the standalone one), and dbus for the systemctl verbs the
# maintainer scripts use.
INCLUDE = debroot.INCLUDE.replace("systemd-standalone-sysusers", "systemd,systemd-sysv,dbus")
KERNEL_DIR = "/kernel-sys"


def make_tarball(suite: str, out: Path) -> Path:
    tarball = debroot.make_tarball(suite, out, include=INCLUDE)
    return tarball.rename(tarball.with_name(f"{suite}-systemd.tar"))


def _nspid(pid: str) -> list[str]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return line.split()[1:]
    return []


class BootedRoot(debroot.Root):
    """One fresh root unpacked from a tarball and booted; run() executes in it, as debroot.Root's does."""

    def __init__(self, tarball: Path, directory: Path):
        self.dir = directory
        directory.mkdir(parents=True)
        subprocess.run(["tar", "-C", str(directory), "-xpf", str(tarball)], check=True, timeout=600)
        (directory / "usr/sbin/policy-rc.d").unlink(missing_ok=True)
        for name, value in debroot.KERNEL_FILES.items():
            self.kernel_file(name).parent.mkdir(parents=True, exist_ok=True)
            self.kernel_file(name).write_text(value + "\n")
        with open(self.dir.parent / f"{self.dir.name}.console", "ab") as console:  # what a failed boot said
            self.init = subprocess.Popen(["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--boot",
                                          "--console=pipe", "--directory", str(directory)],
                                         stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        wait_for(self._init_pid, 60, "the root's systemd")
        # Bound before anything is installed; systemd-sysctl.service skipped the read-only /proc/sys at boot.
        binds = " && ".join(f"mount --bind {KERNEL_DIR}/{name} /proc/sys/{name}" for name in debroot.KERNEL_FILES)
        subprocess.run(["nsenter", "-t", str(self._init_pid()), "-m", "sh", "-c", binds], check=True, timeout=30)
        wait_for(lambda: self.run("systemctl is-system-running", check=False).stdout.strip()
                 in ("running", "degraded"), 120, "the root's boot to finish")

    def kernel_file(self, name: str) -> Path:
        return self.dir / KERNEL_DIR.lstrip("/") / name

    def _init_pid(self) -> int | None:
        """The pid (in ours) of the root's systemd: nspawn's descendant whose pid is 1 in its own namespace
        (its /proc/PID/root reads "/" after nspawn's pivot_root, so the root's path cannot find it)."""
        pending = [str(self.init.pid)]
        while pending:
            pid = pending.pop()
            try:
                if pid != str(self.init.pid) and _nspid(pid)[-1:] == ["1"]:
                    return int(pid)
                for task in os.listdir(f"/proc/{pid}/task"):
                    pending += Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            except OSError:
                continue
        return None

    def journal(self, unit: str) -> str:
        return self.run(f"journalctl --no-pager -o cat -u {unit}", check=False).stdout

    def close(self) -> None:
        # PID 1 killed ends its namespace and every process in it; nspawn exits after it.
        init = self._init_pid()
        for pid in ([init] if init else []) + [-self.init.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.init.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (self._init_pid() is not None or any(
                str(self.dir) in line for line in Path("/proc/self/mountinfo").read_text().splitlines())):
            time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)
