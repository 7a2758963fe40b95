"""Fresh Debian roots for the deb tier: the package installed, upgraded, downgraded and purged by apt in a root
made by mmdebstrap, never on this host.

A root is entered through namespaces of its own: a mount namespace, and a pid namespace whose init is a process
chrooted into the root, so that in the root `ischroot` is false (/proc/1/root is the root) and the maintainer
scripts take the path of a real machine, supervisor and all. The kernel's settings they write are the root's:
/proc/sys is mounted read-only there, and kernel/core_pattern and kernel/core_pipe_limit are files of the root's
own bound over it (KERNEL_FILES), so no test can change this host's handler, and what the package wrote is read
back from those files. Killing the init ends every process of the root.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from support.waiting import wait_for

MIRROR = os.environ.get("COREHANDLER_DEB_MIRROR", "http://deb.debian.org/debian")
# What the roots hold before a package goes in: the packages' dependencies (so apt installs from the cached
# tarball without the network), passwd for 0.4.0's postinst (useradd), and what the tests themselves run.
# python3 is the release's python3.X (bookworm's 3.11, trixie's 3.13), which its package depends on.
INCLUDE = "python3,libsystemd0,passwd,systemd-standalone-sysusers,ca-certificates"
# The kernel's settings as the root sees them: files of its own, bound over /proc/sys's.
KERNEL_FILES = {"kernel/core_pattern": "core", "kernel/core_pipe_limit": "0"}


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "corehandler-deb"


def make_tarball(suite: str, out: Path, include: str = INCLUDE) -> Path:
    """A minimal root of suite as a tarball (mmdebstrap, root mode), its downloads kept in the cache."""
    debs = cache_dir() / "archives" / suite
    debs.mkdir(parents=True, exist_ok=True)
    tarball = out / f"{suite}.tar"
    cmd = ["mmdebstrap", "--mode=root", "--variant=apt", f"--include={include}",
           "--aptopt=Acquire::Languages \"none\"", "--dpkgopt=path-exclude=/usr/share/man/*",
           "--dpkgopt=path-exclude=/usr/share/locale/*", "--skip=essential/unlink",
           "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/",
           f"--setup-hook=sync-in '{debs}' /var/cache/apt/archives/",
           "--customize-hook=rm -rf \"$1\"/var/cache/apt/archives/partial",
           f"--customize-hook=sync-out /var/cache/apt/archives '{debs}'",
           suite, str(tarball), f"deb {MIRROR} {suite} main"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        raise AssertionError(f"mmdebstrap {suite} exited {result.returncode}\n{result.stderr[-4000:]}")
    return tarball


class Root:
    """One fresh root unpacked from a tarball, with its own init; run() executes in it."""

    def __init__(self, tarball: Path, directory: Path):
        self.dir = directory
        directory.mkdir(parents=True)
        subprocess.run(["tar", "-C", str(directory), "-xpf", str(tarball)], check=True, timeout=600)
        # Scripts calling invoke-rc.d in the root may start services: there are none but ours.
        (directory / "usr/sbin/policy-rc.d").unlink(missing_ok=True)
        for name, value in KERNEL_FILES.items():
            self.kernel_file(name).parent.mkdir(parents=True, exist_ok=True)
            self.kernel_file(name).write_text(value + "\n")
        binds = " && ".join(
            f"mount --bind {self.kernel_file(name)} {directory}/proc/sys/{name}" for name in KERNEL_FILES)
        setup = (f"mount -t proc proc {directory}/proc && "
                 f"mount --bind {directory}/proc/sys {directory}/proc/sys && "
                 f"mount -o remount,bind,ro {directory}/proc/sys && {binds} && "
                 f"mount -t tmpfs -o mode=0755 tmpfs {directory}/run && "
                 f"mount --rbind /dev {directory}/dev && "
                 f"exec chroot {directory} /bin/sh -c 'exec sleep infinity'")
        self.init = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--propagation", "private",
                                      "sh", "-c", setup], start_new_session=True)
        wait_for(self._init_pid, 30, "the root's init")

    def kernel_file(self, name: str) -> Path:
        """The file the root sees as /proc/sys/NAME (outside the root's tree, so no script there removes it)."""
        return self.dir.parent / f"{self.dir.name}.sys" / name

    def sysctl(self, name: str) -> str:
        return self.kernel_file(name).read_text().removesuffix("\n")

    def _init_pid(self) -> int | None:
        """The pid (in ours) of the root's init: unshare's child once it is the chrooted sleep."""
        children = Path(f"/proc/{self.init.pid}/task/{self.init.pid}/children")
        try:
            for pid in children.read_text().split():
                if os.readlink(f"/proc/{pid}/root") == str(self.dir):
                    return int(pid)
        except OSError:
            return None
        return None

    def run(self, script: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        """sh -c script, as root in the root (its mounts, its pids, its / and cwd)."""
        pid = self._init_pid()
        assert pid is not None, "the root's init is gone"
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8"}
        result = subprocess.run(["nsenter", "-t", str(pid), "-m", "-p", "-r", "-w", "/bin/sh", "-c", script],
                                capture_output=True, text=True, timeout=timeout, env=env)
        if check and result.returncode != 0:
            raise AssertionError(f"in {self.dir}: {script}\nexited {result.returncode}\n{result.stdout}\n"
                                 f"{result.stderr}")
        return result

    def put(self, source: Path, inside: str) -> str:
        """Copies a host file into the root; returns its path there."""
        target = self.dir / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        return inside

    def path(self, inside: str) -> Path:
        return self.dir / inside.lstrip("/")

    def close(self) -> None:
        try:
            os.killpg(self.init.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.init.wait(timeout=30)
        # The pid namespace is gone with its init; its mounts with the namespace. Wait for both before removing.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(str(self.dir) in line for line in
                                                  Path("/proc/self/mountinfo").read_text().splitlines()):
            time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.kernel_file("kernel").parent.parent, ignore_errors=True)
