"""ELF core validation: headers, program headers against the file's size, and the notes a debugger needs.

Reads only the headers and the PT_NOTE segments, never the memory segments, so a multi-GiB core costs a few
reads. Problems are returned, not raised: a bad core is still kept, flagged with what is wrong with it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

# The primitives shared with elffile.py, under the names the core readers (coremodules, minicore) use.
from corehandler.elffile import (  # noqa: F401
    ELFCLASS32,
    ELFCLASS64,
    ELFDATA2LSB,
    ELFDATA2MSB,
    ELFMAG,
    HEADERS,
    PT_NOTE,
    build_id_of,
    iter_notes,
    notes_of,
)
from corehandler.elffile import read_at as _read_at

ET_CORE = 4
PT_LOAD = 1
PN_XNUM = 0xFFFF
NT_PRSTATUS, NT_PRPSINFO, NT_AUXV, NT_SIGINFO, NT_FILE = 1, 3, 6, 0x53494749, 0x46494C45
AT_SECURE = 23
# Notes beyond this are not read: a real core's notes are a few MiB even with thousands of threads.
MAX_NOTES_BYTES = 64 << 20
MAX_PHNUM = 1 << 20

STATUS_OK, STATUS_TRUNCATED, STATUS_INVALID = "ok", "truncated", "invalid"


@dataclass
class CoreInfo:
    size: int = 0
    status: str = STATUS_INVALID
    problems: list[str] = field(default_factory=list)
    elf_class: int | None = None  # 32 or 64
    machine: int | None = None
    expected_size: int | None = None  # where the last segment ends
    segments: int = 0
    threads: int = 0
    pid: int | None = None
    signal: int | None = None
    fname: str | None = None
    psargs: str | None = None
    files: list[str] = field(default_factory=list)  # NT_FILE mapped file names, in order
    at_secure: int | None = None  # the auxv's AT_SECURE: nonzero for a setuid/setgid/capability exec
    # The dumping thread's NT_SIGINFO: {signo, errno, code, addr} (addr for SIGSEGV, SIGBUS, SIGILL, SIGFPE,
    # SIGTRAP), {signo, errno, code, pid, uid} for a signal sent by kill/tgkill/sigqueue (si_code <= 0).
    siginfo: dict | None = None
    sp: int | None = None  # the dumping thread's stack pointer (NT_PRSTATUS), where REGS knows the machine

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class _Layout:
    """Offsets that differ between ELFCLASS32 and ELFCLASS64 (Linux's elf_prstatus and elf_prpsinfo)."""
    ehdr: str
    phdr: str
    phdr_fields: tuple[str, ...]
    shdr_info: tuple[str, int]  # format and offset of sh_info in section header 0 (for PN_XNUM)
    prstatus_pid: int
    prpsinfo_fname: int
    word: str


_LAYOUTS = {
    ELFCLASS64: _Layout(*HEADERS[ELFCLASS64], ("I", 44), 32, 40, "Q"),
    ELFCLASS32: _Layout(*HEADERS[ELFCLASS32], ("I", 28), 24, 28, "I"),
}
# pr_cursig is a short at offset 12 in both classes (after the embedded elf_siginfo's three ints).
_PRSTATUS_CURSIG = 12


@dataclass(frozen=True)
class Regs:
    """Where the general registers sit in NT_PRSTATUS (pr_reg), how many, their size, and the stack pointer's
    index among them (Linux's elf_prstatus and each architecture's user_regs_struct / elf_gregset_t)."""
    offset: int
    count: int
    word: str
    sp: int


REGS = {
    62: Regs(112, 27, "Q", 19),    # EM_X86_64: ... rip(16) cs eflags rsp(19) ...
    183: Regs(112, 34, "Q", 31),   # EM_AARCH64: x0..x30, sp(31), pc, pstate
    243: Regs(112, 32, "Q", 2),    # EM_RISCV (64-bit): pc, ra, sp(2), ...
    3: Regs(72, 17, "I", 15),      # EM_386: ... eip(12) xcs eflags esp(15) xss
    40: Regs(72, 18, "I", 13),     # EM_ARM: r0..r12, sp(13), lr, pc, cpsr, orig_r0
}
# siginfo_t: si_signo, si_errno, si_code (ints; MIPS swaps the last two, and is not read here), then the union,
# aligned to the word: si_addr for the fault signals, si_pid and si_uid for a signal someone sent.
_FAULT_SIGNALS = frozenset({4, 5, 7, 8, 11})  # SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV
_MIPS = 8
_FNAME_LEN, _PSARGS_LEN = 16, 80


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _parse_notes(info: CoreInfo, data: bytes, end: str, layout: _Layout) -> None:
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(end + "III", data, pos)
        pos += 12
        name_end = pos + ((namesz + 3) & ~3)
        desc_end = name_end + ((descsz + 3) & ~3)
        if desc_end > len(data) + 3:
            info.problems.append("note segment ends inside a note")
            return
        desc = data[name_end:name_end + descsz]
        owner = data[pos:pos + namesz].rstrip(b"\0")
        pos = desc_end
        if owner != b"CORE":
            continue
        if ntype == NT_PRSTATUS and len(desc) >= layout.prstatus_pid + 4:
            info.threads += 1
            if info.pid is None:  # the first one is the thread that dumped
                info.signal = struct.unpack_from(end + "h", desc, _PRSTATUS_CURSIG)[0]
                info.pid = struct.unpack_from(end + "i", desc, layout.prstatus_pid)[0]
                regs = REGS.get(info.machine or 0)
                size = struct.calcsize(regs.word) if regs else 0
                if regs and len(desc) >= regs.offset + (regs.sp + 1) * size:
                    info.sp = struct.unpack_from(end + regs.word, desc, regs.offset + regs.sp * size)[0]
        elif ntype == NT_SIGINFO and info.siginfo is None and info.machine != _MIPS:
            info.siginfo = _parse_siginfo(desc, end, layout.word)
        elif ntype == NT_PRPSINFO and len(desc) >= layout.prpsinfo_fname + _FNAME_LEN:
            info.fname = _text(desc[layout.prpsinfo_fname:layout.prpsinfo_fname + _FNAME_LEN])
            psargs = desc[layout.prpsinfo_fname + _FNAME_LEN:layout.prpsinfo_fname + _FNAME_LEN + _PSARGS_LEN]
            info.psargs = _text(psargs) if psargs else None
        elif ntype == NT_FILE:
            _parse_nt_file(info, desc, end + layout.word)
        elif ntype == NT_AUXV:
            _parse_auxv(info, desc, end, layout.word)


def _parse_siginfo(desc: bytes, end: str, word: str) -> dict | None:
    """The fields of a siginfo_t that say why the process died; None when the note is too short for them."""
    if len(desc) < 12:
        return None
    signo, errno_, code = struct.unpack_from(end + "iii", desc, 0)
    out = {"signo": signo, "errno": errno_, "code": code}
    union = (12 + struct.calcsize(word) - 1) // struct.calcsize(word) * struct.calcsize(word)
    if code > 0 and signo in _FAULT_SIGNALS and len(desc) >= union + struct.calcsize(word):
        out["addr"] = struct.unpack_from(end + word, desc, union)[0]
    elif code <= 0 and len(desc) >= union + 8:  # SI_USER, SI_QUEUE, SI_TKILL...: who sent it
        out["pid"], out["uid"] = struct.unpack_from(end + "iI", desc, union)
    return out


def _parse_auxv(info: CoreInfo, desc: bytes, end: str, word: str) -> None:
    """AT_SECURE of the (type, value) word pairs; absent means unknown (None), not clean."""
    pair = struct.calcsize(end + word * 2)
    for at in range(0, len(desc) - pair + 1, pair):
        key, value = struct.unpack_from(end + word * 2, desc, at)
        if key == AT_SECURE:
            info.at_secure = value
            return


def _parse_nt_file(info: CoreInfo, desc: bytes, fmt: str) -> None:
    word = struct.calcsize(fmt)
    if len(desc) < 2 * word:
        info.problems.append("NT_FILE note too short")
        return
    count = struct.unpack_from(fmt, desc, 0)[0]
    names_at = 2 * word + 3 * word * count
    if count > len(desc) or names_at > len(desc):
        info.problems.append("NT_FILE note is inconsistent")
        return
    names = desc[names_at:].split(b"\0")[:count]
    info.files = [n.decode("utf-8", "surrogateescape") for n in names]


def inspect_core(path: Path | str) -> CoreInfo:
    """Validates the core at path; never raises for a bad file (an unreadable one is a problem, too)."""
    info = CoreInfo()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        info.problems.append(f"cannot open: {e.strerror}")
        return info
    try:
        info.size = os.fstat(fd).st_size
        _inspect(fd, info)
    except OSError as e:
        info.status = STATUS_INVALID
        info.problems.append(f"read error: {e.strerror}")
    finally:
        os.close(fd)
    return info


def _inspect(fd: int, info: CoreInfo) -> None:
    ident = _read_at(fd, 0, 16)
    if len(ident) < 4:
        if ident and ELFMAG.startswith(ident):
            info.status = STATUS_TRUNCATED
            info.problems.append(f"truncated: {info.size} bytes, shorter than an ELF header")
        else:
            info.problems.append("empty file" if not ident else "not an ELF file")
        return
    if ident[:4] != ELFMAG:
        info.problems.append("not an ELF file")
        return
    layout = _LAYOUTS.get(ident[4]) if len(ident) > 4 else None
    if layout is None or len(ident) < 16:
        if len(ident) < 16:
            info.status = STATUS_TRUNCATED
            info.problems.append(f"truncated: {info.size} bytes, shorter than an ELF header")
        else:
            info.problems.append(f"unknown ELF class {ident[4]}")
        return
    info.elf_class = 64 if ident[4] == ELFCLASS64 else 32
    end = "<" if ident[5] == ELFDATA2LSB else ">"
    ehsize = struct.calcsize(end + layout.ehdr)
    raw = _read_at(fd, 0, ehsize)
    if len(raw) < ehsize:
        info.status = STATUS_TRUNCATED
        info.problems.append(f"truncated: {info.size} bytes, shorter than an ELF header")
        return
    (_, e_type, e_machine, _, _, e_phoff, e_shoff, _, _, e_phentsize, e_phnum, e_shentsize, _, _) = \
        struct.unpack(end + layout.ehdr, raw)
    info.machine = e_machine
    if e_type != ET_CORE:
        info.problems.append(f"not a core file (ELF type {e_type})")
        return
    if e_phnum == PN_XNUM:  # more than 65534 segments: the real count is in section header 0
        fmt, off = layout.shdr_info
        sh = _read_at(fd, e_shoff + off, 4)
        if len(sh) < 4:
            info.status = STATUS_TRUNCATED
            info.problems.append("truncated: section header 0 (segment count) is missing")
            return
        e_phnum = struct.unpack(end + fmt, sh)[0]
    phsize = struct.calcsize(end + layout.phdr)
    if e_phnum == 0 or e_phentsize < phsize or e_phnum > MAX_PHNUM:
        info.problems.append(f"bad program header table ({e_phnum} entries of {e_phentsize} bytes)")
        return
    table = _read_at(fd, e_phoff, e_phnum * e_phentsize)
    present = len(table) // e_phentsize
    if present < e_phnum:
        info.status = STATUS_TRUNCATED
        info.problems.append(f"truncated: {present} of {e_phnum} program headers in the file")
    phdrs = [dict(zip(layout.phdr_fields, struct.unpack_from(end + layout.phdr, table, i * e_phentsize)))
             for i in range(present)]
    info.segments = len(phdrs)
    ends = [p["offset"] + p["filesz"] for p in phdrs if p["filesz"]]
    info.expected_size = max(ends + [e_phoff + e_phnum * e_phentsize])
    if info.expected_size > info.size:
        info.status = STATUS_TRUNCATED
        info.problems.append(f"truncated: {info.size} of {info.expected_size} bytes "
                             f"({info.expected_size - info.size} missing)")
    notes = [p for p in phdrs if p["type"] == PT_NOTE]
    if not notes:
        info.problems.append("no PT_NOTE segment")
    for p in notes:
        length = min(p["filesz"], MAX_NOTES_BYTES)
        _parse_notes(info, _read_at(fd, p["offset"], length), end, layout)
    if info.status != STATUS_TRUNCATED:
        info.status = STATUS_OK if notes and info.pid is not None else STATUS_INVALID
        if notes and info.pid is None:
            info.problems.append("no NT_PRSTATUS note")


def file_notes(path: Path | str) -> list[tuple[bytes, int, bytes]]:
    """(owner, type, desc) of every note in an ELF file's PT_NOTE segments (an executable or library, not a
    core), at most MAX_FILE_NOTES_BYTES of them; [] for a file that is not ELF. Raises OSError when the
    file cannot be opened or read. For trusted paths only (a test's, a debug file's): a path a core names is
    opened by the analyser's jail alone, which reads the file through notes_of() and section_names()."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        return notes_of(fd)
    finally:
        os.close(fd)


def file_build_id(path: Path | str) -> str | None:
    """The GNU build-id of an ELF file as hex, None when it has none. Raises OSError like file_notes."""
    return build_id_of(file_notes(path))
