"""corehandler/idlecpus.py: a worker per CPU of the affinity, and the daemon's priority lowered to NICE (never
raised), in a child so that this test process keeps its own."""

from __future__ import annotations

import os
import re
from pathlib import Path

from corehandler import idlecpus

UNIT = Path(__file__).resolve().parents[2] / "packaging" / "systemd" / "corehandler.service"


def test_a_worker_per_cpu_of_the_affinity():
    assert idlecpus.workers() == len(os.sched_getaffinity(0))


def _in_child(start: int) -> tuple[int, int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.setpriority(os.PRIO_PROCESS, 0, start)
        got = idlecpus.lower_priority()
        os.write(write, f"{got} {os.getpriority(os.PRIO_PROCESS, 0)}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    got, now = map(int, text.split())
    return got, now


def test_the_priority_is_lowered_to_nice_and_never_raised():
    assert _in_child(0) == (idlecpus.NICE, idlecpus.NICE)
    assert _in_child(12) == (12, 12)


def test_the_units_nice_is_the_daemons():
    assert re.search(r"(?m)^Nice=(\d+)$", UNIT.read_text()).group(1) == str(idlecpus.NICE)
