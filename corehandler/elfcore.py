"""ELF core validation: headers, program headers against the file's size, and the notes a debugger needs.

Reads only the headers and the PT_NOTE segments, never the memory segments, so a multi-GiB core costs a few
reads. Problems are returned, not raised: a bad core is still kept, flagged with what is wrong with it.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

ELFMAG = b"\x7fELF"
ELFCLASS32, ELFCLASS64 = 1, 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2
ET_CORE = 4
PT_LOAD, PT_NOTE = 1, 4
PN_XNUM = 0xFFFF
NT_PRSTATUS, NT_PRPSINFO, NT_AUXV, NT_FILE = 1, 3, 6, 0x46494C45
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
    ELFCLASS64: _Layout("16sHHIQQQIHHHHHH", "IIQQQQQQ",
                        ("type", "flags", "offset", "vaddr", "paddr", "filesz", "memsz", "align"),
                        ("I", 44), 32, 40, "Q"),
    ELFCLASS32: _Layout("16sHHIIIIIHHHHHH", "IIIIIIII",
                        ("type", "offset", "vaddr", "paddr", "filesz", "memsz", "flags", "align"),
                        ("I", 28), 24, 28, "I"),
}
# pr_cursig is a short at offset 12 in both classes (after the embedded elf_siginfo's three ints).
_PRSTATUS_CURSIG = 12
_FNAME_LEN, _PSARGS_LEN = 16, 80
_MAX_OFFSET = 2**63 - 1  # off_t


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _read_at(fd: int, offset: int, length: int) -> bytes:
    # Header offsets are unsigned 64-bit; past 2^63 pread cannot even be asked (OverflowError), and no file
    # reaches there, so such a read finds what a read past the end finds: nothing.
    if offset + length > _MAX_OFFSET:
        return b""
    chunks, done = [], 0
    while done < length:
        b = os.pread(fd, length - done, offset + done)
        if not b:
            break
        chunks.append(b)
        done += len(b)
    return b"".join(chunks)


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
        elif ntype == NT_PRPSINFO and len(desc) >= layout.prpsinfo_fname + _FNAME_LEN:
            info.fname = _text(desc[layout.prpsinfo_fname:layout.prpsinfo_fname + _FNAME_LEN])
            psargs = desc[layout.prpsinfo_fname + _FNAME_LEN:layout.prpsinfo_fname + _FNAME_LEN + _PSARGS_LEN]
            info.psargs = _text(psargs) if psargs else None
        elif ntype == NT_FILE:
            _parse_nt_file(info, desc, end + layout.word)
        elif ntype == NT_AUXV:
            _parse_auxv(info, desc, end, layout.word)


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


NT_GNU_BUILD_ID = 3
MAX_FILE_NOTES_BYTES = 1 << 20


def iter_notes(data: bytes, end: str):
    """(owner, type, desc) of each note in a note segment's bytes, up to the first one that does not fit."""
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(end + "III", data, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        if desc_at + descsz > len(data):
            return
        yield data[name_at:name_at + namesz].rstrip(b"\0"), ntype, data[desc_at:desc_at + descsz]
        pos = desc_at + ((descsz + 3) & ~3)


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


def _file_header(fd: int) -> tuple[str, _Layout, tuple] | None:
    """(byte order, layout, ELF header fields) of the regular file at fd; None for anything else."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    ident = _read_at(fd, 0, 16)
    layout = _LAYOUTS.get(ident[4]) if len(ident) == 16 and ident[:4] == ELFMAG else None
    if layout is None:
        return None
    end = "<" if ident[5] == ELFDATA2LSB else ">"
    ehsize = struct.calcsize(end + layout.ehdr)
    raw = _read_at(fd, 0, ehsize)
    if len(raw) < ehsize:
        return None
    return end, layout, struct.unpack(end + layout.ehdr, raw)


def is_elf(fd: int) -> bool:
    """Whether fd is a regular file with a whole ELF header."""
    return _file_header(fd) is not None


def notes_of(fd: int) -> list[tuple[bytes, int, bytes]]:
    """file_notes() of an open file."""
    header = _file_header(fd)
    if header is None:
        return []
    end, layout, fields = header
    e_phoff, e_phentsize, e_phnum = fields[5], fields[9], fields[10]
    phsize = struct.calcsize(end + layout.phdr)
    if e_phentsize < phsize or e_phnum > 4096:
        return []
    table = _read_at(fd, e_phoff, e_phnum * e_phentsize)
    notes, budget = [], MAX_FILE_NOTES_BYTES
    for i in range(len(table) // e_phentsize):
        p = dict(zip(layout.phdr_fields, struct.unpack_from(end + layout.phdr, table, i * e_phentsize)))
        if p["type"] != PT_NOTE or budget <= 0:
            continue
        data = _read_at(fd, p["offset"], min(p["filesz"], budget))
        budget -= len(data)
        notes += iter_notes(data, end)
    return notes


def build_id_of(notes: list[tuple[bytes, int, bytes]]) -> str | None:
    """The GNU build-id among an ELF file's notes, as hex; None when it has none."""
    return next((desc.hex() for owner, ntype, desc in notes if owner == b"GNU" and ntype == NT_GNU_BUILD_ID
                 and desc), None)


def file_build_id(path: Path | str) -> str | None:
    """The GNU build-id of an ELF file as hex, None when it has none. Raises OSError like file_notes."""
    return build_id_of(file_notes(path))


_SHDR = {ELFCLASS64: ("IIQQQQIIQQ", 64), ELFCLASS32: ("IIIIIIIIII", 40)}
_MAX_SECTIONS = 4096
# What makes a file's own symbols enough for the unwinder to name its frames.
SYMBOL_SECTIONS = frozenset({b".symtab", b".debug_info"})


def section_names(fd: int) -> set[bytes]:
    """The section names of the ELF file at fd (a few preads); empty for anything else. Raises OSError."""
    header = _file_header(fd)
    if header is None:
        return set()
    end, layout, fields = header
    shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
    fmt, need = _SHDR[ELFCLASS64 if layout is _LAYOUTS[ELFCLASS64] else ELFCLASS32]
    if not shoff or shentsize < need or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum:
        return set()
    table = _read_at(fd, shoff, shnum * shentsize)
    headers = [struct.unpack_from(end + fmt, table, i * shentsize) for i in range(len(table) // shentsize)]
    if shstrndx >= len(headers):
        return set()
    strtab = headers[shstrndx]
    names = _read_at(fd, strtab[4], min(strtab[5], 1 << 20))
    return {names[h[0]:names.find(b"\0", h[0])] for h in headers if h[0] < len(names)}
