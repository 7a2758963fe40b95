"""Faults: the daemon SIGKILLed at every step of ingest and at random times, SIGTERM, a full disk.
After a restart every dump is in the index exactly once, its stored file decompresses to the captured bytes,
and nothing is left in the spool."""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corehandler.daemon import Settings
from corehandler.ingest import PAUSE_POINTS
from corehandler.store import compress
from corehandler.store.index import Store
from corehandler.testpause import INGEST_ENV
from support.daemon_harness import Recorder, Running, wait_for
from support.spoolfeed import fed_state, feed, write_settings

RUNDAEMON = Path(__file__).parent.parent / "support" / "rundaemon.py"
_pending: dict[int, bytes] = {}  # output read past the last line wait_line returned, by fd


def start(state_dir: Path, *args: str, pause: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    if pause:
        env[INGEST_ENV] = pause
    proc = subprocess.Popen([sys.executable, str(RUNDAEMON), str(state_dir), "--threads", "1", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for stream in (proc.stdout, proc.stderr):  # fd numbers are reused: forget an earlier process's output
        _pending.pop(stream.fileno(), None)
    return proc


def wait_line(stream, needle: str, timeout: float = 30.0) -> list[str]:
    """Reads the stream's lines until one holds needle. Reads the fd directly: a buffered readline after
    select() would hide lines that arrived together."""
    fd, seen = stream.fileno(), []
    deadline = time.monotonic() + timeout
    while True:
        buf = _pending.get(fd, b"")
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            _pending[fd] = buf
            seen.append(line.decode(errors="replace"))
            if needle in seen[-1]:
                return seen
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise AssertionError(f"no line with {needle!r} in {seen}")
        data = os.read(fd, 65536)
        if not data:
            raise AssertionError(f"end of output before a line with {needle!r}: {seen}")
        _pending[fd] = buf + data


def sha_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def announced(proc: subprocess.Popen) -> list[tuple[str, str]]:
    """(event, id) of the on_ingested and on_stored events an exited rundaemon printed, in order."""
    out = _pending.pop(proc.stdout.fileno(), b"") + proc.stdout.read()
    return [(e["event"], e["stored"]["id"]) for e in map(json.loads, out.splitlines())
            if e["event"] in ("ingested", "stored")]


def ingested_events(proc: subprocess.Popen) -> set[str]:
    """Ids of the on_ingested events an exited rundaemon printed."""
    return {dump_id for event, dump_id in announced(proc) if event == "ingested"}


def run_to_completion(state_dir: Path, n: int, events: list | None = None) -> set[str]:
    """A fresh daemon finishes the work; then it is stopped with SIGTERM (which must exit 0). Returns the ids
    it reported ingested (and adds every (event, id) it announced to events)."""
    proc = start(state_dir)
    try:
        wait_line(proc.stderr, "Watching")  # SIGTERM before the handlers are set would just kill it
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pending = [x for x in os.listdir(state_dir / "spool") if x != ".rate"]
            if not pending and (state_dir / "index.sqlite").exists():
                with Store(state_dir) as s:
                    if s.totals()[1] >= n and not s.compressing():
                        break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        said = announced(proc)
        if events is not None:
            events += said
        return {dump_id for event, dump_id in said if event == "ingested"}
    finally:
        proc.kill()
        proc.wait()


def check_invariants(state_dir: Path, expected: dict[str, str]) -> None:
    """expected: id -> sha256 of the captured core."""
    assert [x for x in os.listdir(state_dir / "spool") if x != ".rate"] == []
    with Store(state_dir) as s:
        rows = s.all(include_deleting=True)
    assert sorted(r.id for r in rows) == sorted(expected)  # each exactly once: id is the primary key
    assert sorted(os.listdir(state_dir / "store")) == sorted([r.path for r in rows] +
                                                             [r.mini_path for r in rows if r.mini_path])
    for r in rows:
        assert r.status == "ok" and r.sha256 == expected[r.id]
        compress.verify(state_dir / "store" / r.path, r.raw_bytes, r.sha256)


def new_spool(tmp_path, feeder, csplice):
    """A fresh state dir; returns it, the id -> sha256 of what was fed, and add(pid, size) to feed more."""
    state_dir = tmp_path / "state"
    spool_dir = state_dir / "spool"
    spool_dir.mkdir(parents=True, mode=0o700)
    settings = write_settings(tmp_path / "s.conf", spool_dir)
    expected = {}

    def add(pid: int, size: int) -> None:
        r = feed(feeder, csplice, settings, size=size, pid=pid)
        expected[r["id"]] = sha_of(spool_dir / r["core"])

    return state_dir, expected, add


@pytest.fixture
def fed(tmp_path, feeder, csplice):
    """Three committed records of 2 MiB in a fresh state dir; returns (state_dir, id -> sha256)."""
    state_dir, expected, add = new_spool(tmp_path, feeder, csplice)
    for pid in (11, 12, 13):
        add(pid, 2 << 20)
    return state_dir, expected


# A kill between an announcement and the commit it reports is the one that repeats it: the restarted daemon
# redoes the stage and announces it again. A kill anywhere else, compression included, repeats nothing.
REPEATED = {"ingested_announced": "ingested", "stored_announced": "stored"}


@pytest.mark.parametrize("point", PAUSE_POINTS)
def test_sigkill_at_each_ingest_step_loses_nothing(fed, point):
    state_dir, expected = fed
    proc = start(state_dir, pause=point)
    try:
        wait_line(proc.stderr, f"Pausing at {point}")
        proc.kill()
        proc.wait()
    finally:
        proc.kill()
    first = announced(proc)
    interrupted = first[-1][1] if first else None
    second = []
    run_to_completion(state_dir, len(expected), second)
    check_invariants(state_dir, expected)
    # Observers heard of every dump, the interrupted one included: listed, then stored, each once but for
    # the event a kill came between announcing and committing, which the second daemon announces again.
    events = first + second
    for dump_id in expected:
        want = ["ingested", "stored"]
        if point in REPEATED and dump_id == interrupted:
            want.insert(want.index(REPEATED[point]), REPEATED[point])
            assert (REPEATED[point], dump_id) in second
        assert [e for e, i in events if i == dump_id] == want, (dump_id, events)


def cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "corehandler", "--config-dir", str(state_dir / "etc"),
                           "--state-dir", str(state_dir), *args], capture_output=True, text=True)


def test_a_dump_is_listed_while_its_core_is_compressed_and_analysed(fed):
    """Stopped between the two stages (listed, not stored): list and info show the dump `compressing`, its
    analysis pending (it runs off the ingest thread) and no stored file; dump and debug say it is not ready
    (exit 5) and write nothing, rather than hand out an older dump or a core not yet verified. A kill there
    still ends in exactly one complete dump."""
    state_dir, expected = fed
    proc = start(state_dir, pause="visible")
    try:
        wait_line(proc.stderr, "Pausing at visible")
        listed = json.loads(cli(state_dir, "list", "--json").stdout)
        assert len(listed) == 1
        dump_id = listed[0]["id"]
        assert (listed[0]["status"], listed[0]["corefile"], listed[0]["path"]) == ("compressing", "compressing", None)
        assert listed[0]["raw_bytes"] == 2 << 20
        info = cli(state_dir, "info", dump_id)
        assert info.returncode == 0, info.stderr
        assert "Status: compressing" in info.stdout and "Storage: being compressed (2M)" in info.stdout
        assert "Analysis:" in info.stdout
        info_json = json.loads(cli(state_dir, "info", "--json", dump_id).stdout)[0]
        assert info_json["analysis"]["state"] == "pending"
        out = state_dir.parent / "out.core"
        for verb in (["dump", "-o", str(out)], ["debug", "--debugger", "true"]):
            refused = cli(state_dir, *verb, dump_id)
            assert refused.returncode == 5 and "still being compressed" in refused.stderr, refused
        assert not out.exists()
        proc.kill()
        proc.wait()
    finally:
        proc.kill()
    run_to_completion(state_dir, len(expected))
    check_invariants(state_dir, expected)


def test_sigkill_at_random_times_loses_nothing(tmp_path, feeder, csplice):
    state_dir, expected, add = new_spool(tmp_path, feeder, csplice)
    rng = random.Random(1234)
    mid_compression = 0
    for round_ in range(6):
        for pid in range(2):
            add(100 * round_ + pid + 1, 4 << 20)
        proc = start(state_dir, "--level", "15")  # ~0.5 s per dump: most kills land mid-compression
        wait_line(proc.stderr, "Watching")  # start-up time varies with the machine's load; ingest follows
        time.sleep(rng.uniform(0.0, 0.8))
        proc.kill()
        proc.wait()
        store_dir = state_dir / "store"
        if store_dir.exists() and any(n.startswith(".tmp.") for n in os.listdir(store_dir)):
            mid_compression += 1
    assert mid_compression >= 1  # the test did what it says
    run_to_completion(state_dir, len(expected))
    check_invariants(state_dir, expected)


def test_sigterm_stops_cleanly(fed):
    state_dir, expected = fed
    proc = start(state_dir)
    wait_line(proc.stderr, "Watching")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    wait_line(proc.stderr, "Stopping")
    run_to_completion(state_dir, len(expected))
    check_invariants(state_dir, expected)


@pytest.mark.root
def test_disk_full_keeps_the_raw_dump_and_retries(tmp_path, feeder, csplice):
    """The state dir on a 16 MiB tmpfs; a 10 MiB core of random bytes cannot be stored beside itself."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mnt)], check=True)
    proc = None
    try:
        spool_dir = mnt / "state" / "spool"
        spool_dir.mkdir(parents=True, mode=0o700)
        settings = write_settings(tmp_path / "s.conf", spool_dir)
        r = feed(feeder, csplice, settings, size=10 << 20, pid=77)
        core = spool_dir / r["core"]
        with open(core, "r+b") as f:  # keep the ELF headers, make the memory incompressible
            f.seek(8192)
            f.write(random.Random(7).randbytes((10 << 20) - 8192))
        raw_sha = sha_of(core)
        proc = start(mnt / "state", "--retry", "0.5", "--sweep", "0.5")
        lines = wait_line(proc.stdout, '"kind": "disk_full"')
        error = json.loads(lines[-1])
        assert error["id"] == r["id"] and "no space left" in error["message"]
        assert sha_of(core) == raw_sha  # the raw dump is kept
        assert [n for n in os.listdir(mnt / "state" / "store")] == []  # no half-written file
        with Store(mnt / "state") as s:  # listed meanwhile, its core waiting for room
            assert s.get(r["id"]).status == "compressing"
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        wait_line(proc.stdout, '"event": "stored"')
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        check_invariants(mnt / "state", {r["id"]: raw_sha})
    finally:
        if proc:
            proc.kill()
            proc.wait()
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_record_that_kills_ingest_every_time_is_given_up(tmp_path, feeder, csplice):
    """Each start dies on the same record (SIGKILL mid-compression, as a parser crash or the OOM killer would
    end it). The count of attempts outlives the daemon: after twice the limit in deaths the record is stored
    without analysis, and when that dies too it is indexed as invalid without its core. Never a record retried
    forever."""
    state_dir, expected, add = new_spool(tmp_path, feeder, csplice)
    add(21, 2 << 20)
    [dump_id] = expected
    for _ in range(3):  # two normal attempts, then the one given up that still stores the core
        proc = start(state_dir, "--attempts", "1", pause="compressing")
        try:
            wait_line(proc.stderr, "Pausing at compressing")
        finally:
            proc.kill()
            proc.wait()
    proc = start(state_dir, "--attempts", "1", pause="compressing")
    try:
        lines = wait_line(proc.stdout, '"event": "stored"')
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert any('"kind": "ingest"' in line and "given up" in line for line in lines)
    assert [x for x in os.listdir(state_dir / "spool") if x != ".rate"] == []
    with Store(state_dir) as s:
        dump = s.get(dump_id)
        assert s.db.execute("SELECT COUNT(*) FROM ingest_attempts").fetchone()[0] == 0
    assert (dump.status, dump.path) == ("invalid", None)
    assert dump.problem == ("the daemon died 3 times while ingesting it, given up; core not kept: storing it "
                            "failed as well")


def test_a_record_whose_ingest_keeps_failing_is_given_up_not_retried_forever(tmp_path, monkeypatch):
    """Storing fails every time (an I/O error, not a full disk): two normal attempts, one given up that still
    tries to store the core, then the record is indexed as invalid without it; the spool is free again."""
    state, _ = fed_state(tmp_path, (31,), "failing")
    [dump_id] = [n[:-5] for n in os.listdir(state / "spool") if n.endswith(".json")]

    def broken(*args, **kwargs):
        raise compress.CompressError("cannot store: [Errno 5] Input/output error")

    monkeypatch.setattr(compress, "store_file", broken)
    rec = Recorder()
    with Running(Settings(state, threads=1, sweep_interval=0.05, retry_interval=0.0, ingest_attempts=2), [rec]):
        wait_for(lambda: rec.of("stored"), what="the record's row final")
    with Store(state) as s:
        dump = s.get(dump_id)
    assert (dump.status, dump.path) == ("invalid", None)
    assert dump.problem == ("ingest failed 3 times, given up (last: cannot store: [Errno 5] Input/output error); "
                            "core not kept: storing it failed as well")
    assert [e[1] for e in rec.of("error")] == ["compress", "compress", "ingest", "compress", "ingest"]
    assert [x for x in os.listdir(state / "spool") if x != ".rate"] == []
