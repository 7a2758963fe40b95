"""Issue 37, "capture has priority over everything the daemon does": while csplice writes a core into the spool
(a `.tmp.<id>.core` that still grows), the daemon's compression, analyses and scrub pause between chunks and
go on once the capture ends. The real daemon, a record committed by the real csplice, a capture file kept
growing as csplice's would be; what is asserted is the daemon's state, not its timing."""

from __future__ import annotations

import os
import resource
import threading
import time

import pytest

from corehandler import capture, idlecpus
from corehandler.daemon import Settings
from corehandler.store import scrub
from corehandler.store.index import Store
from support.daemon_harness import Running, wait_for
from support.spoolfeed import feed, write_settings


class Capture:
    """A capture in progress, as csplice leaves it in the spool: a .tmp core written to every 0.1 s."""

    def __init__(self, spool_dir):
        self.path = spool_dir / ".tmp.1796000000000000-0123456789abcdef-777.core"
        self.path.write_bytes(b"\x7fELF")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._grow, daemon=True)
        self._thread.start()

    def _grow(self):
        while not self._stop.wait(0.1):
            with open(self.path, "ab") as f:
                f.write(b"x" * 4096)

    def end(self):
        self._stop.set()
        self._thread.join()
        self.path.unlink()


def status_of(state, dump_id):
    with Store(state, readonly=True) as store:
        return store.get(dump_id).status


@pytest.fixture
def state(tmp_path):
    state_dir = tmp_path / "state"
    (state_dir / "spool").mkdir(parents=True, mode=0o700)
    return state_dir


def test_compression_and_analysis_pause_while_csplice_captures(tmp_path, state, feeder, csplice):
    spool_dir = state / "spool"
    record = feed(feeder, csplice, write_settings(tmp_path / "s.conf", spool_dir), size=24 << 20, pid=501)
    dump_id = record["id"]
    running = Capture(spool_dir)
    try:
        with Running(Settings(state, threads=1, sweep_interval=3600)) as d:
            wait_for(lambda: d.capture.waiting.get("compress"), what="compression paused")
            wait_for(lambda: d.capture.waiting.get("analysis"), what="the analysis waiting to start")
            partial = state / "store" / f".tmp.{dump_id}.zst"
            size = partial.stat().st_size
            time.sleep(0.3)  # a paused compression writes nothing
            assert partial.stat().st_size == size and not (state / "store" / f"{dump_id}.zst").exists()
            assert status_of(state, dump_id) == "compressing"  # listed at once: only storing waits
            running.end()
            wait_for(lambda: status_of(state, dump_id) == "ok", what="stored once it ended")
            assert d.capture.waiting == {} and d.capture.pauses >= 2
    finally:
        if running.path.exists():
            running.end()
    assert os.listdir(spool_dir) in ([], [".rate"])


def test_the_scrub_pauses_while_csplice_captures_and_a_stalled_capture_holds_nothing(tmp_path, state):
    spool_dir = state / "spool"
    stop = threading.Event()
    pace = scrub.Pace(1 << 40, stop, capture.Yield(spool_dir, stop))
    running = Capture(spool_dir)
    reader = threading.Thread(target=pace, args=(1 << 20,))
    reader.start()
    try:
        wait_for(lambda: pace.yield_to.waiting == {"scrub": 1}, what="the scrub paused")
        assert reader.is_alive()
    finally:
        running.end()
    reader.join(10)
    assert not reader.is_alive() and pace.yield_to.waiting == {}
    # A .tmp core that stopped growing (a capture stalled on its reader, an orphan) is not a capture running.
    stale = spool_dir / ".tmp.1796000000000000-0123456789abcdef-778.core"
    stale.write_bytes(b"\x7fELF")
    old = time.time() - capture.ACTIVE_SEC - 1
    os.utime(stale, (old, old))
    assert not capture.capturing(spool_dir)
    pace(1 << 20)
    assert pace.yield_to.pauses == 1


def test_a_bounded_wait_returns_at_its_bound_and_waits_again_where_the_longest_wait_gives_up_until_idle(
        state, monkeypatch):
    """A part on the wire waits at most its bound per ask and asks again (fleet/transfer.py); only a wait of
    MAX_WAIT_SEC marks a storm, after which the work goes on beside the captures until the spool is seen idle."""
    spool_dir = state / "spool"
    monkeypatch.setattr(capture, "MAX_WAIT_SEC", 0.4)
    waits = capture.Yield(spool_dir)
    running = Capture(spool_dir)
    try:
        for pauses in (1, 2):
            t0 = time.monotonic()
            waits("upload", 0.15)
            assert waits.pauses == pauses and time.monotonic() - t0 < capture.MAX_WAIT_SEC
        waits("compression")  # the longest wait: tired afterwards
        assert waits.pauses == 3
        waits("upload", 0.15)
        assert waits.pauses == 3  # beside the captures now
    finally:
        running.end()
    time.sleep(capture.LOOK_SEC * 2)
    waits("compression")  # the spool seen idle: the next capture is waited for again
    running = Capture(spool_dir)
    try:
        time.sleep(capture.LOOK_SEC * 2)
        waits("upload", 0.15)
        assert waits.pauses == 4
    finally:
        running.end()


@pytest.mark.root
def test_while_a_capture_is_waited_for_every_thread_of_the_daemon_runs_sched_idle_and_then_goes_back(state):
    """Issue 37: what was handed on before a pause (zstd's workers, the hashing thread, a part on the wire) runs
    only on a CPU the capture leaves idle. Every thread, those started during the wait too, goes back to
    SCHED_OTHER at its niceness when the last wait ends; a thread that was SCHED_IDLE of its own stays so."""
    spool_dir = state / "spool"
    assert idlecpus.may_leave_idle(), "this test needs CAP_SYS_NICE or RLIMIT_NICE (run as root)"
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    stop, seen = threading.Event(), {}

    def worker(name, policy=None):
        if policy is not None:
            os.sched_setscheduler(0, policy, os.sched_param(0))
        seen[name] = threading.get_native_id()
        stop.wait()

    busy = threading.Thread(target=worker, args=("busy",))
    own = threading.Thread(target=worker, args=("own", os.SCHED_IDLE))
    busy.start(), own.start()
    wait_for(lambda: len(seen) == 2, what="the threads started")
    compression, upload = capture.Yield(spool_dir), capture.Yield(spool_dir)
    running = Capture(spool_dir)
    waiters = [threading.Thread(target=compression, args=("compression",)),
               threading.Thread(target=upload, args=("upload", 1.0))]
    try:
        for w in waiters:
            w.start()
        wait_for(lambda: compression.waiting and upload.waiting, what="both paused")
        later = threading.Thread(target=worker, args=("later",))
        later.start()
        wait_for(lambda: "later" in seen, what="a thread started during the wait")
        assert {os.sched_getscheduler(seen[n]) for n in ("busy", "own", "later")} == {os.SCHED_IDLE}
        assert os.sched_getscheduler(0) == os.SCHED_IDLE
        waiters[1].join(5)  # the upload's bounded wait ended: the compression still waits, so all stay idle
        assert not waiters[1].is_alive() and os.sched_getscheduler(seen["busy"]) == os.SCHED_IDLE
    finally:
        running.end()
        for w in waiters:
            w.join(10)
    try:
        for name in ("busy", "later"):
            assert os.sched_getscheduler(seen[name]) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, seen[name]) == nice
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
        assert os.sched_getscheduler(seen["own"]) == os.SCHED_IDLE
    finally:
        stop.set()
        for t in (busy, own, later):
            t.join()


@pytest.mark.root
def test_a_daemon_that_could_not_leave_sched_idle_never_enters_it(tmp_path, monkeypatch):
    """Without CAP_SYS_NICE, RLIMIT_NICE must reach the thread's niceness (corehandler.service: LimitNICE=+5);
    a daemon short of both waits at the priority it has."""
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    may_leave_idle = idlecpus.may_leave_idle
    soft, hard = resource.getrlimit(resource.RLIMIT_NICE)
    try:
        resource.setrlimit(resource.RLIMIT_NICE, (0, hard))  # lowering needs nothing; raising it back, the hard
        assert not may_leave_idle(status)
        monkeypatch.setattr(idlecpus, "may_leave_idle", lambda: may_leave_idle(status))
        with idlecpus.StepAside() as aside:
            assert not aside.allowed and os.sched_getscheduler(0) == os.SCHED_OTHER
        status.write_text(f"Name:\tx\nCapEff:\t{1 << idlecpus.CAP_SYS_NICE:016x}\n")
        assert may_leave_idle(status)
    finally:
        resource.setrlimit(resource.RLIMIT_NICE, (soft, hard))


@pytest.mark.parametrize("nice_limit, nice, cap_eff, leaves", [
    (0, 5, 0, False), (15, 5, 0, True), (14, 5, 0, False), (15, 0, 0, False), (20, 0, 0, True),
    (resource.RLIM_INFINITY, 0, 0, True), (0, 5, 1 << 23, True), (0, 5, (1 << 23) - 1, False),
])
def test_leaving_sched_idle_follows_the_kernels_rule(nice_limit, nice, cap_eff, leaves):
    assert idlecpus.leaves_idle(nice_limit, nice, cap_eff) is leaves
