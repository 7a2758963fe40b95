"""`corehandler status`: what every subsystem says, read without changing the host."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from corehandler import daemonlock, spool
from corehandler import paths as paths_mod
from corehandler.config import Config
from corehandler.csplice_contract import csplice_version
from corehandler.errors import SystemFailure, UnsafePathError
from corehandler.fleet import available
from corehandler.host import handler, listener, supervise, sysctl
from corehandler.host.handler import is_corehandler, mode_of
from corehandler.host.install import _int_or_zero, check_handler_path, core_pattern_for
from corehandler.paths import Host, Paths
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
    summary = _upload_queue(config, index_path)
    if summary is not None and config.upload.url and (off := available.why_off()):
        summary["off"] = off  # the daemon's uploader keeps the queue and sends nothing, for the same reason
    return summary


def _upload_queue(config: Config, index_path: Path) -> dict | None:
    from corehandler.store import upload_queue

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


def daemon_summary(paths: Paths) -> dict:
    """This installation's daemon, from its own lock (daemonlock.py): the same answer whoever runs it (systemd,
    the supervisor, a shell, the node agent's pod). The supervisor's view is added where it runs one."""
    found = daemonlock.holder(paths.daemon_lock)
    summary = {"state": "running" if found else "stopped", "pid": found and found.pid,
               "since": found and found.since, "lock": str(paths.daemon_lock)}
    supervised = supervise.status(paths)
    if supervised.running:
        summary["supervisor"] = supervised.as_dict()
    return summary


def _settings_summary(config: Config, paths: Paths, host: Host, owner) -> dict:
    path = host.csplice_settings
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {"path": str(path), "state": "missing (csplice runs on its built-in defaults)"}
    except OSError as e:
        return {"path": str(path), "state": f"unreadable: {e.strerror}"}
    if not handler.is_me(owner, paths):
        return {"path": str(path), "state": "another installation's"}
    current = text == handler.settings_for(config.capture, paths, host)
    return {"path": str(path), "state": "current" if current else "differs from the config (reinstall or reload)"}


def _capture_summary(paths: Paths, host: Host, socket_path: Path, pattern: str, found) -> dict:
    """Which installation captures this host's crashes (found: handler.owner()), and whether it is this one."""
    return {"owner": found and found.state_dir, "installation": found and found.installation,
            "this": handler.is_me(found, paths), "owner_exists": found is not None and handler.is_live(found),
            "mode": mode_of(pattern) if found else None, "handler": handler.handler_program(pattern),
            "displaced": found is None and handler.displaced(host, paths, socket_path)}


def capture_state(config: Config, paths: Paths, host: Host = Host()) -> dict:
    """The mode in which the kernel hands this installation its dumps (None when this installation does not own
    the host's handler: another handler, or another installation, captures), whether the socket listener
    listens, the socket peers refused, the captures in progress past [capture] timeout and the crashes shed per
    uid: cheap enough for every metrics scrape."""
    pattern = sysctl.read(sysctl.CORE_PATTERN, host.sysctl_root)
    socket_path = config.kernel.socket_path
    mode = mode_of(pattern) if handler.owns(host, paths, socket_path) else None
    return {"mode": mode, "listening": mode == "socket" and listener.listening(socket_path, host.proc_root),
            "refused_peers": spool.refused_count(paths.spool_dir),
            "stalled": len(spool.stalled_captures(paths.spool_dir, config.capture.timeout)),
            "displaced": mode is None and handler.displaced(host, paths, socket_path),
            "shed": spool.shed_counts(paths.spool_dir)}


def _listener_summary(config: Config, paths: Paths, host: Host, mode: str | None) -> dict | None:
    """In socket mode: whether anything listens on the socket (if not, the kernel drops dumps silently)."""
    if mode != "socket":
        return None
    found = supervise.status(paths, supervise.LISTENER)
    path = config.kernel.socket_path
    return {"socket_path": str(path), "listening": listener.listening(path, host.proc_root),
            "supervised": found.running, "pid": found.daemon_pid, "log_file": found.log_file,
            "restarts": found.restarts, "last_restart": found.last_restart, "last_restart_why": found.last_restart_why,
            "refused_peers": spool.refused_count(paths.spool_dir)}


def _previous_summary(paths: Paths) -> dict | None:
    try:
        previous = handler.read_previous(paths)
    except SystemFailure as e:
        return {"error": e.message}
    return None if previous is None else {**previous.sysctls, "saved_at": previous.saved_at}


def status(config: Config, paths: Paths, *, host: Host = Host(), csplice: Path | None = None) -> dict:
    """What is installed and how the spool and store stand; never changes anything, needs no root."""
    program = csplice or paths_mod.csplice_path()
    live = handler.live(host)
    owner = handler.owner(host, config.kernel.socket_path)
    found = {"path": str(program), "exists": program.exists(), "version": None, "problem": None}
    expected = None
    try:
        real = check_handler_path(program)
        found["version"] = csplice_version(real)
        expected = core_pattern_for(real)
    except (UnsafePathError, SystemFailure) as e:
        found["problem"] = e.message
    pipe_limit = _int_or_zero(live[sysctl.CORE_PIPE_LIMIT])
    persistent = sysctl.read_sysctl_d(host.sysctl_d)
    pattern = live[sysctl.CORE_PATTERN]
    installed = is_corehandler(pattern, config.kernel.socket_path)
    mode = mode_of(pattern) if installed else None
    if mode == "socket":
        prefix = listener.socket_prefix(host.proc_root)
        expected = prefix and listener.socket_pattern(prefix, config.kernel.socket_path)
    return {
        "installed": installed,
        "mode": mode,
        "capture": _capture_summary(paths, host, config.kernel.socket_path, pattern, owner),
        "listener": _listener_summary(config, paths, host, mode),
        "core_pattern": pattern,
        "core_pattern_expected": expected,
        "core_pattern_matches": expected is not None and pattern == expected,
        "core_pipe_limit": pipe_limit,
        "core_pipe_limit_ok": pipe_limit > 0,
        "sysctl_d": {"path": str(sysctl.sysctl_d_file(host.sysctl_d)), "exists": persistent is not None,
                     "matches_live": persistent is not None and all(persistent.get(k) == v for k, v in live.items())},
        "previous": _previous_summary(paths),
        "csplice": found,
        "settings": _settings_summary(config, paths, host, owner),
        "state_dir": str(paths.state_dir),
        "spool": _spool_summary(paths.spool_dir),
        "store": _store_summary(paths.index_path),
        "daemon": daemon_summary(paths),
        "upload": _upload_summary(config, paths.index_path),
    }
