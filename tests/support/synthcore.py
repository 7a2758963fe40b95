"""Synthetic ELF cores (64-bit, little-endian) built in Python: the notes a kernel writes (NT_PRSTATUS,
NT_PRPSINFO, NT_FILE) and one PT_LOAD per mapping holding that mapping's first bytes, which may be a small ELF
image with a build-id and a .note.package. For tests of the parsers: any number of mappings, any note bytes."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from corehandler import elfcore

PAGE = 4096
_EHDR, _PHDR = "<16sHHIQQQIHHHHHH", "<IIQQQQQQ"
EHSIZE, PHSIZE = struct.calcsize(_EHDR), struct.calcsize(_PHDR)
ET_DYN = 3
PACKAGE_NOTE_TYPE = 0xCAFE1A7E


def note(owner: bytes, ntype: int, desc: bytes) -> bytes:
    name = owner + b"\0"
    pad = lambda b: b + b"\0" * (-len(b) % 4)  # noqa: E731
    return struct.pack("<III", len(name), len(desc), ntype) + pad(name) + pad(desc)


def elf_image(build_id: bytes | None = None, package: bytes | None = None) -> bytes:
    """The first bytes of a mapped shared object: ELF header, a PT_LOAD and a PT_NOTE with its notes."""
    notes = b""
    if build_id is not None:
        notes += note(b"GNU", 3, build_id)
    if package is not None:
        notes += note(b"FDO", PACKAGE_NOTE_TYPE, package + b"\0")
    notes_at = EHSIZE + 2 * PHSIZE
    ehdr = struct.pack(_EHDR, b"\x7fELF\x02\x01\x01" + b"\0" * 9, ET_DYN, 62, 1, 0, EHSIZE, 0, 0, EHSIZE, PHSIZE,
                       2, 0, 0, 0)
    load = struct.pack(_PHDR, elfcore.PT_LOAD, 5, 0, 0, 0, PAGE, PAGE, PAGE)
    pnote = struct.pack(_PHDR, elfcore.PT_NOTE, 4, notes_at, notes_at, notes_at, len(notes), len(notes), 4)
    return ehdr + load + pnote + notes


@dataclass
class Mapping:
    start: int
    end: int
    pgoff: int          # in pages
    name: bytes
    content: bytes      # the bytes the core holds at start (a PT_LOAD of this size)


def nt_file(mappings: list[Mapping]) -> bytes:
    head = struct.pack("<QQ", len(mappings), PAGE)
    entries = b"".join(struct.pack("<QQQ", m.start, m.end, m.pgoff) for m in mappings)
    return head + entries + b"".join(m.name + b"\0" for m in mappings)


def core(mappings: list[Mapping], *, pid: int = 42, signal: int = 11, extra_notes: bytes = b"",
         nt_file_desc: bytes | None = None) -> bytes:
    prstatus = bytearray(336)
    struct.pack_into("<h", prstatus, 12, signal)
    struct.pack_into("<i", prstatus, 32, pid)
    prpsinfo = bytearray(136)
    prpsinfo[40:46] = b"synth\0"
    notes = (note(b"CORE", elfcore.NT_PRSTATUS, bytes(prstatus)) + note(b"CORE", elfcore.NT_PRPSINFO,
                                                                          bytes(prpsinfo))
             + note(b"CORE", elfcore.NT_FILE, nt_file(mappings) if nt_file_desc is None else nt_file_desc)
             + extra_notes)
    loads = [m for m in mappings if m.content]
    phnum = 1 + len(loads)
    data_at = EHSIZE + phnum * PHSIZE
    phdrs = [struct.pack(_PHDR, elfcore.PT_NOTE, 4, data_at, 0, 0, len(notes), 0, 4)]
    offset = data_at + len(notes)
    for m in loads:
        phdrs.append(struct.pack(_PHDR, elfcore.PT_LOAD, 5, offset, m.start, 0, len(m.content), m.end - m.start,
                                 PAGE))
        offset += len(m.content)
    ehdr = struct.pack(_EHDR, b"\x7fELF\x02\x01\x01" + b"\0" * 9, elfcore.ET_CORE, 62, 1, 0, EHSIZE, 0, 0, EHSIZE,
                       PHSIZE, min(phnum, elfcore.PN_XNUM), 0, 0, 0)
    assert phnum < elfcore.PN_XNUM, "PN_XNUM cores are not built here"
    return b"".join([ehdr, *phdrs, notes, *(m.content for m in loads)])


def many_mappings(n: int, elf_every: int = 0) -> list[Mapping]:
    """n mappings of distinct files, each from its start (offset 0): data files whose first bytes are in the
    core, and every elf_every-th one (0: none) a shared object with a build-id."""
    out = []
    for i in range(n):
        start = 0x10000000 + i * 2 * PAGE
        is_elf = elf_every and i % elf_every == 0
        content = elf_image(build_id=i.to_bytes(20, "big")) if is_elf else b"DATA" + bytes(60)
        out.append(Mapping(start, start + PAGE, 0, f"/synth/{'lib' if is_elf else 'data'}{i}.so".encode(), content))
    return out
