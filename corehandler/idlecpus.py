"""How many CPUs are idle now, for the work that may take every CPU the capture does not need (compression's zstd
workers, `[compression] threads = "auto"`).

Idle CPUs = the CPUs this process may run on (its affinity: a cpuset or `taskset` narrows it) less the 1-minute
load average rounded to the nearest whole CPU, at least 1. The load average is the kernel's own smoothed count of
runnable (and uninterruptible) tasks, one read and no sampling window; it lags by tens of seconds, so a host that
turned busy a moment ago is given more workers than it has idle CPUs for one dump. That costs the others little:
the daemon runs at a lower priority (Nice=5 in its unit), and a capture that starts pauses the compression
altogether (capture.py).
"""

from __future__ import annotations

import os
from pathlib import Path


def affinity() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except OSError:
        return os.cpu_count() or 1


def load(proc: Path = Path("/proc")) -> float | None:
    """The 1-minute load average, None when /proc/loadavg cannot be read."""
    try:
        return float((proc / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def idle_cpus(proc: Path = Path("/proc"), cpus: int | None = None) -> int:
    """The CPUs free for background work now (see the module's docstring); with no load average, all of them."""
    cpus = affinity() if cpus is None else cpus
    busy = load(proc)
    if busy is None:
        return max(1, cpus)
    return max(1, min(cpus, cpus - int(busy + 0.5)))
