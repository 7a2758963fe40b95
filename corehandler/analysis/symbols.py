"""Where each module's symbols come from, and which build-ids a trace still lacks symbols for.

A module's symbols are, in the order elfutils looks for them: `debuginfod` (the fetched file in our cache),
`local debug file` (/usr/lib/debug/.build-id, a -dbgsym package), `embedded` (the file on disk has .symtab
or .debug_info), else `none`. A file on disk whose build-id is not the one the core recorded (replaced or
rebuilt since the crash) gives `none (build-id mismatch)`: elfutils rejects it by build-id, so its frames stay
unsymbolised rather than named from another build; `none (file gone or unreadable)` when there is no file the
crashing user could open (the two read alike).
"""

from __future__ import annotations

from pathlib import Path

from corehandler.analysis import debuginfod

DEBUGINFOD, LOCAL, EMBEDDED, NONE = "debuginfod", "local debug file", "embedded", "none"
MISMATCH, GONE = "none (build-id mismatch)", "none (file gone or unreadable)"


def source(module: dict, cache: Path, debug_root: Path = Path("/usr/lib/debug")) -> str:
    """Where the module's symbols come from. The file at its path is known only by what the analyser's jail
    read of it as the crashing user (`disk`, unwind.py): nothing here opens a path the core names, and a file
    that user could not open reads as one that is not there."""
    build_id = module.get("build_id")
    if build_id and debuginfod.cached(cache, build_id).exists():
        return DEBUGINFOD
    if build_id and debuginfod.system_debug_file(build_id, debug_root).exists():
        return LOCAL
    disk = module.get("disk")
    if not isinstance(disk, dict):
        return GONE
    if build_id and disk.get("build_id") and disk["build_id"] != build_id:
        return MISMATCH
    return EMBEDDED if disk.get("symbols") is True else NONE


def annotate(result: dict, state_dir: Path) -> None:
    """Adds `symbols` (where they came from) to each module of an analysis result, and a problem for each
    module whose file is not the one that crashed."""
    cache = debuginfod.cache_dir(state_dir)
    for m in result.get("modules") or []:
        m["symbols"] = source(m, cache)
        m.pop("disk", None)
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
