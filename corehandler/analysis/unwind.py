"""Crash analysis of a raw core: every thread's stack, the build-id of every mapped module, the exe checked
against the file on disk, its package note, and the grouping keys (docs/analysis.md).

The unwinder is elfutils' `eu-stack`. It runs as a child of the daemon, never in its process, and never as
root: jail.py, started as a fresh interpreter, vets the files the core names (as the crashing user: regular
files reached without symlinks, readable by that user) and reads what this module reports of them, builds a
private read-only view of the system holding only those and the unwinder's own programs, gives it no network
and a PID namespace of its own, and execs eu-stack as the analysis's own uid with no capabilities,
PR_SET_NO_NEW_PRIVS, a seccomp filter, rlimits (address space, CPU time, output file size, no core dumps of
its own) and low priority, with an environment holding no DEBUGINFOD_URLS and no proxies. This process opens
no path the core names. The core is its inherited fd, readable by the analysis's group while it runs. Its output goes to
memory files capped by RLIMIT_FSIZE and is parsed line by line with every line cut at `Limits.line_chars`,
so neither a core with thousands of threads nor a megabyte C++ symbol makes the daemon hold more than the caps.

The modules and their build-ids come from the core's own notes and first pages (coremodules.py), in the
daemon: a few preads.

start() launches the child and returns at once, so the daemon compresses the same raw core meanwhile;
finish() waits for it until the timeout (counted from start), kills it if it is still running, and parses.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal as signals
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from corehandler import elfcore, fields, steps
from corehandler.analysis import account, coremodules, identity, jail, reason
from corehandler.analysis.findings import Limits, apply_errors, build_result, parse_stack

log = logging.getLogger(__name__)

# No proxies, no debuginfod: the analyser never reaches the network (and has none: jail.py).
_ENV = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL": "C"}
# What jail.py may copy into the view of files the analyser's uid cannot read (a user's 0700 binary).
COPY_BYTES = 256 << 20


def _tool(name: str) -> str | None:
    return shutil.which(name, path=_ENV["PATH"])


def sandbox() -> list[str]:
    """What keeps this host's analyses from running at all, said once at the daemon's start: as root, the
    analyser's user must exist (`corehandler install` makes it)."""
    if os.geteuid() == 0 and account.lookup() is None:
        why = f"no user {account.NAME}: crashes are not unwound until `corehandler install` makes it"
        log.warning("Analysis: %s", why)
        return [why]
    return []


@dataclass
class _Child:
    proc: subprocess.Popen
    stdout: BinaryIO
    stderr: BinaryIO
    ended: float | None = None          # when it exited, noted by the waiter thread
    waiter: threading.Thread | None = None

    def _wait(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()


def memfd(name: str) -> BinaryIO:
    return os.fdopen(os.memfd_create(name, os.MFD_CLOEXEC), "w+b")


def foreign(record: dict) -> bool:
    """Whether the crash is of a container (its cgroup names a container, machine or pod) or of another user
    namespace than ours. Its uid is not the host's to vet with: a root container's root is not host root, so
    its paths are vetted as the analysis's own uid (what anyone may read), never as its uid on the host's
    tree. Another mount namespace alone does not count: in the host's user namespace only root makes one
    (a service's sandbox, `unshare -m`), and host root may read those files anyway."""
    ns = identity.namespaces(fields.proc(record).get("ns"))
    try:
        if "user" in ns and ns["user"] != os.stat("/proc/self/ns/user").st_ino:
            return True
    except OSError:
        return True
    who = identity.identify(record)
    return bool(who["container_id"] or who["machine"] or who["pod_uid"])


def _crashing_user(record: dict) -> dict:
    """The crashing process's uid, gid and supplementary groups (its /proc status, read by csplice); no user
    for a crash of another namespace (foreign())."""
    if foreign(record):
        return {"uid": None, "gid": None, "groups": []}
    status = fields.proc(record).get("status")
    groups = []
    for line in (status if isinstance(status, str) else "").splitlines():
        if line.startswith("Groups:"):
            groups = [int(g) for g in line.split()[1:] if g.isdigit()]
    uid, gid = record.get("uid"), record.get("gid")
    return {"uid": uid if isinstance(uid, int) else None, "gid": gid if isinstance(gid, int) else None,
            "groups": groups}


def _exe_path(record: dict) -> str | None:
    exe = fields.proc(record).get("exe")
    return exe if isinstance(exe, str) and not exe.endswith(" (deleted)") else None


def spawn(run: "Running", argv: list[str], files: list[str], binds: tuple[str, ...] = ()) -> _Child:
    """Starts the jail (jail.py) that vets `files` as the crashing user, builds the view (with `binds`, the
    program's own files outside the system trees) and execs argv, which names the core as
    /proc/self/fd/<run.core_fd>."""
    out, err = memfd("corehandler-analysis-out"), memfd("corehandler-analysis-err")
    spec = memfd("corehandler-analysis-spec")
    try:
        limits = run.limits
        spec.write(json.dumps({
            "argv": argv, "core_fd": run.core_fd, "report_fd": run.report.fileno(), "user": run.user,
            "crashing": _crashing_user(run.record), "files": files, "exe": _exe_path(run.record),
            "copy_bytes": COPY_BYTES, "env": _ENV, "debuginfo": limits.debuginfo_path, "binds": list(binds),
            "limits": {"memory_bytes": limits.memory_bytes, "cpu_seconds": limits.cpu_seconds,
                       "output_bytes": limits.output_bytes}}).encode())
        spec.flush()
        spec.seek(0)
        # -I -S: the jail imports the standard library only, from a fresh process (not a preexec hook in
        # this threaded one).
        proc = subprocess.Popen([sys.executable, "-I", "-S", jail.__file__, str(spec.fileno())],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=_ENV, cwd="/",
                                start_new_session=True, close_fds=True,
                                pass_fds=(spec.fileno(), run.core_fd, run.report.fileno()))
    except BaseException:
        out.close()
        err.close()
        raise
    finally:
        spec.close()
    child = _Child(proc, out, err)
    # A thread notes the exit as it happens: finish() runs only after compression, and the analysis's time
    # is the child's, not the compression's.
    child.waiter = threading.Thread(target=child._wait, name="analysis-wait", daemon=True)
    child.waiter.start()
    return child


@dataclass
class Running:
    """An analysis under way: the child started, the daemon free to compress meanwhile."""
    core: Path
    record: dict
    limits: Limits
    started: float
    available: bool = True
    stack: _Child | None = None
    problems: list[str] = field(default_factory=list)
    user: dict | None = None
    core_fd: int = -1
    core_access: tuple[int, int] | None = None  # (mode, gid) to give back once the analyser is done
    report: BinaryIO | None = None


def open_core(run: Running) -> None:
    """The core as an fd for the jail, readable by the analyser's group while it runs (the spool is 0700, so
    only this fd reaches it)."""
    run.core_fd = os.open(run.core, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    if run.user is not None:
        st = os.fstat(run.core_fd)
        run.core_access = (st.st_mode & 0o7777, st.st_gid)
        os.fchown(run.core_fd, -1, run.user["gid"])
        os.fchmod(run.core_fd, 0o640)


def core_arg(run: Running) -> str:
    """eu-stack's --core: the core as the fd the jail's analyser inherits."""
    return "--core=" + core_path(run)


def core_path(run: Running) -> str:
    return f"/proc/self/fd/{run.core_fd}"


def start(core: Path, record: dict, limits: Limits = Limits()) -> Running:
    run = Running(Path(core), record, limits, time.monotonic())
    stack = _tool("eu-stack")
    if stack is None:
        run.available = False
        run.problems.append("eu-stack not found (install elfutils)")
        return run
    if os.geteuid() == 0:
        run.user = account.lookup()
        if run.user is None:
            run.available = False
            run.problems.append(f"no user {account.NAME} to run the analyser as (`corehandler install` makes it)")
            return run
    # No -e EXE: libdwfl then finds every file, the executable too, by the core's file names and rejects one
    # whose build-id differs, so a binary replaced since the crash shows unsymbolised frames, not wrong ones
    # (with -e it would take the file as given). Those names reach it only vetted (jail.py).
    argv = [stack, "-b", "-m", "-n", str(limits.frames)] + (["-s"] if limits.source_lines else [])
    if limits.debuginfo_path:  # the debuginfod cache the daemon fills: read here, never fetched here
        argv.append(f"--debuginfo-path={limits.debuginfo_path}")
    try:
        files = elfcore.inspect_core(run.core).files
        open_core(run)
        run.report = memfd("corehandler-analysis-report")
        run.stack = spawn(run, [argv[0], core_arg(run), *argv[1:]], files)
    except OSError as e:
        run.problems.append(f"cannot start the analyser: {e.strerror}")
        cancel(run)
    return run


def wait_child(child: _Child | None, deadline: float) -> bool:
    """True if the child exited by the deadline; else it is killed (its whole session)."""
    if child is None:
        return True
    child.waiter.join(max(0.0, deadline - time.monotonic()))
    if not child.waiter.is_alive():
        return True
    try:
        os.killpg(child.proc.pid, signals.SIGKILL)
    except ProcessLookupError:
        pass
    child.waiter.join()
    _until_gone(child.proc.pid)
    return False


def _until_gone(group: int, timeout: float = 2.0) -> None:
    """Waits (briefly) until no process of the jail's group runs. The jail's PID namespace init is one: it
    dies of the same SIGKILL, but its exit first ends every process of the namespace, so once it has exited
    the analysis has left nothing behind (a zombie has exited: whoever adopted it reaps it)."""
    deadline = time.monotonic() + timeout
    while _running_in(group) and time.monotonic() < deadline:
        time.sleep(0.005)


def _running_in(group: int) -> bool:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(stat) > 2 and stat[2] == str(group).encode() and stat[0] not in (b"Z", b"X"):
            return True
    return False


def cancel(run: Running) -> None:
    """Kills and reaps the child (ingest gave up on this dump, or the daemon is stopping), and gives the core
    back its own access."""
    if run.stack is not None:
        wait_child(run.stack, 0)
        run.stack.stdout.close()
        run.stack.stderr.close()
    run.stack = None
    if run.core_fd >= 0:
        try:
            if run.core_access is not None:
                os.fchmod(run.core_fd, run.core_access[0])
                os.fchown(run.core_fd, -1, run.core_access[1])
        finally:
            os.close(run.core_fd)
            run.core_fd = -1
    if run.report is not None:
        run.report.close()
        run.report = None


def jail_report(run: Running) -> dict:
    if run.report is None:
        return {}
    run.report.seek(0)
    try:
        report = json.loads(run.report.read() or b"{}")
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def jail_problems(report: dict) -> list[str]:
    out = [f"analyser not started: {report['error']}"] if report.get("error") else []
    out += [str(n) for n in report.get("notes") or []]
    refused = report.get("refused") or []
    if refused:
        shown = "; ".join(f"{path}: {why}" for path, why in refused[:4])
        more = report.get("refused_count", len(refused)) - min(len(refused), 4)
        out.append(f"mapped files not shown to the unwinder: {shown}" + (f" (and {more} more)" if more > 0 else ""))
    return out


def exit_problem(name: str, child: _Child) -> str | None:
    rc = child.proc.returncode
    if rc < 0:
        sig = fields.signal_name(-rc)
        why = " (output over the cap)" if -rc == signals.SIGXFSZ else ""
        return f"{name} killed by {sig}{why}"
    return None


def finish(run: Running) -> dict:
    """Waits for the children (until start + timeout), parses what they wrote, and returns the result: the
    `result` column of the analysis row (docs/analysis.md)."""
    limits = run.limits
    deadline = run.started + limits.timeout
    timed_out = not wait_child(run.stack, deadline)
    parse_started = time.monotonic()
    ended = run.stack.ended if run.stack is not None and run.stack.ended is not None else parse_started
    problems = list(run.problems)
    stack = {"threads": [], "threads_seen": 0, "threads_cut": False, "lines_cut": 0}
    modules: list[dict] = []
    modules_cut = False
    if run.stack is not None:
        for f in (run.stack.stdout, run.stack.stderr):
            f.seek(0)
        stack = parse_stack(run.stack.stdout, limits)
        problems += apply_errors(stack, run.stack.stderr, limits)
        p = exit_problem("eu-stack", run.stack)
        if p:
            problems.append(p)
    report = jail_report(run)
    problems += jail_problems(report)
    cancel(run)
    try:
        modules, modules_cut = coremodules.modules(run.core, problems=problems)
    except OSError as e:
        problems.append(f"cannot read the modules of {run.core.name}: {e.strerror}")
    except Exception as e:  # the core's bytes are the crashed process's: no parser error stops the analysis
        problems.append(steps.problem("module listing", e))
    _disk_facts(modules, report)  # libc's abort-message symbol among them, for the reason
    why = None
    try:
        why = reason.of_core(run.core, run.record, modules, problems)
    except OSError as e:
        problems.append(f"cannot read the crash's reason from {run.core.name}: {e.strerror}")
    except Exception as e:  # the core's bytes are the crashed process's, as above
        problems.append(steps.problem("crash reason", e))
    if timed_out:
        problems.insert(0, f"analyser killed at the {limits.timeout:g} s timeout")
    # The child's own time plus our parsing: not the compression finish() waited behind.
    seconds = ended - run.started + time.monotonic() - parse_started
    result = build_result(run.record, stack, modules, modules_cut, problems, timed_out, available=run.available,
                          seconds=seconds, exe_vetting=report.get("exe"))
    result["sandbox"] = report.get("applied") or []
    result["reason"] = why
    _disk_facts(result["modules"], report)
    return result


def _disk_facts(modules: list[dict], report: dict) -> None:
    """Each module's `disk`: what the jail read of the file at its path as the crashing user (its build-id,
    whether it has its own symbols), for symbols.annotate, which drops it; absent when that user could open
    no file there."""
    files = report.get("files") if isinstance(report.get("files"), dict) else {}
    for m in modules:
        disk = files.get(m.get("file"))
        if isinstance(disk, dict):
            m["disk"] = disk


def analyse(core: Path, record: dict, limits: Limits = Limits()) -> dict:
    return finish(start(core, record, limits))


def interrupt(run: Running) -> None:
    """Kills the child now (the daemon is stopping); the finish() another thread is in returns at once with
    what it wrote."""
    child = run.stack
    if child is not None and child.ended is None:
        try:
            os.killpg(child.proc.pid, signals.SIGKILL)
        except ProcessLookupError:
            pass


# -- how it reads (info, the journal) --------------------------------------------------------------------


