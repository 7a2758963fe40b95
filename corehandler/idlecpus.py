"""How many CPUs are idle now, for the work that may take every CPU the capture does not need (compression's zstd
workers, `[compression] threads = "auto"`).

Idle CPUs = the CPUs this process may run on (its affinity: a cpuset or `taskset` narrows it) less the tasks that
are runnable right now besides the one asking, at least 1. "Right now" is the kernel's instantaneous count (the
fourth field of /proc/loadavg, `running/total`), read SAMPLES times a few milliseconds apart and the median taken,
so one task waking for a moment does not count. Not the load average: it lags by a minute, and right after a crash
it still holds the crashed process, the kernel's dump writer and the daemon's own last compression, so an idle
machine would be given one worker for the dump that follows a big one. A host that turns busy during a dump's
compression costs the others little: the daemon runs at a lower priority (Nice=5 in its unit), and a capture that
starts pauses the compression altogether (capture.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SAMPLES, INTERVAL = 5, 0.004


def affinity() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except OSError:
        return os.cpu_count() or 1


def running_others(proc: Path = Path("/proc")) -> int | None:
    """Tasks runnable now besides the reader (which the kernel's count includes); None when it cannot be read."""
    try:
        running = int((proc / "loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0, running - 1)


def idle_cpus(proc: Path = Path("/proc"), cpus: int | None = None, sleep=time.sleep) -> int:
    """The CPUs free for background work now (see the module's docstring); when the count cannot be read, all."""
    cpus = affinity() if cpus is None else cpus
    counts = []
    for i in range(SAMPLES):
        if i:
            sleep(INTERVAL)
        others = running_others(proc)
        if others is None:
            return max(1, cpus)
        counts.append(others)
    busy = sorted(counts)[len(counts) // 2]
    return max(1, min(cpus, cpus - busy))
