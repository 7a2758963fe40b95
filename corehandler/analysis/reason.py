"""Why the process died, in one line (docs/analysis.md, "The crash's reason").

From the core: the dumping thread's NT_SIGINFO (signal, si_code, fault address or sender; elfcore.py) and stack
pointer, and glibc's `__abort_msg`, the text abort() leaves for a debugger (an assert's expression, file and
line; malloc's "free(): double free detected in tcache 2"; fortify's "*** buffer overflow detected ***"). The
message's address is libc's `__abort_msg` symbol, which the analysis jail reads from the .dynsym of libc's file
as it vets that path as the crashing user (the daemon opens no path a core names), used only when that file's
build-id is the one the core recorded; the message's bytes are read from the core's memory, bounded.
A Rust panic's message or a `Fatal Python error` block is not in the core but in the journal (crashjournal.py);
with_journal puts it in front. Everything here is the crashed process's: the line is escaped where it is printed
(printable.py), never here.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from corehandler import elfcore, elffile, fields
from corehandler.analysis import minicore

MAX_MESSAGE = 4096        # bytes of an abort message read from the core
NULL_PAGE = 1 << 16       # below vm.mmap_min_addr's default: nothing is ever mapped there
STACK_REACH = 64 << 10    # a fault this near the stack pointer is the stack's guard: an overflow

SI_CODES = {0: "SI_USER", 0x80: "SI_KERNEL", -1: "SI_QUEUE", -2: "SI_TIMER", -3: "SI_MESGQ", -4: "SI_ASYNCIO",
            -5: "SI_SIGIO", -6: "SI_TKILL", -7: "SI_DETHREAD", -60: "SI_ASYNCNL"}
CODES = {  # per signal number (include/uapi/asm-generic/siginfo.h)
    11: {1: "SEGV_MAPERR", 2: "SEGV_ACCERR", 3: "SEGV_BNDERR", 4: "SEGV_PKUERR", 5: "SEGV_ACCADI",
         6: "SEGV_ADIDERR", 7: "SEGV_ADIPERR", 8: "SEGV_MTEAERR", 9: "SEGV_MTESERR", 10: "SEGV_CPERR"},
    7: {1: "BUS_ADRALN", 2: "BUS_ADRERR", 3: "BUS_OBJERR", 4: "BUS_MCEERR_AR", 5: "BUS_MCEERR_AO"},
    4: {1: "ILL_ILLOPC", 2: "ILL_ILLOPN", 3: "ILL_ILLADR", 4: "ILL_ILLTRP", 5: "ILL_PRVOPC", 6: "ILL_PRVREG",
        7: "ILL_COPROC", 8: "ILL_BADSTK", 9: "ILL_BADIADDR"},
    8: {1: "FPE_INTDIV", 2: "FPE_INTOVF", 3: "FPE_FLTDIV", 4: "FPE_FLTOVF", 5: "FPE_FLTUND", 6: "FPE_FLTRES",
        7: "FPE_FLTINV", 8: "FPE_FLTSUB", 14: "FPE_FLTUNK", 15: "FPE_CONDTRAP"},
    5: {1: "TRAP_BRKPT", 2: "TRAP_TRACE", 3: "TRAP_BRANCH", 4: "TRAP_HWBKPT", 5: "TRAP_UNK", 6: "TRAP_PERF"},
}
# What a code says, where the name alone does not.
_MEANING = {
    "SEGV_MAPERR": "address not mapped", "SEGV_ACCERR": "invalid permissions for mapped memory",
    "SEGV_PKUERR": "memory protection key denied the access", "SEGV_MTESERR": "memory tag mismatch",
    "SEGV_MTEAERR": "memory tag mismatch", "SEGV_CPERR": "control-flow protection (shadow stack) violation",
    "BUS_ADRALN": "misaligned access", "BUS_ADRERR": "bus error: past the end of a mapped file, or memory the "
    "system could not supply", "BUS_OBJERR": "bus error: hardware error on the object",
    "BUS_MCEERR_AR": "hardware memory error", "BUS_MCEERR_AO": "hardware memory error",
    "FPE_INTDIV": "integer division by zero", "FPE_INTOVF": "integer overflow in division (INT_MIN / -1)",
    "FPE_FLTDIV": "floating-point division by zero", "ILL_ILLOPN": "illegal instruction (ud2: a trap the "
    "compiler put there, e.g. __builtin_trap)", "ILL_ILLOPC": "illegal instruction",
    "ILL_PRVOPC": "privileged instruction", "TRAP_BRKPT": "breakpoint trap",
}
# glibc's assert: "PROG: FILE:LINE: FUNCTION: Assertion `EXPR' failed." (assert/assert.c, __assert_fail_base).
_ASSERT = re.compile(r"^(?:.*?: )?(?P<file>[^:\n]+):(?P<line>\d+): (?:(?P<func>[^\n]*?): )?"
                     r"Assertion [`'](?P<expr>.*)' failed\.?\s*$", re.S)


def code_name(signo: int | None, code: int | None) -> str | None:
    if code is None:
        return None
    if code <= 0 or code == 0x80:
        return SI_CODES.get(code, f"si_code {code}")
    return CODES.get(signo or 0, {}).get(code, f"si_code {code}")


def abort_line(message: str) -> str:
    """glibc's abort message as one line: an assert's parts, else the message's first line."""
    m = _ASSERT.match(message.strip())
    if m:
        where = f"{m['file']}:{m['line']}" + (f", {m['func']}" if m["func"] else "")
        return f"assertion failed: {m['expr']} ({where})"
    first = message.strip().split("\n", 1)[0]
    return f"abort: {first}" if first else "abort"


def explain(signal: int | None, siginfo: Mapping[str, Any] | None, sp: int | None, pids: Iterable[int | None] = (),
            abort_message: str | None = None) -> str | None:
    """The reason line; None when neither the core nor the record says anything (no signal at all). `pids`:
    the crashed process's ids (as the host and its own namespace number it), to tell a signal it raised from
    one another process sent."""
    si = siginfo or {}
    signo = si.get("signo") or signal
    if not signo:
        return None
    name = fields.signal_name(signo) or f"signal {signo}"
    code = si.get("code")
    cname = code_name(signo, code)
    if abort_message:
        return abort_line(abort_message)
    if "pid" in si and code is not None and code <= 0:
        if si["pid"] in set(pids):
            return f"{'abort() called' if signo == 6 else name + ' raised'} by the process itself ({cname})"
        return f"{name} sent by PID {si['pid']} (uid {si.get('uid')}) ({cname})"
    addr = si.get("addr")
    if signo == 11 and code == 0x80:
        return ("general protection fault (SI_KERNEL): a non-canonical address, or an instruction the process "
                "may not run")
    if addr is None:
        return f"{name}" + (f" ({cname})" if cname else "")
    at = f"{cname} at {addr:#x}"
    if signo in (11, 7) and addr < NULL_PAGE:
        return f"null pointer dereference ({at})"
    if signo == 11 and sp is not None and abs(addr - sp) <= STACK_REACH:
        return f"stack overflow ({at}, stack pointer {sp:#x})"
    meaning = _MEANING.get(cname or "")
    return f"{meaning} ({at})" if meaning else f"{name} ({at})"


def _libc(modules: list[dict]) -> dict | None:
    return next((m for m in modules if elffile.LIBC_NAME.match(os.path.basename(m.get("name") or ""))
                 and isinstance(m.get("start"), int) and m.get("build_id")), None)


def _abort_msg_value(libc: dict) -> int | None:
    """__abort_msg's value in libc's file, as the jail read it from the file at the module's path opened as the
    crashing user (jail._read_facts: the daemon opens no path a core names), if that file is the core's libc (its
    build-id)."""
    disk = libc.get("disk")
    if not isinstance(disk, dict) or disk.get("build_id") != libc["build_id"]:
        return None
    value = disk.get("abort_msg")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def abort_message(core: Path | str, modules: list[dict]) -> str | None:
    """The text glibc's abort() left in `*__abort_msg` (struct abort_msg_s: a 32-bit size, then the text), as
    the core holds it; None when libc left none or it cannot be found."""
    libc = _libc(modules)
    value = _abort_msg_value(libc) if libc else None
    if not value:
        return None
    fd = os.open(core, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        raw = minicore._Raw(fd)
        pointer = raw.word(libc["start"] + value)
        if not pointer:
            return None
        head = raw.read(pointer, 4)
        if len(head) < 4:
            return None
        size = struct.unpack(raw.end + "I", head)[0]
        text = raw.read(pointer + 4, min(size, MAX_MESSAGE)).split(b"\0", 1)[0]
    except minicore.MiniCoreError:
        return None
    finally:
        os.close(fd)
    return text.decode("utf-8", "surrogateescape") or None


def identity_pids(record: Mapping[str, Any]) -> set[int]:
    """The crashed process's pid and tid as the record has them, and its pids in every namespace (NSpid)."""
    out = {v for v in (record.get("pid"), record.get("tid")) if isinstance(v, int)}
    status = fields.proc(record).get("status")
    for line in (status if isinstance(status, str) else "").splitlines():
        if line.startswith("NSpid:"):
            out |= {int(v) for v in line.split()[1:] if v.isdigit()}
    return out


def of_core(core: Path | str, record: Mapping[str, Any], modules: list[dict], problems: list[str]) -> dict:
    """The `reason` of an analysis result: {text, signal, code, addr, sender_pid, abort_message}. A core that
    cannot be read gives what the record says (the signal) and a problem; never raises for the core's bytes."""
    info = elfcore.inspect_core(core)
    message = None
    if info.signal == 6 or (info.siginfo or {}).get("signo") == 6:
        try:
            message = abort_message(core, modules)
        except OSError as e:
            problems.append(f"cannot read the abort message: {e.strerror}")
    si = info.siginfo or {}
    signal = fields.signal_number(record) or info.signal
    ident = identity_pids(record)
    text = explain(signal, info.siginfo, info.sp, {info.pid, *ident}, message)
    return {"text": text, "signal": si.get("signo") or signal, "code": code_name(si.get("signo") or signal,
            si.get("code")), "addr": si.get("addr"), "sender_pid": si.get("pid"), "abort_message": message}


def with_journal(why: dict | None, found: Mapping[str, Any] | None) -> dict | None:
    """The reason with what the crashed process wrote to the journal just before (analysis/crashjournal.py): its
    summary leads the line, the core's words follow unless they only say the process aborted itself (what a Rust
    panic or Py_FatalError does next)."""
    if not found:
        return why
    why = dict(why or {"text": None, "signal": None, "code": None, "addr": None, "sender_pid": None,
                       "abort_message": None})
    core = why.get("text")
    redundant = not core or core.startswith("abort() called by the process itself")
    why["text"] = found["summary"] if redundant else f"{found['summary']}; {core}"
    why["journal"] = dict(found)
    return why


def carry_over(before: Mapping[str, Any] | None, result: dict) -> None:
    """An analysis done again (from the mini core, which rarely holds the abort message's page; later, when the
    journal may have rotated the crash's lines away) keeps the first analysis's reason when that one knew more:
    the first read the full core and the journal right after the crash."""
    old = (before or {}).get("reason")
    new = result.get("reason")
    if isinstance(old, dict) and old.get("text") and (not isinstance(new, dict) or not new.get("text")
                                                      or old.get("abort_message") and not new.get("abort_message")
                                                      or old.get("journal") and not new.get("journal")):
        result["reason"] = old
