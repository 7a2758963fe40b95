"""The analysis workers: a dump's unwinding, symbols and mini core run here, in threads off the daemon's, so one
slow dump (a 4000-thread process unwinding to its timeout) cannot hold the ingest of the others
(docs/design.md, "Analysis off the ingest thread; capture first").

- A queue per uid, served round-robin, and at most one running job per uid: with two workers, one user's slow
  crashes hold one worker at most, and another uid's (root's) next dump starts on the other.
- A budget per uid: the analysis seconds a uid's jobs took in the last `window` seconds. A job whose uid has
  spent `budget` is not run: its skip outcome, saying why ("analysis skipped: uid budget"), stands for it.
  Checked when the job's turn comes, so a burst queued before the budget ran out is skipped at once.
- While a capture runs (capture.py) no job starts: the capture has the CPUs and the disk.

Jobs and their outcomes go back to the daemon's thread (finished(), after wake()): the index is written there
only. Workers never raise: a job whose work raises ends with the outcome its skip gives for the error.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corehandler import steps

log = logging.getLogger(__name__)

BUDGET_SKIP = "analysis skipped: uid budget"


@dataclass(eq=False)
class Job:
    """One job of a dump's analysis (`what` it is). work(job) runs in a worker and returns the outcome;
    skip(reason) gives the outcome of a job that is not run (or whose work raised). The work may set
    `interrupt`, which stop() calls to end it early."""
    key: str
    uid: int | None
    what: str
    work: Callable[["Job"], Any]
    skip: Callable[[str], Any]
    outcome: Any = None
    seconds: float = 0.0
    interrupt: Callable[[], None] | None = None


class Workers:
    def __init__(self, wake: Callable[[], None], *, workers: int = 2, budget: float = 0.0, window: float = 600.0,
                 yield_to: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic):
        """wake: tells the daemon's loop a job finished. budget: analysis seconds per uid per window, 0 = no cap.
        yield_to: returns once no capture runs (capture.py)."""
        self._wake = wake
        self.budget, self.window = budget, window
        self._yield_to = yield_to
        self._clock = clock
        self._lock = threading.Condition()
        self._queues: collections.OrderedDict[int | None, collections.deque[Job]] = collections.OrderedDict()
        self._running: dict[int | None, Job] = {}
        self._spent: dict[int | None, collections.deque[tuple[float, float]]] = {}  # uid: (ended, seconds)
        self._done: list[Job] = []
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, name=f"analysis-{n}", daemon=True)
                         for n in range(max(1, workers))]
        for t in self._threads:
            t.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            self._queues.setdefault(job.uid, collections.deque()).append(job)
            self._lock.notify()

    def finished(self) -> list[Job]:
        """The jobs that ended since the last call, with their outcomes."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def spent(self, uid: int | None) -> float:
        """Analysis seconds uid's jobs took in the window."""
        with self._lock:
            return self._spent_locked(uid)

    def stop(self) -> None:
        """Ends the running jobs (interrupt) and the threads; queued jobs are dropped (ingest redoes them at the
        next start, from the index)."""
        with self._lock:
            self._stopping = True
            running = list(self._running.values())
            self._lock.notify_all()
        for job in running:
            if job.interrupt is not None:
                job.interrupt()
        for t in self._threads:
            t.join(timeout=10)

    # -- the workers ------------------------------------------------------------------------------------------

    def _spent_locked(self, uid: int | None) -> float:
        spent = self._spent.get(uid)
        if not spent:
            return 0.0
        horizon = self._clock() - self.window
        while spent and spent[0][0] < horizon:
            spent.popleft()
        return sum(seconds for _, seconds in spent)

    def _take(self) -> Job | None:
        """The next job, round-robin over the uids that have none running; None when stopping."""
        with self._lock:
            while not self._stopping:
                for uid in list(self._queues):
                    if uid in self._running:
                        continue
                    queue = self._queues.pop(uid)  # served: to the end of the round
                    job = queue.popleft()
                    if queue:
                        self._queues[uid] = queue
                    self._running[uid] = job
                    return job
                self._lock.wait()
            return None

    def _run(self) -> None:
        while (job := self._take()) is not None:
            try:
                self._do(job)
            finally:
                with self._lock:
                    del self._running[job.uid]
                    if not self._stopping:
                        self._done.append(job)
                    self._lock.notify_all()
                self._wake()

    def _do(self, job: Job) -> None:
        with self._lock:
            spent = self._spent_locked(job.uid) if self.budget > 0 else 0.0
        if self.budget > 0 and spent >= self.budget:
            log.info("%s of %s skipped: uid %s used %.1f s of analysis in the last %g s", job.what, job.key,
                     job.uid, spent, self.window)
            job.outcome = job.skip(f"{BUDGET_SKIP} (uid {job.uid} used {spent:.0f} s of analysis in the last "
                                   f"{self.window:g} s; the dump is stored without it)")
            return
        if self._yield_to is not None:
            self._yield_to()
        if self._stopping:  # stop() came during the wait: the job is redone at the next start
            return
        started = self._clock()
        problems: list[str] = []
        job.outcome = steps.run("analysis", problems, job.work, job)
        job.seconds = self._clock() - started
        if problems:
            job.outcome = job.skip(problems[0])
        with self._lock:
            self._spent.setdefault(job.uid, collections.deque()).append((self._clock(), job.seconds))
