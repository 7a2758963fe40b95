"""ELF files read from an open fd: the primitives elfcore.py shares, and what is said of an executable or a
library (its notes, build-id and section names). Standard library only and light to import (no dataclasses,
no pathlib): the analyser's jail (analysis/jail.py) imports this module alone on every analysis, to read the
files a core names from the fds it opened as the crashing user."""

from __future__ import annotations

import os
import re
import stat
import struct

ELFMAG = b"\x7fELF"
ELFCLASS32, ELFCLASS64 = 1, 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2
PT_NOTE = 4
NT_GNU_BUILD_ID = 3
MAX_FILE_NOTES_BYTES = 1 << 20
# (ELF header, program header, program header's field names) by class.
HEADERS = {
    ELFCLASS64: ("16sHHIQQQIHHHHHH", "IIQQQQQQ", ("type", "flags", "offset", "vaddr", "paddr", "filesz", "memsz",
                                                 "align")),
    ELFCLASS32: ("16sHHIIIIIHHHHHH", "IIIIIIII", ("type", "offset", "vaddr", "paddr", "filesz", "memsz", "flags",
                                                 "align")),
}
# (section header, the least sh_entsize that holds it) by class.
_SHDR = {ELFCLASS64: ("IIQQQQIIQQ", 64), ELFCLASS32: ("IIIIIIIIII", 40)}
_MAX_SECTIONS = 4096
_MAX_PHNUM = 4096
_MAX_OFFSET = 2**63 - 1  # off_t
# What makes a file's own symbols enough for the unwinder to name its frames.
SYMBOL_SECTIONS = frozenset({b".symtab", b".debug_info"})
SHT_DYNSYM = 11
MAX_TABLE = 8 << 20  # bytes of a .dynsym or its string table read
# glibc's file names: where analysis/reason.py's abort message is found (its __abort_msg in .dynsym).
LIBC_NAME = re.compile(r"^libc(?:\.so\.6|-2\.\d+\.so)$")


def read_at(fd: int, offset: int, length: int) -> bytes:
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


def note_spans(data, end: str):
    """(owner, type, desc start, desc end, next note's start) of each note in a note segment's bytes, up to the
    first one that does not fit; the descriptors are not copied (a core of 500 threads has 2000 notes, most of
    them register sets nobody here reads)."""
    header = struct.Struct(end + "III")
    pos, size = 0, len(data)
    while pos + 12 <= size:
        namesz, descsz, ntype = header.unpack_from(data, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        if desc_at + descsz > size:
            return
        pos = desc_at + ((descsz + 3) & ~3)
        yield bytes(data[name_at:name_at + namesz]).rstrip(b"\0"), ntype, desc_at, desc_at + descsz, pos


def iter_notes(data: bytes, end: str):
    """(owner, type, desc) of each note in a note segment's bytes, up to the first one that does not fit."""
    for owner, ntype, start, stop, _ in note_spans(data, end):
        yield owner, ntype, data[start:stop]


def _header(fd: int) -> tuple[int, str, tuple] | None:
    """(class, byte order, ELF header fields) of the regular file at fd; None for anything else."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    ident = read_at(fd, 0, 16)
    if len(ident) < 16 or ident[:4] != ELFMAG or ident[4] not in HEADERS:
        return None
    end = "<" if ident[5] == ELFDATA2LSB else ">"
    ehdr = end + HEADERS[ident[4]][0]
    raw = read_at(fd, 0, struct.calcsize(ehdr))
    if len(raw) < struct.calcsize(ehdr):
        return None
    return ident[4], end, struct.unpack(ehdr, raw)


def is_elf(fd: int) -> bool:
    """Whether fd is a regular file with a whole ELF header."""
    return _header(fd) is not None


def notes_of(fd: int) -> list[tuple[bytes, int, bytes]]:
    """(owner, type, desc) of every note in the PT_NOTE segments of the ELF file at fd (an executable or a
    library, not a core), at most MAX_FILE_NOTES_BYTES of them; [] for anything else. Raises OSError."""
    header = _header(fd)
    if header is None:
        return []
    elf_class, end, fields = header
    _, phdr, phdr_fields = HEADERS[elf_class]
    e_phoff, e_phentsize, e_phnum = fields[5], fields[9], fields[10]
    if e_phentsize < struct.calcsize(end + phdr) or e_phnum > _MAX_PHNUM:
        return []
    table = read_at(fd, e_phoff, e_phnum * e_phentsize)
    notes, budget = [], MAX_FILE_NOTES_BYTES
    for i in range(len(table) // e_phentsize):
        p = dict(zip(phdr_fields, struct.unpack_from(end + phdr, table, i * e_phentsize)))
        if p["type"] != PT_NOTE or budget <= 0:
            continue
        data = read_at(fd, p["offset"], min(p["filesz"], budget))
        budget -= len(data)
        notes += iter_notes(data, end)
    return notes


def build_id_of(notes: list[tuple[bytes, int, bytes]]) -> str | None:
    """The GNU build-id among an ELF file's notes, as hex; None when it has none."""
    return next((desc.hex() for owner, ntype, desc in notes if owner == b"GNU" and ntype == NT_GNU_BUILD_ID
                 and desc), None)


def section_names(fd: int) -> set[bytes]:
    """The section names of the ELF file at fd (a few preads); empty for anything else. Raises OSError."""
    header = _header(fd)
    if header is None:
        return set()
    elf_class, end, fields = header
    shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
    fmt, need = _SHDR[elf_class]
    if not shoff or shentsize < need or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum:
        return set()
    table = read_at(fd, shoff, shnum * shentsize)
    headers = [struct.unpack_from(end + fmt, table, i * shentsize) for i in range(len(table) // shentsize)]
    if shstrndx >= len(headers):
        return set()
    strtab = headers[shstrndx]
    names = read_at(fd, strtab[4], min(strtab[5], 1 << 20))
    return {names[h[0]:names.find(b"\0", h[0])] for h in headers if h[0] < len(names)}


def dynsym_value(fd: int, name: bytes) -> int | None:
    """The value of a symbol in the ELF file's .dynsym (section headers, then two bounded reads); None if
    absent or for anything that is not such a file. Raises OSError."""
    header = _header(fd)
    if header is None:
        return None
    elf_class, end, fields = header
    shoff, shentsize, shnum = fields[6], fields[11], fields[12]
    fmt, need = _SHDR[elf_class]
    if not shoff or shentsize < need or not 0 < shnum <= _MAX_SECTIONS:
        return None
    table = read_at(fd, shoff, shnum * shentsize)
    # (name, type, flags, addr, offset, size, link, info, align, entsize) in both classes' order of fields
    sections = [struct.unpack_from(end + fmt, table, i * shentsize) for i in range(len(table) // shentsize)]
    dynsym = next((s for s in sections if s[1] == SHT_DYNSYM), None)
    if dynsym is None or dynsym[6] >= len(sections):
        return None
    strtab = sections[dynsym[6]]
    syms = read_at(fd, dynsym[4], min(dynsym[5], MAX_TABLE))
    strings = read_at(fd, strtab[4], min(strtab[5], MAX_TABLE))
    sym = end + ("IBBHQQ" if elf_class == ELFCLASS64 else "IIIBBH")
    step = struct.calcsize(sym)
    for at in range(0, len(syms) - step + 1, step):
        entry = struct.unpack_from(sym, syms, at)
        st_name, value = (entry[0], entry[4]) if elf_class == ELFCLASS64 else entry[:2]
        if strings[st_name:st_name + len(name) + 1] == name + b"\0":
            return value
    return None
