"""why: would a crash now keep a full core (host/coreready.py), for a running process, a unit or an executable;
and for a stored dump without its core, why it has none (nocore.py).

WHAT is read as a dump id (or a unique id prefix) when it looks like one, a PID when it is a number, an
executable when it holds a '/', a unit when it ends in a unit's suffix or names a loaded service, else an
executable found on $PATH (or, if none, the processes whose comm it is). Exit status 0: a full core would be kept
(or was, for a dump); 1: something stands in the way (or stood: the dump has none or a cut one).
"""

from __future__ import annotations

import argparse
import os
import shutil

from corehandler import nocore, spool
from corehandler.cli.common import base_paths, emit, load
from corehandler.cli.selection import open_dumps
from corehandler.config import Config
from corehandler.errors import EXIT_NOMATCH, ConfigError, NoMatchError, UsageError
from corehandler.host import coreready, procfacts, unitlimits
from corehandler.host.coreready import VERDICT_WORDS, Check
from corehandler.paths import Host
from corehandler.printable import display
from corehandler.store import match
from corehandler.units import human_size

# The host's files as csplice and the kernel see them; a test points this elsewhere.
HOST = Host()


def register(commands) -> None:
    parser = commands.add("why", run_why, help="would a crash now keep a full core, and if not what stands in the "
                          "way, each with its fix: RLIMIT_CORE, the unit's LimitCORE=, dumpable, coredump_filter, "
                          "core_pattern, csplice's size, free-space, backlog and storm limits (changes nothing); "
                          "for a stored dump, why it has no core; exits 0 when a full core would be (was) kept, 1 "
                          "when not")
    parser.add_argument("what", metavar="PID|UNIT|EXE|ID", help="a running process, a systemd unit, an executable "
                        "(path or name: its running processes, else a new one) or a stored dump's id")
    parser.add_argument("--user", action="store_true", help="UNIT is a unit of the caller's user manager "
                        "(systemctl --user)")


def _host_state(args: argparse.Namespace):
    try:
        config, paths = load(args)
    except ConfigError:
        config, paths = Config(), base_paths(args)  # the host's facts need no config
    return coreready.host_state(paths, config.kernel.socket_path, HOST)


def _unit_of(name: str, user: bool) -> unitlimits.Unit | None:
    """The unit, if name is one systemd has loaded; None when systemd has no such unit or cannot be asked."""
    try:
        unit = unitlimits.show(name, user)
    except unitlimits.SystemdUnavailable:
        return None
    return unit if unit.load_state == "loaded" else None


def _unit_for(p: procfacts.Process) -> unitlimits.Unit | None:
    """The system unit a process runs in, as systemd has it now (for its LimitCORE=), if systemd answers."""
    if not p.unit or p.user_unit or p.unit == "init.scope" or p.unit.startswith("user@"):
        return None
    return _unit_of(p.unit, False)


def _process_entry(p: procfacts.Process, state, unit: unitlimits.Unit | None) -> dict:
    checks = coreready.process_checks(p, state, unit if unit is not None else _unit_for(p))
    return {**coreready.process_summary(p), "full_core": coreready.full_core(checks),
            "checks": coreready.as_dict(checks)}


def _comm_matches(name: str) -> list[int]:
    found = []
    for entry in os.listdir(procfacts.PROC):
        if entry.isdigit():
            try:
                comm = (procfacts.PROC / entry / "comm").read_text(errors="surrogateescape").removesuffix("\n")
            except OSError:
                continue
            if comm == name[:15]:
                found.append(int(entry))
    return found


def _processes(pids: list[int]) -> list[procfacts.Process]:
    return [p for p in map(procfacts.read, pids) if p is not None]


def resolve(what: str, user: bool) -> tuple[str, str, list[procfacts.Process], unitlimits.Unit | None]:
    """(kind, name, its processes, its unit): kind pid | unit | exe."""
    if what.isdigit():
        found = _processes([int(what)])
        if not found:
            raise NoMatchError(f"no process {what}")
        return "pid", what, found, None
    unit = None
    if what.endswith(unitlimits.UNIT_SUFFIXES) or (user and "/" not in what):
        try:
            unit = unitlimits.show(what, user)
        except unitlimits.SystemdUnavailable as e:
            raise UsageError(f"cannot ask systemd about {display(what)}: {e}") from None
        if unit.load_state != "loaded":
            raise NoMatchError(f"no unit {display(unit.name)} ({display(unit.load_state)})")
    elif "/" not in what:
        unit = _unit_of(what, False)
    if unit is not None:
        return "unit", unit.name, _processes([unit.main_pid] if unit.main_pid else []), unit
    exe = shutil.which(what) if "/" not in what else what
    if exe is None:
        return "exe", what, _processes(_comm_matches(what)), None
    exe = os.path.realpath(exe)
    if not os.path.exists(exe):
        raise NoMatchError(f"no executable {display(what)}")
    return "exe", exe, _processes(procfacts.find_by_exe(exe)), None


def _line(c: dict) -> str:
    """A check as one line, escaped whole: its words name units and executables their owners chose."""
    fix = f" Fix: {c['fix']}." if c.get("fix") else ""
    return f"  {c['name']:<24} {VERDICT_WORDS[c['verdict']]:<15} {display(c['detail'] + fix)}"


def _head(entry: dict) -> str:
    who = f"PID {entry['pid']}" + (f" ({display(entry['comm'])})" if entry["comm"] else "")
    about = [f"uid {entry['uid']}"] if entry["uid"] is not None else []
    about += [display(entry["exe"])] if entry["exe"] else []
    about += [f"unit {display(entry['unit'])}"] if entry["unit"] and entry["unit"] != "init.scope" else []
    if entry["dump_bytes"] is not None:
        about.append(f"core about {human_size(entry['dump_bytes'])}")
    verdict = "a crash now keeps a full core" if entry["full_core"] else "a crash now would NOT keep a full core"
    return f"{who}, {', '.join(about)}: {verdict}"


def _dump(args: argparse.Namespace) -> int:
    with open_dumps(args) as dumps:
        found = dumps.query(match.build([args.what]))
        if not found:
            raise NoMatchError(f"no dump {display(args.what)}")
        d = found[-1]
        missing = nocore.explain(d.record)
        gone = missing is None and d.path is None and d.status != "compressing"
    result = {"id": d.id, "full_core": missing is None and not gone, "no_core": missing,
              "deleted_by_retention": gone}
    if missing:
        text = (f"{d.id}: {'no core' if missing['kind'] == 'dropped' else 'a cut core'}: {missing['why']}.\n"
                f"What to do: {missing['fix']}.")
    elif gone:
        text = (f"{d.id}: its full core was kept, then deleted by retention"
                + (" (its mini core is left: `corehandler debug` opens it)" if d.mini_path else "") + ".")
    else:
        text = f"{d.id}: its full core was kept."
    emit(args, result, text)
    return 0 if result["full_core"] else EXIT_NOMATCH


def _is_dump_id(what: str) -> bool:
    return bool(spool.ID_RE.match(what) or spool.ID_PREFIX_RE.fullmatch(what))


def run_why(args: argparse.Namespace) -> int:
    if _is_dump_id(args.what):
        return _dump(args)
    kind, name, processes, unit = resolve(args.what, args.user)
    state = _host_state(args)
    host = coreready.host_checks(state)
    entries = [_process_entry(p, state, unit) for p in processes]
    new: list[Check] = []
    if not entries:
        if kind == "pid":
            raise NoMatchError(f"no process {display(args.what)}")
        if kind == "exe" and not os.path.exists(name):
            raise NoMatchError(f"no running process and no executable {display(name)}")
        new = coreready.new_process_checks(name if kind == "exe" else None, state, unit)
    ok = coreready.full_core(host) and all(e["full_core"] for e in entries) and coreready.full_core(new)
    result = {"what": args.what, "kind": kind, "name": name, "full_core": ok,
              "host": coreready.as_dict(host), "processes": entries,
              "new_process": coreready.as_dict(new) if not entries else None,
              "settings_from": state.settings_from}
    lines = [f"host: kernel.core_pattern {display(state.pattern)}; csplice's settings from "
             f"{display(state.settings_from)}"]
    lines += [_line(c) for c in result["host"]]
    for entry in entries:
        lines += [_head(entry)] + [_line(c) for c in entry["checks"]]
    if not entries:
        what = f"unit {display(name)}" if kind == "unit" else display(name)
        lines.append(f"{what}: nothing of it runs now; a new process of it "
                     + ("would keep a full core" if ok else "would NOT keep a full core"))
        lines += [_line(c) for c in result["new_process"]]
    emit(args, result, "\n".join(lines))
    return 0 if ok else EXIT_NOMATCH
