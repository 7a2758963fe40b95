"""The CPUs storage may take: compression's zstd workers for `[compression] threads = "auto"`, and the priority
that makes them take only the idle ones.

Which CPUs are idle is the scheduler's to know, moment by moment; no count read at a dump's start can say it for
the seconds the dump takes. The 1-minute load average lags a minute (right after a crash it still counts the
crashed process, the kernel's dump writer and the last compression, so an idle machine got one worker), and the
kernel's instantaneous count of runnable tasks counts the daemon's own analysis of the same crash, which runs for
a few tens of milliseconds beside the compression. So the daemon gives each dump a worker for every CPU it may
run on (its affinity: a cpuset or `taskset` narrows it) and runs at a lower priority than the host's own work
(NICE, as corehandler.service's Nice=): a CPU that anything else wants, the capture's csplice and the kernel's
dump writer first, is theirs, and the workers get what is left. A capture that starts pauses the compression
altogether (capture.py).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

# The daemon's niceness: corehandler.service's Nice= (tests/local/test_units_files.py holds them equal).
NICE = 5


def workers() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except OSError:
        return os.cpu_count() or 1


def lower_priority(nice: int = NICE) -> int:
    """Makes this process at least `nice` (systemd's Nice= did already; the supervisor and a `serve` run by hand
    did not); never raises the priority. Returns the niceness now."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if current < nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as e:  # a seccomp'd or odd environment: compression still works, at the priority it has
            log.warning("cannot lower the daemon's priority to nice %d: %s", nice, e.strerror)
            return current
    return max(current, nice)
