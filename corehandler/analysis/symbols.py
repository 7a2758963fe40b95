"""Where each module's symbols come from, and which build-ids a trace still lacks symbols for.

A module's symbols are, in the order elfutils looks for them: `debuginfod` (the fetched file in our cache),
`local debug file` (/usr/lib/debug/.build-id, a -dbgsym package), `embedded` (the file on disk has .symtab
or .debug_info), else `none`. A file on disk whose build-id is not the one the core recorded (replaced or
rebuilt since the crash) gives `none (build-id mismatch)`: elfutils rejects it by build-id, so its frames stay
unsymbolised rather than named from another build; `none (file gone)` when there is no file.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

from corehandler import elfcore
from corehandler.analysis import debuginfod

DEBUGINFOD, LOCAL, EMBEDDED, NONE = "debuginfod", "local debug file", "embedded", "none"
MISMATCH, GONE = "none (build-id mismatch)", "none (file gone)"
_SYMBOL_SECTIONS = {b".symtab", b".debug_info"}
_MAX_SECTIONS = 4096
_SHDR = {elfcore.ELFCLASS64: ("IIQQQQIIQQ", 64), elfcore.ELFCLASS32: ("IIIIIIIIII", 40)}


def section_names(path: Path | str) -> set[bytes]:
    """The section names of an ELF file (a few preads); empty for anything else. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return set()
        ident = elfcore._read_at(fd, 0, 16)
        if len(ident) < 16 or ident[:4] != elfcore.ELFMAG or ident[4] not in _SHDR:
            return set()
        layout = elfcore._LAYOUTS[ident[4]]
        end = "<" if ident[5] == elfcore.ELFDATA2LSB else ">"
        size = struct.calcsize(end + layout.ehdr)
        raw = elfcore._read_at(fd, 0, size)
        if len(raw) < size:
            return set()
        fields = struct.unpack(end + layout.ehdr, raw)
        shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
        fmt, need = _SHDR[ident[4]]
        if not shoff or shentsize < need or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum:
            return set()
        table = elfcore._read_at(fd, shoff, shnum * shentsize)
        headers = [struct.unpack_from(end + fmt, table, i * shentsize) for i in range(len(table) // shentsize)]
        if shstrndx >= len(headers):
            return set()
        strtab = headers[shstrndx]
        names = elfcore._read_at(fd, strtab[4], min(strtab[5], 1 << 20))
        return {names[h[0]:names.find(b"\0", h[0])] for h in headers if h[0] < len(names)}
    finally:
        os.close(fd)


def source(module: dict, cache: Path, debug_root: Path = Path("/usr/lib/debug")) -> str:
    build_id = module.get("build_id")
    if build_id and debuginfod.cached(cache, build_id).exists():
        return DEBUGINFOD
    if build_id and debuginfod.system_debug_file(build_id, debug_root).exists():
        return LOCAL
    path = module.get("file") or module.get("name")
    try:
        on_disk = elfcore.file_build_id(path) if path else None
        names = section_names(path) if path else set()
    except OSError:
        return GONE
    if build_id and on_disk and on_disk != build_id:
        return MISMATCH
    return EMBEDDED if names & _SYMBOL_SECTIONS else NONE


def annotate(result: dict, state_dir: Path) -> None:
    """Adds `symbols` (where they came from) to each module of an analysis result, and a problem for each
    module whose file is not the one that crashed."""
    cache = debuginfod.cache_dir(state_dir)
    for m in result.get("modules") or []:
        m["symbols"] = source(m, cache)
        if m["symbols"] == MISMATCH and m.get("name") != (result.get("exe") or {}).get("path"):
            result.setdefault("problems", []).append(
                f"{m['name']} on disk is not the build that crashed (build-id {m['build_id']} in the core): "
                "its frames are not symbolised")


def wanted(result: dict) -> list[str]:
    """Build-ids of the modules the crashing thread's frames are in and that have no symbols yet."""
    bare = {m.get("build_id"): m.get("symbols") for m in result.get("modules") or []}
    threads = result.get("threads") or []
    frames = threads[0]["frames"] if threads else []
    return list(dict.fromkeys(f["build_id"] for f in frames if f.get("build_id") and not f.get("function")
                              and bare.get(f["build_id"]) in (NONE, None)))
