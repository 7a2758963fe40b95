"""What an analysis found: eu-stack's output parsed, the result record, its lines for display."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, BinaryIO

from corehandler import fields
from corehandler.analysis import identity, signature
from corehandler.printable import display

# Outcomes of an analysis (the `state` of an analysis row).
OK = "ok"                    # every thread unwound as far as the caps allow


PARTIAL = "partial"          # frames found, but something was cut or failed (see `problems`)


FAILED = "failed"            # the unwinder found nothing (crashed, or a core it cannot read)


TIMEOUT = "timeout"          # killed at the timeout; whatever it wrote before is kept


UNAVAILABLE = "unavailable"  # eu-stack is not installed


SKIPPED = "skipped"          # no core to analyse (metadata only, invalid, raw core gone)


STATES = (OK, PARTIAL, FAILED, TIMEOUT, UNAVAILABLE, SKIPPED)


MAX_PROBLEMS = 32


@dataclass(frozen=True)
class Limits:
    timeout: float = 30.0               # seconds from start() until the children are killed
    memory_bytes: int = 2 << 30         # RLIMIT_AS of each child
    cpu_seconds: int = 60               # RLIMIT_CPU of each child
    output_bytes: int = 16 << 20        # RLIMIT_FSIZE: what each child may write
    threads: int = 64                   # threads kept (the crashing one first)
    frames: int = 64                    # frames per thread (eu-stack -n)
    line_chars: int = 512               # a symbol, module or source path longer is cut
    source_lines: bool = False          # eu-stack -s: file:line per frame (costs 50-300 ms with debug info)
    debuginfo_path: str | None = None   # eu-stack --debuginfo-path: where separate debug files are (debuginfod.py)


def _cut(text: str, limit: int) -> str:
    """text as the unwinder wrote it (escaped only when printed: printable.py), cut at limit characters."""
    return text[:limit] + ("...[cut]" if len(text) > limit else "")


def _lines(f: BinaryIO, limit: int):
    """The lines of f, each decoded and cut at `limit` bytes; the rest of a longer line is skipped unread
    into memory. Yields (text, was_cut)."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        cut = len(line) > limit and not line.endswith(b"\n")
        if cut:
            while True:
                rest = f.readline(1 << 16)
                if not rest or rest.endswith(b"\n"):
                    break
        yield line[:limit].rstrip(b"\n").decode("utf-8", "surrogateescape"), cut


_TID = re.compile(r"^TID (\d+):$")


_FRAME = re.compile(r"^#(\d+)\s+0x([0-9a-f]+)(?: (.*))?$")


_BUILD_ID = re.compile(r"^    \[([0-9a-f]*)\]@0x([0-9a-f]+)\+0x([0-9a-f]+)$")


_SOURCE = re.compile(r"^    (.+?):(\d+)(?::\d+)?$")


_THREAD_ERROR = re.compile(r"^(?:\S*/)?eu-stack: dwfl_thread_getframes tid (\d+) at 0x[0-9a-f]+ in .*?: (.*)$")


_MAX_FRAMES = re.compile(r"^(?:\S*/)?eu-stack: tid (\d+): shown max number of frames")


def _frame_fields(frame: dict, rest: str | None, limit: int) -> None:
    """`FUNCTION - MODULE`, `- MODULE` or nothing, after the pc."""
    function = module = None
    if rest:
        if rest.startswith("- "):
            module = rest[2:]
        else:
            function, sep, module = rest.rpartition(" - ")
            if not sep:
                function, module = rest, None
    frame["function"] = _cut(function, limit) if function else None
    frame["module"] = _cut(module, limit) if module else None


def parse_stack(f: BinaryIO, limits: Limits) -> dict:
    """eu-stack -b -m -s output -> {threads: [{tid, frames: [...]}], threads_seen, threads_cut, lines_cut}.
    A line that fits no pattern continues the previous frame's line (a symbol with a newline in it)."""
    threads: list[dict] = []
    seen = 0
    lines_cut = 0
    frame: dict | None = None
    frame_text = ""
    for line, cut in _lines(f, limits.line_chars):
        lines_cut += cut
        m = _TID.match(line)
        if m:
            seen += 1
            frame = None
            if len(threads) < limits.threads:
                threads.append({"tid": int(m.group(1)), "frames": []})
            continue
        if not threads or seen > limits.threads:
            continue
        frames = threads[-1]["frames"]
        m = _FRAME.match(line)
        if m and len(frames) < limits.frames:
            frame = {"index": int(m.group(1)), "pc": int(m.group(2), 16), "function": None, "module": None,
                     "build_id": None, "offset": None, "file": None, "line": None}
            frame_text = m.group(3) or ""
            _frame_fields(frame, frame_text or None, limits.line_chars)
            if cut:  # the module after the name is lost with the rest of the line
                frame["function"] = f"{frame['function'] or frame['module'] or ''}...[cut]"
                frame["module"] = None
            frames.append(frame)
            continue
        if frame is None:
            continue
        m = _BUILD_ID.match(line)
        if m:
            frame["build_id"] = m.group(1) or None
            frame["offset"] = int(m.group(3), 16)
            continue
        m = _SOURCE.match(line)
        if m and frame["offset"] is not None:
            frame["file"] = _cut(m.group(1), limits.line_chars)
            frame["line"] = int(m.group(2))
            continue
        if frame["build_id"] is None and frame["offset"] is None:
            frame_text += "\n" + line
            _frame_fields(frame, frame_text, limits.line_chars)
    return {"threads": threads, "threads_seen": seen, "threads_cut": seen > len(threads), "lines_cut": lines_cut}


def apply_errors(stack: dict, stderr: BinaryIO, limits: Limits) -> list[str]:
    """eu-stack's complaints: per-thread unwinding errors go on the thread, frame caps set frames_cut;
    the rest comes back as problems."""
    by_tid = {t["tid"]: t for t in stack["threads"]}
    problems = []
    for line, _ in _lines(stderr, limits.line_chars):
        m = _THREAD_ERROR.match(line)
        if m:
            t = by_tid.get(int(m.group(1)))
            if t is not None:
                t["error"] = _cut(m.group(2), limits.line_chars)
            continue
        m = _MAX_FRAMES.match(line)
        if m:
            t = by_tid.get(int(m.group(1)))
            if t is not None:
                t["frames_cut"] = True
            continue
        if line.strip() and len(problems) < MAX_PROBLEMS:
            problems.append(_cut(line, limits.line_chars))
    return problems


def check_exe(exe_path: str | None, core_build_id: str | None, vetting: dict | None = None) -> dict:
    """The exe then (its build-id in the core) against the file at its path now: "same", "replaced" (other
    build-id), "deleted" (/proc said so at the crash), "unreadable" (no file there the crashing user could
    open: gone, or not theirs to read, which read alike), "unknown" (no build-id to compare, or the analyser's
    jail did not run). The path is the crashing process's to choose: the daemon never opens it; the jail
    vetted and read it as the crashing user (`vetting`, its report's `exe`: why it was refused, else the
    build-id it read)."""
    out: dict[str, Any] = {"path": exe_path, "build_id": core_build_id, "disk_build_id": None, "state": "unknown"}
    if not exe_path:
        return out
    if exe_path.endswith(" (deleted)"):
        out["state"] = "deleted"
        return out
    if not isinstance(vetting, dict):
        return out
    refused, disk_id = vetting.get("refused"), vetting.get("build_id")
    if vetting.get("python") is True:  # a CPython interpreter by its symbols (jail._exe_facts): pyframes.py
        out["python"] = True
    if refused:
        out["state"], out["problem"] = "unreadable", str(refused)
        return out
    out["disk_build_id"] = disk_id if isinstance(disk_id, str) else None
    if core_build_id and out["disk_build_id"]:
        out["state"] = "same" if out["disk_build_id"] == core_build_id else "replaced"
    return out


def exe_module(modules: list[dict], exe_path: str | None) -> dict | None:
    """The module of the executable: the one mapped from its path, else the lowest mapped one."""
    path = (exe_path or "").removesuffix(" (deleted)")
    for m in modules:
        if path and m["name"].removesuffix(" (deleted)") == path:
            return m
    return modules[0] if modules else None


def packages(modules: list[dict]) -> dict[str, dict]:
    """The package notes (.note.package) of the mapped modules, by module name, as the core holds them."""
    return {m["name"]: m["package"] for m in modules if m.get("package")}


def build_result(record: dict, stack: dict, modules: list[dict], modules_cut: bool, problems: list[str],
                 timed_out: bool, *, available: bool = True, seconds: float = 0.0,
                 exe_vetting: dict | None = None) -> dict:
    threads = stack["threads"]
    tid = record.get("tid") if isinstance(record.get("tid"), int) else None
    crashing = next((t for t in threads if t["tid"] == tid), threads[0] if threads else None)
    if crashing is not None:  # first, as coredumpctl shows it
        threads.remove(crashing)
        threads.insert(0, crashing)
    for t in threads:
        t["crashing"] = t is crashing
        t.setdefault("error", None)
        t.setdefault("frames_cut", False)
    exe_path = fields.proc(record).get("exe")
    exe_path = exe_path if isinstance(exe_path, str) else None
    main = exe_module(modules, exe_path)
    exe = check_exe(exe_path, main["build_id"] if main else None, exe_vetting)
    exe["package"] = main.get("package") if main else None
    cut = []
    if stack["threads_cut"]:
        cut.append(f"threads: {len(threads)} of {stack['threads_seen']} kept")
    if any(t["frames_cut"] for t in threads):
        cut.append(f"frames: at most {max(len(t['frames']) for t in threads)} per thread kept")
    if stack["lines_cut"]:
        cut.append(f"{stack['lines_cut']} over-long lines cut")
    if modules_cut:
        cut.append(f"modules: {len(modules)} kept")
    if exe["state"] == "replaced":
        problems.append(f"{exe_path} was replaced since the crash (build-id {exe['disk_build_id']} on disk, "
                        f"{exe['build_id']} in the core): its frames are not symbolised")
    elif exe["state"] == "deleted":
        problems.append(f"{exe_path} is gone: its frames are not symbolised")
    if timed_out:
        state = TIMEOUT
    elif not available:
        state = UNAVAILABLE
    elif crashing is None or not crashing["frames"]:
        state = FAILED
    elif problems or cut or any(t["error"] for t in threads):
        state = PARTIAL
    else:
        state = OK
    frames = crashing["frames"] if crashing else []
    sig = fields.signal_number(record)
    name = exe_path or fields.comm(record)
    keys = signature.keys(name, exe["build_id"], sig, fields.signal_name(sig), frames) if frames else {}
    return {"state": state, "problems": problems[:MAX_PROBLEMS], "cut": cut, "seconds": round(seconds, 6),
            "analyser": "eu-stack", "crashing_tid": crashing["tid"] if crashing else tid,
            "threads": threads, "threads_seen": stack["threads_seen"], "modules": modules, "exe": exe,
            "packages": packages(modules), "identity": identity.identify(record), **keys}


def frame_line(f: dict) -> str:
    """One frame as coredumpctl shows it: `#0  0x00005555555551af crash_segv (app + 0x11af) [app.c:6]`. The
    names are the crashed program's (its symbols, its files' paths): escaped (printable.py)."""
    module = display((f.get("module") or "").rsplit("/", 1)[-1]) or None
    where = f"{module} + {f['offset']:#x}" if module and f.get("offset") is not None else (module or "n/a")
    source = f" [{display(f['file'])}:{f['line']}]" if f.get("file") else ""
    return f"#{f['index']:<2} {f['pc']:#018x} {display(f.get('function')) or 'n/a'} ({where}){source}"


def thread_lines(t: dict) -> list[str]:
    out = [f"Stack trace of thread {t['tid']}" + (" (crashing)" if t.get("crashing") else "") + ":"]
    out += [frame_line(f) for f in t["frames"]]
    if t.get("frames_cut"):
        out.append(f"... (more frames, cut at {len(t['frames'])})")
    if t.get("error"):
        out.append(f"(unwinding stopped: {display(t['error'])})")
    return out


def skipped(record: dict, reason: str, state: str = SKIPPED) -> dict:
    """The result of a dump with nothing to unwind (or whose analysis failed outright): identity only."""
    return {"state": state, "problems": [reason], "cut": [], "seconds": 0.0, "analyser": None,
            "crashing_tid": record.get("tid"), "threads": [], "threads_seen": 0, "modules": [], "exe": None,
            "packages": {}, "identity": identity.identify(record)}

