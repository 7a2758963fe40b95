"""Idle CPUs (corehandler/idlecpus.py) from a fake /proc/loadavg: the affinity less the tasks runnable now besides
the reader (the median of a few reads), at least 1, all of them when the count cannot be read; the load average
plays no part."""

from __future__ import annotations

import os

import pytest

from corehandler import idlecpus


def proc_with(tmp_path, text):
    if text is not None:
        (tmp_path / "loadavg").write_text(text)
    return tmp_path


@pytest.mark.parametrize("cpus,loadavg,idle", [
    (2, "0.00 0.10 0.20 1/100 123\n", 2),   # only the reader runs: every CPU
    (2, "1.90 1.50 1.20 1/100 123\n", 2),   # a busy last minute (the crash just stored) is not now
    (2, "0.00 0.10 0.20 2/100 123\n", 1),
    (2, "0.00 0.00 0.00 3/100 123\n", 1),   # past busy: still one, the compression must go on
    (8, "0.00 0.00 0.00 3/100 123\n", 6),
    (1, "0.00 0.00 0.00 1/100 123\n", 1),
    (4, None, 4),                           # no /proc/loadavg
    (4, "garbage\n", 4),
    (4, "0.00 0.00 0.00 x/100 123\n", 4),
    (4, "", 4),
])
def test_idle_cpus(tmp_path, cpus, loadavg, idle):
    assert idlecpus.idle_cpus(proc_with(tmp_path, loadavg), cpus=cpus, sleep=lambda s: None) == idle


def test_a_task_that_runs_for_one_read_does_not_count(tmp_path):
    reads = iter(["1/100", "3/100", "1/100", "1/100", "4/100"])

    def next_read(seconds):
        assert seconds == idlecpus.INTERVAL
        (tmp_path / "loadavg").write_text(f"0.00 0.00 0.00 {next(reads)} 123\n")
    next_read(idlecpus.INTERVAL)
    assert idlecpus.idle_cpus(tmp_path, cpus=4, sleep=next_read) == 4


def test_the_affinity_is_this_process_cpu_set():
    assert idlecpus.affinity() == len(os.sched_getaffinity(0))
    assert 1 <= idlecpus.idle_cpus() <= idlecpus.affinity()
