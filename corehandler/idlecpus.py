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
altogether (capture.py), and while it is waited for every thread of the daemon runs SCHED_IDLE (StepAside).
"""

from __future__ import annotations

import logging
import os
import resource
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# The daemon's niceness: corehandler.service's Nice= (tests/local/test_units_files.py holds them equal).
NICE = 5
CAP_SYS_NICE = 23  # linux/capability.h: leaving SCHED_IDLE without an RLIMIT_NICE that allows it


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


class StepAside:
    """While a capture is waited for (capture.Yield), every thread of the daemon runs SCHED_IDLE, so that the work
    already handed on when the wait began runs only on a CPU the capture leaves idle: zstd's workers hold a few
    MiB of input, the hashing and read-back threads a few more, a part on the wire its last MiB; at nice 5 that
    work still took a quarter of a CPU each from csplice and the kernel's dump writer. Waits of several threads
    overlap: the first steps aside, the last steps back (threads started meanwhile too: they inherited it).

    Only where the daemon can step back: leaving SCHED_IDLE takes CAP_SYS_NICE or an RLIMIT_NICE that reaches the
    thread's niceness (corehandler.service's LimitNICE=), and a daemon left there would store nothing while
    the host is busy."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waits = 0
        self._idle_before: set[int] = set()  # threads that were SCHED_IDLE of their own
        self._allowed: bool | None = None  # known at the first wait, after the daemon set its niceness

    @property
    def allowed(self) -> bool:
        if self._allowed is None:
            self._allowed = may_leave_idle()
            if not self._allowed:
                log.info("captures do not set the daemon's threads SCHED_IDLE: it could not leave it "
                         "(no CAP_SYS_NICE, RLIMIT_NICE short of nice %d)", os.getpriority(os.PRIO_PROCESS, 0))
        return self._allowed

    def __enter__(self) -> "StepAside":
        with self._lock:
            self._waits += 1
            if self._waits == 1 and self.allowed:
                self._idle_before = set()
                for tid in _threads():
                    if _policy(tid) == os.SCHED_IDLE:
                        self._idle_before.add(tid)
                    else:
                        _set_policy(tid, os.SCHED_IDLE)
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._waits -= 1
            if self._waits == 0 and self.allowed:
                for tid in _threads():
                    if tid not in self._idle_before and _policy(tid) == os.SCHED_IDLE:
                        _set_policy(tid, os.SCHED_OTHER)


# One per process: the waits of the compression, the scrub and the uploader count together.
STEP_ASIDE = StepAside()


def not_idle() -> None:
    """In a child of the daemon (the sealer): forked by a thread that was stepping aside, it inherited SCHED_IDLE for
    its whole life, as no wait's end reaches another process; it runs at its niceness like the daemon."""
    if _policy(0) == os.SCHED_IDLE:
        _set_policy(0, os.SCHED_OTHER)


def may_leave_idle(status: Path = Path("/proc/self/status")) -> bool:
    """Whether this thread could go back from SCHED_IDLE to SCHED_OTHER at its niceness."""
    cap_eff = 0
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                cap_eff = int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return leaves_idle(resource.getrlimit(resource.RLIMIT_NICE)[0], os.getpriority(os.PRIO_PROCESS, 0), cap_eff)


def leaves_idle(nice_limit: int, nice: int, cap_eff: int) -> bool:
    """The kernel's rule (can_nice): CAP_SYS_NICE, or an RLIMIT_NICE of at least 20 - nice."""
    return bool(cap_eff >> CAP_SYS_NICE & 1) or nice_limit == resource.RLIM_INFINITY or 20 - nice_limit <= nice


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def _policy(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid)
    except OSError:  # ended since the listing
        return None


def _set_policy(tid: int, policy: int) -> None:
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
    except ProcessLookupError:  # ended since the listing
        pass
    except OSError as e:
        log.warning("cannot set thread %d's scheduling policy to %d: %s", tid, policy, e.strerror)
