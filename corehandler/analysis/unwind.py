"""Crash analysis of a raw core: every thread's stack, the build-id of every mapped module, the exe checked
against the file on disk, its package note, and the grouping keys (docs/analysis.md).

The unwinder is elfutils' `eu-stack`. It runs as a child of the daemon, never in its process, behind
`prlimit` (address space, CPU time, output file size, no core dumps of its own), `nice`/`ionice` and
`unshare --net` (as far as the host allows: see sandbox()), with an environment holding no DEBUGINFOD_URLS
and no proxies: nothing leaves the host. Its output goes to memory files capped by RLIMIT_FSIZE and is
parsed line by line with every line cut at `Limits.line_chars`, so neither a core with thousands of threads
nor a megabyte C++ symbol makes the daemon hold more than the caps.

The modules and their build-ids come from the core's own notes and first pages (coremodules.py), in the
daemon: a few preads.

start() launches the child and returns at once, so the daemon compresses the same raw core meanwhile;
finish() waits for it until the timeout (counted from start), kills it if it is still running, and parses.
"""

from __future__ import annotations

import os
import shutil
import signal as signals
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from corehandler import fields
from corehandler.analysis import coremodules
from corehandler.analysis.findings import Limits, apply_errors, build_result, parse_stack

# No proxies, no debuginfod: the analyser never reaches the network (and as root has none, see _command).
_ENV = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL": "C"}


# -- eu-stack's output --------------------------------------------------------------------------------------


# -- the files on disk --------------------------------------------------------------------------------------


# -- the children -------------------------------------------------------------------------------------------

def _tool(name: str) -> str | None:
    return shutil.which(name, path=_ENV["PATH"])


_SANDBOX: list[tuple[str, list[str]]] | None = None


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd + ["true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=_ENV, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# RLIMIT_CORE 1, not 0: the kernel runs a pipe handler even for RLIMIT_CORE 0 (csplice then keeps metadata),
# but skips the dump of a process whose limit is 1 (fs/coredump.c's guard for a handler's own helpers), so a
# crashing analyser never reaches our own spool; csplice refuses 1 in socket mode the same way.
CORE_LIMIT = "--core=1"


def sandbox() -> list[tuple[str, list[str]]]:
    """The wrappers that work here, probed once per process: under a systemd unit whose seccomp filter denies
    setrlimit, or without the capability to make a network namespace, a wrapper fails and is left out
    rather than failing every analysis (the result's `sandbox` says which applied)."""
    global _SANDBOX
    if _SANDBOX is None:
        found = []
        candidates = [("limits", [_tool("prlimit"), CORE_LIMIT, "--"]), ("nice", [_tool("nice"), "-n", "19"]),
                      ("ionice", [_tool("ionice"), "-c", "2", "-n", "7"])]
        for name, cmd in candidates:
            if cmd[0] and _works(cmd):
                found.append((name, cmd))
        unshare = _tool("unshare")
        for cmd in ([unshare, "--net", "--"], [unshare, "--user", "--map-root-user", "--net", "--"]):
            if unshare and _works(cmd):
                found.append(("no-network", cmd))
                break
        _SANDBOX = found
    return _SANDBOX


def _command(argv: list[str], limits: Limits) -> list[str]:
    """argv behind the resource limits, low priority and no network, as far as this host allows."""
    cmd = []
    for name, wrapper in sandbox():
        if name == "limits":
            cmd += [wrapper[0], f"--as={limits.memory_bytes}", CORE_LIMIT, f"--cpu={limits.cpu_seconds}",
                    f"--fsize={limits.output_bytes}", "--"]
        else:
            cmd += wrapper
    return cmd + argv


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


def _spawn(argv: list[str], limits: Limits) -> _Child:
    out = os.fdopen(os.memfd_create("corehandler-analysis-out", os.MFD_CLOEXEC), "w+b")
    err = os.fdopen(os.memfd_create("corehandler-analysis-err", os.MFD_CLOEXEC), "w+b")
    try:
        proc = subprocess.Popen(_command(argv, limits), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                env=_ENV, cwd="/", start_new_session=True, close_fds=True)
    except BaseException:
        out.close()
        err.close()
        raise
    child = _Child(proc, out, err)
    # A thread notes the exit as it happens: finish() runs only after compression, and the analysis's time
    # is the child's, not the compression's.
    child.waiter = threading.Thread(target=child._wait, name="analysis-wait", daemon=True)
    child.waiter.start()
    return child


@dataclass
class Running:
    """An analysis under way: both children started, the daemon free to compress meanwhile."""
    core: Path
    record: dict
    limits: Limits
    started: float
    available: bool = True
    stack: _Child | None = None
    problems: list[str] = field(default_factory=list)


def start(core: Path, record: dict, limits: Limits = Limits()) -> Running:
    run = Running(Path(core), record, limits, time.monotonic())
    stack = _tool("eu-stack")
    if stack is None:
        run.available = False
        run.problems.append("eu-stack not found (install elfutils)")
        return run
    core_arg = f"--core={run.core}"
    # No -e EXE: libdwfl then finds every file, the executable too, by the core's file names and rejects one
    # whose build-id differs, so a binary replaced since the crash shows unsymbolised frames, not wrong ones
    # (with -e it would take the file as given).
    argv = [stack, core_arg, "-b", "-m", "-n", str(limits.frames)] + (["-s"] if limits.source_lines else [])
    try:
        run.stack = _spawn(argv, limits)
    except OSError as e:
        run.problems.append(f"cannot start the analyser: {e.strerror}")
        cancel(run)
    return run


def _wait(child: _Child | None, deadline: float) -> bool:
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
    return False


def cancel(run: Running) -> None:
    """Kills and reaps the child (ingest gave up on this dump, or the daemon is stopping)."""
    if run.stack is not None:
        _wait(run.stack, 0)
        run.stack.stdout.close()
        run.stack.stderr.close()
    run.stack = None


def _exit_problem(name: str, child: _Child) -> str | None:
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
    timed_out = not _wait(run.stack, deadline)
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
        p = _exit_problem("eu-stack", run.stack)
        if p:
            problems.append(p)
    cancel(run)
    try:
        modules, modules_cut = coremodules.modules(run.core)
    except OSError as e:
        problems.append(f"cannot read the modules of {run.core.name}: {e.strerror}")
    if timed_out:
        problems.insert(0, f"analyser killed at the {limits.timeout:g} s timeout")
    # The child's own time plus our parsing: not the compression finish() waited behind.
    seconds = ended - run.started + time.monotonic() - parse_started
    result = build_result(run.record, stack, modules, modules_cut, problems, timed_out, available=run.available,
                          seconds=seconds)
    result["sandbox"] = [name for name, _ in sandbox()]
    return result


def analyse(core: Path, record: dict, limits: Limits = Limits()) -> dict:
    return finish(start(core, record, limits))


# -- how it reads (info, the journal) --------------------------------------------------------------------


