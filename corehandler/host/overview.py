"""`corehandler status`: what every subsystem says, read without changing the host."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from corehandler import paths as paths_mod
from corehandler import spool
from corehandler.config import Config, render_csplice_settings
from corehandler.csplice_contract import csplice_version
from corehandler.errors import SystemFailure, UnsafePathError
from corehandler.host import listener, supervise, sysctl
from corehandler.host.install import (
    _int_or_zero,
    _live,
    _sysctl_root,
    check_handler_path,
    core_pattern_for,
    is_ours,
    mode_of,
    read_previous,
)
from corehandler.paths import Paths
from corehandler.store.index import Store, StoreError


def _spool_summary(spool_dir: Path) -> dict:
    summary = {"path": str(spool_dir), "exists": spool_dir.is_dir(), "pending": 0, "orphans": None, "bytes": 0}
    try:
        entries = list(os.scandir(spool_dir))
    except FileNotFoundError:
        return summary
    except OSError as e:
        return {**summary, "error": e.strerror}
    for entry in entries:
        if entry.is_file(follow_symlinks=False):
            summary["bytes"] += entry.stat(follow_symlinks=False).st_blocks * 512
            if entry.name.endswith(".json") and not entry.name.startswith("."):
                summary["pending"] += 1
    summary["orphans"] = len(spool.find_orphans(spool_dir))
    return summary


def _store_summary(index_path: Path) -> dict | None:
    """Count and bytes of the stored dumps (not those whose deletion is under way), from the index opened
    read-only so status never creates it."""
    if not index_path.exists():
        return None
    try:
        with Store(index_path.parent, readonly=True) as store:
            stored, count = store.totals()
            corrupt = len(store.corrupt())
    except (StoreError, sqlite3.Error) as e:
        return {"path": str(index_path), "error": str(e)}
    return {"path": str(index_path), "count": count, "bytes": stored, "corrupt": corrupt}


def _upload_summary(config: Config, index_path: Path) -> dict | None:
    """The upload queue and the problem holding it, if any; None when [upload] is off and never ran."""
    from corehandler.fleet import upload_queue

    if not index_path.exists():
        return {"url": config.upload.url, "queue": None} if config.upload.url else None
    try:
        with Store(index_path.parent, readonly=True) as store:
            queue = upload_queue.stats(store.db)
    except (StoreError, sqlite3.Error) as e:
        return {"url": config.upload.url, "error": str(e)}
    if queue is None and not config.upload.url:
        return None
    return {"url": config.upload.url, "queue": queue}


def _daemon_summary(paths: Paths) -> dict:
    found = supervise.status(paths)
    return {"state": "running" if found.running else "stopped", **found.as_dict()}


def _settings_summary(config: Config, paths: Paths) -> dict:
    path = paths.csplice_settings
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {"path": str(path), "state": "missing (csplice runs on its built-in defaults)"}
    except OSError as e:
        return {"path": str(path), "state": f"unreadable: {e.strerror}"}
    current = text == render_csplice_settings(config, paths)
    return {"path": str(path), "state": "current" if current else "differs from the config (reinstall or reload)"}


def capture_state(config: Config, paths: Paths) -> dict:
    """The mode the live core_pattern gives (None when it is not ours), whether the socket listener listens,
    and the socket peers refused: cheap enough for every metrics scrape."""
    pattern = sysctl.read(sysctl.CORE_PATTERN, _sysctl_root(paths))
    socket_path = config.kernel.socket_path
    mode = mode_of(pattern) if is_ours(pattern, socket_path) else None
    return {"mode": mode, "listening": mode == "socket" and listener.listening(socket_path, paths.proc_root),
            "refused_peers": spool.refused_count(paths.spool_dir)}


def _listener_summary(config: Config, paths: Paths, mode: str | None) -> dict | None:
    """In socket mode: whether anything listens on the socket (if not, the kernel drops dumps silently)."""
    if mode != "socket":
        return None
    found = supervise.status(paths, supervise.LISTENER)
    path = config.kernel.socket_path
    return {"socket_path": str(path), "listening": listener.listening(path, paths.proc_root),
            "supervised": found.running, "pid": found.daemon_pid, "log_file": found.log_file,
            "restarts": found.restarts, "last_restart": found.last_restart, "last_restart_why": found.last_restart_why,
            "refused_peers": spool.refused_count(paths.spool_dir)}


def status(config: Config, paths: Paths, *, csplice: Path | None = None) -> dict:
    """What is installed and how the spool and store stand; never changes anything, needs no root."""
    root = _sysctl_root(paths)
    program = csplice or paths_mod.csplice_path()
    live = _live(paths)
    handler = {"path": str(program), "exists": program.exists(), "version": None, "problem": None}
    expected = None
    try:
        real = check_handler_path(program)
        handler["version"] = csplice_version(real)
        expected = core_pattern_for(real, sysctl.read("kernel.osrelease", root))
    except (UnsafePathError, SystemFailure) as e:
        handler["problem"] = e.message
    pipe_limit = _int_or_zero(live[sysctl.CORE_PIPE_LIMIT])
    persistent = sysctl.read_sysctl_d(paths.sysctl_d)
    try:
        previous = read_previous(paths)
    except SystemFailure as e:
        previous = {"error": e.message}
    pattern = live[sysctl.CORE_PATTERN]
    installed = is_ours(pattern, config.kernel.socket_path)
    mode = mode_of(pattern) if installed else None
    if mode == "socket":
        prefix = listener.socket_prefix(paths.proc_root)
        expected = prefix and listener.socket_pattern(prefix, config.kernel.socket_path)
    return {
        "installed": installed,
        "mode": mode,
        "listener": _listener_summary(config, paths, mode),
        "core_pattern": pattern,
        "core_pattern_expected": expected,
        "core_pattern_matches": expected is not None and pattern == expected,
        "core_pipe_limit": pipe_limit,
        "core_pipe_limit_ok": pipe_limit > 0,
        "sysctl_d": {"path": str(sysctl.sysctl_d_file(paths.sysctl_d)), "exists": persistent is not None,
                     "matches_live": persistent is not None and all(persistent.get(k) == v for k, v in live.items())},
        "previous": previous,
        "csplice": handler,
        "settings": _settings_summary(config, paths),
        "state_dir": str(paths.state_dir),
        "spool": _spool_summary(paths.spool_dir),
        "store": _store_summary(paths.index_path),
        "daemon": _daemon_summary(paths),
        "upload": _upload_summary(config, paths.index_path),
    }

