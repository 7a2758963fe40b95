"""Idle CPUs (corehandler/idlecpus.py) from a fake /proc/loadavg: the affinity less the rounded 1-minute load,
at least 1, all of them when the load cannot be read."""

from __future__ import annotations

import os

import pytest

from corehandler import idlecpus


def proc_with(tmp_path, text):
    if text is not None:
        (tmp_path / "loadavg").write_text(text)
    return tmp_path


@pytest.mark.parametrize("cpus,loadavg,idle", [
    (2, "0.00 0.10 0.20 1/100 123\n", 2),   # a quiet host: every CPU
    (2, "0.49 0.10 0.20 1/100 123\n", 2),
    (2, "0.51 0.10 0.20 2/100 123\n", 1),
    (2, "1.70 1.00 0.50 3/100 123\n", 1),
    (2, "9.80 9.00 9.00 9/100 123\n", 1),   # far past busy: still one, the compression must go on
    (8, "2.40 2.00 2.00 3/100 123\n", 6),
    (1, "0.00 0.00 0.00 1/100 123\n", 1),
    (4, None, 4),                           # no /proc/loadavg
    (4, "garbage\n", 4),
    (4, "", 4),
])
def test_idle_cpus(tmp_path, cpus, loadavg, idle):
    assert idlecpus.idle_cpus(proc_with(tmp_path, loadavg), cpus=cpus) == idle


def test_the_affinity_is_this_process_cpu_set():
    assert idlecpus.affinity() == len(os.sched_getaffinity(0))
    assert 1 <= idlecpus.idle_cpus() <= idlecpus.affinity()
