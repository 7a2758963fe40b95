"""The mini core: a small ELF core written beside the stored one, from the raw spool core before it is deleted.

It holds every note of the original (registers, siginfo, auxv, NT_FILE, the package notes), each thread's stack
from its stack pointer up to `Limits.stack_bytes`, a page around every address the crashing thread's general
registers hold, the first page of every mapped ELF image (its headers and build-id note), the vDSO, and the
dynamic linker's list of loaded libraries (the executable's dynamic section, r_debug, each link_map entry and
its name), which gdb walks to find the shared libraries. That is what gdb and eu-stack need to unwind each
thread with the executable and libraries on disk: the code and the unwind tables come from those files, the
stacks and registers from here. Memory is copied in whole pages, so every segment keeps its page alignment.

The raw core is the crashed process's output and read as hostile: every header field, offset, count and
pointer is bounded by the file's size and the caps; what does not fit or does not read is left out and said
(`MiniCore.cut`). Only headers, notes and the chosen pages are read, so the cost does not grow with the core:
one pass over the program headers, one over the notes, and one copy per run of chosen pages, in the kernel
(copy_file_range) where the filesystem allows (bench/minicore.py measures it by thread count).
"""

from __future__ import annotations

import bisect
import errno
import os
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from corehandler import elfcore, elffile

SUFFIX = ".mini.core"          # <id>.mini.core beside the stored <id>.zst
PAGE = 4096
# Below the stack pointer: the x86-64 red zone (128 bytes) and a margin, in whole pages.
BELOW_SP = 256
MAX_SEGMENTS = 65000          # short of PN_XNUM, so the program header count fits e_phnum
MAX_MODULES = 1024            # ELF images whose first page is kept
MAX_LINK_MAP = 1024           # link_map entries followed
MAX_VDSO = 64 << 10
NT_AUXV = 6
AT_PHDR, AT_PHENT, AT_PHNUM, AT_SYSINFO_EHDR = 3, 4, 5, 33
PT_DYNAMIC, PT_PHDR = 2, 6
DT_NULL, DT_DEBUG = 0, 21
MAX_DYNAMIC = 512             # entries of the executable's dynamic section read

class MiniCoreError(Exception):
    """The raw core cannot give a mini core (not an ELF core, unreadable headers): nothing was written."""


@dataclass(frozen=True)
class Limits:
    stack_bytes: int = 64 << 10   # per thread, from its stack pointer up
    max_bytes: int = 32 << 20     # the whole mini core; what does not fit is left out, crashing thread first


@dataclass
class MiniCore:
    path: Path
    bytes: int = 0
    threads: int = 0
    segments: int = 0
    seconds: float = 0.0
    cut: list[str] = field(default_factory=list)   # what was left out, and why

    def as_dict(self) -> dict:
        return {"bytes": self.bytes, "threads": self.threads, "segments": self.segments,
                "seconds": round(self.seconds, 6), "cut": self.cut}


class _Load(NamedTuple):  # a tuple, not a frozen dataclass: a core of many threads makes thousands
    vaddr: int
    offset: int
    filesz: int     # bytes the core holds, already cut to the file's size
    flags: int


class _Raw:
    """The raw core's headers, notes and memory, every read bounded by the file."""

    def __init__(self, fd: int):
        self.fd = fd
        self.size = os.fstat(fd).st_size
        ident = elfcore._read_at(fd, 0, 16)
        layout = elfcore._LAYOUTS.get(ident[4]) if len(ident) == 16 and ident[:4] == elfcore.ELFMAG else None
        if layout is None:
            raise MiniCoreError("not an ELF file")
        self.ident, self.layout = ident, layout
        self.end = "<" if ident[5] == elfcore.ELFDATA2LSB else ">"
        ehsize = struct.calcsize(self.end + layout.ehdr)
        raw = elfcore._read_at(fd, 0, ehsize)
        if len(raw) < ehsize:
            raise MiniCoreError("truncated ELF header")
        fields = struct.unpack(self.end + layout.ehdr, raw)
        self.ehdr = fields
        e_type, self.machine, phoff, shoff, phentsize, phnum = (fields[1], fields[2], fields[5], fields[6],
                                                                 fields[9], fields[10])
        if e_type != elfcore.ET_CORE:
            raise MiniCoreError(f"not a core file (ELF type {e_type})")
        if phnum == elfcore.PN_XNUM:
            fmt, off = layout.shdr_info
            sh = elfcore._read_at(fd, shoff + off, 4)
            if len(sh) < 4:
                raise MiniCoreError("truncated: section header 0 (segment count) is missing")
            phnum = struct.unpack(self.end + fmt, sh)[0]
        phsize = struct.calcsize(self.end + layout.phdr)
        if phentsize < phsize or phnum == 0 or phnum > elfcore.MAX_PHNUM:
            raise MiniCoreError(f"bad program header table ({phnum} entries of {phentsize} bytes)")
        table = elfcore._read_at(fd, phoff, phnum * phentsize)
        self.loads: list[_Load] = []
        self.notes: list[bytes] = []
        # Each note of every note segment once: (segment's index, owner, type, desc start, desc end).
        self.note_spans: list[tuple[int, bytes, int, int, int]] = []
        # Positions of the fields in an unpacked header (the two classes order them differently): a core of
        # many threads has thousands of headers, read here in one pass.
        at = {name: i for i, name in enumerate(layout.phdr_fields)}
        ptype, flags, offset, vaddr, filesz, memsz = (at["type"], at["flags"], at["offset"], at["vaddr"],
                                                      at["filesz"], at["memsz"])
        fmt = struct.Struct(self.end + layout.phdr)
        for i in range(len(table) // phentsize):
            p = fmt.unpack_from(table, i * phentsize)
            if p[ptype] == elfcore.PT_LOAD:
                # A bogus offset or a truncated core: only the bytes the file holds count as held.
                held = max(0, min(p[filesz], p[memsz], self.size - p[offset]))
                if held and p[vaddr] + held <= 1 << 64:
                    self.loads.append(_Load(p[vaddr], p[offset], held, p[flags]))
            elif p[ptype] == elfcore.PT_NOTE and p[filesz]:
                data = elfcore._read_at(fd, p[offset], min(p[filesz], elfcore.MAX_NOTES_BYTES))
                self.notes.append(data[:self._whole_notes(len(self.notes), data)])
        self.loads.sort(key=lambda x: x.vaddr)
        self._starts = [x.vaddr for x in self.loads]

    def segment(self, vaddr: int) -> _Load | None:
        i = bisect.bisect_right(self._starts, vaddr) - 1
        if i >= 0 and vaddr < self.loads[i].vaddr + self.loads[i].filesz:
            return self.loads[i]
        return None

    def read(self, vaddr: int, length: int) -> bytes:
        s = self.segment(vaddr)
        if s is None:
            return b""
        return elfcore._read_at(self.fd, s.offset + vaddr - s.vaddr, min(length, s.vaddr + s.filesz - vaddr))

    def prefetch(self, ranges) -> None:
        """Asks the kernel to read these (vaddr, end) ranges of memory in now, all at once: a core csplice wrote
        with O_DIRECT is not in the page cache, and one read after the other, each waiting for the disk, made
        a 500-thread mini core take 3x as long as from the page cache (bench/minicore.py, cold)."""
        for start, stop in ranges:
            s = self.segment(start)
            if s is not None:
                try:
                    os.posix_fadvise(self.fd, s.offset + start - s.vaddr, min(stop, s.vaddr + s.filesz) - start,
                                     os.POSIX_FADV_WILLNEED)
                except OSError:  # only advice: the reads below still read
                    return

    def word(self, vaddr: int) -> int | None:
        size = struct.calcsize(self.layout.word)
        data = self.read(vaddr, size)
        return struct.unpack(self.end + self.layout.word, data)[0] if len(data) == size else None

    def _whole_notes(self, index: int, data: bytes) -> int:
        """The length of data's complete notes (a note segment cut inside a note stays a valid one without
        it), their spans kept for _scan_notes."""
        whole = 0
        for owner, ntype, start, stop, nxt in elffile.note_spans(data, self.end):
            if nxt > len(data):
                break
            self.note_spans.append((index, owner, ntype, start, stop))
            whole = nxt
        return whole


class _Wanted:
    """Page ranges to copy, in the order they were asked for (which is their priority under the total cap)."""

    def __init__(self, raw: _Raw, budget: int):
        self.raw = raw
        self.budget = budget
        self.pages: dict[int, int] = {}       # page address -> its segment's start (insertion order = priority)
        self.cut: list[str] = []              # what did not fit the total cap
        self.left_out: list[str] = []         # what was left out for other reasons

    def add(self, start: int, end: int, what: str) -> None:
        """Pages of [start, end) the core holds, clipped to their segment; cut when the budget is spent."""
        s = self.raw.segment(start)
        if s is None:
            return
        end = min(end, s.vaddr + s.filesz)
        page = max(start & ~(PAGE - 1), s.vaddr)
        while page < end:
            if page not in self.pages:
                if self.budget < PAGE:
                    self.cut.append(what)
                    return
                self.pages[page] = s.vaddr
                self.budget -= PAGE
            page = (page & ~(PAGE - 1)) + PAGE

    def around(self, addr: int, what: str) -> None:
        self.add(addr & ~(PAGE - 1), (addr & ~(PAGE - 1)) + PAGE, what)


@dataclass
class _Notes:
    threads: list[list[int]] = field(default_factory=list)  # general registers, the thread that dumped first
    auxv: dict[int, int] = field(default_factory=dict)
    file_starts: list[int] = field(default_factory=list)    # NT_FILE mappings at offset 0: ELF headers there


def _scan_notes(raw: _Raw) -> _Notes:
    """What the choice needs from the notes, in one pass over them (a core of 500 threads has thousands)."""
    out = _Notes()
    regs = elfcore.REGS.get(raw.machine)
    fmt = f"{raw.end}{regs.count}{regs.word}" if regs else ""
    need = regs.offset + struct.calcsize(fmt) if regs else 0
    word = raw.layout.word
    size = struct.calcsize(word)
    auxv_seen = files_seen = False
    for index, owner, ntype, start, stop in raw.note_spans:
        if owner != b"CORE" or ntype not in (elfcore.NT_PRSTATUS, NT_AUXV, elfcore.NT_FILE):
            continue
        if ntype == elfcore.NT_PRSTATUS:
            if regs and stop - start >= need:
                out.threads.append(list(struct.unpack_from(fmt, raw.notes[index], start + regs.offset)))
            continue
        desc = raw.notes[index][start:stop]
        if ntype == NT_AUXV and not auxv_seen:
            auxv_seen = True
            pairs = struct.iter_unpack(raw.end + word * 2, desc[:len(desc) - len(desc) % (2 * size)])
            out.auxv = {k: v for k, v in pairs}
        elif ntype == elfcore.NT_FILE and not files_seen and len(desc) >= 2 * size:
            files_seen = True
            count = min(struct.unpack_from(raw.end + word, desc, 0)[0], (len(desc) - 2 * size) // (3 * size))
            entries = struct.iter_unpack(raw.end + word * 3, desc[2 * size:2 * size + 3 * size * count])
            out.file_starts = sorted({start for start, _, offset in entries if offset == 0})
    return out


def _link_map(raw: _Raw, auxv: dict[int, int], want: _Wanted) -> None:
    """The memory gdb reads to list the shared libraries: the executable's program headers and dynamic section
    (found through AT_PHDR), r_debug (DT_DEBUG), and each link_map entry with its name and dynamic section."""
    ehdr_fmt = raw.end + raw.layout.phdr
    phent, phnum, phdr_at = auxv.get(AT_PHENT, 0), auxv.get(AT_PHNUM, 0), auxv.get(AT_PHDR)
    if phdr_at is None or phent < struct.calcsize(ehdr_fmt) or not 0 < phnum <= 256:
        return
    want.add(phdr_at, phdr_at + phent * phnum, "program headers")
    table = raw.read(phdr_at, phent * phnum)
    phdrs = [dict(zip(raw.layout.phdr_fields, struct.unpack_from(ehdr_fmt, table, i * phent)))
             for i in range(len(table) // phent)]
    bias = next((phdr_at - p["vaddr"] for p in phdrs if p["type"] == PT_PHDR), None)
    dynamic = next((p for p in phdrs if p["type"] == PT_DYNAMIC), None)
    if bias is None or dynamic is None:
        return
    mask = (1 << (8 * struct.calcsize(raw.layout.word))) - 1
    dyn_at = (dynamic["vaddr"] + bias) & mask
    word = struct.calcsize(raw.layout.word)
    dyn_size = min(dynamic["memsz"], MAX_DYNAMIC * 2 * word)
    want.add(dyn_at, dyn_at + dyn_size, "dynamic section")
    data = raw.read(dyn_at, dyn_size)
    r_debug = None
    for tag, value in struct.iter_unpack(raw.end + raw.layout.word * 2, data[:len(data) - len(data) % (2 * word)]):
        if tag == DT_NULL:
            break
        if tag == DT_DEBUG:
            r_debug = value
    if not r_debug:
        return
    # struct r_debug { int r_version; struct link_map *r_map; ElfW(Addr) r_brk; r_state; r_ldbase; }
    want.add(r_debug, r_debug + 5 * word, "r_debug")
    entry, seen = raw.word(r_debug + word), set()
    while entry and entry not in seen and len(seen) < MAX_LINK_MAP:
        seen.add(entry)
        # struct link_map { l_addr; char *l_name; ElfW(Dyn) *l_ld; l_next; l_prev; }
        want.add(entry, entry + 5 * word, "link_map")
        name, ld, nxt = raw.word(entry + word), raw.word(entry + 2 * word), raw.word(entry + 3 * word)
        if name:
            want.around(name, "link_map name")
        if ld:
            want.around(ld, "link_map dynamic section")
        entry = nxt


def _choose(raw: _Raw, limits: Limits) -> tuple[_Wanted, int]:
    notes_bytes = sum(len(n) for n in raw.notes)
    want = _Wanted(raw, limits.max_bytes - notes_bytes)
    notes = _scan_notes(raw)
    threads, auxv = notes.threads, notes.auxv
    regs = elfcore.REGS.get(raw.machine)
    if regs is None and raw.loads:
        want.left_out.append(f"stacks: registers of ELF machine {raw.machine} not known, notes only")
    stack = max(PAGE, limits.stack_bytes)

    def stack_of(i: int, values: list[int]) -> None:
        sp = values[regs.sp]
        want.add(max(0, sp - BELOW_SP), sp + stack, "the crashing thread's stack" if i == 0 else "thread stacks")

    if threads:
        stack_of(0, threads[0])
    modules = notes.file_starts[:MAX_MODULES]
    raw.prefetch((start, start + 4) for start in modules)
    for start in modules:
        if raw.read(start, 4) == elfcore.ELFMAG:
            want.around(start, "ELF headers")
    vdso = auxv.get(AT_SYSINFO_EHDR)
    if vdso:
        want.add(vdso, vdso + MAX_VDSO, "vDSO")
    _link_map(raw, auxv, want)
    if threads:
        for value in threads[0]:
            want.around(value, "a page the crashing thread's registers point into")
    for i, values in enumerate(threads[1:], 1):
        stack_of(i, values)
    return want, len(threads)


def _ranges(pages: dict[int, int]) -> list[tuple[int, int]]:
    """Runs of adjacent pages, each inside one segment of the raw core (so one read copies it)."""
    out: list[list[int]] = []
    for page in sorted(pages):
        if out and out[-1][1] == page and pages[out[-1][0]] == pages[page]:
            out[-1][1] = min(page + PAGE, 1 << 64)
        else:
            out.append([page, page + PAGE])
    return [(a, b) for a, b in out]


def write(raw_path: Path | str, dest: Path | str, limits: Limits = Limits(), *, tmp: Path | None = None) -> MiniCore:
    """Writes the mini core of raw_path to dest (through tmp, renamed into place). Raises MiniCoreError when
    the raw core gives none, OSError when a file cannot be read or written; never anything else."""
    started = time.monotonic()
    dest = Path(dest)
    fd = os.open(raw_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        try:
            raw = _Raw(fd)
            want, threads = _choose(raw, limits)
        except (struct.error, OverflowError, ValueError) as e:  # a field no check above foresaw
            raise MiniCoreError(f"malformed core: {e}") from None
        ranges = _ranges(want.pages)
        if len(ranges) + len(raw.notes) > MAX_SEGMENTS:
            want.left_out.append(f"segments past {MAX_SEGMENTS} left out")
            ranges = ranges[:MAX_SEGMENTS - len(raw.notes)]
        counts = Counter(want.cut)
        cut = [f"{what} past the total cap" + (f" ({n})" if n > 1 else "") for what, n in counts.items()]
        result = MiniCore(dest, threads=threads, cut=cut + want.left_out)
        raw.prefetch(ranges)
        _emit(raw, ranges, dest, tmp or dest.with_name(f".tmp.{dest.name}"), result)
    finally:
        os.close(fd)
    result.seconds = time.monotonic() - started
    return result


def _copy(raw: _Raw, out: int, start: int, length: int, at: int, kernel: list[bool]) -> int:
    """Copies [start, start + length) of the raw core's memory to out at `at`; the bytes copied (fewer only if
    the file changed under us). In the kernel (copy_file_range: no read into Python, and on a filesystem
    that shares blocks, no copy at all) while kernel[0] holds; else, and from the first refusal on, by pread
    and pwrite."""
    s = raw.segment(start)
    if s is None:
        return 0
    length = min(length, s.vaddr + s.filesz - start)
    src, done = s.offset + start - s.vaddr, 0
    while done < length and kernel[0]:
        try:
            n = os.copy_file_range(raw.fd, out, length - done, src + done, at + done)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF):
                raise
            kernel[0] = False
            break
        if n == 0:
            return done
        done += n
    while done < length:
        data = elfcore._read_at(raw.fd, src + done, min(length - done, 1 << 20))
        if not data:
            break
        _pwrite_all(out, data, at + done)
        done += len(data)
    return done


def _pwrite_all(out: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        view = view[os.pwrite(out, view, at + len(data) - len(view)):]


def _emit(raw: _Raw, ranges: list[tuple[int, int]], dest: Path, tmp: Path, result: MiniCore) -> None:
    end, layout = raw.end, raw.layout
    ehsize = struct.calcsize(end + layout.ehdr)
    phdr_fmt = struct.Struct(end + layout.phdr)
    segments = len(raw.notes) + len(ranges)
    offset = ehsize + segments * phdr_fmt.size
    headers = []

    order = [("type", "flags", "offset", "vaddr", "paddr", "filesz", "memsz", "align").index(f)
             for f in layout.phdr_fields]

    def phdr(ptype: int, flags: int, off: int, vaddr: int, size: int, align: int) -> bytes:
        values = (ptype, flags, off, vaddr, 0, size, size, align)
        return phdr_fmt.pack(*[values[i] for i in order])

    tmp.unlink(missing_ok=True)
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        for data in raw.notes:
            offset = (offset + 3) & ~3
            headers.append(phdr(elfcore.PT_NOTE, 0, offset, 0, len(data), 4))
            _pwrite_all(out, data, offset)
            offset += len(data)
        kernel = [True]
        for start, stop in ranges:
            offset = (offset + PAGE - 1) & ~(PAGE - 1)
            copied = _copy(raw, out, start, stop - start, offset, kernel)
            # A short copy (the file changed under us) keeps what it got, still whole pages where it can.
            headers.append(phdr(elfcore.PT_LOAD, raw.segment(start).flags if copied else 0, offset, start, copied,
                                PAGE))
            offset += copied
        fields = list(raw.ehdr)
        # e_phoff, e_shoff, e_phnum, e_shentsize, e_shnum, e_shstrndx: program headers only, right after it
        fields[5], fields[6], fields[10], fields[11], fields[12], fields[13] = ehsize, 0, segments, 0, 0, 0
        fields[8], fields[9] = ehsize, phdr_fmt.size
        head = struct.pack(end + layout.ehdr, *fields) + b"".join(headers)
        _pwrite_all(out, head, 0)
        size = max(len(head), offset)
        os.ftruncate(out, size)
        os.fsync(out)
    except BaseException:
        os.close(out)
        tmp.unlink(missing_ok=True)
        raise
    os.close(out)
    os.rename(tmp, dest)
    result.bytes, result.segments = size, segments
