"""Fills a spool the way the kernel does: the feeder pipes a synthetic ELF core into the real csplice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from corehandler.store import userview
from support.csplice_harness import core_args, render_settings


def write_settings(path: Path, spool_dir: Path, **extra) -> Path:
    """A csplice settings file for tests: no storm limits unless asked, no free-space floor."""
    settings = {"spool_dir": str(spool_dir), "max_pending": 0, "max_per_exe_per_minute": 0,
                "min_free": 0}
    settings.update(extra)
    path.write_text(render_settings(settings))
    return path


def feed(feeder: Path, csplice: Path, settings: Path, *, size: int, pid: int = 4242, comm: str | bytes = "feeder",
         signal: int = 11, zero_regions: bool = False, proc_root: Path | None = None, uid: int | None = None,
         dumpable: int | None = None, euid: int | None = None, egid: int | None = None,
         at_secure: int = 0, rlimit: int | None = None,
         namespaces: Mapping[str, str] = userview.HOST_NAMESPACES) -> dict | None:
    """Runs feeder | csplice for one fake crash and returns the committed record (None when a running
    daemon took it before we could read it). uid and dumpable are the kernel's %u (default: ours) and %d
    (default 1); with a uid, the proc root's status says its real, effective, saved and fs ids (euid and egid
    the effective ones, default the real ones); at_secure goes into the core's auxv; rlimit is the kernel's %c
    (default unlimited); the proc root shows the process in namespaces (default: the host's)."""
    spool_dir = Path(next(line.split("=", 1)[1].strip() for line in settings.read_text().splitlines()
                          if line.startswith("spool_dir=")))
    before = set(os.listdir(spool_dir)) if spool_dir.exists() else set()
    # A proc root where the PID is alive (csplice refuses a dead one) but shows nothing: csplice must not read
    # an unrelated host process that happens to have this PID.
    proc_root = proc_root or settings.parent / "noproc"
    (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
    status = proc_root / str(pid) / "status"
    if uid is not None:
        e_uid, e_gid = uid if euid is None else euid, uid if egid is None else egid
        status.write_text(f"Name:\tfeeder\nUid:\t{uid}\t{e_uid}\t{e_uid}\t{e_uid}\n"
                          f"Gid:\t{uid}\t{e_gid}\t{e_gid}\t{e_gid}\n")
    else:
        status.unlink(missing_ok=True)
    ns_dir = proc_root / str(pid) / "ns"
    shutil.rmtree(ns_dir, ignore_errors=True)
    ns_dir.mkdir()
    for name, link in namespaces.items():  # what readlink of /proc/PID/ns/NAME says
        (ns_dir / name).symlink_to(link)
    env = dict(os.environ, CSPLICE_SETTINGS=str(settings), CSPLICE_PROC_ROOT=str(proc_root),
               CSPLICE_LOG_STDERR="1")
    args = [str(feeder), "--size", str(size), "--pid", str(pid), "--at-secure", str(at_secure)] + \
        (["--zero-regions"] if zero_regions else [])
    kernel_args = core_args(pid, comm=comm, signal=signal, hostname="testhost")
    for position, value in ((3, uid), (4, uid), (5, dumpable), (8, rlimit)):  # %u %g %d %c
        if value is not None:
            kernel_args[position] = str(value).encode()
    args += ["--", str(csplice), *kernel_args]
    subprocess.run(args, env=env, check=True, capture_output=True, timeout=120)
    new = sorted(n for n in set(os.listdir(spool_dir)) - before if n.endswith(".json") and not n.startswith("."))
    try:
        return json.loads((spool_dir / new[0]).read_text()) if len(new) == 1 else None
    except FileNotFoundError:
        return None


def emit_core(feeder: Path, path: Path, size: int, zero_regions: bool = False) -> Path:
    """Writes the feeder's synthetic core of `size` bytes to path."""
    args = [str(feeder), "--size", str(size), "--emit", str(path)] + (["--zero-regions"] if zero_regions else [])
    subprocess.run(args, check=True, timeout=120)
    return path


def empty_state(tmp: Path) -> tuple[Path, Path, Path]:
    """tmp/state with an empty spool, an empty config dir tmp/etc, and csplice settings (tmp/s.conf) that spool
    there: (state, etc, settings)."""
    state, etc = tmp / "state", tmp / "etc"
    (state / "spool").mkdir(parents=True)
    etc.mkdir()
    return state, etc, write_settings(tmp / "s.conf", state / "spool")


def fed_state(tmp_path: Path, pids, comm: str) -> tuple[Path, Path]:
    """A state dir whose spool holds one fed crash of about 1 MiB per pid, and an empty config dir."""
    from corehandler import paths
    from support import cbuild

    feeder, csplice = cbuild.feeder(), paths.csplice_path()
    state, etc, settings = empty_state(tmp_path)
    for pid in pids:
        feed(feeder, csplice, settings, size=(1 << 20) + pid, pid=pid, comm=comm)
    return state, etc
