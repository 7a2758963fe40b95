"""The crash's reason line (corehandler/analysis/reason.py) from NT_SIGINFO as the kernel writes it, and
glibc's abort messages: tables. Real crashes are in tests/local/test_analysis_real.py."""

import struct

import pytest

from corehandler import elfcore
from corehandler.analysis import reason
from corehandler.observe import journal
from corehandler.printable import display


@pytest.mark.parametrize("siginfo, sp, expected", [
    ({"signo": 11, "code": 1, "addr": 0}, None, "null pointer dereference (SEGV_MAPERR at 0x0)"),
    ({"signo": 11, "code": 1, "addr": 0x18}, None, "null pointer dereference (SEGV_MAPERR at 0x18)"),
    ({"signo": 11, "code": 1, "addr": 0x7ffd0000fff8}, 0x7ffd00010000,
     "stack overflow (SEGV_MAPERR at 0x7ffd0000fff8, stack pointer 0x7ffd00010000)"),
    ({"signo": 11, "code": 2, "addr": 0x7ffd0000fff8}, 0x7ffd00010000,
     "stack overflow (SEGV_ACCERR at 0x7ffd0000fff8, stack pointer 0x7ffd00010000)"),
    ({"signo": 11, "code": 1, "addr": 0xdeadbeef000}, 0x7ffd00010000,
     "address not mapped (SEGV_MAPERR at 0xdeadbeef000)"),
    ({"signo": 11, "code": 2, "addr": 0x555555556000}, None,
     "invalid permissions for mapped memory (SEGV_ACCERR at 0x555555556000)"),
    ({"signo": 11, "code": 0x80, "addr": 0}, None, "general protection fault (SI_KERNEL): a non-canonical "
     "address, or an instruction the process may not run"),
    ({"signo": 8, "code": 1, "addr": 0x401136}, None, "integer division by zero (FPE_INTDIV at 0x401136)"),
    ({"signo": 7, "code": 2, "addr": 0x7f0000001000}, None, "bus error: past the end of a mapped file, or memory "
     "the system could not supply (BUS_ADRERR at 0x7f0000001000)"),
    ({"signo": 4, "code": 2, "addr": 0x401136}, None,
     "illegal instruction (ud2: a trap the compiler put there, e.g. __builtin_trap) (ILL_ILLOPN at 0x401136)"),
    ({"signo": 11, "code": 0, "pid": 4242, "uid": 0}, None, "SIGSEGV sent by PID 4242 (uid 0) (SI_USER)"),
    ({"signo": 11, "code": -6, "pid": 77, "uid": 1000}, None, "SIGSEGV raised by the process itself (SI_TKILL)"),
    ({"signo": 6, "code": -6, "pid": 77, "uid": 1000}, None, "abort() called by the process itself (SI_TKILL)"),
    ({"signo": 11, "code": 99, "addr": 0x1000000}, None, "SIGSEGV (si_code 99 at 0x1000000)"),
    (None, None, "SIGSEGV"),
])
def test_reason_line(siginfo, sp, expected):
    assert reason.explain(11, siginfo, sp, {77}) == expected


def test_no_signal_no_reason():
    assert reason.explain(None, None, None) is None


@pytest.mark.parametrize("message, expected", [
    ("app: app.c:12: main: Assertion `x > 0' failed.\n", "assertion failed: x > 0 (app.c:12, main)"),
    ("my app: src/a b.c:7: int f(int): Assertion `p != NULL' failed.\n",
     "assertion failed: p != NULL (src/a b.c:7, int f(int))"),
    ("a.c:3: Assertion `0' failed.", "assertion failed: 0 (a.c:3)"),
    ("free(): double free detected in tcache 2\n", "abort: free(): double free detected in tcache 2"),
    ("*** buffer overflow detected ***: terminated\n", "abort: *** buffer overflow detected ***: terminated"),
    ("line one\nline two\n", "abort: line one"),
])
def test_abort_messages(message, expected):
    assert reason.explain(6, {"signo": 6, "code": -6, "pid": 1}, None, {1}, message) == expected


def _siginfo_note(end, bits, signo, code, union):
    word = "Q" if bits == 64 else "I"
    desc = struct.pack(end + "iii", signo, 0, code) + (b"\0" * 4 if bits == 64 else b"")
    desc += struct.pack(end + word, union) if isinstance(union, int) else struct.pack(end + "iI", *union)
    desc = desc.ljust(128, b"\0")
    return struct.pack(end + "III", 5, len(desc), elfcore.NT_SIGINFO) + b"CORE\0\0\0\0" + desc


@pytest.mark.parametrize("end", ["<", ">"])
@pytest.mark.parametrize("bits", [32, 64])
def test_nt_siginfo_is_parsed_in_both_classes_and_orders(end, bits):
    layout = elfcore._LAYOUTS[elfcore.ELFCLASS64 if bits == 64 else elfcore.ELFCLASS32]
    info = elfcore.CoreInfo()
    elfcore._parse_notes(info, _siginfo_note(end, bits, 11, 1, 0x1234) + _siginfo_note(end, bits, 6, 0, 0), end,
                         layout)
    assert info.siginfo == {"signo": 11, "errno": 0, "code": 1, "addr": 0x1234}  # the first: the dumping thread's
    info = elfcore.CoreInfo()
    elfcore._parse_notes(info, _siginfo_note(end, bits, 15, 0, (321, 1000)), end, layout)
    assert info.siginfo == {"signo": 15, "errno": 0, "code": 0, "pid": 321, "uid": 1000}


def test_the_reason_is_escaped_in_the_journal():
    """An assert's text is the program's: a terminal escape or a newline in it reaches MESSAGE escaped, on one
    line, and COREHANDLER_REASON carries it escaped too, as every journal field of crash-chosen text does (the
    exact bytes stay in the index and `info --json`)."""
    f = {"MESSAGE": "Process 1 (x) dumped core"}
    text = "assertion failed: \x1b[2J\nfake line (a.c:1, main)"
    journal.analysis_fields(f, {"state": "ok", "reason": {"text": text}})
    assert "Reason: assertion failed: \\x1b[2J\\nfake line (a.c:1, main)" in f["MESSAGE"]
    assert "\x1b" not in f["MESSAGE"] and f["COREHANDLER_REASON"] == display(text)


def test_an_analysis_done_again_keeps_the_abort_message_the_full_core_gave():
    first = {"reason": {"text": "assertion failed: x (a.c:1)", "abort_message": "a.c:1: Assertion `x' failed."}}
    again = {"reason": {"text": "abort() called by the process itself (SI_TKILL)", "abort_message": None}}
    reason.carry_over(first, again)
    assert again["reason"] == first["reason"]
    better = {"reason": {"text": "null pointer dereference (SEGV_MAPERR at 0x0)", "abort_message": None}}
    reason.carry_over({"reason": {"text": "SIGSEGV", "abort_message": None}}, better)
    assert better["reason"]["text"].startswith("null pointer")
    none = {}
    reason.carry_over(None, none)
    assert "reason" not in none

