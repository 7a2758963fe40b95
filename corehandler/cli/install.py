"""install, uninstall, status."""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
from pathlib import Path

from corehandler.cli.common import emit, load
from corehandler.host import install, overview, supervise
from corehandler.units import human_size


def register(commands) -> None:
    parser = commands.add("install", run_install, help="make csplice the kernel's core handler (needs root)")
    parser.add_argument("--force", action="store_true",
                        help="replace another pipe handler in core_pattern (uninstall puts it back)")
    parser.add_argument("--csplice", type=Path, metavar="PATH", help="the csplice to install (default: the "
                        "one installed with this package)")
    parser.add_argument("--no-daemon", action="store_true",
                        help="do not start the daemon (crashes wait in the spool until it runs)")
    parser.add_argument("--mode", choices=install.MODES, default=None,
                        help="pipe: the kernel runs csplice per crash (the default); socket: the kernel connects to "
                        "csplice's listener, which can refuse a dump before it is written (Linux 6.17+); auto: "
                        "socket where the kernel has it and the listener answers, else pipe (default: [kernel] mode)")
    parser.add_argument("--package", action="store_true",
                        help="for the Debian package's scripts: replace another handler (as --force), leave the "
                        "sysctl.d file and the daemon to the package (socket mode's listener is started all the "
                        "same)")
    parser = commands.add("uninstall", run_uninstall,
                          help="restore the core_pattern and core_pipe_limit from before install (needs root)")
    parser.add_argument("--no-daemon", action="store_true", help="leave the daemon running")
    parser = commands.add("status", run_status, help="what is installed, the kernel's settings, spool and store")
    parser.add_argument("--csplice", type=Path, metavar="PATH", help="the csplice to compare with")


UNIT_DIRS = (Path("/etc/systemd/system"), Path("/lib/systemd/system"), Path("/usr/lib/systemd/system"))


def _systemd_runs_daemon() -> bool:
    return supervise.systemd_is_pid1() and any((d / "corehandler.service").exists() for d in UNIT_DIRS)


def _manages_daemon(args: argparse.Namespace) -> bool:
    """Whether install/uninstall start and stop the daemon: not for the package, whose maintainer scripts do,
    and not where systemd is init and has corehandler.service; elsewhere the supervisor runs it."""
    return not (args.no_daemon or getattr(args, "package", False) or _systemd_runs_daemon())


def _systemd_runs_listener() -> bool:
    return supervise.systemd_is_pid1() and any((d / "corehandler-capture.socket").exists() for d in UNIT_DIRS)


CAPTURE_SOCKET_UNIT = "corehandler-capture.socket"


def _start_listener(paths, command: list[str]):
    if _systemd_runs_listener():
        # The unit's ListenStream is the listener's path; one csplice per connection (Accept=yes).
        return subprocess.run(["systemctl", "enable", "--now", CAPTURE_SOCKET_UNIT], check=False)
    # Whatever ran before (another socket path, an older csplice) is replaced: the command is the config's now.
    supervise.stop(paths, service=supervise.LISTENER)
    return supervise.start(paths, command=command, service=supervise.LISTENER)


def _stop_listener(paths) -> bool:
    if _systemd_runs_listener():
        return subprocess.run(["systemctl", "disable", "--now", CAPTURE_SOCKET_UNIT], check=False).returncode == 0
    return supervise.stop(paths, service=supervise.LISTENER)


def run_install(args: argparse.Namespace) -> int:
    config, paths = load(args)
    start = (lambda p: supervise.start(p, args.config_dir)) if _manages_daemon(args) else None
    # Under systemd the listener is corehandler-capture.socket (Accept=yes); elsewhere the supervisor runs it.
    # The package's postinst runs this too and has no listener of its own to start: socket mode needs one now.
    done = install.install(config, paths, csplice=args.csplice, force=args.force or args.package,
                           start_daemon=start, write_sysctl_d=not args.package, mode=args.mode,
                           start_listener=_start_listener, stop_listener=_stop_listener, measure_rates=True)
    boot = f", also in {done['sysctl_d']} for the next boot" if done["sysctl_d"] else ""
    lines = [f"corehandler installed in {done['mode']} mode: core_pattern = {done['core_pattern']}",
             f"  core_pipe_limit = {done['core_pipe_limit']}{boot}",
             f"  csplice {done['csplice_version']} settings in {done['settings']}, dumps under {done['state_dir']}"]
    rates = done["write_rates"]
    lines.append(f"  capture: {rates['problem'] + '; ' if rates['problem'] else ''}{rates['reason']}")
    if args.mode == "auto" and done["mode"] == "pipe":
        lines.append("  socket mode unavailable (kernel without the handshake, or the listener did not answer)")
    if done["replaced"] is not None:
        back = "restores it" if done["previous_saved"] else "restores what the host had before the first install"
        lines.append(f"  replaced core_pattern {done['replaced']!r}; `corehandler uninstall` {back}")
    if done["daemon_started"]:
        lines.append(f"  daemon started (supervised, log in {paths.log_dir})")
    elif not args.package and _systemd_runs_daemon():
        lines.append("  start the daemon with `systemctl enable --now corehandler.service`")
    emit(args, done, "\n".join(lines))
    return 0


def run_uninstall(args: argparse.Namespace) -> int:
    config, paths = load(args)
    done = install.uninstall(paths, stop_daemon=supervise.stop if _manages_daemon(args) else None,
                             socket_path=config.kernel.socket_path, stop_listener=_stop_listener)
    lines = [uninstalled_line(done, "corehandler")]
    if done["sysctl_d_removed"]:
        lines.append("  removed the sysctl.d file")
    emit(args, done, "\n".join(lines))
    return 0


def uninstalled_line(done: dict, who: str) -> str:
    """What an uninstall (install.uninstall's result) did, in one line: `uninstall`'s and `agent uninstall`'s."""
    if done["restored"] is None:
        return f"{who} was not the core handler (core_pattern = {done['left_alone']}); left it alone"
    restored = done["restored"]
    return (f"{who} uninstalled: core_pattern = {restored['kernel.core_pattern']}, core_pipe_limit = "
            f"{restored['kernel.core_pipe_limit']} (from {done['restored_from']})")


def _capture_line(capture: dict) -> str:
    if capture.get("displaced"):
        return (f"NOBODY: the kernel runs {capture['handler'] or '?'} although csplice.conf names this "
                "installation (another package's postinst re-applied its pattern): `corehandler install --force` "
                "takes it back")
    if capture["owner"] is None:
        return "no corehandler installation (core_pattern is not corehandler's, or csplice.conf names none)"
    where = capture["owner"] + (f" (installation {capture['installation']})" if capture["installation"] else "")
    if capture["this"]:
        return f"this installation, {where}, {capture['mode']} mode"
    gone = "" if capture["owner_exists"] else "; that state dir is gone: `corehandler install` takes it over"
    return f"another installation, {where}: this one ingests its own spool only{gone}"


def _daemon_line(daemon: dict) -> str:
    if daemon["state"] != "running":
        return "stopped"
    since = dt.datetime.fromtimestamp(daemon["since"]).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z") \
        if daemon.get("since") else "?"
    how = ", supervised" if daemon.get("supervisor") else ""
    return f"running (pid {daemon['pid']}, since {since}{how})"


def _installed_line(st: dict) -> str:
    if not st["installed"]:
        return "no"
    return "yes" if st["core_pattern_matches"] else "yes, but a different csplice or specifiers than this one's"


def _listener_line(entry: dict | None) -> str | None:
    if entry is None:
        return None
    # A restart is a window in which the kernel dropped dumps: say when and why, so the gap is visible.
    restarted = ""
    if entry.get("restarts"):
        when = dt.datetime.fromtimestamp(entry["last_restart"]).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z") \
            if entry.get("last_restart") else "?"
        restarted = (f"; restarted {entry['restarts']} time{'s' if entry['restarts'] != 1 else ''}, last at "
                     f"{when} (the listener {entry.get('last_restart_why') or 'failed'})")
    if entry["listening"]:
        how = f"supervised, pid {entry['pid']}" if entry["supervised"] else "not supervised by corehandler"
        return (f"listening on {entry['socket_path']} ({how}); {entry['refused_peers']} non-kernel peers refused"
                + restarted)
    return (f"NOT LISTENING on {entry['socket_path']}: the kernel DROPS EVERY DUMP SILENTLY until it is back "
            f"(log: {entry['log_file']}; `corehandler install --mode pipe` needs no listener)" + restarted)


def _sysctl_d_line(entry: dict) -> str:
    if not entry["exists"]:
        return "absent"
    return "matches live" if entry["matches_live"] else "differs from live"


def _spool_line(spool: dict) -> str:
    if "error" in spool:
        return f"unreadable ({spool['error']})"
    orphans = f"{spool['orphans']} orphaned, " if spool["orphans"] is not None else ""
    return f"{spool['pending']} pending, {orphans}{human_size(spool['bytes'])} on disk"


def _store_line(store: dict | None) -> str:
    if store is None:
        return "no index yet"
    if "error" in store:
        return store["error"]
    corrupt = f", {store['corrupt']} corrupt (`corehandler list` shows which)" if store.get("corrupt") else ""
    return f"{store['count']} dumps, {human_size(store['bytes'])}{corrupt}"


def _upload_line(up: dict) -> str:
    from corehandler.store.upload_queue import status_line

    where = up["url"] or "off (queue left from an earlier [upload])"
    if "off" in up:
        where += f" OFF: {up['off']}"
    if "error" in up:
        return f"{where}: {up['error']}"
    return f"{where}: {status_line(up['queue'])}" if up["queue"] is not None else f"{where}: nothing queued yet"


def run_status(args: argparse.Namespace) -> int:
    config, paths = load(args)
    st = overview.status(config, paths, csplice=args.csplice)
    handler = st["csplice"]
    pipe_note = "" if st["core_pipe_limit_ok"] else " (0: /proc/PID may vanish before csplice reads it)"
    lines = [
        f"installed:        {_installed_line(st)}" + (f", {st['mode']} mode" if st["mode"] else ""),
        f"capture:          {_capture_line(st['capture'])}",
        f"core_pattern:     {st['core_pattern']}",
        f"core_pipe_limit:  {st['core_pipe_limit']}{pipe_note}",
        f"sysctl.d:         {st['sysctl_d']['path']}: {_sysctl_d_line(st['sysctl_d'])}",
        f"csplice:          {handler['path']} " + (handler["version"] or f"({handler['problem']})"),
        f"csplice settings: {st['settings']['path']}: {st['settings']['state']}",
        f"spool:            {st['spool']['path']}: {_spool_line(st['spool'])}",
        f"store:            {_store_line(st['store'])}",
        f"daemon:           {_daemon_line(st['daemon'])}",
    ]
    listener_line = _listener_line(st["listener"])
    if listener_line:
        lines.insert(3, f"listener:         {listener_line}")
    if st["upload"] is not None:
        lines.append(f"upload:           {_upload_line(st['upload'])}")
    emit(args, st, "\n".join(lines))
    return 0
