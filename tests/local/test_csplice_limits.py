"""Limits: size limit, free-space floor, full disk, crash storms, concurrency, the timeout. Whatever stops the
capture, the writer is released (the rest is drained), csplice exits 0 and a record is committed."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from corehandler import paths, spool
from corehandler.csplice_contract import STRATEGIES
from corehandler.observe.metrics import MetricsObserver
from support.csplice_harness import Handler, MiB, core_args, expected_digest, hash_file, make_fake_proc, spool_files


@pytest.fixture
def handler(tmp_path):
    return Handler(tmp_path / "h")


@pytest.mark.parametrize("mode", ("write", "vmsplice"))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_oversize_dump_is_truncated_and_drained(handler, strategy, mode):
    handler.configure(strategy=strategy, max_dump_size=3 * MiB + 5)
    result = handler.feed(16 * MiB, mode=mode)
    # The feeder's whole push went through: the "kernel" was never left blocked or failed.
    assert result.feeder["push_error"] == 0 and result.returncode == 0, result.stderr
    cap = result.capture
    assert cap["truncated"] and cap["truncated_reason"] == "max_dump_size" and not cap["complete"]
    assert cap["bytes"] == 3 * MiB + 5
    assert cap["bytes"] + cap["drained_bytes"] == 16 * MiB
    assert result.core.stat().st_size == 3 * MiB + 5
    assert hash_file(result.core) == expected_digest(16 * MiB, False, result.record["pid"], limit=3 * MiB + 5)
    assert any("truncated" in e and "max_dump_size" in e for e in result.record["errors"])


def test_dump_of_exactly_the_limit_is_complete(handler):
    handler.configure(max_dump_size=MiB)
    cap = handler.feed(MiB).capture
    assert cap["complete"] and not cap["truncated"] and cap["bytes"] == MiB


def test_max_pending_keeps_metadata_only(handler):
    handler.configure(max_pending=2)
    for _ in range(2):
        assert handler.feed(4096).capture["complete"]
    result = handler.feed(2 * MiB)
    assert result.returncode == 0
    cap = result.capture
    assert cap["dropped"] and cap["dropped_reason"] == "max_pending" and result.record["core"] is None
    assert cap["bytes"] == 0 and cap["drained_bytes"] == 2 * MiB
    # Metadata is what such a record is for.
    assert result.record["proc"]["available"] and result.record["pid"] == os.getpid()
    assert len(list(handler.spool.glob("*.core"))) == 2


def test_max_per_exe_per_minute_keeps_metadata_only(handler):
    handler.configure(max_per_exe_per_minute=3)
    outcomes = [handler.feed(8192).capture for _ in range(5)]
    assert [c["dropped_reason"] for c in outcomes] == [None, None, None, "max_per_exe_per_minute",
                                                       "max_per_exe_per_minute"]
    assert all(c["drained_bytes"] == 8192 for c in outcomes[3:])
    # The counter is per executable: another exe still gets its dumps kept.
    other = subprocess.Popen(["sleep", "60"])
    try:
        assert handler.feed(8192, pid=other.pid).capture["complete"]
    finally:
        other.kill()
        other.wait()


def test_one_users_crash_storm_spends_only_their_own_budget(handler):
    """The crash-storm limit counts per (uid, exe): sixteen crashes of one executable by uid 1000 leave root's
    next crash of it its core (v0.2 made it metadata-only); the user's seventeenth is theirs to lose."""
    handler.configure(max_per_exe_per_minute=16)
    pid = os.getpid()
    theirs = [handler.feed(4096, args=core_args(pid, uid=1000)).capture for _ in range(17)]
    assert [c["dropped_reason"] for c in theirs] == [None] * 16 + ["max_per_exe_per_minute"]
    root = handler.feed(4096, args=core_args(pid, uid=0))
    assert root.capture["complete"] and root.record["uid"] == 0


def _no_core(args: list) -> list:
    """The kernel's argv for a process with `ulimit -c 0` (%c is 0)."""
    return args[:8] + [b"0"] + args[9:]


def test_a_storm_of_coreless_crashes_fills_only_its_users_share_and_never_takes_roots_core(handler):
    """Issue 34: `ulimit -c 0` crashes went past max_pending (v0.4 wrote 658 records into a spool limited to 64)
    and made root's next crash metadata-only. Now each is a record against its user's budget: a core while the
    user holds fewer than max_pending_per_uid pending records, a record without one up to twice that, then
    nothing but a count; root's room is its own."""
    handler.configure(max_pending=8, max_pending_per_uid=2)
    pid = os.getpid()
    storm = [handler.feed(4096, args=_no_core(core_args(pid, uid=1000))) for _ in range(12)]
    kept = [r for r in storm if r.record]
    assert len(kept) == 4 and all(r.capture["dropped_reason"] == "rlimit_core" for r in kept)
    assert all(r.record is None and r.returncode == 75 for r in storm[4:])
    assert spool.shed_counts(handler.spool) == {1000: 8}
    # Another user's budget is theirs: their first crashes keep their cores, up to their share.
    other = [handler.feed(4096, args=core_args(pid, uid=1001)).capture for _ in range(3)]
    assert [c["dropped_reason"] for c in other] == [None, None, "max_pending_per_uid"]
    root = handler.feed(4096, args=core_args(pid, uid=0))
    assert root.capture["complete"] and root.record["uid"] == 0


def test_many_users_storming_together_stop_at_max_pending_and_root_keeps_its_core(handler):
    """A user with a range of subordinate uids crashes as each of them: the users but root together get
    max_pending records with a core and as many without; past that they are shed, and root's core is kept."""
    handler.configure(max_pending=4, max_pending_per_uid=2)
    pid = os.getpid()
    results = [handler.feed(4096, args=core_args(pid, uid=100000 + n)) for n in range(12)]
    assert [r.capture["dropped_reason"] for r in results[:8]] == [None] * 4 + ["max_pending"] * 4
    assert all(r.record is None for r in results[8:])
    assert spool.shed_counts(handler.spool) == {100000 + n: 1 for n in range(8, 12)}
    assert handler.feed(4096, args=core_args(pid, uid=0)).capture["complete"]
    # The daemon's metrics: the total, and the users who shed the most by uid (a bounded set of labels).
    for _ in range(2):
        handler.feed(4096, args=core_args(pid, uid=100011))
    text = MetricsObserver(capture_probe=lambda: {"mode": "pipe", "shed": spool.shed_counts(handler.spool)}
                           ).exposition().decode()
    assert "corehandler_crashes_shed_total 6.0" in text
    assert 'corehandler_crashes_shed_by_uid_total{uid="100011"} 3.0' in text
    assert 'corehandler_crashes_shed_by_uid_total{uid="100008"} 1.0' in text


def test_the_shed_table_is_bounded(handler):
    """The per-uid count holds 64 lines whatever the number of users: those past it share uid -1's."""
    handler.configure(max_per_exe_per_minute=1)
    handler.spool.mkdir(mode=0o700)
    (handler.spool / ".shed").write_text("".join(f"{200000 + n} 1\n" for n in range(63)))
    for uid in (300000, 300001):
        for _ in range(3):
            handler.feed(4096, args=core_args(os.getpid(), uid=uid))
    counts = spool.shed_counts(handler.spool)
    assert len(counts) == 64 and counts[-1] == 2 and 300000 not in counts


def test_coreless_crashes_count_against_the_crash_rate(handler):
    """The rate limit counts every crash, `ulimit -c 0` ones included (v0.4 returned before counting them):
    past the limit a crash keeps no core, past twice the limit not even its record."""
    handler.configure(max_per_exe_per_minute=3)
    pid = os.getpid()
    coreless = [handler.feed(4096, args=_no_core(core_args(pid, uid=1000))) for _ in range(6)]
    assert all(r.capture["dropped_reason"] == "rlimit_core" for r in coreless)
    assert handler.feed(4096, args=core_args(pid, uid=1000)).record is None
    assert spool.shed_counts(handler.spool) == {1000: 1}
    # root's crash of the same executable is counted apart.
    assert handler.feed(4096, args=core_args(pid, uid=0)).capture["complete"]


@pytest.mark.parametrize("vm_kib, limit, expected", [
    (10 * 1024, None, 60 + 2),                     # a small process: a minute, not the hour of v0.2
    (1 << 20, None, 60 + 256),                     # 1 GiB of address space
    (1 << 40 >> 10, 8 << 20, 60 + 2),              # a huge mapping: only what the size limit lets it keep
    (1 << 40 >> 10, None, 3600),                   # up to the configured ceiling
    (None, None, 3600),                            # size unknown: the ceiling
])
def test_the_capture_timeout_scales_with_the_process(handler, tmp_path, vm_kib, limit, expected):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x")
    if vm_kib is not None:
        with open(proc_root / "4242" / "status", "a") as f:
            f.write(f"VmSize:\t{vm_kib} kB\nVmRSS:\t100 kB\n")
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    if limit:
        handler.configure(max_dump_size=limit)
    assert handler.feed(4096, pid=4242).record["capture"]["timeout_seconds"] == expected


def test_sixteen_concurrent_captures_all_commit(handler):
    handler.configure(strategy="rw2", max_pending=64, max_per_exe_per_minute=16)
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(16)]
    try:
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda p: handler.feed(4 * MiB + p.pid, pid=p.pid), sleepers))
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    records = handler.records()
    assert len(records) == 16
    assert len({r["id"] for r in records.values()}) == 16
    for result, proc in zip(results, sleepers):
        assert result.returncode == 0
        assert result.record["pid"] == proc.pid and result.capture["complete"]
        assert result.record["proc"]["exe"] == os.path.realpath(shutil.which("sleep"))
        assert hash_file(result.core) == expected_digest(4 * MiB + proc.pid, False, proc.pid)
    assert not [n for n in spool_files(handler.spool) if n.startswith(".tmp")]


def _csplice_on_open_pipe(handler):
    """csplice reading a pipe whose write end the test keeps open: the kernel's side of a dump that stalls."""
    r, w = os.pipe()
    proc = subprocess.Popen([str(paths.csplice_path()), *core_args(os.getpid())], stdin=r,
                            env=handler.environment(), stderr=subprocess.PIPE)
    os.close(r)
    return proc, w


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_stalled_writer_hits_the_timeout(handler, strategy):
    """A dump that stops arriving (the pipe stays open) ends at timeout with what arrived."""
    handler.configure(strategy=strategy, timeout=1)
    proc, w = _csplice_on_open_pipe(handler)
    os.write(w, b"\x7fELF" + b"x" * 100_000)
    try:
        t0 = time.monotonic()
        assert proc.wait(timeout=30) == 0
        elapsed = time.monotonic() - t0
    finally:
        os.close(w)
    assert elapsed < 10
    (record,) = handler.records().values()
    cap = record["capture"]
    assert cap["truncated"] and cap["truncated_reason"] == "timeout"
    assert cap["bytes"] == 100_004 and cap["elf_magic"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_timeout_before_the_first_byte_keeps_metadata_only(handler, strategy):
    """A capture that kept nothing is a metadata-only record with its reason, not an empty core file."""
    handler.configure(strategy=strategy, timeout=1)
    proc, w = _csplice_on_open_pipe(handler)
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        os.close(w)
    (record,) = handler.records().values()
    cap = record["capture"]
    assert record["core"] is None and (cap["dropped"], cap["dropped_reason"], cap["bytes"]) == (True, "timeout", 0)
    assert spool_files(handler.spool) == [f"{record['id']}.json"]


def _mount_tmpfs(where, size: str):
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True)


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt, "64m")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.mark.root
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_free_space_floor_truncates(small_fs, strategy):
    handler = Handler(small_fs / "h", settings={"strategy": strategy, "min_free": 16 * MiB})
    result = handler.feed(100 * MiB)
    assert result.returncode == 0 and result.feeder["push_error"] == 0
    cap = result.capture
    assert cap["truncated"] and cap["truncated_reason"] == "min_free"
    assert 0 < cap["bytes"] <= 48 * MiB and cap["bytes"] + cap["drained_bytes"] == 100 * MiB
    assert hash_file(result.core) == expected_digest(100 * MiB, False, result.record["pid"], limit=cap["bytes"])
    st = os.statvfs(small_fs)
    assert st.f_bavail * st.f_frsize >= 16 * MiB - 64 * 1024  # the floor held (the record is a few KiB)


@pytest.mark.root
def test_free_space_floor_already_crossed_keeps_metadata_only(small_fs):
    (small_fs / "filler").write_bytes(b"\1" * (56 * MiB))
    handler = Handler(small_fs / "h", settings={"min_free": 16 * MiB})
    result = handler.feed(8 * MiB)
    assert result.returncode == 0
    assert result.capture["dropped_reason"] == "min_free" and result.capture["drained_bytes"] == 8 * MiB


@pytest.mark.root
def test_floor_within_one_space_check_keeps_metadata_only(small_fs):
    """Free space above the floor, but by less than the capture's first check asks for: admission used to let
    the dump in and the capture then kept none of it, an empty core indexed as "truncated present 0B"."""
    (small_fs / "filler").write_bytes(b"\1" * (40 * MiB))
    handler = Handler(small_fs / "h", settings={"min_free": 16 * MiB})
    result = handler.feed(8 * MiB)
    assert result.returncode == 0, result.stderr
    cap = result.capture
    assert result.record["core"] is None and (cap["dropped_reason"], cap["drained_bytes"]) == ("min_free", 8 * MiB)
    assert [n for n in spool_files(handler.spool) if n.endswith(".core")] == []


@pytest.mark.root
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_full_disk_truncates_and_still_commits(tmp_path, strategy):
    """No floor configured, the filesystem fills up mid-dump: ENOSPC is recorded, the record still commits."""
    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt, "8m")
    try:
        handler = Handler(mnt / "h", settings={"strategy": strategy})
        result = handler.feed(32 * MiB)
        assert result.returncode == 0, result.stderr
        assert result.feeder["push_error"] == 0
        cap = result.capture
        assert cap["truncated"] and cap["truncated_reason"] == "write_error", cap
        assert cap["error"] == os.strerror(28)
        assert 0 < cap["bytes"] < 8 * MiB and cap["bytes"] + cap["drained_bytes"] == 32 * MiB
        assert result.core.stat().st_size == cap["bytes"]
        assert hash_file(result.core) == expected_digest(32 * MiB, False, result.record["pid"], limit=cap["bytes"])
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.mark.root
def test_full_disk_still_commits_a_record_of_hostile_bytes(tmp_path):
    """The record's room is taken before the dump fills the disk; a process whose command line is all invalid
    UTF-8 makes every byte a six-byte escape in the record, and that must still fit."""
    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt, "8m")
    try:
        cmdline = [b"\xff" * 1000] * 4  # just under procinfo.c's 4 KiB cap
        proc_root = make_fake_proc(tmp_path / "proc", 4242, b"hostile", cmdline, b"/usr/bin/hostile")
        handler = Handler(mnt / "h", env={"CSPLICE_PROC_ROOT": str(proc_root)})
        result = handler.feed(32 * MiB, pid=4242)
        assert result.returncode == 0, result.stderr
        assert result.capture["truncated_reason"] == "write_error"
        assert [a.encode("utf-8", "surrogateescape") for a in result.record["proc"]["cmdline"]] == cmdline
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
