"""The analysis workers (corehandler/analysisqueue.py) with real threads and jobs that wait on events: one
running job per uid, the uids served round-robin, and the per-uid budget of analysis seconds."""

from __future__ import annotations

import threading

from corehandler import analysisqueue
from support.waiting import wait_for


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def job(key, uid, gate=None, log=None, spend=0.0, clock=None):
    def work(j):
        if log is not None:
            log.append(key)
        if gate is not None:
            gate.wait(10)
        if clock is not None:
            clock.now += spend
        return f"done {key}"
    return analysisqueue.Job(key, uid, "analysis", work, lambda reason: f"skipped {key}: {reason}")


def finished(workers, into):
    into.update({j.key: j.outcome for j in workers.finished()})
    return into


def test_one_users_slow_job_does_not_hold_another_uids():
    gate, log, done = threading.Event(), [], {}
    w = analysisqueue.Workers(lambda: None, workers=2)
    try:
        w.submit(job("slow", 1000, gate, log))
        w.submit(job("slow2", 1000, gate, log))  # the same uid: waits for its first, not on the second worker
        w.submit(job("root", 0, log=log))
        wait_for(lambda: finished(w, done).get("root") == "done root", what="root's job")
        assert sorted(log) == ["root", "slow"] and "slow" not in done
        gate.set()
        wait_for(lambda: len(finished(w, done)) == 3, what="every job")
        assert log[2:] == ["slow2"]
    finally:
        gate.set()
        w.stop()


def test_uids_are_served_in_turn():
    gate, log, done = threading.Event(), [], {}
    w = analysisqueue.Workers(lambda: None, workers=1)
    try:
        w.submit(job("hold", 5, gate, log))
        wait_for(lambda: log == ["hold"], what="the first job running")
        for key, uid in (("a1", 1), ("a2", 1), ("a3", 1), ("b1", 2), ("c1", 3), ("b2", 2)):
            w.submit(job(key, uid, log=log))
        gate.set()
        wait_for(lambda: len(finished(w, done)) == 7, what="every job")
        assert log == ["hold", "a1", "b1", "c1", "a2", "b2", "a3"]
    finally:
        w.stop()


def test_a_uid_past_its_budget_is_skipped_saying_why_and_others_are_not():
    clock, done = Clock(), {}
    w = analysisqueue.Workers(lambda: None, workers=1, budget=30, window=600, clock=clock)
    try:
        w.submit(job("long", 1000, spend=31, clock=clock))
        wait_for(lambda: len(finished(w, done)) == 1, what="the long job")
        assert w.spent(1000) == 31 and w.spent(0) == 0
        w.submit(job("next", 1000))
        w.submit(job("root", 0))
        wait_for(lambda: len(finished(w, done)) == 3, what="the others")
        assert done["next"].startswith("skipped next: analysis skipped: uid budget (uid 1000 used 31 s of "
                                       "analysis in the last 600 s")
        assert done["root"] == "done root"
        clock.now += 601  # the window passed: the uid's seconds are its own again
        w.submit(job("later", 1000))
        wait_for(lambda: len(finished(w, done)) == 4, what="the later job")
        assert done["later"] == "done later"
    finally:
        w.stop()


def test_a_job_that_raises_ends_with_its_skip_outcome():
    def work(j):
        raise RecursionError("deep")
    done = {}
    w = analysisqueue.Workers(lambda: None, workers=1)
    try:
        w.submit(analysisqueue.Job("bad", 1, "analysis", work, lambda reason: reason))
        wait_for(lambda: finished(w, done), what="the job")
        assert done["bad"] == "analysis failed: RecursionError: deep"
    finally:
        w.stop()
