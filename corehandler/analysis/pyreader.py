"""The Python frames of a CPython core, read by bloomberg's pystack inside the analysis jail (pyframes.py starts
it there, as jail.py starts eu-stack): run as `python -I -S pyreader.py SITE CORE EXE THREADS FRAMES CHARS`, it
imports pystack from SITE (the directory holding the `pystack` package, bound read-only into the jail's view)
and nothing of ours, reads every thread's Python stack from CORE (the raw core as the jail's inherited fd) with
EXE (the interpreter the process ran, at its own path, vetted as the crashing user), and writes one JSON
object to stdout:

    {"version": "3.11" | null, "threads_seen": N, "error": str | null,
     "threads": [{"tid", "gil", "gc", "name", "frames_seen",
                  "frames": [{"file", "line", "function", "entry"}, ... innermost first]}]}

At most THREADS threads and FRAMES frames each (the innermost kept), every string cut at CHARS characters:
whatever the core's memory says, the output stays bounded (and RLIMIT_FSIZE bounds it again). The daemon
checks it as hostile all the same (pyframes.parse). A pystack error is the `error` string, exit 0; a crash
of pystack itself is the jail's to report (the exit signal).

Standard library and pystack only: it runs without the venv's site-packages, as the analysis's own uid.
"""

from __future__ import annotations

import json
import sys


def _cut(text, limit: int) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text[:limit] + ("...[cut]" if len(text) > limit else "")


def _frames(thread, frames: int, chars: int) -> tuple[list[dict], int]:
    """The thread's Python frames, innermost first (pystack walks them outermost first), shims left out."""
    out = []
    for f in thread.frames:
        code = f.code
        out.append({"file": _cut(code.filename, chars), "line": int(code.location.lineno),
                    "function": _cut(code.scope, chars), "entry": bool(f.is_entry)})
    out.reverse()
    return out[:frames], len(out)


def read(core: str, exe: str, threads: int, frames: int, chars: int) -> dict:
    from pystack.engine import NativeReportingMode, StackMethod, get_process_threads_for_core

    found = get_process_threads_for_core(core, exe, native_mode=NativeReportingMode.OFF, method=StackMethod.AUTO)
    out: dict = {"version": None, "threads_seen": 0, "error": None, "threads": []}
    for t in found:
        out["threads_seen"] += 1
        if t.python_version and out["version"] is None:
            out["version"] = ".".join(str(n) for n in t.python_version[:2])
        if len(out["threads"]) >= threads:
            continue
        kept, seen = _frames(t, frames, chars)
        out["threads"].append({"tid": int(t.tid), "gil": bool(t.holds_the_gil), "gc": bool(t.is_gc_collecting),
                               "name": _cut(t.name, chars), "frames_seen": seen, "frames": kept})
    return out


def main(argv: list[str]) -> int:
    site, core, exe = argv[1], argv[2], argv[3]
    threads, frames, chars = (int(x) for x in argv[4:7])
    sys.path.append(site)  # appended: the standard library keeps every name
    try:
        out = read(core, exe, threads, frames, chars)
    except ImportError as e:
        out = {"error": f"pystack cannot be imported: {_cut(e, chars)}"}
    except Exception as e:  # pystack's own errors (NotEnoughInformation, EngineError, ...): the core's story
        first = str(e).strip().split("\n", 1)[0]
        out = {"error": _cut(f"{type(e).__name__}: {first}" if first else type(e).__name__, chars)}
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
