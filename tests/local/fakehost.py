"""A fake host for install/uninstall/status: /proc/sys, sysctl.d, config and state under tmp_path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from corehandler.host import install
from corehandler.paths import Host, Paths

SYSTEMD_PATTERN = "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h %d"


class FakeHost:
    def __init__(self, tmp_path: Path, csplice: Path, monkeypatch, release: str = "6.18.44-fc-v657",
                 bin_dir: Path | None = None):
        self.root = tmp_path
        self.paths = Paths(state_dir=tmp_path / "var/lib/corehandler", config_dir=tmp_path / "etc/corehandler",
                           run_dir=tmp_path / "run")
        # The machine's side: what host/handler.py writes, under a lock of this fake host's own.
        self.machine = Host(proc_root=tmp_path / "proc", sysctl_d=tmp_path / "etc/sysctl.d",
                            csplice_settings=tmp_path / "var/lib/corehandler/csplice.conf",
                            lock=tmp_path / "run/corehandler/lock/core-pattern.lock")
        (tmp_path / "run").mkdir(exist_ok=True)
        self.kernel = tmp_path / "proc/sys/kernel"
        self.kernel.mkdir(parents=True)
        self.set("osrelease", release)
        self.set("core_pattern", "core")
        self.set("core_pipe_limit", "0")
        # A private copy of the real csplice that only this test owns, in bin_dir: pytest's tmp_path can be
        # too long for a 127-character core_pattern.
        libexec = (bin_dir or tmp_path) / "corehandler"
        libexec.mkdir(parents=True)
        self.csplice = libexec / "csplice"
        shutil.copy(csplice, self.csplice)
        os.chmod(self.csplice, 0o755)
        if os.geteuid() != 0:
            # Unprivileged run: this user stands in for root, and the real root still owns / and /tmp.
            monkeypatch.setattr(install, "ROOT_UID", os.getuid())
            monkeypatch.setattr(install, "TRUSTED_UIDS", frozenset({0, os.getuid()}))

    def installation(self, name: str) -> Paths:
        """Another installation (state dir) on this host."""
        return Paths(state_dir=self.root / name, config_dir=self.root / f"etc/{name}",
                     run_dir=self.root / f"run/{name}")

    def set(self, name: str, value: str) -> None:
        # The fake kernel's own tree, as another handler's installer would leave it: the value and a newline.
        (self.kernel / name).write_text(value + "\n")

    def get(self, name: str) -> str:
        return (self.kernel / name).read_text().removesuffix("\n")
