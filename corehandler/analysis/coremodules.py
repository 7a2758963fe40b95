"""The modules a core maps and their build-ids, read from the core itself, as `eu-unstrip -n --core` lists them.

The kernel's NT_FILE note says which file is mapped where; the first page of every ELF mapping is in the core
(coredump_filter bit 4, on by default), and with it the ELF and program headers and, in every toolchain's
layout, the PT_NOTE segments that hold the GNU build-id and the systemd package note (.note.package). Reading
them here costs a few preads; eu-unstrip -n took 90-350 ms a core on the loaded test machine, most of it
finding and checksumming debug files it does not need for the list (docs/analysis.md).

Everything read comes from the crashed process's memory: sizes and counts are capped, and a malformed header
gives a module without a build-id, never an exception. The cost is O(n log n) in the core's mappings (a
process may have 65530 of them, vm.max_map_count): a read finds its segment by bisection, at most
MAX_EXAMINED mapped files are looked into, and the listing stops at its time budget with what it has.
"""

from __future__ import annotations

import os
import struct
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from corehandler import boundedjson, elfcore

NT_GNU_BUILD_ID = 3
PACKAGE_NOTE_OWNER, PACKAGE_NOTE_TYPE = b"FDO", 0xCAFE1A7E
MAX_NOTE_BYTES = 8192
MAX_PACKAGE_NOTE = 4096
MAX_MODULES = 512
MAX_NT_FILE = 8 << 20
# NT_FILE entries read (the kernel's default vm.max_map_count is 65530) and mapped files looked into: a data
# file mapped from its start costs a look as an ELF image does.
MAX_FILE_ENTRIES = 1 << 16
MAX_EXAMINED = 1 << 14
BUDGET_SECONDS = 10.0
ET_EXEC = 2


@dataclass
class _Core:
    fd: int
    end: str
    layout: object
    loads: list[tuple[int, int, int]]   # (vaddr, offset, filesz) of PT_LOAD segments with file bytes, sorted
    files: list[tuple[int, int, int, str]]  # (start, end, page offset, name) from NT_FILE
    files_cut: bool = False
    starts: list[int] = field(default_factory=list)  # each load's vaddr, for bisection

    def read(self, vaddr: int, length: int) -> bytes:
        """Bytes of the process's memory at vaddr, as far as the core holds them."""
        i = bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return b""
        start, offset, size = self.loads[i]
        if vaddr >= start + size:
            return b""
        return elfcore._read_at(self.fd, offset + vaddr - start, min(length, start + size - vaddr))


def _open(fd: int) -> _Core | None:
    ident = elfcore._read_at(fd, 0, 16)
    layout = elfcore._LAYOUTS.get(ident[4]) if len(ident) == 16 and ident[:4] == elfcore.ELFMAG else None
    if layout is None:
        return None
    end = "<" if ident[5] == elfcore.ELFDATA2LSB else ">"
    ehsize = struct.calcsize(end + layout.ehdr)
    fields = struct.unpack(end + layout.ehdr, elfcore._read_at(fd, 0, ehsize).ljust(ehsize, b"\0"))
    phoff, phentsize, phnum = fields[5], fields[9], fields[10]
    phsize = struct.calcsize(end + layout.phdr)
    if phentsize < phsize or phnum > elfcore.MAX_PHNUM:
        return None
    table = elfcore._read_at(fd, phoff, phnum * phentsize)
    core = _Core(fd, end, layout, [], [])
    notes = []
    for i in range(len(table) // phentsize):
        p = dict(zip(layout.phdr_fields, struct.unpack_from(end + layout.phdr, table, i * phentsize)))
        if p["type"] == elfcore.PT_LOAD and p["filesz"]:
            core.loads.append((p["vaddr"], p["offset"], p["filesz"]))
        elif p["type"] == elfcore.PT_NOTE:
            notes.append(p)
    core.loads.sort()
    core.starts = [start for start, _, _ in core.loads]
    for p in notes:
        _nt_file(core, elfcore._read_at(fd, p["offset"], min(p["filesz"], elfcore.MAX_NOTES_BYTES)))
    return core


def _nt_file(core: _Core, data: bytes) -> None:
    word = core.layout.word
    for owner, ntype, desc in elfcore.iter_notes(data, core.end):
        if owner != b"CORE" or ntype != elfcore.NT_FILE or len(desc) > MAX_NT_FILE:
            continue
        size = struct.calcsize(word)
        if len(desc) < 2 * size:
            return
        count, page = struct.unpack_from(core.end + word * 2, desc, 0)
        names_at = 2 * size + 3 * size * count
        if names_at > len(desc):
            return
        names = desc[names_at:].split(b"\0", min(count, MAX_FILE_ENTRIES))
        room = MAX_FILE_ENTRIES - len(core.files)
        n = min(count, len(names), room)
        core.files_cut = core.files_cut or room < min(count, len(names))
        entries = struct.iter_unpack(core.end + word * 3, desc[2 * size:2 * size + 3 * size * n])
        for (start, stop, offset), name in zip(entries, names):
            core.files.append((start, stop, offset * page, name.decode("utf-8", "surrogateescape")))


def _module_notes(core: _Core, start: int) -> tuple[str | None, dict | None]:
    """(build-id, package note) of the ELF image whose first page is mapped at start."""
    layout, end = core.layout, core.end
    ehsize = struct.calcsize(end + layout.ehdr)
    head = core.read(start, ehsize)
    if len(head) < ehsize or head[:4] != elfcore.ELFMAG:
        return None, None
    fields = struct.unpack(end + layout.ehdr, head)
    e_type, phoff, phentsize, phnum = fields[1], fields[5], fields[9], fields[10]
    phsize = struct.calcsize(end + layout.phdr)
    if phentsize < phsize or phnum > 256:
        return None, None
    table = core.read(start + phoff, phnum * phentsize)
    phdrs = [dict(zip(layout.phdr_fields, struct.unpack_from(end + layout.phdr, table, i * phentsize)))
             for i in range(len(table) // phentsize)]
    loads = [p["vaddr"] for p in phdrs if p["type"] == elfcore.PT_LOAD]
    if not loads:
        return None, None
    bias = 0 if e_type == ET_EXEC else start - (min(loads) & ~0xFFF)
    build_id = package = None
    for p in phdrs:
        if p["type"] != elfcore.PT_NOTE:
            continue
        data = core.read(bias + p["vaddr"], min(p["filesz"], MAX_NOTE_BYTES))
        for owner, ntype, desc in elfcore.iter_notes(data, end):
            if owner == b"GNU" and ntype == NT_GNU_BUILD_ID and desc and build_id is None:
                build_id = desc[:64].hex()
            elif owner == PACKAGE_NOTE_OWNER and ntype == PACKAGE_NOTE_TYPE and package is None:
                package = parse_package(desc)
    return build_id, package


def parse_package(desc: bytes) -> dict | None:
    """The JSON of a .note.package (systemd's package-metadata spec), None when it is not a JSON object (or is
    nested deeper than any package note is)."""
    try:
        value = boundedjson.loads(desc[:MAX_PACKAGE_NOTE].split(b"\0", 1)[0])
    except boundedjson.BoundedJSONError:
        return None
    return value if isinstance(value, dict) else None


def modules(path: Path | str, *, budget: float = BUDGET_SECONDS,
            problems: list[str] | None = None) -> tuple[list[dict], bool]:
    """([{name, start, size, build_id, file, package}], cut) for every file-backed ELF image the core maps,
    in address order; ([], False) for a file that is no core. Raises OSError when it cannot be read. Past a
    cap or the time budget (seconds) the list is cut, and why is appended to problems."""
    deadline = time.monotonic() + budget
    problems = [] if problems is None else problems
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        core = _open(fd)
        if core is None:
            return [], False
        if core.files_cut:
            problems.append(f"module listing read the first {MAX_FILE_ENTRIES} of the core's mapped files only")
        spans: dict[str, list[int]] = {}
        for start, stop, _, name in core.files:
            span = spans.setdefault(name, [start, stop])
            span[0], span[1] = min(span[0], start), max(span[1], stop)
        out, seen, examined = [], set(), 0
        for start, _, offset, name in sorted(core.files):
            if offset != 0 or name in seen:
                continue
            if len(out) == MAX_MODULES:
                return out, True
            examined += 1
            if examined > MAX_EXAMINED or time.monotonic() > deadline:
                problems.append(f"module listing stopped after {examined - 1} mapped files "
                                f"({'its cap' if examined > MAX_EXAMINED else f'its {budget:g} s budget'})")
                return out, True
            build_id, package = _module_notes(core, start)
            if build_id is None and core.read(start, 4) != elfcore.ELFMAG:
                continue  # a data file mapped from its start, not an ELF image
            seen.add(name)
            span = spans[name]
            out.append({"name": name, "start": start, "size": span[1] - start, "build_id": build_id,
                        "file": name, "package": package})
        return out, False
    finally:
        os.close(fd)
