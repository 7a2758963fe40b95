"""Every thread's frames as eu-stack and gdb unwind a core: what the mini-core tests compare."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def eu_stack(core: Path) -> dict[str, list[str]]:
    """eu-stack's frames per thread (every frame, no limit), addresses and all."""
    out = subprocess.run(["eu-stack", f"--core={core}", "-n", "0"], capture_output=True, text=True, timeout=120)
    threads: dict[str, list[str]] = {}
    current = None
    for line in out.stdout.splitlines():
        if line.startswith("TID "):
            current = threads.setdefault(line, [])
        elif line.startswith("#") and current is not None:
            current.append(line.split(None, 1)[1])
    assert threads, out.stderr
    return threads


def gdb_bt(exe: Path, core: Path) -> list[tuple[str, list[str]]]:
    """gdb's backtrace of every thread: (LWP, [pc and function of each frame])."""
    out = subprocess.run(["gdb", "-q", "-nx", "-batch", "-ex", "set pagination off", "-ex", "thread apply all bt",
                          str(exe), str(core)], capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    threads: list[tuple[str, list[str]]] = []
    for line in out.stdout.splitlines():
        if line.startswith("Thread "):
            threads.append((re.search(r"LWP (\d+)", line).group(1), []))
        elif (m := re.match(r"#\d+\s+(?:(0x[0-9a-f]+) in )?(\S+)", line)) and threads:
            threads[-1][1].append(f"{m.group(1)} {m.group(2)}")
    assert threads, out.stdout + out.stderr
    return threads
