"""Would a crash now give a full core, and if not what stands in the way (`corehandler why`, README "Would a
crash now keep its core?").

Each check is one thing the kernel or csplice applies to a dump, read as it stands now, with a verdict (ok;
stops: no core is kept; cuts: a core is kept, cut short or without some memory; unknown: not this caller's to
read) and the fix in words. The host's checks (kernel.core_pattern, core_pipe_limit) come once, the rest per
process: its RLIMIT_CORE and its unit's LimitCORE=, whether it is dumpable, its coredump_filter, and csplice's
own limits from the csplice.conf csplice reads (max_dump_size, the free-space floor, the spool's backlog, the
crash-storm limit) against the process's size now and the spool as it is. The same rules as csplice's admission
(csplice/admit.c) and the kernel's (fs/coredump.c), read, never tried: nothing here crashes or changes anything.
The words hold what processes chose (unit and executable names) raw; the CLI escapes each line it prints
(printable.py).
"""

from __future__ import annotations

import os
import resource
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from corehandler import nocore, spool
from corehandler import paths as paths_mod
from corehandler.csplice_contract import parse_settings
from corehandler.host import handler, listener, procfacts, sysctl, unitlimits
from corehandler.host.procfacts import Process
from corehandler.paths import Host, Paths
from corehandler.units import human_size, parse_size

OK, STOPS, CUTS, UNKNOWN = "ok", "stops", "cuts", "unknown"
VERDICT_WORDS = {OK: "ok", STOPS: "stops the core", CUTS: "cuts the core", UNKNOWN: "unknown"}
CAPTURE_SPACE_STEP = 16 << 20  # csplice/capture.h: the headroom admission asks beyond the floor


@dataclass
class Check:
    name: str
    verdict: str
    detail: str
    fix: str | None = None


def _check(name: str, verdict: str, detail: str, fix: str | None = None) -> Check:
    return Check(name, verdict, detail, fix if verdict != OK else None)


def full_core(checks: list[Check]) -> bool:
    """Nothing read stands in the way (an unknown check does not count: it is what the caller may not read)."""
    return all(c.verdict in (OK, UNKNOWN) for c in checks)


# -- the host ------------------------------------------------------------------------------------------------

@dataclass
class HostState:
    pattern: str
    pipe_limit: str
    suid_dumpable: int | None
    mode: str | None                 # pipe | socket while a corehandler pattern is live, else None
    owner: str | None                # the state dir of the installation capturing, if one does
    this: bool                       # ... and it is this one
    displaced: bool
    listening: bool | None           # socket mode: something listens on the socket
    socket_path: str
    settings: dict[str, str]         # csplice.conf as csplice reads it
    settings_from: str


def csplice_settings(host: Host) -> tuple[dict[str, str], str]:
    """The settings csplice runs with: csplice.conf's, over csplice's built-in defaults (`--list-settings`) for
    what it leaves out or when it is missing or unreadable (csplice/settings.c does the same)."""
    try:
        listed = subprocess.run([str(paths_mod.csplice_path()), "--list-settings"], capture_output=True, text=True,
                                timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    values = parse_settings(listed)
    try:
        text = host.csplice_settings.read_text(errors="replace")
    except OSError as e:
        return values, f"csplice's built-in defaults ({host.csplice_settings}: {e.strerror})"
    return values | parse_settings(text), str(host.csplice_settings)


def host_state(paths: Paths, socket_path: Path, host: Host = Host()) -> HostState:
    pattern = sysctl.read_or_none(sysctl.CORE_PATTERN, host.sysctl_root) or ""
    found = handler.owner(host, socket_path) if pattern else None
    mode = handler.mode_of(pattern) if found else None
    suid = sysctl.read_or_none(sysctl.SUID_DUMPABLE, host.sysctl_root)
    settings, source = csplice_settings(host)
    return HostState(
        pattern=pattern, pipe_limit=sysctl.read_or_none(sysctl.CORE_PIPE_LIMIT, host.sysctl_root) or "",
        suid_dumpable=int(suid) if suid and suid.isdigit() else None, mode=mode,
        owner=found.state_dir if found else None, this=handler.is_me(found, paths),
        displaced=found is None and handler.displaced(host, paths, socket_path),
        listening=listener.listening(socket_path, host.proc_root) if mode == "socket" else None,
        socket_path=str(socket_path), settings=settings, settings_from=source)


def host_checks(state: HostState) -> list[Check]:
    shown = state.pattern
    if state.mode is None:
        program = handler.handler_program(state.pattern)
        where = (f"the kernel runs {program} for every core, not corehandler" if program is not None
                 else f"the kernel writes a core file itself ({shown}, relative to the crashed process's working "
                 "directory), which corehandler never sees")
        if state.displaced:
            where = f"another handler took the pattern over from corehandler: {shown} (a package's postinst, " \
                    "e.g. systemd-coredump's on every systemd update)"
        out = [_check("core_pattern", STOPS, where, "`corehandler install` (it saves the current handler and "
                      "`corehandler uninstall` puts it back)")]
    else:
        who = "this installation" if state.this else f"the installation in {state.owner}"
        out = [_check("core_pattern", OK, f"corehandler's csplice captures every core ({state.mode} mode, {who})")]
        if state.mode == "socket" and not state.listening:
            out.append(_check("listener", STOPS, f"nothing listens on {state.socket_path}: the kernel "
                              "drops every core", "start the daemon (`systemctl start corehandler`), or "
                              "`corehandler install --mode pipe`"))
    if handler.mode_of(state.pattern) == "pipe":
        limit = int(state.pipe_limit) if state.pipe_limit.isdigit() else None
        if limit == 0:
            out.append(_check("core_pipe_limit", OK, "0: the kernel does not wait for the handler, which may find "
                              "/proc/PID gone (a core without the process's facts)"))
        elif limit is not None:
            out.append(_check("core_pipe_limit", OK, f"{limit}: up to {limit} crashes are piped at once; one more "
                              "at the same moment gets no core"))
    return out


# -- a process ---------------------------------------------------------------------------------------------

def _size(n: int | None) -> str:
    return "?" if n is None else human_size(n)


def _limit(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


def rlimit_check(soft: int | None, read: bool, size: int | None, unit: str | None) -> Check:
    if not read:
        return _check("rlimit_core", UNKNOWN, "its /proc/PID/limits cannot be read")
    where = nocore.rlimit_where(unit)
    if soft in (0, 1):
        # 1 is the kernel's own guard against a handler's helpers crashing into it: never piped either.
        return _check("rlimit_core", STOPS, f"its RLIMIT_CORE is {soft} ({where}): it asks for no core",
                      nocore.rlimit_fix(unit))
    if soft is None:
        return _check("rlimit_core", OK, "RLIMIT_CORE unlimited")
    if size is not None and soft < size:
        return _check("rlimit_core", CUTS, f"its RLIMIT_CORE of {_size(soft)} ({where}) cuts a core of about "
                      f"{_size(size)}", nocore.rlimit_fix(unit))
    return _check("rlimit_core", OK, f"RLIMIT_CORE {_size(soft)}" + (f", above its core of about {_size(size)}"
                                                                      if size is not None else ""))


def unit_check(unit: unitlimits.Unit, size: int | None) -> Check:
    name = unit.name
    soft = unit.limit_core_soft
    fix = f"`systemctl edit {name}` and set LimitCORE=infinity under [Service], then restart it"
    if soft in (0, 1):
        return _check("unit_limit_core", STOPS, f"{name} has LimitCORE={soft}: every process it starts asks for "
                      "no core", fix)
    if soft is not None and size is not None and soft < size:
        return _check("unit_limit_core", CUTS, f"{name} has LimitCORE={_size(soft)}: its processes' cores are cut "
                      "there", fix)
    return _check("unit_limit_core", OK, f"{name} has LimitCORE={'infinity' if soft is None else _size(soft)}")


def dumpable_check(p: Process, state: HostState, proc: Path) -> Check:
    if p.kernel_thread:
        return _check("dumpable", STOPS, "a kernel thread: the kernel writes no core of it", "none")
    flag = procfacts.dumpable(p, proc)
    exe_why = procfacts.privileged_exe(p.exe) if p.exe else None
    mixed = len(set(p.uids[:3])) > 1 or len(set(p.gids[:3])) > 1
    suid = state.suid_dumpable
    if flag == procfacts.DUMPABLE:
        return _check("dumpable", OK, "dumpable")
    if flag == procfacts.DUMPABLE_UNKNOWN:
        why = ("a process of root's holding CAP_SYS_PTRACE: the kernel shows its dumpable flag to nobody"
               if p.uids and p.uids[1] == 0 and os.geteuid() == 0 else "not yours: /proc does not show it to you")
        return _check("dumpable", UNKNOWN, why)
    changed = exe_why or ("its ids differ (real, effective, saved)" if mixed else None)
    if changed and suid == 2:
        return _check("dumpable", OK, f"{changed}: dumped as root (fs.suid_dumpable=2), a core only root may see")
    if changed:
        return _check("dumpable", STOPS, f"not dumpable: {changed}, and fs.suid_dumpable is {suid}",
                      "`sysctl fs.suid_dumpable=2` (such cores are then written as root and root's alone to "
                      "see), or run it without the id change")
    return _check("dumpable", STOPS, "not dumpable: the program turned it off itself (prctl(PR_SET_DUMPABLE, 0): "
                  "ssh-agent, gpg-agent and sandboxes do so on purpose, to keep their memory out of cores)",
                  "only the program can turn it back on (its own option or prctl(PR_SET_DUMPABLE, 1)); "
                  "`gcore PID` as root takes a core of it while it runs")


def filter_check(p: Process) -> Check:
    f = p.coredump_filter
    if f is None:
        return _check("coredump_filter", UNKNOWN, "its /proc/PID/coredump_filter cannot be read")
    missing = [what for bit, what in procfacts.FILTER_BITS.items() if procfacts.DEFAULT_FILTER >> bit & 1
               and not f >> bit & 1]
    if not missing:
        return _check("coredump_filter", OK, f"{f:#x}")
    sizes = (f": the core would hold about {_size(p.dump_bytes)} of the {_size(p.default_dump_bytes)} the default "
             f"{procfacts.DEFAULT_FILTER:#x} gives" if p.dump_bytes is not None else "")
    nothing = " (only the notes and registers are left)" if f & 0x1FF == 0 else ""
    return _check("coredump_filter", CUTS, f"{f:#x} leaves out {', '.join(missing)}{nothing}{sizes}",
                  f"`echo {procfacts.DEFAULT_FILTER:#x} > /proc/{p.pid}/coredump_filter` (as its user or root; "
                  "children inherit it), CoredumpFilter=default in its unit, or coredump_filter= on the kernel "
                  "command line")


def _free(spool_dir: Path) -> tuple[int, int] | None:
    """(available, total) bytes of the spool's filesystem (its nearest existing directory: csplice makes it)."""
    path = spool_dir
    while True:
        try:
            sv = os.statvfs(path)
            return sv.f_bavail * sv.f_frsize, sv.f_blocks * sv.f_frsize
        except FileNotFoundError:
            if path.parent == path:
                return None
            path = path.parent
        except OSError:
            return None


def _floor(value: str, total: int) -> int:
    if value.endswith("%"):
        return total // 100 * int(value[:-1] or 0)
    try:
        return parse_size(value)
    except ValueError:
        return 0


def settings_checks(p: Process | None, uid: int, key: str | None, state: HostState, size: int | None,
                    disk: int | None, now: float | None = None) -> list[Check]:
    """csplice's limits for a crash of uid's key (its exe), of size bytes taking about disk bytes of disk."""
    s = state.settings
    spool_dir = Path(s.get("spool_dir") or paths_mod.spool_dir(paths_mod.DEFAULT_STATE_DIR))
    out = []
    limit = _limit(s.get("max_dump_size"))
    if limit == 0:
        out.append(_check("max_dump_size", OK, "no limit"))
    elif size is not None and size > limit:
        refused = state.mode == "socket"
        out.append(_check("max_dump_size", STOPS if refused else CUTS,
                          f"a core of about {_size(size)} is over [capture] max_dump_size ({_size(limit)}): "
                          + ("refused before it is written" if refused else "cut there"),
                          "raise " + nocore.config_fix("max_dump_size")))
    else:
        out.append(_check("max_dump_size", OK, f"{_size(limit)}" + (f", above its core of about {_size(size)}"
                                                                    if size is not None else "")))
    free = _free(spool_dir)
    if free is None:
        out.append(_check("min_free", UNKNOWN, f"cannot read the free space of {spool_dir}"))
    else:
        avail, total = free
        floor = _floor(s.get("min_free", "0"), total)
        room = avail - floor
        fix = ("free space on the spool's filesystem (`corehandler vacuum`, `df`), or lower "
               + nocore.config_fix("min_free"))
        detail = f"{_size(avail)} free in {spool_dir}, floor {s.get('min_free', '0')} ({_size(floor)})"
        if floor and room < CAPTURE_SPACE_STEP:
            out.append(_check("min_free", STOPS, detail + ": at the floor, a crash keeps metadata only", fix))
        elif floor and disk is not None and room < disk:
            out.append(_check("min_free", CUTS, detail + f": about {_size(disk)} of core would not fit above it",
                              fix))
        else:
            out.append(_check("min_free", OK, detail))
    out += _spool_checks(uid, key, s, spool_dir, now)
    return out


def _spool_checks(uid: int, key: str | None, s: dict[str, str], spool_dir: Path, now: float | None) -> list[Check]:
    """The backlog and the crash-storm limit, as csplice's admission counts them (admit.c)."""
    max_pending, per_uid, rate = (_limit(s.get(k)) for k in ("max_pending", "max_pending_per_uid",
                                                              "max_per_exe_per_minute"))
    out = []
    try:
        pending = spool.count_pending(spool_dir, uid) if max_pending else None
        count = spool.rate_count(spool_dir, uid, key, now) if rate and key is not None else None
    except FileNotFoundError:
        pending, count = spool.Pending(0, 0, 0), 0
    except OSError as e:
        why = (f"the spool ({spool_dir}) is root's: only root can count what waits there" if
               isinstance(e, PermissionError) else f"cannot read {spool_dir}: {e.strerror}")
        return [_check("max_pending", UNKNOWN, why), _check("max_per_exe_per_minute", UNKNOWN, why)]
    if not max_pending:
        out.append(_check("max_pending", OK, "no limit"))
    else:
        share = max_pending if uid == 0 else min(per_uid or max_pending, max_pending)
        others = pending.mine if uid == 0 else pending.all - pending.root
        fix = "check the daemon runs and keeps up (`corehandler status`), or raise "
        if others >= max_pending:
            out.append(_check("max_pending", STOPS, f"{others} dumps wait in the spool, [capture] max_pending is "
                              f"{max_pending}: a crash keeps metadata only", fix + nocore.config_fix("max_pending")))
        elif pending.mine >= share:
            out.append(_check("max_pending_per_uid", STOPS, f"uid {uid} has {pending.mine} dumps waiting, its share "
                              f"is {share}: a crash keeps metadata only",
                              fix + nocore.config_fix("max_pending_per_uid")))
        else:
            out.append(_check("max_pending", OK, f"{pending.mine} of uid {uid}'s {share} and {others} of "
                              f"{max_pending} dumps waiting"))
    if not rate:
        out.append(_check("max_per_exe_per_minute", OK, "no limit"))
    elif count is None:
        out.append(_check("max_per_exe_per_minute", UNKNOWN, "its executable is not yours to read"))
    elif count >= rate:
        out.append(_check("max_per_exe_per_minute", STOPS, f"crash storm: it crashed {count} times this minute as "
                          f"uid {uid}, [capture] max_per_exe_per_minute is {rate}: the next keeps metadata only",
                          "fix the crash loop (its unit's Restart=), wait for the minute to pass, or raise "
                          + nocore.config_fix("max_per_exe_per_minute")))
    else:
        out.append(_check("max_per_exe_per_minute", OK, f"{count} crashes this minute of {rate}"))
    return out


def process_checks(p: Process, state: HostState, unit: unitlimits.Unit | None = None,
                   proc: Path = procfacts.PROC, now: float | None = None) -> list[Check]:
    size = p.dump_bytes if p.dump_bytes is not None else p.vsz
    # What the spool takes: sparse writing skips the pages never touched, about all but the resident ones.
    disk = min(size, (p.rss or 0) + procfacts.NOTES_ESTIMATE) if size is not None and \
        state.settings.get("sparse", "yes") == "yes" else size
    out = [rlimit_check(p.rlimit_soft, p.rlimit_read, size, p.user_unit or p.unit)]
    if unit is not None:
        out.append(unit_check(unit, size))
    out += [dumpable_check(p, state, proc), filter_check(p)]
    out += settings_checks(p, p.uid if p.uid is not None else -1, p.exe or p.comm, state, size, disk, now)
    return out


def new_process_checks(exe: str | None, state: HostState, unit: unitlimits.Unit | None = None,
                       now: float | None = None) -> list[Check]:
    """For an executable nothing runs now: what a process of it started from here (this shell's limits, its
    coredump_filter; or the unit's LimitCORE=) would meet, its size unknown."""
    out = []
    if unit is not None:
        out.append(unit_check(unit, None))
    else:
        soft, _ = resource.getrlimit(resource.RLIMIT_CORE)
        check = rlimit_check(None if soft == resource.RLIM_INFINITY else soft, True, None, None)
        check.detail = "started from this shell: " + check.detail
        out.append(check)
    privileged = procfacts.privileged_exe(exe) if exe else None
    if privileged and os.getuid() != 0 and state.suid_dumpable != 2:
        out.append(_check("dumpable", STOPS, f"{exe} is {privileged}: run by you it changes ids and is not "
                          f"dumpable while fs.suid_dumpable is {state.suid_dumpable}",
                          "`sysctl fs.suid_dumpable=2` (such cores are then written as root and root's alone to "
                          "see)"))
    elif privileged and os.getuid() != 0:
        out.append(_check("dumpable", OK, f"{privileged}: dumped as root (fs.suid_dumpable=2), a core only root "
                          "may see"))
    elif exe:
        out.append(_check("dumpable", OK, "dumpable unless it turns that off itself"
                          + (f" ({privileged}, which changes no ids when root runs it)" if privileged else "")))
    me = procfacts.read(os.getpid())
    if me is not None and unit is None:
        check = filter_check(me)
        check.detail = "inherited from this shell: " + check.detail
        out.append(check)
    out += settings_checks(None, os.getuid(), exe, state, None, None, now)
    return out


def as_dict(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]


def process_summary(p: Process) -> dict:
    return {"pid": p.pid, "comm": p.comm, "exe": p.exe, "uid": p.uid, "unit": p.unit, "user_unit": p.user_unit,
            "rlimit_core": p.rlimit_soft, "rlimit_core_hard": p.rlimit_hard,
            "coredump_filter": None if p.coredump_filter is None else f"{p.coredump_filter:#x}",
            "rss_bytes": p.rss, "vsz_bytes": p.vsz, "dump_bytes": p.dump_bytes}
