"""install, uninstall, status."""

from __future__ import annotations

import argparse
from pathlib import Path

from corehandler import install
from corehandler.cli import emit, load
from corehandler.units import human_size


def register(commands) -> None:
    parser = commands.add("install", run_install, help="make csplice the kernel's core handler (needs root)")
    parser.add_argument("--force", action="store_true",
                        help="replace another pipe handler in core_pattern (uninstall puts it back)")
    parser.add_argument("--csplice", type=Path, metavar="PATH", help="the csplice to install (default: the "
                        "one installed with this package)")
    parser = commands.add("uninstall", run_uninstall,
                          help="restore the core_pattern and core_pipe_limit from before install (needs root)")
    parser = commands.add("status", run_status, help="what is installed, the kernel's settings, spool and store")
    parser.add_argument("--csplice", type=Path, metavar="PATH", help="the csplice to compare with")


def run_install(args: argparse.Namespace) -> int:
    config, paths = load(args)
    # The daemon hook: branch `packaging` passes start_daemon= (its supervisor) where systemd is not PID 1.
    done = install.install(config, paths, csplice=args.csplice, force=args.force)
    lines = [f"corehandler installed: core_pattern = {done['core_pattern']}",
             f"  core_pipe_limit = {done['core_pipe_limit']}, also in {done['sysctl_d']} for the next boot",
             f"  csplice {done['csplice_version']} settings in {done['settings']}, dumps under {done['state_dir']}"]
    if done["replaced"] is not None:
        lines.append(f"  replaced core_pattern {done['replaced']!r}; `corehandler uninstall` restores it")
    emit(args, done, "\n".join(lines))
    return 0


def run_uninstall(args: argparse.Namespace) -> int:
    _, paths = load(args)
    done = install.uninstall(paths)
    if done["restored"] is not None:
        restored = done["restored"]
        lines = [f"corehandler uninstalled: core_pattern = {restored['kernel.core_pattern']}, core_pipe_limit = "
                 f"{restored['kernel.core_pipe_limit']} (from {done['restored_from']})"]
    else:
        lines = [f"corehandler was not the core handler (core_pattern = {done['left_alone']}); left it alone"]
    if done["sysctl_d_removed"]:
        lines.append("  removed the sysctl.d file")
    emit(args, done, "\n".join(lines))
    return 0


def _installed_line(st: dict) -> str:
    if not st["installed"]:
        return "no"
    return "yes" if st["core_pattern_matches"] else "yes, but a different csplice or specifiers than this one's"


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
    return store.get("error") or f"{store['count']} dumps, {human_size(store['bytes'])}"


def run_status(args: argparse.Namespace) -> int:
    config, paths = load(args)
    st = install.status(config, paths, csplice=args.csplice)
    handler = st["csplice"]
    pipe_note = "" if st["core_pipe_limit_ok"] else " (0: /proc/PID may vanish before csplice reads it)"
    lines = [
        f"installed:        {_installed_line(st)}",
        f"core_pattern:     {st['core_pattern']}",
        f"core_pipe_limit:  {st['core_pipe_limit']}{pipe_note}",
        f"sysctl.d:         {st['sysctl_d']['path']}: {_sysctl_d_line(st['sysctl_d'])}",
        f"csplice:          {handler['path']} " + (handler["version"] or f"({handler['problem']})"),
        f"csplice settings: {st['settings']['path']}: {st['settings']['state']}",
        f"spool:            {st['spool']['path']}: {_spool_line(st['spool'])}",
        f"store:            {_store_line(st['store'])}",
        f"daemon:           {st['daemon']['state']}",
    ]
    emit(args, st, "\n".join(lines))
    return 0
