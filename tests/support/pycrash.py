"""A Python program that segfaults through ctypes three calls deep in its own functions (inner < middle <
outer), for the Python frames' tests (tests/local/test_pyframes_real.py, tests/system/test_pyframes_live.py)
and benchmark (bench/analysis.py): the script, and the line each of its own frames stops at.

Its arguments: `--heap MIB` fills a heap of that size first (every page written, so the core holds it),
`--thread` starts a second thread that sleeps (without the GIL), `--stop` stops it (SIGSTOP) before it
crashes, so that gdb can attach to a script the kernel started (realcore.crash_attached)."""

from __future__ import annotations

from pathlib import Path

BODY = """import ctypes
import os
import signal
import sys
import threading
import time


def inner():
    return ctypes.string_at(0)


def middle():
    return inner()


def outer():
    return middle()


if "--heap" in sys.argv:
    heap = bytearray(int(sys.argv[sys.argv.index("--heap") + 1]) << 20)
    heap[::4096] = b"x" * len(heap[::4096])
if "--thread" in sys.argv:
    threading.Thread(target=time.sleep, args=(600,), name="sleeper", daemon=True).start()
if "--stop" in sys.argv:
    os.kill(os.getpid(), signal.SIGSTOP)
outer()
"""
FRAMES = ("inner", "middle", "outer")


def write(path: Path, interpreter: Path) -> Path:
    """The program at path, executable, its shebang naming interpreter."""
    path.write_text(f"#!{interpreter}\n{BODY}")
    path.chmod(0o755)
    return path


def lines(path: Path) -> dict[str, int]:
    """The line each of its own frames stops at, by function name."""
    text = path.read_text().splitlines()
    calls = {"inner": "    return ctypes.string_at(0)", "middle": "    return inner()", "outer": "    return middle()"}
    return {name: text.index(call) + 1 for name, call in calls.items()}


def expected(path: Path) -> list[tuple[str, int, str]]:
    """Its three own frames as (file, line, function), innermost first."""
    at = lines(path)
    return [(str(path), at[name], name) for name in FRAMES]
